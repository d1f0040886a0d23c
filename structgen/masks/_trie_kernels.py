"""numba kernels behind :mod:`structgen.masks.trie` (used only when numba is available).

All kernels are compiled on first use and cached on disk (``cache=True``), release the GIL,
and never allocate per token. Masks are packed uint32 words: bit ``t & 31`` of word
``t >> 5`` allows token ``t``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from structgen.grammar.native import njit

# the array types of the kernels' arguments
U8s = NDArray[np.uint8]
I8s = NDArray[np.int8]
I32s = NDArray[np.int32]
I64s = NDArray[np.int64]
U32s = NDArray[np.uint32]
U64s = NDArray[np.uint64]


@njit(cache=True, nogil=True)
def _lcp(flat: U8s, offs: I64s, lens: I64s, k: int) -> int:
    if k == 0:
        return 0
    a, b = offs[k - 1], offs[k]
    m = min(lens[k - 1], lens[k])
    j = 0
    while j < m and flat[a + j] == flat[b + j]:
        j += 1
    return j


@njit(cache=True, nogil=True)
def count_nodes(flat: U8s, offs: I64s, lens: I64s) -> int:
    """Number of distinct non-empty prefixes of the (byte-sorted) tokens."""
    n = 0
    for k in range(lens.size):
        n += lens[k] - _lcp(flat, offs, lens, k)
    return n


@njit(cache=True, nogil=True)
def _parents(depth: I32s) -> I64s:
    """The parent of every node of a depth-first trie (``depth[0] = 0`` is the root): the
    last shallower node before it."""
    n = depth.shape[0] - 1
    parent = np.zeros(n + 1, dtype=np.int64)
    stack = np.zeros(int(depth.max()) + 2 if n > 0 else 2, dtype=np.int64)
    top = 0
    for j in range(1, n + 1):
        while top > 0 and depth[stack[top - 1]] >= depth[j]:
            top -= 1
        parent[j] = stack[top - 1] if top > 0 else 0
        stack[top] = j
        top += 1
    return parent


@njit(cache=True, nogil=True)
def build_nodes(flat: U8s, offs: I64s, lens: I64s, byte: U8s, depth: I32s, skip: I32s, lo: I32s,
                own: I32s, suf: U64s) -> None:
    """Fill the depth-first node arrays from byte-sorted tokens (see structgen.masks.trie)."""
    maxlen = 0
    for k in range(lens.size):
        maxlen = max(maxlen, lens[k])
    path = np.zeros(maxlen + 1, dtype=np.int64)  # node at each depth along the current token
    nxt = 1
    for k in range(lens.size):
        ln = lens[k]
        for d in range(_lcp(flat, offs, lens, k) + 1, ln + 1):
            byte[nxt] = flat[offs[k] + d - 1]
            depth[nxt] = d
            lo[nxt] = k
            path[d] = nxt
            nxt += 1
        own[path[ln]] += 1
    n = nxt - 1
    stack = np.zeros(maxlen + 2, dtype=np.int64)
    top = 0
    for j in range(1, n + 1):
        while top > 0 and depth[stack[top - 1]] >= depth[j]:
            skip[stack[top - 1]] = j
            top -= 1
        stack[top] = j
        top += 1
    for t in range(top):
        skip[stack[t]] = n + 1
    skip[0] = n + 1
    lo[0] = 0
    lo[n + 1] = lens.size
    # suf[i]: the bytes on every edge below node i (children first: reverse depth-first
    # order visits a node after its whole subtree)
    parent = _parents(depth)
    for j in range(n, 0, -1):
        p = parent[j]
        b = byte[j]
        for w in range(4):
            suf[p, w] |= suf[j, w]
        suf[p, b >> 6] |= np.uint64(1) << np.uint64(b & 63)


@njit(cache=True, nogil=True)
def utf8_ok(byte: U8s, depth: I32s, u8: I8s, wf: U8s) -> None:
    """``wf[i] = 1`` where every byte string below trie node ``i``, read from a character
    boundary by the UTF-8 automaton ``u8`` (int8 ``[8, 256]``), stays well-formed (its last
    character may be cut). Bottom-up over the depth-first order with one bit per automaton
    state: ``ok[i]`` bit ``u`` says the strings below ``i`` are well-formed from state ``u``."""
    n = byte.shape[0] - 1
    ok = np.full(n + 1, 0xFF, dtype=np.int64)
    parent = _parents(depth)
    for j in range(n, 0, -1):
        b = byte[j]
        bits = 0
        for u in range(8):
            v = u8[u, b]
            if v >= 0 and (ok[j] >> v) & 1:
                bits |= 1 << u
        ok[parent[j]] &= bits
    for i in range(n + 1):
        wf[i] = ok[i] & 1


@njit(cache=True, nogil=True)
def loop_split(slot_bytes: U64s, slot_ids: I64s, nonloop: U64s, words: U32s) -> I64s:
    """Set the tokens whose bytes are all in the looping set; return the ids of the others."""
    out = np.empty(slot_ids.size, dtype=np.int64)
    m = 0
    for q in range(slot_ids.size):
        if ((slot_bytes[q, 0] & nonloop[0]) | (slot_bytes[q, 1] & nonloop[1])
                | (slot_bytes[q, 2] & nonloop[2]) | (slot_bytes[q, 3] & nonloop[3])) != 0:
            out[m] = slot_ids[q]
            m += 1
        else:
            tid = slot_ids[q]
            words[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
    return out[:m]



@njit(cache=True, nogil=True)
def match_nodes(byte: U8s, depth: I32s, cbyte: U8s, cdepth: I32s, cskip: I32s, out: I64s) -> None:
    """For every node of a trie, the node of the same path in a sub-trie (a trie of some of
    the same tokens, also depth-first in byte order), or -1: both orders agree, so one merge
    pass matches them (``cm[d]``: the sub-trie node matched at depth ``d``)."""
    n = byte.shape[0]
    nc = cbyte.shape[0]
    cm = np.full(int(depth.max()) + 2 if n > 1 else 2, -1, dtype=np.int64)
    j = 1
    out[0] = 0
    for i in range(1, n):
        d = depth[i]
        out[i] = -1
        cm[d] = -1
        if j >= nc or cdepth[j] != d or cbyte[j] != byte[i]:
            continue
        if d > 1 and (cm[d - 1] < 0 or j >= cskip[cm[d - 1]]):
            continue
        out[i] = j
        cm[d] = j
        j += 1


@njit(cache=True, nogil=True)
def row_shape(row: I32s, lab: U8s, tg: I32s) -> int:
    """The shape of a transition row (int32 ``[256]``): ``lab[b]`` the rank of ``row[b]``
    among the row's distinct targets in first-occurrence order, ``tg[:n]`` those targets;
    returns ``n``."""
    n = 0
    prev = -1
    for b in range(256):
        t = row[b]
        if prev >= 0 and tg[prev] == t:
            lab[b] = prev
            continue
        k = -1
        for j in range(n):
            if tg[j] == t:
                k = j
                break
        if k < 0:
            k = n
            tg[n] = t
            n += 1
        lab[b] = k
        prev = k
    return n
