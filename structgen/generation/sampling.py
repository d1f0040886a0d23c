"""Small tensor helpers shared by drafters and the generation loop (torch)."""

from __future__ import annotations

import torch

__all__ = ["unpack_bitmask", "masked_logits", "masked_distribution", "DistributionBuffers"]

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


def masked_distribution(logits: torch.Tensor, words: torch.Tensor, temperature: float) -> torch.Tensor | None:
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


class DistributionBuffers:
    """:func:`masked_distribution` into preallocated rows: ``rows`` distributions ``[V]`` of one
    vocabulary plus the scratch to unpack a mask, so drafting allocates nothing vocabulary-sized
    per token. ``probs`` float32 ``[rows, V]``; :meth:`compute` returns a view of one row (valid
    until that row is computed again)."""

    def __init__(self, vocab_size: int, rows: int, device: torch.device | str = "cpu") -> None:
        words = (vocab_size + 31) // 32
        self.vocab_size = vocab_size
        self.probs = torch.empty((rows, vocab_size), dtype=torch.float32, device=device)
        self._bits = torch.empty((words, 32), dtype=torch.int32, device=device)
        self._forbidden = torch.empty(words * 32, dtype=torch.bool, device=device)
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        self._noise = torch.empty(vocab_size, dtype=torch.float32, device=device)

    def point_mass(self, row: int, token: int) -> torch.Tensor:
        """Row ``row`` set to the distribution that puts all its mass on ``token``; returns that
        row (a view ``[V]``, valid until the row is written again)."""
        p = self.probs[row]
        p.zero_()
        p[token] = 1.0
        return p

    def compute(self, row: int, logits: torch.Tensor, words: torch.Tensor,
                temperature: float) -> torch.Tensor | None:
        """Row ``row`` set to the masked distribution of ``logits`` ``[V]`` under the packed mask
        ``words`` ``[W]``: softmax(masked / T) for T > 0, a point mass on the masked argmax
        for T == 0; None when no token is viable (every one masked, or NaN logits)."""
        p = self.probs[row]
        torch.bitwise_right_shift(words.view(-1, 1), self._shifts, out=self._bits)
        torch.bitwise_and(self._bits, 1, out=self._bits)
        torch.eq(self._bits.view(-1), 0, out=self._forbidden)
        p.copy_(logits)
        p.masked_fill_(self._forbidden[: self.vocab_size], float("-inf"))
        top = float(p.max())
        if not top > float("-inf"):
            return None
        if temperature <= 0:
            return self.point_mass(row, int(torch.argmax(p)))
        p.div_(temperature)
        p.sub_(p.max())
        p.exp_()
        p.div_(p.sum())
        return p

    def sample(self, row: int, generator: torch.Generator | None = None) -> int:
        """A token drawn from row ``row`` by inverting its cumulative sum (kept in a scratch
        buffer): the first token whose cumulative mass exceeds ``u * total``, so a token of
        probability 0 is never drawn."""
        p = self.probs[row]
        c = self._noise
        torch.cumsum(p, 0, out=c)
        u = torch.rand(1, generator=generator, dtype=torch.float32, device=c.device)
        t = int(torch.searchsorted(c, u * c[-1:], right=True))
        if t >= self.vocab_size:   # u * total rounded up to the total: the last viable token
            t = int(torch.nonzero(p > 0)[-1])
        return t
