"""The per-request cursor over a compiled grammar: :class:`Matcher`.

The matcher is the only layer that knows both a grammar and a vocabulary. Its verbs
are the ones speculative decoding needs:

* ``accept_token`` / ``accept_tokens`` advance (a rejected token returns False and
  changes nothing; the hot path never raises),
* ``validate_tokens`` counts how many tokens would be accepted without advancing,
* ``rollback(n)`` undoes the last ``n`` accepted tokens (O(n)), ``fork()`` copies the cursor,
* ``fill_bitmask`` writes the packed allowed-token mask of the current state
  (:func:`fill_bitmasks`: many matchers into one tensor, masks not yet cached computed on
  a thread pool, one engine per task, the compiled walks releasing the GIL),
* ``forced_bytes`` / ``forced_tokens`` report what the grammar alone determines,
* ``is_accepting`` (EOS allowed now) and ``is_terminated`` (EOS accepted).

State is a list of interned configuration ids (one per accepted token), so rollback and
fork are list operations. All heavy work (transition rows, masks) is cached in the
grammar's shared :class:`~structgen.engine.Engine`.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from typing import Any

import numpy as np

from .automaton import CompiledGrammar
from .engine import VocabTable

__all__ = ["Matcher", "allocate_bitmask", "vocab_table", "bitmask_words", "fill_bitmasks"]

_TERMINATED = -3  # history marker: EOS was accepted

_VT_LOCK = threading.Lock()
_VT_CACHE: weakref.WeakKeyDictionary[Any, VocabTable] = weakref.WeakKeyDictionary()
_VT_BY_HASH: dict[Any, VocabTable] = {}


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words per bitmask row: ``ceil(vocab_size / 32)``."""
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> Any:
    """A packed int32 torch tensor ``[rows, ceil(vocab_size/32)]`` with every token allowed
    (all bits set), on the CPU. Imports torch."""
    import torch

    return torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def vocab_table(vocab: Any) -> VocabTable:
    """The vectorised view of a vocabulary, built once per vocabulary (cached)."""
    with _VT_LOCK:
        try:
            vt = _VT_CACHE.get(vocab)
        except TypeError:
            vt = None
        if vt is not None:
            return vt
        key = getattr(vocab, "content_hash", None)
        if not isinstance(key, str):
            # a duck-typed vocabulary: key by content too (an id() could be reused by a
            # different vocabulary after this one is collected, and keys outlive it in the
            # engines' mask caches and the shared trie cache)
            key = _content_key(vocab)
        vt = _VT_BY_HASH.get(key)
        if vt is None:
            flat_view = None
            if all(hasattr(vocab, a) for a in ("lengths", "offsets", "flat_bytes")):
                flat_view = (vocab.lengths, vocab.offsets, vocab.flat_bytes)
            vt = VocabTable(list(vocab.token_bytes), list(vocab.eos_token_ids),
                            int(vocab.vocab_size), key, flat_view)
            _VT_BY_HASH[key] = vt
        try:
            _VT_CACHE[vocab] = vt
        except TypeError:
            pass
        return vt


def _content_key(vocab: Any) -> str:
    d = hashlib.sha256(b"structgen.vocab-like.v1\0")
    d.update(repr((int(vocab.vocab_size), sorted(int(e) for e in vocab.eos_token_ids))).encode())
    for b in vocab.token_bytes:
        d.update(b"\xff" if b is None else len(b).to_bytes(4, "little") + bytes(b))
    return d.hexdigest()


