"""Tool calling with triggered grammars: call/no-call and argument accuracy, validity, speculation.

Every case is a user message and the calls it should produce (none, one, several, or one with
nested arguments) against six tools. Each case runs three ways with greedy decoding:

* ``spec``: ``structgen.generate(tools=..., tool_choice="auto")`` with speculation;
* ``plain``: the same without speculation (the oracle for exactness: greedy output must be
  token-identical, and the tokens per target pass are compared);
* ``free``: unconstrained decoding of the same chat-template prompt (any bytes), parsed with
  the template's format (Hermes for Qwen2.5) and validated with ``jsonschema``;
* ``required``: ``tool_choice="required"`` with speculation, on the cases that expect calls
  (the decision given, this measures the arguments a forced call gets);
* ``xgrammar`` (``--modes xgrammar``, the peer): transformers' greedy ``generate`` with
  XGrammar's structural tags (trigger ``<tool_call>``, one tag per tool), parsed like ``free``.

Figures: the share of emitted calls that parse and validate, call/no-call accuracy, exact
argument accuracy (strings compared case-insensitively), tokens per pass and tokens/s.

``--masks``: the free-text mask cost on the Llama-3 vocabulary, two ways. Bare calls: a step of
a triggered tool grammar in free text (mask into a bitmask + accept; and the forbidden ids +
accept, what the logits processor does there) against a no-op function (the call alone) and
against applying an all-allowed bitmask to the logits (what any whole-mask processor pays).
Through transformers: ``LogitsProcessorList([proc])(input_ids, scores)`` on ``[1, 128256]``
scores, ``StructgenLogitsProcessor`` against a
``LogitsProcessor`` that returns the scores unchanged, interleaved step by step, each call on
fresh scores as ``generate`` makes them: the default (a copy on a generation's first call, then
in place while the caller keeps no earlier scores), ``inplace=False`` (always a copy) and
``inplace=True``; and, to show where the margin comes from, a no-op with a stored signature
(transformers reads each processor's signature on every call; ours is stored). And inside the
arguments, the triggered grammar against the tool's JSON Schema alone (bare steps).

::

    python -m benchmarks.tools --model qwen2.5-coder-0.5b \
        --out benchmarks/results/tools-qwen2.5-coder-0.5b-cpu.json
    python -m benchmarks.tools --masks --out benchmarks/results/tools-masks-llama3.json
    python -m benchmarks.tools --smoke --out /tmp/tools.json   # tiny random model, 3 cases + masks (CI)
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.common import envelope as envelope_lib


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS = [
    _fn("get_weather", "Get the current weather in a city",
        {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"]),
    _fn("add", "Add two integers", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
    _fn("get_time", "Get the current time in an IANA time zone", {"timezone": {"type": "string"}},
        ["timezone"]),
    _fn("send_email", "Send an email", {"to": {"type": "string"}, "subject": {"type": "string"}},
        ["to", "subject"]),
    _fn("book_hotel", "Book a hotel room", {
        "guest": {"type": "object", "properties": {"name": {"type": "string"},
                                                   "vip": {"type": "boolean"}}, "required": ["name"]},
        "city": {"type": "string"}, "nights": {"type": "integer", "minimum": 1, "maximum": 30}},
        ["guest", "city", "nights"]),
    _fn("create_event", "Create a calendar event", {
        "title": {"type": "string"},
        "attendees": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "email": {"type": "string"}}, "required": ["name"]}}},
        ["title", "attendees"]),
]

W, A, T, E, H, C = "get_weather", "add", "get_time", "send_email", "book_hotel", "create_event"
CITIES = ["Paris", "Tokyo", "Berlin", "Lima", "Oslo", "Cairo", "Madrid", "Seoul"]
CASES: list[tuple[str, str, list[tuple[str, dict[str, Any]]]]] = []
for c in CITIES:
    CASES.append(("single", f"What's the weather in {c} right now?", [(W, {"city": c})]))
for a, b in [(2, 3), (17, 25), (100, 250), (7, 8)]:
    CASES.append(("single", f"Please add {a} and {b} using the tool.", [(A, {"a": a, "b": b})]))
for tz in ["Europe/London", "Asia/Tokyo", "America/New_York", "Australia/Sydney"]:
    CASES.append(("single", f"What time is it in the {tz} time zone?", [(T, {"timezone": tz})]))
for c1, c2 in [("Paris", "Tokyo"), ("Berlin", "Oslo"), ("Lima", "Cairo"), ("Madrid", "Seoul")]:
    CASES.append(("parallel", f"What's the weather in {c1} and in {c2}?",
                  [(W, {"city": c1}), (W, {"city": c2})]))
for (a, b), (c_, d) in [((1, 2), (3, 4)), ((10, 20), (30, 40)), ((5, 6), (7, 8)), ((11, 12), (13, 14))]:
    CASES.append(("parallel", f"Compute {a} + {b} and also {c_} + {d}.",
                  [(A, {"a": a, "b": b}), (A, {"a": c_, "b": d})]))
for q in ["Hi! How are you today?", "Tell me a short joke about cats.", "What is the capital of Italy?",
          "Write one sentence about the sea.", "Thanks, that is all.", "Who wrote Hamlet?",
          "Translate 'good morning' to French.", "What colour is the sky on a clear day?"]:
    CASES.append(("no_call", q, []))
for name, city, n in [("Ann Lee", "Paris", 3), ("Bob Stone", "Tokyo", 2), ("Cara Diaz", "Rome", 5),
                      ("Dan Wu", "Oslo", 1)]:
    CASES.append(("nested", f"Book a hotel in {city} for {n} nights for the guest {name}.",
                  [(H, {"guest": {"name": name}, "city": city, "nights": n})]))
for title, people in [("Standup", ["Ann", "Bob"]), ("Review", ["Cara"]), ("Lunch", ["Dan", "Eve"]),
                      ("Retro", ["Finn"])]:
    CASES.append(("nested", f"Create a calendar event called {title} with attendees {' and '.join(people)}.",
                  [(C, {"title": title, "attendees": [{"name": p} for p in people]})]))
SMOKE_CASES = (0, 16, 24)


def _norm(v: Any) -> Any:
    if isinstance(v, str):
        return v.strip().casefold()
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v


OPTIONAL = ("unit", "vip", "email")  # optional arguments the cases do not prescribe


def _matches(got: Any, want: Any) -> bool:
    """``got`` equals ``want``, except that objects may also hold the optional keys."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and _matches(got[k], v) for k, v in want.items()) \
            and all(k in want or k in OPTIONAL for k in got)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_matches, got, want))
    return bool(got == want)


