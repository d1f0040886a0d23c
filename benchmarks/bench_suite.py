"""The benchmark suite (``structgen bench`` in a checkout): JSON, code and prose, structgen vs
baselines.

Benchmark code, not part of the installed package: run it from a source checkout, as
``python -m benchmarks.bench_suite`` or ``structgen bench`` (which finds this file beside the
``structgen`` package it runs from). Three task types (data in ``benchmarks/tasks/suite.py``):
JSON extraction (schemas whose facts are in the prompt), code under a Lark grammar (SQL with
``structgen/grammars/sql.lark``, Python expressions with ``structgen/grammars/python_expr.lark``)
and prose under a light sentence grammar.
Engines, all greedy, batch 1, on the same prompt token ids:

* ``plain``    -- ``structgen.generate(..., speculative=False)``: plain grammar-constrained
  decoding, the baseline of every speedup;
* ``spec``     -- ``structgen.generate(..., speculative=True)`` (grammar-forced and prompt
  lookup drafts; ``--draft-model`` adds a draft LM);
* ``xgrammar`` -- transformers ``generate`` with XGrammar's logits processor (JSON schemas
  only: XGrammar does not read Lark grammars);
* ``outlines`` -- outlines' transformers integration (``JsonSchema``; Lark tasks through
  outlines' ``CFG`` type when that works for the grammar).

Peers are skipped (with a note) when not installed. Rounds are interleaved -- every task runs
each engine before the next task, with the engine order rotated per task -- so machine noise
hits all engines alike. Grammars are compiled in an untimed warm-up for every engine
(structgen's cache, XGrammar's compiled grammar, outlines' generator), so timings are
generation only: tokenisation of the prompt, prefill and decoding.

Reported per task and per type: wall time, throughput (new tokens / s), speedup
(``plain`` wall / ``spec`` wall; greedy outputs are token-identical, so this is also the
throughput ratio), draft acceptance (accepted / proposed draft tokens, per drafter and
overall), tokens per target forward pass, the relative cost of a verify pass (mean forward
time per pass, spec / plain), output validity (completed outputs checked by ``jsonschema``
or Lark's own Earley parser), quality (JSON: exact match with the reference; SQL: execution
match on a small SQLite database; Python: ``ast`` equality; prose: sentence BLEU-4) and
whether greedy ``spec`` output is token-identical to ``plain`` (it must be).

Writes ``suite-<model>-<device>.json`` and ``.md`` (date, machine, versions, tables, the
design's headline figures set against the measured ones) and two PNG plots (speedup against
acceptance; speedup by task type) into ``--out`` (default ``benchmarks/results``).

    python -m benchmarks.bench_suite                 # the default model, every task
    python -m benchmarks.bench_suite --model qwen2.5-coder-0.5b --types json,code --tasks-per-type 4
    python -m benchmarks.bench_suite --smoke --out /tmp/b   # tiny random model, 1 task per type
    structgen bench ...                              # the same, from a checkout

Exit code 0; 1 when a greedy ``spec`` output differs from ``plain`` or a completed output
is invalid; 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from structgen.atomic_files import AtomicOutput, write_text_atomic

HERE = Path(__file__).resolve().parent  # benchmarks/
ROOT = HERE.parent

__all__ = ["main", "bleu", "check_output", "tiny_model", "prompt_text", "run_structgen", "run_xgrammar",
           "run_outlines", "HEADLINE"]

# The design's headline figures: task type -> (speedup, draft acceptance).
HEADLINE: dict[str, tuple[float, float]] = {"json": (3.8, 0.891), "code": (3.0, 0.623),
                                             "prose": (1.8, 0.176)}
TYPES = ("json", "code", "prose")
DRAFTERS = ("grammar", "lookup", "ngram", "draft_model")  # columns of the per-drafter table
ENGINES = ("plain", "spec", "xgrammar", "outlines")
PEERS = ("xgrammar", "outlines")


class Unsupported(Exception):
    """A peer cannot run this task (e.g. a Lark grammar for XGrammar)."""


# ---------------------------------------------------------------------------------------------
# models and prompts

SMOKE_FAVOUR: dict[str, float] = {'"': 40.0, '"}': 40.0, '"]': 40.0, "}": 25.0, "]": 25.0, ".": 25.0,
                                   ")": 25.0, " FROM": 25.0, " 1": 15.0}
"""Logit biases of the smoke model: closing punctuation and the one keyword SQL needs, so
that grammar-steered random output completes within a few dozen tokens."""


def tiny_model(seed: int = 0, favour: dict[str, float] | None = None) -> Any:
    """A tiny randomly initialised Llama (2 layers, hidden 64) with the real GPT-2 tokenizer,
    as in ``tests/test_generate.py``; built in memory in about a second. Returns a
    :class:`~structgen.generation.model.CausalLM`.

    ``favour``: text -> logit bias for the text's tokens (EOS gets the largest bias), so that
    the random model, steered by a grammar, completes short outputs (the smoke run needs
    completed outputs to check their validity); e.g. :data:`SMOKE_FAVOUR`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from structgen.assets.store import load_tokenizer
    from structgen.generation.model import CausalLM

    tok = load_tokenizer("gpt2")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=50304, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharper random logits
        model.lm_head.weight.mul_(4.0)
        if favour:
            head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=True)
            head.weight.copy_(model.lm_head.weight)
            head.bias.zero_()
            for text, b in favour.items():
                head.bias[tok.encode(text)] = b
            head.bias[tok.eos_token_id] = 2 * max(favour.values())
            model.lm_head = head
    return CausalLM(model.eval(), tok)


