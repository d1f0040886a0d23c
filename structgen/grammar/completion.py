"""Shortest completions: the exact minimum number of bytes from a configuration to acceptance.

Per rule state ``g`` (a state of one rule's DFA) ``d(g)`` is the fewest bytes that take the
rule from ``g`` to a state where it may return: 0 where it may return already, else the
minimum of ``1 + d(g')`` over its byte edges and ``d(callee start) + d(return state)`` over
its calls (a call costs the called rule's shortest yield). That is a system of min-plus
equations. Every right-hand side is at least each of its arguments, so Knuth's
generalisation of Dijkstra's algorithm solves it exactly, each unknown settled once in
increasing order (Knuth, "A generalization of Dijkstra's algorithm", 1977): time about
linear in the unknowns and edges, whatever the length of the completions.

The unknowns are not the DFA states where that can be helped, since a lazily determinised
rule (:class:`~structgen.grammar.compiled.LazyRule`) can have exponentially more DFA states
than NFA states: ``(a|b)*a(a|b){20}`` is a few dozen NFA states and 2^21 DFA states, every
one reachable. Such a rule's DFA state is the set of important NFA states of an epsilon
closure (subset construction, calls treated as symbols), and the language from a set is the
union of the languages from its members; so ``d(g)`` is the minimum over its NFA states of
``dN(q)``, the same equations on the NFA (an epsilon edge costs 0, the rule's end is 0).
``dN`` is solved once per grammar over every NFA state of every lazy rule (the *grammar
solve*), with the other rule kinds' shortest yields as constants: a table rule's
(:class:`~structgen.grammar.compiled.DfaRule`) by breadth-first search over its table, a
counted repetition ``item{lo,hi}`` in closed form (bytes to finish the current item, plus
the items still missing times the shortest item; its possibly many count states are never
enumerated), a difference ``A - B`` (:class:`~structgen.grammar.compiled.ProductRule`) by
exploring its pair states, the one kind still explored. No lazy rule's DFA state is built to
measure it: ``d(g)`` reads the key the runtime interned ``g`` by.

A stack needs the sum of ``d`` over its frames (the top frame's state, the return states
below); a configuration the minimum over its stacks (0 when it is accepting). These are
exact: the configuration graph is deterministic and every stack completes independently.
Lengths are exact below :data:`LONGEST` and saturate there (a grammar of forty rules, each
twice the one below, has a shortest sentence of 2^40 bytes): ``LONGEST`` reads "at least
that many bytes".

The work is bounded. The grammar solve is linear in the compiled grammar's size, like the
compilation it follows. The exploration of a difference's pair states (and of every rule
state in the reference method, ``CompletionLengths(runtime, explore_all=True)``, kept for
tests and benchmarks) expands at most :func:`solve_bound` new rule states per solve -- in
proportion to the compiled grammar's size. Both read :func:`structgen.limits.check`
(cancellation) every few hundred states and stop at the compile timeout
(``CompileOptions.timeout_s``, brought forward to the request's deadline). Past either they
raise :class:`~structgen.errors.CompileLimitError` (:class:`~structgen.errors.CompileTimeoutError`)
naming the rule they were solving and, through
:attr:`~structgen.grammar.compiled.CompiledGrammar.rule_sources`, its place in the source (a
JSON schema pointer and keyword, a Lark rule and line).

:meth:`CompletionLengths.completion` gives the *first* shortest completion: from ``c`` the
smallest byte ``b`` with ``D(c.b) = D(c) - 1``, repeated. Consuming a prefix of it leaves
exactly the rest as the first shortest completion of the state reached, which the
token-level budget (:mod:`structgen.masks.budget`) relies on. It is spelled one byte at a
time (each step memoised per configuration, so the bytes of a long completion are not kept
once per suffix), and only as far as a caller asks: spelling costs time and table space in
proportion to its length, so callers compare :meth:`~CompletionLengths.distance` with what
they can afford first.

What is keyed by table ids is dropped when the runtime flushes its tables (the runtime's
``on_flush`` hook); the grammar solve's distances (per NFA state and per rule, read-only numpy
arrays), the tables' and the counted items' depend only on the grammar and are kept.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from structgen import limits
from structgen.errors import CompileLimitError, CompileTimeoutError
from structgen.grammar import _runtime_kernels as K
from structgen.grammar.compiled import CompiledGrammar, CountedRule, DfaRule
from structgen.grammar.runtime import Runtime, RuntimeTables

__all__ = ["CompletionLengths", "INFINITE", "LONGEST", "MIN_SOLVE_STATES", "SOLVE_STATES_PER_STATE",
           "completion_lengths", "solve_bound"]

#: The distance of a state from which the grammar cannot accept.
INFINITE = 1 << 40
#: Where distances saturate: a distance of ``LONGEST`` means at least that many bytes.
LONGEST = INFINITE - 1
#: Rule states one solve may expand, at the least (a small grammar's DFAs may well be larger
#: than its NFAs).
MIN_SOLVE_STATES = 20_000
#: Rule states one solve may expand per NFA state of the compiled grammar (above the minimum;
#: at most ``CompileOptions.max_states``).
SOLVE_STATES_PER_STATE = 8
_ROOT = 0  # the empty stack
_CHECK_EVERY = 256  # states expanded between two reads of the clock and the cancellation test


def completion_lengths(runtime: Runtime) -> CompletionLengths:
    """The :class:`CompletionLengths` of ``runtime`` (built on first use, kept on it)."""
    got = runtime.completion_lengths
    if got is None:
        with runtime.lock:
            got = runtime.completion_lengths
            if got is None:
                got = CompletionLengths(runtime)
                runtime.completion_lengths = got
    return got


def solve_bound(grammar: CompiledGrammar) -> int:
    """The most new rule states one solve may expand for ``grammar`` (a compiled grammar):
    :data:`SOLVE_STATES_PER_STATE` per NFA state, at least :data:`MIN_SOLVE_STATES`, at most
    ``CompileOptions.max_states`` (the limit of every automaton built eagerly)."""
    bound = max(MIN_SOLVE_STATES, SOLVE_STATES_PER_STATE * int(grammar.num_states))
    return min(bound, int(grammar.options.max_states))


def _plus(a: int, b: int) -> int:
    """``a + b`` for distances: INFINITE if either is, else saturated at LONGEST."""
    if a >= INFINITE or b >= INFINITE:
        return INFINITE
    return min(a + b, LONGEST)


def _csr_slices(off: NDArray[np.int64], rows: NDArray[np.int64]) -> NDArray[np.int64]:
    """The indices ``off[r] .. off[r + 1] - 1`` of every row ``r`` of ``rows``, concatenated
    (the entries of those rows of a CSR array)."""
    starts = off[rows]
    counts = off[rows + 1] - starts
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    # position within the row = running index minus where that row's run begins
    run_start = np.repeat(np.cumsum(counts) - counts, counts)
    out: NDArray[np.int64] = np.repeat(starts, counts) + (np.arange(total, dtype=np.int64) - run_start)
    return out


def _by_key(keys: NDArray[np.int64], n: int) -> tuple[NDArray[np.int64], NDArray[np.intp]]:
    """CSR over ``keys`` (ints in ``[0, n)``): (offsets ``[n + 1]``, the positions of
    ``keys`` grouped by key, stably)."""
    order = np.argsort(keys, kind="stable")
    off = np.zeros(n + 1, dtype=np.int64)
    off[1:] = np.cumsum(np.bincount(keys, minlength=n))
    return off, order


def _table_distances(trans: NDArray[np.int32], accept: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Fewest bytes from each state of a DFA table (-1 = dead edge) to an accepting state
    (INFINITE where there is none): breadth-first search backwards from the accepting
    states, one level at a time (a level costs one pass over its predecessors, so a table
    with long chains costs no more than its edges)."""
    trans = np.asarray(trans)
    n = trans.shape[0]
    dist = np.full(n, INFINITE, dtype=np.int64)
    if not n:
        return dist
    src, byte = np.nonzero(trans >= 0)
    # the distinct edges, as (target, source) pairs: the predecessors of each state
    pairs = np.unique(trans[src, byte].astype(np.int64) * n + src)
    off, order = _by_key(pairs // n, n)
    preds = (pairs % n)[order]
    frontier = np.flatnonzero(np.asarray(accept, dtype=bool))
    dist[frontier] = 0
    level = 0
    while frontier.size:
        level += 1
        before = np.unique(preds[_csr_slices(off, frontier)])
        frontier = before[dist[before] >= INFINITE]
        dist[frontier] = level
    return dist


def _nfa_distances(tab: RuntimeTables, yields: NDArray[np.int64],
                   tick: Callable[[int, int], None]) -> NDArray[np.int64]:
    """``dN``: the fewest bytes from each NFA state of every lazy rule to its rule's end (the
    *grammar solve*, see the module docstring), by Knuth's generalised Dijkstra.

    ``tab``: the runtime tables (the concatenated NFAs, global state ids); ``yields``: per
    rule its shortest yield, read for the rules that are not lazy (constants here) and
    written for the lazy ones (``dN`` of their start state). ``tick(state, settled)`` is
    called every :data:`_CHECK_EVERY` settled states, from the first, to read cancellation
    and the clock."""
    kind = np.asarray(tab.rule_kind)
    n = int(tab.nfa_important.shape[0])
    lazy = np.flatnonzero(kind == K.LAZY)
    dist = np.full(n, INFINITE, dtype=np.int64)
    if not n or not lazy.size:
        return dist
    states = np.arange(n, dtype=np.int64)
    base = np.asarray(tab.rule_base)
    # lazy rules' NFAs are concatenated in rule order: each state's rule
    sizes = np.diff(np.append(base[lazy], n))
    rule_of = np.repeat(lazy, sizes)
    # epsilon edges x -> y cost 0
    eps_off = np.asarray(tab.nfa_eps_off, dtype=np.int64)
    eps_src = np.repeat(states, np.diff(eps_off))
    eps_dst = np.asarray(tab.nfa_eps, dtype=np.int64)
    # byte edges x -(classes lo..hi)-> y cost 1, where one of those classes has a byte (a
    # class no byte maps to is an edge the DFA never takes)
    edge_off = np.asarray(tab.nfa_edge_off, dtype=np.int64)
    edges = np.asarray(tab.nfa_edges, dtype=np.int64).reshape(-1, 3)
    edge_src = np.repeat(states, np.diff(edge_off))
    nclasses = np.asarray(tab.rule_nclasses, dtype=np.int64)
    cls_at = np.zeros(kind.shape[0], dtype=np.int64)  # each lazy rule's run in ``inhabited``
    runs = []
    at = 0
    for r in lazy.tolist():
        nc = int(nclasses[r])
        used = np.bincount(np.asarray(tab.rule_class[r]), minlength=nc)[:nc] > 0
        runs.append(np.concatenate([[0], np.cumsum(used)]))  # classes with a byte, below each class
        cls_at[r] = at
        at += nc + 1
    inhabited = np.concatenate(runs)
    er = cls_at[rule_of[edge_src]]
    live = inhabited[er + edges[:, 1] + 1] > inhabited[er + edges[:, 0]]
    # calls x -(call R)-> y: a constant cost where R is not lazy, else dN(R's start) + dN(y)
    call_off = np.asarray(tab.nfa_call_off, dtype=np.int64)
    calls = np.asarray(tab.nfa_calls, dtype=np.int64).reshape(-1, 2)
    call_src = np.repeat(states, np.diff(call_off))
    callee, ret = calls[:, 0], calls[:, 1]
    joint = kind[callee] == K.LAZY
    fixed = ~joint & (yields[callee] < INFINITE)
    # simple edges, grouped by the state whose distance they wait for
    dst = np.concatenate([eps_dst, edges[live, 2], ret[fixed]])
    src = np.concatenate([eps_src, edge_src[live], call_src[fixed]])
    cost = np.concatenate([np.zeros(eps_dst.shape[0], np.int64), np.ones(int(live.sum()), np.int64),
                           np.minimum(yields[callee[fixed]], LONGEST)])
    off, order = _by_key(dst, n)
    off_l, src_l, cost_l = off.tolist(), src[order].tolist(), cost[order].tolist()
    # calls of lazy rules: each waits for two distances (one where the callee starts where
    # the call returns)
    j_src, j_a, j_b = call_src[joint], base[callee[joint]], ret[joint]
    two = j_a != j_b
    waiting = (1 + two).tolist()
    args = np.concatenate([j_a, j_b[two]])
    which = np.concatenate([np.arange(j_a.shape[0]), np.flatnonzero(two)])
    uoff, uorder = _by_key(args, n)
    uoff_l, uses_l = uoff.tolist(), which[uorder].tolist()
    j_src_l, j_a_l, j_b_l = j_src.tolist(), j_a.tolist(), j_b.tolist()

    d = [INFINITE] * n
    done = bytearray(n)
    heap = [(0, int(tab.rule_end[r])) for r in lazy.tolist()]
    heapq.heapify(heap)
    push, pop = heapq.heappush, heapq.heappop
    settled = 0
    while heap:
        v, x = pop(heap)
        if done[x]:
            continue
        if settled % _CHECK_EVERY == 0:
            tick(x, settled)
        done[x] = 1
        d[x] = v
        settled += 1
        for k in range(off_l[x], off_l[x + 1]):
            p = src_l[k]
            if not done[p]:
                w = v + cost_l[k]
                push(heap, (w if w < LONGEST else LONGEST, p))
        for k in range(uoff_l[x], uoff_l[x + 1]):
            i = uses_l[k]
            waiting[i] -= 1
            if not waiting[i]:
                p = j_src_l[i]
                if not done[p]:
                    w = d[j_a_l[i]] + d[j_b_l[i]]
                    push(heap, (w if w < LONGEST else LONGEST, p))
    dist[:] = d
    yields[lazy] = dist[base[lazy]]
    return dist


class CompletionLengths:
    """Exact shortest-completion lengths (bytes) of one runtime's configurations; see the
    module docstring. Thread-safe through the runtime's lock; ids are of the current epoch.

    ``max_solve_states`` is the work bound of one exploring solve (:func:`solve_bound`),
    ``timeout_s`` the time limit of every solve; ``largest_solve`` the most rule states one
    exploring solve has expanded so far (a measure of how near the bound the grammar comes).
    ``explore_all``: measure every rule state by exploring its rule's DFA, as before the
    grammar solve existed (the reference method of tests and benchmarks: exact too, but a
    lazy rule's DFA may be exponentially large, and the work bound refuses it then)."""

    def __init__(self, runtime: Runtime, *, explore_all: bool = False) -> None:
        self.runtime = runtime
        grammar = runtime.grammar
        self.max_solve_states = solve_bound(grammar)
        self.timeout_s = float(grammar.options.timeout_s)
        self.largest_solve = 0
        self.explore_all = explore_all
        # (dN per NFA state, shortest yield per rule): the grammar solve, read-only, made once
        self._solved: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None
        self._tables: dict[int, NDArray[np.int64]] = {}  # table rule -> distance per table state
        self._state: dict[int, int] = {}  # rule state -> d
        self._stack: dict[int, int] = {}  # stack -> sum of d over its frames
        self._config: dict[int, int] = {}  # configuration -> D
        self._next: dict[int, tuple[int, int]] = {}  # configuration -> (first byte, configuration after it)
        # rule -> (item distances, shortest item)
        self._counted: dict[int, tuple[NDArray[np.int64], int]] = {}
        runtime.on_flush.append(self._forget)

    def _forget(self) -> None:
        """Drop everything keyed by table ids (the runtime flushed its tables)."""
        self._state.clear()
        self._stack.clear()
        self._config.clear()
        self._next.clear()

    # -- the grammar solve ----------------------------------------------------------------
    def nfa_distances(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(``dN`` per NFA state of the runtime's concatenated NFAs, the shortest yield per
        rule): int64, read-only, :data:`INFINITE` where there is none; solved on first use
        (see the module docstring). Raises what a solve raises (see :meth:`_solve`)."""
        got = self._solved
        if got is None:
            with self.runtime.lock:
                got = self._solved
                if got is None:
                    got = self._solved = self._solve_grammar()
        return got

    def _solve_grammar(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """The grammar solve (hold the lock): the shortest yields of the rules that are not
        lazy first (constants of the lazy rules' equations), then ``dN``."""
        rt = self.runtime
        kinds = rt.tab.rule_kind.tolist()
        yields = np.full(len(kinds), INFINITE, dtype=np.int64)
        for r, kind in enumerate(kinds):
            if kind == K.TABLE:
                yields[r] = self._table(r)[0]
            elif kind != K.LAZY:  # a counted repetition or a difference: from its start state
                yields[r] = self._measure(rt.run_kernel(K.start_state, r))
        deadline: list[float | None] = [None]

        def tick(x: int, settled: int) -> None:
            limits.check()
            if deadline[0] is None:
                deadline[0] = limits.deadline_within(limits.now() + self.timeout_s)
            elif limits.now() > deadline[0]:
                raise self._limit_error(self._rule_of_nfa_state(x), settled, timed_out=True)

        dist = _nfa_distances(rt.tab, yields, tick)
        dist.flags.writeable = False
        yields.flags.writeable = False
        return dist, yields

    def _rule_of_nfa_state(self, x: int) -> int:
        """The lazy rule NFA state ``x`` (a global id) belongs to."""
        tab = self.runtime.tab
        lazy = np.flatnonzero(tab.rule_kind == K.LAZY)
        return int(lazy[np.searchsorted(tab.rule_base[lazy], x, side="right") - 1])

    def _table(self, r: int) -> NDArray[np.int64]:
        """Distance per state of table rule ``r`` (kept: it depends only on the grammar)."""
        got = self._tables.get(r)
        if got is None:
            rule = self.runtime.rules[r]
            assert isinstance(rule, DfaRule)  # a TABLE rule
            got = self._tables[r] = _table_distances(rule._trans, rule._accept)
        return got

    # -- rule states ----------------------------------------------------------------------
    def _measure(self, g: int) -> int:
        """``d(g)``, computed and kept (hold the lock): from the grammar solve for a lazy
        rule's state (a minimum over the NFA states of its key), from its rule's table or in
        closed form for a table or a counted rule, by exploring for a difference (and for
        every state when :attr:`explore_all`)."""
        rt = self.runtime
        tab = rt.tab
        r = int(tab.state_rule[g])
        kind = int(tab.rule_kind[r])
        if self.explore_all or kind == K.PRODUCT:
            self._solve([g])
            return self._state[g]
        if kind == K.COUNTED:
            v = self._counted_distance(r, g)
        else:
            k0, kn = (int(x) for x in tab.state_key[g])
            if kind == K.TABLE:
                v = int(self._table(r)[int(tab.state_key_data[k0])])
            else:
                nfa = self.nfa_distances()[0]
                key = rt.tab.state_key_data[k0:k0 + kn]
                v = int(nfa[key].min()) if kn else INFINITE
        self._state[g] = v
        return v

    def _counted_distance(self, r: int, g: int) -> int:
        tab = self.runtime.tab
        got = self._counted.get(r)
        if got is None:
            rule = self.runtime.rules[r]
            assert isinstance(rule, CountedRule)
            dist = _table_distances(rule._trans, rule._accept)
            got = self._counted[r] = (dist, int(dist[0]))
        dist, shortest = got
        k0 = int(tab.state_key[g, 0])
        count, q = int(tab.state_key_data[k0]), int(tab.state_key_data[k0 + 1])
        lo = int(tab.rule_lo[r])
        if q == 0:
            missing, rest = max(0, lo - count), 0
        else:
            missing, rest = max(0, lo - count - 1), int(dist[q])
        if rest >= INFINITE or (missing and shortest >= INFINITE):
            return INFINITE
        return min(rest + missing * shortest, LONGEST)

    def _solve(self, roots: list[int]) -> None:
        """Compute ``d`` for ``roots`` and every rule state they reach by exploring them (hold
        the lock): a difference's pair states, or every state with :attr:`explore_all`.
        Raises CompileLimitError past :attr:`max_solve_states` new states,
        CompileTimeoutError past the time limit, RequestCancelledError when the request is
        cancelled."""
        rt = self.runtime
        known = self._state
        new: list[int] = []
        seen: set[int] = set()
        preds: dict[int, list[int]] = {}  # state -> the states with a byte edge into it
        calls: list[tuple[int, int, int]] = []  # (caller state, callee start, return state)
        heap: list[tuple[int, int]] = []  # (a candidate d, state)
        bound = self.max_solve_states
        deadline: float | None = None
        counted, accept = K.COUNTED, K.ACCEPT
        work = [g for g in roots if g not in known]
        while work:
            g = work.pop()
            if g in seen or g in known:
                continue
            seen.add(g)
            new.append(g)
            if len(new) > bound:
                raise self._too_much(new, timed_out=False)
            if len(new) % _CHECK_EVERY == 0:
                limits.check()
                if deadline is None:  # a small solve never reads the clock
                    deadline = limits.deadline_within(limits.now() + self.timeout_s)
                elif limits.now() > deadline:
                    raise self._too_much(new, timed_out=True)
            rt.expand(g)
            tab = rt.tab
            r = int(tab.state_rule[g])
            if tab.rule_kind[r] == counted:
                v = self._counted_distance(r, g)
                if v < INFINITE:
                    heap.append((v, g))
                continue
            if tab.state_flags[g] & accept:
                heap.append((0, g))
            row = tab.state_trans[g]
            targets = row[row >= 0]
            if targets.size:
                for t in set(targets.tolist()):
                    preds.setdefault(t, []).append(g)
                    work.append(t)
            st, n = tab.state_calls[g].tolist()
            if n:
                for callee, ret in tab.call_targets[st:st + n].tolist():
                    calls.append((g, callee, ret))
                    work.append(callee)
                    work.append(ret)
        if not new:
            return
        self.largest_solve = max(self.largest_solve, len(new))
        # states solved before are constants: their edges give candidates at once
        for t, ps in preds.items():
            kt = known.get(t)
            if kt is not None and kt < INFINITE:
                heap.extend((min(kt + 1, LONGEST), p) for p in ps)
        waiting = [0] * len(calls)  # per call: its arguments not settled yet
        uses: dict[int, list[int]] = {}  # state -> the calls that wait for it
        for i, (g, a, b) in enumerate(calls):
            ka, kb = known.get(a), known.get(b)
            if (ka is not None and ka >= INFINITE) or (kb is not None and kb >= INFINITE):
                continue  # a constant argument that never completes: the call never does
            if ka is not None and kb is not None:
                heap.append((min(ka + kb, LONGEST), g))
                continue
            pending = (a,) if a == b or kb is not None else (b,) if ka is not None else (a, b)
            waiting[i] = len(pending)
            for x in pending:
                uses.setdefault(x, []).append(i)
        heapq.heapify(heap)
        settled: dict[int, int] = {}
        while heap:
            v, x = heapq.heappop(heap)
            if x in settled:
                continue
            settled[x] = v
            step = min(v + 1, LONGEST)
            for p in preds.get(x, ()):
                if p not in settled:
                    heapq.heappush(heap, (step, p))
            for i in uses.get(x, ()):
                waiting[i] -= 1
                if waiting[i] == 0:
                    g, a, b = calls[i]
                    if g not in settled:
                        va = settled[a] if a in settled else known[a]
                        vb = settled[b] if b in settled else known[b]
                        heapq.heappush(heap, (_plus(va, vb), g))
        for g in new:
            known[g] = settled.get(g, INFINITE)

    def _too_much(self, new: list[int], *, timed_out: bool) -> CompileLimitError:
        """The error for an exploring solve that expanded too many rule states (``timed_out``:
        ran out of time), naming the rule most of ``new`` belong to."""
        rt = self.runtime
        rules = rt.tab.state_rule[np.asarray(new, dtype=np.int64)]
        r = int(np.bincount(rules[rules >= 0]).argmax()) if (rules >= 0).any() else rt.grammar.root
        return self._limit_error(r, len(new), timed_out=timed_out)

    def _limit_error(self, r: int, states: int, *, timed_out: bool) -> CompileLimitError:
        """The error for a solve stopped after ``states`` automaton states in rule ``r``
        (``timed_out``: by its time limit, else by its state bound), naming the rule and its
        place in the source."""
        rt = self.runtime
        src = rt.grammar.rule_sources[r]
        where = f"rule {src.rule!r}"
        if src.line is not None:
            where += f" (line {src.line})"
        if src.pointer is not None:
            where += f", schema location {src.pointer}"
        if src.keyword is not None:
            where += f", keyword {src.keyword!r}"
        advice = ("the constraint's automaton has too many states to bound the length of its outputs; "
                  "simplify it, or pass on_budget='cut', which needs no such check")
        if timed_out:
            return CompileTimeoutError(
                f"the token-budget check ran past its deadline (its time limit of {self.timeout_s:g} s, "
                f"CompileOptions.timeout_s, or the request's own) after {states} automaton states "
                f"in {where}: {advice}",
                pointer=src.pointer, keyword=src.keyword, rule=src.rule)
        return CompileLimitError(
            f"the token-budget check needed more than {self.max_solve_states} automaton states "
            f"(its bound for this grammar: {SOLVE_STATES_PER_STATE} per compiled state, at least "
            f"{MIN_SOLVE_STATES}, at most CompileOptions.max_states) in {where}: {advice}",
            pointer=src.pointer, keyword=src.keyword, rule=src.rule)

    def state_distance(self, g: int) -> int:
        """``d(g)``: fewest bytes from rule state ``g`` to where its rule may return."""
        got = self._state.get(g)
        if got is None:
            with self.runtime.lock:
                got = self._state.get(g)
                if got is None:
                    got = self._measure(g)
        return got

    def _stack_distance(self, s: int) -> int:
        got = self._stack.get(s)
        if got is not None:
            return got
        frames = self.runtime.tab.frames
        chain = []
        x = s
        while x != _ROOT and x not in self._stack:
            chain.append(x)
            x = int(frames[x, 0])
        total = 0 if x == _ROOT else self._stack[x]
        for y in chain:
            g = int(frames[y, 1])
            if g not in self._state:
                self._measure(g)
        frames = self.runtime.tab.frames
        for y in reversed(chain):
            total = _plus(total, self._state[int(frames[y, 1])])
            self._stack[y] = total
        return total

    def distance(self, cid: int) -> int:
        """``D(cid)``: the fewest bytes from configuration ``cid`` to acceptance
        (:data:`INFINITE` when it cannot accept; ``cid`` < 0 is dead; :data:`LONGEST`: at
        least that many). Raises what a solve raises (see :meth:`_solve`)."""
        if cid < 0:
            return INFINITE
        got = self._config.get(cid)
        if got is not None:
            return got
        rt = self.runtime
        with rt.lock:
            if rt.is_accepting(cid):
                best = 0
            else:
                best = INFINITE
                for s in rt.stacks(cid):
                    best = min(best, self._stack_distance(s))
            self._config[cid] = best
        return best

    def next_byte(self, cid: int) -> tuple[int, int] | None:
        """(the first byte of the first shortest completion of ``cid``, the configuration
        after it); None when ``cid`` accepts or cannot. Raises CompileLimitError when the
        completion is too long to be measured (:data:`LONGEST` bytes or more)."""
        got = self._next.get(cid)
        if got is not None:
            return got
        rt = self.runtime
        with rt.lock:
            k = self.distance(cid)
            if k == 0 or k >= INFINITE:
                return None
            if k >= LONGEST:
                raise CompileLimitError(f"the shortest completion is {LONGEST} bytes or longer: "
                                        "it cannot be spelled")
            rt.fill_row(cid)
            row = rt.tab.trans[cid]
            tried: set[int] = set()
            for b in np.flatnonzero(row >= 0).tolist():  # ascending: the smallest byte first
                t = int(row[b])
                if t in tried:
                    continue
                tried.add(t)
                if self.distance(t) == k - 1:
                    got = self._next[cid] = (b, t)
                    return got
            raise RuntimeError(f"no byte shortens the completion of configuration {cid}")  # pragma: no cover

    def completion(self, cid: int, limit: int | None = None) -> bytes | None:
        """The first (byte-wise smallest) shortest byte string from configuration ``cid`` to
        acceptance, or its first ``limit`` bytes; None when there is none. Costs time and
        table space in proportion to the bytes spelled: compare :meth:`distance` with what
        you can afford first."""
        k = self.distance(cid)
        if k >= INFINITE:
            return None
        out = bytearray()
        c = cid
        n = k if limit is None else min(k, max(limit, 0))
        while len(out) < n:
            got = self.next_byte(c)
            if got is None:  # pragma: no cover - D is exact
                break
            out.append(got[0])
            c = got[1]
        return bytes(out)
