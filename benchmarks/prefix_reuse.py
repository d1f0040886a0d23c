"""Prefix reuse in ``structgen.generate`` on llama.cpp: repeated calls sharing a system prompt.

Every call sends the shared system prompt of ``benchmarks/tasks/shared_prefix.py`` (instructions
and a tool list, about 500 tokens with the chat template), then one extraction task's user
message (its schema and text, 270-500 tokens) and that task's JSON Schema. Per round the model's
prefix cache starts empty; calls 1..N run the tasks in turn (``shared``: a new user message per
call), then the first task's messages again (``repeat``). Each call also runs with the cache
off (``max_bytes`` 0), the two interleaved (their order alternates), as the oracle for the
output (identical tokens) and as the baseline of the same call.

Reported: per call the wall time with and without the cache, the prompt tokens restored, and
the issue-38 bar: the wall time of the second and later calls over the first call's (cache on,
median over rounds; bar <= 0.5x). Every schema is compiled before the timed rounds (the first
call of a round pays its prefill, not a compile).

    python -m benchmarks.prefix_reuse --out benchmarks/results/prefix-reuse-qwen2.5-coder-0.5b-gguf-cpu.json
    python -m benchmarks.prefix_reuse --smoke --out x.json   # the tests' tiny GGUF (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.common import envelope as envelope_lib
from benchmarks.tasks.shared_prefix import TASKS, shared_messages


def _call(lm: Any, task: dict[str, Any], cache_on: bool, cap: int, max_new: int) -> dict[str, Any]:
    import structgen

    lm.prefix_cache.max_bytes = cap if cache_on else 0
    before = lm.prefix_cache.stats.tokens_reused
    t0 = time.perf_counter()
    res = structgen.generate(lm, schema=task["schema"], messages=shared_messages(task),
                             max_new_tokens=max_new)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "tokens": res.tokens, "text": res.text,
            "reused": lm.prefix_cache.stats.tokens_reused - before,
            "prefill_s": res.stats.time_prefill}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b",
                    help="model alias (its -gguf twin) or .gguf path")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=5, help="tasks per round (shared system prompt)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--smoke", action="store_true", help="the tests' tiny GGUF, 1 round of 2 calls (CI)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    import jsonschema

    import structgen
    from benchmarks.common import llamacpp_model

    lm, path, name = llamacpp_model.load(args.model, args.threads, args.smoke)
    if args.smoke:
        args.calls, args.rounds, args.max_new_tokens = 2, 1, 80
    cap = 1 << 30
    tasks = TASKS[: args.calls]
    for task in tasks:  # compile every schema, warm llama.cpp
        lm.prefix_cache.max_bytes = 0
        structgen.generate(lm, schema=task["schema"], prompt="{", max_new_tokens=4, on_budget="cut")
    calls: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        lm.prefix_cache.clear()
        order = tasks + [tasks[0]]
        for i, task in enumerate(order):
            runs = {}
            for on in ((True, False) if (rnd + i) % 2 == 0 else (False, True)):
                runs[on] = _call(lm, task, on, cap, args.max_new_tokens)
            on, off = runs[True], runs[False]
            complete = True
            try:
                jsonschema.validate(json.loads(on["text"]), task["schema"])
            except (ValueError, jsonschema.ValidationError):
                complete = False
            kind = "repeat" if i == len(tasks) else ("first" if i == 0 else "shared")
            prompt = lm.tokenizer.apply_chat_template(shared_messages(task), tokenize=True)
            row = {"round": rnd, "call": i + 1, "task": task["name"], "kind": kind,
                   "prompt_tokens": len(prompt),
                   "output_tokens": len(on["tokens"]), "wall_on_s": round(on["wall_s"], 4),
                   "wall_off_s": round(off["wall_s"], 4), "prefill_on_s": round(on["prefill_s"], 4),
                   "prefill_off_s": round(off["prefill_s"], 4), "reused_tokens": on["reused"],
                   "identical": on["tokens"] == off["tokens"], "valid": complete}
            calls.append(row)
            print(json.dumps(row), flush=True)

    def med(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 3) if xs else None

    later_over_first = []
    for rnd in range(args.rounds):
        rows = [c for c in calls if c["round"] == rnd]
        first = rows[0]["wall_on_s"]
        later_over_first += [c["wall_on_s"] / first for c in rows[1:]]
    summary = {
        "model": name, "threads": args.threads, "calls_per_round": len(tasks) + 1, "rounds": args.rounds,
        "later_over_first_median": med(later_over_first),
        "later_over_first_max": round(max(later_over_first), 3) if later_over_first else None,
        "shared_on_over_off_median": med([c["wall_on_s"] / c["wall_off_s"] for c in calls
                                          if c["kind"] == "shared"]),
        "repeat_on_over_off_median": med([c["wall_on_s"] / c["wall_off_s"] for c in calls
                                          if c["kind"] == "repeat"]),
        "prefill_on_over_off_median_shared": med([c["prefill_on_s"] / c["prefill_off_s"] for c in calls
                                                  if c["kind"] == "shared"]),
        "identical": sum(c["identical"] for c in calls), "calls": len(calls),
        "valid": sum(c["valid"] for c in calls),
        "bar_later_over_first_le_0.5": bool(later_over_first) and max(later_over_first) <= 0.5,
        "cache_stats": vars(lm.prefix_cache.stats),
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        envelope_lib.write(args.out, envelope, {"summary": summary, "calls": calls})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
