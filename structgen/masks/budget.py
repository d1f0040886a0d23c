"""Closing within a token budget: the masks that keep a complete output within ``max_new_tokens``.

For a configuration ``c`` let ``w(c)`` be its first shortest completion in bytes
(:meth:`structgen.grammar.completion.CompletionLengths.completion`) and ``U(c)`` the number of
tokens of the greedy longest-match tokenization of ``w(c)`` over the vocabulary (0 when ``c``
accepts). ``U(c)`` bounds the tokens needed to reach acceptance from ``c``; every token of that
tokenization is grammar-allowed, since masks are byte-exact. Consuming a prefix of ``w(c)``
leaves its rest as the first shortest completion of the state reached, and greedy tokenization
of a string minus its first greedy token is the rest of its greedy tokenization: so with
``t1`` the first greedy token of ``w(c)``, ``U(c.t1) = U(c) - 1``.

The rule, with ``R`` tokens of budget left counting the current position: a token ``t`` is
allowed when the grammar allows it and ``U(c.t) + 1 <= R - 1`` (its completion plus EOS still
fits); EOS where the grammar accepts. If ``U(c) + 1 <= R`` holds at the start it holds at every
step (``t1``, or EOS where ``c`` accepts, is always allowed), so every output ends with EOS on
an accepted document within the budget. The rule depends only on (configuration, ``R``),
never on logits, so speculative decoding under it stays token-identical to plain decoding.

Per configuration the table keeps ``U(c)`` and the largest ``U(c.t)`` over the allowed tokens
(the *worst* next need): where ``R - 2`` is at least that, the rule removes nothing and the
grammar's mask is used as is; that check is a dictionary lookup once a configuration has been
met. The first time it is met, every allowed token's end configuration is found by one walk of
the vocabulary trie (:func:`structgen.masks.trie.walk_ends`).

Far from the end of the budget the exact ``U`` of each end is not needed: when every byte value
is a token of its own, each step of the greedy tokenization consumes at least one byte, so
``U(x) <= D(x)``, the byte length of the shortest completion
(:meth:`~structgen.grammar.completion.CompletionLengths.distance`, much cheaper than spelling the
completion and tokenizing it). The largest ``D`` over the ends bounds the worst next need; where
``R - 2`` is at least that bound the rule removes nothing, and ``U`` is computed only for
configurations met closer to the end. The same bound answers :meth:`BudgetTable.allows` for a
draft token far from the end. Everything is keyed by configuration ids and dropped with the
runtime's tables.

Close to the end only whether ``U`` fits matters, never how far it overshoots, and a hostile
constraint can make ``w(c)`` enormous (a string of ``minLength`` 10^9). So every count takes
the budget it is compared with (:meth:`BudgetTable.tokens_needed`'s ``cap``): with ``Lmax``
the longest token's length, no tokenization of ``D`` bytes has fewer than ``ceil(D / Lmax)``
tokens, so where that exceeds the cap the answer is "more than the cap" without spelling a
byte; otherwise the completion is spelled and tokenized together, and counting stops once it
passes the cap. A count above the cap is a lower bound and is never kept as if exact (the
table is shared by requests with different budgets); a verdict ``U(c.t) <= R - 2`` is the same
either way. No count spells more than about ``(cap + 2) * Lmax`` bytes.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from structgen.grammar.completion import INFINITE, LONGEST, completion_lengths
from structgen.masks import trie as native

if TYPE_CHECKING:  # pragma: no cover
    from structgen.masks.engine import Engine
    from structgen.masks.vocab_table import VocabTable

__all__ = ["BudgetTable", "UNREACHABLE"]

#: Tokens needed from a configuration that cannot reach acceptance (or whose shortest
#: completion has a byte no token spells).
UNREACHABLE = 1 << 30
_NEXT_KEPT = 256  # per-token needs kept (one per configuration: the live tokens only)
_MASKS_KEPT = 256  # narrowed masks kept, per (configuration, threshold)


#: What a budget table needs of a vocabulary (see :func:`_vocab_part`)
_VocabPart = tuple[dict[bytes, int], list[list[int]], NDArray[np.int64], NDArray[np.bool_],
                   "native.Trie | None"]
_VOCAB_PARTS: weakref.WeakKeyDictionary[VocabTable, _VocabPart] = weakref.WeakKeyDictionary()
_VOCAB_LOCK = threading.Lock()


def _vocab_part(vt: VocabTable, compiled: bool) -> _VocabPart:
    """What a budget table needs of a vocabulary, built once per vocabulary: the tokens by
    their bytes (EOS left out) for greedy tokenization, the longest token's length, the
    walk's token slots (ids, and which are EOS) and the trie (None without compiled walks)."""
    with _VOCAB_LOCK:
        got = _VOCAB_PARTS.get(vt)
        if got is None or (got[4] is None) == compiled:
            eos = set(int(e) for e in vt.eos_ids.tolist())
            by_bytes: dict[bytes, int] = {}
            for tid, b in enumerate(vt.token_bytes[: vt.vocab_size]):
                if b and tid not in eos and b not in by_bytes:
                    by_bytes[bytes(b)] = tid
            # per first byte, the lengths of the tokens starting with it, longest first
            lens: list[set[int]] = [set() for _ in range(256)]
            for b in by_bytes:
                lens[b[0]].add(len(b))
            by_first = [sorted(x, reverse=True) for x in lens]
            trie = vt.trie() if compiled else None
            slots = np.asarray(trie.slot_ids if trie is not None else vt.flat_ids, dtype=np.int64)
            got = _VOCAB_PARTS[vt] = (by_bytes, by_first, slots, np.isin(slots, vt.eos_ids), trie)
        return got