class Matcher:
    """Per-request matcher state over an immutable :class:`CompiledGrammar`.

    ``max_rollback`` bounds how many tokens can be rolled back (None: unbounded); the
    history is trimmed beyond it.
    """

    __slots__ = ("grammar", "vocab", "_eng", "_vt", "_hist", "_eos", "_max_rollback", "_tb")

    def __init__(self, grammar: CompiledGrammar, vocab: Any, *, max_rollback: int | None = None) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self._eng = grammar.engine
        self._vt = vocab_table(vocab)
        self._tb = self._vt.token_bytes
        self._eos = frozenset(int(x) for x in vocab.eos_token_ids)
        self._hist: list[int] = [self._eng.start]
        self._max_rollback = max_rollback

    # -- core verbs ---------------------------------------------------------------------
    def _advance(self, cid: int, tid: int) -> int:
        if cid == _TERMINATED:
            return -1
        if tid in self._eos:
            return _TERMINATED if self._eng.is_accepting(cid) else -1
        if not (0 <= tid < len(self._tb)):
            return -1
        data = self._tb[tid]
        if not data:
            return -1
        return self._eng.walk(cid, data)

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token. Returns False (state unchanged) if the grammar forbids it."""
        nxt = self._advance(self._hist[-1], int(token_id))
        if nxt == -1:
            return False
        self._push(nxt)
        return True

    def _push(self, cid: int) -> None:
        h = self._hist
        h.append(cid)
        mr = self._max_rollback
        if mr is not None and len(h) > mr + 1:
            del h[: len(h) - mr - 1]

    def accept_tokens(self, token_ids: Any) -> int:
        """Accept tokens in order, stopping at the first rejected one; returns how many."""
        n = 0
        for t in token_ids:
            if not self.accept_token(int(t)):
                break
            n += 1
        return n

    def validate_tokens(self, token_ids: Any) -> int:
        """How many leading tokens of ``token_ids`` would be accepted; the state is unchanged."""
        cid = self._hist[-1]
        n = 0
        for t in token_ids:
            cid = self._advance(cid, int(t))
            if cid == -1:
                break
            n += 1
        return n

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (EOS included)."""
        if num_tokens < 0 or num_tokens > len(self._hist) - 1:
            raise ValueError(f"cannot roll back {num_tokens} tokens: only "
                             f"{len(self._hist) - 1} can be rolled back")
        if num_tokens:
            del self._hist[-num_tokens:]

    def fork(self) -> Matcher:
        """An independent copy of this matcher (shares the compiled grammar and caches)."""
        m = Matcher.__new__(Matcher)
        m.grammar = self.grammar
        m.vocab = self.vocab
        m._eng = self._eng
        m._vt = self._vt
        m._tb = self._tb
        m._eos = self._eos
        m._hist = list(self._hist)
        m._max_rollback = self._max_rollback
        return m

    def reset(self) -> None:
        self._hist = [self._eng.start]

    @property
    def num_accepted(self) -> int:
        """Tokens accepted and still rollback-able (the history length)."""
        return len(self._hist) - 1

    # -- masks ------------------------------------------------------------------------------
    def _mask_words(self) -> np.ndarray:
        cid = self._hist[-1]
        vt = self._vt
        if cid == _TERMINATED:
            bits = np.zeros(vt.num_words * 32, dtype=bool)
            bits[vt.eos_ids] = True
            return np.packbits(bits, bitorder="little").view(np.uint32)
        return self._eng.token_mask(cid, vt)

    def _cached_words(self) -> np.ndarray | None:
        """The current mask's words if the engine has them cached (no walk), else None."""
        cid = self._hist[-1]
        if cid == _TERMINATED or cid < 0:
            return None
        return self._eng.cached_mask(cid, self._vt)

    def get_bitmask_words(self) -> np.ndarray:
        """The current mask as packed uint32 words ``[ceil(vocab_size/32)]`` (read-only view)."""
        return self._mask_words()

    def fill_bitmask(self, bitmask: Any, row: int = 0) -> None:
        """Write the current mask into ``bitmask[row]`` (int32 ``[rows, ceil(V/32)]``, torch or numpy).

        After termination only EOS is allowed. The tensor may be on any device; CPU
        tensors and numpy arrays are written without a copy through a numpy view.
        """
        words = self._mask_words().view(np.int32)
        if isinstance(bitmask, np.ndarray):
            bitmask[row, : words.shape[0]] = words
            return
        if bitmask.device.type == "cpu":
            bitmask[row].numpy()[: words.shape[0]] = words
        else:
            import torch

            bitmask[row, : words.shape[0]].copy_(torch.from_numpy(words), non_blocking=False)

    def allowed_token_ids(self) -> list[int]:
        """All token ids allowed now (EOS included when accepting), ascending."""
        words = self._mask_words()
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        ids = np.nonzero(bits)[0]
        return ids[ids < self._vt.vocab_size].tolist()

    def is_token_allowed(self, token_id: int) -> bool:
        return self._advance(self._hist[-1], int(token_id)) != -1

    # -- forced continuations ------------------------------------------------------------
    def viable_prefix_length(self, data: bytes) -> int:
        """Length of the longest prefix of ``data`` (bytes) the grammar allows from here."""
        cid = self._hist[-1]
        if cid == _TERMINATED:
            return 0
        eng = self._eng
        for i, b in enumerate(data):
            cid = eng.step(cid, b)
            if cid < 0:
                return i
        return len(data)

    def forced_bytes(self, limit: int = 4096, *, after: bytes = b"") -> bytes:
        """The bytes the grammar alone determines from here: the longest string that every
        continuation starts with (stops where the input could also end). With ``after``: the
        forced bytes following the bytes ``after`` (empty if ``after`` is not allowed)."""
        cid = self._hist[-1]
        if cid == _TERMINATED:
            return b""
        eng = self._eng
        if after:
            cid = eng.walk(cid, after)
            if cid < 0:
                return b""
        out = bytearray()
        while len(out) < limit and cid >= 0 and not eng.is_accepting(cid):
            live = eng.live_bytes(cid)
            if live.shape[0] != 1:
                break
            b = int(live[0])
            out.append(b)
            cid = eng.step(cid, b)
        return bytes(out)

    def forced_tokens(self) -> list[int]:
        """A tokenization of :meth:`forced_bytes` (greedy longest match over the vocabulary).

        Every returned token is grammar-valid in sequence. The drafting layer re-tokenizes
        forced text canonically with the model's own tokenizer; this is the grammar-only view.
        """
        data = self.forced_bytes()
        if not data:
            return []
        index = _prefix_index(self._vt)
        out: list[int] = []
        i = 0
        while i < len(data):
            best = -1
            best_len = 0
            for ln in range(min(len(data) - i, index.max_len), 0, -1):
                tid = index.by_bytes.get(data[i:i + ln])
                if tid is not None:
                    best, best_len = tid, ln
                    break
            if best < 0:
                break
            out.append(best)
            i += best_len
        return out

    # -- status -------------------------------------------------------------------------
    def is_accepting(self) -> bool:
        """True when the input may end here (EOS is allowed now)."""
        cid = self._hist[-1]
        return cid != _TERMINATED and self._eng.is_accepting(cid)

    def is_terminated(self) -> bool:
        """True once EOS has been accepted."""
        return self._hist[-1] == _TERMINATED

    def __repr__(self) -> str:
        return (f"Matcher(accepted={self.num_accepted}, accepting={self.is_accepting()}, "
                f"terminated={self.is_terminated()})")


