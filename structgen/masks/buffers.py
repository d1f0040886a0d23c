"""The caller's token bitmask buffers: checked and written without importing torch.

A bitmask is int32 ``[rows, >= ceil(vocab_size / 32)]``, a numpy array or a torch tensor on any
device (:data:`Bitmask`); :class:`~structgen.masks.matcher.Matcher` and
:func:`~structgen.masks.matcher.fill_bitmasks` check a buffer once (:func:`bitmask_target`) and
write rows through a uint32 numpy view of its host memory where it has one. The integer
arguments of the mask API are checked here too (:func:`whole_number`, :func:`row_index`).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, SupportsIndex, TypeAlias, cast

import numpy as np
from numpy.typing import NDArray

from structgen.errors import MatcherUsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    #: A packed token bitmask: int32 ``[rows, >= ceil(vocab_size / 32)]``, numpy or torch.
    Bitmask: TypeAlias = NDArray[np.int32] | torch.Tensor

__all__ = ["bitmask_words", "whole_number", "bitmask_kind", "bitmask_target", "write_row", "row_index",
           "set_bits"]


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words per bitmask row: ``ceil(vocab_size / 32)``."""
    return (vocab_size + 31) // 32


def whole_number(name: str, value: object, least: int) -> int:
    """``value`` as an int of at least ``least`` (ints, numpy integers, 0-d integer
    tensors; not bools or floats), else :class:`MatcherUsageError` naming ``name``."""
    if isinstance(value, bool):
        raise MatcherUsageError(f"{name} must be an integer, not a bool")
    try:
        v = operator.index(cast(SupportsIndex, value))  # raises TypeError for anything else
    except TypeError:
        raise MatcherUsageError(f"{name} must be an integer, not {type(value).__name__}") from None
    if v < least:
        raise MatcherUsageError(f"{name} must be >= {least}, not {v}")
    return v


_INT32 = np.dtype(np.int32)


def bitmask_kind(bitmask: Bitmask, words: int) -> bool:
    """Check that ``bitmask`` is a 2-d int32 numpy array or torch tensor with at least
    ``words`` columns; returns True for numpy. Raises :class:`MatcherUsageError`. (A
    read-only array is reported when written: :func:`write_row`.) Cheap: the hot path
    calls it once per mask."""
    if isinstance(bitmask, np.ndarray):
        dt = bitmask.dtype
        if dt is not _INT32 and dt != _INT32:
            raise MatcherUsageError(f"bitmask must be int32, not {dt}")
        is_numpy = True
    elif type(bitmask).__module__.startswith("torch") and hasattr(bitmask, "device"):
        if str(bitmask.dtype) != "torch.int32":
            raise MatcherUsageError(f"bitmask must be torch.int32, not {bitmask.dtype}")
        is_numpy = False
    else:
        raise MatcherUsageError("bitmask must be an int32 numpy array or torch tensor, not "
                                f"{type(bitmask).__name__}")
    shape = bitmask.shape
    if len(shape) != 2 or shape[1] < words:
        raise MatcherUsageError(f"bitmask must have shape [rows, >= {words}] (ceil(vocab_size / 32) "
                                f"int32 words per row), not {list(shape)}")
    return is_numpy


def write_row(view: NDArray[np.uint32], words: NDArray[np.uint32], nw: int, wide: bool) -> None:
    """``view[:nw] = words`` and zeros beyond; a read-only array is a MatcherUsageError."""
    try:
        view[:nw] = words
        if wide:
            view[nw:] = 0
    except ValueError as e:
        if not view.flags.writeable:
            raise MatcherUsageError("bitmask is a read-only array") from None
        raise MatcherUsageError(f"cannot write the bitmask: {e}") from None


# What :meth:`structgen.masks.matcher.Matcher.fill_bitmask` keeps about the last buffer it was
# given (checked once per buffer, not per call): (the buffer, its host memory as uint32
# ``[rows, W]`` -- a numpy view of a numpy array or CPU tensor, None for a device tensor --, rows,
# W > words, the CPU tensor's data pointer (-1 for numpy: an array with views cannot be resized in
# place)).
Target: TypeAlias = "tuple[Bitmask, NDArray[np.uint32] | None, int, bool, int]"


def bitmask_target(bitmask: Bitmask, words: int) -> Target:
    """:data:`Target` of ``bitmask`` (checked with :func:`bitmask_kind`)."""
    bitmask_kind(bitmask, words)
    rows, wide = int(bitmask.shape[0]), int(bitmask.shape[1]) > words
    if isinstance(bitmask, np.ndarray):
        return bitmask, bitmask.view(np.uint32), rows, wide, -1
    if bitmask.device.type == "cpu":
        return bitmask, bitmask.numpy().view(np.uint32), rows, wide, int(bitmask.data_ptr())
    return bitmask, None, rows, wide, -1


def row_index(row: object, rows: int) -> int:
    """``row`` checked against ``rows``: an integer in ``[0, rows)`` (negative indices are a
    caller bug here, not Python's count from the end)."""
    if type(row) is not int:
        row = whole_number("row", row, 0)
    if not 0 <= row < rows:
        raise MatcherUsageError(f"row {row} is out of range for a bitmask of {rows} rows")
    return row


def set_bits(words: NDArray[np.uint32], ids: NDArray[np.int64]) -> None:
    """Set the bits of token ids ``ids`` in packed mask words (bit ``t & 31`` of word ``t >> 5``)."""
    np.bitwise_or.at(words, ids >> 5, np.uint32(1) << (ids & 31).astype(np.uint32))
