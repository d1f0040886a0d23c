"""A batch of prompts, each with its own JSON Schema, in one call.

    python examples/batch_mixed_schemas.py [--model ALIAS_OR_FOLDER] [--batch-size N]

``structgen.generate`` takes a list of prompts (or conversations) and either one schema for
all of them or a list with one schema per prompt. Every sequence gets its own matcher,
drafters and statistics; compiled grammars are shared. Prints one JSON document per line, in
prompt order, and the per-sequence statistics plus a summary on stderr.
"""

from __future__ import annotations

import argparse
import sys

import structgen
from structgen.generation.api import DEFAULT_MODEL

SCHEMAS = [
    {"type": "object",
     "properties": {"city": {"type": "string", "maxLength": 30},
                    "population": {"type": "integer", "minimum": 0},
                    "capital": {"type": "boolean"}},
     "required": ["city", "population", "capital"], "additionalProperties": False},
    {"type": "object",
     "properties": {"sentiment": {"enum": ["positive", "neutral", "negative"]},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["sentiment", "confidence"], "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "maxLength": 15}, "minItems": 1, "maxItems": 5},
]

PROMPTS = [
    "Paris has about 2100000 inhabitants and is the capital of France. Describe Paris as JSON.",
    "Review: 'The battery lasts forever, I love it.' Classify the sentiment as JSON.",
    "List three primary colours as a JSON array of strings.",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model alias or local folder")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--batch-size", type=int, default=2, help="sequences per micro-batch")
    args = ap.parse_args(argv)

    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    results = structgen.generate(args.model, schema=SCHEMAS, messages=conversations,
                                 max_new_tokens=args.max_new_tokens,
                                 config=structgen.SpecConfig(batch_size=args.batch_size))
    failed = 0
    for i, r in enumerate(results):
        print(r.text)
        s = r.stats
        print(f"[{i}] finish={r.finish_reason} tokens={s.new_tokens} "
              f"tokens/pass={s.tokens_per_pass:.2f}", file=sys.stderr)
        failed += r.value is None
    total = getattr(results, "stats", None)  # the whole call's statistics, when provided
    if total is not None:
        print(f"batch: {total.new_tokens} tokens in {total.forward_passes} forward passes, "
              f"{total.time_total:.2f}s", file=sys.stderr)
    print(f"{len(results)} results, {failed} incomplete", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
