"""The finite-automaton toolkit of the grammar compiler and the front-ends: byte-level NFAs
and DFAs, and every algorithm on them, written once.

* :class:`Nfa` (Thompson NFA over bytes, epsilons and call symbols) and :class:`Dfa` (a
  transition table ``trans`` int32 ``[n, 256]``, -1 = no edge, state 0 = start; ``accept``
  bool ``[n]``; call edges per state);
* subset construction (:func:`determinise`), the product of two DFAs (:func:`product`),
  trimming (:func:`trim`), minimisation (:func:`minimise`), language tests
  (:func:`finite_language`, :func:`all_states_infinite`) and copying a DFA into an NFA
  (:func:`embed`). The heavy ones run as compiled kernels (:mod:`structgen.grammar._fsa_kernels`)
  when numba is present, else as numpy / plain Python with the same results;
* for the front-ends, DFAs given implicitly or as IR: :func:`explore_dfa`,
  :func:`minimise_dfa` (canonical :class:`~structgen.grammar.ir.Dfa` nodes, so equal
  languages give equal IR) and :func:`regular_expr_dfa`, defined in
  :mod:`structgen.grammar.dfa_ir` and re-exported here.

The compiler's algorithms report through a :class:`BuildBudget` (its deadline and state
limits), so this module raises no limit errors of its own beyond what the budget raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NoReturn, Protocol

import numpy as np
from numpy.typing import NDArray

from structgen import limits
from structgen.grammar.dfa_ir import explore_dfa, minimise_dfa, regular_expr_dfa
from structgen.grammar.fsa_native import FsaKernels, dfa_kernels, native_ready
from structgen.grammar.graphs import strongly_connected_components

__all__ = ["BuildBudget", "Dfa", "Nfa", "all_states_infinite", "byte_classes", "cyclic_states",
           "determinise", "embed", "explore_dfa", "finite_language", "minimise", "minimise_dfa",
           "joined_nfa_arrays", "native_ready", "nfa_arrays", "product", "regular_expr_dfa", "trim"]

MINIMISE_MIN = 256       # regular sub-automata above this size are minimised
MINIMISE_SKIP_MIN = 8192  # ... unless above this size with almost no two states alike (see _nearly_distinct)


class BuildBudget(Protocol):
    """What :func:`product` and :func:`determinise` need from their caller (the grammar
    compiler): its deadline, its state limits and the errors that name where it was."""

    def dfa_kernels(self) -> FsaKernels:
        """:mod:`structgen.grammar._fsa_kernels`, loaded (loading time is not charged)."""

    def check_time(self) -> None:
        """Raise a timeout error past the deadline (checked on a stride of calls)."""

    def check_time_now(self) -> None:
        """:meth:`check_time` on every call."""

    def work_budget(self) -> int:
        """Inner steps a compiled kernel may take before the deadline."""

    def kernel_status(self, status: int, what: str) -> None:
        """Raise for a kernel's LIMIT / OUT_OF_TIME status (``what`` names the automaton)."""

    def too_many_states(self, what: str) -> NoReturn:
        """Raise the state-limit error for automaton ``what``."""

    def rule_too_big(self, name: str) -> NoReturn:
        """Raise the state-limit error for rule ``name``."""

    def count_states(self, n: int, what: str) -> None:
        """Add ``n`` states to the grammar's total; raise past its limit."""


