"""Compiled passes over a grammar's rule NFAs, all rules at once in the flat layout of
:func:`structgen.grammar.fsa.nfa_arrays` (see :mod:`structgen.grammar.rule_nfas`): which states
can reach their rule's end (trimming, with the rules whose language is non-empty found
together), and which rules a rule can call before reading a byte (left recursion);
:func:`frozen_rules` runs both with the grouping, trimming and byte classes around them, so
that a compile makes one kernel call for all of it.

The rules' states are numbered one after the other: rule ``r`` owns the states ``first[r]`` to
``first[r + 1] - 1``, its start is ``first[r]`` and its end ``first[r] + end[r]``. Targets in
``eps``, ``edges[:, 2]`` and ``calls[:, 1]`` are local to the rule (0 = the rule's start);
``calls[:, 0]`` is a rule index, those at or past ``len(end)`` being call-free rules that follow
the NFA rules. Without numba (or with ``STRUCTGEN_NATIVE=0``) they run as plain Python.
"""

from __future__ import annotations

import numpy as np

from structgen.grammar._jit import B1, I32, I64, U8, Int, njit


@njit(cache=True, nogil=True)
def _owners(first: I64) -> I64:
    """The rule of each state."""
    n_rules = first.shape[0] - 1
    owner = np.empty(first[n_rules], dtype=np.int64)
    for r in range(n_rules):
        owner[first[r]:first[r + 1]] = r
    return owner


@njit(cache=True, nogil=True)
def live_states(first: I64, end: I64, eo: I32, eps: I32, do: I32, edges: I32, co: I32, calls: I32,
                n_shared: int) -> tuple[B1, B1]:
    """``(good, nonempty)``: per state, whether it reaches its rule's end through byte edges,
    epsilons and calls of non-empty rules; per rule (the call-free ones after the NFA rules
    count as non-empty), whether its start does. A least fixpoint: a rule is walked again
    whenever one it calls turned out non-empty."""
    n_rules = end.shape[0]
    n = first[n_rules]
    owner = _owners(first)
    # predecessors of each state: by epsilon or byte edge (pred), by a call (cpred, crule)
    count = np.zeros(n + 1, dtype=np.int64)
    ccount = np.zeros(n + 1, dtype=np.int64)
    for x in range(n):
        base = first[owner[x]]
        for k in range(eo[x], eo[x + 1]):
            count[base + eps[k] + 1] += 1
        for k in range(do[x], do[x + 1]):
            count[base + edges[k, 2] + 1] += 1
        for k in range(co[x], co[x + 1]):
            ccount[base + calls[k, 1] + 1] += 1
    po = np.cumsum(count)
    cpo = np.cumsum(ccount)
    pred = np.empty(po[n], dtype=np.int64)
    cpred = np.empty(cpo[n], dtype=np.int64)
    crule = np.empty(cpo[n], dtype=np.int64)
    fill = po[:n].copy()
    cfill = cpo[:n].copy()
    # the rules calling each rule, for the fixpoint
    callers_n = np.zeros(n_rules + n_shared + 1, dtype=np.int64)
    for x in range(n):
        base = first[owner[x]]
        for k in range(eo[x], eo[x + 1]):
            t = base + eps[k]
            pred[fill[t]] = x
            fill[t] += 1
        for k in range(do[x], do[x + 1]):
            t = base + edges[k, 2]
            pred[fill[t]] = x
            fill[t] += 1
        for k in range(co[x], co[x + 1]):
            t = base + calls[k, 1]
            cpred[cfill[t]] = x
            crule[cfill[t]] = calls[k, 0]
            cfill[t] += 1
            callers_n[calls[k, 0] + 1] += 1
    callers_o = np.cumsum(callers_n)
    callers = np.empty(callers_o[-1], dtype=np.int64)
    callers_fill = callers_o[:-1].copy()
    for x in range(n):
        for k in range(co[x], co[x + 1]):
            q = calls[k, 0]
            callers[callers_fill[q]] = owner[x]
            callers_fill[q] += 1

    good = np.zeros(n, dtype=np.bool_)
    nonempty = np.zeros(n_rules + n_shared, dtype=np.bool_)
    nonempty[n_rules:] = True
    fresh = np.ones(n_rules, dtype=np.bool_)
    stack = np.empty(n, dtype=np.int64)
    changed = True
    while changed:
        changed = False
        for r in range(n_rules):
            if not fresh[r]:
                continue
            fresh[r] = False
            good[first[r]:first[r + 1]] = False
            e = first[r] + end[r]
            good[e] = True
            stack[0] = e
            sp = 1
            while sp > 0:
                sp -= 1
                y = stack[sp]
                for k in range(po[y], po[y + 1]):
                    x = pred[k]
                    if not good[x]:
                        good[x] = True
                        stack[sp] = x
                        sp += 1
                for k in range(cpo[y], cpo[y + 1]):
                    x = cpred[k]
                    if nonempty[crule[k]] and not good[x]:
                        good[x] = True
                        stack[sp] = x
                        sp += 1
            if good[first[r]] and not nonempty[r]:
                nonempty[r] = True
                changed = True
                for k in range(callers_o[r], callers_o[r + 1]):
                    fresh[callers[k]] = True
    return good, nonempty


