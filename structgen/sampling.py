"""Small tensor helpers shared by drafters and the generation loop (torch)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["unpack_bitmask", "masked_logits", "masked_distribution"]

_SHIFTS: dict[str, torch.Tensor] = {}


def unpack_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed int32 words ``[..., W]`` -> bool ``[..., vocab_size]`` (bit j of word w = token 32w+j)."""
    key = str(words.device)
    shifts = _SHIFTS.get(key)
    if shifts is None:
        shifts = torch.arange(32, dtype=torch.int32, device=words.device)
        _SHIFTS[key] = shifts
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [..., W, 32]
    return bits.reshape(*words.shape[:-1], -1)[..., :vocab_size].bool()


def masked_logits(logits: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """``logits`` [..., V] with grammar-forbidden tokens set to -inf."""
    allowed = unpack_bitmask(words, logits.shape[-1])
    return logits.masked_fill(~allowed, float("-inf"))


def masked_distribution(logits: torch.Tensor, words: torch.Tensor, temperature: float) -> Any:
    """Masked next-token distribution ``[V]`` float32: softmax(masked / T) for T > 0, a point
    mass on the masked argmax for T == 0; None when every token is masked."""
    ml = masked_logits(logits.float(), words)
    if not torch.isfinite(ml).any():
        return None
    if temperature <= 0:
        p = torch.zeros_like(ml)
        p[int(torch.argmax(ml))] = 1.0
        return p
    return torch.softmax(ml / temperature, dim=-1)
