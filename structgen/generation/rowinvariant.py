"""Row-invariant forward passes: a model patched so that a position's logits do not depend
on how many positions one pass computes (bitwise equal logits whatever the number of positions
per pass), which makes greedy speculative output equal plain decoding token for token on the
CPU in bfloat16/float16 (:func:`make_row_invariant`; :func:`stock_copy` undoes it on a copy).

Imports torch (and transformers' attention registries when a model is patched).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["make_row_invariant", "stock_copy"]

_ROWWISE_MAX = 64  # query rows computed one by one; longer passes (a prompt) use plain SDPA
_ROWWISE_NAME = "structgen_rowwise"


def _rowwise_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA that computes every query row exactly as a one-token pass of that sequence at that
    position does: the row attends to the key/value slots it may see, gathered in order
    (``kv - q + 1 + i`` leading slots for row ``i`` of an unpadded sequence; the unmasked
    slots of its mask row in a padded batch), in its own single-query call; a one-token pass
    makes that same call.

    query ``[B, H, q, d]``, key/value ``[B, Hkv, kv, d]`` (cache included) -> output
    ``[B, q, H, d]``. The mask is the one transformers builds for SDPA (bool, True = attend;
    None where it can be skipped). Long unbatched passes (a prompt), non-boolean masks and
    models with extra attention arguments (soft-capping, sliding windows, position biases)
    go to transformers' SDPA unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bsz, h, q, d = query.shape
    kv, hkv = key.shape[2], key.shape[1]
    extra = any(kwargs.get(k) is not None for k in ("softcap", "sliding_window", "position_bias"))
    odd_mask = attention_mask is not None and (attention_mask.dtype != torch.bool or attention_mask.dim() != 4
                                               or tuple(attention_mask.shape[-2:]) != (q, kv))
    if (extra or kwargs.get("dropout", 0.0) or h % hkv or odd_mask or (bsz == 1 and q > _ROWWISE_MAX)
            or q * bsz > _ROWWISE_MAX * 8):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    scale = kwargs.get("scaling")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out = torch.zeros((bsz, q, h, value.shape[-1]), dtype=query.dtype, device=query.device)
    for b in range(bsz):
        rows = None if attention_mask is None else attention_mask[b, 0]  # [q, kv]
        leading: list[int] | None = None  # slots per row where each row sees leading slots only
        if rows is None:
            leading = [kv - q + 1 + i for i in range(q)]
        else:
            counts = rows.sum(-1)  # [q]
            if torch.equal(rows, torch.arange(kv, device=rows.device)[None, :] < counts[:, None]):
                leading = counts.tolist()
        for i in range(q):
            if leading is not None:  # as an unpadded sequence has them: a slice of the cache
                n = leading[i]
                k_i, v_i = key[b:b + 1, :, :n], value[b:b + 1, :, :n]
            else:
                idx = rows[i].nonzero().reshape(-1)  # type: ignore[index]
                n = idx.numel()
                k_i, v_i = key[b:b + 1, :, idx], value[b:b + 1, :, idx]
            if n == 0:  # a padding row: nothing to attend to
                continue
            # grouped-query heads packed as rows of their key/value head: [1, Hkv, H/Hkv, d]
            # (torch's CPU SDPA is several times slower with enable_gqa for one query)
            qi = query[b:b + 1, :, i:i + 1].reshape(1, hkv, h // hkv, d)
            o = sdpa(qi, k_i, v_i, attn_mask=None, dropout_p=0.0, scale=scale,
                     is_causal=False)  # [1, Hkv, H/Hkv, dv]
            out[b, i] = o.reshape(h, -1)
    return out, None


def _two_row_linear(lin: torch.nn.Linear) -> None:
    """Run a one-row input as two identical rows (and keep the first): oneDNN's reduced-
    precision GEMM takes a different kernel for a single row, while every row of a
    two-or-more-row product is computed the same way whatever the row count."""
    if getattr(lin, "_structgen_two_row", False):
        return
    inner = lin.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dim() >= 2 and x.numel() == x.shape[-1]:  # exactly one row
            y = inner(x.reshape(1, -1).repeat(2, 1))  # [2, out]
            return y[:1].reshape(*x.shape[:-1], y.shape[-1])
        return inner(x)

    # instance attributes over the class's forward (stock_copy deletes them again)
    setattr(lin, "forward", forward)  # noqa: B010
    setattr(lin, "_structgen_two_row", True)  # noqa: B010


def stock_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A deep copy of a model made row-invariant by :func:`make_row_invariant`, with the stock
    transformers forward back (SDPA attention, the modules' own linear forwards): the model as
    a user would load it, e.g. for peers in a benchmark."""
    m = copy.deepcopy(model)
    for mod in m.modules():
        if getattr(mod, "_structgen_two_row", False):
            del mod.forward  # the instance attribute: back to the class's forward
            setattr(mod, "_structgen_two_row", False)  # noqa: B010
    if getattr(getattr(m, "config", None), "_attn_implementation", None) == _ROWWISE_NAME:
        m.set_attn_implementation("sdpa")
    return m


def make_row_invariant(model: PreTrainedModel) -> bool:
    """Make ``model``'s forward row-invariant on the CPU in bfloat16/float16: the logits of a
    position do not depend on how many positions the pass computes, so a speculative verify
    pass of ``k`` positions gives bit for bit the logits that ``k`` one-token passes give,
    and greedy speculative output equals plain decoding token for token, batched or not
    (``tests/test_model_rowinvariant.py``). Linear layers run one-row inputs as two rows;
    attention runs row by row (:func:`_rowwise_attention`). Returns False (model unchanged)
    where the model's attention is not SDPA/eager. A pass costs about what the stock forward
    costs (the per-row attention calls are offset by packing grouped-query heads)."""
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None)
    if impl not in ("sdpa", "eager", _ROWWISE_NAME) or not hasattr(model, "set_attn_implementation"):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_ROWWISE_NAME, _rowwise_attention)
    # the same masks as SDPA (an attention function without a mask function gets none)
    AttentionMaskInterface.register(_ROWWISE_NAME, sdpa_mask)
    if impl != _ROWWISE_NAME:
        model.set_attn_implementation(_ROWWISE_NAME)
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            _two_row_linear(mod)
    return True
