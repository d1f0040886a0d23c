"""Compiled runtime of the lazily determinised pushdown automaton (see :mod:`structgen.masks.engine`).

Everything the engine interns at run time lives in flat arrays, bundled in one compiled
object ``T`` (:class:`Tab`, fields below) so that a kernel gets the whole runtime in one
argument:

* rules (fixed when the engine is built): per rule its kind (a lazily determinised NFA, a
  transition table, or the difference of two tables explored pairwise), where its data
  starts, and its start state once known. NFAs are concatenated (global NFA state ids):
  epsilon, byte-class and call edges in CSR form, the rule's byte classes, which states are
  *important* (have byte or call edges, or are the rule's end) and, memoised, the
  important states of each state's epsilon closure. Tables are concatenated in ``tb``.
* rule states ``g``: one id per state of a rule's DFA that the engine has met, interned by
  a key (the rule and its sorted important NFA states; a table row; a pair of table rows).
  ``g_row[g]`` holds the byte transitions as rule-state ids (-1 dead, -2 while ``g`` is
  not expanded), ``g_flag[g]`` (EXPANDED, ACCEPT, BYTES, TAIL), ``g_call[g] = (start,
  count)`` into ``calls[k] = (callee start state, return state)``, ``g_pred[g]`` a state
  it was first reached from (the horizon checks walk back along it). A state is expanded
  (its row, calls and flags computed, subset construction for NFAs) on first use.
* stacks: interned frames ``fr[s] = (parent stack, rule state)``, 0 = the empty stack;
  per stack its closure under calls and returns, kept to stacks whose top has byte edges
  (``cl[s] = (start, count, accepting)`` into ``cl_d``, count -1 = unknown) and the
  configuration of that closure (``cl_cfg``, -2 = unknown).
* configurations: sorted stack sets plus an accepting flag (``cf[c] = (start, count,
  acc)`` into ``cf_d``), their byte transition table ``trans[c, 256]`` (-2 unknown, -1
  dead), ``accepting[c]`` and the looping-byte sets the trie walks use.

Kernels never allocate table space they do not have: they return NEED_GROW (with the
space a data array lacks in ``meta[M_WANT]``) and the engine grows the tables and calls
again. Interning is idempotent, so a kernel that stops half way leaves only valid entries
behind and simply starts over.

Without numba (or with ``STRUCTGEN_NATIVE=0``) the same functions run as plain Python
(slow, identical results).
"""

from __future__ import annotations

import numpy as np

from structgen.grammar._jit import COMPILED, njit
from structgen.grammar._jit import GOLD as _GOLD
from structgen.grammar._jit import mix as _mix

DEAD = -1
UNKNOWN = -2
DONE = -3
NEED_GROW = -4
SLICED = -5  # walk: the node's state read the text slice (its slice tokens are set)
SLICED_KILL = -6  # ... and rejects "plain text then a control byte" (slice_from answered 3)

EXPANDED = 1
ACCEPT = 2
BYTES = 4
TAIL = 8

LAZY = 0
TABLE = 1
PRODUCT = 2
COUNTED = 3

# meta slots
M_NG = 0      # rule states interned
M_NCALL = 1   # call slots used
M_NFR = 2     # stacks interned (0 = the empty stack)
M_NCLD = 3    # closure data used
M_NCF = 4     # configurations interned
M_NCFD = 5    # configuration data used
M_ROWS = 6    # configuration rows filled
M_NECD = 7    # epsilon-closure data used
M_NGSD = 8    # rule-state key data used
M_WANT = 9    # room a data array lacked (NEED_GROW)
M_EXPANDS = 10  # rule states expanded

# the table fields, in order (see _Tables in structgen/masks/engine.py): name, numba type
def _fields() -> list[tuple[str, object]]:
    from numba import types as nt

    i8, i32, i64, u8, u64, b1 = nt.int8, nt.int32, nt.int64, nt.uint8, nt.uint64, nt.boolean
    v = lambda t: t[::1]  # noqa: E731 - C-contiguous 1-d
    m = lambda t: t[:, ::1]  # noqa: E731 - C-contiguous 2-d
    return [
        ("meta", v(i64)),
        ("rkind", v(i8)), ("rbase", v(i64)), ("raux", v(i64)), ("rcls", m(i32)), ("rncls", v(i32)),
        ("rend", v(i32)), ("rstart", v(i32)), ("rlo", v(i64)), ("rhi", v(i64)),
        ("xepso", v(i32)), ("xeps", v(i32)), ("xedgo", v(i32)), ("xedg", m(i32)), ("xcalo", v(i32)),
        ("xcal", m(i32)), ("ximp", v(u8)), ("xec", m(i32)), ("ecd", v(i32)),
        ("tb", m(i32)), ("tbacc", v(u8)),
        ("grow", m(i32)), ("gflag", v(u8)), ("gcall", m(i32)), ("calls", m(i32)), ("grule", v(i32)),
        ("gkey", m(i32)), ("gsd", v(i32)), ("gshk", v(i64)), ("gshv", v(i32)), ("gpred", v(i32)),
        ("gacc", v(b1)), ("gls", m(u64)), ("glk", v(u8)), ("gsl", m(i8)), ("gu8", v(i8)),
        ("fr", m(i32)), ("frhk", v(i64)), ("frhv", v(i32)), ("cl", m(i32)), ("cld", v(i32)),
        ("clcfg", v(i32)),
        ("cf", m(i32)), ("cfd", v(i32)), ("cfhk", v(i64)), ("cfhv", v(i32)), ("trans", m(i32)),
        ("acc", v(b1)), ("ls", m(u64)), ("lk", m(u64)), ("rdone", v(u8)), ("csl", m(i8)), ("cu8", v(i8)),
    ]


FIELD_NAMES = ["meta", "rkind", "rbase", "raux", "rcls", "rncls", "rend", "rstart", "rlo", "rhi", "xepso",
               "xeps", "xedgo", "xedg", "xcalo", "xcal", "ximp", "xec", "ecd", "tb", "tbacc", "grow", "gflag",
               "gcall", "calls", "grule", "gkey", "gsd", "gshk", "gshv", "gpred", "gacc", "gls", "glk",
               "gsl", "gu8", "fr", "frhk", "frhv", "cl", "cld", "clcfg", "cf", "cfd", "cfhk", "cfhv", "trans",
               "acc", "ls", "lk", "rdone", "csl", "cu8"]