def prompt_text(lm: Any, messages: list[dict[str, str]]) -> str:
    """The prompt string: the tokenizer's chat template when it has one, else the messages'
    contents joined by newlines."""
    tok = lm.tokenizer
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in messages) + "\n"


def _grammar_text(task: dict[str, Any]) -> str | None:
    if "grammar" in task:
        return task["grammar"]
    if "grammar_name" in task:
        from structgen.frontends.lark import builtin_grammar

        task["grammar"] = builtin_grammar(task["grammar_name"])
        return task["grammar"]
    return None


def _constraint(task: dict[str, Any]) -> dict[str, Any]:
    """The task's constraint as ``generate``/``resolve_grammar`` keywords (Lark text, or the
    schema as the task gives it); the front door,
    :func:`structgen.frontends.constraint.compile_constraint`, compiles it."""
    g = _grammar_text(task)
    return {"grammar": g} if g is not None else {"schema": task["schema"]}


# ---------------------------------------------------------------------------------------------
# engines

def run_structgen(lm: Any, task: dict[str, Any], *, speculative: bool, max_new: int, cfg: Any,
                  draft: Any = None, prompt: str | None = None, on_budget: str = "cut") -> dict[str, Any]:
    """One greedy ``structgen.generate`` call, timed; returns text, tokens and statistics.

    ``on_budget="cut"`` by default: the peer engines stop at ``max_new_tokens`` wherever the
    output is, so the comparison does the same; ``"close"`` measures structgen's own default."""
    from structgen.generation.api import generate

    prompt = prompt if prompt is not None else prompt_text(lm, task["messages"])
    t0 = time.perf_counter()
    r = generate(lm, prompt=prompt, max_new_tokens=max_new, speculative=speculative, config=cfg,
                 draft_model=draft if speculative else None, on_budget=on_budget, **_constraint(task))
    wall = time.perf_counter() - t0
    st = r.stats
    return {"text": r.text, "tokens": list(r.tokens), "wall_s": wall, "new_tokens": st.new_tokens,
            "complete": r.complete, "finish_reason": r.finish_reason,
            "forward_passes": st.forward_passes, "drafted": st.drafted, "accepted": st.accepted,
            "drafters": {k: {"proposed": int(v["proposed"]), "accepted": int(v["accepted"])}
                         for k, v in st.drafters.items()},
            "time": {k: getattr(st, k) for k in ("time_masks", "time_drafting", "time_forward",
                                                    "time_verify", "time_prefill")}}


def _hf_generate(lm: Any, prompt: str, max_new: int, processors: list[Any]) -> tuple[list[int], str, bool]:
    import torch

    tok = lm.tokenizer
    ids = torch.tensor([tok.encode(prompt)], dtype=torch.long, device=lm.device)  # [1, P]
    eos = tok.eos_token_id
    with torch.inference_mode():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                do_sample=False, logits_processor=processors,
                                pad_token_id=eos if eos is not None else 0)
    new = out[0, ids.shape[1]:].tolist()
    eos_ids = set(lm.model.generation_config.eos_token_id
                  if isinstance(lm.model.generation_config.eos_token_id, list)
                  else [lm.model.generation_config.eos_token_id, eos])
    complete = bool(new) and new[-1] in eos_ids
    return new, tok.decode(new, skip_special_tokens=True), complete


def run_xgrammar(lm: Any, task: dict[str, Any], max_new: int, state: dict[str, Any],
                 prompt: str | None = None) -> dict[str, Any]:
    """transformers ``generate`` with XGrammar's logits processor (JSON schema tasks only).
    The compiled grammar is cached in ``state`` (compile it in a warm-up call)."""
    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor

    if "schema" not in task:
        raise Unsupported("XGrammar's HF integration takes JSON schemas / EBNF, not Lark grammars")
    if "compiler" not in state:
        info = xgr.TokenizerInfo.from_huggingface(lm.tokenizer, vocab_size=lm.vocab_size)
        state["compiler"] = xgr.GrammarCompiler(info)
    key = ("cg", task["name"])
    if key not in state:
        state[key] = state["compiler"].compile_json_schema(json.dumps(task["schema"]), any_whitespace=False,
                                                            separators=(",", ":"))
    prompt = prompt if prompt is not None else prompt_text(lm, task["messages"])
    t0 = time.perf_counter()
    new, text, complete = _hf_generate(lm, prompt, max_new, [LogitsProcessor(state[key])])
    return {"text": text, "tokens": new, "wall_s": time.perf_counter() - t0, "new_tokens": len(new),
            "complete": complete}


def run_outlines(lm: Any, task: dict[str, Any], max_new: int, state: dict[str, Any],
                 prompt: str | None = None) -> dict[str, Any]:
    """outlines' transformers integration: ``JsonSchema`` for JSON tasks, ``CFG`` (Lark text)
    for grammar tasks. The generator is cached in ``state`` (build it in a warm-up call)."""
    import outlines
    from outlines.types import CFG, JsonSchema

    if "model" not in state:
        state["model"] = outlines.from_transformers(lm.model, lm.tokenizer)
    key = ("gen", task["name"])
    if key not in state:
        g = _grammar_text(task)
        try:
            out_type = (CFG(g) if g is not None
                        else JsonSchema(json.dumps(task["schema"]), whitespace_pattern=""))
            state[key] = outlines.Generator(state["model"], out_type)
        except Exception as exc:  # noqa: BLE001 - a peer's limitation, reported as n/a
            state[key] = Unsupported(f"outlines: {type(exc).__name__}: {str(exc)[:120]}")
    gen = state[key]
    if isinstance(gen, Unsupported):
        raise gen
    prompt = prompt if prompt is not None else prompt_text(lm, task["messages"])
    t0 = time.perf_counter()
    try:
        text = gen(prompt, max_new_tokens=max_new, do_sample=False)
    except Exception as exc:  # noqa: BLE001
        state[key] = Unsupported(f"outlines: {type(exc).__name__}: {str(exc)[:120]}")
        raise state[key] from None
    wall = time.perf_counter() - t0
    n = len(lm.tokenizer.encode(text, add_special_tokens=False))
    # outlines returns text only: "complete" is decided by the validity oracle below
    return {"text": text, "tokens": None, "wall_s": wall, "new_tokens": n, "complete": None}