class Nfa:
    """A Thompson NFA under construction: ``n`` states and its edges in the order they were
    added, as flat lists of ints (``eps_flat``: ``source, target`` pairs; ``edge_flat``:
    ``source, lo, hi, target`` byte ranges; ``call_flat``: ``source, rule, target`` call
    edges). Flat lists cost one append per number, not a list per state, and become arrays
    in one conversion (:meth:`arrays`); the per-state views (:attr:`eps`, :attr:`edges`,
    :attr:`calls`) are built on request for the plain-Python algorithms."""

    __slots__ = ("n", "eps_flat", "edge_flat", "call_flat")

    def __init__(self) -> None:
        self.n = 0
        self.eps_flat: list[int] = []
        self.edge_flat: list[int] = []
        self.call_flat: list[int] = []

    def new(self) -> int:
        """Add a state without edges; returns its number."""
        n = self.n
        self.n = n + 1
        return n

    def __len__(self) -> int:
        return self.n

    def add_eps(self, s: int, t: int) -> None:
        """An epsilon edge ``s -> t``."""
        self.eps_flat += (s, t)

    def add_edge(self, s: int, lo: int, hi: int, t: int) -> None:
        """A byte edge ``s -> t`` on bytes ``lo..hi``."""
        self.edge_flat += (s, lo, hi, t)

    def add_call(self, s: int, rule: int, t: int) -> None:
        """A call edge ``s -> t`` through rule ``rule``."""
        self.call_flat += (s, rule, t)

    def has_calls(self) -> bool:
        """Does any state have a call edge?"""
        return bool(self.call_flat)

    def flat_arrays(self) -> tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]]:
        """The edge lists as int32 arrays ``[k, 2]``, ``[m, 4]`` and ``[c, 3]`` (rows in the
        order added, the source first)."""
        return (np.array(self.eps_flat, dtype=np.int32).reshape(-1, 2),
                np.array(self.edge_flat, dtype=np.int32).reshape(-1, 4),
                np.array(self.call_flat, dtype=np.int32).reshape(-1, 3))

    def arrays(self) -> tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32],
                              NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]]:
        """The NFA as :func:`nfa_arrays` lays it out."""
        return _csr_arrays(self.n, *self.flat_arrays())

    def _rows(self, flat: list[int], width: int) -> list[list[Any]]:
        out: list[list[Any]] = [[] for _ in range(self.n)]
        for i in range(0, len(flat), width):
            out[flat[i]].append(flat[i + 1] if width == 2 else tuple(flat[i + 1:i + width]))
        return out

    @property
    def eps(self) -> list[list[int]]:
        """Per state, its epsilon targets (a copy)."""
        return self._rows(self.eps_flat, 2)

    @property
    def edges(self) -> list[list[tuple[int, int, int]]]:
        """Per state, its byte edges ``(lo, hi, target)`` (a copy)."""
        return self._rows(self.edge_flat, 4)

    @property
    def calls(self) -> list[list[tuple[int, int]]]:
        """Per state, its call edges ``(rule, target)`` (a copy)."""
        return self._rows(self.call_flat, 3)


def _csr_arrays(n: int, eps: NDArray[np.int32], edges: NDArray[np.int32], calls: NDArray[np.int32]
                ) -> tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32],
                           NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]]:
    """Edge rows of ``n`` states (the source in column 0, as :meth:`Nfa.flat_arrays` gives
    them) as :func:`nfa_arrays` lays them out: grouped by source, each state's edges in the
    order of the rows."""

    def rows(a: NDArray[np.int32]) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
        src = a[:, 0]
        off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.bincount(src, minlength=n), out=off[1:])
        if a.shape[0] > 1 and bool((src[1:] < src[:-1]).any()):
            a = a[np.argsort(src, kind="stable")]
        body = a[:, 1:]
        return off, np.ascontiguousarray(body[:, 0] if body.shape[1] == 1 else body)

    eo, e = rows(eps)
    do, d = rows(edges)
    co, c = rows(calls)
    return eo, e, do, d, co, c


@dataclass
class Dfa:
    """Intermediate DFA over bytes: trans [n, 256] int32 (-1 dead), accept [n], calls."""

    trans: NDArray[np.int32]
    accept: NDArray[np.bool_]
    calls: list[tuple[tuple[int, int], ...]]
    # memos of the language tests (a regular operand is shared by many differences)
    _cyclic: NDArray[np.bool_] | None = field(default=None, init=False, repr=False, compare=False)
    _all_infinite: bool | None = field(default=None, init=False, repr=False, compare=False)



def all_states_infinite(d: Dfa) -> bool:
    """Does every state of the trimmed DFA ``d`` have infinitely many completions (can
    reach a cycle)? Cached on ``d`` (a regular operand shared by many differences)."""
    got = d._all_infinite
    if got is None:
        got = d._all_infinite = _all_states_infinite_of(d)
    return bool(got)


def _all_states_infinite_of(d: Dfa) -> bool:
    n: int = d.trans.shape[0]
    if n == 0:
        return False
    on_cycle = cyclic_states(d)
    if not on_cycle.any():
        return False
    # backward reachability to cycle states
    good = on_cycle.copy()
    changed = True
    while changed:
        nxt = good | ((d.trans >= 0) & good[np.maximum(d.trans, 0)]).any(axis=1)
        changed = bool((nxt != good).any())
        good = nxt
    return bool(good.all())


