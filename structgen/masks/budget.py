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
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from structgen.grammar.completion import INFINITE, completion_lengths
from structgen.masks import trie as native

if TYPE_CHECKING:  # pragma: no cover
    from structgen.masks.engine import Engine, VocabTable

__all__ = ["BudgetTable", "UNREACHABLE"]

#: Tokens needed from a configuration that cannot reach acceptance (or whose shortest
#: completion has a byte no token spells).
UNREACHABLE = 1 << 30
_NEXT_KEPT = 256  # per-token needs kept (one per configuration: the live tokens only)
_MASKS_KEPT = 256  # narrowed masks kept, per (configuration, threshold)


_VOCAB_PARTS: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
_VOCAB_LOCK = threading.Lock()


def _vocab_part(vt: VocabTable, compiled: bool) -> tuple[Any, ...]:
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
        self._need: dict[int, int] = {}
        self._worst: dict[int, int] = {}
        self._bound: dict[int, int] = {}  # configuration -> an upper bound of its worst next need
        # configuration -> (live token slots, U after each): vocabulary-sized arrays are not kept
        self._next: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._live: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._masks: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
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

    def tokens_needed(self, cid: int) -> int:
        """``U(cid)``: tokens of the greedy tokenization of the first shortest completion
        (0 when ``cid`` accepts; UNREACHABLE when none exists or cannot be spelled).

        Memoised at every token boundary of that tokenization too: the configuration after
        its first ``j`` tokens has the rest of the completion as its own first shortest
        completion, and the rest of the tokenization as that one's."""
        need = self._need
        got = need.get(cid)
        if got is not None:
            return got
        w = self.lengths.completion(cid) if cid >= 0 else None
        if w is None:
            need[cid] = UNREACHABLE
            return UNREACHABLE
        rt = self.runtime
        seen: list[tuple[int, int]] = []  # (configuration at a token boundary, tokens before it)
        c, i, n = cid, 0, 0
        total = -1
        while i < len(w):
            known = need.get(c)
            if known is not None:
                total = n + known
                break
            seen.append((c, n))
            ln = self._longest(w, i)
            if not ln:
                total = UNREACHABLE
                break
            for b in w[i:i + ln]:
                c = rt.step(c, b)
            i += ln
            n += 1
        if total < 0:
            total = n
        for x, before in seen:
            need[x] = total if total >= UNREACHABLE else total - before
        need.setdefault(cid, total)  # an accepting cid (empty completion) is not in ``seen``
        return need[cid]

    def _ends(self, cid: int) -> np.ndarray:
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

    def _live_ends(self, cid: int) -> tuple[np.ndarray, np.ndarray]:
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

    def _live_needs(self, cid: int) -> tuple[np.ndarray, np.ndarray]:
        """(the token slots ``cid`` allows, EOS left out; ``U`` of the configuration after each)."""
        got = self._next.get(cid)
        if got is not None:
            self._next.move_to_end(cid)
            return got
        slots, at = self._live_ends(cid)
        need = np.full(slots.size, UNREACHABLE, dtype=np.int32)
        if slots.size:
            # the distinct end configurations (small ids: a count table, no sort)
            uniq = np.flatnonzero(np.bincount(at))
            per = np.zeros(int(uniq[-1]) + 1, dtype=np.int32)
            per[uniq] = [min(self.tokens_needed(int(c)), UNREACHABLE) for c in uniq.tolist()]
            need = per[at]
        got = (slots, need)
        self._next[cid] = got
        if len(self._next) > _NEXT_KEPT:
            self._next.popitem(last=False)
        # UNREACHABLE when a live token leads to where no completion is spelled
        self._worst[cid] = int(need.max()) if need.size else -1
        return got

    def next_needs(self, cid: int) -> np.ndarray:
        """Per token slot, ``U`` of the configuration after that token (UNREACHABLE where
        the token is rejected; EOS slots too: EOS is decided by acceptance alone)."""
        slots, need = self._live_needs(cid)
        out = np.full(self._slot_ids.size, UNREACHABLE, dtype=np.int32)
        out[slots] = need
        return out

    def worst_next(self, cid: int) -> int:
        """The largest ``U`` over the configurations the allowed tokens lead to (-1 when only
        EOS is allowed)."""
        got = self._worst.get(cid)
        if got is None:
            self._live_needs(cid)
            got = self._worst[cid]
        return got

    def worst_bound(self, cid: int) -> int:
        """An upper bound of :meth:`worst_next` that costs no tokenization: the largest
        shortest-completion length in bytes over the allowed tokens' ends where every byte is
        a token (module docstring), else :meth:`worst_next` itself."""
        got = self._worst.get(cid)
        if got is not None:
            return got
        got = self._bound.get(cid)
        if got is not None:
            return got
        if not self._bytes_bound:
            return self.worst_next(cid)
        _, at = self._live_ends(cid)
        if at.size == 0:
            got = -1
        else:
            dist = self.lengths.distance
            got = max(dist(int(c)) for c in np.flatnonzero(np.bincount(at)).tolist())
            got = UNREACHABLE if got >= INFINITE else got
        self._bound[cid] = got
        return got

    def narrows(self, cid: int, budget: int) -> bool:
        """Whether the rule removes a grammar-allowed token at ``cid`` with ``budget`` tokens
        left (this position included)."""
        if self.worst_bound(cid) <= budget - 2:
            return False
        return self.worst_next(cid) > budget - 2

    def allows(self, cid: int, after: int, budget: int) -> bool:
        """Whether a token from ``cid`` to configuration ``after`` (not EOS) keeps the rule
        with ``budget`` tokens left (this position included)."""
        if after < 0:
            return False
        if self._bytes_bound and after not in self._need and self.lengths.distance(after) <= budget - 2:
            return True  # U(after) <= D(after)
        return self.tokens_needed(after) <= budget - 2

    def mask(self, cid: int, words: np.ndarray, budget: int) -> np.ndarray:
        """The grammar's mask ``words`` (packed uint32) of ``cid`` narrowed by the rule with
        ``budget`` tokens left (this position included); ``words`` itself when the rule
        removes nothing."""
        thr = budget - 2
        if self.worst_bound(cid) <= thr or self.worst_next(cid) <= thr:
            return words
        thr = max(thr, -1)
        key = (cid, thr)
        got = self._masks.get(key)
        if got is not None:
            self._masks.move_to_end(key)
            return got
        slots, need = self._live_needs(cid)
        keep = np.zeros(self.vt.num_words * 32, dtype=bool)
        keep[self._slot_ids[slots[need <= thr]]] = True
        keep[self.vt.eos_ids] = True  # EOS: as the grammar's mask says (where it accepts)
        out = words & np.packbits(keep, bitorder="little").view(np.uint32)
        self._masks[key] = out
        if len(self._masks) > _MASKS_KEPT:
            self._masks.popitem(last=False)
        return out

