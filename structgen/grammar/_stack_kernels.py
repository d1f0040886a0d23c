"""Compiled stacks and configurations of the byte-level runtime (:mod:`structgen.grammar.runtime`).

Stacks are interned frames over rule states (:mod:`structgen.grammar._runtime_kernels`, which
also documents the table layout); a stack's closure under calls and returns, the
configurations (sets of stacks) and their byte transition table ``trans`` are computed here,
one entry or one row at a time on first use. Every kernel returns NEED_GROW instead of
writing past the end of a table: the runtime grows its tables and calls it again.
"""

from __future__ import annotations

import numpy as np

from structgen.grammar._jit import B1, I32, I64, U8, U64, Int, njit
from structgen.grammar._jit import int64 as _int64
from structgen.grammar._jit import mix as _mix
from structgen.grammar._runtime_kernels import (
    ACCEPT,
    BYTES,
    DEAD,
    EXPANDED,
    N_CLOSURE_DATA,
    N_CONFIG_DATA,
    N_CONFIGS,
    N_FRAMES,
    N_ROWS,
    NEED_GROW,
    TAIL,
    UNKNOWN,
    WANT_ROOM,
    Tables,
    expand,
    key_equals,
    seq_hash,
)


@njit(cache=True, nogil=True)
def _frame(meta: I64, fr: I32, hk: I64, hv: I32, cl: I32, cl_cfg: I32, parent: Int, g: Int) -> np.int64:
    """The stack id of frame (parent, g), interned; NEED_GROW when the tables are full."""
    key = (np.int64(parent) << np.int64(32)) | np.int64(g)
    mask = hk.shape[0] - 1
    h = _mix(key) & mask
    while True:
        k = hk[h]
        if k == key:
            return _int64(hv[h])
        if k == -1:
            break
        h = (h + 1) & mask
    n = meta[N_FRAMES]
    if n >= fr.shape[0]:
        return _int64(NEED_GROW)
    fr[n, 0] = parent
    fr[n, 1] = g
    cl[n, 0] = 0
    cl[n, 1] = -1
    cl[n, 2] = 0
    cl_cfg[n] = UNKNOWN
    hk[h] = key
    hv[h] = n
    meta[N_FRAMES] = n + 1
    return _int64(n)


@njit(cache=True, nogil=True)
def frame(T: Tables, parent: Int, g: Int) -> np.int64:
    """:func:`_frame` on the table tuple."""
    return _frame(T.counters, T.frames, T.frame_hash_keys, T.frame_hash_ids, T.closures, T.stack_config,
                  parent, g)


@njit(cache=True, nogil=True)
def _config(meta: I64, cf: I32, cf_d: I32, hk: I64, hv: I32, trans: I32, accepting: B1, ls: U64, loopok: U64,
            rdone: U8, buf: I32, n: Int, acc: bool) -> np.int64:
    """The configuration id of the sorted, duplicate-free stack set ``buf[:n]`` with the
    accepting flag ``acc`` (DEAD when both are empty), interned; or NEED_GROW."""
    if n == 0 and not acc:
        return _int64(DEAD)
    a = 1 if acc else 0
    key = seq_hash(a, buf, n)
    mask = hk.shape[0] - 1
    h = key & mask
    while True:
        k = hk[h]
        if k == -1:
            break
        if k == key:
            c = hv[h]
            if cf[c, 1] == n and cf[c, 2] == a:
                if key_equals(cf_d, cf[c, 0], buf, n):
                    return _int64(c)
        h = (h + 1) & mask
    c = meta[N_CONFIGS]
    used = meta[N_CONFIG_DATA]
    if c >= cf.shape[0]:
        return _int64(NEED_GROW)
    if used + n > cf_d.shape[0]:
        meta[WANT_ROOM] = n
        return _int64(NEED_GROW)
    for i in range(n):
        cf_d[used + i] = buf[i]
    cf[c, 0] = used
    cf[c, 1] = n
    cf[c, 2] = a
    meta[N_CONFIG_DATA] = used + n
    for b in range(256):
        trans[c, b] = UNKNOWN
    accepting[c] = acc
    for w in range(4):
        loopok[c, w] = 0
        ls[c, w] = 0
    rdone[c] = 0
    hk[h] = key
    hv[h] = c
    meta[N_CONFIGS] = c + 1
    return _int64(c)