if COMPILED:
    from numba import types as _nt
    from numba.experimental import structref as _structref

    @_structref.register
    class _TabType(_nt.StructRef):
        def preprocess_fields(self, fields):  # type: ignore[no-untyped-def]
            return tuple((name, _nt.unliteral(typ)) for name, typ in fields)

    class Tab(_structref.StructRefProxy):
        """The runtime tables as one compiled object: kernels get a pointer, not dozens of
        array arguments (a tuple of arrays is copied into every call)."""

    _structref.define_boxing(_TabType, Tab)
    _TAB = _TabType(_fields())
    assert [f for f, _t in _fields()] == FIELD_NAMES

    @njit(cache=True)
    def make_tables(meta, rkind, rbase, raux, rcls, rncls, rend, rstart, rlo, rhi, xepso, xeps, xedgo, xedg,
                    xcalo, xcal, ximp, xec, ecd, tb, tbacc, grow, gflag, gcall, calls, grule, gkey, gsd, gshk,
                    gshv, gpred, gacc, gls, glk, gsl, gu8, fr, frhk, frhv, cl, cld, clcfg, cf, cfd, cfhk,
                    cfhv, trans, acc, ls, lk, rdone, csl, cu8):  # type: ignore[no-untyped-def]
        t = _structref.new(_TAB)
        t.meta = meta
        t.rkind = rkind
        t.rbase = rbase
        t.raux = raux
        t.rcls = rcls
        t.rncls = rncls
        t.rend = rend
        t.rstart = rstart
        t.rlo = rlo
        t.rhi = rhi
        t.xepso = xepso
        t.xeps = xeps
        t.xedgo = xedgo
        t.xedg = xedg
        t.xcalo = xcalo
        t.xcal = xcal
        t.ximp = ximp
        t.xec = xec
        t.ecd = ecd
        t.tb = tb
        t.tbacc = tbacc
        t.grow = grow
        t.gflag = gflag
        t.gcall = gcall
        t.calls = calls
        t.grule = grule
        t.gkey = gkey
        t.gsd = gsd
        t.gshk = gshk
        t.gshv = gshv
        t.gpred = gpred
        t.gacc = gacc
        t.gls = gls
        t.glk = glk
        t.gsl = gsl
        t.gu8 = gu8
        t.fr = fr
        t.frhk = frhk
        t.frhv = frhv
        t.cl = cl
        t.cld = cld
        t.clcfg = clcfg
        t.cf = cf
        t.cfd = cfd
        t.cfhk = cfhk
        t.cfhv = cfhv
        t.trans = trans
        t.acc = acc
        t.ls = ls
        t.lk = lk
        t.rdone = rdone
        t.csl = csl
        t.cu8 = cu8
        return t

else:  # pragma: no cover - plain Python: a namespace object with the same attributes
    class Tab:  # type: ignore[no-redef]
        def __init__(self, **kw: object) -> None:
            self.__dict__.update(kw)

    def make_tables(*arrays: object) -> Tab:  # type: ignore[misc]
        return Tab(**dict(zip(FIELD_NAMES, arrays)))


@njit(cache=True, nogil=True)
def _eq_at(data, st, buf, n):  # type: ignore[no-untyped-def]
    """Whether ``data[st : st + n]`` equals ``buf[:n]`` (an interned key against a probe)."""
    for i in range(n):
        if data[st + i] != buf[i]:
            return False
    return True


@njit(cache=True, nogil=True)
def _seq_hash(head, buf, n):  # type: ignore[no-untyped-def]
    h = _mix(np.int64(head) * _GOLD + np.int64(n))
    for i in range(n):
        h = _mix(h ^ (np.int64(buf[i]) * _GOLD))
    return h


# -- rule states ---------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _state(meta, g_row, g_flag, g_rule, g_key, gs_d, hk, hv, g_pred, r, buf, n):  # type: ignore[no-untyped-def]
    """The rule-state id of rule ``r``'s state with key ``buf[:n]``, interned (not
    expanded); or NEED_GROW. (Hot helpers take the arrays they use, not the table tuple:
    passing the whole tuple to a call costs more than most of them do.)"""
    key = _seq_hash(r, buf, n)
    mask = hk.shape[0] - 1
    h = key & mask
    while True:
        k = hk[h]
        if k == -1:
            break
        if k == key:
            g = hv[h]
            if g_rule[g] == r and g_key[g, 1] == n:
                if _eq_at(gs_d, g_key[g, 0], buf, n):
                    return np.int64(g)
        h = (h + 1) & mask
    g = meta[M_NG]
    used = meta[M_NGSD]
    if g >= g_flag.shape[0]:
        return np.int64(NEED_GROW)
    if used + n > gs_d.shape[0]:
        meta[M_WANT] = n
        return np.int64(NEED_GROW)
    for i in range(n):
        gs_d[used + i] = buf[i]
    meta[M_NGSD] = used + n
    g_rule[g] = r
    g_key[g, 0] = used
    g_key[g, 1] = n
    g_flag[g] = 0
    g_pred[g] = -1
    for b in range(256):
        g_row[g, b] = UNKNOWN
    hk[h] = key
    hv[h] = g
    meta[M_NG] = g + 1
    return np.int64(g)


