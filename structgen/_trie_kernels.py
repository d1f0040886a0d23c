"""numba kernels behind :mod:`structgen.trie` (imported only when numba is available).

All kernels are compiled on first use and cached on disk (``cache=True``), release the GIL,
and never allocate per token. Masks are packed uint32 words: bit ``t & 31`` of word
``t >> 5`` allows token ``t``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

UNKNOWN = -2
DONE = -3


@njit(cache=True, nogil=True)
def _lcp(flat, offs, lens, k):  # type: ignore[no-untyped-def]
    if k == 0:
        return 0
    a, b = offs[k - 1], offs[k]
    m = min(lens[k - 1], lens[k])
    j = 0
    while j < m and flat[a + j] == flat[b + j]:
        j += 1
    return j


@njit(cache=True, nogil=True)
def count_nodes(flat, offs, lens):  # type: ignore[no-untyped-def]
    """Number of distinct non-empty prefixes of the (byte-sorted) tokens."""
    n = 0
    for k in range(lens.size):
        n += lens[k] - _lcp(flat, offs, lens, k)
    return n


@njit(cache=True, nogil=True)
def build_nodes(flat, offs, lens, byte, depth, skip, lo, own, suf):  # type: ignore[no-untyped-def]
    """Fill the depth-first node arrays from byte-sorted tokens (see structgen.trie)."""
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
    # order visits a node after its whole subtree; the parent is the last shallower node)
    parent = np.zeros(n + 1, dtype=np.int64)
    top = 0
    for j in range(1, n + 1):
        while top > 0 and depth[stack[top - 1]] >= depth[j]:
            top -= 1
        parent[j] = stack[top - 1] if top > 0 else 0
        stack[top] = j
        top += 1
    for j in range(n, 0, -1):
        p = parent[j]
        b = byte[j]
        for w in range(4):
            suf[p, w] |= suf[j, w]
        suf[p, b >> 6] |= np.uint64(1) << np.uint64(b & 63)


@njit(cache=True, nogil=True)
def _loops(trans, t, loopset, loopok):  # type: ignore[no-untyped-def]
    """Bytes on which configuration ``t`` (row known) steps to itself, as 4 x uint64."""
    if not loopok[t]:
        for w in range(4):
            loopset[t, w] = 0
        for b in range(256):
            if trans[t, b] == t:
                loopset[t, b >> 6] |= np.uint64(1) << np.uint64(b & 63)
        loopok[t] = 1


@njit(cache=True, nogil=True)
def walk(byte, depth, skip, lo, own, suf, slot_ids, trans, accepting, loopset, loopok, i, end,
         st, tn, split, words, unc, cnt):  # type: ignore[no-untyped-def]
    """Depth-first walk of nodes ``[i, end)``; ``st[d]`` is the configuration after the
    first ``d`` bytes of the current path (``st[depth[i] - 1]`` set by the caller).

    Accepted tokens are OR-ed into ``words``. Where every byte below a node loops on the
    node's configuration, the whole subtree is accepted without visiting it. With ``split``
    (a walk rooted at a stack top, see Engine._split_mask), ``tn[d]`` records whether the
    path passed an accepting configuration after one of its first ``d`` bytes (``tn[0] =
    0``): where such a path dies, the rule could have returned earlier, so the ids of the
    dead node's subtree are appended to ``unc`` (count in ``cnt[0]``), not rejected.
    Returns ``(i, need)``: ``need`` is a configuration whose row is unknown (resume at
    node ``i`` after filling it) or DONE."""
    nu = cnt[0]
    while i < end:
        d = depth[i]
        s = st[d - 1]
        t = trans[s, byte[i]]
        if t == UNKNOWN:
            cnt[0] = nu
            return i, s
        if t < 0:
            if split and tn[d - 1]:
                for q in range(lo[i], lo[skip[i]]):
                    unc[nu] = slot_ids[q]
                    nu += 1
            i = skip[i]
            continue
        a = lo[i]
        b = a + own[i]
        e = skip[i]
        for q in range(a, b):
            tid = slot_ids[q]
            words[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        if e > i + 1:  # the node has children
            if trans[t, 0] == UNKNOWN:
                cnt[0] = nu
                return i, t  # node i is visited again once t's row is known
            _loops(trans, t, loopset, loopok)
            if ((suf[i, 0] & ~loopset[t, 0]) | (suf[i, 1] & ~loopset[t, 1]) | (suf[i, 2] & ~loopset[t, 2])
                    | (suf[i, 3] & ~loopset[t, 3])) == 0:
                for q in range(b, lo[e]):
                    tid = slot_ids[q]
                    words[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
                i = e
                continue
        st[d] = t
        if split:
            tn[d] = tn[d - 1] | accepting[t]
        i += 1
    cnt[0] = nu
    return i, DONE


@njit(cache=True, nogil=True)
def walk_ids(id_off, id_len, blob, trans, accepting, cid, ids, pos, words, split,
             unc, cnt):  # type: ignore[no-untyped-def]
    """Walk tokens ``ids[pos[0]:]`` from ``cid``, OR-ing the accepted ones into ``words``
    (tokens already set are skipped). With ``split``, a token that dies after passing an
    accepting configuration (after its first byte or later) is appended to ``unc`` (count
    ``cnt[0]``). Resumable: ``pos`` = (token index, byte index, configuration, passed an
    accepting configuration). Returns a configuration whose row is unknown, or DONE."""
    nu = cnt[0]
    k = pos[0]
    j = pos[1]
    s = pos[2]
    passed = pos[3]
    while k < ids.size:
        tid = ids[k]
        if j == 0:
            if (words[tid >> 5] >> np.uint32(tid & 31)) & np.uint32(1):
                k += 1
                continue
            s = cid
            passed = 0
        ln = id_len[tid]
        off = id_off[tid]
        ok = ln > 0
        while j < ln:
            t = trans[s, blob[off + j]]
            if t == UNKNOWN:
                pos[0] = k
                pos[1] = j
                pos[2] = s
                pos[3] = passed
                cnt[0] = nu
                return s
            if t < 0:
                ok = False
                if split and passed:
                    unc[nu] = tid
                    nu += 1
                break
            s = t
            j += 1
            if accepting[t]:
                passed = 1
        if ok:
            words[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        k += 1
        j = 0
    pos[0] = k
    pos[1] = 0
    cnt[0] = nu
    return DONE


@njit(cache=True, nogil=True)
def loop_split(slot_bytes, slot_ids, nonloop, words):  # type: ignore[no-untyped-def]
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

