"""The cost of typed partial streaming: ``structgen.stream(..., partial=True)`` against the same
stream without it, on the extraction tasks of the benchmark suite.

Per task, the two runs alternate in order (greedy, so both write the same text). Reported per
task: the wall time of each run, and the time the partial path itself spends -- the event
reader fed each step's text exactly as the stream feeds it, replayed on its own after the run
and timed (``reader_s``), which is the part a noisy two-core machine cannot hide in its wall-time
ratio. The issue-41 bar: the overhead at most 5% of the generation's wall time; the summary gives
both the median wall-time ratio (partial / plain) and the median ``reader_s`` / plain wall time.

    python -m benchmarks.partial_stream --out benchmarks/results/partial-stream-smollm2-135m-cpu.json
    python -m benchmarks.partial_stream --smoke --out x.json   # a tiny random model, two tasks (CI)
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


def _run(lm: Any, task: dict[str, Any], partial: bool, max_new: int,
         on_budget: str = "close") -> dict[str, Any]:
    import structgen
    from benchmarks.tasks.suite import extraction_messages

    steps: list[str] = []
    events = 0
    t0 = time.perf_counter()
    for ev in structgen.stream(lm, schema=task["schema"], messages=extraction_messages(task),
                               max_new_tokens=max_new, partial=partial, on_budget=on_budget):
        text = ev if isinstance(ev, str) else (ev.text if ev.kind == "content" else None)
        if text is not None:
            steps.append(text)
        elif partial and ev.kind != "done":
            events += 1
    return {"wall_s": time.perf_counter() - t0, "steps": steps, "events": events}


def _reader_seconds(steps: list[str], repeats: int = 5) -> float:
    """The event reader's own time on ``steps``, fed as the stream fed it (best of ``repeats``)."""
    from structgen.generation.partial import PartialJsonReader

    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        reader = PartialJsonReader()
        for text in steps:
            reader.feed(text)
        reader.finish()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="model alias or folder")
    ap.add_argument("--tasks", type=int, default=10, help="extraction tasks (from the start of the list)")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, two tasks (CI)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    from benchmarks.bench_suite import SMOKE_FAVOUR, tiny_model
    from benchmarks.tasks.suite import EXTRACTION_TASKS
    from structgen.generation.model import load_model

    if args.smoke:
        lm, name, args.tasks, args.max_new_tokens = tiny_model(favour=SMOKE_FAVOUR), "tiny", 2, 60
    else:
        lm, name = load_model(args.model), args.model
    rows = []
    for i, task in enumerate(EXTRACTION_TASKS[: args.tasks]):
        _run(lm, task, False, 4, "cut")  # compile the schema outside the timed runs
        runs = {}
        for partial in ((True, False) if i % 2 == 0 else (False, True)):
            runs[partial] = _run(lm, task, partial, args.max_new_tokens)
        on, off = runs[True], runs[False]
        reader_s = _reader_seconds(on["steps"])
        row = {"task": task["name"], "chars": len("".join(on["steps"])), "steps": len(on["steps"]),
               "events": on["events"], "wall_partial_s": round(on["wall_s"], 4),
               "wall_plain_s": round(off["wall_s"], 4), "reader_s": round(reader_s, 6),
               "same_text": "".join(on["steps"]) == "".join(off["steps"])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {
        "model": name, "tasks": len(rows),
        "wall_ratio_median": round(statistics.median(r["wall_partial_s"] / r["wall_plain_s"]
                                                     for r in rows), 4),
        "reader_share_median": round(statistics.median(r["reader_s"] / r["wall_plain_s"] for r in rows), 6),
        "reader_us_per_char_median": round(statistics.median(1e6 * r["reader_s"] / max(r["chars"], 1)
                                                             for r in rows), 3),
        "same_text": sum(r["same_text"] for r in rows),
        "bar_overhead_at_most_5pct": None,
    }
    summary["bar_overhead_at_most_5pct"] = summary["reader_share_median"] <= 0.05
    print(json.dumps(summary), flush=True)
    if args.out is not None:
        envelope_lib.write(args.out, envelope, {"summary": summary, "tasks": rows})
    return 0 if summary["same_text"] == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