@njit(cache=True, nogil=True)
def state(T, r, buf, n):  # type: ignore[no-untyped-def]
    """:func:`_state` on the table tuple."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.meta, T.grow, T.gflag, T.grule, T.gkey, T.gsd, T.gshk, T.gshv,
        T.gpred)
    return _state(meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred, r, buf, n)


@njit(cache=True, nogil=True)
def _eclose(meta, eps_o, eps, imp, ec, ec_d, x):  # type: ignore[no-untyped-def]
    """Memoise the important states of NFA state ``x``'s epsilon closure (sorted); 0 or
    NEED_GROW."""
    if ec[x, 1] >= 0:
        return 0
    work = [np.int64(x)]
    seen = {np.int64(x)}
    out = [np.int64(0)]
    out.pop()
    while len(work) > 0:
        y = work.pop()
        if imp[y]:
            out.append(y)
        for k in range(eps_o[y], eps_o[y + 1]):
            z = np.int64(eps[k])
            if z not in seen:
                seen.add(z)
                work.append(z)
    m = len(out)
    used = meta[M_NECD]
    if used + m > ec_d.shape[0]:
        meta[M_WANT] = m
        return NEED_GROW
    arr = np.empty(m, dtype=np.int32)
    for i in range(m):
        arr[i] = out[i]
    arr.sort()
    for i in range(m):
        ec_d[used + i] = arr[i]
    meta[M_NECD] = used + m
    ec[x, 0] = used
    ec[x, 1] = m
    return 0


@njit(cache=True, nogil=True)
def _closure_key(meta, eps_o, eps, imp, ec, ec_d, targets, nt, out):  # type: ignore[no-untyped-def]
    """Sorted union of the epsilon closures of NFA states ``targets[:nt]`` into ``out``;
    returns its length, or NEED_GROW (``out`` must have room for the union)."""
    m = 0
    for i in range(nt):
        r = _eclose(meta, eps_o, eps, imp, ec, ec_d, targets[i])
        if r < 0:
            return r
        st = ec[targets[i], 0]
        for k in range(st, st + ec[targets[i], 1]):
            out[m] = ec_d[k]
            m += 1
    u = out[:m]
    u.sort()
    w = 0
    for i in range(m):
        if w == 0 or u[i] != u[w - 1]:
            u[w] = u[i]
            w += 1
    return w


@njit(cache=True, nogil=True)
def _closure_room(meta, eps_o, eps, imp, ec, ec_d, targets, nt):  # type: ignore[no-untyped-def]
    """An upper bound on the size of :func:`_closure_key`'s union (closures memoised first);
    or NEED_GROW."""
    tot = 0
    for i in range(nt):
        r = _eclose(meta, eps_o, eps, imp, ec, ec_d, targets[i])
        if r < 0:
            return r
        tot += ec[targets[i], 1]
    return tot


@njit(cache=True, nogil=True)
def start_state(T, r):  # type: ignore[no-untyped-def]
    """The start state of rule ``r`` (interned); or NEED_GROW."""
    rstart = T.rstart
    got = rstart[r]
    if got >= 0:
        return np.int64(got)
    kind = T.rkind[r]
    if kind == LAZY:
        x = np.empty(1, dtype=np.int32)
        x[0] = T.rbase[r]
        meta = T.meta
        eps_o, eps, imp, ec, ec_d = T.xepso, T.xeps, T.ximp, T.xec, T.ecd
        room = _closure_room(meta, eps_o, eps, imp, ec, ec_d, x, 1)
        if room < 0:
            return np.int64(room)
        key = np.empty(max(room, 1), dtype=np.int32)
        n = _closure_key(meta, eps_o, eps, imp, ec, ec_d, x, 1, key)
        if n < 0:
            return np.int64(n)
        g = state(T, r, key, n)
    elif kind == TABLE:
        key = np.zeros(1, dtype=np.int32)
        g = state(T, r, key, 1)
    elif kind == COUNTED:
        key = np.zeros(2, dtype=np.int32)  # (items so far, item state)
        g = state(T, r, key, 2)
    else:
        key = np.zeros(2, dtype=np.int32)
        key[1] = 1  # (a state 0, b state 0 + 1)
        g = state(T, r, key, 2)
    if g >= 0:
        rstart[r] = g
    return np.int64(g)


@njit(cache=True, nogil=True)
def _expand_lazy(T, g, r, row):  # type: ignore[no-untyped-def]
    """Subset construction for one DFA state of a lazily determinised NFA rule: ``row`` gets
    the byte targets; calls are appended. Returns the flags or NEED_GROW."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.meta, T.grow, T.gflag, T.grule, T.gkey, T.gsd, T.gshk, T.gshv,
        T.gpred)
    eps_o, eps, imp, ec, ec_d = T.xepso, T.xeps, T.ximp, T.xec, T.ecd
    cls, ncls = T.rcls, T.rncls
    edg_o, edg, cal_o, cal, rend = T.xedgo, T.xedg, T.xcalo, T.xcal, T.rend
    g_call, calls = T.gcall, T.calls
    st = g_key[g, 0]
    n = g_key[g, 1]
    nc = ncls[r]
    # targets per byte class (CSR): count, then fill
    cnt = np.zeros(nc + 1, dtype=np.int64)
    accept = False
    for i in range(n):
        x = gs_d[st + i]
        if x == rend[r]:
            accept = True
        for k in range(edg_o[x], edg_o[x + 1]):
            for c in range(edg[k, 0], edg[k, 1] + 1):
                cnt[c + 1] += 1
    for c in range(nc):
        cnt[c + 1] += cnt[c]
    tg = np.empty(max(cnt[nc], 1), dtype=np.int32)
    fillp = cnt[:nc].copy()
    for i in range(n):
        x = gs_d[st + i]
        for k in range(edg_o[x], edg_o[x + 1]):
            t = edg[k, 2]
            for c in range(edg[k, 0], edg[k, 1] + 1):
                tg[fillp[c]] = t
                fillp[c] += 1
    crow = np.full(nc, -1, dtype=np.int64)
    has = False
    # classes with the same target multiset share a successor: an order-independent hash
    # per class, compared through a small open-addressing table of earlier classes
    hsz = 1
    while hsz < 2 * nc:
        hsz *= 2
    hcls = np.full(hsz, -1, dtype=np.int64)
    chash = np.zeros(nc, dtype=np.int64)
    for c in range(nc):
        hh = np.int64(cnt[c + 1] - cnt[c])
        for i in range(cnt[c], cnt[c + 1]):
            hh += _mix(np.int64(tg[i]) + np.int64(0x51ED27))
        chash[c] = _mix(hh)
    for c in range(nc):
        a = cnt[c]
        b = cnt[c + 1]
        if a == b:
            continue
        seg = tg[a:b]
        seg.sort()
        j = -1
        slot = chash[c] & (hsz - 1)
        while hcls[slot] >= 0:
            c2 = hcls[slot]
            a2 = cnt[c2]
            if chash[c2] == chash[c] and cnt[c2 + 1] - a2 == b - a:
                if _eq_at(tg, a2, seg, b - a):
                    j = c2
                    break
            slot = (slot + 1) & (hsz - 1)
        if j >= 0:
            crow[c] = crow[j]
            has = True
            continue
        hcls[slot] = c
        w = 0
        for i in range(b - a):
            if w == 0 or seg[i] != seg[w - 1]:
                seg[w] = seg[i]
                w += 1
        room = _closure_room(meta, eps_o, eps, imp, ec, ec_d, seg, w)
        if room < 0:
            return room
        key = np.empty(max(room, 1), dtype=np.int32)
        m = _closure_key(meta, eps_o, eps, imp, ec, ec_d, seg, w, key)
        if m < 0:
            return m
        t = _state(meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred, r, key, m)
        if t < 0:
            return t
        if g_pred[t] < 0 and t != g:
            g_pred[t] = g
        crow[c] = t
        has = True
    for b in range(256):
        row[b] = crow[cls[r, b]]
    # calls: targets grouped by callee, callees ascending
    ncall = 0
    for i in range(n):
        x = gs_d[st + i]
        ncall += cal_o[x + 1] - cal_o[x]
    nout = 0
    if ncall:
        pairs = np.empty((ncall, 2), dtype=np.int64)
        p = 0
        for i in range(n):
            x = gs_d[st + i]
            for k in range(cal_o[x], cal_o[x + 1]):
                pairs[p, 0] = cal[k, 0]
                pairs[p, 1] = cal[k, 1]
                p += 1
        order = np.argsort(pairs[:, 0] * np.int64(1 << 32) + pairs[:, 1])
        out = np.empty((ncall, 2), dtype=np.int64)
        q = 0
        while q < ncall:
            callee = pairs[order[q], 0]
            e = q
            while e < ncall and pairs[order[e], 0] == callee:
                e += 1
            seg = np.empty(e - q, dtype=np.int32)
            for i in range(q, e):
                seg[i - q] = pairs[order[i], 1]
            room = _closure_room(meta, eps_o, eps, imp, ec, ec_d, seg, e - q)
            if room < 0:
                return room
            key = np.empty(max(room, 1), dtype=np.int32)
            m = _closure_key(meta, eps_o, eps, imp, ec, ec_d, seg, e - q, key)
            if m < 0:
                return m
            t = _state(meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred, r, key, m)
            if t < 0:
                return t
            if g_pred[t] < 0 and t != g:
                g_pred[t] = g
            c0 = start_state(T, callee)
            if c0 < 0:
                return c0
            out[nout, 0] = c0
            out[nout, 1] = t
            nout += 1
            q = e
        used = meta[M_NCALL]
        if used + nout > calls.shape[0]:
            meta[M_WANT] = nout
            return NEED_GROW
        for i in range(nout):
            calls[used + i, 0] = out[i, 0]
            calls[used + i, 1] = out[i, 1]
        meta[M_NCALL] = used + nout
        g_call[g, 0] = used
        g_call[g, 1] = nout
    else:
        g_call[g, 0] = 0
        g_call[g, 1] = 0
    f = EXPANDED
    if accept:
        f |= ACCEPT
    if has:
        f |= BYTES
    if accept and not has and nout == 0:
        f |= TAIL
    return f