def finite_language(d: Dfa) -> bool:
    """Is the language of the trimmed DFA ``d`` finite (no cycle among its states)? A
    compiled cycle search, else Kahn's peeling of states without predecessors (all of them
    go exactly when there is no cycle)."""
    got = d._cyclic
    if got is not None:
        return not got.any()
    dk = dfa_kernels()
    if dk.COMPILED:
        return bool(dk.acyclic(_c32(d.trans)))
    n: int = d.trans.shape[0]
    succ = _successors(d)
    indeg = np.bincount(np.fromiter((t for ts in succ for t in ts), dtype=np.int64), minlength=n).tolist()
    todo = [q for q in range(n) if indeg[q] == 0]
    peeled = 0
    while todo:
        q = todo.pop()
        peeled += 1
        for t in succ[q]:
            indeg[t] -= 1
            if indeg[t] == 0:
                todo.append(t)
    return peeled == n


def _successors(d: Dfa) -> list[list[int]]:
    """Per state of DFA ``d``, its distinct successor states in ascending order."""
    n: int = d.trans.shape[0]
    rows, cols = np.nonzero(d.trans >= 0)
    pairs = np.unique(rows.astype(np.int64) * n + d.trans[rows, cols])  # distinct (state, successor)
    bounds = np.searchsorted(pairs // n, np.arange(n + 1)).tolist()
    tgt = (pairs % n).tolist()
    return [tgt[bounds[q]:bounds[q + 1]] for q in range(n)]


def cyclic_states(d: Dfa) -> NDArray[np.bool_]:
    """States that lie on a cycle (strongly connected components); cached on ``d``."""
    got = d._cyclic
    if got is not None:
        return got
    n: int = d.trans.shape[0]
    succ = _successors(d)
    comps = strongly_connected_components(list(range(n)), dict(enumerate(succ)))
    out = np.zeros(n, dtype=bool)
    for comp in comps:
        if len(comp) > 1 or comp[0] in succ[comp[0]]:
            out[list(comp)] = True
    d._cyclic = out
    return out




def _coreachable(d: Dfa, nonempty: list[bool]) -> NDArray[np.bool_]:
    """States from which an accepting state is reachable (byte edges, and call edges to
    non-empty rules), by backward breadth-first search over a CSR of reversed edges."""
    n: int = d.trans.shape[0]
    src, _b = np.nonzero(d.trans >= 0)
    dst = d.trans[src, _b].astype(np.int64)
    extra_src = [q for q in range(n) for r, _t in d.calls[q] if nonempty[r]]
    extra_dst = [t for q in range(n) for r, t in d.calls[q] if nonempty[r]]
    if extra_src:
        src = np.concatenate([src, np.array(extra_src, dtype=np.int64)])
        dst = np.concatenate([dst, np.array(extra_dst, dtype=np.int64)])
    keys = np.unique(dst * n + src)
    rdst, rsrc = keys // n, keys % n  # sorted by destination
    indptr = np.searchsorted(rdst, np.arange(n + 1))
    good: NDArray[np.bool_] = d.accept.copy()
    frontier = np.nonzero(good)[0]
    while frontier.size:
        starts, ends = indptr[frontier], indptr[frontier + 1]
        counts = ends - starts
        total = int(counts.sum())
        if total == 0:
            break
        idx = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(total)
        preds = np.unique(rsrc[idx])
        preds = preds[~good[preds]]
        good[preds] = True
        frontier = preds
    return good


def _restrict(d: Dfa, keep: NDArray[np.bool_], nonempty: list[bool]) -> Dfa:
    """Drop states not in ``keep`` (and unreachable ones), renumbering from 0."""
    n: int = d.trans.shape[0]
    if not keep[0]:
        return Dfa(np.full((1, 256), -1, np.int32), np.zeros(1, bool), [()])
    trans = np.where((d.trans >= 0) & keep[np.maximum(d.trans, 0)], d.trans, -1)
    # forward reachability from 0
    reach = np.zeros(n, dtype=bool)
    reach[0] = True
    stack = [0]
    calls = [tuple((r, t) for r, t in d.calls[q] if nonempty[r] and keep[t]) for q in range(n)]
    while stack:
        q = stack.pop()
        nxt = set(trans[q][trans[q] >= 0].tolist())
        nxt.update(t for _r, t in calls[q])
        for t in nxt:
            if not reach[t]:
                reach[t] = True
                stack.append(t)
    alive = keep & reach
    order = np.nonzero(alive)[0]
    remap = np.full(n, -1, dtype=np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    nt = trans[order]
    nt = np.where(nt >= 0, remap[np.maximum(nt, 0)], -1).astype(np.int32)
    ncalls = [tuple((r, int(remap[t])) for r, t in calls[q]) for q in order]
    return Dfa(np.ascontiguousarray(nt), d.accept[order].copy(), ncalls)


def trim(d: Dfa) -> Dfa:
    """``d`` (call-free) restricted to states reachable from the start that can accept."""
    dk = dfa_kernels()
    if dk.COMPILED:
        trans, acc = dk.trim(_c32(d.trans), np.ascontiguousarray(d.accept, dtype=bool))
        return Dfa(trans, acc, [()] * trans.shape[0])
    return _restrict(d, _coreachable(d, []), [])


def _c32(a: NDArray[np.int32]) -> NDArray[np.int32]:
    return np.ascontiguousarray(a, dtype=np.int32)


def nfa_arrays(eps: Sequence[Sequence[int]], edges: Sequence[Sequence[tuple[int, int, int]]],
               calls: Sequence[Sequence[tuple[int, int]]]
               ) -> tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32],
                          NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]]:
    """An NFA's per-state lists (as :class:`Nfa` holds them) as flat int32 arrays:
    ``(eps_off [n+1], eps, edge_off [n+1], edges [m, 3] (lo, hi, target), call_off [n+1],
    calls [k, 2] (rule, target))``, row ``x`` of each between ``off[x]`` and ``off[x + 1]``."""
    n = len(eps)

    def rows(lists: Sequence[Sequence[Any]], width: int) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, lists), dtype=np.int64, count=n), out=off[1:])
        items = chain.from_iterable(lists)
        if width > 1:
            items = chain.from_iterable(items)
        flat = np.fromiter(items, dtype=np.int32, count=int(off[-1]) * width)
        return off.astype(np.int32), (flat if width == 1 else flat.reshape(-1, width))

    eo, eps_flat = rows(eps, 1)
    do, edges_flat = rows(edges, 3)
    co, calls_flat = rows(calls, 2)
    return eo, eps_flat, do, edges_flat, co, calls_flat


