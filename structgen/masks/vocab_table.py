"""The vocabulary as the mask engine walks it: one byte trie level per token position.

:class:`VocabTable` is built once per vocabulary (:func:`structgen.masks.matcher.vocab_table`)
and shared by every grammar's :class:`~structgen.masks.engine.Engine`: the byte trie of all
tokens with non-empty bytes as numpy arrays, one :class:`TrieLevel` per depth (the numpy
walks), the flat per-token arrays (the walks of chosen token ids), and, on first use, the
depth-first trie of the compiled walks and the vocabulary's text slice
(:mod:`structgen.masks.trie`).
"""

from __future__ import annotations

import threading

import numpy as np
from numpy.typing import ArrayLike, NDArray

from structgen.masks import trie as native

__all__ = ["VocabTable", "TrieLevel"]


class TrieLevel:
    """Trie nodes at one depth, sorted by (parent, byte).

    byte:        uint8 [n]        the byte on the edge into the node
    child_start: int64 [n_prev]   first child (at this level) of each previous-level node
    child_count: int64 [n_prev]
    tok_start / tok_count: int64 [n]   range in ``tok_ids`` of tokens ending at the node
    tok_ids:     int64 [k]        token ids (original numbering) ending at this level
    """

    __slots__ = ("byte", "child_start", "child_count", "tok_start", "tok_count", "tok_ids")

    byte: NDArray[np.uint8]
    child_start: NDArray[np.int64]
    child_count: NDArray[np.int64]
    tok_start: NDArray[np.int64]
    tok_count: NDArray[np.int64]
    tok_ids: NDArray[np.int64]


_SLICE_BUILD_LOCK = threading.Lock()


