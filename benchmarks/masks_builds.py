"""Token-mask cost of this structgen build against an earlier one (``--baseline``), interleaved.

The cases are those of ``benchmarks/masks.py`` (JSONSchemaBench schemas with one valid
instance each, replayed token by token with the Llama-3 vocabulary by default), built once
here. Each build runs in its own worker process (masks.py's worker protocol); for every case
each worker in turn compiles (cold) and replays it, the first worker rotating, so that both
builds see the same machine load. Workers:

* ``after``: this tree, compiled the way generation compiles (masks.py's adapter:
  ``string_escapes="canonical"``);
* ``after-all``: this tree with ``string_escapes="all"`` (validation's language), unless
  ``--no-all``;
* ``before``: the tree at ``--baseline`` (a checkout of an earlier commit): its ``structgen``
  package imported in the worker from that tree's folder, run through *its own* masks worker,
  adapter and replayer (so an older module layout works: a tree whose benchmarks are flat
  scripts, ``benchmarks/masks.py`` beside ``benchmarks/_mask_engines.py``, runs its
  ``masks.py`` as it ran there).

Reported per worker over the cases every worker compiled and replayed without a rejection:
compile mean / median (ms) and step mean / median (us; a step = accept the next token + fill
the next mask), and the ratios to ``before``. Output: a table on stdout and JSON (``--out``)
with the shared envelope. Example (a checkout of the commit before the escape layer)::

    git worktree add --detach ../pre-escape 38e7885
    python -m benchmarks.masks_builds --baseline ../pre-escape --limit 2 --candidates 5 \\
        --out benchmarks/results/masks-llama3-escape-cost.json
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from benchmarks import masks
from benchmarks.common import envelope as envelope_lib
from benchmarks.common import mask_engines
from benchmarks.common.checkout import ROOT

# the modules a worker drops before it imports the baseline tree's: this tree's packages and
# the flat scripts of older trees
_BASELINE_DROPS = ("structgen", "benchmarks", "masks", "_mask_engines", "jsonschemabench", "_envelope")


def _import_package_from(name: str, folder: Path) -> None:
    """Import package ``name`` from ``folder`` (its ``__init__.py``); its submodules then
    resolve inside that folder, whatever else is on the module search path."""
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def _baseline_worker(baseline: Path) -> Any:
    """The masks worker function of the tree at ``baseline``, with that tree's ``structgen``."""
    for name in [m for m in sys.modules if m.split(".")[0] in _BASELINE_DROPS]:
        del sys.modules[name]
    _import_package_from("structgen", baseline / "structgen")
    if (baseline / "benchmarks" / "__init__.py").is_file():  # the benchmarks package
        _import_package_from("benchmarks", baseline / "benchmarks")
        return importlib.import_module("benchmarks.common.mask_engines").engine_worker
    # flat scripts: masks.py puts its own folder on the path; the worker lived in masks.py, later
    # in _mask_engines.py
    spec = importlib.util.spec_from_file_location("baseline_masks", baseline / "benchmarks" / "masks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, "_worker", None) or importlib.import_module("_mask_engines")._worker


def _worker_main(kind: str, baseline: str | None, tok_alias: str, opts: dict[str, Any], conn: Any) -> None:
    """Worker process: run masks.py's worker loop for one build."""
    if kind == "before":
        assert baseline is not None
        _baseline_worker(Path(baseline))("structgen", tok_alias, opts, conn)
        return
    if kind == "after-all":
        base = mask_engines.StructgenAdapter

        class AllEscapes(base):  # type: ignore[misc, valid-type]
            def compile(self, case: dict[str, Any]) -> Any:
                cjs = self._cjs
                self._cjs = lambda s, **kw: cjs(s, **{**kw, "string_escapes": "all"})
                try:
                    return base.compile(self, case)
                finally:
                    self._cjs = cjs

        mask_engines.ADAPTERS["structgen"] = AllEscapes
    mask_engines.engine_worker("structgen", tok_alias, opts, conn)


class BuildProc(mask_engines.EngineProc):
    """masks.py's worker handle, started on :func:`_worker_main` for one build."""

    def __init__(self, kind: str, baseline: str | None, tok_alias: str, opts: dict[str, Any]) -> None:
        super().__init__("structgen", tok_alias, opts)
        self.kind, self.baseline = kind, baseline

    def start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker_main,
                                     args=(self.kind, self.baseline, self.tok_alias, self.opts, child),
                                     daemon=True, name=f"masks-{self.kind}")
        self.proc.start()
        child.close()
        self.conn = parent


