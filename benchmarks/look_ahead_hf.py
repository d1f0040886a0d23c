"""Look-ahead in the transformers logits processor: the masks' time on a real decode loop's path.

``StructgenLogitsProcessor(look_ahead=True)`` hands each row's configuration to a background
thread after every call, which prepares the masks a few bytes ahead while the model computes
the next logits (:meth:`structgen.masks.matcher.Matcher.start_look_ahead`). This benchmark runs
``model.generate`` greedily over JSONSchemaBench schemas, each compiled anew for every run (the
first request on a new schema: every mask a first visit), with look-ahead off and on,
interleaved schema by schema (the order alternates), and times every call of the processor:
that is the time the masks add to each token. The processor's first call of a generation
(the matchers' creation and the first mask, which nothing can prepare) is reported apart.

Exactness: both runs of a schema must give the same tokens (the masks are the same).

``--threads`` sets torch's threads: with 1, a core is left for the look-ahead thread, as the
CPU is on a GPU machine during the forward pass; with every core given to torch the thread
takes time from the forward pass.

    python -m benchmarks.look_ahead_hf --cases 40 --threads 1 --out benchmarks/results/look-ahead-hf.json
    python -m benchmarks.look_ahead_hf --smoke                    # tiny random model, 3 cases (CI)

Exit status 1 when a schema's two runs differ.
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
import torch

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.mask_engines import clear_structgen_caches
from benchmarks.jsonschemabench import default_data
from benchmarks.masks import sample_schemas
from structgen.errors import StructgenError
from structgen.frontends.constraint import compile_constraint
from structgen.generation.model import load_model, vocabulary_for
from structgen.integrations.transformers import StructgenLogitsProcessor
from structgen.masks import lookahead

SMOKE_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}},
                                      "ok": {"type": "boolean"}}, "required": ["tags"]},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}}}},
]


def _timed(proc: StructgenLogitsProcessor, times: list[int]) -> Any:
    """A transformers logits processor that records each call's nanoseconds in ``times``."""
    from transformers import LogitsProcessor

    class Timed(LogitsProcessor):  # type: ignore[misc]
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            t0 = time.perf_counter_ns()
            out = proc(input_ids, scores)
            times.append(time.perf_counter_ns() - t0)
            return out

    return Timed()


def run_once(lm: Any, vocab: Any, schema: Any, prompt_ids: torch.Tensor, look_ahead: bool,
             max_new_tokens: int) -> dict[str, Any]:
    """One generation on a freshly compiled grammar: the processor's call times and tokens."""
    assert lookahead.wait_idle(30.0)  # nothing left over from the previous run
    clear_structgen_caches()
    t0 = time.perf_counter()
    grammar = compile_constraint("json", schema)
    compile_s = time.perf_counter() - t0
    proc = StructgenLogitsProcessor(grammar, vocab=vocab, look_ahead=look_ahead)
    times: list[int] = []
    eos = vocab.eos_token_ids[0]
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids),
                                logits_processor=[_timed(proc, times)], do_sample=False,
                                max_new_tokens=max_new_tokens, pad_token_id=eos)
    generate_s = time.perf_counter() - t0
    return {"tokens": out[0, prompt_ids.shape[1]:].tolist(), "call_ns": times,
            "compile_ms": round(compile_s * 1e3, 2), "generate_s": round(generate_s, 3)}