class VocabTable:
    """Vectorisation-friendly view of a vocabulary (built once per vocabulary).

    levels:    the byte trie of all tokens with non-empty bytes, one :class:`TrieLevel` per depth
    eos_ids:   int64 [E]
    num_words: ceil(vocab_size / 32)
    """

    def __init__(self, token_bytes: list[bytes | None], eos_ids: list[int], vocab_size: int,
                 key: str, flat_view: tuple[ArrayLike, ArrayLike, ArrayLike] | None = None) -> None:
        self.key = key
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self.token_bytes = token_bytes
        self.eos_ids = np.array(sorted(set(eos_ids)), dtype=np.int64)
        if flat_view is not None:
            # the vocabulary's own lazily built arrays: lengths [V], offsets [V+1], bytes [total]
            all_lens, all_offs, flat = flat_view
            ids = np.nonzero(np.asarray(all_lens) > 0)[0].astype(np.int64)
            lens = np.asarray(all_lens, dtype=np.int64)[ids]
            offs = np.asarray(all_offs, dtype=np.int64)[ids]
            flat = np.asarray(flat, dtype=np.uint8)
        else:
            ids = np.array([i for i, b in enumerate(token_bytes) if b], dtype=np.int64)
            blobs = [b for b in token_bytes if b]  # the bytes of tokens ``ids``, in order
            lens = np.array([len(b) for b in blobs], dtype=np.int64)
            flat = np.frombuffer(b"".join(blobs), dtype=np.uint8)
            offs = (np.concatenate([[0], np.cumsum(lens)[:-1]]) if lens.size
                    else np.zeros(0, np.int64))
        self.num_tokens = int(ids.size)
        self.max_len = int(lens.max()) if lens.size else 0
        node = np.zeros(self.num_tokens, dtype=np.int64)  # node of each token's prefix so far
        n_prev = 1
        active = np.arange(self.num_tokens, dtype=np.int64)
        self.levels: list[TrieLevel] = []
        # flat per-token arrays (ids ascending): lengths, zero-padded byte matrix, byte bitmaps
        self.flat_ids = ids
        self.flat_lens = lens
        width = max(self.max_len, 1)
        mat = np.zeros((self.num_tokens, width), dtype=np.uint8)
        col = np.arange(flat.size, dtype=np.int64) - np.repeat(offs, lens)
        row = np.repeat(np.arange(self.num_tokens, dtype=np.int64), lens)
        mat[row, col] = flat
        self.matrix = mat
        bits = np.zeros((self.num_tokens, 256), dtype=bool)
        bits[row, flat] = True
        self.byte_bits = np.packbits(bits, axis=1, bitorder="little").view(np.uint64)  # [N, 4]
        for j in range(self.max_len):
            active = active[lens[active] > j]
            if active.size == 0:
                break
            keys = node[active] * 256 + flat[offs[active] + j]
            uniq, inv = np.unique(keys, return_inverse=True)
            lv = TrieLevel()
            parent = uniq // 256
            lv.byte = (uniq % 256).astype(np.uint8)
            lv.child_start = np.searchsorted(parent, np.arange(n_prev)).astype(np.int64)
            lv.child_count = (np.searchsorted(parent, np.arange(n_prev), side="right")
                              - lv.child_start).astype(np.int64)
            node[active] = inv.reshape(-1)
            ending = active[lens[active] == j + 1]
            end_nodes = node[ending]
            order = np.argsort(end_nodes, kind="stable")
            lv.tok_ids = ids[ending[order]]
            sorted_nodes = end_nodes[order]
            lv.tok_start = np.searchsorted(sorted_nodes, np.arange(uniq.size)).astype(np.int64)
            lv.tok_count = (np.searchsorted(sorted_nodes, np.arange(uniq.size), side="right")
                            - lv.tok_start).astype(np.int64)
            self.levels.append(lv)
            n_prev = uniq.size
        self._trie: native.Trie | None = None
        self._slice: native.TextSlice | bool | None = None

    def trie(self) -> native.Trie:
        """The depth-first trie for the compiled walks (built on first use, shared per vocabulary)."""
        if self._trie is None:
            self._trie = native.trie_for(self.key, self.token_bytes, self.vocab_size)
        return self._trie

    def text_slice(self) -> native.TextSlice | None:
        """The vocabulary's text slice (see :class:`native.TextSlice`), built on first use (once per
        vocabulary, shared); None without compiled walks or when the slice would be small."""
        if self._slice is None:
            with _SLICE_BUILD_LOCK:
                if self._slice is None:
                    self._slice = self._build_slice() or False
        sl = self._slice
        return sl if isinstance(sl, native.TextSlice) else None

    def _build_slice(self) -> native.TextSlice | None:
        if not self.num_tokens or not native.available():
            return None
        pd = native.TEXT_AUTOMATON
        # run the slice automaton over every token (column by column): in the slice iff
        # no edge is missing (a token may end inside a character: a slice check reads every
        # path of the automaton, complete characters or not)
        # it ends in state 0 without a missing edge; ``killed``: plain text of fewer than
        # ``depth`` bytes, then a C0 control byte
        st = np.zeros(self.num_tokens, dtype=np.int64)
        killed = np.zeros(self.num_tokens, dtype=bool)
        for j in range(self.max_len):
            act = np.nonzero((self.flat_lens > j) & (st >= 0))[0]
            col = self.matrix[act, j]
            nxt = pd[st[act], col]
            if j < native.SLICE_DEPTH - 1:
                killed[act[(nxt < 0) & (st[act] == 0) & (col < 0x20)]] = True
            st[act] = nxt
        sel = (st >= 0) & (self.flat_lens <= native.SLICE_DEPTH)
        if int(sel.sum()) < self.num_tokens // 4:
            return None  # too small a slice to pay for a second trie
        ids = self.flat_ids[sel]
        inside = np.zeros(self.vocab_size, dtype=bool)
        inside[ids] = True
        rest = list(self.token_bytes)
        for t in ids.tolist():
            rest[t] = None
        full = self.trie()
        trie = native.trie_for((self.key, "text-slice", native.SLICE_DEPTH), rest, self.vocab_size)
        for t in self.flat_ids[killed].tolist():
            rest[t] = None
        ktrie = native.trie_for((self.key, "text-slice-killed", native.SLICE_DEPTH), rest, self.vocab_size)
        in_slot = inside[full.slot_ids]
        sps = np.zeros(in_slot.size + 1, dtype=np.int64)
        np.cumsum(in_slot, out=sps[1:])
        sids = np.ascontiguousarray(full.slot_ids[in_slot], dtype=np.int64)
        return native.TextSlice(native.SLICE_DEPTH, pd, sps, sids, trie, native.match_nodes(full, trie),
                                ktrie, native.match_nodes(full, ktrie))