def _same_calls(got: list[tuple[str, Any]], want: list[tuple[str, Any]]) -> bool:
    """Same multiset of calls, arguments compared by :func:`_matches` (strings case-folded)."""
    left = [(n, _norm(a)) for n, a in got]
    for name, args in want:
        args = _norm(args)
        hit = next((i for i, (n, a) in enumerate(left) if n == name and _matches(a, args)), None)
        if hit is None:
            return False
        left.pop(hit)
    return not left


def _validate(calls: list[tuple[str, Any]]) -> tuple[int, int]:
    """(calls, calls whose name is a tool and whose arguments validate)."""
    import jsonschema

    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    ok = 0
    for name, args in calls:
        if name in by_name:
            try:
                jsonschema.validate(args, by_name[name])
                ok += 1
            except jsonschema.ValidationError:
                pass
    return len(calls), ok


MODES = ("spec", "plain", "free", "required", "xgrammar")
DEFAULT_MODES = ("spec", "plain", "free", "required")


# --tool-format: the call markers of each format (begin, end); "fenced" is what the Qwen2.5-Coder
# models write when asked for tool calls, registered the documented way (TaggedFormat)
FORMAT_MARKERS = {"hermes": ("<tool_call>\n", "\n</tool_call>"), "fenced": ("```json\n", "\n```")}


