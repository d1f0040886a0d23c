"""Quickstart: a JSON Schema in, a valid JSON document out.

    python examples/quickstart_json_schema.py                  # the default model
    python examples/quickstart_json_schema.py --model PATH     # any local HF model folder

Prints the generated document on stdout (one line) and the generation statistics on stderr.
Exits 1 when the output was cut short by --max-new-tokens (it is then not a complete document).
"""

from __future__ import annotations

import argparse
import json
import sys

import structgen
from structgen.generation.api import DEFAULT_MODEL

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}

PROMPT = ("Ada Lovelace, 36, writes to ada@analytical.org and speaks English, French and "
          "Italian. Give her details as JSON.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model alias or local folder")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    args = ap.parse_args(argv)

    # compile once; the compiled grammar is cached and can be reused for many requests
    grammar = structgen.compile_json_schema(SCHEMA)
    print(f"grammar: {grammar!r}", file=sys.stderr)

    r = structgen.generate(args.model, schema=SCHEMA, max_new_tokens=args.max_new_tokens,
                           messages=[{"role": "user", "content": PROMPT}])
    print(r.text)
    s = r.stats
    print(f"finish={r.finish_reason} tokens={s.new_tokens} forward_passes={s.forward_passes} "
          f"tokens/pass={s.tokens_per_pass:.2f} time={s.time_total:.2f}s", file=sys.stderr)
    if r.value is None:
        print("incomplete output (raise --max-new-tokens)", file=sys.stderr)
        return 1
    assert r.value == json.loads(r.text)  # r.value is the parsed document
    return 0


if __name__ == "__main__":
    sys.exit(main())
