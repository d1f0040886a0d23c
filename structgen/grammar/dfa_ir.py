"""DFAs for the front-ends, as canonical :class:`~structgen.grammar.ir.Dfa` nodes (re-exported
by :mod:`structgen.grammar.fsa`, where the front-ends find them):

* :func:`explore_dfa`: the DFA of an automaton given implicitly (a start state and a step
  function), trimmed and minimised;
* :func:`minimise_dfa`: trimming and Hopcroft minimisation of a partial DFA given as edge
  maps (by the compiled kernels of :mod:`structgen.grammar._fsa_kernels` from a few dozen
  states on), states renumbered breadth-first so that equal languages give equal IR;
* :func:`regular_expr_dfa`: the small byte DFA of a regular IR expression, in plain Python
  (a front-end's analysis of one terminal).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from itertools import chain
from typing import TypeVar

import numpy as np

from structgen import limits
from structgen.errors import CompileLimitError
from structgen.grammar import ir
from structgen.grammar.fsa_native import dfa_kernels

__all__ = ["explore_dfa", "minimise_dfa", "regular_expr_dfa"]

S = TypeVar("S", bound=Hashable)

def explore_dfa(start: S, step: Callable[[S, int], S | None],
                accepting: Callable[[S], bool],
                alphabet: bytes | Sequence[bytes] | Callable[[S], Sequence[bytes]],
                what: str, *, max_states: int, hint: str) -> ir.Expr:
    """Build the DFA of an implicitly given automaton (trimmed and minimised).

    ``step(state, byte)`` returns the next (hashable) state or None (reject);
    ``accepting(state)``. ``alphabet`` is the bytes to try, or a sequence of byte
    classes (``bytes`` objects) whose members behave alike: ``step`` then sees each
    class's first byte only; or a function giving each state its own classes (bytes
    in no class are rejected there). Raises
    :class:`~structgen.errors.CompileLimitError` (naming ``what``, then ``hint``: what the
    user can do) beyond ``max_states`` states after minimisation, or twice that while
    exploring. Returns :data:`~structgen.grammar.ir.NEVER` if nothing is
    accepted.
    """
    if callable(alphabet):
        classes_of = alphabet
    else:
        classes = ([bytes([b]) for b in alphabet] if isinstance(alphabet, (bytes, bytearray))
                   else [bytes(c) for c in alphabet if c])
        classes_of = lambda _s: classes  # noqa: E731
    ids: dict[S, int] = {start: 0}
    states: list[S] = [start]
    edges: list[dict[int, int]] = []
    i = 0
    while i < len(states):
        s = states[i]
        out: dict[int, int] = {}
        for cls in classes_of(s):
            t = step(s, cls[0])
            if t is None:
                continue
            j = ids.get(t)
            if j is None:
                j = len(states)
                if j >= 2 * max_states:
                    raise CompileLimitError(
                        f"{what}: automaton exceeds {2 * max_states} states while being built; {hint}")
                ids[t] = j
                states.append(t)
            for b in cls:
                out[b] = j
        edges.append(out)
        i += 1
    acc = [accepting(s) for s in states]
    dfa = minimise_dfa(edges, acc, 0)
    if dfa is None:
        return ir.NEVER
    if len(dfa.trans) > max_states:
        raise CompileLimitError(
            f"{what}: automaton has {len(dfa.trans)} states (limit {max_states}); {hint}")
    return dfa


_NATIVE_MIN = 48  # explored automata from this many states are minimised by the compiled kernels


def _minimise_native(edges: Sequence[dict[int, int]], accept: Sequence[bool], start: int) -> ir.Dfa | None:
    """:func:`minimise_dfa` by the compiled trim and Hopcroft kernels; the result is
    renumbered in the same breadth-first order, so it is the same node."""
    dk = dfa_kernels()
    n = len(edges)
    if start != 0:  # the kernels start at state 0: swap the two
        perm = list(range(n))
        perm[0], perm[start] = start, 0
        edges = [{b: perm[t] for b, t in edges[q].items()} for q in perm]
        accept = [accept[q] for q in perm]
    sizes = np.fromiter(map(len, edges), dtype=np.int64, count=n)
    total = int(sizes.sum())
    table = np.full((n, 256), -1, dtype=np.int32)
    table[np.repeat(np.arange(n), sizes),
          np.fromiter(chain.from_iterable(edges), dtype=np.int64, count=total)] = np.fromiter(
        chain.from_iterable(d.values() for d in edges), dtype=np.int32, count=total)
    trans, acc = dk.trim(table, np.array(accept, dtype=np.bool_))
    if not acc.any():
        return None
    _status, trans, acc = dk.minimise(trans, acc, 1 << 62, limits.stop_cell())
    if _status != dk.OK:  # stopped: the request was cancelled
        limits.check()
    # each state's edges as runs of bytes to one target (row-major: in byte order), so the
    # breadth-first numbering below steps through runs, not bytes
    n_min = trans.shape[0]
    change = np.ones((n_min, 257), dtype=np.bool_)
    change[:, 1:256] = trans[:, 1:] != trans[:, :-1]
    rows, cols = np.nonzero(change)  # run starts, then each row's end (column 256)
    runs = cols[:-1] != 256
    rows, lo, hi = rows[:-1][runs], cols[:-1][runs], cols[1:][runs] - 1
    tgt = trans[rows, lo]
    live = tgt >= 0
    rows, lo, hi, tgt = rows[live], lo[live], hi[live], tgt[live]
    bounds = np.searchsorted(rows, np.arange(n_min + 1)).tolist()
    run_list = list(zip(lo.tolist(), hi.tolist(), tgt.tolist()))
    acc_l = acc.tolist()
    return _emit_bfs(0, lambda q: run_list[bounds[q]:bounds[q + 1]], acc_l.__getitem__)


def _emit_bfs(start: S, runs_of: Callable[[S], Iterable[tuple[int, int, S]]],
              accepting: Callable[[S], bool]) -> ir.Dfa:
    """The DFA reached from ``start``, states numbered breadth-first with each state's edges
    (runs ``(lo, hi, target)``, ascending) in order, adjacent runs to one target merged: the
    canonical numbering that makes equal minimal languages equal :class:`~structgen.grammar.ir.Dfa`
    nodes."""
    new_id = {start: 0}
    order = [start]
    out: list[list[tuple[int, int, int]]] = []
    accept_out: list[int] = []
    k = 0
    while k < len(order):
        q = order[k]
        row: list[tuple[int, int, int]] = []
        for lo, hi, t in runs_of(q):
            tid = new_id.get(t)
            if tid is None:
                tid = new_id[t] = len(order)
                order.append(t)
            if row and row[-1][1] == lo - 1 and row[-1][2] == tid:
                row[-1] = (row[-1][0], hi, tid)
            else:
                row.append((lo, hi, tid))
        out.append(row)
        if accepting(q):
            accept_out.append(k)
        k += 1
    return ir.Dfa.canonical(0, accept_out, out)


def minimise_dfa(edges: Sequence[dict[int, int]], accept: Sequence[bool], start: int) -> ir.Dfa | None:
    """Trim and minimise a partial DFA (``edges[q][byte] = target``); None if empty.

    Hopcroft's partition refinement; states are renumbered in breadth-first order from
    the start state, so equal languages give equal :class:`~structgen.grammar.ir.Dfa` nodes.
    """
    n = len(edges)
    if n >= _NATIVE_MIN and dfa_kernels().COMPILED:
        return _minimise_native(edges, accept, start)
    # co-reachability (live states)
    preds: list[list[int]] = [[] for _ in range(n)]
    for q, out in enumerate(edges):
        for t in out.values():
            preds[t].append(q)
    live = [False] * n
    stack = [q for q in range(n) if accept[q]]
    for q in stack:
        live[q] = True
    while stack:
        q = stack.pop()
        for p in preds[q]:
            if not live[p]:
                live[p] = True
                stack.append(p)
    if not live[start]:
        return None
    # reachable & live
    keep: dict[int, int] = {start: 0}
    order = [start]
    k = 0
    while k < len(order):
        q = order[k]
        k += 1
        for t in edges[q].values():
            if live[t] and t not in keep:
                keep[t] = len(order)
                order.append(t)
    m = len(order)
    sink = m
    alphabet = sorted({b for q in order for b, t in edges[q].items() if live[t]})
    nsym = len(alphabet)
    sym = {b: i for i, b in enumerate(alphabet)}
    delta = [[sink] * nsym for _ in range(m + 1)]
    for q in order:
        row = delta[keep[q]]
        for b, t in edges[q].items():
            if live[t]:
                row[sym[b]] = keep[t]
    # bytes with identical columns behave alike: refine over one representative each
    reps: dict[tuple[int, ...], int] = {}
    for a in range(nsym):
        reps.setdefault(tuple(row[a] for row in delta), a)
    rep_syms = list(reps.values())
    inv: list[list[list[int]]] = [[[] for _ in range(m + 1)] for _ in rep_syms]
    for q in range(m + 1):
        row = delta[q]
        for ai, a in enumerate(rep_syms):
            inv[ai][row[a]].append(q)
    acc_set = {keep[q] for q in order if accept[q]}
    blocks: list[set[int]] = []
    block_of = [0] * (m + 1)
    for part in (acc_set, set(range(m + 1)) - acc_set):
        if part:
            for q in part:
                block_of[q] = len(blocks)
            blocks.append(set(part))
    work = list(range(len(blocks)))
    in_work = set(work)
    while work:
        bi = work.pop()
        in_work.discard(bi)
        splitter = list(blocks[bi])
        for a in range(len(rep_syms)):
            x: set[int] = set()
            inv_a = inv[a]
            for q in splitter:
                x.update(inv_a[q])
            if not x:
                continue
            touched: dict[int, set[int]] = {}
            for q in x:
                touched.setdefault(block_of[q], set()).add(q)
            for yi, inter in touched.items():
                y = blocks[yi]
                if len(inter) == len(y):
                    continue
                y -= inter
                ni = len(blocks)
                blocks.append(inter)
                for q in inter:
                    block_of[q] = ni
                if yi in in_work:
                    work.append(ni)
                    in_work.add(ni)
                else:
                    smaller = ni if len(inter) <= len(y) else yi
                    work.append(smaller)
                    in_work.add(smaller)
    # emit in BFS order from start, dropping the sink's block (blocks stand for their states)
    sink_block = block_of[sink]
    rep = {block_of[0]: 0}  # a member of each block reached

    def block_edges(bq: int) -> Iterator[tuple[int, int, int]]:
        row = delta[rep[bq]]
        for a, b in enumerate(alphabet):
            tb = block_of[row[a]]
            if tb != sink_block:
                rep.setdefault(tb, row[a])
                yield b, b, tb

    return _emit_bfs(block_of[0], block_edges, lambda bq: rep[bq] in acc_set)


def regular_expr_dfa(e: ir.Expr, *, max_nfa: int, max_dfa: int
                     ) -> tuple[list[list[tuple[int, int, int]]], set[int]] | None:
    """Trimmed byte DFA (start state 0) of a regular IR expression made of ByteSet, Seq,
    Alt, Repeat and Dfa nodes, by Thompson construction and subset construction in plain
    Python: ``(edges per state as (lo, hi, target), accepting states)``. None when ``e``
    has other nodes (Ref, And, Diff) or needs more than ``max_nfa`` NFA or ``max_dfa`` DFA
    states. Meant for small expressions (a front-end's analysis of one terminal); states
    are numbered in discovery order and edges are not minimised."""
    eps: list[list[int]] = []
    edges: list[list[tuple[int, int, int]]] = []

    def new() -> int:
        if len(eps) >= max_nfa:
            raise OverflowError
        eps.append([])
        edges.append([])
        return len(eps) - 1

    def build(x: ir.Expr, s: int) -> int:
        if isinstance(x, ir.ByteSet):
            t = new()
            edges[s].extend((lo, hi, t) for lo, hi in x.ranges)
            return t
        if isinstance(x, ir.Seq):
            for it in x.items:
                s = build(it, s)
            return s
        if isinstance(x, ir.Alt):
            t = new()
            for it in x.items:
                a = new()
                eps[s].append(a)
                eps[build(it, a)].append(t)
            return t
        if isinstance(x, ir.Repeat):
            for _ in range(x.min):
                s = build(x.item, s)
            if x.max is None:
                a = new()
                eps[s].append(a)
                eps[build(x.item, a)].append(a)
                return a
            for _ in range(x.max - x.min):
                j = new()
                eps[s].append(j)
                eps[build(x.item, s)].append(j)
                s = j
            return s
        if isinstance(x, ir.Dfa):
            base = [new() for _ in x.trans]
            t = new()
            eps[s].append(base[x.start])
            for q, es in enumerate(x.trans):
                edges[base[q]].extend((lo, hi, base[r]) for lo, hi, r in es)
                if q in x.accept:
                    eps[base[q]].append(t)
            return t
        raise TypeError(type(x).__name__)

    try:
        start = new()
        final = build(e, start)
    except (OverflowError, TypeError):
        return None

    def close(states: set[int]) -> frozenset[int]:
        stack, seen = list(states), set(states)
        while stack:
            for t in eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    first = close({start})
    index = {first: 0}
    order = [first]
    trans: list[list[tuple[int, int, int]]] = []
    while len(trans) < len(order):
        cur = order[len(trans)]
        cuts = {0, 256}
        for q in cur:
            for lo, hi, _t in edges[q]:
                cuts.update((lo, hi + 1))
        bounds = sorted(cuts)
        out: list[tuple[int, int, int]] = []
        for lo, nxt in zip(bounds, bounds[1:]):
            hi = nxt - 1
            tgt = {t for q in cur for a, b, t in edges[q] if a <= lo and hi <= b}
            if not tgt:
                continue
            key = close(tgt)
            if key not in index:
                if len(order) >= max_dfa:
                    return None
                index[key] = len(order)
                order.append(key)
            out.append((lo, hi, index[key]))
        trans.append(out)
    accept = {i for i, st in enumerate(order) if final in st}
    live = set(accept)
    changed = True
    while changed:
        changed = False
        for q, out in enumerate(trans):
            if q not in live and any(t in live for _lo, _hi, t in out):
                live.add(q)
                changed = True
    return [[(lo, hi, t) for lo, hi, t in out if t in live] for out in trans], accept