def joined_nfa_arrays(parts: Sequence[Sequence[NDArray[Any]]]) -> tuple[NDArray[Any], ...]:
    """NFAs ``parts`` (each as :meth:`~structgen.grammar.compiled.LazyRule.csr` gives it:
    ``eps_off, eps, edge_off, edges [m, 3], call_off, calls [k, 2], important``) in one set
    of arrays of that layout, as the compiled runtime lays its rules out: states numbered on
    from the previous part's, offsets running on with a final total. A fixed number of array
    operations for any number of parts."""
    if not parts:
        z = np.zeros(1, dtype=np.int32)
        e = np.zeros(0, dtype=np.int32)
        return z, e, z, e.reshape(0, 3), z, e.reshape(0, 2), e.astype(np.uint8)
    if len(parts) == 1:  # numbered from 0 already: shared, not copied (read-only ones are)
        return tuple(a if a.flags.writeable else a.copy() for a in parts[0][:7])
    n_states = np.array([p[6].shape[0] for p in parts], dtype=np.int64)
    first = np.zeros(len(parts), dtype=np.int64)  # per part: its first state
    np.cumsum(n_states[:-1], out=first[1:])

    def join(k: int, target: int | None) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
        items = [p[k + 1] for p in parts]
        counts = np.array([x.shape[0] for x in items], dtype=np.int64)
        before = np.zeros(len(items), dtype=np.int64)  # per part: items of the parts before it
        np.cumsum(counts[:-1], out=before[1:])
        off = np.concatenate([*(p[k][:-1] for p in parts), np.array([counts.sum()], dtype=np.int32)])
        off[:-1] += np.repeat(before, n_states).astype(np.int32)
        flat = np.concatenate(items)
        shift = np.repeat(first, counts).astype(np.int32)
        if target is None:
            flat += shift
        else:
            flat[:, target] += shift
        return off, flat

    eo, eps = join(0, None)
    do, edges = join(2, 2)
    co, calls = join(4, 1)
    return eo, eps, do, edges, co, calls, np.concatenate([p[6] for p in parts])


