"""Time to first mask (TTFM) per phase, and the warm step, in one warm process (private helper).

Two steps, so that "before" and "after" trees measure the same cases:

1. ``--prepare CASES.json``: a fixed sample of JSONSchemaBench schemas (``--limit`` per subset,
   ``--seed``) with one replayed valid instance each (as in ``benchmarks/masks.py``: the
   schema's examples and hypothesis-jsonschema instances, serialised with ``canonical_json``
   and tokenized with the Llama-3 tokenizer);
2. ``--run CASES.json --out OUT.json``: in this process, warm up (a small schema compiled and
   replayed, then the Unicode-class / formats schema of ``benchmarks/common/mask_engines.py``), then per case:
   clear structgen's content caches (``StructgenAdapter.clear_caches``), ``gc.collect()``, and
   time compile, ``Matcher`` creation and the first ``fill_bitmask`` (TTFM = their sum); then
   replay the instance and time every ``accept_token`` + ``fill_bitmask`` step; then replay it
   a second time on a fresh matcher (every mask cached: the *warm step*). With ``--disk``, the
   time to first mask of the same grammar loaded from the disk cache, as a restarted
   ``structgen serve`` gets it (``structgen_disk``). With ``--phases``
   the compile is run once more, cold, with timers around its phases (schema document,
   normaliser, lowering, automaton compile, rule sources, engine set-up). With
   ``--llguidance`` llguidance runs each case too, in the same process, right before or
   after structgen (alternating).

Run it from the tree to measure (``python -m`` puts the current directory first, so ``import
structgen`` resolves to it)::

    python -m benchmarks.common.ttfm --prepare /tmp/ttfm-cases.json --limit 15
    python -m benchmarks.common.ttfm --run /tmp/ttfm-cases.json --llguidance --phases --out ttfm.json

In a tree without this module (an older checkout), put this checkout on ``PYTHONPATH``:
``PYTHONPATH=/path/to/this/checkout python -m benchmarks.common.ttfm --run ...``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def prepare(args: argparse.Namespace) -> None:
    from benchmarks import masks as mb
    from benchmarks.common.mask_engines import load_vocab

    tok, vocab = load_vocab("llama3")
    ns = argparse.Namespace(no_schemas=False, no_lark=True, smoke=False, data=mb.default_data(),
                            subset=None, limit=args.limit, seed=args.seed, candidates=args.candidates,
                            instance_deadline=args.instance_deadline, max_chars=3000, max_tokens=2000)
    cases, info = mb.build_cases(ns, tok, vocab)
    out = [{"name": c["name"], "schema": c["schema"], "tokens": c.get("tokens"),
            "truncated": bool(c.get("truncated"))} for c in cases]
    Path(args.prepare).write_text(json.dumps({"info": info, "cases": out}))
    print(f"{len(out)} cases, {sum(bool(c['tokens']) for c in out)} with an instance -> {args.prepare}")


class _Phases:
    """Timers wrapped around the compile path's phases (installed only with ``--phases``)."""

    def __init__(self) -> None:
        self.t: dict[str, int] = {}
        self._patched: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr)
        t = self.t
        clock = time.perf_counter_ns

        def timed(*a: Any, **k: Any) -> Any:
            s = clock()
            try:
                return fn(*a, **k)
            finally:
                t[label] = t.get(label, 0) + clock() - s

        self._patched.append((owner, attr, fn))
        setattr(owner, attr, timed)

    def install(self) -> None:
        import structgen.frontends.json_schema.compiler as jc
        import structgen.grammar.compiler as gcomp
        import structgen.masks.matcher as mm
        from structgen.frontends.json_schema import lower

        self.wrap(jc, "SchemaDoc", "doc")
        self.wrap(jc, "Normalizer", "normalizer")
        self.wrap(lower.Lowering, "build", "lower")
        self.wrap(gcomp, "compile_grammar", "automaton")
        self.wrap(jc, "rule_sources", "rule_sources")
        self.wrap(mm, "engine_for", "engine_setup")

    def uninstall(self) -> None:
        for owner, attr, fn in reversed(self._patched):
            setattr(owner, attr, fn)
        self._patched.clear()