def _dist(ns: list[int]) -> dict[str, Any]:
    if not ns:
        return {"calls": 0}
    xs = sorted(ns)

    def q(f: float) -> float:
        return round(xs[min(len(xs) - 1, int(f * len(xs)))] / 1e3, 1)

    return {"calls": len(xs), "p50_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99),
            "max_us": round(xs[-1] / 1e3, 1), "mean_us": round(statistics.fmean(xs) / 1e3, 1),
            "total_ms": round(sum(xs) / 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--cases", type=int, default=40, help="JSONSchemaBench schemas (sampled)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data", type=Path, default=None, help="JSONSchemaBench folder")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--smoke", action="store_true", help="tiny random model, 3 small schemas (CI)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.cases < 1 or args.max_new_tokens < 1 or args.threads < 1:
        ap.error("--cases, --max-new-tokens and --threads must be positive")
    envelope = envelope_lib.capture(argv, __file__)
    torch.set_num_threads(args.threads)
    if args.smoke:
        from benchmarks import bench_suite as bench

        lm = bench.tiny_model()
        args.model, args.max_new_tokens = "tiny-random", 16
        schemas = [{"id": f"smoke-{i}", "schema": s} for i, s in enumerate(SMOKE_SCHEMAS)]
    else:
        lm = load_model(args.model)
        schemas = sample_schemas(args.data or default_data(), None, args.cases, args.seed)
    vocab = vocabulary_for(lm)
    tok = lm.tokenizer
    # untimed: the vocabulary's tables, the kernels and the thread start here, not in case 1
    warm_ids = torch.tensor([tok.encode("JSON:")])
    for mode in (False, True):
        run_once(lm, vocab, SMOKE_SCHEMAS[0], warm_ids, mode, 4)
    rows: list[dict[str, Any]] = []
    calls: dict[str, list[int]] = {"off": [], "on": []}
    firsts: dict[str, list[int]] = {"off": [], "on": []}
    gen_s: dict[str, float] = {"off": 0.0, "on": 0.0}
    load = []
    for i, row in enumerate(schemas):
        schema = row["schema"]
        try:
            compile_constraint("json", schema)
        except StructgenError as e:
            rows.append({"id": row.get("id"), "skipped": f"{type(e).__name__}"})
            continue
        text = json.dumps(schema, separators=(",", ":"))[:1500]
        prompt = f"Write one JSON instance of this JSON Schema.\nSchema: {text}\nJSON:"
        ids = torch.tensor([tok.encode(prompt)[-1024:]])
        order = ("off", "on") if i % 2 == 0 else ("on", "off")
        got = {mode: run_once(lm, vocab, schema, ids, mode == "on", args.max_new_tokens) for mode in order}
        load.append(os.getloadavg()[0])
        for mode, r in got.items():
            firsts[mode].extend(r["call_ns"][:1])
            calls[mode].extend(r["call_ns"][1:])
            gen_s[mode] += r["generate_s"]
        same = got["off"]["tokens"] == got["on"]["tokens"]
        case: dict[str, Any] = {"id": row.get("id"), "identical": same, "tokens": len(got["off"]["tokens"])}
        for mode, r in got.items():
            case[f"{mode}_mask_ms"] = round(sum(r["call_ns"][1:]) / 1e6, 1)
            case[f"{mode}_compile_ms"] = r["compile_ms"]
            case[f"{mode}_generate_s"] = r["generate_s"]
        rows.append(case)
        print(f"{row.get('id')}: identical={same} tokens={len(got['off']['tokens'])} "
              f"masks off {rows[-1]['off_mask_ms']} ms / on {rows[-1]['on_mask_ms']} ms", file=sys.stderr)
    ran = [r for r in rows if "identical" in r]
    summary: dict[str, Any] = {
        "model": args.model, "threads": args.threads, "max_new_tokens": args.max_new_tokens,
        "cases": len(schemas), "ran": len(ran), "identical": sum(r["identical"] for r in ran),
        "load_max": round(max(load), 2) if load else None,
        "calls_after_first": {m: _dist(v) for m, v in calls.items()},
        "first_call": {m: _dist(v) for m, v in firsts.items()},
        "generate_s": {m: round(v, 2) for m, v in gen_s.items()},
    }
    off, on = summary["calls_after_first"]["off"], summary["calls_after_first"]["on"]
    if off.get("calls") and on.get("calls"):
        summary["on_over_off"] = {k: round(on[k] / off[k], 3) if off[k] else None
                                  for k in ("p50_us", "p90_us", "p99_us", "max_us", "mean_us", "total_ms")}
        summary["on_over_off"]["generate_s"] = round(gen_s["on"] / gen_s["off"], 3) if gen_s["off"] else None
    print(json.dumps(summary, indent=1))
    if args.out:
        envelope_lib.write(args.out, envelope, {"summary": summary, "cases": rows})
    return 0 if all(r["identical"] for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