# ---------------------------------------------------------------------------------------------
# oracles: validity and quality

_LARK_PARSERS: dict[str, Any] = {}


def _lark_parses(grammar: str, text: str) -> bool:
    import lark

    from structgen.frontends.lark import lark_import_loader

    p = _LARK_PARSERS.get(grammar)
    if p is None:  # %import through structgen's loader: never the working folder
        p = _LARK_PARSERS[grammar] = lark.Lark(grammar, parser="earley", lexer="dynamic_complete",
                                               import_paths=[lark_import_loader()])
    try:
        p.parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


def _words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text.lower())


def bleu(hypothesis: str, reference: str, max_n: int = 4) -> float:
    """Sentence BLEU-4 in [0, 100] of ``hypothesis`` against one ``reference``: lower-cased
    word/punctuation tokens, clipped n-gram precisions with add-one smoothing for n > 1
    (Lin and Och 2004), geometric mean, brevity penalty."""
    hyp, ref = _words(hypothesis), _words(reference)
    if not hyp or not ref:
        return 0.0
    log_p = 0.0
    for n in range(1, max_n + 1):
        h = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
        r = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
        match = sum(min(c, r[g]) for g, c in h.items())
        total = max(len(hyp) - n + 1, 0)
        if n == 1:
            if match == 0:
                return 0.0
            p = match / total
        else:
            p = (match + 1) / (total + 1)
        log_p += math.log(p) / max_n
    bp = 1.0 if len(hyp) > len(ref) else math.exp(1 - len(ref) / len(hyp))
    return 100.0 * bp * math.exp(log_p)


def _sql_rows(query: str) -> list[tuple[Any, ...]] | None:
    import sqlite3

    from benchmarks.tasks.suite import SQL_ROWS, SQL_TABLES

    con = sqlite3.connect(":memory:")
    try:
        con.executescript(SQL_TABLES)
        for table, rows in SQL_ROWS.items():
            con.executemany(f"INSERT INTO {table} VALUES ({','.join('?' * len(rows[0]))})", rows)
        con.set_progress_handler(lambda: 1, 200_000)  # abort runaway queries
        return [tuple(r) for r in con.execute(query).fetchall()]
    except Exception:  # noqa: BLE001 - a query SQLite rejects does not match
        return None
    finally:
        con.close()


def _leaves(v: Any, path: str = "$") -> dict[str, Any]:
    if isinstance(v, dict):
        return {k: x for key, val in v.items() for k, x in _leaves(val, f"{path}.{key}").items()}
    if isinstance(v, list):
        return {k: x for i, val in enumerate(v) for k, x in _leaves(val, f"{path}[{i}]").items()}
    return {path: v}


def _field_accuracy(value: Any, reference: Any) -> float:
    """Fraction of the reference's leaf values (by JSON path) that ``value`` has equal."""
    want, got = _leaves(reference), _leaves(value)
    return sum(k in got and got[k] == x and type(got[k]) is type(x) for k, x in want.items()) / len(want)


def _norm_sql(q: str) -> str:
    return " ".join(q.strip().rstrip(";").split()).casefold()


def check_output(task: dict[str, Any], text: str, complete: bool | None) -> dict[str, Any]:
    """Validity and quality of one output by independent oracles.

    ``valid``: the text parses and validates (``jsonschema`` Draft 2020-12; Lark's Earley
    parser over the task's grammar). ``complete``: generation stopped on its own (None: not
    known, then it is taken as "valid"). ``quality``: JSON exact match (0/1), SQL execution
    match on :data:`tasks.suite.SQL_ROWS` (0/1, row order compared only when the
    reference orders), Python ``ast`` equality (0/1), prose BLEU (0-100)."""
    ttype = task["type"]
    out: dict[str, Any] = {"valid": False, "quality": 0.0}
    if ttype == "json":
        from structgen.validation import jsonschema_validator

        try:
            v = json.loads(text)
        except ValueError:
            v = None
        else:
            # no registry-less validator: its $ref resolution would fetch URLs and read files
            out["valid"] = jsonschema_validator(task["schema"]).is_valid(v)
        out["exact"] = bool(out["valid"] and v == task["answer"])
        out["quality"] = _field_accuracy(v, task["answer"]) if out["valid"] else 0.0
    else:
        out["valid"] = _lark_parses(_grammar_text(task) or "", text)
        if ttype == "prose":
            out["quality"] = bleu(text, task["answer"])
        elif task.get("lang") == "sql":
            got, want = _sql_rows(text), _sql_rows(task["answer"])
            if got is not None and want is not None and "order by" not in task["answer"].lower():
                got, want = sorted(got, key=repr), sorted(want, key=repr)
            out["quality"] = float(got is not None and got == want)
            out["exact"] = _norm_sql(text) == _norm_sql(task["answer"])
        else:
            try:
                out["quality"] = float(ast.dump(ast.parse(text.strip(), mode="eval"))
                                       == ast.dump(ast.parse(task["answer"], mode="eval")))
            except SyntaxError:
                out["quality"] = 0.0
    out["complete"] = out["valid"] if complete is None else complete
    return out


