"""Compiled token walks: the vocabulary's byte trie in depth-first order, walked by numba.

The engine's masks are walks of token bytes through its configuration transition table
``trans`` (int32 ``[configs, 256]``; -2 unknown, -1 dead). The numpy walks in
:mod:`structgen.masks.engine` move a whole trie level at a time; the kernels here walk the trie
depth first in compiled code, skipping a whole subtree at its first dead byte, and write
allowed tokens straight into packed mask words.

Rows of ``trans`` are filled lazily by the engine (Python), so every kernel is resumable:
when it meets an unknown row it returns where it stopped and which configuration needs its
row; the driver fills that row and calls the kernel again with the same scratch arrays, so
no work is repeated.

numba is optional: :func:`available` says whether the kernels can be used (and
``STRUCTGEN_NATIVE=0`` turns them off); the engine falls back to its numpy walks.

Trie layout (nodes ``1..n`` in depth-first order; node 0 is the root, the empty prefix):

    byte:  uint8 [n+1]   byte on the edge into the node
    depth: int32 [n+1]   prefix length (root 0)
    skip:  int32 [n+1]   first node after the node's subtree (n+1 at the end)
    lo:    int32 [n+2]   first token slot of the subtree (slots = tokens sorted by bytes);
                         lo[n+1] = number of tokens, so the subtree's slots are
                         [lo[i], lo[skip[i]])
    own:   int32 [n+1]   tokens whose bytes end exactly at the node: slots [lo[i], lo[i]+own[i])
    suf:   uint64 [n+1, 4]  the set of bytes on the edges below the node (256 bits)
    wf:    uint8 [n+1]   1 where every byte string below the node is well-formed UTF-8 read
                         from a character boundary (the last character may be cut)
    slot_ids: int64 [T]  token id of each slot
Per token id: ``id_off`` / ``id_len`` (int64 ``[V]``) index ``blob`` (uint8, all token bytes).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from structgen.grammar import ir
from structgen.grammar.compiler import compile_grammar
from structgen.grammar.native import COMPILED, warm_fsa_kernels
from structgen.grammar.runtime import RuntimeTables, warm_kernels
from structgen.masks import _trie_kernels as tk
from structgen.masks import _walk_kernels as wk
from structgen.masks._walk_kernels import UTF8, TextArgs, TrieArrays

if TYPE_CHECKING:  # pragma: no cover
    from structgen.grammar.runtime import Runtime

__all__ = ["available", "Trie", "trie_for", "TextSlice", "TEXT_AUTOMATON", "SLICE_DEPTH", "SLICE_BUDGET",
           "SLICE_WIDTH", "SLICE_NODES", "walk_trie", "walk_ids", "walk_sliced", "walk_loop_split",
           "row_shape", "match_nodes", "walk_tails", "item_runs"]

DONE = -3

_lock = threading.Lock()
_warmed = False
_status: bool | None = None


def available() -> bool:
    """Whether the compiled kernels can be used (numba importable, not disabled)."""
    global _status
    if _status is None:
        with _lock:
            if _status is None:
                if (os.environ.get("STRUCTGEN_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")
                        or not COMPILED):  # numba missing (its kernels would run as plain Python)
                    _status = False
                else:
                    try:
                        _load()
                        _status = True
                    except Exception:  # noqa: BLE001 - any numba/llvmlite problem: numpy fallback
                        _status = False
    return _status


def _load() -> None:
    """Load (or compile) every kernel once per process (see :func:`_warm`)."""
    global _warmed
    if not _warmed:
        _warm()
        _warmed = True


def _warm_tables(arrays: TrieArrays, offs: NDArray[np.int64], lens: NDArray[np.int64],
                 flat: NDArray[np.uint8], words: NDArray[np.uint32], unc: NDArray[np.int64],
                 cnt: NDArray[np.int64]) -> None:
    """Run the runtime and walk kernels once on the tables of a small recursive grammar."""
    t = ir.alt(ir.lit("b"), ir.seq(ir.lit("["), ir.ref("t"), ir.lit("]")))
    cg = compile_grammar(ir.Grammar({"s": ir.seq(ir.lit("a"), ir.star(ir.ref("t"))), "t": t}, "s"))
    tab = RuntimeTables(cg.rules)
    g, c = warm_kernels(tab)
    st, tn = np.zeros(3, np.int32), np.zeros(3, np.uint8)
    ids = arrays.slot_ids
    n = arrays.byte.shape[0] - 1
    for gmode in (False, True):
        for split in (False, True):
            st[0] = g if gmode else c
            wk.walk(arrays, tab.T, gmode, 1, n + 1, st, tn, split, words, unc, cnt, _no_slice())
            wk.walk_ids(offs, lens, flat, tab.T, gmode, int(st[0]), ids, np.zeros(4, np.int64), words, split,
                        unc, cnt)
    st[0] = c
    wk.walk_ends(arrays, tab.T, 1, n + 1, st, np.full(ids.size, -1, np.int32))
    cnode = np.arange(arrays.byte.shape[0], dtype=np.int64)
    sps = np.zeros(ids.size + 1, dtype=np.int64)
    for gmode in (False, True):
        wk.slice_from(tab.T, gmode, g if gmode else c, 0, TEXT_AUTOMATON, 4, 128, 16)
        for split in (False, True):
            text = TextArgs(np.zeros(3, np.int64), TEXT_AUTOMATON, sps, ids,
                            np.array([4, 128, 16, 1], np.int64))
            wk.walk_sliced(arrays, arrays, cnode, arrays, cnode, text, np.zeros_like(words), tab.T, gmode,
                           g if gmode else c, np.array([0, -1, 0, 0], np.int64), st, tn, split, words, unc,
                           cnt)


def _warm() -> None:
    """Call every kernel once on tiny inputs of the real argument types, so that loading
    them from numba's disk cache (or compiling them, the first time ever) happens here,
    once per process, and not inside the first mask that needs each one."""
    flat = np.frombuffer(b"ab", dtype=np.uint8)
    offs = np.array([0, 1], dtype=np.int64)
    lens = np.array([1, 1], dtype=np.int64)
    n = tk.count_nodes(flat, offs, lens)
    byte, depth, skip = np.zeros(n + 1, np.uint8), np.zeros(n + 1, np.int32), np.zeros(n + 1, np.int32)
    lo, own, suf = np.zeros(n + 2, np.int32), np.zeros(n + 1, np.int32), np.zeros((n + 1, 4), np.uint64)
    tk.build_nodes(flat, offs, lens, byte, depth, skip, lo, own, suf)
    wf = np.zeros(n + 1, np.uint8)
    tk.utf8_ok(byte, depth, UTF8, wf)
    words, unc, cnt = np.zeros(1, np.uint32), np.zeros(2, np.int64), np.zeros(1, np.int64)
    ids = np.array([0, 1], dtype=np.int64)
    _warm_tables(TrieArrays(byte, depth, skip, lo, own, suf, wf, ids), offs, lens, flat, words, unc, cnt)
    warm_fsa_kernels()
    tk.loop_split(np.zeros((2, 4), np.uint64), ids, np.zeros(4, np.uint64), words)
    tk.match_nodes(byte, depth, byte, depth, skip, np.zeros(n + 1, np.int64))
    tk.row_shape(np.zeros(256, np.int32), np.zeros(256, np.uint8), np.zeros(256, np.int32))
    item = np.full((2, 256), -1, dtype=np.int32)
    item[0, 0x61] = 1
    wk.item_runs(TrieArrays(byte, depth, skip, lo, own, suf, wf, ids), item, np.array([0, 1], np.uint8),
                 np.zeros(2, np.int8), np.zeros(2, np.int32), np.zeros(2, np.int32))


class Trie:
    """Depth-first byte trie of one vocabulary (see the module docstring for the layout)."""

    def __init__(self, token_bytes: list[bytes | None], vocab_size: int) -> None:
        _load()
        ids = [i for i, b in enumerate(token_bytes) if b and i < vocab_size]
        ids.sort(key=lambda i: token_bytes[i])  # type: ignore[arg-type,return-value]
        slot_ids = np.array(ids, dtype=np.int64)
        lens = np.array([len(token_bytes[i]) for i in ids], dtype=np.int64)  # type: ignore[arg-type]
        blobs = [token_bytes[i] for i in ids]
        flat = np.frombuffer(b"".join(blobs), dtype=np.uint8)  # type: ignore[arg-type]
        offs = np.zeros(len(ids), dtype=np.int64)
        if len(ids) > 1:
            offs[1:] = np.cumsum(lens)[:-1]
        n = tk.count_nodes(flat, offs, lens)
        self.byte = np.zeros(n + 1, dtype=np.uint8)
        self.depth = np.zeros(n + 1, dtype=np.int32)
        self.skip = np.zeros(n + 1, dtype=np.int32)
        self.lo = np.zeros(n + 2, dtype=np.int32)
        self.own = np.zeros(n + 1, dtype=np.int32)
        self.suf = np.zeros((n + 1, 4), dtype=np.uint64)
        tk.build_nodes(flat, offs, lens, self.byte, self.depth, self.skip, self.lo, self.own, self.suf)
        self.wf = np.zeros(n + 1, dtype=np.uint8)
        tk.utf8_ok(self.byte, self.depth, UTF8, self.wf)
        self.num_nodes = n
        self.slot_ids = slot_ids
        self.max_depth = int(lens.max()) if lens.size else 0
        # per token id: offset and length into blob (0 length for empty / special tokens)
        self.id_len = np.zeros(vocab_size, dtype=np.int64)
        self.id_off = np.zeros(vocab_size, dtype=np.int64)
        self.id_len[slot_ids] = lens
        self.id_off[slot_ids] = offs
        self.blob = flat
        # byte set per slot (4 x uint64 = 256 bits), for loop-split walks
        bits = np.zeros((len(ids), 256), dtype=bool)
        if len(ids):
            rows = np.repeat(np.arange(len(ids), dtype=np.int64), lens)
            bits[rows, flat] = True
        self.slot_bytes = np.ascontiguousarray(np.packbits(bits, axis=1, bitorder="little").view(np.uint64))
        self._arrays: TrieArrays | None = None

    def arrays(self) -> TrieArrays:
        """The node arrays as one walk argument (:data:`structgen.masks._walk_kernels.TrieArrays`)."""
        if self._arrays is None:
            self._arrays = TrieArrays(self.byte, self.depth, self.skip, self.lo, self.own, self.suf, self.wf,
                                      self.slot_ids)
        return self._arrays


_tries: dict[Hashable, Trie] = {}


def trie_for(key: Hashable, token_bytes: list[bytes | None], vocab_size: int) -> Trie:
    """The (process-wide, cached) trie of a vocabulary table."""
    t = _tries.get(key)
    if t is None:
        with _lock:
            t = _tries.get(key)
            if t is None:
                t = Trie(token_bytes, vocab_size)
                _tries[key] = t
    return t


def _json_text_automaton() -> NDArray[np.int8]:
    """The bytes of JSON string content without escapes: complete, well-formed UTF-8
    characters other than ``"``, ``\\`` and the C0 controls (int8 ``[8, 256]``: state 0 =
    between characters, -1 = no edge): UTF-8 (:data:`structgen.masks._walk_kernels.UTF8`) less
    those ASCII bytes."""
    pd: NDArray[np.int8] = UTF8.copy()
    pd[0, 0x00:0x20] = -1
    pd[0, 0x22] = pd[0, 0x5C] = -1
    return pd


#: The slice automaton of the text slice (see :class:`TextSlice`).
TEXT_AUTOMATON = _json_text_automaton()
SLICE_DEPTH = 24  # the text slice: tokens of at most this many bytes
SLICE_BUDGET = 512  # (state, slice state) pairs one slice check may visit
SLICE_WIDTH = 48  # ... and at one depth
SLICE_NODES = 24  # descendants a trie node needs for a slice check


class TextSlice:
    """The text slice of a vocabulary: the tokens of at most ``depth`` bytes that are plain
    JSON text (``pd``, :data:`TEXT_AUTOMATON`; the last character may be cut), as
    ``sids`` in the order of the full trie's slots (``sps[k]``: how many of them precede
    slot ``k``, so a subtree's slice tokens are one range), and ``trie``, the trie of every
    *other* token (``cnode``: the node of each full-trie node's path in it, or -1). From a
    state that can read every plain text of up to ``depth`` bytes
    (:func:`structgen.masks._walk_kernels.slice_from`), a node's slice tokens are all accepted,
    and only its subtree in ``trie`` needs a walk
    (:func:`structgen.masks._walk_kernels.walk_sliced`); ``ktrie`` / ``knode``: the same without
    the tokens of plain text then a control byte, for states that reject those. ``words``:
    the slice's tokens as a packed mask (uint32 ``[ceil(vocab_size / 32)]``), OR-ed in whole
    where the root takes the slice."""

    __slots__ = ("depth", "pd", "sps", "sids", "trie", "cnode", "ktrie", "knode", "size", "words")

    def __init__(self, depth: int, pd: NDArray[np.int8], sps: NDArray[np.int64], sids: NDArray[np.int64],
                 trie: Trie, cnode: NDArray[np.int64], ktrie: Trie, knode: NDArray[np.int64]) -> None:
        self.depth, self.pd, self.sps, self.sids, self.trie = depth, pd, sps, sids, trie
        self.cnode, self.ktrie, self.knode, self.size = cnode, ktrie, knode, int(sids.size)
        nw = (int(trie.id_len.size) + 31) // 32  # the vocabulary's size, in words
        bits = np.zeros(nw * 32, dtype=np.bool_)
        bits[sids] = True
        self.words = np.packbits(bits, bitorder="little").view(np.uint32)


def _no_slice() -> TextArgs:
    """The text-slice argument of a walk that takes no slice (see :data:`_walk_kernels.TextArgs`)."""
    return TextArgs(np.zeros(1, dtype=np.int64), np.full((1, 256), -1, dtype=np.int8),
                    np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.full(4, -1, dtype=np.int64))


# -- drivers (each takes the grammar's runtime: its kernel tables, and its ``service`` that grows
# them when a walk asks for room) ----------------------------------------------------------------

def walk_trie(runtime: Runtime, trie: Trie, start: int, gmode: bool, split: bool,
              words: NDArray[np.uint32]) -> NDArray[np.int64]:
    """OR into ``words`` the tokens accepted from ``start`` (a configuration of ``runtime``, or
    with ``gmode`` a rule state of a call-free rule); with ``split`` (a rooted walk), also
    return the ids of the rejected tokens that passed an accepting state first (they depend
    on the context), else an empty array."""
    st = np.zeros(trie.max_depth + 1, dtype=np.int32)
    st[0] = start
    tn = np.zeros(trie.max_depth + 1, dtype=np.uint8)
    unc = np.empty(trie.slot_ids.size if split else 0, dtype=np.int64)  # written before read
    cnt = np.zeros(1, dtype=np.int64)
    no_slice = _no_slice()
    i = 1
    end = trie.num_nodes + 1
    while True:
        i, status = wk.walk(trie.arrays(), runtime.tab.T, gmode, i, end, st, tn, split, words, unc, cnt,
                            no_slice)
        if status == DONE:
            break
        runtime.service(int(status))
    return unc[: int(cnt[0])]


def walk_ids(runtime: Runtime, trie: Trie, start: int, gmode: bool, ids: NDArray[np.int64],
             words: NDArray[np.uint32], split: bool = False) -> NDArray[np.int64]:
    """OR into ``words`` the tokens among ``ids`` whose bytes are consumed from ``start``
    (tokens already set in ``words`` are skipped). With ``split`` (a rooted walk), the
    rejected tokens that passed an accepting state first are returned."""
    pos = np.zeros(4, dtype=np.int64)  # resume point: token index, byte index, state, passed
    pos[2] = start
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    unc = np.empty(ids.size if split else 0, dtype=np.int64)
    cnt = np.zeros(1, dtype=np.int64)
    while True:
        status = wk.walk_ids(trie.id_off, trie.id_len, trie.blob, runtime.tab.T, gmode, start, ids, pos,
                             words, split, unc, cnt)
        if status == DONE:
            return unc[: int(cnt[0])]
        runtime.service(int(status))


def walk_tails(runtime: Runtime, trie: Trie, start: int, ids: NDArray[np.int64], off: NDArray[np.int64],
               length: NDArray[np.int64], words: NDArray[np.uint32]) -> None:
    """OR into ``words`` the tokens among ``ids`` whose byte strings ``trie.blob[off[t] :
    off[t] + length[t]]`` (per token id: a part of its bytes) are consumed from configuration
    ``start``."""
    _load()
    pos = np.zeros(4, dtype=np.int64)
    pos[2] = start
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    unc = np.empty(0, dtype=np.int64)
    cnt = np.zeros(1, dtype=np.int64)
    while True:
        status = wk.walk_ids(off, length, trie.blob, runtime.tab.T, False, start, ids, pos, words, False, unc,
                             cnt)
        if status == DONE:
            return
        runtime.service(int(status))


def item_runs(trie: Trie, item: NDArray[np.int32], accept: NDArray[np.bool_]
              ) -> tuple[NDArray[np.int8], NDArray[np.int32], NDArray[np.int32]]:
    """Per token slot of ``trie``: (kind, items, cut) of the token read as a run of the
    prefix-free item ``item`` / ``accept`` (see :func:`structgen.masks._walk_kernels.item_runs`)."""
    _load()
    n = trie.slot_ids.size
    kind = np.full(n, 3, dtype=np.int8)
    count = np.zeros(n, dtype=np.int32)
    cut = np.zeros(n, dtype=np.int32)
    wk.item_runs(trie.arrays(), np.ascontiguousarray(item, dtype=np.int32),
                 np.ascontiguousarray(accept, dtype=np.uint8), kind, count, cut)
    return kind, count, cut


def walk_ends(runtime: Runtime, trie: Trie, start: int, *,
              out: NDArray[np.int32] | None = None) -> NDArray[np.int32]:
    """Per token slot of ``trie`` (``trie.slot_ids[q]`` is slot ``q``'s token id), the
    configuration of ``runtime`` its bytes lead to from configuration ``start``; -1 where they
    are rejected (int32 ``[slots]``; written into ``out`` when given)."""
    if out is None:
        out = np.full(trie.slot_ids.size, -1, dtype=np.int32)
    else:
        out.fill(-1)
    st = np.zeros(trie.max_depth + 1, dtype=np.int32)
    st[0] = start
    i = 1
    end = trie.num_nodes + 1
    while True:
        i, status = wk.walk_ends(trie.arrays(), runtime.tab.T, i, end, st, out)
        if status == DONE:
            return out
        runtime.service(int(status))


def walk_sliced(runtime: Runtime, trie: Trie, sl: TextSlice, start: int, gmode: bool, split: bool,
                words: NDArray[np.uint32]) -> NDArray[np.int64]:
    """:func:`walk_trie` over the whole vocabulary, taking the text slice ``sl`` (a
    :class:`TextSlice`) whole where a node's state can read it (see
    :func:`structgen.masks._walk_kernels.walk_sliced`)."""
    ct, kt = sl.trie, sl.ktrie
    md = max(trie.max_depth, ct.max_depth) + 1
    st = np.zeros(md, dtype=np.int32)
    tn = np.zeros(md, dtype=np.uint8)
    pq = np.zeros(md, dtype=np.int64)
    unc = np.empty(trie.slot_ids.size if split else 0, dtype=np.int64)
    cnt = np.zeros(1, dtype=np.int64)
    pos = np.array([0, -1, 0, 0], dtype=np.int64)
    sp = np.array([sl.depth, SLICE_BUDGET, SLICE_WIDTH, SLICE_NODES], dtype=np.int64)
    text = TextArgs(pq, sl.pd, sl.sps, sl.sids, sp)
    full, rest, rest_kill = trie.arrays(), ct.arrays(), kt.arrays()
    while True:
        status = wk.walk_sliced(full, rest, sl.cnode, rest_kill, sl.knode, text, sl.words, runtime.tab.T,
                                gmode, start, pos, st, tn, split, words, unc, cnt)
        if status == DONE:
            return unc[: int(cnt[0])]
        runtime.service(int(status))


def row_shape(row: NDArray[np.int32], lab: NDArray[np.uint8], tg: NDArray[np.int32]) -> int:
    """See :func:`structgen.masks._trie_kernels.row_shape`."""
    _load()
    return int(tk.row_shape(np.ascontiguousarray(row, dtype=np.int32), lab, tg))


def match_nodes(full: Trie, sub: Trie) -> NDArray[np.int64]:
    """For every node of ``full``, the node of ``sub`` (a trie of some of its tokens) with
    the same path, or -1."""
    out = np.empty(full.byte.shape[0], dtype=np.int64)
    _load()
    tk.match_nodes(full.byte, full.depth, sub.byte, sub.depth, sub.skip, out)
    return out


def walk_loop_split(runtime: Runtime, trie: Trie, start: int, gmode: bool, loops: NDArray[np.bool_],
                    words: NDArray[np.uint32], split: bool = False) -> NDArray[np.int64]:
    """Tokens made only of bytes that loop on ``start`` are allowed outright; the others are
    walked byte by byte (``split`` as in :func:`walk_ids`, for a non-accepting ``start``).
    ``loops``: bool [256]."""
    _load()
    nonloop = np.packbits(~loops, bitorder="little").view(np.uint64)
    impure = tk.loop_split(trie.slot_bytes, trie.slot_ids, nonloop, words)
    if impure.size:
        return walk_ids(runtime, trie, start, gmode, impure, words, split)
    return np.zeros(0, dtype=np.int64)
