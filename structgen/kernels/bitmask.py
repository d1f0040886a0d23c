"""Allocating token bitmasks as torch tensors.

The mask layer (:mod:`structgen.masks`) fills numpy arrays and torch tensors alike without
importing torch; allocating a tensor is the one step that needs torch, so it lives here.
"""

from __future__ import annotations

import torch

from structgen.masks.buffers import bitmask_words, whole_number

__all__ = ["allocate_bitmask"]


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """A packed int32 torch tensor ``[rows, ceil(vocab_size/32)]`` with every token allowed
    (all bits set), on the CPU. Raises :class:`~structgen.errors.MatcherUsageError` unless
    ``rows >= 0`` and ``vocab_size >= 1`` are integers."""
    rows = whole_number("rows", rows, 0)
    vocab_size = whole_number("vocab_size", vocab_size, 1)
    return torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)
