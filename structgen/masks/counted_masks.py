"""Token masks inside a counted repetition, from one pass over the vocabulary per item.

A ``maxLength`` string is a counted rule ``item{lo,hi}`` (one state per character read, see
:class:`structgen.grammar.compiled.CountedRule`) called between its quotes. Every character
position is a configuration of its own, and below the vocabulary's longest token the
positions do not fall into shared classes (:mod:`structgen.masks.horizon`): a walk of the
whole vocabulary per character, milliseconds each. Yet the masks differ only by a count.
Read as an unbounded run of items from between two items, a token either

* is read whole, after ``k`` items (and maybe part of one more): allowed where ``k`` (plus
  one for the part) fits the room left, ``hi - c``; or
* stops between items after ``k`` items, at a byte no item starts with: allowed where
  ``lo <= c + k <= hi`` and what follows the repetition reads the token's rest; or
* dies inside an item: never allowed.

So one pass over the vocabulary per item table (:func:`structgen.masks.trie.item_runs`, shared
by every grammar of the process) and one walk of the tokens' rests per caller give the mask
of every position. This holds where the configuration is exactly one counted frame between
items, at count ``c``, over a caller, together with what the caller's closure adds when the
repetition may end there; and where the caller cannot read a byte an item starts with (then a
token can leave the repetition only where its run of items stops). :meth:`CountedMasks.mask`
checks both and answers None elsewhere (the engine's walks decide those).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from structgen.grammar.runtime import COUNTED, ROOT
from structgen.masks import trie as native
from structgen.masks.buffers import set_bits

if TYPE_CHECKING:  # pragma: no cover
    from structgen.grammar.runtime import Runtime
    from structgen.masks.vocab_table import VocabTable

__all__ = ["CountedMasks", "ItemRuns", "item_runs_for", "prepare_item_runs"]

_RUNS_KEPT = 8  # item tables' runs kept per process (a few MB each for a 128k vocabulary)
_FAMILIES_KEPT = 1024  # callers' rest walks kept per engine


class ItemRuns:
    """Every token of one vocabulary read as a run of one item table (see the module
    docstring): the tokens read whole by the number of items they need, and the tokens
    that stop between items with their item counts and where their rest begins."""

    def __init__(self, vt: VocabTable, item: NDArray[np.int32], accept: NDArray[np.bool_]) -> None:
        trie = vt.trie()
        kind, count, cut = native.item_runs(trie, item, accept)
        ids = trie.slot_ids
        whole = kind <= 1
        self._whole_ids = ids[whole]
        self._whole_need = count[whole] + kind[whole]  # an item begun needs room too
        # (a token's items are at most its bytes: 16-bit keys, which numpy sorts by radix)
        order = np.argsort(self._whole_need.astype(np.int16), kind="stable")
        self._whole_ids = self._whole_ids[order]
        self._whole_need = self._whole_need[order]
        stop = kind == 2
        self.stop_ids = ids[stop]
        self.stop_items = count[stop]
        self.stop_cut = cut[stop].astype(np.int64)
        # per token id, where the rest of a stopping token begins in the trie's blob and how long
        # it is (other tokens whole), for the rest walks of every caller
        self.rest_off = trie.id_off.copy()
        self.rest_len = trie.id_len.copy()
        self.rest_off[self.stop_ids] += self.stop_cut
        self.rest_len[self.stop_ids] -= self.stop_cut
        self.stop_first = trie.blob[self.rest_off[self.stop_ids]]  # most rests die on their first byte
        self._num_words = vt.num_words
        self._by_room: dict[int, NDArray[np.uint32]] = {}
        self._lock = threading.Lock()

    def whole_words(self, room: int) -> NDArray[np.uint32]:
        """Packed words of the tokens read whole within ``room`` more items (shared: do not
        write)."""
        room = min(room, int(self._whole_need[-1]) if self._whole_need.size else 0)
        got = self._by_room.get(room)
        if got is None:
            n = int(np.searchsorted(self._whole_need, room, side="right"))
            bits = np.zeros(self._num_words * 32, dtype=np.bool_)
            bits[self._whole_ids[:n]] = True
            got = np.packbits(bits, bitorder="little").view(np.uint32)
            got.flags.writeable = False
            with self._lock:
                self._by_room[room] = got
        return got


_runs: OrderedDict[tuple[str, bytes], ItemRuns] = OrderedDict()
_building: dict[tuple[str, bytes], Future[ItemRuns]] = {}
_runs_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _runs_key(vt: VocabTable, item: NDArray[np.int32], accept: NDArray[np.bool_]) -> tuple[str, bytes]:
    digest = hashlib.sha256(np.ascontiguousarray(item, dtype=np.int32).tobytes()
                            + np.ascontiguousarray(accept, dtype=np.bool_).tobytes()).digest()
    return vt.key, digest


def _build(key: tuple[str, bytes], vt: VocabTable, item: NDArray[np.int32],
           accept: NDArray[np.bool_]) -> ItemRuns:
    got = ItemRuns(vt, item, accept)
    with _runs_lock:
        _runs[key] = got
        _building.pop(key, None)
        while len(_runs) > _RUNS_KEPT:
            _runs.popitem(last=False)
    return got


def prepare_item_runs(vt: VocabTable, item: NDArray[np.int32], accept: NDArray[np.bool_]) -> None:
    """Start building the :class:`ItemRuns` of an item table on a background thread (the
    vocabulary pass releases the GIL), unless it is built or under way: a grammar's first
    counted position then finds it ready."""
    global _pool
    key = _runs_key(vt, item, accept)
    with _runs_lock:
        if key in _runs or key in _building:
            return
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="structgen-item-runs")
        _building[key] = _pool.submit(_build, key, vt, item, accept)


def item_runs_for(vt: VocabTable, item: NDArray[np.int32], accept: NDArray[np.bool_]) -> ItemRuns:
    """The :class:`ItemRuns` of an item table over vocabulary ``vt`` (process-wide, keyed by
    the table's content: every grammar's JSON string character is one entry)."""
    key = _runs_key(vt, item, accept)
    with _runs_lock:
        got = _runs.get(key)
        if got is not None:
            _runs.move_to_end(key)
            return got
        pending = _building.get(key)
    if pending is not None:
        return pending.result()
    return _build(key, vt, item, accept)


class _Family:
    """What one caller (the stack below a counted frame) makes of the tokens that stop
    between items: the accepted ones' ids, sorted by their item counts."""

    __slots__ = ("runs", "ids", "items")

    def __init__(self, runs: ItemRuns, ids: NDArray[np.int64], items: NDArray[np.int32]) -> None:
        self.runs, self.ids, self.items = runs, ids, items


