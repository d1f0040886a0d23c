"""What the kernel modules (:mod:`structgen.grammar._runtime_kernels`, :mod:`structgen.grammar._fsa_kernels`)
share: ``njit`` (numba's, or a pass-through when numba is missing or ``STRUCTGEN_NATIVE=0``,
so the kernels run as plain Python), ``COMPILED``, the hash mixer of their tables, and the
array types of their signatures (``I32`` = ``NDArray[np.int32]`` and so on)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import SupportsInt, TypeVar, overload

import numpy as np
from numpy.typing import NDArray

__all__ = ["B1", "COMPILED", "GOLD", "I8", "I32", "I64", "OFF", "U8", "U64", "Int", "int64", "mix", "njit"]

I8 = NDArray[np.int8]
I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
U8 = NDArray[np.uint8]
U64 = NDArray[np.uint64]
B1 = NDArray[np.bool_]
Int = int | np.int64  # a kernel's integer: a Python int, or an int64 a kernel computed

# ``np.int64`` itself, typed: numpy's stubs give its constructor an untyped result when mypy
# checks for Python 3.10, so kernels that return ``np.int64(x)`` call it under this name.
int64: Callable[[SupportsInt], np.int64] = np.int64

_F = TypeVar("_F", bound=Callable[..., object])


@overload
def _plain(func: _F, /) -> _F: ...
@overload
def _plain(*, cache: bool = ..., nogil: bool = ..., parallel: bool = ...,
           fastmath: bool = ...) -> Callable[[_F], _F]: ...
def _plain(func: _F | None = None, /, **options: bool) -> _F | Callable[[_F], _F]:
    """``njit`` when the kernels run as plain Python: the function itself."""
    if func is not None:
        return func

    def keep(f: _F) -> _F:
        return f

    return keep


OFF = os.environ.get("STRUCTGEN_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")
try:
    if OFF:
        raise ImportError
    from numba import njit
    COMPILED = True
except ImportError:  # pragma: no cover - exercised only without numba
    COMPILED = False
    # The kernels' hashes wrap around on purpose (int64/uint64 arithmetic, as compiled code
    # does); run as plain Python, numpy scalars warn on each wrap. Only those warnings, only
    # from the kernel modules, are silenced.
    warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning,
                            module=r"structgen\.(grammar|masks)\._(jit|fsa_kernels|runtime_kernels|stack_kernels|trie_kernels|walk_kernels)$")
    njit = _plain

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
GOLD = np.int64(0x1E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def mix(x: Int) -> np.int64:
    """A 64-bit finaliser (murmur3's): int64 in, non-negative int64 out."""
    h = np.uint64(x)
    h ^= h >> _S33
    h *= _M1
    h ^= h >> _S33
    h *= _M2
    h ^= h >> _S33
    return int64(h >> np.uint64(1))
