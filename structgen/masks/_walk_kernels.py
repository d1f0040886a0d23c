"""Compiled token walks: the vocabulary's byte trie walked through the runtime's tables.

A token mask is a walk of the vocabulary's depth-first byte trie (layout in
:mod:`structgen.masks.trie`) through the byte transitions of the runtime
(:mod:`structgen.grammar.runtime`): configurations, or the rule states of a call-free rule.
A dead byte skips the node's whole subtree; where every byte below a node loops on its state
(or the node's text is well-formed UTF-8 that the state reads whole, or the state can read the
vocabulary's whole text slice) the subtree is accepted without visiting it. Allowed tokens
are OR-ed straight into packed uint32 words (bit ``t & 31`` of word ``t >> 5``).

Transitions are computed lazily by the runtime kernels, which may answer NEED_GROW; every walk
is then resumable: it returns where it stopped, the runtime grows its tables, and the driver
(:mod:`structgen.masks.trie`) calls the walk again with the same scratch arrays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import NDArray

from structgen.grammar.native import DONE, NEED_GROW, UNKNOWN, expand, njit, succ_row

if TYPE_CHECKING:  # pragma: no cover
    # the runtime's compiled tables (``RuntimeTables.T``) as the kernels see them
    from structgen.grammar.native import Tables

# the array types of the kernels' arguments
U8s = NDArray[np.uint8]
I8s = NDArray[np.int8]
I32s = NDArray[np.int32]
I64s = NDArray[np.int64]
U32s = NDArray[np.uint32]
U64s = NDArray[np.uint64]

#: An integer a kernel returns: an int64 (compiled), or an int or int64 (run as plain Python).
KInt = int | np.int64


class TrieArrays(NamedTuple):
    """A vocabulary trie's node arrays (layout in :mod:`structgen.masks.trie`), passed to the walks
    as one argument (numba types a namedtuple of arrays as a tuple of array structs)."""

    byte: U8s
    depth: I32s
    skip: I32s
    lo: I32s
    own: I32s
    suf: U64s
    wf: U8s
    slot_ids: I64s


class TextArgs(NamedTuple):
    """The text slice as a walk reads it: ``pq`` (int64 ``[max depth + 1]``, scratch: the slice
    automaton's state after each byte of the current path), ``pd`` (the slice automaton, int8
    ``[P, 256]``), ``sps`` / ``sids`` (see :class:`structgen.masks.trie.TextSlice`) and ``sp``
    (int64 ``[4]``: slice depth, budget, width, node threshold; threshold -1 = no slice)."""

    pq: I64s
    pd: I8s
    sps: I64s
    sids: I64s
    sp: I64s


SLICED = -5  # walk: the node's state read the text slice (its slice tokens are set)
SLICED_KILL = -6  # ... and rejects "plain text then a control byte" (slice_from answered 3)

@njit(cache=True, nogil=True)
def _loops(trans: I32s, t: int, loopset: U64s, loopok: U8s) -> None:
    """Bytes on which state ``t`` (row known) steps to itself, as 4 x uint64."""
    for w in range(4):
        loopset[t, w] = 0
    for b in range(256):
        if trans[t, b] == t:
            loopset[t, b >> 6] |= np.uint64(1) << np.uint64(b & 63)
    loopok[t] = 1


@njit(cache=True, nogil=True)
def _step(T: Tables, gmode: bool, trans: I32s, s: int, b: int) -> KInt:
    """The successor of state ``s`` on byte ``b`` (a rule state with ``gmode``: its row is
    expanded whole; else a configuration: one entry computed): a state, DEAD or NEED_GROW."""
    t = trans[s, b]
    if t != UNKNOWN:
        return np.int64(t)  # type: ignore[no-any-return]  # numpy stubs: np.int64() is untyped
    if gmode:
        r = expand(T, s)
        if r < 0:
            return np.int64(r)  # type: ignore[no-any-return]  # numpy stubs: np.int64() is untyped
        return np.int64(trans[s, b])  # type: ignore[no-any-return]  # numpy stubs: np.int64() is untyped
    return succ_row(T, s, b)


@njit(cache=True, nogil=True)
def _ctz(x: np.uint64) -> int:
    """Index of the lowest set bit of a non-zero uint64."""
    n = 0
    while (x & np.uint64(1)) == 0:
        x >>= np.uint64(1)
        n += 1
    return n


@njit(cache=True, nogil=True)
def _loop_check(trans: I32s, loop_bytes: U64s, loop_known: U64s, t: int, suf: U64s, i: int, first: int,
                nw: int) -> int:
    """Whether every byte in ``suf[i]`` (the bytes below trie node ``i``; with ``nw = 2``
    only its ASCII bytes) loops on configuration ``t``, learning loops byte by byte (``loop_bytes``
    loop bits, ``loop_known`` known bits; ``first``, the byte of the node's first child, needed next
    anyway, is tried first): 1 yes, 0 no, or ``-1 - b`` when the successor on byte ``b`` is
    not computed yet."""
    one = np.uint64(1)
    fw = first >> 6
    fb = one << np.uint64(first & 63)
    if fw < nw and not (loop_bytes[t, fw] & fb):
        if not (loop_known[t, fw] & fb):
            v = trans[t, first]
            if v == UNKNOWN:
                return -1 - first
            loop_known[t, fw] |= fb
            if v == t:
                loop_bytes[t, fw] |= fb
        if not (loop_bytes[t, fw] & fb):
            return 0
    for w in range(nw):
        need = suf[i, w] & ~loop_bytes[t, w]
        if need == 0:
            continue
        if need & loop_known[t, w]:
            return 0  # a byte below is known not to loop
        while need:
            low = need & (~need + one)
            b = w * 64 + _ctz(low)
            v = trans[t, b]
            if v == UNKNOWN:
                return -1 - b
            loop_known[t, w] |= low
            if v != t:
                return 0
            loop_bytes[t, w] |= low
            need &= ~low
    return 1


@njit(cache=True, nogil=True)
def _loop_learn(T: Tables, trans: I32s, loop_bytes: U64s, loop_known: U64s, t: int, suf: U64s, i: int,
                first: int, nw: int) -> KInt:
    """:func:`_loop_check`, computing the successors it asks for: 1, 0 or NEED_GROW (the
    walk's fast path reads the loop bits already known without this call)."""
    r = _loop_check(trans, loop_bytes, loop_known, t, suf, i, first, nw)
    while r < 0:
        if succ_row(T, t, -1 - r) == NEED_GROW:
            return np.int64(NEED_GROW)  # type: ignore[no-any-return]  # numpy stubs: np.int64() is untyped
        r = _loop_check(trans, loop_bytes, loop_known, t, suf, i, first, nw)
    return np.int64(r)  # type: ignore[no-any-return]  # numpy stubs: np.int64() is untyped


def _utf8_automaton() -> I8s:
    """Well-formed UTF-8 (int8 ``[8, 256]``: state 0 = between characters, -1 = no edge):
    ASCII, and the multibyte sequences of RFC 3629 (no overlong forms, no surrogates)."""
    u = np.full((8, 256), -1, dtype=np.int8)
    u[0, 0x00:0x80] = 0
    u[0, 0xC2:0xE0] = 1
    u[0, 0xE0] = 2
    u[0, 0xE1:0xED] = 3
    u[0, 0xEE:0xF0] = 3
    u[0, 0xED] = 4
    u[0, 0xF0] = 5
    u[0, 0xF1:0xF4] = 6
    u[0, 0xF4] = 7
    u[1, 0x80:0xC0] = 0
    u[2, 0xA0:0xC0] = 1
    u[3, 0x80:0xC0] = 1
    u[4, 0x80:0xA0] = 1
    u[5, 0x90:0xC0] = 3
    u[6, 0x80:0xC0] = 3
    u[7, 0x80:0x90] = 3
    return u


UTF8 = _utf8_automaton()
_U8_BUDGET = 64  # (state, UTF-8 state) pairs one multibyte-loop check may visit


@njit(cache=True, nogil=True)
def u8_loop(T: Tables, gmode: bool, t: int) -> KInt:
    """Whether every multibyte UTF-8 character leads from state ``t`` (a rule state with
    ``gmode``, else a configuration) back to ``t``, every proper prefix of it staying
    alive: then from ``t`` a byte string of well-formed characters (its last one possibly
    cut) is read whole as long as each of its ASCII bytes loops on ``t``. Depth-first over
    (state, UTF-8 state) pairs, giving up (0) after ``_U8_BUDGET`` of them; memoised in
    ``state_utf8_memo`` / ``utf8_memo``. 0, 1 or NEED_GROW."""
    memo = T.state_utf8_memo if gmode else T.utf8_memo
    got = memo[t]
    if got >= 0:
        return np.int64(got)  # type: ignore[no-any-return]  # numpy stubs: np.int64() is untyped
    trans = T.state_trans if gmode else T.trans
    todo = [np.int64(t) * 8]
    seen = {todo[0]}
    ok = 1
    while todo and ok:
        key = todo.pop()
        x = key // 8
        u = key % 8
        for b in range(0x80, 0x100):
            v = UTF8[u, b]
            if v < 0:
                continue
            y = _step(T, gmode, trans, x, b)
            if y == NEED_GROW:
                return NEED_GROW
            if y < 0 or (v == 0 and y != t):
                ok = 0
                break
            if v == 0:
                continue
            k2 = np.int64(y) * 8 + v
            if k2 not in seen:
                if len(seen) >= _U8_BUDGET:
                    ok = 0
                    break
                seen.add(k2)
                todo.append(k2)
    memo[t] = ok
    return np.int64(ok)  # type: ignore[no-any-return]  # numpy stubs: np.int64() is untyped


@njit(cache=True, nogil=True)
def walk(trie: TrieArrays, T: Tables, gmode: bool, i: int, end: int, st: I32s, tn: U8s, split: bool,
         words: U32s, unc: I64s, cnt: I64s, text: TextArgs) -> tuple[int, KInt]:
    """Depth-first walk of nodes ``[i, end)`` of ``trie`` (a :data:`TrieArrays`); ``st[d]`` is
    the state after the first ``d`` bytes of the current path (``st[depth[i] - 1]`` set by the
    caller). States are configurations, or with ``gmode`` rule states of a call-free rule (a
    rooted walk of one frame, no stacks needed).

    Accepted tokens are OR-ed into ``words``. Where every byte below a node loops on the
    node's state, the whole subtree is accepted without visiting it; so it is where every
    path below is well-formed UTF-8 text (``wf[i]``), its ASCII bytes loop and every
    multibyte character leads back to the state (:func:`u8_loop`). With ``split`` (a walk
    rooted at a stack top, see Engine._split_mask), ``tn[d]`` records whether the path
    passed an accepting state after one of its first ``d`` bytes (``tn[0] = 0``): where such
    a path dies, the rule could have returned earlier, so the ids of the dead node's subtree
    are appended to ``unc`` (count in ``cnt[0]``), not rejected.
    ``text`` (a :data:`TextArgs`: ``pq``, ``pd``, ``sps``, ``sids``, ``sp``) is the text slice.
    With ``sp[3] >= 0`` (``sp`` = slice depth, budget, width, node threshold), a node of more
    than ``sp[3]`` descendants whose path is plain text (slice automaton ``pd``, state
    ``pq[d]``) and whose state reads the slice (:func:`slice_from`) stops the walk: its slice
    tokens (``sids[sps[lo[i]] : sps[lo[skip[i]]]]``) are set, ``st``/``tn`` hold the node's
    state, and SLICED or SLICED_KILL is returned with the node (see :func:`walk_sliced`).
    Returns ``(i, status)``: DONE, SLICED, SLICED_KILL, or NEED_GROW (call again from node
    ``i`` once the runtime has grown its tables)."""
    byte, depth, skip, lo, own, suf, wf, slot_ids = trie
    pq, pd, sps, sids, sp = text
    if gmode:
        trans, accepting = T.state_trans, T.state_accepting
    else:
        trans, accepting = T.trans, T.accepting
    state_loops, state_loops_known = T.state_loop_bytes, T.state_loops_known
    loops, loops_known = T.loop_bytes, T.loop_known
    state_utf8_ok, utf8_ok = T.state_utf8_memo, T.utf8_memo
    slice_memo = T.state_slice_memo if gmode else T.slice_memo
    thresh = sp[3]
    nu = cnt[0]
    while i < end:
        d = depth[i]
        s = st[d - 1]
        t = trans[s, byte[i]]
        if t == UNKNOWN:
            t = _step(T, gmode, trans, s, byte[i])
            if t == NEED_GROW:
                cnt[0] = nu
                return i, NEED_GROW
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
            if gmode:
                if trans[t, 0] == UNKNOWN:
                    r = expand(T, t)
                    if r < 0:
                        cnt[0] = nu
                        return i, r  # node i is visited again
                if not state_loops_known[t]:
                    _loops(trans, t, state_loops, state_loops_known)
                asc = ((suf[i, 0] & ~state_loops[t, 0]) | (suf[i, 1] & ~state_loops[t, 1])) == 0
                full = asc and ((suf[i, 2] & ~state_loops[t, 2]) | (suf[i, 3] & ~state_loops[t, 3])) == 0
                asc = asc and state_utf8_ok[t] != 0
            else:
                n0 = suf[i, 0] & ~loops[t, 0]
                n1 = suf[i, 1] & ~loops[t, 1]
                n2 = suf[i, 2] & ~loops[t, 2]
                n3 = suf[i, 3] & ~loops[t, 3]
                if (n0 | n1 | n2 | n3) == 0:
                    r = 1
                elif ((n0 & loops_known[t, 0]) | (n1 & loops_known[t, 1]) | (n2 & loops_known[t, 2])
                      | (n3 & loops_known[t, 3])):
                    r = 0  # a byte below is known not to loop
                else:
                    r = _loop_learn(T, trans, loops, loops_known, t, suf, i, byte[i + 1], 4)
                full = r == 1
                asc = False
                if not full and r != NEED_GROW and wf[i] and utf8_ok[t] != 0 and (n2 | n3) != 0:
                    n0 = suf[i, 0] & ~loops[t, 0]
                    n1 = suf[i, 1] & ~loops[t, 1]
                    if (n0 | n1) == 0:
                        r = 1
                    elif (n0 & loops_known[t, 0]) | (n1 & loops_known[t, 1]):
                        r = 0
                    else:
                        r = _loop_learn(T, trans, loops, loops_known, t, suf, i, byte[i + 1], 2)
                    asc = r == 1
                if r == NEED_GROW:
                    cnt[0] = nu
                    return i, NEED_GROW  # node i is visited again
            if not full and asc and wf[i]:
                v = u8_loop(T, gmode, t)
                if v == NEED_GROW:
                    cnt[0] = nu
                    return i, NEED_GROW
                full = v == 1
            if full:
                for q in range(b, lo[e]):
                    tid = slot_ids[q]
                    words[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
                i = e
                continue
            if thresh >= 0:
                p = pq[d - 1]
                q0 = pd[p, byte[i]] if p >= 0 else -1
                pq[d] = q0
                if q0 >= 0 and e - i > thresh and sps[lo[e]] > sps[b]:
                    v = slice_memo[t, q0]
                    if v < 0:
                        v = slice_from(T, gmode, t, q0, pd, sp[0], sp[1], sp[2])
                    if v == NEED_GROW:
                        cnt[0] = nu
                        return i, NEED_GROW  # node i is visited again
                    if v & 1:
                        for k in range(sps[b], sps[lo[e]]):
                            tid = sids[k]
                            words[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
                        st[d] = t
                        if split:
                            tn[d] = tn[d - 1] | accepting[t]
                        cnt[0] = nu
                        return i, (SLICED_KILL if v == 3 else SLICED)
        st[d] = t
        if split:
            tn[d] = tn[d - 1] | accepting[t]
        i += 1
    cnt[0] = nu
    return i, DONE


@njit(cache=True, nogil=True)
def walk_ids(id_off: I64s, id_len: I64s, blob: U8s, T: Tables, gmode: bool, start: int, ids: I64s,
             pos: I64s, words: U32s, split: bool, unc: I64s, cnt: I64s) -> KInt:
    """Walk tokens ``ids[pos[0]:]`` from state ``start``, OR-ing the accepted ones into
    ``words`` (tokens already set are skipped). With ``split``, a token that dies after
    passing an accepting state (after its first byte or later) is appended to ``unc``
    (count ``cnt[0]``). Resumable: ``pos`` = (token index, byte index, state, passed an
    accepting state). Returns DONE or NEED_GROW."""
    if gmode:
        trans, accepting = T.state_trans, T.state_accepting
    else:
        trans, accepting = T.trans, T.accepting
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
            s = start
            passed = 0
        ln = id_len[tid]
        off = id_off[tid]
        ok = ln > 0
        while j < ln:
            if gmode and trans[s, 0] == UNKNOWN:
                r = expand(T, s)
                if r < 0:
                    pos[0] = k
                    pos[1] = j
                    pos[2] = s
                    pos[3] = passed
                    cnt[0] = nu
                    return r
            if j > 0 and accepting[s]:
                passed = 1
            t = trans[s, blob[off + j]]
            if t == UNKNOWN:
                t = succ_row(T, s, blob[off + j])
                if t == NEED_GROW:
                    pos[0] = k
                    pos[1] = j
                    pos[2] = s
                    pos[3] = passed
                    cnt[0] = nu
                    return NEED_GROW
            if t < 0:
                ok = False
                if split and passed:
                    unc[nu] = tid
                    nu += 1
                break
            s = t
            j += 1
        if ok:
            words[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        k += 1
        j = 0
    pos[0] = k
    pos[1] = 0
    cnt[0] = nu
    return DONE


@njit(cache=True, nogil=True)
def slice_from(T: Tables, gmode: bool, s: int, q0: int, pd: I8s, depth: int, budget: int,
               width: int) -> KInt:
    """Whether every byte string of at most ``depth`` bytes that the slice automaton ``pd``
    (int8 ``[P, 256]``, -1 = no edge) reads from its state ``q0`` (the last character cut or not) can
    be read from state ``s`` (a rule state with ``gmode``, else a configuration): then every
    token whose bytes, after the ones that led to ``s`` and ``q0``, lie in the slice is
    accepted. Breadth-first over (state, slice state) pairs, giving up (answer 0) after
    ``budget`` pairs or when one depth has more than ``width``; and at character
    boundaries, where (almost) every printable ASCII byte does not lead to one and the
    same state: text states loop or step to the next position of a counted string, while
    states that branch on the text (keys, enumerations, patterns) would build many states
    for nothing. Memoised per (state, slice state) in ``state_slice_memo`` / ``slice_memo``.
    0 (no), 1 (yes), 3 (yes, and no state on the way is accepting and every C0 control byte at a character
    boundary is dead: a token of plain text then a control byte is rejected in any
    context) or NEED_GROW."""
    memo = T.state_slice_memo if gmode else T.slice_memo
    got = memo[s, q0]
    if got >= 0:
        return np.int64(got)  # type: ignore[no-any-return]  # numpy stubs: np.int64() is untyped
    trans = T.state_trans if gmode else T.trans
    accepting = T.state_accepting if gmode else T.accepting
    kill = 1
    npd = pd.shape[0]
    cur = [np.int64(s) * npd + q0]
    seen = {cur[0]}
    ok = 1
    for _d in range(depth):
        if len(seen) > budget:
            ok = 0
            break
        nxt = [np.int64(0)]
        nxt.pop()
        for key in cur:
            x = key // npd
            p = key % npd
            if kill and accepting[x]:
                kill = 0
            if kill and p == 0:
                for b in range(0x20):
                    t = trans[x, b]
                    if t == UNKNOWN:
                        t = _step(T, gmode, trans, x, b)
                        if t == NEED_GROW:
                            return NEED_GROW
                    if t >= 0:
                        kill = 0
                        break
            if p == 0:
                ref = _step(T, gmode, trans, x, 0x61)
                if ref == NEED_GROW:
                    return NEED_GROW
                if ref < 0:
                    ok = 0
                    break
                odd = 0
                for b in range(0x20, 0x7F):
                    if pd[0, b] < 0:
                        continue
                    t = trans[x, b]
                    if t == UNKNOWN:
                        t = _step(T, gmode, trans, x, b)
                        if t == NEED_GROW:
                            return NEED_GROW
                    if t != ref:
                        odd += 1
                        if odd > 4:
                            break
                if odd > 4:
                    ok = 0
                    break
            for b in range(256):
                q = pd[p, b]
                if q < 0:
                    continue
                t = trans[x, b]
                if t == UNKNOWN:
                    t = _step(T, gmode, trans, x, b)
                    if t == NEED_GROW:
                        return NEED_GROW
                if t < 0:
                    ok = 0
                    break
                k2 = np.int64(t) * npd + q
                if k2 not in seen:
                    seen.add(k2)
                    nxt.append(k2)
            if ok == 0:
                break
        if ok == 0 or len(nxt) == 0:
            break
        if len(nxt) > width:
            ok = 0
            break
        cur = nxt
    if ok and kill:
        ok = 3
    memo[s, q0] = ok
    return np.int64(ok)  # type: ignore[no-any-return]  # numpy stubs: np.int64() is untyped


@njit(cache=True, nogil=True)
def walk_sliced(full: TrieArrays, rest: TrieArrays, rest_node: I64s, rest_kill: TrieArrays,
                rest_kill_node: I64s, text: TextArgs, slice_words: U32s, T: Tables, gmode: bool, start: int,
                pos: I64s, st: I32s, tn: U8s, split: bool, words: U32s, unc: I64s, cnt: I64s) -> KInt:
    """The walk of :func:`walk` from ``start`` over the whole vocabulary (trie ``full``), taking
    the text slice whole where it can: at the root, and at every node of more than ``sp[3]``
    descendants whose path so far is plain text, when the node's state can read the slice
    (:func:`slice_from`; ``sp`` = its depth, budget, width, and that threshold), the slice's
    tokens below the node (``sids[sps[lo[i]] : sps[lo[skip[i]]]]`` of ``full``, in full-trie
    order) are accepted at once and only the node's subtree in the trie of the other tokens
    (``rest``, node ``rest_node[i]``) is walked. A key that may be any string, or a string body, then
    costs a walk of the few thousand tokens outside the slice, wherever the key's names
    branch. Where the check also finds control bytes dead (answer 3) and the path has not
    passed an accepting state, the trie ``rest_kill`` (node ``rest_kill_node[i]``) is walked instead: it
    also leaves out the tokens of plain text then a control byte, all rejected.
    Resumable: ``pos`` = (full-trie node, 0 = the root still to decide, -1 = the root
    took the slice; other-trie node of the walk in progress, or -1; its end; 1 when that
    walk is in ``rest_kill``). ``text`` (a :data:`TextArgs`): the slice, its ``pq`` the scratch
    slice states of the path; ``slice_words``: the slice's tokens as a packed mask. Returns
    DONE or NEED_GROW."""
    pq, pd, sps, sids, sp = text
    fd, fs = full.depth, full.skip
    # the other tries' walks take no slice
    no_slice = TextArgs(pq, pd, sps, sids, np.full(4, -1, dtype=np.int64))
    while True:
        if pos[1] >= 0:  # a walk of the other tokens below a node that took the slice
            if pos[3]:
                j, r = walk(rest_kill, T, gmode, pos[1], pos[2], st, tn, split, words, unc, cnt, no_slice)
            else:
                j, r = walk(rest, T, gmode, pos[1], pos[2], st, tn, split, words, unc, cnt, no_slice)
            if r == NEED_GROW:
                pos[1] = j
                return NEED_GROW
            pos[1] = -1
            if pos[0] < 0:
                return DONE
            pos[0] = fs[pos[0]]
        if pos[0] == 0:  # the root
            st[0] = start
            tn[0] = 0
            pq[0] = 0
            v = slice_from(T, gmode, start, 0, pd, sp[0], sp[1], sp[2])
            if v == NEED_GROW:
                return NEED_GROW
            if v & 1:
                for w in range(slice_words.shape[0]):  # the slice's tokens, packed
                    words[w] |= slice_words[w]
                pos[0] = -1
                pos[1] = 1
                pos[3] = 1 if v == 3 else 0
                pos[2] = rest_kill.byte.shape[0] if v == 3 else rest.byte.shape[0]
                continue
            pos[0] = 1
        i, r = walk(full, T, gmode, pos[0], full.byte.shape[0], st, tn, split, words, unc, cnt, text)
        pos[0] = i
        if r == DONE or r == NEED_GROW:
            return r
        # node i took the slice: walk its subtree in the trie of the other tokens
        kl = r == SLICED_KILL and not (split and tn[fd[i]])
        c = rest_kill_node[i] if kl else rest_node[i]
        if c < 0:
            pos[0] = fs[i]
            continue
        pos[1] = c + 1
        pos[2] = rest_kill.skip[c] if kl else rest.skip[c]
        pos[3] = 1 if kl else 0


@njit(cache=True, nogil=True)
def walk_ends(trie: TrieArrays, T: Tables, i: int, end: int, st: I32s, out: I32s) -> tuple[int, int]:
    """The configuration each token leads to: a depth-first walk of nodes ``[i, end)`` of
    ``trie`` from configuration ``st[0]`` that writes, for every token slot ``q`` whose bytes
    stay alive, the configuration after them into ``out[q]`` (slots of dead tokens are left
    as they are). No subtree is taken whole: every live node is visited (the budget rule of
    :mod:`structgen.masks.budget` needs each token's end, not only whether it is allowed).
    Returns ``(i, status)``: DONE, or NEED_GROW (call again from node ``i`` once the runtime
    has grown its tables)."""
    byte, depth, skip, lo, own = trie.byte, trie.depth, trie.skip, trie.lo, trie.own
    trans = T.trans
    while i < end:
        d = depth[i]
        s = st[d - 1]
        t = trans[s, byte[i]]
        if t == UNKNOWN:
            t = succ_row(T, s, byte[i])
            if t == NEED_GROW:
                return i, NEED_GROW
        if t < 0:
            i = skip[i]
            continue
        for q in range(lo[i], lo[i] + own[i]):
            out[q] = t
        st[d] = t
        i += 1
    return i, DONE


@njit(cache=True, nogil=True)
def item_runs(trie: TrieArrays, item: I32s, accept: U8s, kind: I8s, count: I32s, cut: I32s) -> None:
    """How every token reads as a run of items of a prefix-free item table ``item`` (int32
    ``[n, 256]``, -1 dead, row 0 the start; ``accept``: where an item ends), repeated without
    bound from the start: per token slot of ``trie``, ``kind`` 0 when the run reads the whole
    token ending between items, 1 ending inside an item, 2 when it stops between items before
    byte ``cut`` (the token's rest must be read by what follows the run), 3 when it dies inside
    an item; ``count``: the items completed before the end or the stop. One depth-first pass,
    a dead byte settling its whole subtree."""
    byte, depth, skip, lo, own = trie.byte, trie.depth, trie.skip, trie.lo, trie.own
    n = byte.shape[0] - 1
    md = 1
    for i in range(1, n + 1):
        if depth[i] > md:
            md = depth[i]
    st = np.zeros(md + 1, dtype=np.int32)
    items = np.zeros(md + 1, dtype=np.int32)
    i = 1
    while i <= n:
        d = depth[i]
        p = st[d - 1]
        t = item[p, byte[i]]
        if t < 0:
            kd = 2 if p == 0 else 3
            for q in range(lo[i], lo[skip[i]]):
                kind[q] = kd
                count[q] = items[d - 1]
                cut[q] = d - 1
            i = skip[i]
            continue
        c = items[d - 1]
        if accept[t]:
            t = 0
            c += 1
        st[d] = t
        items[d] = c
        for q in range(lo[i], lo[i] + own[i]):
            kind[q] = 0 if t == 0 else 1
            count[q] = c
        i += 1