def _tool_format(name: str) -> Any:
    from structgen.calls.formats import TaggedFormat, register_tool_format, tool_format

    if name == "fenced":  # (registering again replaces the same format)
        register_tool_format(TaggedFormat("fenced", "```json", "```", padding="\n", separator="\n"))
    return tool_format(name)


def _xgrammar_processor(lm: Any, fmt: str = "hermes") -> Any:
    """A fresh transformers logits processor with XGrammar's structural tags for the tools."""
    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor

    key = (id(lm), fmt)
    compiled = _XGR.get(key)
    if compiled is None:
        info = xgr.TokenizerInfo.from_huggingface(lm.tokenizer, vocab_size=lm.vocab_size)
        begin, end = FORMAT_MARKERS[fmt]
        head = begin + '{"name": "%s", "arguments": '
        tags = [xgr.StructuralTagItem(begin=head % t["function"]["name"], schema=t["function"]["parameters"],
                                      end="}" + end) for t in TOOLS]
        compiled = xgr.GrammarCompiler(info).compile_structural_tag(tags, [begin.rstrip("\n")])
        _XGR[key] = compiled
    return LogitsProcessor(compiled)


_XGR: dict[tuple[int, str], Any] = {}


def run_cases(lm: Any, todo: list[int], max_new_tokens: int, progress: Any = None,
              modes: tuple[str, ...] = DEFAULT_MODES,
              fmt_name: str = "hermes") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the cases ``todo``; ``progress(rows, summary)`` is called after each one."""
    import structgen
    from structgen.config import SpecConfig
    from structgen.generation.api import prompt_ids
    from structgen.generation.loop import run_sequence
    from structgen.generation.model import vocabulary_for
    from structgen.grammar import ir
    from structgen.grammar.compiler import compile_grammar

    vocab = vocabulary_for(lm)
    any_text = compile_grammar(ir.Grammar({"text": ir.star(ir.ANY_BYTE)}, "text"))
    fmt = _tool_format(fmt_name)  # (the parser of unconstrained and peer output too)
    rows = []
    for i in todo:
        kind, user, want = CASES[i]
        msgs = [{"role": "user", "content": user}]
        row: dict[str, Any] = {"case": i, "kind": kind, "user": user, "want": want}
        for mode in modes:
            if mode == "required" and not want:
                continue
            t0 = time.perf_counter()
            if mode == "xgrammar":
                import torch

                ids = prompt_ids(lm, None, msgs, TOOLS)
                with torch.no_grad():
                    peer = _xgrammar_processor(lm, fmt_name)
                    out = lm.model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens,
                                            do_sample=False, logits_processor=[peer],
                                            pad_token_id=lm.tokenizer.eos_token_id)
                new = out[0, len(ids):].tolist()
                eos = set(vocab.eos_token_ids)
                text = lm.tokenizer.decode([t for t in new if t not in eos])
                calls = fmt.parse(text).calls
                complete = any(t in eos for t in new)
                res = _PeerResult(new, text, len(new))
            elif mode == "free":
                ids = prompt_ids(lm, None, msgs, TOOLS)
                res = run_sequence(lm, vocab, any_text, ids, SpecConfig(), speculative=False,
                                   max_new_tokens=max_new_tokens, on_budget="cut")
                parsed = fmt.parse(res.text)
                calls = parsed.calls
                complete = res.finish_reason == "stop"
            else:
                res = structgen.generate(lm, messages=msgs, tools=TOOLS,
                                         tool_choice="required" if mode == "required" else "auto",
                                         speculative=mode != "plain", max_new_tokens=max_new_tokens,
                                         on_budget="cut", tool_format=fmt_name)
                calls = [(c.name, c.arguments) for c in res.tool_calls]
                if res.complete and res.error is None:
                    complete = True
                else:
                    complete = False
                    raw = res.extra.get("raw_text", res.text)
                    calls = fmt.parse(raw).calls if res.error else calls
            dt = time.perf_counter() - t0
            n, valid = _validate(calls)
            text = res.text if mode == "free" else res.extra.get("raw_text")
            row[mode] = {"tokens": res.tokens, "text": text,
                         "complete": complete, "calls": calls, "n_calls": n, "valid_calls": valid,
                         "called": bool(calls), "right_decision": bool(calls) == bool(want),
                         "right_calls": _same_calls(calls, want) if complete or not want else False,
                         "seconds": round(dt, 3), "passes": res.stats.forward_passes,
                         "new_tokens": len(res.tokens)}
        row["identical"] = "spec" not in row or row["spec"]["tokens"] == row["plain"]["tokens"]
        for mode in MODES:
            if mode in row:
                del row[mode]["tokens"]
        rows.append(row)
        print(f"{i:3} {kind:8} identical={row['identical']} "
              + " ".join(f"{m}:calls={row[m]['n_calls']}/{row[m]['valid_calls']} "
                         f"right={row[m]['right_calls']} {row[m]['seconds']:.1f}s"
                         for m in MODES if m in row), file=sys.stderr)
        if progress is not None:
            progress(rows, _summary(rows))
    return rows, _summary(rows)


class _PeerResult:
    """What the summary reads of a peer's output (no speculation: one pass per token)."""

    def __init__(self, tokens: list[int], text: str, passes: int) -> None:
        self.tokens, self.text, self.extra = tokens, text, {"raw_text": text}

        class _Stats:
            forward_passes = passes

        self.stats = _Stats()


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = ("single", "parallel", "no_call", "nested")
    summary: dict[str, Any] = {"cases": len(rows),
                               "kinds": {k: sum(r["kind"] == k for r in rows) for k in kinds},
                               "identical": sum(r["identical"] for r in rows)}
    for mode in MODES:
        mrows = [r for r in rows if mode in r]
        if not mrows:
            continue
        calls = sum(r[mode]["n_calls"] for r in mrows)
        valid = sum(r[mode]["valid_calls"] for r in mrows)
        toks = sum(r[mode]["new_tokens"] for r in mrows)
        secs = sum(r[mode]["seconds"] for r in mrows)
        passes = sum(r[mode]["passes"] for r in mrows)
        summary[mode] = {
            "calls": calls, "calls_valid": valid,
            "calls_valid_pct": round(100 * valid / calls, 1) if calls else None,
            "decision_accuracy_pct": round(100 * sum(r[mode]["right_decision"] for r in mrows)
                                           / len(mrows), 1),
            "argument_accuracy_pct": round(100 * sum(r[mode]["right_calls"] for r in mrows) / len(mrows), 1),
            "by_kind_right": {k: sum(r[mode]["right_calls"] for r in mrows if r["kind"] == k)
                              for k in ("single", "parallel", "no_call", "nested")},
            "cases": len(mrows), "complete": sum(r[mode]["complete"] for r in mrows),
            "tokens": toks, "passes": passes, "tokens_per_pass": round(toks / passes, 3) if passes else None,
            "tokens_per_s": round(toks / secs, 2) if secs else None, "seconds": round(secs, 1)}
    return summary


