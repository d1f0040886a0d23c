"""What the kernel modules (:mod:`structgen.grammar._runtime_kernels`, :mod:`structgen.grammar._fsa_kernels`)
share: ``njit`` (numba's, or a pass-through when numba is missing or ``STRUCTGEN_NATIVE=0``,
so the kernels run as plain Python), ``COMPILED``, and the hash mixer of their tables."""

from __future__ import annotations

import os
import warnings

import numpy as np

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

    def njit(*args, **kwargs):  # type: ignore[no-redef]
        if args and callable(args[0]):
            return args[0]
        return lambda f: f

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
GOLD = np.int64(0x1E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def mix(x):  # type: ignore[no-untyped-def]
    """A 64-bit finaliser (murmur3's): int64 in, non-negative int64 out."""
    h = np.uint64(x)
    h ^= h >> _S33
    h *= _M1
    h ^= h >> _S33
    h *= _M2
    h ^= h >> _S33
    return np.int64(h >> np.uint64(1))
