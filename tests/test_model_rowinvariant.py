"""Row-invariant forward in bfloat16 on the CPU: a position's logits do not depend on how
many positions one pass computes.

Oracle: one-token passes (what plain decoding runs). A speculative verify pass of ``k``
positions, and any other grouping of the same tokens, must give bit-for-bit the same
logits; greedy speculative generation must then give plain decoding's tokens. The tiny
model is a randomly initialised Llama (2 layers) with the real GPT-2 tokenizer.
"""

from __future__ import annotations

import pytest
import torch

import structgen

pytestmark = pytest.mark.assets


def _tiny(tokenizer_by_alias, **kw):
    """The 2-layer random Llama of tests/_tiny_lm.py, wide enough (512) that oneDNN's one-row
    bf16 GEMM kernel differs from the multi-row one, in bfloat16."""
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    model = build_tiny_llama(tok, "random", seed=1, hidden_size=512, intermediate_size=2048)
    return CausalLM(model.to(torch.bfloat16), tok, **kw)


@pytest.fixture(scope="module")
def tiny_bf16(tokenizer_by_alias):
    return _tiny(tokenizer_by_alias)


def _singles(lm, prefix: list[int], tokens: list[int]) -> torch.Tensor:
    lm.reset()
    lm.extend(prefix, all_logits=False)
    return torch.cat([lm.extend([t]) for t in tokens])  # [n, V]


def test_auto_enabled_for_bf16_cpu(tiny_bf16) -> None:
    assert tiny_bf16.row_invariant
    assert tiny_bf16.model.config._attn_implementation == "structgen_rowwise"


@pytest.mark.parametrize("groups", [(7,), (1, 6), (3, 1, 3), (2, 2, 2, 1)])
def test_grouping_does_not_change_logits(tiny_bf16, groups: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(sum(groups))
    prefix = torch.randint(0, 50257, (23,), generator=g).tolist()
    tokens = torch.randint(0, 50257, (sum(groups),), generator=g).tolist()
    want = _singles(tiny_bf16, prefix, tokens)
    lm = tiny_bf16
    lm.reset()
    lm.extend(prefix, all_logits=False)
    got, i = [], 0
    for n in groups:
        got.append(lm.extend(tokens[i:i + n]))
        i += n
    assert torch.equal(torch.cat(got), want)
    # after a rollback the recomputed positions are the same bits again
    lm.crop(len(prefix) + 2)
    assert torch.equal(lm.extend(tokens[2:5]), want[2:5])


def test_plain_sdpa_bf16_is_not_row_invariant_here(tokenizer_by_alias) -> None:
    """Why the row-invariant mode exists: without it, a multi-position pass's bf16 logits may
    differ from one-token passes in the last bits (oneDNN takes another GEMM kernel for one
    row; at these sizes on an AVX-512 CPU they differ for this seed). Only closeness is
    asserted: the exact kernels are the BLAS library's business."""
    lm = _tiny(tokenizer_by_alias, row_invariant=False)
    assert not lm.row_invariant
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 50257, (23,), generator=g).tolist()
    tokens = torch.randint(0, 50257, (7,), generator=g).tolist()
    want = _singles(lm, prefix, tokens)
    lm.reset()
    lm.extend(prefix, all_logits=False)
    got = lm.extend(tokens)
    assert torch.allclose(got, want, atol=0.5, rtol=0.05)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "tags": {"type": "array", "maxItems": 3,
                                                    "items": {"type": "string", "maxLength": 6}},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "tags", "age"], "additionalProperties": False}


@pytest.mark.parametrize("prompt", ["Extract: Bob Smith is 42, tags a, b. JSON:",
                                    '{"name": "Ann", "tags": ["x"], "age": 7} again:'])
def test_greedy_speculative_equals_plain_bf16(tiny_bf16, prompt: str) -> None:
    plain = structgen.generate(tiny_bf16, schema=SCHEMA, prompt=prompt, max_new_tokens=60,
                               speculative=False)
    spec = structgen.generate(tiny_bf16, schema=SCHEMA, prompt=prompt, max_new_tokens=60,
                              speculative=True)
    assert spec.tokens == plain.tokens
    assert spec.stats.forward_passes <= plain.stats.forward_passes


def test_row_invariant_forward_computes_the_same_model(tiny_bf16) -> None:
    """The row-invariant forward is the same function as transformers' stock one (SDPA,
    grouped-query heads), up to bf16 rounding: compared on the same weights, per position."""
    from structgen.generation.model import CausalLM, stock_copy

    stock = CausalLM(stock_copy(tiny_bf16.model), tiny_bf16.tokenizer, row_invariant=False)
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 50257, (40,), generator=g).tolist()
    tokens = torch.randint(0, 50257, (9,), generator=g).tolist()
    for lm in (tiny_bf16, stock):
        lm.reset()
    a = tiny_bf16.extend(prefix)  # a prompt pass (every position)
    b = stock.extend(prefix)
    assert torch.allclose(a, b, atol=0.15, rtol=0.02)
    a = torch.cat([tiny_bf16.extend(tokens[:4]), tiny_bf16.extend(tokens[4:])])  # passes with a cache
    b = torch.cat([stock.extend(tokens[:4]), stock.extend(tokens[4:])])
    assert torch.allclose(a, b, atol=0.15, rtol=0.02)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.8


def test_batched_generation_equals_one_at_a_time_bf16(tiny_bf16) -> None:
    """A padded batch (prompts of different lengths, rows accepting different numbers of
    drafts, so the shared cache gets holes) gives each sequence the tokens it gets alone."""
    from structgen.config import SpecConfig

    prompts = ["Bob is 42. JSON:", "Ann, 7 years:", "x", '{"name": "Zed", "tags": [], "age": 1} again:']
    batch = structgen.generate(tiny_bf16, schema=SCHEMA, prompt=prompts, max_new_tokens=40,
                               config=SpecConfig(batch_size=4))
    for prompt, got in zip(prompts, batch):
        alone = structgen.generate(tiny_bf16, schema=SCHEMA, prompt=prompt, max_new_tokens=40)
        assert got.tokens == alone.tokens