def summarise(cases: list[dict[str, Any]], kinds: list[str]) -> dict[str, Any]:
    """Compile and step statistics per build over the cases every build replayed cleanly."""
    def clean(r: dict[str, Any]) -> bool:
        return r.get("status") == "ok" and not r.get("reject")

    common = [c for c in cases if c.get("tokens") and all(clean(c["raw"][k]) for k in kinds)]
    out: dict[str, Any] = {"cases_compared": [c["name"] for c in common],
                           "cases_excluded": {c["name"]: {k: c["raw"][k].get("status") for k in kinds}
                                              for c in cases if c not in common}}
    for k in kinds:
        comp = [c["raw"][k]["compile_ns"] / 1e6 for c in common]
        steps: list[float] = []
        for c in common:
            n = min(len(c["raw"][j]["steps_ns"]) for j in kinds)
            steps.extend(s / 1e3 for s in c["raw"][k]["steps_ns"][:n])
        out[k] = {"compile_mean_ms": round(statistics.fmean(comp), 1) if comp else None,
                  "compile_median_ms": round(statistics.median(comp), 1) if comp else None,
                  "step_mean_us": round(statistics.fmean(steps), 1) if steps else None,
                  "step_median_us": round(statistics.median(steps), 1) if steps else None,
                  "steps": len(steps),
                  "compile_ms_per_case": {c["name"]: round(c["raw"][k]["compile_ns"] / 1e6, 1)
                                          for c in common}}
    if "before" in kinds:
        for k in kinds:
            if k == "before":
                continue
            out[f"{k}/before"] = {m: (round(out[k][m] / out["before"][m], 3)
                                      if out[k][m] and out["before"][m] else None)
                                  for m in ("compile_mean_ms", "compile_median_ms", "step_mean_us",
                                            "step_median_us")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, default=None, help="source tree of the earlier build")
    ap.add_argument("--no-all", action="store_true", help="skip the string_escapes='all' worker")
    ap.add_argument("--tokenizer", default="llama3")
    ap.add_argument("--data", type=Path, default=masks.default_data())
    ap.add_argument("--subset", action="append")
    ap.add_argument("--limit", type=int, default=2, help="schemas per subset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--candidates", type=int, default=5)
    ap.add_argument("--instance-deadline", type=float, default=3.0)
    ap.add_argument("--max-chars", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=2000)
    ap.add_argument("--compile-timeout", type=float, default=30.0)
    ap.add_argument("--replay-timeout", type=float, default=120.0)
    ap.add_argument("--rounds", type=int, default=1, help="passes over the cases")
    ap.add_argument("--smoke", action="store_true",
                    help="3 repository schemas; without --baseline this tree is its own baseline")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    args.no_schemas, args.no_lark, args.grammar = False, True, None
    if args.smoke:  # this tree against itself: exercises the baseline worker too
        args.candidates = 0
        args.baseline = args.baseline or ROOT
    kinds = ["after"] + ([] if args.no_all else ["after-all"]) + (["before"] if args.baseline else [])
    baseline = str(args.baseline.resolve()) if args.baseline else None
    opts = {"compile_timeout": args.compile_timeout, "threads": 1}
    procs = {k: BuildProc(k, baseline, args.tokenizer, opts) for k in kinds}
    t_start = time.time()
    for p in procs.values():
        p.start()
    try:
        tok, vocab = mask_engines.load_vocab(args.tokenizer)
        cases, prep = masks.build_cases(args, tok, vocab)
        cases = [c for c in cases if c.get("tokens")]
        print(f"{len(cases)} replayable cases in {time.time() - t_start:.0f} s", file=sys.stderr)
        for k, p in procs.items():
            if not p.wait_ready():
                print(f"worker {k} failed: {p.unavailable}", file=sys.stderr)
                return 1
        rounds = []
        for rnd in range(args.rounds):
            for c in cases:
                c["raw"] = {}
            for i, c in enumerate(cases):
                slim = {x: c[x] for x in ("kind", "schema", "tokens", "truncated") if x in c}
                j = (i + rnd) % len(kinds)
                for k in kinds[j:] + kinds[:j]:
                    c["raw"][k] = procs[k].run(slim, args.compile_timeout, args.replay_timeout)
                print(f"  round {rnd + 1} case {i + 1}/{len(cases)} {c['name']}: " + ", ".join(
                    f"{k} {c['raw'][k].get('status')} {c['raw'][k].get('compile_ns', 0) / 1e6:.0f} ms"
                    for k in kinds), file=sys.stderr)
            rounds.append(summarise(cases, kinds))
    finally:
        for p in procs.values():
            p.close()
    report = {"benchmark": "masks_builds", "tokenizer": args.tokenizer, "baseline": baseline,
              "args": {k: str(v) for k, v in vars(args).items()}, "prep": prep, "rounds": rounds,
              "load_average": os.getloadavg(), "wall_s": round(time.time() - t_start, 1)}
    for r, s in enumerate(rounds):
        print(f"round {r + 1}: {len(s['cases_compared'])} cases compared")
        for k in kinds:
            print(f"  {k:10s} compile mean {s[k]['compile_mean_ms']} ms median {s[k]['compile_median_ms']} ms"
                  f" | step mean {s[k]['step_mean_us']} us median {s[k]['step_median_us']} us")
        for k in kinds:
            if f"{k}/before" in s:
                print(f"  {k}/before: {s[f'{k}/before']}")
    if args.out:
        envelope_lib.write(args.out, envelope, report, ensure_ascii=False)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