@njit(cache=True, nogil=True)
def left_calls(first: I64, end: I64, eo: I32, eps: I32, co: I32, calls: I32, shared_nullable: B1) -> I64:
    """The pairs ``(rule, callee)``, one row each, where NFA rule ``rule`` can call ``callee``
    before reading a byte: from the rule's start through epsilons and past calls of rules that
    derive the empty string (found first, as a least fixpoint)."""
    n_rules = end.shape[0]
    n = first[n_rules]
    nullable = np.zeros(n_rules + shared_nullable.shape[0], dtype=np.bool_)
    nullable[n_rules:] = shared_nullable
    seen = np.zeros(n, dtype=np.bool_)
    stack = np.empty(n, dtype=np.int64)
    called = np.zeros(n_rules + shared_nullable.shape[0], dtype=np.int64)  # marks: rule index + 1
    out = np.empty((16, 2), dtype=np.int64)
    m = 0
    changed = True
    while True:
        collect = not changed  # once nothing changes, one last walk collects the callees
        changed = False
        for r in range(n_rules):
            if nullable[r] and not collect:
                continue
            base = first[r]
            seen[base:first[r + 1]] = False
            seen[base] = True
            stack[0] = base
            sp = 1
            while sp > 0:
                sp -= 1
                x = stack[sp]
                for k in range(eo[x], eo[x + 1]):
                    y = base + eps[k]
                    if not seen[y]:
                        seen[y] = True
                        stack[sp] = y
                        sp += 1
                for k in range(co[x], co[x + 1]):
                    q = calls[k, 0]
                    if collect and called[q] != r + 1:
                        called[q] = r + 1
                        if m == out.shape[0]:
                            grown = np.empty((2 * m, 2), dtype=np.int64)
                            grown[:m] = out
                            out = grown
                        out[m, 0] = r
                        out[m, 1] = q
                        m += 1
                    if nullable[q]:
                        y = base + calls[k, 1]
                        if not seen[y]:
                            seen[y] = True
                            stack[sp] = y
                            sp += 1
            if not collect and seen[base + end[r]]:
                nullable[r] = True
                changed = True
        if collect:
            pairs: I64 = out[:m].copy()
            return pairs


@njit(cache=True, nogil=True)
def _by_source(n: Int, rows: I32) -> tuple[I32, I32]:
    """Edge ``rows`` (the source in column 0) grouped by source, each state's in row order:
    ``(off [n + 1], the other columns)``."""
    off = np.zeros(n + 1, dtype=np.int32)
    for i in range(rows.shape[0]):
        off[rows[i, 0] + 1] += 1
    for x in range(n):
        off[x + 1] += off[x]
    fill = off[:n].copy()
    width = rows.shape[1] - 1
    out = np.empty((rows.shape[0], width), dtype=np.int32)
    for i in range(rows.shape[0]):
        x = rows[i, 0]
        j = fill[x]
        fill[x] += 1
        for c in range(width):
            out[j, c] = rows[i, c + 1]
    return off, out


@njit(cache=True, nogil=True)
def _trimmed(off: I32, data: I32, target: int, rule: int, good: B1, first_of: I64,
             nonempty: B1) -> tuple[I32, I32]:
    """The rows of ``data`` (grouped by ``off``) whose source and target (column ``target``,
    local to the source's rule, whose first state is ``first_of[source]``) are both good, and
    whose called rule (column ``rule``, when not -1) is non-empty."""
    n = off.shape[0] - 1
    keep = np.zeros(data.shape[0], dtype=np.bool_)
    new_off = np.zeros(n + 1, dtype=np.int32)
    m = 0
    for x in range(n):
        if good[x]:
            for k in range(off[x], off[x + 1]):
                if good[first_of[x] + data[k, target]] and (rule < 0 or nonempty[data[k, rule]]):
                    keep[k] = True
                    m += 1
        new_off[x + 1] = m
    out = np.empty((m, data.shape[1]), dtype=np.int32)
    j = 0
    for k in range(data.shape[0]):
        if keep[k]:
            out[j] = data[k]
            j += 1
    return new_off, out


