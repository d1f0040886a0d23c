"""Shortest completions: the exact minimum number of bytes from a configuration to acceptance.

Per rule state ``g`` (a state of one rule's DFA) ``d(g)`` is the fewest bytes that take the
rule from ``g`` to a state where it may return: 0 where it may return already, else the
minimum of ``1 + d(g')`` over its byte edges and ``d(callee start) + d(return state)`` over
its calls (a call costs the called rule's shortest yield). That is a system of min-plus
equations over the rule states reachable from ``g``; it is solved by Bellman-Ford
iteration over the states met so far (each new batch of states solved with the earlier ones
as constants, since a state's reachable set is closed). A counted repetition ``item{lo,hi}``
is answered in closed form (bytes to finish the current item, plus the items still missing
times the shortest item), so that its possibly many count states are never enumerated.

A stack needs the sum of ``d`` over its frames (the top frame's state, the return states
below); a configuration the minimum over its stacks (0 when it is accepting). These are
exact: the configuration graph is deterministic and every stack completes independently.

:meth:`CompletionLengths.completion` gives the *first* shortest completion: from ``c`` the
smallest byte ``b`` with ``D(c.b) = D(c) - 1``, repeated. Consuming a prefix of it leaves
exactly the rest as the first shortest completion of the state reached, which the
token-level budget (:mod:`structgen.masks.budget`) relies on.

Everything is keyed by table ids, so it is dropped when the runtime flushes its tables
(the runtime's ``on_flush`` hook); the counted rules' item distances are static and kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from structgen.grammar import _runtime_kernels as K

__all__ = ["CompletionLengths", "INFINITE", "completion_lengths"]

#: The distance of a state from which the grammar cannot accept.
INFINITE = 1 << 40
_ROOT = 0  # the empty stack


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
    module docstring. Thread-safe through the runtime's lock; ids are of the current epoch."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self._state: dict[int, int] = {}  # rule state -> d
        self._stack: dict[int, int] = {}  # stack -> sum of d over its frames
        self._config: dict[int, int] = {}  # configuration -> D
        self._first: dict[int, bytes] = {}  # configuration -> its first shortest completion
        self._counted: dict[int, tuple[np.ndarray, int]] = {}  # rule -> (item distances, shortest item)
        runtime.on_flush.append(self._forget)

    def _forget(self) -> None:
        """Drop everything keyed by table ids (the runtime flushed its tables)."""
        self._state.clear()
        self._stack.clear()
        self._config.clear()
        self._first.clear()

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
        return min(INFINITE, rest + missing * shortest)

    def _solve(self, roots: list[int]) -> None:
        """Compute ``d`` for ``roots`` and every rule state they reach (hold the lock)."""
        rt = self.runtime
        known = self._state
        order: list[int] = []
        index: dict[int, int] = {}
        byte_src: list[int] = []
        byte_dst: list[int] = []
        calls: list[tuple[int, int, int]] = []
        fixed: dict[int, int] = {}
        work = [g for g in roots if g not in known]
        while work:
            g = work.pop()
            if g in index or g in known:
                continue
            index[g] = len(order)
            order.append(g)
            rt.expand(g)
            tab = rt.tab
            r = int(tab.state_rule[g])
            if tab.rule_kind[r] == K.COUNTED:
                fixed[g] = self._counted_distance(r, g)
                continue
            if tab.state_flags[g] & K.ACCEPT:
                fixed[g] = 0
            for t in set(tab.state_trans[g].tolist()):
                if t < 0:
                    continue
                byte_src.append(g)
                byte_dst.append(t)
                work.append(t)
            st, n = int(tab.state_calls[g, 0]), int(tab.state_calls[g, 1])
            for callee, ret in tab.call_targets[st:st + n].tolist():
                calls.append((g, callee, ret))
                work.append(callee)
                work.append(ret)
        if not order:
            return
        n = len(order)
        # unknown states get slots 0..n-1; known ones are appended as constants
        consts = sorted({x for x in byte_dst + [c for _, a, b in calls for c in (a, b)] if x not in index})
        for x in consts:
            index[x] = len(index)
        dist = np.full(len(index), INFINITE, dtype=np.int64)
        for x in consts:
            dist[index[x]] = known[x]
        for g, v in fixed.items():
            dist[index[g]] = v
        bs = np.array([index[x] for x in byte_src], dtype=np.int64)
        bd = np.array([index[x] for x in byte_dst], dtype=np.int64)
        cs = np.array([index[x] for x, _, _ in calls], dtype=np.int64)
        ca = np.array([index[x] for _, x, _ in calls], dtype=np.int64)
        cr = np.array([index[x] for _, _, x in calls], dtype=np.int64)
        while True:
            new = dist.copy()
            if bs.size:
                np.minimum.at(new, bs, dist[bd] + 1)
            if cs.size:
                np.minimum.at(new, cs, dist[ca] + dist[cr])
            np.minimum(new, INFINITE, out=new)
            if np.array_equal(new, dist):
                break
            dist = new
        for g in order:
            known[g] = int(dist[index[g]])

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
            total = min(INFINITE, total + self._state[int(frames[y, 1])])
            self._stack[y] = total
        return total

    def distance(self, cid: int) -> int:
        """``D(cid)``: the fewest bytes from configuration ``cid`` to acceptance
        (:data:`INFINITE` when it cannot accept; ``cid`` < 0 is dead)."""
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

    def completion(self, cid: int) -> bytes | None:
        """The first (byte-wise smallest) shortest byte string from configuration ``cid`` to
        acceptance; None when there is none."""
        got = self._first.get(cid)
        if got is not None:
            return got
        rt = self.runtime
        with rt.lock:
            path: list[int] = []
            out = bytearray()
            c = cid
            while True:
                tail = self._first.get(c)
                if tail is not None:
                    break
                k = self.distance(c)
                if k >= INFINITE:
                    return None
                if k == 0:
                    tail = b""
                    break
                rt.fill_row(c)
                row = rt.tab.trans[c]
                live = np.nonzero(row >= 0)[0]
                # each distinct successor once, with the smallest byte leading to it
                targets, first = np.unique(row[live], return_index=True)
                nxt, c2 = 256, -1
                for t, i in zip(targets.tolist(), first.tolist()):
                    b = int(live[i])
                    if b < nxt and self.distance(t) == k - 1:
                        nxt, c2 = b, t
                if c2 < 0:
                    nxt = -1
                if nxt < 0:  # pragma: no cover - D is exact; a failure here is a bug
                    raise RuntimeError(f"no byte shortens the completion of configuration {c}")
                path.append(c)
                out.append(nxt)
                c = c2
            full = bytes(out) + tail
            for i, pc in enumerate(path):
                self._first[pc] = full[i:]
            self._first[c] = tail
            return self._first[cid]
