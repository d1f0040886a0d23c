"""Lossless check on a real model: greedy speculative output == plain constrained decoding.

Cases are (prompt, schema) pairs: every extraction task's schema with its own prompt, plus
each task's schema with every other task's text (the model must still produce a valid
instance), and the example schemas in ``schemas/``. For each case both modes run greedily;
the case passes when the token sequences are identical and a completed output validates
with ``jsonschema``.

    python -m benchmarks.lossless --model smollm2-135m --cases 50
    python -m benchmarks.lossless --smoke        # tiny random model, 2 cases (CI)
    python -m benchmarks.lossless --backend llamacpp --model smollm2-135m   # the GGUF, llama.cpp
    python -m benchmarks.lossless --backend llamacpp --smoke   # tiny GGUF written on the fly

``--backend llamacpp`` runs the model's GGUF (``ALIAS-gguf``, or a ``.gguf`` path) on the
llama.cpp backend (needs ``structgen[llamacpp]``) with ``--threads`` threads.

``--out`` writes the summary and every case with the shared envelope of
``benchmarks/common/envelope.py``. Exit status 1 when a case differs or a completed output is invalid.
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
from benchmarks.tasks.extraction import TASKS
from structgen.generation.model import load_model
from structgen.validation import jsonschema_validator


def cases(n: int) -> list[tuple[str, dict[str, Any], str]]:
    out: list[tuple[str, dict[str, Any], str]] = []
    for t in TASKS:
        out.append((t["name"], t["schema"], t["text"]))
    for sp in sorted((ROOT / "schemas").glob("*.schema.json")):
        schema = json.loads(sp.read_text())
        out.append((sp.stem, schema, "Produce an example instance."))
    for i, t in enumerate(TASKS):
        for j, u in enumerate(TASKS):
            if i != j:
                out.append((f"{t['name']}<-{u['name']}", t["schema"], u["text"]))
    return out[:n]


# --smoke: one extraction task (the tiny model runs it to the length limit) and one example schema
# the tiny model completes, so that a completed output is validated too
SMOKE_CASES = ("person", "config.schema")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--start", type=int, default=0,
                    help="skip the first START of the --cases cases (finish a run that was cut short)")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--dtype", default="float32", help="model weights: float32, bfloat16, auto")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--backend", choices=("transformers", "llamacpp"), default="transformers",
                    help="llamacpp: the model's GGUF run by llama.cpp (ALIAS-gguf or a .gguf path)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny random model biased towards short outputs, 2 cases, 32 new tokens (CI)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    torch.set_num_threads(args.threads)
    if args.backend == "llamacpp":
        from benchmarks.common import llamacpp_model

        lm, _path, args.model = llamacpp_model.load(args.model, args.threads, args.smoke)
        if args.smoke:
            args.max_new_tokens = 32
    elif args.smoke:
        from benchmarks import bench_suite as bench

        lm = bench.tiny_model(favour=bench.SMOKE_FAVOUR)
        args.model, args.max_new_tokens = "tiny-random", 32
    else:
        lm = load_model(args.model, dtype=args.dtype)
    todo = ([c for c in cases(len(TASKS) ** 2 + 10) if c[0] in SMOKE_CASES] if args.smoke
            else cases(args.cases)[args.start:])
    rows = []
    ok = 0
    t0 = time.time()
    for name, schema, text in todo:
        msgs = [{"role": "user", "content": f"Return JSON for this schema: "
                 f"{json.dumps(schema, separators=(',', ':'))}\n\nText: {text}"}]
        # on_budget="cut": outputs as the model would give them (benchmarks/budget.py checks "close")
        plain = structgen.generate(lm, schema=schema, messages=msgs, max_new_tokens=args.max_new_tokens,
                                   speculative=False, on_budget="cut")
        spec = structgen.generate(lm, schema=schema, messages=msgs, max_new_tokens=args.max_new_tokens,
                                  on_budget="cut")
        same = plain.tokens == spec.tokens
        valid = True
        if plain.complete:
            valid = jsonschema_validator(schema, jsonschema.Draft202012Validator).is_valid(
                json.loads(plain.text))
        ok += int(same and valid)
        rows.append({"case": name, "identical": same, "valid": valid, "finish": plain.finish_reason,
                     "tokens": len(plain.tokens), "plain_passes": plain.stats.forward_passes,
                     "spec_passes": spec.stats.forward_passes})
        print(f"{name:28} identical={same} valid={valid} finish={plain.finish_reason} "
              f"tokens={len(plain.tokens)} passes {plain.stats.forward_passes}->{spec.stats.forward_passes}",
              file=sys.stderr)
    summary = {"model": args.model, "backend": args.backend,
               "dtype": "gguf" if args.backend == "llamacpp" else str(lm.model.dtype),
               "threads": args.threads,
               "max_new_tokens": args.max_new_tokens, "start": args.start, "cases": len(rows), "passed": ok,
               "seconds": round(time.time() - t0, 1)}
    print(json.dumps(summary))
    if args.out:
        envelope_lib.write(args.out, envelope, {"summary": summary, "cases": rows})
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
