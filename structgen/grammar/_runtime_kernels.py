"""Compiled tables and rule states of the byte-level runtime (:mod:`structgen.grammar.runtime`).

Everything the runtime interns lives in flat arrays, bundled in one compiled object ``T``
(:class:`Tab`, built by :func:`make_tables`; its fields :data:`FIELD_NAMES` and its static
type :class:`Tables` are declared in :mod:`structgen.grammar._runtime_tables`; Python side
:class:`~structgen.grammar.runtime.RuntimeTables`) so that a kernel gets the whole runtime in
one argument:

* rules (fixed when the runtime is built): per rule its kind (``rule_kind``: a lazily
  determinised NFA, a transition table, the difference of two tables explored pairwise, or
  a counted repetition), where its data starts (``rule_base``, ``rule_aux``), and its start
  state once known (``rule_start``). NFAs are concatenated (global NFA state ids): epsilon,
  byte-class and call edges in CSR form (``nfa_eps_off``/``nfa_eps``, ``nfa_edge_off``/
  ``nfa_edges``, ``nfa_call_off``/``nfa_calls``), the rule's byte classes (``rule_class``),
  which states are *important* (``nfa_important``: byte or call edges, or the rule's end)
  and, memoised, the important states of each state's epsilon closure (``nfa_closure`` =
  (start, count) into ``nfa_closure_data``). Tables are concatenated in ``table_trans``.
* rule states ``g``: one id per state of a rule's DFA that the runtime has met, interned by
  a key (``state_rule``, ``state_key`` into ``state_key_data``: the sorted important NFA
  states; a table row; a pair of table rows). ``state_trans[g]`` holds the byte transitions
  as rule-state ids (-1 dead, -2 while ``g`` is not expanded), ``state_flags[g]`` (EXPANDED,
  ACCEPT, BYTES, TAIL), ``state_calls[g] = (start, count)`` into ``call_targets[k] =
  (callee start state, return state)``, ``state_pred[g]`` a state it was first reached from
  (the token-mask layer's horizon checks walk back along it). A state is expanded (its row,
  calls and flags computed, subset construction for NFAs) on first use.
* stacks (:mod:`structgen.grammar._stack_kernels`): interned frames ``frames[s] = (parent
  stack, rule state)``, 0 = the empty stack; per stack its closure under calls and returns,
  kept to stacks whose top has byte edges (``closures[s] = (start, count, accepting)`` into
  ``closure_data``, count -1 = unknown) and the configuration of that closure
  (``stack_config``, -2 = unknown).
* configurations: sorted stack sets plus an accepting flag (``configs[c] = (start, count,
  accepting)`` into ``config_data``), their byte transition table ``trans[c, 256]`` (-2
  unknown, -1 dead), ``accepting[c]`` and ``row_done[c]``.
* per rule state and per configuration, memos the token walks keep
  (:mod:`structgen.masks._walk_kernels`): the bytes known to loop (``state_loop_bytes``,
  ``loop_bytes``, ``loop_known``), the multibyte-UTF-8 loop answer (``state_utf8_memo``,
  ``utf8_memo``) and the text-slice answers (``state_slice_memo``, ``slice_memo``). They live
  here because they grow, and are flushed, with the rows they describe.
* ``counters``: the used sizes (slots ``N_*``) and the room a kernel lacked (``WANT_ROOM``).

Kernels never allocate table space they do not have: they return NEED_GROW (with the
space a data array lacks in ``counters[WANT_ROOM]``) and the runtime grows the tables and
calls again. Interning is idempotent, so a kernel that stops half way leaves only valid
entries behind and simply starts over.

Without numba (or with ``STRUCTGEN_NATIVE=0``) the same functions run as plain Python
(slow, identical results).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from structgen.grammar._jit import B1, COMPILED, I8, I32, I64, U8, U64, Int, njit
from structgen.grammar._jit import GOLD as _GOLD
from structgen.grammar._jit import int64 as _int64
from structgen.grammar._jit import mix as _mix
from structgen.grammar._runtime_tables import FIELD_NAMES as FIELD_NAMES
from structgen.grammar._runtime_tables import Tables as Tables
from structgen.grammar._runtime_tables import field_types

if TYPE_CHECKING:
    from numba.types import Type as NumbaType

DEAD = -1
UNKNOWN = -2
DONE = -3
NEED_GROW = -4

EXPANDED = 1
ACCEPT = 2
BYTES = 4
TAIL = 8

LAZY = 0
TABLE = 1
PRODUCT = 2
COUNTED = 3

# slots of ``counters``
N_STATES = 0  # rule states interned
N_CALLS = 1  # call slots used
N_FRAMES = 2  # stacks interned (0 = the empty stack)
N_CLOSURE_DATA = 3  # closure data used
N_CONFIGS = 4  # configurations interned
N_CONFIG_DATA = 5  # configuration data used
N_ROWS = 6  # configuration rows filled
N_NFA_CLOSURE_DATA = 7  # epsilon-closure data used
N_STATE_KEY_DATA = 8  # rule-state key data used
WANT_ROOM = 9  # room a data array lacked (NEED_GROW)
N_EXPANDED = 10  # rule states expanded


if TYPE_CHECKING:
    def make_tables(*arrays: NDArray[np.generic]) -> Tables:
        """The tables holding ``arrays`` (in the order of :data:`FIELD_NAMES`)."""
elif COMPILED:
    from numba import types as _nt
    from numba.experimental import structref as _structref

    @_structref.register
    class _TabType(_nt.StructRef):
        def preprocess_fields(self, fields: tuple[tuple[str, NumbaType], ...]
                              ) -> tuple[tuple[str, NumbaType], ...]:
            return tuple((name, _nt.unliteral(typ)) for name, typ in fields)

    class Tab(_structref.StructRefProxy):
        """The runtime tables as one compiled object: kernels get a pointer, not dozens of
        array arguments (a tuple of arrays is copied into every call)."""

    _structref.define_boxing(_TabType, Tab)
    _TAB = _TabType(field_types())
    assert [f for f, _t in field_types()] == FIELD_NAMES

    @njit(cache=True)
    def make_tables(counters: I64, rule_kind: I8, rule_base: I64, rule_aux: I64, rule_class: I32,
                    rule_nclasses: I32, rule_end: I32, rule_start: I32, rule_lo: I64, rule_hi: I64,
                    nfa_eps_off: I32, nfa_eps: I32, nfa_edge_off: I32, nfa_edges: I32, nfa_call_off: I32,
                    nfa_calls: I32, nfa_important: U8, nfa_closure: I32, nfa_closure_data: I32,
                    table_trans: I32, table_accept: U8, state_trans: I32, state_flags: U8,
                    state_calls: I32, call_targets: I32, state_rule: I32, state_key: I32,
                    state_key_data: I32, state_hash_keys: I64, state_hash_ids: I32, state_pred: I32,
                    state_accepting: B1, state_loop_bytes: U64, state_loops_known: U8,
                    state_slice_memo: I8, state_utf8_memo: I8, frames: I32, frame_hash_keys: I64,
                    frame_hash_ids: I32, closures: I32, closure_data: I32, stack_config: I32, configs: I32,
                    config_data: I32, config_hash_keys: I64, config_hash_ids: I32, trans: I32,
                    accepting: B1, loop_bytes: U64, loop_known: U64, row_done: U8, slice_memo: I8,
                    utf8_memo: I8) -> Tables:
        """The compiled tables holding ``arrays`` (in the order of :data:`FIELD_NAMES`)."""
        t: Tables = _structref.new(_TAB)
        t.counters = counters
        t.rule_kind = rule_kind
        t.rule_base = rule_base
        t.rule_aux = rule_aux
        t.rule_class = rule_class
        t.rule_nclasses = rule_nclasses
        t.rule_end = rule_end
        t.rule_start = rule_start
        t.rule_lo = rule_lo
        t.rule_hi = rule_hi
        t.nfa_eps_off = nfa_eps_off
        t.nfa_eps = nfa_eps
        t.nfa_edge_off = nfa_edge_off
        t.nfa_edges = nfa_edges
        t.nfa_call_off = nfa_call_off
        t.nfa_calls = nfa_calls
        t.nfa_important = nfa_important
        t.nfa_closure = nfa_closure
        t.nfa_closure_data = nfa_closure_data
        t.table_trans = table_trans
        t.table_accept = table_accept
        t.state_trans = state_trans
        t.state_flags = state_flags
        t.state_calls = state_calls
        t.call_targets = call_targets
        t.state_rule = state_rule
        t.state_key = state_key
        t.state_key_data = state_key_data
        t.state_hash_keys = state_hash_keys
        t.state_hash_ids = state_hash_ids
        t.state_pred = state_pred
        t.state_accepting = state_accepting
        t.state_loop_bytes = state_loop_bytes
        t.state_loops_known = state_loops_known
        t.state_slice_memo = state_slice_memo
        t.state_utf8_memo = state_utf8_memo
        t.frames = frames
        t.frame_hash_keys = frame_hash_keys
        t.frame_hash_ids = frame_hash_ids
        t.closures = closures
        t.closure_data = closure_data
        t.stack_config = stack_config
        t.configs = configs
        t.config_data = config_data
        t.config_hash_keys = config_hash_keys
        t.config_hash_ids = config_hash_ids
        t.trans = trans
        t.accepting = accepting
        t.loop_bytes = loop_bytes
        t.loop_known = loop_known
        t.row_done = row_done
        t.slice_memo = slice_memo
        t.utf8_memo = utf8_memo
        return t

else:  # pragma: no cover - plain Python: a namespace object with the same attributes
    class Tab:
        """The runtime tables as a namespace object (plain Python runs)."""

        def __init__(self, **kw: object) -> None:
            self.__dict__.update(kw)

    def make_tables(*arrays: NDArray[np.generic]) -> Tables:
        """The tables holding ``arrays`` (in the order of :data:`FIELD_NAMES`)."""
        return Tab(**dict(zip(FIELD_NAMES, arrays)))


@njit(cache=True, nogil=True)
def key_equals(data: I32, st: Int, buf: I32, n: Int) -> bool:
    """Whether ``data[st : st + n]`` equals ``buf[:n]`` (an interned key against a probe)."""
    for i in range(n):
        if data[st + i] != buf[i]:
            return False
    return True


@njit(cache=True, nogil=True)
def seq_hash(head: Int, buf: I32, n: Int) -> np.int64:
    """The hash of an interning key: ``head`` (a rule, or an accepting flag) and ``buf[:n]``."""
    h = _mix(np.int64(head) * _GOLD + np.int64(n))
    for i in range(n):
        h = _mix(h ^ (np.int64(buf[i]) * _GOLD))
    return h


# -- rule states ---------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _state(meta: I64, g_row: I32, g_flag: U8, g_rule: I32, g_key: I32, gs_d: I32, hk: I64, hv: I32,
           g_pred: I32, r: Int, buf: I32, n: Int) -> np.int64:
    """The rule-state id of rule ``r``'s state with key ``buf[:n]``, interned (not
    expanded); or NEED_GROW. (Hot helpers take the arrays they use, not the table tuple:
    passing the whole tuple to a call costs more than most of them do.)"""
    key = seq_hash(r, buf, n)
    mask = hk.shape[0] - 1
    h = key & mask
    while True:
        k = hk[h]
        if k == -1:
            break
        if k == key:
            g = hv[h]
            if g_rule[g] == r and g_key[g, 1] == n:
                if key_equals(gs_d, g_key[g, 0], buf, n):
                    return _int64(g)
        h = (h + 1) & mask
    g = meta[N_STATES]
    used = meta[N_STATE_KEY_DATA]
    if g >= g_flag.shape[0]:
        return _int64(NEED_GROW)
    if used + n > gs_d.shape[0]:
        meta[WANT_ROOM] = n
        return _int64(NEED_GROW)
    for i in range(n):
        gs_d[used + i] = buf[i]
    meta[N_STATE_KEY_DATA] = used + n
    g_rule[g] = r
    g_key[g, 0] = used
    g_key[g, 1] = n
    g_flag[g] = 0
    g_pred[g] = -1
    for b in range(256):
        g_row[g, b] = UNKNOWN
    hk[h] = key
    hv[h] = g
    meta[N_STATES] = g + 1
    return _int64(g)


@njit(cache=True, nogil=True)
def state(T: Tables, r: Int, buf: I32, n: Int) -> np.int64:
    """:func:`_state` on the table tuple."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.counters, T.state_trans, T.state_flags, T.state_rule, T.state_key, T.state_key_data,
        T.state_hash_keys, T.state_hash_ids,
        T.state_pred)
    return _state(meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred, r, buf, n)