@njit(cache=True, nogil=True)
def config(T: Tables, buf: I32, n: Int, acc: bool) -> np.int64:
    """:func:`_config` on the table tuple."""
    return _config(T.counters, T.configs, T.config_data, T.config_hash_keys, T.config_hash_ids, T.trans,
                   T.accepting, T.loop_bytes, T.loop_known, T.row_done, buf, n, acc)


@njit(cache=True, nogil=True)
def closure(T: Tables, s: Int) -> Int:
    """Compute the closure of stack ``s`` (if not known): the stacks reachable by calls and
    returns whose top state has byte edges, and whether the empty stack is reachable.
    Returns 0 or NEED_GROW."""
    meta, g_flag, g_call, calls = T.counters, T.state_flags, T.state_calls, T.call_targets
    fr, cl, cl_d = T.frames, T.closures, T.closure_data
    frhk, frhv, cl_cfg = T.frame_hash_keys, T.frame_hash_ids, T.stack_config
    if cl[s, 1] >= 0:
        return 0
    acc = False
    # work stack and result in small arrays (grown on demand); ``seen`` by linear search
    # while small, closures being a few stacks in almost every grammar
    work = np.empty(16, dtype=np.int64)
    seen = np.empty(16, dtype=np.int64)
    res = np.empty(16, dtype=np.int64)
    nw = 1
    ns_ = 1
    nr = 0
    work[0] = s
    seen[0] = s
    while nw > 0:
        nw -= 1
        x = work[nw]
        p = fr[x, 0]
        g = fr[x, 1]
        if g_flag[g] & EXPANDED == 0:
            r = expand(T, g)
            if r < 0:
                return r
        f = g_flag[g]
        # candidates pushed from this frame: its parent (it can return) and its calls
        if f & BYTES:
            if nr == res.shape[0]:
                res = _grow1(res)
            res[nr] = x
            nr += 1
        if f & ACCEPT:
            if p == 0:
                acc = True
            elif cl[p, 1] >= 0:
                st = cl[p, 0]
                for i in range(st, st + cl[p, 1]):
                    if nr == res.shape[0]:
                        res = _grow1(res)
                    res[nr] = cl_d[i]
                    nr += 1
                if cl[p, 2]:
                    acc = True
            elif not _has(seen, ns_, p):
                if ns_ == seen.shape[0]:
                    seen = _grow1(seen)
                seen[ns_] = p
                ns_ += 1
                if nw == work.shape[0]:
                    work = _grow1(work)
                work[nw] = p
                nw += 1
        c0 = g_call[g, 0]
        for k in range(c0, c0 + g_call[g, 1]):
            callee = calls[k, 0]
            ret = calls[k, 1]
            if g_flag[ret] & EXPANDED == 0:
                r = expand(T, ret)
                if r < 0:
                    return r
            if g_flag[ret] & TAIL:
                base = np.int64(p)
            else:
                base = _frame(meta, fr, frhk, frhv, cl, cl_cfg, p, ret)
                if base < 0:
                    return base
            nx = _frame(meta, fr, frhk, frhv, cl, cl_cfg, base, callee)
            if nx < 0:
                return nx
            if not _has(seen, ns_, nx):
                if ns_ == seen.shape[0]:
                    seen = _grow1(seen)
                seen[ns_] = nx
                ns_ += 1
                if nw == work.shape[0]:
                    work = _grow1(work)
                work[nw] = nx
                nw += 1
    arr = res[:nr]
    arr.sort()
    m = 0
    for i in range(nr):
        if m == 0 or arr[i] != arr[m - 1]:
            arr[m] = arr[i]
            m += 1
    used = meta[N_CLOSURE_DATA]
    if used + m > cl_d.shape[0]:
        meta[WANT_ROOM] = m
        return NEED_GROW
    for i in range(m):
        cl_d[used + i] = arr[i]
    meta[N_CLOSURE_DATA] = used + m
    cl[s, 0] = used
    cl[s, 2] = 1 if acc else 0
    cl[s, 1] = m  # last: marks the closure known
    return 0


