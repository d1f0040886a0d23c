"""Constrain ``transformers``' own ``model.generate`` with a structgen logits processor.

    python examples/logits_processor.py [--model ALIAS_OR_FOLDER] [--sample]

For code that keeps its ``model.generate(...)`` calls: ``StructgenLogitsProcessor`` masks
every row of a (left-padded) batch to the tokens its grammar allows, and allows EOS exactly
when the row's output is complete. This is plain constrained decoding (no speculation);
``structgen.generate`` is the faster path. Prints one JSON document per prompt on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from structgen.generation.api import DEFAULT_MODEL

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "kind": {"enum": ["person", "place", "thing"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "kind", "tags"],
    "additionalProperties": False,
}

PROMPTS = [
    "Describe the Eiffel Tower as JSON.",
    "Describe Marie Curie, the physicist and chemist, as JSON.",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model alias or local folder")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--sample", action="store_true", help="sample (temperature 0.7) instead of greedy")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from structgen.assets.store import resolve_model
    from structgen.integrations import StructgenLogitsProcessor

    path = resolve_model(args.model)  # an alias must have been pulled (`structgen models pull`)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # decoder-only models continue on the right
    if tok.chat_template:
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                         add_generation_prompt=True) for p in PROMPTS]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    else:
        enc = tok(PROMPTS, return_tensors="pt", padding=True)

    eos = model.generation_config.eos_token_id  # EOS is allowed exactly when the JSON is complete
    # max_new_tokens: every row closes its JSON within the budget instead of being cut short
    proc = StructgenLogitsProcessor(SCHEMA, tok, eos_token_ids=eos, max_new_tokens=args.max_new_tokens)
    sampling = dict(do_sample=True, temperature=0.7, top_p=0.95) if args.sample else dict(do_sample=False)
    torch.manual_seed(0)
    out = model.generate(**enc, logits_processor=[proc], max_new_tokens=args.max_new_tokens,
                         pad_token_id=tok.pad_token_id, **sampling)

    eos_ids = {eos} if isinstance(eos, int) else set(eos or [tok.eos_token_id])
    failed = 0
    new = out[:, enc["input_ids"].shape[1]:]  # [batch, generated]; finished rows padded
    for row in range(new.shape[0]):
        text = tok.decode(new[row], skip_special_tokens=True)
        print(text)
        if not eos_ids & set(new[row].tolist()):  # EOS was allowed only once complete
            failed += 1
            print(f"row {row}: no EOS within --max-new-tokens", file=sys.stderr)
        else:
            json.loads(text)  # a finished row is a complete document
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