def minimise(d: Dfa, check: Callable[[], None] | None = None) -> Dfa:
    """Minimal DFA of ``d``: Hopcroft's algorithm in compiled code for call-free DFAs, else
    Moore partition refinement (vectorised with numpy); ``check`` runs once per round (the
    compiler's deadline)."""
    n: int = d.trans.shape[0]
    if n <= 1:
        return d
    dk = dfa_kernels()
    if dk.COMPILED and not any(d.calls):
        status, trans, acc = dk.minimise(_c32(d.trans), np.ascontiguousarray(d.accept, dtype=bool),
                                         1 << 62, limits.stop_cell())
        if status != dk.OK:  # stopped: the request was cancelled
            limits.check()
        return Dfa(trans, acc, [()] * trans.shape[0])
    called = sorted({r for cs in d.calls for r, _ in cs})
    ccols = np.full((n, len(called)), -1, dtype=np.int64)
    cpos = {r: i for i, r in enumerate(called)}
    for q, cs in enumerate(d.calls):
        for r, t in cs:
            ccols[q, cpos[r]] = t
    # initial partition: accept flag + which rules are called
    init = np.concatenate([d.accept[:, None].astype(np.int64), (ccols >= 0).astype(np.int64)], axis=1)
    block = _row_classes(init)
    nblocks = int(block.max()) + 1
    # columns (bytes) that behave identically in every state need to be compared only once
    if d.trans.shape[1] > 1:
        _u, first_col = np.unique(_row_classes(d.trans.T), return_index=True)
        cols = d.trans[:, first_col]
    else:
        cols = d.trans
    while True:
        if check is not None:
            check()
        tb = np.where(cols >= 0, block[np.maximum(cols, 0)], -1)
        cb = np.where(ccols >= 0, block[np.maximum(ccols, 0)], -1)
        sig = np.concatenate([block[:, None], tb, cb], axis=1)
        nb = _row_classes(sig)
        k = int(nb.max()) + 1
        block = nb
        if k == nblocks:
            break
        nblocks = k
    if nblocks == n:
        return d
    # renumber blocks: the start state's block becomes 0, the rest by first occurrence
    first: dict[int, int] = {int(block[0]): 0}
    for b in block.tolist():
        if b not in first:
            first[b] = len(first)
    remap = np.empty(nblocks, dtype=np.int32)
    for b, j in first.items():
        remap[b] = j
    new_of_state = remap[block]
    reps = np.zeros(nblocks, dtype=np.int64)
    reps[new_of_state] = np.arange(n)  # any member represents its block
    trans = d.trans[reps]
    trans = np.where(trans >= 0, new_of_state[np.maximum(trans, 0)], -1).astype(np.int32)
    acc = d.accept[reps].copy()
    calls = [tuple((r, int(new_of_state[t])) for r, t in d.calls[int(q)]) for q in reps]
    return Dfa(np.ascontiguousarray(trans), acc, calls)


_HASH_RNG = np.random.default_rng(0x5EED)


def _nearly_distinct(d: Dfa) -> bool:
    """Whether at most 1% of ``d``'s states share their acceptance and transition row with
    another. The product of two minimal DFAs where that holds is minimal or nearly so, and
    minimising a large one costs far more than the few states it would save; products with
    many equal rows shrink a lot and are still minimised. A non-minimal table is exact all
    the same, only larger."""
    rows = _row_classes(np.concatenate([d.accept[:, None].astype(np.int32), d.trans], axis=1))
    return bool(int(rows.max()) + 1 >= 0.99 * d.trans.shape[0])