def run(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    import structgen
    from benchmarks.common.mask_engines import (
        WARMUP_SCHEMA,
        WARMUP_TABLES_SCHEMA,
        WARMUP_TEXT,
        StructgenAdapter,
        load_vocab,
    )

    data = json.loads(Path(args.run).read_text())
    cases = data["cases"]
    if args.only:
        cases = [c for c in cases if any(s in c["name"] for s in args.only)]
    tok, vocab = load_vocab("llama3")
    sg = StructgenAdapter(tok, vocab, {"compile_timeout": args.compile_timeout})
    if args.mode == "generation":
        from structgen.config import CompileOptions, JsonSchemaOptions
        from structgen.json_schema import compile_json_schema

        gen_opts = JsonSchemaOptions().for_generation()
        copts = CompileOptions(timeout_s=args.compile_timeout)
        sg.compile = lambda case: compile_json_schema(case["schema"], options=gen_opts,  # type: ignore[method-assign]
                                                      compile_options=copts)
    llg = None
    if args.llguidance:
        from benchmarks.common.mask_engines import LlguidanceAdapter

        llg = LlguidanceAdapter(tok, vocab, {})
    words = (vocab.vocab_size + 31) // 32
    bm = torch.zeros((1, words), dtype=torch.int32)
    clock = time.perf_counter_ns

    import structgen.grammar.compiler as gcomp

    def one(adapter: Any, case: dict[str, Any], phases: _Phases | None = None) -> dict[str, Any]:
        adapter.clear_caches()
        if adapter is sg and args.clear_regular:  # content-keyed; masks.py keeps them
            gcomp._REGULAR.clear()
            gcomp._DFA_RULES.clear()
        gc.collect()
        bm.zero_()
        c = {"kind": "schema", "schema": case["schema"]}
        t0 = clock()
        try:
            compiled = adapter.compile(c)
        except Exception as e:  # noqa: BLE001 - compile errors and crashes are both recorded
            return {"status": "error", "error": f"{type(e).__name__}: {str(e)[:160]}",
                    "compile_ms": (clock() - t0) / 1e6}
        t1 = clock()
        try:
            m = adapter.new_matcher(compiled)
            t2 = clock()
            adapter.fill(m, bm)
        except Exception as e:  # noqa: BLE001 - e.g. a validation grammar with value checks
            return {"status": "error", "error": f"{type(e).__name__}: {str(e)[:160]}",
                    "compile_ms": (t1 - t0) / 1e6}
        t3 = clock()
        res = {"status": "ok", "compile_ms": (t1 - t0) / 1e6, "matcher_ms": (t2 - t1) / 1e6,
               "first_fill_ms": (t3 - t2) / 1e6, "ttfm_ms": (t3 - t0) / 1e6}
        if phases is not None:
            return res
        toks = case.get("tokens") or []
        steps: list[int] = []
        reject = None
        for i, t in enumerate(toks):
            s0 = clock()
            ok = adapter.advance(m, t)
            adapter.fill(m, bm)
            steps.append(clock() - s0)
            if not ok:
                reject = i
                break
        res["cold_steps"] = len(steps)
        res["cold_step_med_us"] = float(np.median(steps)) / 1e3 if steps else None
        res["reject"] = reject
        if toks and reject is None:
            # warm: the same path again on a fresh matcher (llguidance: a fresh compile's matcher)
            m2 = adapter.new_matcher(adapter.compile(c) if adapter is llg else compiled)
            adapter.fill(m2, bm)
            warm: list[int] = []
            for t in toks:
                s0 = clock()
                adapter.advance(m2, t)
                adapter.fill(m2, bm)
                warm.append(clock() - s0)
            res["warm_steps_ns"] = warm
        return res

    def one_from_disk(case: dict[str, Any]) -> dict[str, Any]:
        """Time to first mask when an earlier process stored the grammar (``structgen serve``
        after a restart): the grammar is compiled and filed in the disk cache, the in-memory
        caches cleared, then loaded (``compile_json_schema_cached``), a matcher made and the
        first mask filled."""
        import structgen.grammar_cache as gcache
        from structgen.config import JsonSchemaOptions

        opts = JsonSchemaOptions(string_escapes="canonical")
        copts = sg._copts

        def load() -> Any:
            return gcache.compile_json_schema_cached(case["schema"], options=opts, compile_options=copts,
                                                     for_generation=args.mode == "generation")

        sg.clear_caches()
        load()  # the earlier process: compiled and stored
        sg.clear_caches()
        gcache._LOADED.clear()
        gc.collect()
        bm.zero_()
        t0 = clock()
        compiled = load()
        t1 = clock()
        m = sg.new_matcher(compiled)
        t2 = clock()
        sg.fill(m, bm)
        t3 = clock()
        return {"status": "ok", "compile_ms": (t1 - t0) / 1e6, "matcher_ms": (t2 - t1) / 1e6,
                "first_fill_ms": (t3 - t2) / 1e6, "ttfm_ms": (t3 - t0) / 1e6}

    if args.disk:
        import tempfile

        os.environ["STRUCTGEN_GRAMMAR_CACHE"] = tempfile.mkdtemp(prefix="ttfm-grammars-")
    warm_case = {"schema": WARMUP_SCHEMA, "tokens": tok.encode(WARMUP_TEXT, add_special_tokens=False)}
    for a in [sg] + ([llg] if llg else []):
        one(a, warm_case)
        try:
            one(a, {"schema": WARMUP_TABLES_SCHEMA, "tokens": []})
        except Exception:  # noqa: BLE001 - as in mask_engines: the compile itself warmed the tables
            pass
    results = []
    t_start = time.time()
    for i, case in enumerate(cases):
        row: dict[str, Any] = {"name": case["name"], "tokens": len(case.get("tokens") or [])}
        order = [("structgen", sg)] + ([("llguidance", llg)] if llg else [])
        if i % 2:
            order.reverse()
        for name, a in order:
            row[name] = one(a, case)
        if args.disk and row["structgen"]["status"] == "ok":
            row["structgen_disk"] = one_from_disk(case)
        if args.phases and row["structgen"]["status"] == "ok":
            ph = _Phases()
            ph.install()
            try:
                r = one(sg, case, ph)
            finally:
                ph.uninstall()
            r["phases_ms"] = {k: v / 1e6 for k, v in ph.t.items()}
            row["structgen_phased"] = r
        results.append(row)
        s = row["structgen"]
        if s.get("ttfm_ms", 0) > 100 or args.verbose:
            print(f"  {case['name']}: structgen {s.get('ttfm_ms', 0):.1f} ms "
                  f"({s.get('status')}); llguidance {row.get('llguidance', {}).get('ttfm_ms', 0):.1f} ms",
                  file=sys.stderr)
    report = {"structgen_file": structgen.__file__, "mode": args.mode, "cases": len(results),
              "wall_s": round(time.time() - t_start, 1), "load": os.getloadavg(),
              "summary": summarise(results), "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    import numpy as np

    out: dict[str, Any] = {}
    both = [r for r in results if r["structgen"].get("status") == "ok"
            and r.get("llguidance", {}).get("status", "ok") == "ok"]
    for eng in ("structgen", "structgen_disk", "llguidance"):
        rs = [r[eng] for r in both if eng in r]
        if not rs:
            continue
        s: dict[str, Any] = {"cases": len(rs)}
        for k in ("compile_ms", "matcher_ms", "first_fill_ms", "ttfm_ms"):
            xs = np.asarray([r[k] for r in rs])
            s[k] = {f"p{q}": round(float(np.percentile(xs, q)), 3) for q in (50, 90, 99)}
            s[k]["max"] = round(float(xs.max()), 3)
        warm = [x for r in rs for x in r.get("warm_steps_ns", [])]
        if warm:
            w = np.asarray(warm) / 1e3
            s["warm_step_us"] = {"steps": len(warm), "p50": round(float(np.median(w)), 2),
                                 "mean": round(float(w.mean()), 2),
                                 "p99": round(float(np.percentile(w, 99)), 2)}
        s["rejects"] = sum(r.get("reject") is not None for r in rs)
        out[eng] = s
    ph = [r["structgen_phased"]["phases_ms"] for r in results if "structgen_phased" in r]
    if ph:
        keys = sorted({k for p in ph for k in p})
        out["phases_ms_p50"] = {k: round(float(np.median([p.get(k, 0.0) for p in ph])), 3) for k in keys}
        out["phases_ms_sum"] = {k: round(float(sum(p.get(k, 0.0) for p in ph)), 1) for k in keys}
    out["errors"] = [(r["name"], r["structgen"].get("error")) for r in results
                     if r["structgen"].get("status") != "ok"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", help="write the cases here")
    ap.add_argument("--run", help="read the cases here and measure")
    ap.add_argument("--limit", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--candidates", type=int, default=10)
    ap.add_argument("--instance-deadline", type=float, default=5.0)
    ap.add_argument("--compile-timeout", type=float, default=20.0)
    ap.add_argument("--mode", choices=("masks", "generation"), default="masks",
                    help="masks: masks.py's structgen settings (string_escapes='canonical', else the "
                         "validation defaults); generation: JsonSchemaOptions().for_generation() "
                         "(strict, canonical numbers, no value checks), as generate/serve compile")
    ap.add_argument("--llguidance", action="store_true")
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--disk", action="store_true",
                    help="also time the first mask of a grammar loaded from the disk cache")
    ap.add_argument("--clear-regular", action="store_true",
                    help="clear the regular sub-automata caches too (benchmarks/masks.py keeps them)")
    ap.add_argument("--only", action="append", help="only cases whose name contains this")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.prepare:
        prepare(args)
    if args.run:
        run(args)


if __name__ == "__main__":
    main()
