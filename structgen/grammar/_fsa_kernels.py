"""Compiled DFA algorithms for grammar compilation (see :mod:`structgen.grammar.fsa`): subset
construction of a call-free NFA, the product of two DFAs, trimming and Hopcroft
minimisation. DFAs are transition tables ``trans`` (int32 ``[n, 256]``, -1 = no edge; state 0
= start) with an accepting flag per state.

Every kernel takes a work budget (a count of inner steps, derived by the caller from the
compile deadline) and a stop cell (int8 ``[1]``, :func:`structgen.limits.stop_cell`: set once
the request is cancelled, from another thread) and returns a status: OK, LIMIT (more states
than allowed) or OUT_OF_TIME (the budget spent, or the cell set).
Without numba (or with ``STRUCTGEN_NATIVE=0``) they run as plain Python: correct, slow.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from structgen.grammar._jit import B1, I8, I32, I64, njit
from structgen.grammar._jit import COMPILED as COMPILED  # read by structgen.grammar.fsa
from structgen.grammar._jit import GOLD as _GOLD
from structgen.grammar._jit import mix as _mix

_S = TypeVar("_S", bound=np.generic)

OK = 0
LIMIT = 1
OUT_OF_TIME = 2


@njit(cache=True, nogil=True)
def _grow1(a: NDArray[_S]) -> NDArray[_S]:
    b = np.empty(2 * a.shape[0] + 16, dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True, nogil=True)
def _grow2(a: NDArray[_S]) -> NDArray[_S]:
    b = np.empty((2 * a.shape[0] + 16, a.shape[1]), dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True, nogil=True)
def byte_classes(edg: I32) -> tuple[I32, int]:
    """Byte classes from edge ranges ``edg[k] = (lo, hi, target)``: bytes no range boundary
    separates share a class. Returns ``class_of`` (int32 [256]) and the class count."""
    cut = np.zeros(257, dtype=np.bool_)
    cut[0] = True
    cut[256] = True
    for k in range(edg.shape[0]):
        cut[edg[k, 0]] = True
        cut[edg[k, 1] + 1] = True
    class_of = np.empty(256, dtype=np.int32)
    c = -1
    for b in range(256):
        if cut[b]:
            c += 1
        class_of[b] = c
    return class_of, c + 1


@njit(cache=True, nogil=True)
def _closures(eps_o: I32, eps: I32, imp: B1, need: B1) -> tuple[I64, I32]:
    """For every NFA state with ``need[x]``: the important states of its epsilon closure,
    sorted (CSR ``ec_o [nx+1]``, ``ec_d``; empty for the others)."""
    nx = eps_o.shape[0] - 1
    ec_o = np.zeros(nx + 1, dtype=np.int64)
    ec_d = np.empty(max(nx, 16), dtype=np.int32)
    used = 0
    mark = np.full(nx, -1, dtype=np.int64)
    stack = np.empty(max(nx, 1), dtype=np.int64)
    for x in range(nx):
        ec_o[x] = used
        if not need[x]:
            continue
        top = 1
        stack[0] = x
        mark[x] = x
        while top > 0:
            top -= 1
            y = stack[top]
            if imp[y]:
                if used == ec_d.shape[0]:
                    ec_d = _grow1(ec_d)
                ec_d[used] = y
                used += 1
            for k in range(eps_o[y], eps_o[y + 1]):
                z = eps[k]
                if mark[z] != x:
                    mark[z] = x
                    stack[top] = z
                    top += 1
        ec_d[ec_o[x]:used].sort()
    ec_o[nx] = used
    return ec_o, ec_d


@njit(cache=True, nogil=True)
def determinise(eps_o: I32, eps: I32, edg_o: I32, edg: I32, start: int, end: int, limit: int, budget: int,
                stop: I8) -> tuple[int, I32, B1]:
    """Subset construction of a call-free NFA (CSR: epsilon edges; byte edges ``(lo, hi,
    target)``). A DFA state is the set of *important* NFA states of an epsilon closure (those
    with byte edges, or ``end``). Returns ``(status, trans [n, 256], accept [n])``."""
    nx = eps_o.shape[0] - 1
    class_of, nclass = byte_classes(edg)
    imp = np.zeros(nx, dtype=np.bool_)
    need = np.zeros(nx, dtype=np.bool_)
    need[start] = True
    for x in range(nx):
        imp[x] = edg_o[x + 1] > edg_o[x] or x == end
    for k in range(edg.shape[0]):
        need[edg[k, 2]] = True
    ec_o, ec_d = _closures(eps_o, eps, imp, need)
    work = np.int64(ec_d.shape[0])
    # DFA states: sets in CSR, interned by hash
    s_off = np.zeros(64, dtype=np.int64)
    s_len = np.zeros(64, dtype=np.int64)
    s_d = np.empty(1024, dtype=np.int32)
    s_used = 0
    hsz = 256
    hk = np.full(hsz, -1, dtype=np.int64)
    hv = np.zeros(hsz, dtype=np.int64)
    nstate = 0
    ctrans = np.full((64, nclass), -1, dtype=np.int32)
    accept = np.zeros(64, dtype=np.bool_)
    buf = np.empty(64, dtype=np.int32)
    mark = np.full(nx, -1, dtype=np.int64)
    stamp = 0
    cnt = np.zeros(nclass + 1, dtype=np.int64)
    i = -1  # -1: intern the start state; then expand states 0, 1, ...
    while i < nstate:
        if i >= 0:
            for c in range(nclass + 1):
                cnt[c] = 0
            st = s_off[i]
            for j in range(s_len[i]):
                x = s_d[st + j]
                if x == end:
                    accept[i] = True
                for k in range(edg_o[x], edg_o[x + 1]):
                    for c in range(class_of[edg[k, 0]], class_of[edg[k, 1]] + 1):
                        cnt[c + 1] += 1
            for c in range(nclass):
                cnt[c + 1] += cnt[c]
            tg = np.empty(max(cnt[nclass], 1), dtype=np.int32)
            fill = cnt[:nclass].copy()
            for j in range(s_len[i]):
                x = s_d[st + j]
                for k in range(edg_o[x], edg_o[x + 1]):
                    t = edg[k, 2]
                    for c in range(class_of[edg[k, 0]], class_of[edg[k, 1]] + 1):
                        tg[fill[c]] = t
                        fill[c] += 1
            work += 4 * (s_len[i] + cnt[nclass]) + 8 * nclass
            nloop = nclass
        else:
            tg = np.empty(1, dtype=np.int32)
            tg[0] = start
            cnt[0] = 0
            cnt[1] = 1
            nloop = 1
        for c in range(nloop):
            a = cnt[c]
            b = cnt[c + 1]
            if a == b:
                continue
            if i >= 0 and c > 0 and cnt[c] - cnt[c - 1] == b - a and ctrans[i, c - 1] >= 0:
                same = True  # the same targets as the previous class: the same successor
                a0 = cnt[c - 1]
                for q in range(b - a):
                    if tg[a0 + q] != tg[a + q]:
                        same = False
                        break
                if same:
                    ctrans[i, c] = ctrans[i, c - 1]
                    continue
            # closure of the targets: union of their epsilon closures
            stamp += 1
            m = 0
            for q in range(a, b):
                x = tg[q]
                work += ec_o[x + 1] - ec_o[x]
                for k in range(ec_o[x], ec_o[x + 1]):
                    y = ec_d[k]
                    if mark[y] != stamp:
                        mark[y] = stamp
                        if m == buf.shape[0]:
                            buf = _grow1(buf)
                        buf[m] = y
                        m += 1
            key = buf[:m]
            key.sort()
            work += 4 * m + (b - a) + 16
            if work > budget or stop[0] != 0:
                return OUT_OF_TIME, np.zeros((0, 256), np.int32), np.zeros(0, np.bool_)
            h = _mix(np.int64(m) * _GOLD)
            for q in range(m):
                h = _mix(h ^ (np.int64(key[q]) * _GOLD))
            slot = h & (hsz - 1)
            found = -1
            while hk[slot] != -1:
                if hk[slot] == h:
                    j = hv[slot]
                    if s_len[j] == m:
                        same = True
                        o = s_off[j]
                        for q in range(m):
                            if s_d[o + q] != key[q]:
                                same = False
                                break
                        if same:
                            found = j
                            break
                slot = (slot + 1) & (hsz - 1)
            if found < 0:
                found = nstate
                if found >= limit:
                    return LIMIT, np.zeros((0, 256), np.int32), np.zeros(0, np.bool_)
                if found == s_off.shape[0]:
                    s_off = _grow1(s_off)
                    s_len = _grow1(s_len)
                    old = ctrans.shape[0]
                    ctrans = _grow2(ctrans)
                    ctrans[old:] = -1
                    acc2 = np.zeros(ctrans.shape[0], dtype=np.bool_)
                    acc2[:old] = accept[:old]
                    accept = acc2
                while s_used + m > s_d.shape[0]:
                    s_d = _grow1(s_d)
                s_d[s_used:s_used + m] = key
                work += 64 + nclass  # a new state: its row, later its 256 output bytes
                s_off[found] = s_used
                s_len[found] = m
                s_used += m
                nstate += 1
                hk[slot] = h
                hv[slot] = found
                if 2 * nstate > hsz:  # rehash
                    hsz *= 2
                    hk2 = np.full(hsz, -1, dtype=np.int64)
                    hv2 = np.zeros(hsz, dtype=np.int64)
                    for z in range(hk.shape[0]):
                        if hk[z] != -1:
                            s2 = hk[z] & (hsz - 1)
                            while hk2[s2] != -1:
                                s2 = (s2 + 1) & (hsz - 1)
                            hk2[s2] = hk[z]
                            hv2[s2] = hv[z]
                    hk = hk2
                    hv = hv2
            if i >= 0:
                ctrans[i, c] = found
        i += 1
    trans = np.empty((nstate, 256), dtype=np.int32)
    for q in range(nstate):
        for b in range(256):
            trans[q, b] = ctrans[q, class_of[b]]
    return OK, trans, accept[:nstate].copy()


@njit(cache=True, nogil=True)
def column_classes(ta: I32, tb: I32) -> tuple[I32, I32]:
    """Bytes on which every state of both tables agrees share a class: ``(class_of [256],
    first byte of each class)``."""
    # polynomial hash of every column, rows outer (the tables are row-major)
    h = np.zeros(256, dtype=np.uint64)
    mul = np.uint64(0x100000001B3)
    for q in range(ta.shape[0]):
        for b in range(256):
            h[b] = h[b] * mul + np.uint64(ta[q, b] + 2)
    for q in range(tb.shape[0]):
        for b in range(256):
            h[b] = h[b] * mul + np.uint64(tb[q, b] + 3)
    class_of = np.full(256, -1, dtype=np.int32)
    firsts = np.empty(256, dtype=np.int32)
    n = 0
    for b in range(256):
        if class_of[b] >= 0:
            continue
        class_of[b] = n
        firsts[n] = b
        for b2 in range(b + 1, 256):
            if class_of[b2] < 0 and h[b2] == h[b]:
                same = True
                for q in range(ta.shape[0]):
                    if ta[q, b] != ta[q, b2]:
                        same = False
                        break
                if same:
                    for q in range(tb.shape[0]):
                        if tb[q, b] != tb[q, b2]:
                            same = False
                            break
                if same:
                    class_of[b2] = n
        n += 1
    return class_of, firsts[:n].copy()


@njit(cache=True, nogil=True)
def product(ta: I32, acc_a: B1, tb: I32, acc_b: B1, is_and: bool, limit: int, budget: int,
            stop: I8) -> tuple[int, I32, B1]:
    """``A & B`` or ``A - B`` of two DFA tables (missing edges = dead), explored from the
    start pair. Returns ``(status, trans [n, 256], accept [n])``."""
    class_of, firsts = column_classes(ta, tb)
    nc = firsts.shape[0]
    nb1 = np.int64(tb.shape[0] + 1)
    hsz = 1024
    hk = np.full(hsz, -1, dtype=np.int64)
    hv = np.zeros(hsz, dtype=np.int64)
    pa = np.zeros(256, dtype=np.int64)
    pb = np.zeros(256, dtype=np.int64)
    ctrans = np.full((256, nc), -1, dtype=np.int32)
    n = 1
    pa[0] = 0
    pb[0] = 0
    hk[_mix(np.int64(1)) & (hsz - 1)] = 1  # key of (0, 0): 0 * nb1 + (0 + 1)
    hv[_mix(np.int64(1)) & (hsz - 1)] = 0
    i = 0
    work = 0
    while i < n:
        qa = pa[i]
        qb = pb[i]
        for c in range(nc):
            b = firsts[c]
            ta_ = ta[qa, b]
            if ta_ < 0:
                continue
            tb_ = tb[qb, b] if qb >= 0 else -1
            if is_and and tb_ < 0:
                continue
            key = np.int64(ta_) * nb1 + (tb_ + 1)
            slot = _mix(key) & (hsz - 1)
            j = -1
            while hk[slot] != -1:
                if hk[slot] == key:
                    j = hv[slot]
                    break
                slot = (slot + 1) & (hsz - 1)
            if j < 0:
                j = n
                if j >= limit:
                    return LIMIT, np.zeros((0, 256), np.int32), np.zeros(0, np.bool_)
                if j == pa.shape[0]:
                    pa = _grow1(pa)
                    pb = _grow1(pb)
                    old = ctrans.shape[0]
                    ctrans = _grow2(ctrans)
                    ctrans[old:] = -1
                pa[j] = ta_
                pb[j] = tb_
                n += 1
                hk[slot] = key
                hv[slot] = j
                if 2 * n > hsz:
                    hsz *= 2
                    hk2 = np.full(hsz, -1, dtype=np.int64)
                    hv2 = np.zeros(hsz, dtype=np.int64)
                    for z in range(hk.shape[0]):
                        if hk[z] != -1:
                            s2 = _mix(hk[z]) & (hsz - 1)
                            while hk2[s2] != -1:
                                s2 = (s2 + 1) & (hsz - 1)
                            hk2[s2] = hk[z]
                            hv2[s2] = hv[z]
                    hk = hk2
                    hv = hv2
            ctrans[i, c] = j
        work += 4 * nc + 16
        if work > budget or stop[0] != 0:
            return OUT_OF_TIME, np.zeros((0, 256), np.int32), np.zeros(0, np.bool_)
        i += 1
    trans = np.empty((n, 256), dtype=np.int32)
    accept = np.zeros(n, dtype=np.bool_)
    for q in range(n):
        for b in range(256):
            trans[q, b] = ctrans[q, class_of[b]]
        a = acc_a[pa[q]]
        bb = pb[q] >= 0 and acc_b[pb[q]]
        accept[q] = (a and bb) if is_and else (a and not bb)
    return OK, trans, accept


@njit(cache=True, nogil=True)
def trim(trans: I32, accept: B1) -> tuple[I32, B1]:
    """Keep the states reachable from 0 that can reach an accepting state, renumbered in
    order (edges into dropped states removed). Returns ``(trans, accept)``; a DFA whose
    start cannot accept becomes one dead state."""
    n: int = trans.shape[0]
    # reverse edges (CSR by target)
    cnt = np.zeros(n + 1, dtype=np.int64)
    for q in range(n):
        for b in range(256):
            t = trans[q, b]
            if t >= 0:
                cnt[t + 1] += 1
    for q in range(n):
        cnt[q + 1] += cnt[q]
    src = np.empty(max(cnt[n], 1), dtype=np.int64)
    fill = cnt[:n].copy()
    for q in range(n):
        for b in range(256):
            t = trans[q, b]
            if t >= 0:
                src[fill[t]] = q
                fill[t] += 1
    good = accept.copy()
    stack = np.empty(n, dtype=np.int64)
    top = 0
    for q in range(n):
        if good[q]:
            stack[top] = q
            top += 1
    while top > 0:
        top -= 1
        q = stack[top]
        for k in range(cnt[q], cnt[q + 1]):
            p = src[k]
            if not good[p]:
                good[p] = True
                stack[top] = p
                top += 1
    if n == 0 or not good[0]:
        return np.full((1, 256), -1, dtype=np.int32), np.zeros(1, dtype=np.bool_)
    reach = np.zeros(n, dtype=np.bool_)
    reach[0] = True
    stack[0] = 0
    top = 1
    while top > 0:
        top -= 1
        q = stack[top]
        for b in range(256):
            t = trans[q, b]
            if t >= 0 and good[t] and not reach[t]:
                reach[t] = True
                stack[top] = t
                top += 1
    remap = np.full(n, -1, dtype=np.int32)
    m = 0
    for q in range(n):
        if reach[q]:
            remap[q] = m
            m += 1
    out = np.empty((m, 256), dtype=np.int32)
    acc = np.zeros(m, dtype=np.bool_)
    for q in range(n):
        j = remap[q]
        if j < 0:
            continue
        acc[j] = accept[q]
        for b in range(256):
            t = trans[q, b]
            out[j, b] = remap[t] if t >= 0 else -1
    return out, acc


@njit(cache=True, nogil=True)
def minimise(trans: I32, accept: B1, budget: int, stop: I8) -> tuple[int, I32, B1]:
    """Hopcroft's partition refinement over the byte classes of a trimmed DFA (a dead sink
    completes it). Returns ``(status, trans, accept)``: the start state's block is state 0,
    the others in order of first occurrence."""
    n = trans.shape[0]
    if n <= 1:
        return OK, trans, accept
    # symbol classes: bytes with equal columns
    class_of, firsts = column_classes(trans, trans[:0])
    k = firsts.shape[0]
    N = n + 1  # + the dead sink
    dead = n
    # inverse transitions per class (CSR over (class, target))
    cnt = np.zeros(k * N + 1, dtype=np.int64)
    for c in range(k):
        b = firsts[c]
        for q in range(N):
            t = trans[q, b] if q < n else -1
            if t < 0:
                t = dead
            cnt[c * N + t + 1] += 1
    for z in range(k * N):
        cnt[z + 1] += cnt[z]
    pre = np.empty(k * N, dtype=np.int64)
    fill = cnt[: k * N].copy()
    for c in range(k):
        b = firsts[c]
        for q in range(N):
            t = trans[q, b] if q < n else -1
            if t < 0:
                t = dead
            pre[fill[c * N + t]] = q
            fill[c * N + t] += 1
    # partition: elements grouped by block in ``elem``; block b = elem[bstart[b]:bend[b]]
    elem = np.empty(N, dtype=np.int64)
    pos = np.empty(N, dtype=np.int64)
    block = np.empty(N, dtype=np.int64)
    bstart = np.zeros(N, dtype=np.int64)
    bend = np.zeros(N, dtype=np.int64)
    na = 0
    for q in range(n):
        if accept[q]:
            na += 1
    ia = 0
    ir = na
    for q in range(N):
        if q < n and accept[q]:
            elem[ia] = q
            pos[q] = ia
            block[q] = 0
            ia += 1
        else:
            elem[ir] = q
            pos[q] = ir
            block[q] = 1
            ir += 1
    nblocks = 2
    bstart[0] = 0
    bend[0] = na
    bstart[1] = na
    bend[1] = N
    if na == 0:  # cannot happen for a trimmed DFA with states, but stay safe
        return OK, trans, accept
    # worklist of (block, class)
    inw = np.zeros((N, k), dtype=np.bool_)
    wl = np.empty(2 * k + 16, dtype=np.int64)
    nw = 0
    small = 0 if na <= N - na else 1
    for c in range(k):
        if nw == wl.shape[0]:
            wl = _grow1(wl)
        wl[nw] = small * k + c
        inw[small, c] = True
        nw += 1
    marked = np.zeros(N, dtype=np.int64)  # per block: marked elements moved to its front
    touched = np.empty(N, dtype=np.int64)
    xs = np.empty(N, dtype=np.int64)
    work = 0
    while nw > 0:
        nw -= 1
        item = wl[nw]
        a = item // k
        c = item % k
        inw[a, c] = False
        # predecessors under c of the members of block a
        nx = 0
        for z in range(bstart[a], bend[a]):
            t = elem[z]
            for kk in range(cnt[c * N + t], cnt[c * N + t + 1]):
                xs[nx] = pre[kk]
                nx += 1
        work += nx + (bend[a] - bstart[a])
        if work > budget or stop[0] != 0:
            return OUT_OF_TIME, trans, accept
        nt = 0
        for z in range(nx):
            p = xs[z]
            bp = block[p]
            # move p to the front part (marked) of its block
            m0 = bstart[bp] + marked[bp]
            if pos[p] >= m0:
                if marked[bp] == 0:
                    touched[nt] = bp
                    nt += 1
                q2 = elem[m0]
                pp = pos[p]
                elem[m0] = p
                pos[p] = m0
                elem[pp] = q2
                pos[q2] = pp
                marked[bp] += 1
        for z in range(nt):
            y = touched[z]
            mk = marked[y]
            marked[y] = 0
            size = bend[y] - bstart[y]
            if mk == size:
                continue
            # split: the marked front becomes a new block
            nb = nblocks
            nblocks += 1
            bstart[nb] = bstart[y]
            bend[nb] = bstart[y] + mk
            bstart[y] = bstart[y] + mk
            for q in range(bstart[nb], bend[nb]):
                block[elem[q]] = nb
            for cc in range(k):
                if inw[y, cc]:
                    add = nb
                else:
                    add = nb if mk <= size - mk else y
                if not inw[add, cc]:
                    if nw == wl.shape[0]:
                        wl = _grow1(wl)
                    wl[nw] = add * k + cc
                    inw[add, cc] = True
                    nw += 1
    if nblocks == N:
        return OK, trans, accept
    # renumber: the dead sink's block is dropped; the start's block first
    newid = np.full(nblocks, -1, dtype=np.int64)
    dblock = block[dead]
    m = 0
    newid[block[0]] = 0
    m = 1
    for q in range(n):
        bq = block[q]
        if newid[bq] < 0 and bq != dblock:
            newid[bq] = m
            m += 1
    rep = np.full(m, -1, dtype=np.int64)
    for q in range(n):
        j = newid[block[q]]
        if j >= 0 and rep[j] < 0:
            rep[j] = q
    out = np.empty((m, 256), dtype=np.int32)
    acc = np.zeros(m, dtype=np.bool_)
    for j in range(m):
        q = rep[j]
        acc[j] = accept[q]
        for b in range(256):
            t = trans[q, b]
            if t < 0 or block[t] == dblock:
                out[j, b] = -1
            else:
                out[j, b] = newid[block[t]]
    return OK, out, acc


@njit(cache=True, nogil=True)
def acyclic(trans: I32) -> bool:
    """Whether the DFA table ``trans`` (int32 ``[n, 256]``, -1 = no edge) has no cycle: a
    depth-first search that meets no state still on its path (for a trimmed DFA: whether
    its language is finite)."""
    n = trans.shape[0]
    color = np.zeros(n, dtype=np.int8)  # 0 unseen, 1 on the path, 2 done
    sq = np.empty(n, dtype=np.int64)
    sb = np.empty(n, dtype=np.int64)
    for root in range(n):
        if color[root]:
            continue
        sp = 0
        sq[0] = root
        sb[0] = 0
        color[root] = 1
        while sp >= 0:
            q = sq[sp]
            b = sb[sp]
            if b == 256:
                color[q] = 2
                sp -= 1
                continue
            sb[sp] = b + 1
            t = trans[q, b]
            if t < 0:
                continue
            if color[t] == 1:
                return False
            if color[t] == 0:
                color[t] = 1
                sp += 1
                sq[sp] = t
                sb[sp] = 0
    return True


def warm() -> None:
    """Run every kernel once on a tiny automaton (loads them from numba's cache, or compiles
    them the first time ever), so that no grammar compile pays for it."""
    eo = np.array([0, 0, 0], dtype=np.int32)
    eps = np.zeros(0, dtype=np.int32)
    do = np.array([0, 1, 1], dtype=np.int32)
    edges = np.array([[97, 98, 1]], dtype=np.int32)
    go = np.zeros(1, dtype=np.int8)
    _st, trans, acc = determinise(eo, eps, do, edges, 0, 1, 100, 10**6, go)
    _st, p, pacc = product(trans, acc, trans, acc, False, 100, 10**6, go)
    trans, acc = trim(trans, acc)
    minimise(trans, acc, 10**6, go)
    acyclic(trans)