QUALITY_METRIC = {"json": "field accuracy %", "code": "execution / AST match %", "prose": "BLEU"}


# ---------------------------------------------------------------------------------------------
# summaries

def _summarise(rs: list[dict[str, Any]]) -> dict[str, Any]:
    wall = sum(r["wall_s"] for r in rs)
    toks = sum(r["new_tokens"] for r in rs)
    complete = sum(bool(r["complete"]) for r in rs)
    valid_complete = sum(bool(r["valid"]) for r in rs if r["complete"])
    q = [r["quality"] for r in rs]
    scale = 1.0 if rs and rs[0]["type"] == "prose" else 100.0
    s: dict[str, Any] = {"tasks": len(rs), "wall_s": wall, "new_tokens": toks,
                         "tokens_per_s": toks / wall if wall else None,
                         "median_task_s": statistics.median(r["wall_s"] for r in rs),
                         "complete": complete, "valid_complete": valid_complete,
                         "validity": valid_complete / complete if complete else None,
                         "quality": scale * statistics.mean(q) if q else None}
    if rs and "forward_passes" in rs[0]:
        passes = sum(r["forward_passes"] for r in rs)
        drafted = sum(r["drafted"] for r in rs)
        accepted = sum(r["accepted"] for r in rs)
        s.update(forward_passes=passes, tokens_per_pass=toks / passes if passes else None,
                 drafted=drafted, accepted=accepted, acceptance=accepted / drafted if drafted else None)
        per: dict[str, dict[str, Any]] = {}
        for r in rs:
            for name, d in r["drafters"].items():
                p = per.setdefault(name, {"proposed": 0, "accepted": 0})
                p["proposed"] += d["proposed"]
                p["accepted"] += d["accepted"]
        for p in per.values():
            p["acceptance"] = p["accepted"] / p["proposed"] if p["proposed"] else None
        s["drafters"] = per
        s["time_split"] = {k: sum(r["time"][k] for r in rs) for k in rs[0]["time"]}
        fwd = s["time_split"]["time_forward"]
        s["forward_s_per_pass"] = fwd / passes if passes else None
    return s


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarise(results: list[dict[str, Any]], engines: list[str]) -> dict[str, Any]:
    """Per type (and ``all``) per engine summaries, speedups and the spec/plain identity."""
    out: dict[str, Any] = {}
    groups = {t: [r for r in results if r["type"] == t] for t in TYPES}
    groups["all"] = results
    for g, rows in groups.items():
        if not rows:
            continue
        by_e = {e: [r for r in rows if r["engine"] == e] for e in engines}
        gs: dict[str, Any] = {"engines": {e: _summarise(v) for e, v in by_e.items() if v}}
        if g == "all":  # prose quality (BLEU) and match rates do not average
            for e in gs["engines"].values():
                e["quality"] = None
        spec = gs["engines"].get("spec")
        if spec:
            spec_wall = {r["task"]: r["wall_s"] for r in by_e["spec"]}
            for e in gs["engines"]:
                if e != "spec":  # over the tasks both engines ran
                    both = [r for r in by_e[e] if r["task"] in spec_wall]
                    spec[f"speedup_vs_{e}"] = _ratio(sum(r["wall_s"] for r in both),
                                                     sum(spec_wall[r["task"]] for r in both))
            plain = gs["engines"].get("plain")
            if plain:
                per_task = []
                for r in by_e["spec"]:
                    p = next((x for x in by_e["plain"] if x["task"] == r["task"]), None)
                    if p:
                        per_task.append(p["wall_s"] / r["wall_s"])
                spec["median_task_speedup"] = statistics.median(per_task) if per_task else None
                spec["verify_pass_cost"] = _ratio(spec.get("forward_s_per_pass"),
                                                  plain.get("forward_s_per_pass"))
        ident = [r["identical_to_plain"] for r in by_e.get("spec", []) if "identical_to_plain" in r]
        gs["identical"] = f"{sum(ident)}/{len(ident)}"
        out[g] = gs
    return out


def headline_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The design's headline figures against the measured speedup and acceptance."""
    rows = []
    for t, (sp, acc) in HEADLINE.items():
        spec = summary.get(t, {}).get("engines", {}).get("spec")
        if not spec:
            rows.append({"type": t, "design_speedup": sp, "design_acceptance": acc, "speedup": None,
                         "acceptance": None, "reproduced": "not run"})
            continue
        got_sp, got_acc = spec.get("speedup_vs_plain"), spec.get("acceptance")
        ok = got_sp is not None and got_sp >= 0.95 * sp
        rows.append({"type": t, "design_speedup": sp, "design_acceptance": acc, "speedup": got_sp,
                     "acceptance": got_acc, "tokens_per_pass": spec.get("tokens_per_pass"),
                     "verify_pass_cost": spec.get("verify_pass_cost"),
                     "reproduced": "yes" if ok else "no"})
    return rows


# ---------------------------------------------------------------------------------------------
# report