def _row_classes(mat: NDArray[np.int32] | NDArray[np.int64]) -> NDArray[np.int64]:
    """Class id per row of an int matrix (equal rows <-> equal ids), via 64-bit row hashes
    checked for collisions (falls back to an exact ``np.unique`` if any)."""
    m = mat.astype(np.int64)
    mult = _HASH_RNG.integers(1, 2**62, size=m.shape[1], dtype=np.int64) | 1
    with np.errstate(over="ignore"):
        h = (m * mult).sum(axis=1) ^ (m[:, 0] << 17 if m.shape[1] else 0)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    if not np.array_equal(m, m[first[inv]]):  # a hash collision: be exact
        _, inv = np.unique(m, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
    return inv.astype(np.int64)


def byte_classes(nfa: Nfa) -> tuple[NDArray[np.int32], int, list[list[tuple[int, int, int]]]]:
    """Byte equivalence classes from all edge boundaries of ``nfa``: ``class_of`` int32
    ``[256]``, the number of classes, and per NFA state its edges as
    ``(class_lo, class_hi, target)``."""
    cuts = {0, 256}
    per_state = nfa.edges
    for es in per_state:
        for lo, hi, _t in es:
            cuts.add(lo)
            cuts.add(hi + 1)
    bounds = sorted(cuts)
    class_of = np.zeros(256, dtype=np.int32)
    for ci in range(len(bounds) - 1):
        class_of[bounds[ci]:bounds[ci + 1]] = ci
    cl = class_of.tolist()
    cedges = [[(cl[lo], cl[hi], t) for lo, hi, t in es] for es in per_state]
    return class_of, len(bounds) - 1, cedges



def embed(nfa: Nfa, d: Dfa, s: int) -> int:
    """Copy a call-free DFA into the NFA after state ``s``; return the end state."""
    n: int = d.trans.shape[0]
    base0 = len(nfa)
    for _ in range(n + 1):
        nfa.new()
    end = base0 + n
    nfa.add_eps(s, base0)
    trans = d.trans
    # run boundaries per row: positions where the target changes
    change = np.ones((n, 257), dtype=bool)
    change[:, 1:256] = trans[:, 1:] != trans[:, :-1]
    rows, cols = np.nonzero(change)  # row-major: grouped by state, ascending
    bounds = np.searchsorted(rows, np.arange(n + 1))
    cols_l = cols.tolist()
    add_edge = nfa.add_edge
    for q in range(n):
        starts = cols_l[bounds[q]:bounds[q + 1]]
        row = trans[q]
        for k in range(len(starts) - 1):
            lo = int(starts[k])
            t = int(row[lo])
            if t >= 0:
                add_edge(base0 + q, lo, int(starts[k + 1]) - 1, base0 + t)
        if d.accept[q]:
            nfa.add_eps(base0 + q, end)
    return end


def product(a: Dfa, b: Dfa, op: str, max_states: int, budget: BuildBudget) -> Dfa:
    """Product of two call-free DFAs (missing transitions = dead), explored from the
    start pair over the joint byte classes of both automata (compiled when numba is
    present), then trimmed and minimised."""
    dk = budget.dfa_kernels()
    if dk.COMPILED:
        status, trans, acc = dk.product(_c32(a.trans), a.accept, _c32(b.trans), b.accept, op == "and",
                                        max_states, budget.work_budget(), limits.stop_cell())
        budget.kernel_status(int(status), "intersection/difference")
        d = trim(Dfa(trans, acc, [()] * trans.shape[0]))
        if d.trans.shape[0] > MINIMISE_SKIP_MIN and _nearly_distinct(d):
            return d
        return minimise(d, budget.check_time_now) if d.trans.shape[0] > MINIMISE_MIN else d
    # joint byte classes: bytes on which every state of both automata agrees
    joint = np.concatenate([a.trans, b.trans], axis=0)  # [na + nb, 256]
    # equal columns by row hashing of the transpose (a structured-array unique sorts
    # the whole matrix)
    _u, first, cls_of = np.unique(_row_classes(joint.T), return_index=True, return_inverse=True)
    cls_of = cls_of.reshape(-1)
    ta = a.trans[:, first].tolist()  # [na][nclass]
    tb = b.trans[:, first].tolist()  # [nb][nclass]
    nclass = len(first)
    dead_b = [-1] * nclass
    is_and = op == "and"
    ids: dict[tuple[int, int], int] = {(0, 0): 0}
    order = [(0, 0)]
    rows: list[list[int]] = []
    limit = max_states
    i = 0
    while i < len(order):
        if i & 63 == 0:
            budget.check_time()
        qa, qb = order[i]
        ra = ta[qa]
        rb = tb[qb] if qb >= 0 else dead_b
        row = [-1] * nclass
        for c in range(nclass):
            pa = ra[c]
            if pa < 0:
                continue
            pb = rb[c]
            if is_and and pb < 0:
                continue
            key = (pa, pb)
            j = ids.get(key)
            if j is None:
                j = len(order)
                ids[key] = j
                order.append(key)
                if j >= limit:
                    budget.too_many_states("intersection/difference")
            row[c] = j
        rows.append(row)
        i += 1
    trans = np.array(rows, dtype=np.int32)[:, cls_of]
    acc_a = a.accept.tolist()
    acc_b = b.accept.tolist()
    acc = np.array([(acc_a[qa] and (qb >= 0 and acc_b[qb])) if is_and
                    else (acc_a[qa] and not (qb >= 0 and acc_b[qb])) for qa, qb in order],
                   dtype=bool)
    d = Dfa(np.ascontiguousarray(trans), acc, [() for _ in range(len(order))])
    d = trim(d)
    return minimise(d, budget.check_time_now) if d.trans.shape[0] > MINIMISE_MIN else d

# -- subset construction ------------------------------------------------------
def determinise(nfa: Nfa, start: int, end: int, name: str, max_states: int,
                budget: BuildBudget) -> Dfa:
    """Subset construction of ``nfa`` from ``start`` (accepting where ``end`` is in the
    subset) over its byte classes, for rule ``name`` (named by limit errors): compiled for a
    call-free NFA, else in Python keeping call edges. Raises through ``budget`` past
    ``max_states`` states or the deadline; the states are added to the budget's count."""
    dk = budget.dfa_kernels()
    if dk.COMPILED and not nfa.has_calls():
        eo, eps_csr, do, edges = nfa.arrays()[:4]
        status, trans, acc = dk.determinise(eo, eps_csr, do, edges, start, end, max_states,
                                            budget.work_budget(), limits.stop_cell())
        if status == dk.LIMIT:
            budget.rule_too_big(name)
        budget.kernel_status(int(status), f"rule {name!r}")
        budget.count_states(trans.shape[0], f"rule {name!r}")
        return Dfa(trans, acc, [()] * trans.shape[0])
    class_of, nclass, cedges = byte_classes(nfa)

    eps = nfa.eps
    nfa_calls = nfa.calls
    closure_memo: dict[int, frozenset[int]] = {}

    def eclose(states: Iterable[int]) -> frozenset[int]:
        seen = set()
        stack = list(states)
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            stack.extend(eps[x])
        return frozenset(seen)

    def eclose1(x: int) -> frozenset[int]:
        got = closure_memo.get(x)
        if got is None:
            got = eclose((x,))
            closure_memo[x] = got
        return got

    s0 = eclose1(start)
    ids: dict[frozenset[int], int] = {s0: 0}
    subsets = [s0]
    rows: list[list[int]] = []
    calls: list[tuple[tuple[int, int], ...]] = []
    accept: list[bool] = []
    i = 0
    while i < len(subsets):
        budget.check_time()
        S = subsets[i]
        tgt: list[set[int] | None] = [None] * nclass
        callt: dict[int, set[int]] = {}
        for x in S:
            for clo, chi, t in cedges[x]:
                for c in range(clo, chi + 1):
                    bucket = tgt[c]
                    if bucket is None:
                        tgt[c] = {t}
                    else:
                        bucket.add(t)
            for r, t in nfa_calls[x]:
                callt.setdefault(r, set()).add(t)
        row = [-1] * nclass
        seen_targets: dict[frozenset[int], int] = {}
        for c in range(nclass):
            bucket = tgt[c]
            if bucket is None:
                continue
            key = frozenset(bucket)
            j = seen_targets.get(key)
            if j is None:
                closed = frozenset().union(*(eclose1(t) for t in bucket))
                j = ids.get(closed)
                if j is None:
                    j = len(subsets)
                    ids[closed] = j
                    subsets.append(closed)
                    if len(subsets) > max_states:
                        budget.rule_too_big(name)
                seen_targets[key] = j
            row[c] = j
        crow = []
        for r in sorted(callt):
            closed = frozenset().union(*(eclose1(t) for t in callt[r]))
            j = ids.get(closed)
            if j is None:
                j = len(subsets)
                ids[closed] = j
                subsets.append(closed)
            crow.append((r, j))
        rows.append(row)
        calls.append(tuple(crow))
        accept.append(end in S)
        i += 1
    budget.count_states(len(subsets), f"rule {name!r}")
    ctrans = np.array(rows, dtype=np.int32).reshape(len(subsets), nclass)
    trans = ctrans[:, class_of]
    return Dfa(np.ascontiguousarray(trans), np.array(accept, dtype=bool), calls)