@njit(cache=True, nogil=True)
def _expand_table(T, g, r, row):  # type: ignore[no-untyped-def]
    """One state of a table rule (a call-free DFA given as a table)."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.meta, T.grow, T.gflag, T.grule, T.gkey, T.gsd, T.gshk, T.gshv,
        T.gpred)
    tb, tbacc, base = T.tb, T.tbacc, T.rbase
    q = gs_d[g_key[g, 0]]
    src = base[r] + q
    key = np.empty(1, dtype=np.int32)
    has = False
    last = -1
    last_g = np.int64(-1)
    for b in range(256):
        t = tb[src, b]
        if t < 0:
            row[b] = DEAD
            continue
        has = True
        if t != last:
            key[0] = t
            tg = _state(meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred, r, key, 1)
            if tg < 0:
                return tg
            if g_pred[tg] < 0 and tg != g:
                g_pred[tg] = g
            last = t
            last_g = tg
        row[b] = last_g
    T.gcall[g, 0] = 0
    T.gcall[g, 1] = 0
    acc = tbacc[src] != 0
    f = EXPANDED
    if acc:
        f |= ACCEPT
    if has:
        f |= BYTES
    if acc and not has:
        f |= TAIL
    return f


@njit(cache=True, nogil=True)
def _expand_product(T, g, r, row):  # type: ignore[no-untyped-def]
    """One state ``(qa, qb)`` of ``A - B`` over two tables (``qb`` -1: B already failed)."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.meta, T.grow, T.gflag, T.grule, T.gkey, T.gsd, T.gshk, T.gshv,
        T.gpred)
    tb, tbacc, base, aux = T.tb, T.tbacc, T.rbase, T.raux
    st = g_key[g, 0]
    qa = gs_d[st]
    qb = gs_d[st + 1] - 1
    ra = base[r] + qa
    rb = aux[r] + qb
    key = np.empty(2, dtype=np.int32)
    has = False
    # distinct target pairs of this row, interned once each (a row has a few)
    seen_a = np.empty(256, dtype=np.int64)
    seen_b = np.empty(256, dtype=np.int64)
    seen_t = np.empty(256, dtype=np.int64)
    ns = 0
    for b in range(256):
        ta = tb[ra, b]
        if ta < 0:
            row[b] = DEAD
            continue
        has = True
        tb_ = tb[rb, b] if qb >= 0 else -1
        t = np.int64(-1)
        for i in range(ns - 1, -1, -1):
            if seen_a[i] == ta and seen_b[i] == tb_:
                t = seen_t[i]
                break
        if t < 0:
            key[0] = ta
            key[1] = tb_ + 1
            t = _state(meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred, r, key, 2)
            if t < 0:
                return t
            if g_pred[t] < 0 and t != g:
                g_pred[t] = g
            seen_a[ns] = ta
            seen_b[ns] = tb_
            seen_t[ns] = t
            ns += 1
        row[b] = t
    T.gcall[g, 0] = 0
    T.gcall[g, 1] = 0
    acc = tbacc[ra] != 0 and not (qb >= 0 and tbacc[rb] != 0)
    f = EXPANDED
    if acc:
        f |= ACCEPT
    if has:
        f |= BYTES
    if acc and not has:
        f |= TAIL
    return f


