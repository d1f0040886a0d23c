"""structgen as the structured-output backend of a serving engine (vLLM-style contract).

    python examples/vllm_style_backend.py [--model ALIAS_OR_FOLDER]

A serving engine owns the batch, the KV cache and sampling; per request it asks a grammar
object for a token bitmask, applies it to the logits, and reports back which tokens it
committed. ``StructgenBackend`` compiles each constraint once (cached) and hands out one
``StructgenGrammar`` per request with the contract's verbs: ``fill_bitmask(bitmask, row)``,
``accept_tokens(request_id, tokens) -> bool``, ``validate_tokens(tokens) -> list`` (longest
valid prefix of a speculative draft, no state change), ``rollback(n)``, ``is_terminated()``.

This script is a toy engine loop (greedy, whole-sequence forwards, no KV cache) serving
three requests with different constraint types in one batch; each step also validates a
naive draft and rolls it back, as a speculative engine would. Prints one output per request.
For vLLM itself, use ``structgen.integrations.vllm`` (docs/guides/vllm.md) instead.
"""

from __future__ import annotations

import argparse
import json
import sys

from structgen.generation.api import DEFAULT_MODEL

REQUESTS = [  # (request id, request type, spec, prompt)
    ("json-1", "json",
     {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                       "country": {"type": "string", "maxLength": 20}},
      "required": ["city", "country"], "additionalProperties": False},
     "Where is the Colosseum? Answer as JSON with city and country."),
    ("regex-1", "regex", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "The date of the first Moon landing (YYYY-MM-DD):"),
    ("choice-1", "choice", ["yes", "no"], "Is water wet? Answer yes or no:"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model alias or local folder")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from structgen.assets.store import resolve_model
    from structgen.generation.sampling import unpack_bitmask
    from structgen.integrations import StructgenBackend

    path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    vocab_size = model.get_output_embeddings().weight.shape[0]  # logits width
    backend = StructgenBackend(tok, vocab_size, eos_token_ids=model.generation_config.eos_token_id)

    grammars = {rid: backend.compile_grammar(kind, spec) for rid, kind, spec, _p in REQUESTS}
    seqs = {rid: tok.encode(p) for rid, _k, _s, p in REQUESTS}
    outputs: dict[str, list[int]] = {rid: [] for rid in grammars}
    bitmask = backend.allocate_token_bitmask(len(REQUESTS))  # int32 [rows, ceil(V/32)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    drafted = kept = 0
    for _step in range(args.max_new_tokens):
        live = [rid for rid, g in grammars.items() if not g.is_terminated()]
        if not live:
            break
        width = max(len(seqs[r]) for r in live)  # left-padded batch of the live requests
        ids = torch.tensor([[pad] * (width - len(seqs[r])) + seqs[r] for r in live])
        mask = torch.tensor([[0] * (width - len(seqs[r])) + [1] * len(seqs[r]) for r in live])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # padding does not shift positions
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask,
                           position_ids=positions).logits[:, -1].float()  # [B, V]
        for row, rid in enumerate(live):
            grammars[rid].fill_bitmask(bitmask, row)
        allowed = unpack_bitmask(bitmask[: len(live)], logits.shape[-1])
        next_tokens = logits.masked_fill(~allowed, float("-inf")).argmax(-1).tolist()
        for rid, t in zip(live, next_tokens):
            g = grammars[rid]
            # speculative engines: check a draft first (here: the token repeated), keep its
            # valid prefix, and roll back what the target model would not have produced
            valid = g.validate_tokens([t, t, t])
            drafted += 3
            kept += len(valid)
            assert g.accept_tokens(rid, valid), "validated tokens are always accepted"
            g.rollback(len(valid) - 1)  # the toy target keeps only the first one
            seqs[rid].append(t)
            outputs[rid].append(t)

    eos = set(backend.vocab.eos_token_ids)
    failed = 0
    for rid, g in grammars.items():
        text = tok.decode([t for t in outputs[rid] if t not in eos])
        print(json.dumps({"request_id": rid, "text": text, "complete": g.is_terminated()}))
        failed += not g.is_terminated()
    print(f"draft tokens validated: {kept}/{drafted}; compiled grammars cached: "
          f"{backend.cache_misses} (hits {backend.cache_hits})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