def _us(xs: list[float]) -> dict[str, float]:
    return {"mean_us": round(1e6 * statistics.fmean(xs), 2),
            "median_us": round(1e6 * statistics.median(xs), 2), "n": len(xs)}


REGION_PASSES = 20  # passes over the arguments per repeat


def mask_costs(repeats: int) -> dict[str, Any]:
    """Per-step costs on the Llama-3 vocabulary (see the module docstring), engines interleaved."""
    import numpy as np
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    from structgen.assets.store import load_tokenizer
    from structgen.calls.plan import plan_output
    from structgen.config import JsonSchemaOptions
    from structgen.frontends.constraint import compile_constraint
    from structgen.integrations import StructgenLogitsProcessor
    from structgen.masks.matcher import Matcher, bitmask_words
    from structgen.masks.vocab import Vocabulary

    tok = load_tokenizer("llama3")
    vocab = Vocabulary.from_tokenizer(tok)
    plan = plan_output(tools=TOOLS, tool_choice="auto", tool_format="hermes")
    args = {"guest": {"name": "Ann Lee", "vip": True}, "city": "Paris", "nights": 3}
    args_text = json.dumps(args)  # the spelling the hermes format writes (and templates show)
    free = ("Sure! I can help with that. Let me look up the hotels for you; one moment please, "
            "I will check the availability in Paris for three nights and book the best one. ") * 3
    free_ids = tok.encode(free, add_special_tokens=False)
    head = tok.encode('<tool_call>\n{"name": "book_hotel", "arguments": ', add_special_tokens=False)
    arg_ids = tok.encode(args_text, add_special_tokens=False)
    tail = tok.encode('}\n</tool_call>', add_special_tokens=False)
    schema = TOOLS[4]["function"]["parameters"]
    alone = compile_constraint("json", schema, json_options=JsonSchemaOptions(whitespace="spaced"))
    bm = np.zeros((1, bitmask_words(len(vocab.token_bytes))), dtype=np.int32)
    scores = torch.zeros(1, 128256)
    ones = torch.full((1, bitmask_words(128256)), -1, dtype=torch.int32)
    bits = torch.arange(32, dtype=torch.int32)

    def noop(ids: Any, s: Any) -> Any:  # a logits processor that does nothing
        return s

    def apply_mask(ids: Any, s: Any) -> Any:  # what applying any packed bitmask costs
        allowed = ((ones.unsqueeze(-1) >> bits) & 1).reshape(1, -1)[:, : s.shape[1]].bool()
        return s.masked_fill_(~allowed, float("-inf"))

    def steps(m: Matcher, ids: list[int], out: list[float]) -> None:
        for t in ids:
            t0 = time.perf_counter()
            m.fill_bitmask(bm)
            ok = m.accept_token(t)
            out.append(time.perf_counter() - t0)
            if not ok:
                raise RuntimeError(f"token {t} rejected")

    def sparse_steps(m: Matcher, ids: list[int], out: list[float]) -> None:
        for t in ids:
            t0 = time.perf_counter()
            few = m.forbidden_token_ids()
            ok = m.accept_token(t)
            out.append(time.perf_counter() - t0)
            if few is None or not ok:
                raise RuntimeError(f"token {t}: not a free configuration, or rejected")

    class Unchanged(LogitsProcessor):  # the no-op baseline through transformers' list call
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            return scores

    class UnchangedSigned(LogitsProcessor):  # the same with a stored signature, as ours has
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            return scores

    UnchangedSigned.__call__.__signature__ = inspect.signature(  # type: ignore[attr-defined]
        UnchangedSigned.__call__)

    prompt = tok.encode("You are a helpful assistant with tools. Book me a hotel in Paris.",
                        add_special_tokens=False)
    feeds = [torch.tensor([prompt + free_ids[:k]]) for k in range(len(free_ids) + 1)]
    hf_kinds = ("hf_noop", "hf_noop_signed", "hf_structgen", "hf_structgen_copy", "hf_structgen_inplace")

    def hf_request(out: dict[str, list[float]], order: int) -> None:
        """One free-text request through LogitsProcessorList, the processors interleaved step
        by step (the first call, which starts the request, not timed). Each call gets fresh
        scores, as ``generate`` makes them (a copy of the model's last logits), made untimed."""
        lists = {"hf_noop": LogitsProcessorList([Unchanged()]),
                 "hf_noop_signed": LogitsProcessorList([UnchangedSigned()]),
                 "hf_structgen": LogitsProcessorList([StructgenLogitsProcessor(plan.grammar, vocab=vocab)]),
                 "hf_structgen_copy": LogitsProcessorList([StructgenLogitsProcessor(
                     plan.grammar, vocab=vocab, inplace=False)]),
                 "hf_structgen_inplace": LogitsProcessorList([StructgenLogitsProcessor(
                     plan.grammar, vocab=vocab, inplace=True)])}
        kinds = hf_kinds if order % 2 == 0 else hf_kinds[::-1]
        for k, ids in enumerate(feeds):
            for kind in kinds:
                fresh = scores.clone()
                t0 = time.perf_counter()
                lists[kind](ids, fresh)
                if k:
                    out[kind].append(time.perf_counter() - t0)
                del fresh

    # cold: the first request on a fresh grammar (masks of the free-text states not cached yet)
    cold_free: list[float] = []
    t0 = time.perf_counter()
    steps(Matcher(plan.grammar, vocab), free_ids + head + arg_ids + tail, cold_free)
    cold_s = time.perf_counter() - t0
    costs: dict[str, list[float]] = {k: [] for k in ("noop", "apply_mask", "free_text", "free_text_forbidden",
                                                      *hf_kinds, "region_triggered", "region_schema_alone")}
    hf_request({k: [] for k in hf_kinds}, 0)  # warm-up (transformers' first calls)
    Matcher(alone, vocab).accept_tokens(arg_ids)  # warm the schema-alone masks the same way
    m0 = Matcher(alone, vocab)
    steps(m0, arg_ids, [])
    for r in range(repeats):  # interleaved
        for _t in free_ids:
            t0 = time.perf_counter()
            noop(None, scores)
            costs["noop"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            apply_mask(None, scores)
            costs["apply_mask"].append(time.perf_counter() - t0)
        steps(Matcher(plan.grammar, vocab), free_ids, costs["free_text"])
        sparse_steps(Matcher(plan.grammar, vocab), free_ids, costs["free_text_forbidden"])
        hf_request(costs, r)
        m = Matcher(plan.grammar, vocab)
        m.accept_tokens(free_ids)
        if m.accept_tokens(head) != len(head):
            raise RuntimeError("call head rejected")
        # in alternating order (whichever runs first after the other work meets colder caches),
        # several times over: the arguments are few steps, and a mean over few steps is at
        # the mercy of one preemption on a loaded machine
        for i in range(REGION_PASSES):
            for kind in ("region_triggered", "region_schema_alone")[:: 1 if (r + i) % 2 else -1]:
                # a fresh matcher each (its first mask checks the bitmask it is given)
                steps(m.fork() if kind == "region_triggered" else Matcher(alone, vocab), arg_ids,
                      costs[kind])
    out = {k: _us(v) for k, v in costs.items()}
    out["cold_first_request"] = {"seconds": round(cold_s, 3), "steps": len(cold_free)}

    def ratio(a: str, b: str, stat: str) -> float:
        return round(out[a][stat] / out[b][stat], 2)

    # bare: a whole Python call (and a 16 KB mask copy) against a function that returns at once
    out["ratio_free_text_vs_noop"] = ratio("free_text", "noop", "mean_us")
    out["ratio_free_text_vs_noop_median"] = ratio("free_text", "noop", "median_us")
    out["ratio_free_text_forbidden_vs_noop"] = ratio("free_text_forbidden", "noop", "mean_us")
    out["ratio_free_text_forbidden_vs_noop_median"] = ratio("free_text_forbidden", "noop", "median_us")
    # through transformers' LogitsProcessorList, as generate() calls a processor
    for kind in hf_kinds[1:]:
        out[f"ratio_{kind}_vs_hf_noop"] = ratio(kind, "hf_noop", "mean_us")
        out[f"ratio_{kind}_vs_hf_noop_median"] = ratio(kind, "hf_noop", "median_us")
    for kind in hf_kinds[2:]:  # against a no-op whose signature is as cheap to read as ours
        out[f"ratio_{kind}_vs_hf_noop_signed"] = ratio(kind, "hf_noop_signed", "mean_us")
        out[f"ratio_{kind}_vs_hf_noop_signed_median"] = ratio(kind, "hf_noop_signed", "median_us")
    out["ratio_free_text_vs_apply_mask"] = round(out["free_text"]["mean_us"]
                                                 / out["apply_mask"]["mean_us"], 3)
    out["ratio_region_vs_schema_alone"] = round(out["region_triggered"]["mean_us"]
                                                / out["region_schema_alone"]["mean_us"], 3)
    out["ratio_region_vs_schema_alone_median"] = ratio("region_triggered", "region_schema_alone", "median_us")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--cases", type=int, default=len(CASES))
    ap.add_argument("--offset", type=int, default=0, help="skip the first OFFSET cases of the run order "
                    "(to split a run over processes; --merge joins the files)")
    ap.add_argument("--merge", nargs="+", type=Path, help="join the case rows of these results files")
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--masks", action="store_true", help="only the mask-cost figures")
    ap.add_argument("--repeats", type=int, default=20, help="mask-cost passes")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES),
                    help=f"comma-separated, of {', '.join(MODES)} (xgrammar: the peer)")
    ap.add_argument("--tool-format", choices=sorted(FORMAT_MARKERS), default="hermes",
                    help="the call format asked of the model: hermes (its chat template's) or fenced "
                    "(```json blocks, what Qwen2.5-Coder writes; registered as a TaggedFormat)")
    ap.add_argument("--smoke", action="store_true", help="tiny random model, 3 cases, 2 mask passes (CI)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    import torch

    torch.set_num_threads(args.threads)
    figures: dict[str, Any] = {}
    ok = True
    if args.merge:
        parts = [json.loads(p.read_text(encoding="utf-8")) for p in args.merge]
        rows = list({r["case"]: r for part in parts for r in part["cases"]}.values())
        for r in rows:  # scored again (the scoring may have been corrected since the runs)
            for m in MODES:
                if m in r:
                    r[m]["right_calls"] = _same_calls(r[m]["calls"], r["want"]) \
                        if r[m]["complete"] or not r["want"] else False
        summary = _summary(rows)
        first = parts[0]["summary"]
        summary.update(model=first["model"], max_new_tokens=first["max_new_tokens"],
                       merged=[str(p) for p in args.merge], envelopes=[part["envelope"] for part in parts])
        if args.out:
            envelope_lib.write(args.out, envelope, {"summary": summary, "cases": rows})
        print(json.dumps(summary), file=sys.stderr)
        return 0
    if args.masks or args.smoke:
        figures["masks"] = mask_costs(2 if args.smoke else args.repeats)
        print(json.dumps(figures["masks"]), file=sys.stderr)
    if not args.masks:
        if args.smoke:
            from benchmarks import bench_suite as bench

            lm = bench.tiny_model()
            args.model, todo, max_new = "tiny-random", list(SMOKE_CASES), 40
        else:
            from structgen.generation.model import load_model

            lm = load_model(args.model)
            # the kinds interleaved, so that a cut-short run still covers them all
            order = sorted(range(len(CASES)), key=lambda i: (i % 8, i))
            todo, max_new = order[args.offset: args.offset + args.cases], args.max_new_tokens
        t0 = time.time()
        meta = {"model": args.model, "threads": args.threads, "max_new_tokens": max_new,
                "tool_format": args.tool_format}

        def progress(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
            if args.out:  # a run cut short still leaves its figures
                summary.update(meta, seconds=round(time.time() - t0, 1), partial=True)
                envelope_lib.write(args.out, envelope, {**figures, "summary": summary, "cases": rows})

        modes = tuple(m for m in args.modes.split(",") if m)
        bad = [m for m in modes if m not in MODES]
        if bad:
            ap.error(f"--modes: unknown {', '.join(bad)}")
        if "xgrammar" in modes:
            envelope_lib.add_peers(envelope, ["xgrammar"])
        rows, summary = run_cases(lm, todo, max_new, progress, modes, args.tool_format)
        summary.update(meta, seconds=round(time.time() - t0, 1))
        figures.update({"summary": summary, "cases": rows})
        print(json.dumps(summary), file=sys.stderr)
        ok = summary["identical"] == len(rows) and all(
            summary[m]["calls"] == summary[m]["calls_valid"]
            for m in ("spec", "plain", "required") if m in summary)
    if args.out:
        envelope_lib.write(args.out, envelope, figures)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