@njit(cache=True, nogil=True)
def _grow1(a: I64) -> I64:
    b = np.empty(2 * a.shape[0], dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True, nogil=True)
def _has(a: I64, n: Int, x: Int) -> bool:
    for i in range(n):
        if a[i] == x:
            return True
    return False


@njit(cache=True, nogil=True)
def closure_config(T: Tables, s: Int) -> np.int64:
    """The configuration of stack ``s``'s closure (DEAD if empty), or NEED_GROW."""
    cl, cl_d, cl_cfg = T.closures, T.closure_data, T.stack_config
    got = cl_cfg[s]
    if got != UNKNOWN:
        return _int64(got)
    if cl[s, 1] < 0:
        r = closure(T, s)
        if r < 0:
            return _int64(r)
    st = cl[s, 0]
    c = _config(T.counters, T.configs, T.config_data, T.config_hash_keys, T.config_hash_ids, T.trans,
                T.accepting, T.loop_bytes, T.loop_known, T.row_done, cl_d[st:st + cl[s, 1]], cl[s, 1],
                cl[s, 2] != 0)
    if c == NEED_GROW:
        return c
    cl_cfg[s] = c
    return c


@njit(cache=True, nogil=True)
def _succ_stacks(T: Tables, st0: Int, n: Int, b: Int, alive: I64) -> np.int64:
    """For each of the ``n`` stacks ``config_data[st0:st0+n]`` of a configuration, the successor
    stack on byte ``b`` with its closure computed, into ``alive``; returns how many are
    alive, or NEED_GROW."""
    meta, g_row, g_flag = T.counters, T.state_trans, T.state_flags
    fr, cl, cf_d = T.frames, T.closures, T.config_data
    frhk, frhv, cl_cfg = T.frame_hash_keys, T.frame_hash_ids, T.stack_config
    na = 0
    for j in range(n):
        x = cf_d[st0 + j]
        g = fr[x, 1]
        if g_flag[g] & EXPANDED == 0:
            r = expand(T, g)
            if r < 0:
                return _int64(r)
        t = g_row[g, b]
        if t < 0:
            continue
        ns = _frame(meta, fr, frhk, frhv, cl, cl_cfg, fr[x, 0], t)
        if ns < 0:
            return ns
        if cl[ns, 1] < 0:
            r = closure(T, ns)
            if r < 0:
                return _int64(r)
        alive[na] = ns
        na += 1
    return _int64(na)


@njit(cache=True, nogil=True)
def _union_config(T: Tables, alive: I64, na: Int) -> np.int64:
    """The configuration of the union of the closures of stacks ``alive[:na]`` (na >= 1)."""
    cl, cl_d, cl_cfg = T.closures, T.closure_data, T.stack_config
    if na == 1:
        got = cl_cfg[alive[0]]
        if got != UNKNOWN:
            return _int64(got)
        return closure_config(T, alive[0])
    tot = 0
    acc = False
    for j in range(na):
        tot += cl[alive[j], 1]
        if cl[alive[j], 2]:
            acc = True
    buf = np.empty(max(tot, 1), dtype=np.int32)
    m = 0
    for j in range(na):
        ns = alive[j]
        s0 = cl[ns, 0]
        for q in range(s0, s0 + cl[ns, 1]):
            buf[m] = cl_d[q]
            m += 1
    u = buf[:m]
    u.sort()
    w = 0
    for q in range(m):
        if w == 0 or u[q] != u[w - 1]:
            u[w] = u[q]
            w += 1
    return _config(T.counters, T.configs, T.config_data, T.config_hash_keys, T.config_hash_ids, T.trans,
                   T.accepting, T.loop_bytes, T.loop_known, T.row_done, u, w, acc)