class BudgetTable:
    """The budget rule's numbers for one (grammar, vocabulary): see the module docstring.
    Build it with :meth:`structgen.masks.engine.Engine.budget_table`; call it holding the
    runtime's lock, with configuration ids of the current epoch."""

    def __init__(self, engine: Engine, vt: VocabTable) -> None:
        self.runtime = engine.runtime
        self.vt = vt
        self.lengths = completion_lengths(self.runtime)
        part = _vocab_part(vt, engine.native)
        self._by_bytes, self._by_first, self._slot_ids, self._slot_eos, self._trie = part
        # U(x) <= D(x) holds when every byte value is a token of its own (module docstring)
        self._bytes_bound = all(bytes([b]) in self._by_bytes for b in range(256))
        #: the longest token's length in bytes: no tokenization of D bytes has fewer than D / max_len tokens
        self.max_len = max((ln[0] for ln in self._by_first if ln), default=1)
        self._need: dict[int, int] = {}  # configuration -> U (exact values only)
        # configuration -> (its worst next need, the cap it was counted with: exact when at most
        # the cap, else only known to be above it; None: no cap)
        self._worst: dict[int, tuple[int, int | None]] = {}
        self._bound: dict[int, int] = {}  # configuration -> an upper bound of its worst next need
        # configuration -> (live token slots, U after each, the cap they were counted with):
        # vocabulary-sized arrays are not kept
        self._next: OrderedDict[int, tuple[NDArray[np.int64], NDArray[np.int32], int | None]] = OrderedDict()
        self._live: OrderedDict[int, tuple[NDArray[np.int64], NDArray[np.int32]]] = OrderedDict()
        self._masks: OrderedDict[tuple[int, int], NDArray[np.uint32]] = OrderedDict()
        self._walk_out = np.empty(self._slot_ids.size, dtype=np.int32)  # reused by every walk

    def forget(self) -> None:
        """Drop everything keyed by configuration ids (the runtime flushed its tables)."""
        self._need.clear()
        self._worst.clear()
        self._bound.clear()
        self._next.clear()
        self._live.clear()
        self._masks.clear()

    def _longest(self, data: bytes, i: int) -> int:
        """Length of the longest token spelling a prefix of ``data[i:]`` (0: none)."""
        rest = len(data) - i
        by = self._by_bytes
        for ln in self._by_first[data[i]]:
            if ln <= rest and data[i:i + ln] in by:
                return ln
        return 0

    def _at_least(self, distance: int) -> int:
        """Fewest tokens any tokenization of ``distance`` bytes has (no token is longer than
        :attr:`max_len`), below UNREACHABLE."""
        return min(-(-distance // self.max_len), UNREACHABLE - 1)

    def tokens_needed(self, cid: int, cap: int | None) -> int:
        """``U(cid)``: tokens of the greedy tokenization of the first shortest completion
        (0 when ``cid`` accepts; UNREACHABLE when none exists or cannot be spelled), exact
        when it is at most ``cap``. Above ``cap`` the answer may be a lower bound (still above
        ``cap``, below UNREACHABLE): counting stops there, so that the work is about ``cap``
        tokens however long the completion. ``cap`` None counts to the end (the time and
        table space grow with the completion's length), but for a completion too long to
        measure (:data:`~structgen.grammar.completion.LONGEST` bytes or more), which is never
        spelled: its count is a lower bound too.

        Exact answers are memoised at every token boundary of that tokenization too: the
        configuration after its first ``j`` tokens has the rest of the completion as its own
        first shortest completion, and the rest of the tokenization as that one's."""
        need = self._need
        got = need.get(cid)
        if got is not None:
            return got
        lengths = self.lengths
        left = lengths.distance(cid)  # bytes of the completion (INFINITE for cid < 0)
        if left >= INFINITE or left == 0:
            need[cid] = UNREACHABLE if left else 0
            return need[cid]
        if (cap is not None and self._at_least(left) > cap) or left >= LONGEST:
            return self._at_least(left)  # too long to spell, or to need counting
        seen: list[tuple[int, int]] = []  # (configuration at a token boundary, tokens before it)
        ahead = b""  # the completion's bytes spelled past the boundary ...
        ends: list[int] = []  # ... and the configuration after each of them
        tail = cid  # the configuration after the last byte spelled
        c, n = cid, 0
        while True:
            known = need.get(c)
            if known is not None:
                total = n + known
                break
            if left == 0:
                total = n
                break
            if cap is not None and n > cap:
                return min(n + self._at_least(left), UNREACHABLE - 1)
            seen.append((c, n))
            if len(ahead) < self.max_len:  # spell as far as the longest token reaches
                more = bytearray()
                while len(ahead) + len(more) < self.max_len:
                    step = lengths.next_byte(tail)
                    if step is None:
                        break
                    more.append(step[0])
                    tail = step[1]
                    ends.append(tail)
                ahead += bytes(more)
            ln = self._longest(ahead, 0)
            if not ln:
                total = UNREACHABLE
                break
            c = ends[ln - 1]
            ahead = ahead[ln:]
            del ends[:ln]
            left -= ln
            n += 1
        for x, before in seen:
            need[x] = total if total >= UNREACHABLE else total - before
        need.setdefault(cid, total)
        return need[cid]

    def _ends(self, cid: int) -> NDArray[np.int32]:
        """Per token slot, the configuration its bytes lead to from ``cid`` (-1: rejected).
        The array is a buffer reused by the next call."""
        if self._trie is not None:
            return native.walk_ends(self.runtime, self._trie, cid, out=self._walk_out)
        rt = self.runtime
        out = self._walk_out
        out.fill(-1)
        tb = self.vt.token_bytes
        for q, tid in enumerate(self._slot_ids.tolist()):
            c = cid
            for b in tb[tid]:
                c = rt.step(c, b)
                if c < 0:
                    break
            out[q] = c
        return out

    def _live_ends(self, cid: int) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
        """(the token slots that ``cid`` allows, EOS left out; the configuration each leads to)."""
        got = self._live.get(cid)
        if got is not None:
            self._live.move_to_end(cid)
            return got
        ends = self._ends(cid)
        ends[self._slot_eos] = -1
        slots = np.flatnonzero(ends >= 0)
        got = (slots, ends[slots].copy())
        self._live[cid] = got
        if len(self._live) > _NEXT_KEPT:
            self._live.popitem(last=False)
        return got

    def _live_needs(self, cid: int, cap: int | None) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
        """(the token slots ``cid`` allows, EOS left out; ``U`` of the configuration after each,
        exact up to ``cap`` and only known to be above it beyond, see :meth:`tokens_needed`)."""
        got = self._next.get(cid)
        if got is not None and (got[2] is None or (cap is not None and cap <= got[2])):
            # counted with a cap at least this one: what was above it is above this one too
            self._next.move_to_end(cid)
            return got[0], got[1]
        slots, at = self._live_ends(cid)
        need = np.full(slots.size, UNREACHABLE, dtype=np.int32)
        if slots.size:
            # the distinct end configurations (small ids: a count table, no sort)
            uniq = np.flatnonzero(np.bincount(at))
            per = np.zeros(int(uniq[-1]) + 1, dtype=np.int32)
            per[uniq] = [min(self.tokens_needed(int(c), cap), UNREACHABLE) for c in uniq.tolist()]
            need = per[at]
        self._next[cid] = (slots, need, cap)
        if len(self._next) > _NEXT_KEPT:
            self._next.popitem(last=False)
        # UNREACHABLE when a live token leads to where no completion is spelled
        self._worst[cid] = (int(need.max()) if need.size else -1, cap)
        return slots, need

    def next_needs(self, cid: int, cap: int | None = None) -> NDArray[np.int32]:
        """Per token slot, ``U`` of the configuration after that token (UNREACHABLE where
        the token is rejected; EOS slots too: EOS is decided by acceptance alone); exact up
        to ``cap``, above it only known to be above (None: exact, whatever it costs)."""
        slots, need = self._live_needs(cid, cap)
        out = np.full(self._slot_ids.size, UNREACHABLE, dtype=np.int32)
        out[slots] = need
        return out

    def worst_next(self, cid: int, cap: int | None = None) -> int:
        """The largest ``U`` over the configurations the allowed tokens lead to (-1 when only
        EOS is allowed): exact when at most ``cap``, else a number above ``cap`` (None: exact,
        whatever it costs)."""
        got = self._worst.get(cid)
        if got is not None:
            value, used = got
            if used is None or value <= used or (cap is not None and cap <= used):
                return value
        self._live_needs(cid, cap)
        return self._worst[cid][0]

    def worst_bound(self, cid: int) -> int | None:
        """An upper bound of :meth:`worst_next` that costs no tokenization: the largest
        shortest-completion length in bytes over the allowed tokens' ends where every byte is
        a token (module docstring), or the exact worst need where already known; None where
        neither is at hand."""
        got = self._worst.get(cid)
        if got is not None and (got[1] is None or got[0] <= got[1]):
            return got[0]
        got2 = self._bound.get(cid)
        if got2 is not None:
            return got2
        if not self._bytes_bound:
            return None
        _, at = self._live_ends(cid)
        if at.size == 0:
            bound = -1
        else:
            dist = self.lengths.distance
            bound = max(dist(int(c)) for c in np.flatnonzero(np.bincount(at)).tolist())
            bound = UNREACHABLE if bound >= INFINITE else bound
        self._bound[cid] = bound
        return bound

    def _room(self, cid: int, threshold: int) -> bool:
        """Whether every allowed token's need is at most ``threshold`` (the rule removes
        nothing), counting no further than the threshold."""
        bound = self.worst_bound(cid)
        if bound is not None and bound <= threshold:
            return True
        return self.worst_next(cid, max(threshold, -1)) <= threshold

    def narrows(self, cid: int, budget: int) -> bool:
        """Whether the rule removes a grammar-allowed token at ``cid`` with ``budget`` tokens
        left (this position included)."""
        return not self._room(cid, budget - 2)

    def allows(self, cid: int, after: int, budget: int) -> bool:
        """Whether a token from ``cid`` to configuration ``after`` (not EOS) keeps the rule
        with ``budget`` tokens left (this position included)."""
        if after < 0:
            return False
        thr = budget - 2
        if self._bytes_bound and after not in self._need and self.lengths.distance(after) <= thr:
            return True  # U(after) <= D(after)
        return self.tokens_needed(after, max(thr, -1)) <= thr

    def mask(self, cid: int, words: NDArray[np.uint32], budget: int) -> NDArray[np.uint32]:
        """The grammar's mask ``words`` (packed uint32) of ``cid`` narrowed by the rule with
        ``budget`` tokens left (this position included); ``words`` itself when the rule
        removes nothing."""
        thr = budget - 2
        if self._room(cid, thr):
            return words
        thr = max(thr, -1)
        key = (cid, thr)
        got = self._masks.get(key)
        if got is not None:
            self._masks.move_to_end(key)
            return got
        slots, need = self._live_needs(cid, thr)
        keep = np.zeros(self.vt.num_words * 32, dtype=bool)
        keep[self._slot_ids[slots[need <= thr]]] = True
        keep[self.vt.eos_ids] = True  # EOS: as the grammar's mask says (where it accepts)
        out = words & np.packbits(keep, bitorder="little").view(np.uint32)
        self._masks[key] = out
        if len(self._masks) > _MASKS_KEPT:
            self._masks.popitem(last=False)
        return out