@njit(cache=True, nogil=True)
def _eclose(meta: I64, eps_o: I32, eps: I32, imp: U8, ec: I32, ec_d: I32, x: Int) -> int:
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
    used = meta[N_NFA_CLOSURE_DATA]
    if used + m > ec_d.shape[0]:
        meta[WANT_ROOM] = m
        return NEED_GROW
    arr = np.empty(m, dtype=np.int32)
    for i in range(m):
        arr[i] = out[i]
    arr.sort()
    for i in range(m):
        ec_d[used + i] = arr[i]
    meta[N_NFA_CLOSURE_DATA] = used + m
    ec[x, 0] = used
    ec[x, 1] = m
    return 0


@njit(cache=True, nogil=True)
def _closure_key(meta: I64, eps_o: I32, eps: I32, imp: U8, ec: I32, ec_d: I32, targets: I32, nt: Int,
                 out: I32) -> int:
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
def _closure_room(meta: I64, eps_o: I32, eps: I32, imp: U8, ec: I32, ec_d: I32, targets: I32, nt: Int) -> int:
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
def start_state(T: Tables, r: Int) -> np.int64:
    """The start state of rule ``r`` (interned); or NEED_GROW."""
    rstart = T.rule_start
    got = rstart[r]
    if got >= 0:
        return _int64(got)
    kind = T.rule_kind[r]
    if kind == LAZY:
        x = np.empty(1, dtype=np.int32)
        x[0] = T.rule_base[r]
        meta = T.counters
        eps_o, eps, imp = T.nfa_eps_off, T.nfa_eps, T.nfa_important
        ec, ec_d = T.nfa_closure, T.nfa_closure_data
        room = _closure_room(meta, eps_o, eps, imp, ec, ec_d, x, 1)
        if room < 0:
            return _int64(room)
        key = np.empty(max(room, 1), dtype=np.int32)
        n = _closure_key(meta, eps_o, eps, imp, ec, ec_d, x, 1, key)
        if n < 0:
            return _int64(n)
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
    return _int64(g)


