"""Batch benchmark: 32 mixed-schema requests in one call vs one at a time.

Requests (``--requests``, default 32): every extraction task of ``benchmarks/tasks/extraction.py``
with its own text, every example schema in ``schemas/`` ("produce an example instance"), then
task schemas paired with other tasks' texts, until the count is reached. Four engines run the
same requests greedily on the same model, interleaved per repeat so machine noise hits all:

* ``batch-spec``  -- one ``structgen.generate`` call with the list (speculative, micro-batches of
  ``--batch-size``: one batched target forward per step);
* ``batch-plain`` -- the same call with ``speculative=False`` (batched plain constrained decoding);
* ``single-spec`` / ``single-plain`` -- one call per request (batch 1);
* ``batch-spec-serial`` (not in the default list) -- ``batch-spec`` with
  ``SpecConfig(overlap_masks=False)``: the masks built before each target forward instead of
  while it runs, to measure that overlap; run it with ``--overlap`` so that ``batch-spec``
  overlaps (on the CPU overlap is opt-in: a worker thread builds the masks). ``--repeats N``
  runs the engines N times, interleaved, and reports the median wall time.

``--interleave`` runs the one-at-a-time engines request by request (request 1 with every
single engine, then request 2, the engine order rotated per request) instead of each engine over
all requests in turn: on a shared machine whose load drifts over minutes, a whole-engine run
catches another load than the next one, and the ratio of two such runs can be off by 1.5x
(seen: ``single-spec`` at 0.54x and 0.86x ``single-plain`` in separate runs, 1.6x with the
same requests alternated). The batch engines still run whole.

Reported per engine: wall time, output tokens, throughput (output tokens / s, prefill included),
target forward passes (batched passes for the batch engines), valid outputs (``jsonschema``),
finish reasons, and whether each output is token-identical to ``single-plain`` (the exactness
oracle). Speed ratios are against ``single-plain`` and ``single-spec``.

    python -m benchmarks.batch                                   # smollm2-135m, 32 requests
    python -m benchmarks.batch --model qwen2.5-coder-0.5b
    python -m benchmarks.batch --smoke                           # tiny random model, 4 requests (CI)
    python -m benchmarks.batch --backend llamacpp --requests 16 --interleave   # smollm2-135m's GGUF
    python -m benchmarks.batch --backend llamacpp --smoke        # tiny GGUF written on the fly

``--backend llamacpp`` runs the model's GGUF (``ALIAS-gguf`` or a ``.gguf`` path) on structgen's
llama.cpp backend (one unified cache, one ``llama_decode`` per batched step).

The full mode writes ``benchmarks/results/batch-<model>-<device>.json`` (``--out``; the smoke writes
only with ``--out``), with the shared envelope of ``benchmarks/common/envelope.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
import jsonschema
import torch

import structgen
from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT
from benchmarks.tasks.extraction import TASKS, messages
from structgen.config import SpecConfig
from structgen.generation.model import CausalLM, load_model
from structgen.validation import jsonschema_validator

ENGINES = ("batch-spec", "batch-plain", "single-spec", "single-plain")
EXTRA_ENGINES = ("batch-spec-serial",)
OVERLAP = False  # --overlap: the spec engines build masks while the forward runs (CPU included)


def requests(n: int) -> list[dict[str, Any]]:
    """``n`` (name, schema, messages) requests with mixed schemas (see the module doc)."""
    out: list[dict[str, Any]] = []
    for t in TASKS:
        out.append({"name": t["name"], "schema": t["schema"], "messages": messages(t)})
    for sp in sorted((ROOT / "schemas").glob("*.schema.json")):
        schema = json.loads(sp.read_text())
        out.append({"name": sp.name.removesuffix(".schema.json"), "schema": schema, "messages": [
            {"role": "user", "content": "Produce an example instance of this JSON schema: "
                                        + json.dumps(schema, separators=(",", ":"))}]})
    for i, t in enumerate(TASKS):
        for j, u in enumerate(TASKS):
            if i != j:
                msgs = messages(t)
                body = msgs[-1]["content"].replace(t["text"], u["text"])
                out.append({"name": f"{t['name']}<-{u['name']}", "schema": t["schema"],
                            "messages": msgs[:-1] + [{"role": msgs[-1]["role"], "content": body}]})
    return out[:n]


def _valid(schema: dict[str, Any], r: Any) -> bool:
    if not r.complete:
        return False
    try:
        return jsonschema_validator(schema, jsonschema.Draft202012Validator).is_valid(json.loads(r.text))
    except ValueError:
        return False


def _single(lm: CausalLM, engine: str, q: dict[str, Any], max_new: int, cfg: SpecConfig) -> tuple[Any, float]:
    t0 = time.perf_counter()
    # on_budget="cut" as in run_engine: the batch engines cut too, so outputs stay comparable
    r = structgen.generate(lm, schema=q["schema"], messages=q["messages"], max_new_tokens=max_new,
                           speculative="spec" in engine, config=cfg, on_budget="cut")
    return r, time.perf_counter() - t0


def run_singles_interleaved(lm: CausalLM, engines: list[str], reqs: list[dict[str, Any]], max_new: int,
                            batch_size: int) -> dict[str, dict[str, Any]]:
    """The one-at-a-time ``engines`` request by request, the engine order rotated per request;
    one result per engine as :func:`run_engine` gives it (wall time = the sum of its calls)."""
    cfg = SpecConfig(batch_size=batch_size, overlap_masks=True if OVERLAP else None)
    got: dict[str, list[Any]] = {e: [] for e in engines}
    wall = {e: 0.0 for e in engines}
    for i, q in enumerate(reqs):
        order = engines[i % len(engines):] + engines[: i % len(engines)]
        for e in order:
            r, dt = _single(lm, e, q, max_new, cfg)
            got[e].append(r)
            wall[e] += dt
    return {e: _summarise(e, reqs, got[e], wall[e], sum(r.stats.forward_passes for r in got[e]),
                          {"drafted": sum(r.stats.drafted for r in got[e]),
                           "accepted": sum(r.stats.accepted for r in got[e]),
                           "draft_cut": sum(getattr(r.stats, "draft_cut", 0) for r in got[e])})
            for e in engines}


def run_engine(lm: CausalLM, engine: str, reqs: list[dict[str, Any]], max_new: int,
               batch_size: int) -> dict[str, Any]:
    speculative = "spec" in engine
    cfg = SpecConfig(batch_size=batch_size,
                     overlap_masks=False if engine.endswith("serial") else (True if OVERLAP else None))
    t0 = time.perf_counter()
    if engine.startswith("batch"):
        rs = structgen.generate(lm, schema=[q["schema"] for q in reqs],
                                messages=[q["messages"] for q in reqs], max_new_tokens=max_new,
                                speculative=speculative, config=cfg, on_budget="cut")
        passes = rs.stats.forward_passes
        extra = {"row_forward_passes": rs.stats.row_forward_passes,
                 "real_positions": rs.stats.real_positions,
                 "padded_positions": rs.stats.padded_positions,
                 "micro_batches": rs.stats.micro_batches,
                 "time": {k: round(getattr(rs.stats, k), 3) for k in
                          ("time_prefill", "time_forward", "time_verify", "time_masks",
                           "time_drafting")},
                 "drafted": rs.stats.drafted, "accepted": rs.stats.accepted,
                 "drafters": rs.stats.drafters}
    else:
        rs = [structgen.generate(lm, schema=q["schema"], messages=q["messages"],
                                 max_new_tokens=max_new, speculative=speculative, config=cfg,
                                 on_budget="cut")
              for q in reqs]
        passes = sum(r.stats.forward_passes for r in rs)
        extra = {"drafted": sum(r.stats.drafted for r in rs),
                 "accepted": sum(r.stats.accepted for r in rs)}
    return _summarise(engine, reqs, rs, time.perf_counter() - t0, passes, extra)


def _summarise(engine: str, reqs: list[dict[str, Any]], rs: Any, wall: float, passes: int,
               extra: dict[str, Any]) -> dict[str, Any]:
    tokens = sum(len(r.tokens) for r in rs)
    valid = [_valid(q["schema"], r) for q, r in zip(reqs, rs)]
    finish: dict[str, int] = {}
    for r in rs:
        finish[r.finish_reason] = finish.get(r.finish_reason, 0) + 1
    return {"engine": engine, "wall_s": round(wall, 3), "output_tokens": tokens,
            "tokens_per_s": round(tokens / wall, 2), "forward_passes": passes,
            "tokens_per_pass": round(tokens / passes, 3) if passes else None,
            "valid": sum(valid), "requests": len(reqs), "finish_reasons": finish,
            "outputs": [r.tokens for r in rs], "invalid": [q["name"] for q, v in zip(reqs, valid) if not v],
            **extra}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--backend", choices=("transformers", "llamacpp"), default="transformers",
                    help="llamacpp: the model's GGUF (ALIAS-gguf or a .gguf path) run by llama.cpp")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved runs per engine (median wall time)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny random model, 4 requests of 16 new tokens (CI); writes only with --out")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--overlap", action="store_true", help="overlap mask building with the forward")
    ap.add_argument("--interleave", action="store_true",
                    help="one-at-a-time engines request by request, alternated (see the module doc)")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    global OVERLAP
    OVERLAP = args.overlap
    torch.set_num_threads(args.threads)
    engines = [e for e in args.engines.split(",") if e]
    unknown = set(engines) - set(ENGINES) - set(EXTRA_ENGINES)
    if unknown:
        ap.error(f"unknown engines {sorted(unknown)}; choose from {ENGINES}")
    name = args.model
    if args.backend == "llamacpp":
        from benchmarks.common import llamacpp_model

        lm, _path, name = llamacpp_model.load(args.model, args.threads, args.smoke)
    elif args.smoke:
        from benchmarks.bench_suite import tiny_model

        lm = tiny_model()
        name = "tiny-random"
    else:
        lm = load_model(args.model)
    if args.smoke:
        args.requests, args.max_new_tokens, args.batch_size = 4, 16, 2
    reqs = requests(args.requests)
    # warm-up: grammar compilation (cached per schema) and first-call costs outside the timing
    structgen.generate(lm, schema=[q["schema"] for q in reqs], messages=[q["messages"] for q in reqs],
                       max_new_tokens=2, speculative=False, config=SpecConfig(batch_size=args.batch_size),
                       on_budget="cut")
    results: dict[str, dict[str, Any]] = {}
    walls: dict[str, list[float]] = {e: [] for e in engines}
    singles = [e for e in engines if e.startswith("single")] if args.interleave else []
    for rep in range(max(1, args.repeats)):
        pre = (run_singles_interleaved(lm, singles, reqs, args.max_new_tokens, args.batch_size)
               if singles else {})
        for e in engines:
            r = pre[e] if e in pre else run_engine(lm, e, reqs, args.max_new_tokens, args.batch_size)
            walls[e].append(r["wall_s"])
            if e in results and results[e]["outputs"] != r["outputs"]:
                print(f"NOTE: {e} repeat {rep} gave other outputs", file=sys.stderr)
            results[e] = r
            r["wall_s_runs"] = list(walls[e])
            r["wall_s"] = round(sorted(walls[e])[len(walls[e]) // 2], 3)
            r["tokens_per_s"] = round(r["output_tokens"] / r["wall_s"], 2)
            print(f"{e:17} {r['wall_s']:8.1f} s  {r['output_tokens']:6d} tokens  "
                  f"{r['tokens_per_s']:7.1f} tok/s  {r['forward_passes']:6d} passes  "
                  f"valid {r['valid']}/{r['requests']}  {r['finish_reasons']}  {r.get('time', '')}",
                  file=sys.stderr)
    oracle = results.get("single-plain")
    summary: dict[str, Any] = {}
    for e, r in results.items():
        s = {k: r[k] for k in ("wall_s", "wall_s_runs", "output_tokens", "tokens_per_s", "forward_passes",
                               "tokens_per_pass", "valid", "requests", "finish_reasons")}
        if oracle is not None and e != "single-plain":
            same = sum(a == b for a, b in zip(r["outputs"], oracle["outputs"]))
            s["identical_to_single_plain"] = f"{same}/{len(reqs)}"
        for base in ("single-plain", "single-spec"):
            if base in results and base != e:
                s[f"throughput_vs_{base}"] = round(r["tokens_per_s"] / results[base]["tokens_per_s"], 3)
        summary[e] = s
    if "batch-spec" in results and "batch-spec-serial" in results:
        a, b = results["batch-spec"], results["batch-spec-serial"]
        summary["overlap"] = {"wall_s_overlapped": a["wall_s"], "wall_s_serial": b["wall_s"],
                              "saving_s": round(b["wall_s"] - a["wall_s"], 3),
                              "speedup": round(b["wall_s"] / a["wall_s"], 3),
                              "mask_time_s": a["time"]["time_masks"],
                              "same_outputs": a["outputs"] == b["outputs"]}
    print(json.dumps(summary, indent=1))
    meta = {"model": name, "backend": args.backend, "requests": len(reqs),
            "request_names": [q["name"] for q in reqs], "batch_size": args.batch_size,
            "max_new_tokens": args.max_new_tokens, "greedy": True, "threads": args.threads,
            "interleave": args.interleave,
            "device": str(lm.device)}
    out = args.out
    if out is None and not args.smoke:
        out = ROOT / "benchmarks" / "results" / f"batch-{name}-{lm.device.type}.json"
    if out is not None:
        envelope_lib.write(out, envelope, {"meta": meta, "summary": summary, "results": results})
        print(f"wrote {out}", file=sys.stderr)
    bad = [e for e, s in summary.items() if str(s.get("identical_to_single_plain", "x/x")).split("/")[0]
           != str(len(reqs)) and "identical_to_single_plain" in s]
    if bad:
        print(f"NOTE: outputs differ from single-plain for {bad}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