@njit(cache=True, nogil=True)
def _expand_counted(T, g, r, row):  # type: ignore[no-untyped-def]
    """One state ``(c, q)`` of ``item{lo,hi}`` for an item given as a prefix-free table (no
    accepting state has an edge, so an item ends exactly where its table accepts): ``c``
    items read, ``q`` the item table's state (0 = between items)."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.meta, T.grow, T.gflag, T.grule, T.gkey, T.gsd, T.gshk, T.gshv,
        T.gpred)
    tb, tbacc, base = T.tb, T.tbacc, T.rbase
    st = g_key[g, 0]
    c = gs_d[st]
    q = gs_d[st + 1]
    lo = T.rlo[r]
    hi = T.rhi[r]
    src = base[r] + q
    key = np.empty(2, dtype=np.int32)
    has = False
    last = -1
    last_t = np.int64(-1)
    for b in range(256):
        q2 = tb[src, b] if (q != 0 or c < hi) else -1
        if q2 < 0:
            row[b] = DEAD
            continue
        has = True
        if q2 != last:
            if tbacc[base[r] + q2]:  # the item ends here: one more item, between items
                key[0] = c + 1
                key[1] = 0
            else:
                key[0] = c
                key[1] = q2
            t = _state(meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred, r, key, 2)
            if t < 0:
                return t
            if g_pred[t] < 0 and t != g:
                g_pred[t] = g
            last = q2
            last_t = t
        row[b] = last_t
    T.gcall[g, 0] = 0
    T.gcall[g, 1] = 0
    acc = q == 0 and c >= lo
    f = EXPANDED
    if acc:
        f |= ACCEPT
    if has:
        f |= BYTES
    if acc and not has:
        f |= TAIL
    return f


@njit(cache=True, nogil=True)
def expand(T, g):  # type: ignore[no-untyped-def]
    """Compute rule state ``g``'s row, calls and flags if not known; 0 or NEED_GROW."""
    g_flag = T.gflag
    if g_flag[g] & EXPANDED:
        return 0
    r = T.grule[g]
    kind = T.rkind[r]
    row = np.empty(256, dtype=np.int32)
    if kind == LAZY:
        f = _expand_lazy(T, g, r, row)
    elif kind == TABLE:
        f = _expand_table(T, g, r, row)
    elif kind == COUNTED:
        f = _expand_counted(T, g, r, row)
    else:
        f = _expand_product(T, g, r, row)
    if f < 0:
        return f
    g_row = T.grow
    for b in range(256):
        g_row[g, b] = row[b]
    T.gacc[g] = (f & ACCEPT) != 0
    T.glk[g] = 0
    T.meta[M_EXPANDS] += 1
    g_flag[g] = f  # last: marks the state expanded
    return 0


# -- stacks and configurations -------------------------------------------------------------

@njit(cache=True, nogil=True)
def _frame(meta, fr, hk, hv, cl, cl_cfg, parent, g):  # type: ignore[no-untyped-def]
    """The stack id of frame (parent, g), interned; NEED_GROW when the tables are full."""
    key = (np.int64(parent) << np.int64(32)) | np.int64(g)
    mask = hk.shape[0] - 1
    h = _mix(key) & mask
    while True:
        k = hk[h]
        if k == key:
            return np.int64(hv[h])
        if k == -1:
            break
        h = (h + 1) & mask
    n = meta[M_NFR]
    if n >= fr.shape[0]:
        return np.int64(NEED_GROW)
    fr[n, 0] = parent
    fr[n, 1] = g
    cl[n, 0] = 0
    cl[n, 1] = -1
    cl[n, 2] = 0
    cl_cfg[n] = UNKNOWN
    hk[h] = key
    hv[h] = n
    meta[M_NFR] = n + 1
    return np.int64(n)


@njit(cache=True, nogil=True)
def frame(T, parent, g):  # type: ignore[no-untyped-def]
    """:func:`_frame` on the table tuple."""
    return _frame(T.meta, T.fr, T.frhk, T.frhv, T.cl, T.clcfg, parent, g)


@njit(cache=True, nogil=True)
def _config(meta, cf, cf_d, hk, hv, trans, accepting, ls, loopok, rdone, buf, n, acc):  # type: ignore[no-untyped-def]
    """The configuration id of the sorted, duplicate-free stack set ``buf[:n]`` with the
    accepting flag ``acc`` (DEAD when both are empty), interned; or NEED_GROW."""
    if n == 0 and not acc:
        return np.int64(DEAD)
    a = 1 if acc else 0
    key = _seq_hash(a, buf, n)
    mask = hk.shape[0] - 1
    h = key & mask
    while True:
        k = hk[h]
        if k == -1:
            break
        if k == key:
            c = hv[h]
            if cf[c, 1] == n and cf[c, 2] == a:
                if _eq_at(cf_d, cf[c, 0], buf, n):
                    return np.int64(c)
        h = (h + 1) & mask
    c = meta[M_NCF]
    used = meta[M_NCFD]
    if c >= cf.shape[0]:
        return np.int64(NEED_GROW)
    if used + n > cf_d.shape[0]:
        meta[M_WANT] = n
        return np.int64(NEED_GROW)
    for i in range(n):
        cf_d[used + i] = buf[i]
    cf[c, 0] = used
    cf[c, 1] = n
    cf[c, 2] = a
    meta[M_NCFD] = used + n
    for b in range(256):
        trans[c, b] = UNKNOWN
    accepting[c] = acc
    for w in range(4):
        loopok[c, w] = 0
        ls[c, w] = 0
    rdone[c] = 0
    hk[h] = key
    hv[h] = c
    meta[M_NCF] = c + 1
    return np.int64(c)


@njit(cache=True, nogil=True)
def config(T, buf, n, acc):  # type: ignore[no-untyped-def]
    """:func:`_config` on the table tuple."""
    return _config(T.meta, T.cf, T.cfd, T.cfhk, T.cfhv, T.trans, T.acc, T.ls,
                   T.lk, T.rdone, buf, n, acc)


@njit(cache=True, nogil=True)
def closure(T, s):  # type: ignore[no-untyped-def]
    """Compute the closure of stack ``s`` (if not known): the stacks reachable by calls and
    returns whose top state has byte edges, and whether the empty stack is reachable.
    Returns 0 or NEED_GROW."""
    meta, g_flag, g_call, calls, fr, cl, cl_d = (T.meta, T.gflag, T.gcall, T.calls, T.fr,
                                                 T.cl, T.cld)
    frhk, frhv, cl_cfg = T.frhk, T.frhv, T.clcfg
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
    used = meta[M_NCLD]
    if used + m > cl_d.shape[0]:
        meta[M_WANT] = m
        return NEED_GROW
    for i in range(m):
        cl_d[used + i] = arr[i]
    meta[M_NCLD] = used + m
    cl[s, 0] = used
    cl[s, 2] = 1 if acc else 0
    cl[s, 1] = m  # last: marks the closure known
    return 0


@njit(cache=True, nogil=True)
def _grow1(a):  # type: ignore[no-untyped-def]
    b = np.empty(2 * a.shape[0], dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True, nogil=True)
def _has(a, n, x):  # type: ignore[no-untyped-def]
    for i in range(n):
        if a[i] == x:
            return True
    return False