class CountedMasks:
    """Masks of counted-repetition positions for one engine (hold the runtime's lock)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # (vocab key, caller stack, counted rule) -> _Family, or None where the caller may read
        # a byte an item starts with; ids of the runtime's tables: emptied by forget()
        self._families: OrderedDict[tuple[str, int, int], _Family | None] = OrderedDict()
        self._prepared: set[str] = set()  # vocabularies whose item runs were asked for
        self.hits = 0

    def forget(self) -> None:
        """Drop everything keyed by table ids (the runtime flushed its tables)."""
        self._families.clear()

    def prepare(self, vt: VocabTable) -> None:
        """Start building the item runs of the grammar's counted rules over ``vt`` in the
        background (once per vocabulary; see :func:`prepare_item_runs`)."""
        if vt.key in self._prepared:
            return
        self._prepared.add(vt.key)
        for rule in self.runtime.rules:
            if rule.kind == "counted":
                prepare_item_runs(vt, rule.item_table, rule.item_accept)

    def mask(self, cid: int, vt: VocabTable) -> NDArray[np.uint32] | None:
        """Packed allowed-token words of configuration ``cid`` (EOS included where it is
        accepting), or None where it is not a counted position this module answers for."""
        rt = self.runtime
        tab = rt.tab
        frame = -1
        for sid in rt.stacks(cid):
            if tab.rule_kind[rt.rule_of(int(tab.frames[sid, 1]))] == COUNTED:
                if frame >= 0:
                    return None
                frame = sid
        if frame < 0:
            return None
        caller = int(tab.frames[frame, 0])
        g = int(tab.frames[frame, 1])
        st = int(tab.state_key[g, 0])
        c, q = int(tab.state_key_data[st]), int(tab.state_key_data[st + 1])
        if caller == ROOT or q != 0 or rt.closure_config(frame) != cid:
            return None
        r = rt.rule_of(g)
        key = (vt.key, caller, r)
        if key in self._families:
            fam = self._families[key]
            self._families.move_to_end(key)
        else:
            fam = self._family(vt, caller, r)
            self._families[key] = fam
            while len(self._families) > _FAMILIES_KEPT:
                self._families.popitem(last=False)
        if fam is None:
            return None
        self.hits += 1
        lo, hi = int(tab.rule_lo[r]), int(tab.rule_hi[r])
        words: NDArray[np.uint32] = fam.runs.whole_words(hi - c).copy()
        a = int(np.searchsorted(fam.items, lo - c, side="left"))
        b = int(np.searchsorted(fam.items, hi - c, side="right"))
        if b > a:
            set_bits(words, fam.ids[a:b])
        if rt.is_accepting(cid) and vt.eos_ids.size:
            set_bits(words, vt.eos_ids)
        return words

    def _family(self, vt: VocabTable, caller: int, r: int) -> _Family | None:
        """The :class:`_Family` of counted rule ``r`` called from stack ``caller``, or None
        where what follows the repetition may read a byte an item starts with."""
        rt = self.runtime
        rule = rt.rules[r]
        assert rule.kind == "counted"
        after = rt.closure_config(caller)  # the repetition ended: the caller goes on
        if after < 0:
            return None
        rt.fill_row(after)
        starts = rule.item_table[0] >= 0
        if bool((rt.tab.trans[after][starts] >= 0).any()):
            return None
        runs = item_runs_for(vt, rule.item_table, rule.item_accept)
        words = np.zeros(vt.num_words, dtype=np.uint32)
        live = rt.tab.trans[after][runs.stop_first] >= 0  # rests the caller's first byte lets on
        if live.any():
            native.walk_tails(rt, vt.trie(), after, runs.stop_ids[live], runs.rest_off, runs.rest_len, words)
        ok = ((words[runs.stop_ids >> 5] >> (runs.stop_ids & 31).astype(np.uint32)) & 1).astype(bool)
        ids, items = runs.stop_ids[ok], runs.stop_items[ok]
        order = np.argsort(items.astype(np.int16), kind="stable")
        return _Family(runs, ids[order], items[order])

