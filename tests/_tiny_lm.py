"""Tiny randomly initialised Llama models over the real GPT-2 tokenizer, for fast model tests.

``kind="random"``: the pattern of tests/test_generate.py (2 layers, lm_head scaled up), so
greedy choices are varied and decided by clear logit gaps; outputs often run to the length
limit. ``kind="biased"``: the same, plus a fixed preference for closing punctuation and EOS
(every token embedding gets a constant first coordinate that survives the final RMSNorm, and
the first column of lm_head becomes a per-token bias), so constrained outputs finish within a
few dozen tokens: closing quotes, brackets and braces, then ``;``, `` FROM`` and ``,``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# token -> bias on the first lm_head column (the hidden state's first coordinate is ~8)
_BIAS = [('"', 1.1), ("}", 1.0), ("]", 1.0), (";", 0.9), ("\u0120FROM", 0.8), (",", 0.5), ("1", 0.3)]


def build_tiny_llama(tok: Any, kind: str = "random", seed: int = 0, *, hidden_size: int = 64,
                     intermediate_size: int = 128) -> Any:
    """A 2-layer ``LlamaForCausalLM`` (hidden 64 by default, 50304 logit rows: 47 padding rows
    beyond GPT-2's 50257) in eval mode; EOS = BOS = pad = GPT-2's ``<|endoftext|>``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    eos = tok.eos_token_id
    cfg = LlamaConfig(vocab_size=50304, hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    with torch.no_grad():
        if kind == "random":
            model.lm_head.weight.mul_(4.0)
        elif kind == "biased":
            model.model.embed_tokens.weight[:, 0] = 1.0
            w = model.lm_head.weight
            w[:, 0] = 0.0
            for token, bias in _BIAS:
                w[tok.convert_tokens_to_ids(token), 0] = bias
            w[eos, 0] = 1.2
        else:
            raise ValueError(f"unknown kind {kind!r}")
    return model


def save_tiny_model(folder: Path, tok: Any, kind: str = "biased") -> Path:
    """``build_tiny_llama`` plus the tokenizer, saved as a Hugging Face model folder."""
    model = build_tiny_llama(tok, kind)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def build_cycle_llama(tok: Any, cycle: list[str], seed: int = 0) -> Any:
    """A 2-layer ``LlamaForCausalLM`` (hidden 64) that is a bigram model: its attention and MLP
    outputs are zeroed, so a position's logits depend on its own token only, and token
    ``cycle[i]`` strongly predicts ``cycle[i + 1]`` (the last predicts the first). Greedy
    decoding after a token of the cycle repeats the cycle for ever (``121212...``), whatever
    the context: the setting of a model stuck in a loop."""
    model = build_tiny_llama(tok, "random", seed)
    ids = [tok.convert_tokens_to_ids(t) for t in cycle]
    if len(set(ids)) != len(ids) or tok.unk_token_id in ids:
        raise ValueError(f"cycle tokens must be distinct tokens of the vocabulary: {cycle}")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        head = model.lm_head.weight
        for i, t in enumerate(ids):
            emb[t] = 0.0
            emb[t, i] = 10.0          # after the final RMSNorm: about 8 in coordinate i
            head[ids[(i + 1) % len(ids)], i] = 5.0   # logit about 40 for the next cycle token
    return model
