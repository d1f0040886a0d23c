"""Speculative decoding with a draft model (plus grammar-forced and prompt-lookup drafts).

    python examples/draft_model_speculation.py --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b
    python examples/draft_model_speculation.py            # default model drafting for itself

The draft model must share the target's tokenizer. Its proposals are masked by the grammar,
cut to their longest grammar-valid prefix and verified by the target in one forward pass, so
greedy output is token-identical to plain constrained decoding; this script checks that by
also running ``speculative=False``. Prints the document on stdout; on stderr the forward
passes of both runs and the acceptance of each drafter (accepted / proposed draft tokens).
"""

from __future__ import annotations

import argparse
import sys

import structgen
from structgen.generation.api import DEFAULT_MODEL

SCHEMA = {
    "type": "object",
    "properties": {
        "product": {"type": "string", "maxLength": 40},
        "price": {"type": "number", "minimum": 0},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "in_stock": {"type": "boolean"},
    },
    "required": ["product", "price", "currency", "in_stock"],
    "additionalProperties": False,
}

PROMPT = ("Listing: 'Mechanical keyboard, 89.90 EUR, ships tomorrow (in stock)'. "
          "Extract product, price, currency and in_stock as JSON.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="target model alias or local folder")
    ap.add_argument("--draft-model", default=None,
                    help="draft model with the same tokenizer (default: --model itself)")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    args = ap.parse_args(argv)
    draft = args.draft_model or args.model

    common = dict(schema=SCHEMA, messages=[{"role": "user", "content": PROMPT}],
                  max_new_tokens=args.max_new_tokens)
    spec = structgen.generate(args.model, draft_model=draft, **common)
    plain = structgen.generate(args.model, speculative=False, **common)

    print(spec.text)
    s, p = spec.stats, plain.stats
    print(f"speculative: {s.new_tokens} tokens in {s.forward_passes} target passes "
          f"({s.tokens_per_pass:.2f} tokens/pass, {s.time_total:.2f}s); plain: "
          f"{p.forward_passes} passes ({p.time_total:.2f}s)", file=sys.stderr)
    for name, d in sorted(s.drafters.items()):
        acc = d.get("acceptance")
        acc_s = "n/a" if acc is None else f"{acc:.1%}"
        print(f"  drafter {name}: proposed {d['proposed']}, accepted {d['accepted']} ({acc_s})",
              file=sys.stderr)
    same = spec.tokens == plain.tokens
    print(f"greedy output identical to plain constrained decoding: {same}", file=sys.stderr)
    if not same or spec.value is None:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