def fill_bitmasks(matchers: Any, bitmask: Any, rows: Any = None, *, executor: Any = None) -> None:
    """Write the current mask of each matcher into one packed bitmask: ``matchers[i]`` into
    row ``rows[i]`` (default ``i``) of ``bitmask`` (int32 ``[R, ceil(V/32)]``, torch on any
    device or numpy); a ``None`` matcher leaves its row all ones (every token allowed).

    Masks already cached cost a lookup each. The others are computed per engine (matchers of
    one grammar share an engine, whose walks are serialised by its lock); with an
    ``executor`` (a :class:`concurrent.futures.Executor`, e.g. a ``ThreadPoolExecutor``) the
    engines with work run in parallel, the compiled trie walks releasing the GIL. The rows
    are then written in one copy (one host-to-device transfer for a CUDA tensor)."""
    ms = list(matchers)
    rws = list(range(len(ms))) if rows is None else [int(r) for r in rows]
    if len(rws) != len(ms):
        raise ValueError(f"{len(ms)} matchers but {len(rws)} rows")
    if not ms:
        return
    words: list[np.ndarray | None] = [None] * len(ms)
    pending: dict[int, list[int]] = {}  # id(engine) -> matcher indices whose mask is not cached
    for i, m in enumerate(ms):
        if m is None:
            continue
        w = m._cached_words()
        if w is None:
            pending.setdefault(id(m._eng), []).append(i)
        else:
            words[i] = w

    def run(idx: list[int]) -> None:
        for i in idx:
            words[i] = ms[i]._mask_words()

    if executor is not None and len(pending) > 1:
        for f in [executor.submit(run, idx) for idx in pending.values()]:
            f.result()
    else:
        for idx in pending.values():
            run(idx)
    block = np.full((len(ms), int(bitmask.shape[1])), -1, dtype=np.int32)  # [n, W]
    for i, w in enumerate(words):
        if w is not None:
            block[i, : w.shape[0]] = w.view(np.int32)
    if isinstance(bitmask, np.ndarray):
        bitmask[rws] = block
        return
    import torch

    src = torch.from_numpy(block)
    idx = torch.tensor(rws, dtype=torch.long)
    if bitmask.device.type == "cpu":
        bitmask.index_copy_(0, idx, src)
    else:  # one pinned host-to-device copy for every row
        dev = bitmask.device
        bitmask.index_copy_(0, idx.to(dev), src.pin_memory().to(dev, non_blocking=True))


class _PrefixIndex:
    def __init__(self, vt: VocabTable) -> None:
        self.by_bytes: dict[bytes, int] = {}
        for tid, b in enumerate(vt.token_bytes):
            if b and b not in self.by_bytes:
                self.by_bytes[b] = tid
        self.max_len = vt.max_len


_PREFIX: weakref.WeakKeyDictionary[VocabTable, _PrefixIndex] = weakref.WeakKeyDictionary()


def _prefix_index(vt: VocabTable) -> _PrefixIndex:
    idx = _PREFIX.get(vt)
    if idx is None:
        idx = _PrefixIndex(vt)
        _PREFIX[vt] = idx
    return idx