@njit(cache=True, nogil=True)
def closure_config(T, s):  # type: ignore[no-untyped-def]
    """The configuration of stack ``s``'s closure (DEAD if empty), or NEED_GROW."""
    cl, cl_d, cl_cfg = T.cl, T.cld, T.clcfg
    got = cl_cfg[s]
    if got != UNKNOWN:
        return np.int64(got)
    if cl[s, 1] < 0:
        r = closure(T, s)
        if r < 0:
            return np.int64(r)
    st = cl[s, 0]
    c = _config(T.meta, T.cf, T.cfd, T.cfhk, T.cfhv, T.trans, T.acc, T.ls,
                T.lk, T.rdone, cl_d[st:st + cl[s, 1]], cl[s, 1], cl[s, 2] != 0)
    if c == NEED_GROW:
        return c
    cl_cfg[s] = c
    return c


@njit(cache=True, nogil=True)
def _succ_stacks(T, st0, n, b, alive):  # type: ignore[no-untyped-def]
    """For each of the ``n`` stacks ``cf_d[st0:st0+n]`` of a configuration, the successor
    stack on byte ``b`` with its closure computed, into ``alive``; returns how many are
    alive, or NEED_GROW."""
    meta, g_row, g_flag, fr, cl, cf_d = T.meta, T.grow, T.gflag, T.fr, T.cl, T.cfd
    frhk, frhv, cl_cfg = T.frhk, T.frhv, T.clcfg
    na = 0
    for j in range(n):
        x = cf_d[st0 + j]
        g = fr[x, 1]
        if g_flag[g] & EXPANDED == 0:
            r = expand(T, g)
            if r < 0:
                return np.int64(r)
        t = g_row[g, b]
        if t < 0:
            continue
        ns = _frame(meta, fr, frhk, frhv, cl, cl_cfg, fr[x, 0], t)
        if ns < 0:
            return ns
        if cl[ns, 1] < 0:
            r = closure(T, ns)
            if r < 0:
                return np.int64(r)
        alive[na] = ns
        na += 1
    return np.int64(na)


@njit(cache=True, nogil=True)
def _union_config(T, alive, na):  # type: ignore[no-untyped-def]
    """The configuration of the union of the closures of stacks ``alive[:na]`` (na >= 1)."""
    cl, cl_d, cl_cfg = T.cl, T.cld, T.clcfg
    if na == 1:
        got = cl_cfg[alive[0]]
        if got != UNKNOWN:
            return np.int64(got)
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
    return _config(T.meta, T.cf, T.cfd, T.cfhk, T.cfhv, T.trans, T.acc, T.ls,
                   T.lk, T.rdone, u, w, acc)


@njit(cache=True, nogil=True)
def succ(T, c, b):  # type: ignore[no-untyped-def]
    """``trans[c, b]``, computed on first use (each stack steps on its own; the successor is
    the union of the stacks' successor closures): a configuration, DEAD or NEED_GROW."""
    trans = T.trans
    got = trans[c, b]
    if got != UNKNOWN:
        return np.int64(got)
    cf = T.cf
    n = cf[c, 1]
    out = np.int64(DEAD)
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
def fill_row(T, c):  # type: ignore[no-untyped-def]
    """Compute every unknown entry of ``trans[c, :]``; 0 or NEED_GROW. Bytes on which each
    stack steps to the same rule state share one successor."""
    trans, g_row, fr, cf, cf_d = T.trans, T.grow, T.fr, T.cf, T.cfd
    if T.rdone[c]:
        return 0
    st0 = cf[c, 0]
    n = cf[c, 1]
    for j in range(n):
        g = fr[cf_d[st0 + j], 1]
        if T.gflag[g] & EXPANDED == 0:
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
    T.rdone[c] = 1
    T.meta[M_ROWS] += 1
    return 0


@njit(cache=True, nogil=True)
def succ_row(T, c, b):  # type: ignore[no-untyped-def]
    """``trans[c, b]``, filling the whole row of ``c`` on first use (:func:`fill_row`: bytes
    with equal successor vectors share one computation, far fewer than the bytes a walk
    asks for); a configuration, DEAD or NEED_GROW."""
    if not T.rdone[c]:
        r = fill_row(T, c)
        if r == NEED_GROW:
            return np.int64(NEED_GROW)
    return np.int64(T.trans[c, b])


@njit(cache=True, nogil=True)
def stack_of_chain(T, gs, n):  # type: ignore[no-untyped-def]
    """The stack of rule states ``gs[:n]`` (bottom first) above the empty stack; or NEED_GROW."""
    s = np.int64(0)
    for i in range(n):
        s = frame(T, s, gs[i])
        if s < 0:
            return s
    return s


# -- table maintenance -----------------------------------------------------------------------

@njit(cache=True, nogil=True)
def rehash_frames(fr, n, hk, hv):  # type: ignore[no-untyped-def]
    """Rebuild the frame hash (all slots -1) from ``fr[1:n]``."""
    mask = hk.shape[0] - 1
    for s in range(1, n):
        key = (np.int64(fr[s, 0]) << np.int64(32)) | np.int64(fr[s, 1])
        h = _mix(key) & mask
        while hk[h] != -1:
            h = (h + 1) & mask
        hk[h] = key
        hv[h] = s


@njit(cache=True, nogil=True)
def rehash_seqs(heads, keys, data, n, hk, hv):  # type: ignore[no-untyped-def]
    """Rebuild a sequence hash (all slots -1) from entries ``0..n-1``: head ``heads[i]`` and
    key ``data[keys[i, 0] : keys[i, 0] + keys[i, 1]]``."""
    mask = hk.shape[0] - 1
    for i in range(n):
        st = keys[i, 0]
        key = _seq_hash(heads[i], data[st:st + keys[i, 1]], keys[i, 1])
        h = key & mask
        while hk[h] != -1:
            h = (h + 1) & mask
        hk[h] = key
        hv[h] = i


# -- token walks over the vocabulary trie (see structgen.masks.trie for the trie layout) ----------

@njit(cache=True, nogil=True)
def _loops(trans, t, loopset, loopok):  # type: ignore[no-untyped-def]
    """Bytes on which state ``t`` (row known) steps to itself, as 4 x uint64."""
    for w in range(4):
        loopset[t, w] = 0
    for b in range(256):
        if trans[t, b] == t:
            loopset[t, b >> 6] |= np.uint64(1) << np.uint64(b & 63)
    loopok[t] = 1


