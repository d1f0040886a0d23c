"""Stream the output as it is committed, then show the generation statistics.

    python examples/streaming_stats.py [--model ALIAS_OR_FOLDER]

``structgen.stream`` yields text increments after every verify step (never text that a later
rollback could take back), so the streamed pieces concatenate to exactly the final output.
The stream itself carries only text; the statistics (forward passes, tokens per pass, drafter
acceptance, time split) come with ``structgen.generate``'s result, here from a second, greedy
run of the same request (token-identical to the streamed one, which this script checks).
Streams the document to stdout; timings and statistics go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import structgen
from structgen.generation.api import DEFAULT_MODEL

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "steps": {"type": "array", "items": {"type": "string", "maxLength": 60},
                  "minItems": 1, "maxItems": 4},
        "minutes": {"type": "integer", "minimum": 1, "maximum": 600},
    },
    "required": ["title", "steps", "minutes"],
    "additionalProperties": False,
}

PROMPT = "A recipe for a cup of tea in a few steps, as JSON."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model alias or local folder")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    args = ap.parse_args(argv)
    request = dict(schema=SCHEMA, messages=[{"role": "user", "content": PROMPT}],
                   max_new_tokens=args.max_new_tokens)

    pieces: list[str] = []
    t0 = time.perf_counter()
    first = None
    for piece in structgen.stream(args.model, **request):
        if first is None:
            first = time.perf_counter() - t0
        pieces.append(piece)
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    wall = time.perf_counter() - t0
    text = "".join(pieces)
    print(f"streamed {len(pieces)} pieces, {len(text)} characters in {wall:.2f}s "
          f"(first piece after {first or 0:.2f}s)", file=sys.stderr)

    r = structgen.generate(args.model, **request)
    s = r.stats
    acc = "n/a" if s.acceptance is None else f"{s.acceptance:.1%}"
    print(f"statistics: {s.new_tokens} tokens, {s.forward_passes} forward passes "
          f"({s.tokens_per_pass:.2f} tokens/pass), {s.free_tokens} free tokens, "
          f"draft acceptance {acc}", file=sys.stderr)
    print("time split (s): " + json.dumps({k[5:]: round(v, 3) for k, v in s.as_dict().items()
                                          if k.startswith("time_") and v is not None}),
          file=sys.stderr)
    for name, d in sorted(s.drafters.items()):
        print(f"  drafter {name}: {d['accepted']}/{d['proposed']} accepted", file=sys.stderr)
    if r.text != text:
        print("the streamed text differs from the generated text", file=sys.stderr)
        return 1
    return 0 if r.value is not None else 1


if __name__ == "__main__":
    sys.exit(main())