@njit(cache=True, nogil=True)
def frozen_rules(first: I64, end: I64, eps_rows: I32, edge_rows: I32, call_rows: I32,
                 shared_nullable: B1) -> tuple[bool, I32, I32, I32, I32, I32, I32, U8, I32, I64, B1, I64]:
    """Every pass of :func:`structgen.grammar.rule_nfas.freeze_rules` in one call, over the
    rules' edge rows (``source, target`` / ``source, lo, hi, target`` / ``source, rule,
    target``: sources numbered across rules, targets local). Returns ``(start rule
    non-empty, eps_off, eps, edge_off, edges [m, 3] (class_lo, class_hi, target), call_off,
    calls [k, 2], important, class_of [rules, 256], classes per rule, per rule whether a class
    of value-check markers only starts among 0xF8-0xFF, left calls [p, 2])``, trimmed: an
    edge from or into a state that cannot reach its rule's end is dropped, and so is a call
    of an empty rule (states keep their numbers)."""
    n_rules = end.shape[0]
    n = int(first[n_rules])
    eo, eps2 = _by_source(n, eps_rows)
    do, edges = _by_source(n, edge_rows)
    co, calls = _by_source(n, call_rows)
    eps = eps2[:, 0].copy()
    good, nonempty = live_states(first, end, eo, eps, do, edges, co, calls, shared_nullable.shape[0])
    first_of = first[_owners(first)]  # per state: its rule's first state
    eo, eps2 = _trimmed(eo, eps2, 0, -1, good, first_of, nonempty)
    do, edges = _trimmed(do, edges, 2, -1, good, first_of, nonempty)
    co, calls = _trimmed(co, calls, 1, 0, good, first_of, nonempty)
    eps = eps2[:, 0].copy()
    pairs = left_calls(first, end, eo, eps, co, calls, shared_nullable)
    # byte classes per rule: bytes between two consecutive edge boundaries go everywhere alike
    bound = np.zeros((n_rules, 257), dtype=np.bool_)
    for r in range(n_rules):
        bound[r, 0] = True
        bound[r, 256] = True
        for k in range(do[first[r]], do[first[r + 1]]):
            bound[r, edges[k, 0]] = True
            bound[r, edges[k, 1] + 1] = True
    class_of = np.empty((n_rules, 256), dtype=np.int32)
    n_classes = np.empty(n_rules, dtype=np.int64)
    marker = np.zeros(n_rules, dtype=np.bool_)
    for r in range(n_rules):
        c = -1
        for b in range(256):
            if bound[r, b]:
                c += 1
            class_of[r, b] = c
        n_classes[r] = c + 1
        for b in range(0xF8, 0x100):  # a class of value-check markers only starts among them
            if bound[r, b]:
                marker[r] = True
        for k in range(do[first[r]], do[first[r + 1]]):
            edges[k, 0] = class_of[r, edges[k, 0]]
            edges[k, 1] = class_of[r, edges[k, 1]]
    # the important states: byte or call edges, and each rule's end
    important = np.zeros(n, dtype=np.uint8)
    for x in range(n):
        if do[x + 1] > do[x] or co[x + 1] > co[x]:
            important[x] = 1
    for r in range(n_rules):
        important[first[r] + end[r]] = 1
    ok = bool(nonempty[0]) if n_rules > 0 else False
    return ok, eo, eps, do, edges, co, calls, important, class_of, n_classes, marker, pairs


def warm() -> None:
    """Run each kernel once on a tiny grammar (loads them from numba's cache, or compiles
    them the first time ever)."""
    first = np.array([0, 2], dtype=np.int64)
    end = np.array([1], dtype=np.int64)
    eo = np.array([0, 0, 0], dtype=np.int32)
    eps = np.zeros(0, dtype=np.int32)
    do = np.array([0, 1, 1], dtype=np.int32)
    edges = np.array([[97, 97, 1]], dtype=np.int32)
    co = np.array([0, 0, 0], dtype=np.int32)
    calls = np.zeros((0, 2), dtype=np.int32)
    live_states(first, end, eo, eps, do, edges, co, calls, 0)
    left_calls(first, end, eo, eps, co, calls, np.zeros(0, dtype=np.bool_))
    frozen_rules(first, end, np.zeros((0, 2), dtype=np.int32), np.array([[0, 97, 97, 1]], dtype=np.int32),
                 np.zeros((0, 3), dtype=np.int32), np.zeros(0, dtype=np.bool_))