@njit(cache=True, nogil=True)
def _step(T, gmode, trans, s, b):  # type: ignore[no-untyped-def]
    """The successor of state ``s`` on byte ``b`` (a rule state with ``gmode``: its row is
    expanded whole; else a configuration: one entry computed): a state, DEAD or NEED_GROW."""
    t = trans[s, b]
    if t != UNKNOWN:
        return np.int64(t)
    if gmode:
        r = expand(T, s)
        if r < 0:
            return np.int64(r)
        return np.int64(trans[s, b])
    return succ_row(T, s, b)


@njit(cache=True, nogil=True)
def _ctz(x):  # type: ignore[no-untyped-def]
    """Index of the lowest set bit of a non-zero uint64."""
    n = 0
    while (x & np.uint64(1)) == 0:
        x >>= np.uint64(1)
        n += 1
    return n


@njit(cache=True, nogil=True)
def _loop_check(trans, ls, lk, t, suf, i, first, nw):  # type: ignore[no-untyped-def]
    """Whether every byte in ``suf[i]`` (the bytes below trie node ``i``; with ``nw = 2``
    only its ASCII bytes) loops on configuration ``t``, learning loops byte by byte (``ls``
    loop bits, ``lk`` known bits; ``first``, the byte of the node's first child, needed next
    anyway, is tried first): 1 yes, 0 no, or ``-1 - b`` when the successor on byte ``b`` is
    not computed yet."""
    one = np.uint64(1)
    fw = first >> 6
    fb = one << np.uint64(first & 63)
    if fw < nw and not (ls[t, fw] & fb):
        if not (lk[t, fw] & fb):
            v = trans[t, first]
            if v == UNKNOWN:
                return -1 - first
            lk[t, fw] |= fb
            if v == t:
                ls[t, fw] |= fb
        if not (ls[t, fw] & fb):
            return 0
    for w in range(nw):
        need = suf[i, w] & ~ls[t, w]
        if need == 0:
            continue
        if need & lk[t, w]:
            return 0  # a byte below is known not to loop
        while need:
            low = need & (~need + one)
            b = w * 64 + _ctz(low)
            v = trans[t, b]
            if v == UNKNOWN:
                return -1 - b
            lk[t, w] |= low
            if v != t:
                return 0
            ls[t, w] |= low
            need &= ~low
    return 1


@njit(cache=True, nogil=True)
def _loop_learn(T, trans, ls, lk, t, suf, i, first, nw):  # type: ignore[no-untyped-def]
    """:func:`_loop_check`, computing the successors it asks for: 1, 0 or NEED_GROW (the
    walk's fast path reads the loop bits already known without this call)."""
    r = _loop_check(trans, ls, lk, t, suf, i, first, nw)
    while r < 0:
        if succ_row(T, t, -1 - r) == NEED_GROW:
            return np.int64(NEED_GROW)
        r = _loop_check(trans, ls, lk, t, suf, i, first, nw)
    return np.int64(r)


def _utf8_automaton() -> np.ndarray:
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
def u8_loop(T, gmode, t):  # type: ignore[no-untyped-def]
    """Whether every multibyte UTF-8 character leads from state ``t`` (a rule state with
    ``gmode``, else a configuration) back to ``t``, every proper prefix of it staying
    alive: then from ``t`` a byte string of well-formed characters (its last one possibly
    cut) is read whole as long as each of its ASCII bytes loops on ``t``. Depth-first over
    (state, UTF-8 state) pairs, giving up (0) after ``_U8_BUDGET`` of them; memoised in
    ``gu8``/``cu8``. 0, 1 or NEED_GROW."""
    memo = T.gu8 if gmode else T.cu8
    got = memo[t]
    if got >= 0:
        return np.int64(got)
    trans = T.grow if gmode else T.trans
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
    return np.int64(ok)


