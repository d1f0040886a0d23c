"""Closing within the token budget (``on_budget="close"``): every output complete and valid.

Cases are (schema, prompt) pairs: every extraction task's schema with its own text, the example
schemas in ``schemas/``, then each task's schema with another task's text. Per case the budget is
``max_new_tokens = shortest + --extra`` where ``shortest`` is what the budget rule needs from the
start (``Matcher.tokens_to_finish``: the shortest completion tokenized greedily, plus EOS). Both
plain and speculative decoding run greedily under the rule; a case passes when both outputs are
token-identical (finish reason included), end within the budget, parse, and validate with
``jsonschema`` (formats checked).

Mask cost per step, replaying each plain output token by token: the grammar's mask alone
(``fill_bitmask``) against the mask under the rule at that position's remaining budget, split
into steps where the rule removed a token (in the close zone) and steps where it did not;
``cold`` right after the grammar's tables were flushed (every cache empty: the first visit of
each state), ``warm`` on a second replay.

    python -m benchmarks.budget --model smollm2-135m --cases 40 --out benchmarks/results/budget.json
    python -m benchmarks.budget --smoke --out /tmp/budget.json    # tiny random model, 3 cases (CI)

Exit status 1 when a case fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
import jsonschema
import torch

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT
from benchmarks.tasks.extraction import TASKS
from structgen.config import SpecConfig
from structgen.frontends.constraint import compile_constraint
from structgen.generation.api import prompt_ids
from structgen.generation.loop import run_sequence
from structgen.generation.model import load_model, vocabulary_for
from structgen.kernels.bitmask import allocate_bitmask
from structgen.masks.matcher import Matcher
from structgen.validation import jsonschema_validator


def cases(n: int) -> list[tuple[str, dict[str, Any], str]]:
    """``n`` (name, schema, text) cases: own texts, example schemas, then cross pairs."""
    out: list[tuple[str, dict[str, Any], str]] = [(t["name"], t["schema"], t["text"]) for t in TASKS]
    for sp in sorted((ROOT / "schemas").glob("*.schema.json")):
        out.append((sp.stem, json.loads(sp.read_text()), "Produce an example instance."))
    for i, t in enumerate(TASKS):
        for j, u in enumerate(TASKS):
            if i != j:
                out.append((f"{t['name']}<-{u['name']}", t["schema"], u["text"]))
    return out[:n]


SMOKE_CASES = ("person", "invoice", "config.schema")


def _us(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"steps": 0}
    xs = sorted(xs)
    return {"steps": len(xs), "median_us": round(statistics.median(xs) * 1e6, 1),
            "p90_us": round(xs[int(0.9 * (len(xs) - 1))] * 1e6, 1),
            "mean_us": round(statistics.fmean(xs) * 1e6, 1)}


def replay_costs(grammar: Any, vocab: Any, tokens: list[int], budget: int,
                 cold: bool) -> dict[str, list[float]]:
    """Per position of ``tokens``: seconds for the grammar's mask alone and for the mask under
    the rule, by whether the rule removed a token there."""
    rt = grammar.engine
    if cold:
        with rt.lock:
            rt.flush()
    bm = allocate_bitmask(1, vocab.vocab_size)
    times: dict[str, list[float]] = {"plain_mask": [], "rule_in_zone": [], "rule_out_of_zone": [],
                                     "plain_in_zone": [], "plain_out_of_zone": []}
    m_plain, m_rule = Matcher(grammar, vocab), Matcher(grammar, vocab)
    for i, t in enumerate(tokens):
        left = budget - i
        t0 = time.perf_counter()
        m_plain.fill_bitmask(bm, 0)
        t1 = time.perf_counter()
        m_rule.fill_bitmask(bm, 0, budget=left)
        narrowed = m_rule.budget_narrows(left)
        t2 = time.perf_counter()
        zone = "in_zone" if narrowed else "out_of_zone"
        times["plain_" + zone].append(t1 - t0)
        times["rule_" + zone].append(t2 - t1)
        times["plain_mask"].append(t1 - t0)
        if not (m_plain.accept_token(t) and m_rule.accept_token(t)):
            raise RuntimeError("replayed token rejected")
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--extra", type=int, default=16, help="max_new_tokens = shortest + EXTRA")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--smoke", action="store_true", help="tiny random model, 3 cases, EXTRA 4 (CI)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    torch.set_num_threads(args.threads)
    if args.smoke:
        from benchmarks import bench_suite as bench

        lm = bench.tiny_model()  # unbiased: it runs long, so the rule has to close
        args.model, args.extra = "tiny-random", 4
        todo = [c for c in cases(len(TASKS) ** 2 + 10) if c[0] in SMOKE_CASES]
    else:
        lm = load_model(args.model)
        todo = cases(args.cases)
    vocab = vocabulary_for(lm)
    cfg = SpecConfig()
    rows = []
    costs: dict[str, dict[str, list[float]]] = {"cold": {}, "warm": {}}
    passed = 0
    t_start = time.time()
    for name, schema, text in todo:
        grammar = compile_constraint("json", schema)
        msgs = [{"role": "user", "content": f"Return JSON for this schema: "
                 f"{json.dumps(schema, separators=(',', ':'))}\n\nText: {text}"}]
        ids = prompt_ids(lm, None, msgs)
        shortest = Matcher(grammar, vocab).tokens_to_finish()
        budget = shortest + args.extra
        t0 = time.perf_counter()
        plain = run_sequence(lm, vocab, grammar, ids, cfg, speculative=False, max_new_tokens=budget)
        t1 = time.perf_counter()
        spec = run_sequence(lm, vocab, grammar, ids, cfg, speculative=True, max_new_tokens=budget)
        t2 = time.perf_counter()
        identical = plain.tokens == spec.tokens and plain.finish_reason == spec.finish_reason
        within = len(plain.tokens) <= budget and plain.finish_reason in ("stop", "budget_close")
        error = None
        try:
            value = json.loads(plain.text)
            validator = jsonschema_validator(schema, jsonschema.Draft202012Validator,
                                             format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
            errs = [e.message for e in validator.iter_errors(value)]
            error = "; ".join(errs[:2]) or None
        except ValueError as e:
            error = f"not JSON: {e}"
        ok = identical and within and error is None
        passed += ok
        for kind in ("cold", "warm"):
            got = replay_costs(grammar, vocab, plain.tokens, budget, cold=kind == "cold")
            for k, v in got.items():
                costs[kind].setdefault(k, []).extend(v)
        rows.append({"case": name, "ok": ok, "identical": identical, "valid": error is None, "error": error,
                     "shortest": shortest, "budget": budget, "tokens": len(plain.tokens),
                     "finish": plain.finish_reason, "narrowed_steps": plain.stats.budget_narrowed,
                     "plain_s": round(t1 - t0, 2), "spec_s": round(t2 - t1, 2),
                     "plain_passes": plain.stats.forward_passes, "spec_passes": spec.stats.forward_passes,
                     "text": plain.text})
        print(f"{name:28} ok={ok} identical={identical} valid={error is None} finish={plain.finish_reason} "
              f"tokens={len(plain.tokens)}/{budget} narrowed={plain.stats.budget_narrowed}"
              + (f" error={error}" if error else ""), file=sys.stderr)
    summary = {"model": args.model, "threads": args.threads, "extra": args.extra, "cases": len(rows),
               "passed": passed, "identical": sum(r["identical"] for r in rows),
               "valid": sum(r["valid"] for r in rows),
               "budget_close": sum(r["finish"] == "budget_close" for r in rows),
               "stop": sum(r["finish"] == "stop" for r in rows),
               "seconds": round(time.time() - t_start, 1),
               "mask_cost": {kind: {k: _us(v) for k, v in c.items()} for kind, c in costs.items()}}
    print(json.dumps(summary))
    if args.out:
        envelope_lib.write(args.out, envelope, {"summary": summary, "cases": rows})
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