@njit(cache=True, nogil=True)
def succ(T: Tables, c: Int, b: Int) -> np.int64:
    """``trans[c, b]``, computed on first use (each stack steps on its own; the successor is
    the union of the stacks' successor closures): a configuration, DEAD or NEED_GROW."""
    trans = T.trans
    got = trans[c, b]
    if got != UNKNOWN:
        return _int64(got)
    cf = T.configs
    n = cf[c, 1]
    out = _int64(DEAD)
    if n > 0:
        alive = np.empty(n, dtype=np.int64)
        na = _succ_stacks(T, cf[c, 0], n, b, alive)
        if na < 0:
            return na
        if na > 0:
            out = _union_config(T, alive, na)
            if out == NEED_GROW:
                return out
    trans[c, b] = out
    return out


@njit(cache=True, nogil=True)
def fill_row(T: Tables, c: Int) -> Int:
    """Compute every unknown entry of ``trans[c, :]``; 0 or NEED_GROW. Bytes on which each
    stack steps to the same rule state share one successor."""
    trans, g_row, fr, cf, cf_d = T.trans, T.state_trans, T.frames, T.configs, T.config_data
    if T.row_done[c]:
        return 0
    st0 = cf[c, 0]
    n = cf[c, 1]
    for j in range(n):
        g = fr[cf_d[st0 + j], 1]
        if T.state_flags[g] & EXPANDED == 0:
            r = expand(T, g)
            if r < 0:
                return r
    # bytes on which every stack steps to the same rule state share one successor: the
    # first such byte (by a hash of the successor vector) computes it
    gs = np.empty(n, dtype=np.int64)
    for j in range(n):
        gs[j] = fr[cf_d[st0 + j], 1]
    slots = np.full(512, -1, dtype=np.int64)
    for b in range(256):
        h = np.int64(0x2545F491)
        for j in range(n):
            h = _mix(h ^ np.int64(g_row[gs[j], b]))
        k = h & 511
        rep = -1
        while slots[k] >= 0:
            b2 = slots[k]
            same = True
            for j in range(n):
                if g_row[gs[j], b2] != g_row[gs[j], b]:
                    same = False
                    break
            if same:
                rep = b2
                break
            k = (k + 1) & 511
        if rep < 0:
            slots[k] = b
            if trans[c, b] == UNKNOWN:
                v = succ(T, c, b)
                if v == NEED_GROW:
                    return NEED_GROW
        elif trans[c, b] == UNKNOWN:
            trans[c, b] = trans[c, rep]
    T.row_done[c] = 1
    T.counters[N_ROWS] += 1
    return 0


@njit(cache=True, nogil=True)
def succ_row(T: Tables, c: Int, b: Int) -> np.int64:
    """``trans[c, b]``, filling the whole row of ``c`` on first use (:func:`fill_row`: bytes
    with equal successor vectors share one computation, far fewer than the bytes a walk
    asks for); a configuration, DEAD or NEED_GROW."""
    if not T.row_done[c]:
        r = fill_row(T, c)
        if r == NEED_GROW:
            return _int64(NEED_GROW)
    return _int64(T.trans[c, b])


@njit(cache=True, nogil=True)
def stack_of_chain(T: Tables, gs: I64, n: Int) -> np.int64:
    """The stack of rule states ``gs[:n]`` (bottom first) above the empty stack; or NEED_GROW."""
    s = _int64(0)
    for i in range(n):
        s = frame(T, s, gs[i])
        if s < 0:
            return s
    return s