@njit(cache=True, nogil=True)
def walk(byte, depth, skip, lo, own, suf, wf, slot_ids, T, gmode, i, end, st, tn, split, words, unc,
         cnt, pq, pd, sps, sids, sp):  # type: ignore[no-untyped-def]
    """Depth-first walk of trie nodes ``[i, end)``; ``st[d]`` is the state after the first
    ``d`` bytes of the current path (``st[depth[i] - 1]`` set by the caller). States are
    configurations, or with ``gmode`` rule states of a call-free rule (a rooted walk of one
    frame, no stacks needed).

    Accepted tokens are OR-ed into ``words``. Where every byte below a node loops on the
    node's state, the whole subtree is accepted without visiting it; so it is where every
    path below is well-formed UTF-8 text (``wf[i]``), its ASCII bytes loop and every
    multibyte character leads back to the state (:func:`u8_loop`). With ``split`` (a walk
    rooted at a stack top, see Engine._split_mask), ``tn[d]`` records whether the path
    passed an accepting state after one of its first ``d`` bytes (``tn[0] = 0``): where such
    a path dies, the rule could have returned earlier, so the ids of the dead node's subtree
    are appended to ``unc`` (count in ``cnt[0]``), not rejected.
    With ``sp[3] >= 0`` (``sp`` = slice depth, budget, width, node threshold), a node of more
    than ``sp[3]`` descendants whose path is plain text (slice automaton ``pd``, state
    ``pq[d]``) and whose state reads the slice (:func:`slice_from`) stops the walk: its slice
    tokens (``sids[sps[lo[i]] : sps[lo[skip[i]]]]``) are set, ``st``/``tn`` hold the node's
    state, and SLICED or SLICED_KILL is returned with the node (see :func:`walk_sliced`).
    Returns ``(i, status)``: DONE, SLICED, SLICED_KILL, or NEED_GROW (call again from node
    ``i`` once the engine has grown its tables)."""
    if gmode:
        trans, accepting = T.grow, T.gacc
    else:
        trans, accepting = T.trans, T.acc
    gls, glk, ls, lk = T.gls, T.glk, T.ls, T.lk
    gu8, cu8 = T.gu8, T.cu8
    slmemo = T.gsl if gmode else T.csl
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
                if not glk[t]:
                    _loops(trans, t, gls, glk)
                asc = ((suf[i, 0] & ~gls[t, 0]) | (suf[i, 1] & ~gls[t, 1])) == 0
                full = asc and ((suf[i, 2] & ~gls[t, 2]) | (suf[i, 3] & ~gls[t, 3])) == 0
                asc = asc and gu8[t] != 0
            else:
                n0 = suf[i, 0] & ~ls[t, 0]
                n1 = suf[i, 1] & ~ls[t, 1]
                n2 = suf[i, 2] & ~ls[t, 2]
                n3 = suf[i, 3] & ~ls[t, 3]
                if (n0 | n1 | n2 | n3) == 0:
                    r = 1
                elif (n0 & lk[t, 0]) | (n1 & lk[t, 1]) | (n2 & lk[t, 2]) | (n3 & lk[t, 3]):
                    r = 0  # a byte below is known not to loop
                else:
                    r = _loop_learn(T, trans, ls, lk, t, suf, i, byte[i + 1], 4)
                full = r == 1
                asc = False
                if not full and r != NEED_GROW and wf[i] and cu8[t] != 0 and (n2 | n3) != 0:
                    n0 = suf[i, 0] & ~ls[t, 0]
                    n1 = suf[i, 1] & ~ls[t, 1]
                    if (n0 | n1) == 0:
                        r = 1
                    elif (n0 & lk[t, 0]) | (n1 & lk[t, 1]):
                        r = 0
                    else:
                        r = _loop_learn(T, trans, ls, lk, t, suf, i, byte[i + 1], 2)
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
                    v = slmemo[t, q0]
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
def walk_ids(id_off, id_len, blob, T, gmode, start, ids, pos, words, split, unc,
             cnt):  # type: ignore[no-untyped-def]
    """Walk tokens ``ids[pos[0]:]`` from state ``start``, OR-ing the accepted ones into
    ``words`` (tokens already set are skipped). With ``split``, a token that dies after
    passing an accepting state (after its first byte or later) is appended to ``unc``
    (count ``cnt[0]``). Resumable: ``pos`` = (token index, byte index, state, passed an
    accepting state). Returns DONE or NEED_GROW."""
    if gmode:
        trans, accepting = T.grow, T.gacc
    else:
        trans, accepting = T.trans, T.acc
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
def slice_from(T, gmode, s, q0, pd, depth, budget, width):  # type: ignore[no-untyped-def]
    """Whether every byte string of at most ``depth`` bytes that the slice automaton ``pd``
    (int8 ``[P, 256]``, -1 = no edge) reads from its state ``q0`` (the last character cut or not) can
    be read from state ``s`` (a rule state with ``gmode``, else a configuration): then every
    token whose bytes, after the ones that led to ``s`` and ``q0``, lie in the slice is
    accepted. Breadth-first over (state, slice state) pairs, giving up (answer 0) after
    ``budget`` pairs or when one depth has more than ``width``; and at character
    boundaries, where (almost) every printable ASCII byte does not lead to one and the
    same state: text states loop or step to the next position of a counted string, while
    states that branch on the text (keys, enumerations, patterns) would build many states
    for nothing. Memoised per (state, slice state) in ``gsl``/``csl``. 0 (no), 1 (yes), 3
    (yes, and no state on the way is accepting and every C0 control byte at a character
    boundary is dead: a token of plain text then a control byte is rejected in any
    context) or NEED_GROW."""
    memo = T.gsl if gmode else T.csl
    got = memo[s, q0]
    if got >= 0:
        return np.int64(got)
    trans = T.grow if gmode else T.trans
    accepting = T.gacc if gmode else T.acc
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
    return np.int64(ok)


@njit(cache=True, nogil=True)
def walk_sliced(fb, fd, fs, flo, fown, fsuf, fwf, fids, cb, cd, cs, clo, cown, csuf, cwf, cids, cnode,
                kb, kd, ks, klo, kown, ksuf, kwf, kids, knode, sps, sids, pd, sp, T, gmode, start, pos, st,
                tn, pq, split, words, unc, cnt):  # type: ignore[no-untyped-def]
    """The walk of :func:`walk` from ``start`` over the whole vocabulary (trie ``f*``), taking
    the text slice whole where it can: at the root, and at every node of more than ``sp[3]``
    descendants whose path so far is plain text, when the node's state can read the slice
    (:func:`slice_from`; ``sp`` = its depth, budget, width, and that threshold), the slice's
    tokens below the node (``sids[sps[flo[i]] : sps[flo[fs[i]]]]``, in full-trie order) are
    accepted at once and only the node's subtree in the trie of the other tokens (``c*``,
    node ``cnode[i]``) is walked. A key that may be any string, or a string body, then
    costs a walk of the few thousand tokens outside the slice, wherever the key's names
    branch. Where the check also finds control bytes dead (answer 3) and the path has not
    passed an accepting state, the trie ``k*`` (node ``knode[i]``) is walked instead: it
    also leaves out the tokens of plain text then a control byte, all rejected.
    Resumable: ``pos`` = (full-trie node, 0 = the root still to decide, -1 = the root
    took the slice; other-trie node of the walk in progress, or -1; its end; 1 when that
    walk is in ``k*``). Returns DONE or NEED_GROW."""
    off = np.full(4, -1, dtype=np.int64)  # the other tries' walks take no slice
    while True:
        if pos[1] >= 0:  # a walk of the other tokens below a node that took the slice
            if pos[3]:
                j, r = walk(kb, kd, ks, klo, kown, ksuf, kwf, kids, T, gmode, pos[1], pos[2], st, tn, split,
                            words, unc, cnt, pq, pd, sps, sids, off)
            else:
                j, r = walk(cb, cd, cs, clo, cown, csuf, cwf, cids, T, gmode, pos[1], pos[2], st, tn, split,
                            words, unc, cnt, pq, pd, sps, sids, off)
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
                for k in range(sids.shape[0]):
                    tid = sids[k]
                    words[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
                pos[0] = -1
                pos[1] = 1
                pos[3] = 1 if v == 3 else 0
                pos[2] = kb.shape[0] if v == 3 else cb.shape[0]
                continue
            pos[0] = 1
        i, r = walk(fb, fd, fs, flo, fown, fsuf, fwf, fids, T, gmode, pos[0], fb.shape[0], st, tn, split,
                    words, unc, cnt, pq, pd, sps, sids, sp)
        pos[0] = i
        if r == DONE or r == NEED_GROW:
            return r
        # node i took the slice: walk its subtree in the trie of the other tokens
        kl = r == SLICED_KILL and not (split and tn[fd[i]])
        c = knode[i] if kl else cnode[i]
        if c < 0:
            pos[0] = fs[i]
            continue
        pos[1] = c + 1
        pos[2] = ks[c] if kl else cs[c]
        pos[3] = 1 if kl else 0
