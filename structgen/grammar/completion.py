"""Shortest completions: the exact minimum number of bytes from a configuration to acceptance.

Per rule state ``g`` (a state of one rule's DFA) ``d(g)`` is the fewest bytes that take the
rule from ``g`` to a state where it may return: 0 where it may return already, else the
minimum of ``1 + d(g')`` over its byte edges and ``d(callee start) + d(return state)`` over
its calls (a call costs the called rule's shortest yield). That is a system of min-plus
equations over the rule states reachable from ``g``. Every right-hand side is at least each
of its arguments, so Knuth's generalisation of Dijkstra's algorithm solves it exactly, each
state settled once in increasing order of ``d`` (Knuth, "A generalization of Dijkstra's
algorithm", 1977): time about linear in the states and edges, whatever the length of the
completions. Each new batch of states is solved with the earlier ones as constants, since a
state's reachable set is closed. A counted repetition ``item{lo,hi}`` is answered in closed
form (bytes to finish the current item, plus the items still missing times the shortest
item), so that its possibly many count states are never enumerated.

A stack needs the sum of ``d`` over its frames (the top frame's state, the return states
below); a configuration the minimum over its stacks (0 when it is accepting). These are
exact: the configuration graph is deterministic and every stack completes independently.
Lengths are exact below :data:`LONGEST` and saturate there (a grammar of forty rules, each
twice the one below, has a shortest sentence of 2^40 bytes): ``LONGEST`` reads "at least
that many bytes".

The work is bounded, since a hostile constraint can make it unbounded: a pattern such as
``(a|b)*a(a|b){20}`` is a few NFA states whose lazily built DFA has 2^21 states, every one
reachable. One solve expands at most :func:`solve_bound` new rule states -- in proportion to
the compiled grammar's size, so that the check costs no more than the compilation it
follows -- reads :func:`structgen.limits.check` (cancellation) every few hundred states and
stops at the compile timeout (``CompileOptions.timeout_s``, brought forward to the
request's deadline). Past either it raises :class:`~structgen.errors.CompileLimitError`
(:class:`~structgen.errors.CompileTimeoutError`) naming the rule whose states it was
expanding and, through :attr:`~structgen.grammar.compiled.CompiledGrammar.rule_sources`, its
place in the source (a JSON schema pointer and keyword, a Lark rule and line).

:meth:`CompletionLengths.completion` gives the *first* shortest completion: from ``c`` the
smallest byte ``b`` with ``D(c.b) = D(c) - 1``, repeated. Consuming a prefix of it leaves
exactly the rest as the first shortest completion of the state reached, which the
token-level budget (:mod:`structgen.masks.budget`) relies on. It is spelled one byte at a
time (each step memoised per configuration, so the bytes of a long completion are not kept
once per suffix), and only as far as a caller asks: spelling costs time and table space in
proportion to its length, so callers compare :meth:`~CompletionLengths.distance` with what
they can afford first.

Everything is keyed by table ids, so it is dropped when the runtime flushes its tables
(the runtime's ``on_flush`` hook); the counted rules' item distances are static and kept.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from structgen import limits
from structgen.errors import CompileLimitError, CompileTimeoutError
from structgen.grammar import _runtime_kernels as K

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


def completion_lengths(runtime: Any) -> CompletionLengths:
    """The :class:`CompletionLengths` of ``runtime`` (built on first use, kept on it)."""
    got = getattr(runtime, "completion_lengths", None)
    if got is None:
        with runtime.lock:
            got = getattr(runtime, "completion_lengths", None)
            if got is None:
                got = CompletionLengths(runtime)
                runtime.completion_lengths = got
    return got


def solve_bound(grammar: Any) -> int:
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


def _table_distances(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """Fewest bytes from each state of a DFA table (-1 = dead edge) to an accepting state."""
    n = trans.shape[0]
    dist = np.where(np.asarray(accept, dtype=bool), 0, INFINITE).astype(np.int64)
    live = trans >= 0
    tgt = np.where(live, trans, 0)
    while True:
        via = np.where(live, dist[tgt] + 1, INFINITE).min(axis=1) if n else dist
        new = np.minimum(dist, via)
        if np.array_equal(new, dist):
            return dist
        dist = new


class CompletionLengths:
    """Exact shortest-completion lengths (bytes) of one runtime's configurations; see the
    module docstring. Thread-safe through the runtime's lock; ids are of the current epoch.

    ``max_solve_states`` is the work bound of one solve (:func:`solve_bound`), ``timeout_s``
    its time limit; ``largest_solve`` the most rule states one solve has expanded so far (a
    measure of how near the bound the grammar comes)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        grammar = runtime.grammar
        self.max_solve_states = solve_bound(grammar)
        self.timeout_s = float(grammar.options.timeout_s)
        self.largest_solve = 0
        self._state: dict[int, int] = {}  # rule state -> d
        self._stack: dict[int, int] = {}  # stack -> sum of d over its frames
        self._config: dict[int, int] = {}  # configuration -> D
        self._next: dict[int, tuple[int, int]] = {}  # configuration -> (first byte, configuration after it)
        self._counted: dict[int, tuple[np.ndarray, int]] = {}  # rule -> (item distances, shortest item)
        runtime.on_flush.append(self._forget)

    def _forget(self) -> None:
        """Drop everything keyed by table ids (the runtime flushed its tables)."""
        self._state.clear()
        self._stack.clear()
        self._config.clear()
        self._next.clear()

    # -- rule states ----------------------------------------------------------------------
    def _counted_distance(self, r: int, g: int) -> int:
        tab = self.runtime.tab
        got = self._counted.get(r)
        if got is None:
            rule = self.runtime.rules[r]
            dist = _table_distances(np.asarray(rule._trans), np.asarray(rule._accept))
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
        """Compute ``d`` for ``roots`` and every rule state they reach (hold the lock).
        Raises CompileLimitError past :attr:`max_solve_states` new states, CompileTimeoutError
        past the time limit, RequestCancelledError when the request is cancelled."""
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
                    got = preds.get(t)
                    if got is None:
                        preds[t] = [g]
                    else:
                        got.append(g)
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
            v = known.get(t)
            if v is not None and v < INFINITE:
                heap.extend((min(v + 1, LONGEST), p) for p in ps)
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
                got = uses.get(x)
                if got is None:
                    uses[x] = [i]
                else:
                    got.append(i)
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
        """The error for a solve that expanded too many rule states (``timed_out``: ran out of
        time), naming the rule most of ``new`` belong to and its place in the source."""
        rt = self.runtime
        rules = rt.tab.state_rule[np.asarray(new, dtype=np.int64)]
        r = int(np.bincount(rules[rules >= 0]).argmax()) if (rules >= 0).any() else rt.grammar.root
        src = rt.grammar.rule_sources[r]
        where = f"rule {src.rule!r}"
        if src.line is not None:
            where += f" (line {src.line})"
        if src.pointer is not None:
            where += f", schema location {src.pointer}"
        if src.keyword is not None:
            where += f", keyword {src.keyword!r}"
        advice = ("the constraint's automaton has too many states to bound the length of its outputs; "
                  "simplify it (a pattern such as (a|b)*a(a|b){20} has 2^21), or pass on_budget='cut', "
                  "which needs no such check")
        if timed_out:
            return CompileTimeoutError(
                f"the token-budget check ran past its deadline (its time limit of {self.timeout_s:g} s, "
                f"CompileOptions.timeout_s, or the request's own) after {len(new)} automaton states "
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
                self._solve([g])
                got = self._state[g]
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
        missing = [int(frames[y, 1]) for y in chain if int(frames[y, 1]) not in self._state]
        if missing:
            self._solve(missing)
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
