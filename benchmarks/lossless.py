"""Lossless check on a real model: greedy speculative output == plain constrained decoding.

Cases are (prompt, schema) pairs: every extraction task's schema with its own prompt, plus
each task's schema with every other task's text (the model must still produce a valid
instance), and the example schemas in ``schemas/``. For each case both modes run greedily;
the case passes when the token sequences are identical and a completed output validates
with ``jsonschema``.

    python benchmarks/lossless.py --model smollm2-135m --cases 50
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
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import jsonschema  # noqa: E402
import torch  # noqa: E402
from tasks.extraction import TASKS  # noqa: E402

import structgen  # noqa: E402
from structgen.generation.model import load_model  # noqa: E402
from structgen.tools.validation import jsonschema_validator  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--dtype", default="float32", help="model weights: float32, bfloat16, auto")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype=args.dtype)
    rows = []
    ok = 0
    t0 = time.time()
    for name, schema, text in cases(args.cases):
        msgs = [{"role": "user", "content": f"Return JSON for this schema: "
                 f"{json.dumps(schema, separators=(',', ':'))}\n\nText: {text}"}]
        plain = structgen.generate(lm, schema=schema, messages=msgs, max_new_tokens=args.max_new_tokens,
                                   speculative=False)
        spec = structgen.generate(lm, schema=schema, messages=msgs, max_new_tokens=args.max_new_tokens)
        same = plain.tokens == spec.tokens
        valid = True
        if plain.finish_reason == "stop":
            valid = jsonschema_validator(schema, jsonschema.Draft202012Validator).is_valid(
                json.loads(plain.text))
        ok += int(same and valid)
        rows.append({"case": name, "identical": same, "valid": valid, "finish": plain.finish_reason,
                     "tokens": len(plain.tokens), "plain_passes": plain.stats.forward_passes,
                     "spec_passes": spec.stats.forward_passes})
        print(f"{name:28} identical={same} valid={valid} finish={plain.finish_reason} "
              f"tokens={len(plain.tokens)} passes {plain.stats.forward_passes}->{spec.stats.forward_passes}",
              file=sys.stderr)
    print(json.dumps({"model": args.model, "dtype": str(lm.model.dtype), "threads": args.threads,
                      "cases": len(rows), "passed": ok,
                      "seconds": round(time.time() - t0, 1)}))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
