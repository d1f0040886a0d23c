"""Bounded-horizon classes of rule states: which states may share one vocabulary walk.

Two rule states of one rule that behave alike on every input of at most ``depth`` symbols
(bytes or calls) are interchangeable for any token of at most ``depth`` bytes, as long as
every call consumes at least one byte: walking the token from either visits states with the
same acceptance, the same byte partition and the same callees, so the rooted split walks of
:class:`structgen.masks.engine.Engine` (and masks) from them are equal. :class:`HorizonClasses`
finds a representative per class (the engine files walks under it) and memoises what it
learnt; its ids are the runtime's, so the engine calls :meth:`HorizonClasses.forget` when the
runtime flushes its tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from structgen.grammar.runtime import ACCEPT, COUNTED, ROOT
from structgen.masks import trie as native

if TYPE_CHECKING:  # pragma: no cover
    from structgen.grammar.runtime import Runtime

__all__ = ["HorizonClasses"]

_HORIZON_BUDGET = 4  # pair checks one horizon query may do, per unit of depth
_HORIZON_HOPS = 64  # predecessors followed back to a state whose class is known
_HORIZON_MEMO = 500_000  # memoised state pairs kept per engine


class _Abort(Exception):
    """A horizon query gave up (over budget, or a call that may consume nothing)."""


def _row_shape(row: NDArray[np.int32]) -> tuple[bytes, tuple[int, ...]]:
    """(rank of each byte's target among the row's distinct targets in first-occurrence
    order, as bytes; those targets) of a transition row (int32 ``[256]``)."""
    if native.available():
        lab = np.empty(256, dtype=np.uint8)
        tg = np.empty(256, dtype=np.int32)
        n = native.row_shape(row, lab, tg)
        return lab.tobytes(), tuple(tg[:n].tolist())
    uniq, first, inv = np.unique(row, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inv.reshape(-1)].astype(np.uint8).tobytes(), tuple(int(t) for t in uniq[order].tolist())


class HorizonClasses:
    """Bounded-horizon classes of one runtime's rule states (hold the runtime's lock)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._hshape: dict[int, tuple[bytes, tuple[int, ...], tuple[tuple[int, int], ...], bool]] = {}
        self._hstat: dict[int, list[int]] = {}  # rule -> [work, shared]; work -1 = off
        self._hrep_of: dict[tuple[int, int], int] = {}  # (depth, state) -> representative
        self._hpair: dict[tuple[int, int], int] = {}  # (p, q) -> depth verified equal
        self._hfail: dict[tuple[int, int], int] = {}  # (p, q) -> depth they differ at
        self._nullable: dict[int, bool] = {}  # rule start state -> may return without a byte

    @property
    def shared(self) -> dict[int, int]:
        """Per rule, how many queries found a representative other than the state itself."""
        return {r: stat[1] for r, stat in self._hstat.items()}

    def forget(self) -> None:
        """Drop everything (the runtime flushed its tables: the ids are stale)."""
        for memo in (self._hshape, self._hstat, self._hrep_of, self._hpair, self._hfail, self._nullable):
            memo.clear()

    def memory_bytes(self) -> int:
        """Approximate bytes the memos hold."""
        return 100 * (len(self._hshape) + len(self._hrep_of) + len(self._hpair) + len(self._hfail))

    def known_rep(self, q: int, depth: int) -> int:
        """The representative of ``q`` at ``depth`` known without a query: its counted class
        (:meth:`counted_rep`, arithmetic), or the one already found, else ``q``."""
        if self.shared_count(q, depth):
            return self.counted_rep(q, depth)
        return self._hrep_of.get((depth, q), q)

    def rep(self, q: int, depth: int) -> int:
        """A rule state of the same rule as ``q`` that behaves like ``q`` on every input of
        at most ``depth`` symbols (bytes or calls), or ``q`` itself.

        Such states are interchangeable for any token of at most ``depth`` bytes as long as
        every call consumes at least one byte: walking the token from either visits states
        with the same acceptance, the same byte partition and the same callees, so rooted
        split walks (and masks) from them are equal. A counted string (``maxLength``) is a
        chain of one state per character: every position at least ``depth`` characters
        away from its bounds falls in one class, so the vocabulary is walked once for them,
        not once per character.

        The class is found by going back along recorded predecessors (the state each state
        was first reached from) while each consecutive pair is equivalent (transitivity),
        to a state whose representative is known, or else the furthest one, which becomes
        the representative. Pairs are compared structurally (:meth:`_heq`), memoising how
        deep each pair was verified; a pair is verified ``depth`` deeper than asked, so
        going along a chain re-verifies only every ``depth`` states (constant amortised work
        per state). A rule whose queries cost much more than the walks they share is not
        tried again."""
        r = self.runtime.rule_of(q)
        stat = self._hstat.get(r)
        if stat is None:
            stat = self._hstat[r] = [0, 0]  # [work spent, walks shared]; work -1 = off
        if self.runtime.tab.rule_kind[r] == COUNTED:
            counted = self.counted_rep(q, depth)
            if counted != q:
                stat[1] += 1
            return counted
        if stat[0] < 0:
            return q
        got = self._hrep_of.get((depth, q))
        if got is not None:
            return got
        start = _HORIZON_BUDGET * max(depth, 1)
        budget = [start]
        path = [q]
        rep = None
        pred = self.runtime.tab.state_pred
        try:
            x = q
            for _ in range(_HORIZON_HOPS):
                p = int(pred[x])
                if p < 0 or p in path or not self._heq(p, x, depth, depth, budget):
                    break
                rep = self._hrep_of.get((depth, p))
                if rep is not None:
                    break
                path.append(p)
                x = p
                pred = self.runtime.tab.state_pred  # the tables may have grown
        except _Abort:
            stat[0] = -1
            return q
        if rep is None:
            rep = path[-1]
        stat[0] += start - budget[0]
        if rep != q:
            stat[1] += 1
        if stat[0] > _HORIZON_BUDGET * depth * (2 + 16 * stat[1]):
            stat[0] = -1  # costs more than it saves
        if len(self._hpair) + len(self._hfail) > _HORIZON_MEMO:
            self._hpair.clear()  # representatives stay valid; the pair memo is rebuilt
            self._hfail.clear()
        for x in path:
            self._hrep_of[(depth, x)] = rep
        return rep

    def shared_count(self, q: int, depth: int) -> bool:
        """Whether rule state ``q`` is a position of a counted rule ``item{lo,hi}`` whose
        class under :meth:`counted_rep` holds more than one position."""
        tab = self.runtime.tab
        r = self.runtime.rule_of(q)
        return bool(tab.rule_kind[r] == COUNTED) and int(tab.rule_lo[r]) + depth < int(tab.rule_hi[r])

    def counted_rep(self, q: int, depth: int) -> int:
        """The representative of counted-rule state ``q`` = (c, s) of ``item{lo,hi}`` on
        inputs of at most ``depth`` bytes: within them at most ``depth`` more items end, so c
        matters only through c + k >= lo and c + k < hi for k <= depth; every c in
        [lo, hi - depth - 1] behaves alike, and (lo, s) stands for them (hold the lock)."""
        tab = self.runtime.tab
        r = self.runtime.rule_of(q)
        st = int(tab.state_key[q, 0])
        c, s = int(tab.state_key_data[st]), int(tab.state_key_data[st + 1])
        lo, hi = int(tab.rule_lo[r]), int(tab.rule_hi[r])
        if c <= lo or c + depth >= hi:
            return q
        return self.runtime.intern_state(r, np.array([lo, s], dtype=np.int32))

    def _may_skip(self, g: int) -> bool:
        """Whether a call of the rule starting at rule state ``g`` may return without
        consuming a byte."""
        got = self._nullable.get(g)
        if got is None:
            got = self._nullable[g] = self.runtime.closure_accepts(self.runtime.frame(ROOT, g))
        return got

    def _hlocal(self, q: int) -> tuple[bytes, tuple[int, ...], tuple[tuple[int, int], ...], bool]:
        """(byte labels in first-occurrence order, targets in that order (-1 dead), calls,
        accepting) of rule state ``q``; raises :class:`_Abort` at a call of a rule
        that may consume nothing."""
        got = self._hshape.get(q)
        if got is None:
            self.runtime.expand(q)
            tab = self.runtime.tab
            row = tab.state_trans[q]
            c0, n = tab.state_calls[q].tolist()
            calls = tuple((int(a), int(b)) for a, b in tab.call_targets[c0:c0 + n].tolist())
            acc = bool(tab.state_flags[q] & ACCEPT)
            for callee, _q2 in calls:
                if self._may_skip(callee):
                    raise _Abort  # a call that may consume nothing: no byte bound
            got = (*_row_shape(row), calls, acc)
            self._hshape[q] = got
        return got

    def _heq(self, p: int, q: int, need: int, slack: int, budget: list[int]) -> bool:
        """Whether rule states ``p`` and ``q`` (of one rule) agree on every input of at most
        ``need`` symbols. A pair not yet verified that deep is verified ``need + slack``
        deep (memoised per pair; differences memoised with the depth they show at)."""
        if p == q:
            return True
        key = (p, q)
        if self._hpair.get(key, -1) >= need:
            return True
        f = self._hfail.get(key)
        if f is not None and f <= need:
            return False
        need += slack
        budget[0] -= 1
        if budget[0] < 0:
            raise _Abort
        lp, tp, cp, ap = self._hlocal(p)
        lq, tq, cq, aq = self._hlocal(q)
        fail = None
        if ap != aq:
            fail = 0
        elif need == 0:
            pass
        elif lp != lq or len(cp) != len(cq) or any(a[0] != b[0] for a, b in zip(cp, cq)):
            fail = 1
        else:
            pairs = [(a, b) for a, b in zip(tp, tq) if a != b] + [(a[1], b[1]) for a, b in zip(cp, cq)
                                                                  if a[1] != b[1]]
            for a, b in pairs:
                if a < 0 or b < 0:
                    fail = 1
                    break
                if not self._heq(a, b, need - 1, 0, budget):
                    fail = self._hfail[(a, b)] + 1
                    break
        if fail is not None:
            # a valid upper bound on the depth they differ at (exact where slack is 0)
            self._hfail[key] = min(fail, self._hfail.get(key, fail))
            if slack and fail > need - slack:  # they differ only deeper than asked: ask exactly
                return self._heq(p, q, need - slack, 0, budget)
            return False
        self._hpair[key] = need
        return True