@njit(cache=True, nogil=True)
def _expand_lazy(T: Tables, g: Int, r: Int, row: I32) -> Int:
    """Subset construction for one DFA state of a lazily determinised NFA rule: ``row`` gets
    the byte targets; calls are appended. Returns the flags or NEED_GROW."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.counters, T.state_trans, T.state_flags, T.state_rule, T.state_key, T.state_key_data,
        T.state_hash_keys, T.state_hash_ids,
        T.state_pred)
    eps_o, eps, imp, ec, ec_d = T.nfa_eps_off, T.nfa_eps, T.nfa_important, T.nfa_closure, T.nfa_closure_data
    cls, ncls = T.rule_class, T.rule_nclasses
    edg_o, edg, cal_o, cal, rend = T.nfa_edge_off, T.nfa_edges, T.nfa_call_off, T.nfa_calls, T.rule_end
    g_call, calls = T.state_calls, T.call_targets
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
                if key_equals(tg, a2, seg, b - a):
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
        used = meta[N_CALLS]
        if used + nout > calls.shape[0]:
            meta[WANT_ROOM] = nout
            return NEED_GROW
        for i in range(nout):
            calls[used + i, 0] = out[i, 0]
            calls[used + i, 1] = out[i, 1]
        meta[N_CALLS] = used + nout
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
def _expand_table(T: Tables, g: Int, r: Int, row: I32) -> Int:
    """One state of a table rule (a call-free DFA given as a table)."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.counters, T.state_trans, T.state_flags, T.state_rule, T.state_key, T.state_key_data,
        T.state_hash_keys, T.state_hash_ids,
        T.state_pred)
    tb, tbacc, base = T.table_trans, T.table_accept, T.rule_base
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
    T.state_calls[g, 0] = 0
    T.state_calls[g, 1] = 0
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
def _expand_product(T: Tables, g: Int, r: Int, row: I32) -> Int:
    """One state ``(qa, qb)`` of ``A - B`` over two tables (``qb`` -1: B already failed)."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.counters, T.state_trans, T.state_flags, T.state_rule, T.state_key, T.state_key_data,
        T.state_hash_keys, T.state_hash_ids,
        T.state_pred)
    tb, tbacc, base, aux = T.table_trans, T.table_accept, T.rule_base, T.rule_aux
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
    T.state_calls[g, 0] = 0
    T.state_calls[g, 1] = 0
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
def _expand_counted(T: Tables, g: Int, r: Int, row: I32) -> Int:
    """One state ``(c, q)`` of ``item{lo,hi}`` for an item given as a prefix-free table (no
    accepting state has an edge, so an item ends exactly where its table accepts): ``c``
    items read, ``q`` the item table's state (0 = between items)."""
    meta, g_row, g_flag, g_rule, g_key, gs_d, gshk, gshv, g_pred = (
        T.counters, T.state_trans, T.state_flags, T.state_rule, T.state_key, T.state_key_data,
        T.state_hash_keys, T.state_hash_ids,
        T.state_pred)
    tb, tbacc, base = T.table_trans, T.table_accept, T.rule_base
    st = g_key[g, 0]
    c = gs_d[st]
    q = gs_d[st + 1]
    lo = T.rule_lo[r]
    hi = T.rule_hi[r]
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
    T.state_calls[g, 0] = 0
    T.state_calls[g, 1] = 0
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
def expand(T: Tables, g: Int) -> Int:
    """Compute rule state ``g``'s row, calls and flags if not known; 0 or NEED_GROW."""
    g_flag = T.state_flags
    if g_flag[g] & EXPANDED:
        return 0
    r = T.state_rule[g]
    kind = T.rule_kind[r]
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
    g_row = T.state_trans
    for b in range(256):
        g_row[g, b] = row[b]
    T.state_accepting[g] = (f & ACCEPT) != 0
    T.state_loops_known[g] = 0
    T.counters[N_EXPANDED] += 1
    g_flag[g] = f  # last: marks the state expanded
    return 0


# -- table maintenance -----------------------------------------------------------------------

@njit(cache=True, nogil=True)
def rehash_frames(fr: I32, n: Int, hk: I64, hv: I32) -> None:
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
def rehash_seqs(heads: I32, keys: I32, data: I32, n: Int, hk: I64, hv: I32) -> None:
    """Rebuild a sequence hash (all slots -1) from entries ``0..n-1``: head ``heads[i]`` and
    key ``data[keys[i, 0] : keys[i, 0] + keys[i, 1]]``."""
    mask = hk.shape[0] - 1
    for i in range(n):
        st = keys[i, 0]
        key = seq_hash(heads[i], data[st:st + keys[i, 1]], keys[i, 1])
        h = key & mask
        while hk[h] != -1:
            h = (h + 1) & mask
        hk[h] = key
        hv[h] = i