def _versions() -> dict[str, str]:
    from importlib import metadata

    from structgen import __version__

    v = {"python": platform.python_version(), "structgen": __version__}
    for dist in ("torch", "transformers", "xgrammar", "outlines", "outlines-core", "llguidance", "lark",
                 "matplotlib"):
        try:
            v[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            v[dist] = "not installed"
    return v


def _f(x: Any, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _pct(x: Any) -> str:
    return _f(None if x is None else 100 * x, "{:.1f}%")


def render_markdown(doc: dict[str, Any]) -> str:
    """The Markdown report of a suite run (``doc`` is the JSON document)."""
    meta, summary, results = doc["meta"], doc["summary"], doc["results"]
    engines = meta["engines"]
    L: list[str] = []
    L.append(f"# structgen benchmark suite: {meta['model']} on {meta['device']}")
    L.append("")
    L.append(f"* date: {meta['date']}")
    L.append(f"* machine: {meta['machine']}, {meta['cpu_count']} CPUs, torch threads {meta['torch_threads']}"
             + (f", GPU {meta['gpu']}" if meta.get("gpu") else ""))
    L.append("* versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    L.append(f"* settings: greedy, batch 1, max_new_tokens {meta['max_new_tokens']} "
             f"(structgen at the budget: {meta.get('on_budget', 'cut')}), "
             f"repeats {meta['repeats']} (median per task), engines {', '.join(engines)}"
             + (f", draft model {meta['draft_model']}" if meta.get("draft_model") else "")
             + "; grammars compiled in an untimed warm-up for every engine; wall time includes "
               "prompt tokenisation and prefill")
    if meta.get("load_average"):
        la = meta["load_average"]
        fmt = lambda xs: "/".join(f"{x:.1f}" for x in xs)
        L.append(f"* machine load (1/5/15-min load average): start {fmt(la['start'])}, end {fmt(la['end'])}")
    for note in meta.get("notes", []):
        L.append(f"* note: {note}")
    L.append("")
    L.append("## By task type")
    L.append("")
    hdr = ["type", "tasks", "baseline tok/s", "structgen tok/s", "speedup (median task)",
           "acceptance", "tokens/pass", "verify pass cost", "validity (complete)", "quality", "spec==plain"]
    peers = [e for e in engines if e in PEERS]
    hdr[5:5] = [f"vs {p}" for p in peers]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|" + "---|" * len(hdr))
    for t in (*TYPES, "all"):
        g = summary.get(t)
        if not g:
            continue
        es = g["engines"]
        plain, spec = es.get("plain", {}), es.get("spec", {})
        row = [t, str(spec.get("tasks", plain.get("tasks", 0))), _f(plain.get("tokens_per_s"), "{:.1f}"),
               _f(spec.get("tokens_per_s"), "{:.1f}"),
               f"{_f(spec.get('speedup_vs_plain'), '{:.2f}x')} "
               f"({_f(spec.get('median_task_speedup'), '{:.2f}x')})"]
        for p in peers:
            row.append(_f(spec.get(f"speedup_vs_{p}"), "{:.2f}x", "n/a"))
        vals = []
        for e in engines:
            s = es.get(e)
            if s:
                vals.append(f"{e} {s['valid_complete']}/{s['complete']}"
                            + (f" of {s['tasks']}" if s["complete"] != s["tasks"] else ""))
        q = []
        if t != "all":
            for e in engines:
                s = es.get(e)
                if s and s.get("quality") is not None:
                    q.append(f"{e} {s['quality']:.1f}")
        row += [_pct(spec.get("acceptance")), _f(spec.get("tokens_per_pass")),
                _f(spec.get("verify_pass_cost"), "{:.2f}x"), "; ".join(vals),
                ("; ".join(q) + f" ({QUALITY_METRIC[t]})") if q else "-", g["identical"]]
        L.append("| " + " | ".join(row) + " |")
    L.append("")
    L.append("Draft acceptance per drafter (accepted / proposed draft tokens):")
    L.append("")
    L.append("| type | " + " | ".join(DRAFTERS) + " |")
    L.append("|" + "---|" * (len(DRAFTERS) + 1))
    for t in (*TYPES, "all"):
        spec = summary.get(t, {}).get("engines", {}).get("spec")
        if not spec:
            continue
        cells = []
        for d in DRAFTERS:
            x = spec.get("drafters", {}).get(d)
            cells.append(f"{_pct(x['acceptance'])} ({x['accepted']}/{x['proposed']})" if x else "-")
        L.append(f"| {t} | " + " | ".join(cells) + " |")
    L.append("")
    L.append("## The design's headline figures")
    L.append("")
    L.append("| type | design: speedup at acceptance | measured: speedup at acceptance | tokens/pass | "
             "verify pass cost | reproduced |")
    L.append("|---|---|---|---|---|---|")
    for h in headline_rows(summary):
        L.append(f"| {h['type']} | {h['design_speedup']:.1f}x at {100 * h['design_acceptance']:.1f}% | "
                 f"{_f(h['speedup'], '{:.2f}x')} at {_pct(h['acceptance'])} | "
                 f"{_f(h.get('tokens_per_pass'))} | {_f(h.get('verify_pass_cost'), '{:.2f}x')} | "
                 f"{h['reproduced']} |")
    L.append("")
    L.append("Speedup is close to tokens per pass divided by the verify pass cost (the mean forward time "
             "of a speculative pass over a one-token pass, prefill excluded) minus the CPU time of "
             "drafting and masks; a figure is marked reproduced when the measured speedup is at least "
             "95% of the design's.")
    L.append("")
    L.append("## Per task")
    L.append("")
    L.append("| task | type | plain s | spec s | speedup | acceptance | tokens/pass | tokens | valid | "
             "quality | identical | " + " | ".join(f"{p} s" for p in peers) + (" |" if peers else "|"))
    L.append("|" + "---|" * (11 + len(peers)))
    names = list(dict.fromkeys(r["task"] for r in results))
    for n in names:
        rs = {r["engine"]: r for r in results if r["task"] == n}
        p, s = rs.get("plain"), rs.get("spec")
        any_r = s or p or next(iter(rs.values()))
        acc = s["accepted"] / s["drafted"] if s and s["drafted"] else None
        q = any_r["quality"]
        qs = (f"{q:.1f}" if any_r["type"] == "prose" else
              f"{100 * q:.0f}%" + (" exact" if any_r.get("exact") else "") if any_r["type"] == "json"
              else ("yes" if q else "no"))
        cells = [n, any_r["type"], _f(p and p["wall_s"]), _f(s and s["wall_s"]),
                 _f(p["wall_s"] / s["wall_s"] if p and s else None, "{:.2f}x"), _pct(acc),
                 _f(s["new_tokens"] / s["forward_passes"] if s and s["forward_passes"] else None),
                 str(any_r["new_tokens"]),
                 "yes" if any_r["valid"] else ("no" if any_r["complete"] else "cut"), qs,
                 "yes" if s and s.get("identical_to_plain") else ("no" if s and p else "-")]
        for pe in peers:
            r = rs.get(pe)
            cells.append(_f(r["wall_s"]) + ("" if r["valid"] else " (invalid)") if r else "n/a")
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    L.append("Definitions: throughput = new tokens / wall seconds summed over the tasks of a type; speedup = "
             "plain wall / spec wall (same greedy tokens); acceptance = accepted / proposed draft tokens; "
             "tokens/pass = new tokens / target forward passes (prefill included); validity counts "
             "completed outputs that pass jsonschema (JSON) or Lark's Earley parser (code, prose); an "
             "output cut at max_new_tokens is 'cut'. Quality: JSON field accuracy (share of the reference "
             "instance's leaf values matched at the same path; 'exact' = whole instance); SQL "
             "execution match on a small SQLite database; Python ast equality; prose sentence BLEU-4 "
             "(add-one smoothing) against one reference.")
    groups: dict[str, list[str]] = {}
    for skip in meta.get("skipped", []):  # "ENGINE on TASK: reason" -> one line per reason
        m = re.match(r"(\S+) on (\S+): (.*)", skip)
        key, task = (f"{m.group(1)}: {m.group(3)}", m.group(2)) if m else (skip, "")
        groups.setdefault(key, []).append(task)
    for key, names in groups.items():
        on = f" ({len(names)} tasks: {', '.join(names)})" if any(names) else ""
        L.append(f"* not run: {key}{on}")
    L.append("")
    return "\n".join(L).rstrip("\n") + "\n"


def write_plots(doc: dict[str, Any], stem: Path) -> list[str]:
    """Two PNGs beside ``stem``: speedup vs acceptance (one point per task, the design's
    headline points hollow) and speedup by task type (structgen vs plain and vs peers, the
    design's figures beside). Returns the paths; none when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed (pip install 'structgen[bench]'); plots skipped",
              file=sys.stderr)
        return []
    colors = {"json": "tab:blue", "code": "tab:orange", "prose": "tab:green"}
    results, summary = doc["results"], doc["summary"]
    paths = []
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for t in TYPES:
        xs, ys = [], []
        for s in (r for r in results if r["engine"] == "spec" and r["type"] == t):
            p = next((r for r in results if r["engine"] == "plain" and r["task"] == s["task"]), None)
            if p and s["drafted"]:
                xs.append(100 * s["accepted"] / s["drafted"])
                ys.append(p["wall_s"] / s["wall_s"])
        if xs:
            ax.scatter(xs, ys, color=colors[t], label=f"{t} (task)", alpha=0.7)
        spec = summary.get(t, {}).get("engines", {}).get("spec")
        if spec and spec.get("acceptance") is not None and spec.get("speedup_vs_plain"):
            ax.scatter([100 * spec["acceptance"]], [spec["speedup_vs_plain"]], color=colors[t], marker="s",
                       s=90, edgecolor="black", label=f"{t} (all tasks)")
        sp, acc = HEADLINE[t]
        ax.scatter([100 * acc], [sp], facecolor="none", edgecolor=colors[t], marker="*", s=220,
                   label=f"{t} (design)")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("draft acceptance, accepted / proposed (%)")
    ax.set_ylabel("speedup over plain constrained decoding (x)")
    ax.set_title(f"structgen: speedup vs acceptance ({doc['meta']['model']}, {doc['meta']['device']})")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    p1 = stem.with_name(stem.name + "-speedup-vs-acceptance.png")
    with AtomicOutput(p1, binary=True) as png:
        fig.savefig(png.stream, format="png", dpi=120)
    plt.close(fig)
    paths.append(str(p1))

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    bars = [("vs plain", "plain"), *((f"vs {p}", p) for p in PEERS if p in doc["meta"]["engines"])]
    width = 0.8 / (len(bars) + 1)
    for i, t in enumerate(TYPES):
        spec = summary.get(t, {}).get("engines", {}).get("spec", {})
        for j, (label, e) in enumerate(bars):
            v = spec.get(f"speedup_vs_{e}")
            if v:
                ax.bar(i + j * width, v, width, color=f"C{j}", label=label if i == 0 else None)
        ax.bar(i + len(bars) * width, HEADLINE[t][0], width, color="none", edgecolor="black", hatch="//",
               label="design (vs plain)" if i == 0 else None)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks([i + len(bars) * width / 2 for i in range(len(TYPES))], list(TYPES))
    ax.set_ylabel("structgen speedup (x)")
    ax.set_title(f"structgen speedup by task type ({doc['meta']['model']}, {doc['meta']['device']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p2 = stem.with_name(stem.name + "-speedup-by-type.png")
    with AtomicOutput(p2, binary=True) as png:
        fig.savefig(png.stream, format="png", dpi=120)
    plt.close(fig)
    paths.append(str(p2))
    return paths


# ---------------------------------------------------------------------------------------------
# driver

def _select_tasks(types: list[str], per_type: int | None, names: list[str] | None) -> list[dict[str, Any]]:
    from benchmarks.tasks.suite import all_tasks

    tasks = [t for t in all_tasks() if t["type"] in types]
    if names:
        tasks = [t for t in tasks if t["name"] in names]
    if per_type is not None:
        kept: list[dict[str, Any]] = []
        for ty in types:
            of = [t for t in tasks if t["type"] == ty]
            if ty == "code" and per_type > 1:  # mix SQL and Python
                sql = [t for t in of if t.get("lang") == "sql"]
                py = [t for t in of if t.get("lang") == "python"]
                n_py = min(len(py), max(1, per_type // 3))
                of = sql[: per_type - n_py] + py[:n_py]
            kept.extend(of[:per_type])
        tasks = kept
    return tasks


def _positive_int(text: str) -> int:
    """argparse type: an integer from 1 to structgen.config.MAX_COUNT."""
    from structgen.config import positive_int_arg

    return positive_int_arg(text)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr (exit 2), like the rest of the CLI."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see `{self.prog} --help`)\n")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(prog="structgen bench", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model alias or path (default: the default model)")
    ap.add_argument("--draft-model", default=None, help="draft LM alias/path for the spec engine")
    ap.add_argument("--types", default="json,code,prose", help="task types, comma separated")
    ap.add_argument("--tasks-per-type", type=_positive_int, default=None, help="first N tasks of each type")
    ap.add_argument("--task", action="append", default=None, help="run only this task (repeatable)")
    ap.add_argument("--engines", default=None,
                    help="comma separated from plain,spec,xgrammar,outlines "
                         "(default all; --smoke: plain,spec)")
    ap.add_argument("--max-new-tokens", type=_positive_int, default=None,
                    help="default 400 (--smoke: 96)")
    ap.add_argument("--on-budget", default="cut", choices=("cut", "close"),
                    help="structgen engines at max_new_tokens: cut (default, as the peers do) or close "
                         "(structgen's own default: steer every output to end complete within the budget)")
    ap.add_argument("--repeats", type=_positive_int, default=1,
                    help="timed runs per task and engine (median)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    ap.add_argument("--threads", type=_positive_int, default=None,
                    help="torch threads (default: torch's own)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"),
                    help="model weights (bfloat16 on the CPU runs a row-invariant forward)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default benchmarks/results; --smoke: a new temporary folder)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny random model, 1 task per type, plain+spec: a quick end-to-end check")
    ap.add_argument("--report", type=Path, default=None, metavar="SUITE.json",
                    help="only re-render the Markdown table and plots of an earlier run's JSON")
    return ap.parse_args(argv)


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        from structgen.errors import ConfigError

        raise ConfigError("--device cuda: no CUDA device is available", key="device")
    return name


def main(argv: list[str] | None = None) -> int:
    """Run the suite; see the module docstring. Returns the exit code."""
    try:
        args = _parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    from structgen.errors import StructgenError

    types = [t.strip() for t in args.types.split(",") if t.strip()]
    bad = [t for t in types if t not in TYPES]
    engines = (args.engines or ("plain,spec" if args.smoke else ",".join(ENGINES))).split(",")
    bad += [e for e in engines if e not in ENGINES]
    if bad or args.repeats < 1:
        print(f"structgen bench: error: unknown task type or engine: {', '.join(bad) or '--repeats < 1'}",
              file=sys.stderr)
        return 2
    if args.report is not None:
        return _report(args)
    try:
        return _run(args, types, engines)
    except StructgenError as e:
        print(f"structgen bench: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def _write_reports(doc: dict[str, Any], stem: Path, plots: bool) -> None:
    if plots:
        doc["meta"]["plots"] = write_plots(doc, stem)
    write_text_atomic(stem.with_name(stem.name + ".json"), json.dumps(doc, indent=1, default=str))
    write_text_atomic(stem.with_name(stem.name + ".md"), render_markdown(doc))
    print(f"wrote {stem}.json, {stem}.md" + (f", {', '.join(doc['meta'].get('plots', []))}"
                                             if doc["meta"].get("plots") else ""), file=sys.stderr)


def _report(args: argparse.Namespace) -> int:
    try:
        doc = json.loads(args.report.read_text())
        tasks = {t["name"]: t for t in _select_tasks(list(TYPES), None, None)}
        for r in doc["results"]:  # re-check with the current oracles (outlines: no token ids)
            if r["task"] in tasks:
                r.update(check_output(tasks[r["task"]], r["text"], None if r["tokens"] is None
                                      else r["complete"]))
        doc["summary"] = summarise(doc["results"], doc["meta"]["engines"])
        doc["headline_comparison"] = headline_rows(doc["summary"])
    except (OSError, ValueError, KeyError) as e:
        print(f"structgen bench: cannot read {args.report}: {e}", file=sys.stderr)
        return 2
    stem = args.report.with_name(args.report.name.removesuffix(".json"))
    _write_reports(doc, stem, not args.no_plots)
    return 0


def _run(args: argparse.Namespace, types: list[str], engines: list[str]) -> int:
    import torch

    from structgen.config import SpecConfig
    from structgen.generation.api import DEFAULT_MODEL, resolve_grammar
    from structgen.generation.model import CausalLM, load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    device = _device(args.device)
    per_type = 1 if args.smoke and args.tasks_per_type is None else args.tasks_per_type
    max_new = args.max_new_tokens or (96 if args.smoke else 400)
    tasks = _select_tasks(types, per_type, args.task)
    if not tasks:
        print("structgen bench: no task selected", file=sys.stderr)
        return 2
    model_name = "tiny-random" if args.smoke else (args.model or DEFAULT_MODEL)
    lm = tiny_model(favour=SMOKE_FAVOUR) if args.smoke else load_model(model_name, dtype=args.dtype)
    if device != "cpu":
        lm = CausalLM(lm.model.to(device), lm.tokenizer)
    draft = None
    if args.draft_model:
        draft = load_model(args.draft_model, dtype=args.dtype)
        if device != "cpu":
            draft = CausalLM(draft.model.to(device), draft.tokenizer)
    cfg = SpecConfig()
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="structgen-bench-")) if args.smoke
                           else HERE / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    safe_model = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model_name).name)
    stem = out_dir / f"suite-{safe_model}-{device}"

    load_start = list(os.getloadavg())
    skipped: list[str] = []
    peer_state: dict[str, dict[str, Any]] = {e: {} for e in engines if e in PEERS}
    prompts = {t["name"]: prompt_text(lm, t["messages"]) for t in tasks}
    # --- untimed warm-up: compile every grammar for every engine, first-call overheads
    t_warm = time.perf_counter()
    for t in tasks:
        resolve_grammar(**_constraint(t))
    for ty in types:
        first = next((t for t in tasks if t["type"] == ty), None)
        if first is not None:
            run_structgen(lm, first, speculative=True, max_new=8, cfg=cfg, draft=draft,
                          prompt=prompts[first["name"]])
    for e in list(peer_state):
        for t in tasks:
            try:
                fn = run_xgrammar if e == "xgrammar" else run_outlines
                fn(lm, t, 4, peer_state[e], prompt=prompts[t["name"]])
            except ImportError as exc:
                skipped.append(f"{e}: not installed ({exc})")
                engines.remove(e)
                break
            except Unsupported as exc:
                skipped.append(f"{e} on {t['name']}: {exc}")
    warm_s = time.perf_counter() - t_warm
    print(f"warm-up {warm_s:.1f}s; {len(tasks)} tasks; engines {','.join(engines)}", file=sys.stderr)

    results: list[dict[str, Any]] = []
    for i, task in enumerate(tasks):
        order = engines[i % len(engines):] + engines[: i % len(engines)]
        runs: dict[str, list[dict[str, Any]]] = {e: [] for e in order}
        for _ in range(args.repeats):
            for e in order:
                prompt = prompts[task["name"]]
                try:
                    if e in ("plain", "spec"):
                        r = run_structgen(lm, task, speculative=e == "spec", max_new=max_new, cfg=cfg,
                                          draft=draft, prompt=prompt, on_budget=args.on_budget)
                    elif e == "xgrammar":
                        r = run_xgrammar(lm, task, max_new, peer_state[e], prompt=prompt)
                    else:
                        r = run_outlines(lm, task, max_new, peer_state[e], prompt=prompt)
                except Unsupported:
                    continue
                runs[e].append(r)
        for e in order:
            if not runs[e]:
                continue
            walls = sorted(x["wall_s"] for x in runs[e])
            r = dict(runs[e][0])
            r["wall_s"] = statistics.median(walls)
            r["wall_s_all"] = walls
            r.update(check_output(task, r["text"], r["complete"]))
            r.update(task=task["name"], type=task["type"], engine=e)
            results.append(r)
        got = {r["engine"]: r for r in results if r["task"] == task["name"]}
        if "spec" in got and "plain" in got:
            got["spec"]["identical_to_plain"] = got["spec"]["tokens"] == got["plain"]["tokens"]
        line = " ".join(f"{e}={got[e]['wall_s']:.2f}s" for e in engines if e in got)
        s = got.get("spec")
        extra = (f" passes={s['forward_passes']} acc={s['accepted']}/{s['drafted']} "
                 f"identical={s.get('identical_to_plain')}") if s else ""
        anyr = s or next(iter(got.values()))
        print(f"{task['name']:16} {task['type']:5} tokens={anyr['new_tokens']:4d} {line}{extra} "
              f"valid={anyr['valid']} quality={anyr['quality']:.2f}", file=sys.stderr)

    summary = summarise(results, engines)
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "model": model_name, "draft_model": args.draft_model,
        "device": device, "machine": f"{platform.platform()} ({platform.machine()})",
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "dtype": str(getattr(lm.model, "dtype", "")),
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "versions": _versions(), "engines": engines, "max_new_tokens": max_new, "on_budget": args.on_budget,
        "repeats": args.repeats,
        "smoke": args.smoke, "warmup_s": warm_s, "skipped": skipped,
        "load_average": {"start": load_start, "end": list(os.getloadavg())},
        "headline": {t: {"speedup": sp, "acceptance": acc} for t, (sp, acc) in HEADLINE.items()},
        "notes": (["tiny randomly initialised model: speed and quality figures are meaningless, this run "
                   "only checks the pipeline"] if args.smoke else []),
    }
    doc = {"meta": meta, "summary": summary, "headline_comparison": headline_rows(summary),
           "results": results}
    _write_reports(doc, stem, not args.no_plots)
    print(render_markdown(doc).split("## Per task")[0])

    status = 0
    non_identical = [r["task"] for r in results
                     if r["engine"] == "spec" and r.get("identical_to_plain") is False]
    if non_identical:
        print(f"ERROR: greedy spec output differs from plain on {', '.join(non_identical)}", file=sys.stderr)
        status = 1
    invalid = [f"{r['task']}/{r['engine']}" for r in results
               if r["engine"] in ("plain", "spec") and r["complete"] and not r["valid"]]
    if invalid:
        print(f"ERROR: completed structgen outputs that fail validation: {', '.join(invalid)}",
              file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
