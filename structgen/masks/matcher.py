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
* ``forbidden_token_ids`` gives the mask as the few ids it forbids where nearly every token
  is allowed (free text between triggers: :meth:`Engine.free_state
  <structgen.masks.engine.Engine.free_state>`), and steps from such configurations, once
  visited often, are dictionary lookups rather than walks of the token's bytes,
* ``forced_bytes`` / ``forced_tokens`` report what the grammar alone determines,
* ``is_accepting`` (EOS allowed now) and ``is_terminated`` (EOS accepted).

State is a list of interned configuration ids (one per accepted token), so rollback and
fork are list operations. All heavy work (transition rows, masks) is cached in the
grammar's shared runtime (:class:`~structgen.grammar.runtime.Runtime`) and mask engine
(:class:`~structgen.masks.engine.Engine`).
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Iterable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, cast

import numpy as np
from numpy.typing import NDArray

from structgen.errors import MatcherUsageError
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.runtime import STALE, Runtime
from structgen.masks.buffers import (
    bitmask_kind,
    bitmask_target,
    bitmask_words,
    row_index,
    whole_number,
    write_row,
)
from structgen.masks.engine import FREE_JUMPS_AFTER, FreeState, engine_for
from structgen.masks.lookahead import LOOK_AHEAD_CONFIGS, LOOK_AHEAD_DEPTH, LookAheadJob, submit
from structgen.masks.vocab import FlatVocabLike, VocabLike
from structgen.masks.vocab_table import VocabTable

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

    from structgen.masks.buffers import Bitmask, Target

__all__ = ["Matcher", "vocab_table", "bitmask_words", "fill_bitmasks", "whole_number"]

_TERMINATED = -3  # history marker: EOS was accepted
_SEEN_MAX = 64  # masks a matcher keeps of configurations it met (shared arrays, not copies)

_VT_LOCK = threading.Lock()
_VT_CACHE: weakref.WeakKeyDictionary[VocabLike, VocabTable] = weakref.WeakKeyDictionary()
_VT_BY_HASH: dict[str, VocabTable] = {}


def vocab_table(vocab: VocabLike) -> VocabTable:
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
            if isinstance(vocab, FlatVocabLike):
                flat_view = (vocab.lengths, vocab.offsets, vocab.flat_bytes)
            vt = VocabTable(list(vocab.token_bytes), list(vocab.eos_token_ids),
                            int(vocab.vocab_size), key, flat_view)
            _VT_BY_HASH[key] = vt
        try:
            _VT_CACHE[vocab] = vt
        except TypeError:
            pass
        return vt


def _content_key(vocab: VocabLike) -> str:
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

    __slots__ = ("grammar", "vocab", "_eng", "_masks", "_vt", "_hist", "_eos", "_max_rollback", "_tb",
                 "_nvocab", "_epoch", "_bm_ok", "_free", "_steps", "_seen", "_seen_epoch", "__weakref__")

    def __init__(self, grammar: CompiledGrammar, vocab: VocabLike, *,
                 max_rollback: int | None = None) -> None:
        if not isinstance(grammar, CompiledGrammar):
            raise MatcherUsageError(f"Matcher needs a CompiledGrammar, not {type(grammar).__name__}")
        if grammar.has_value_checks:
            # its string checks run on whole values (structgen.grammar.checks): token masks
            # cannot apply them, so masks over it would not be exact
            raise MatcherUsageError(
                "this grammar checks values it cannot mask (it was compiled for validation, e.g. "
                "hostname A-labels or idn-* formats); compile it for generation "
                "(compile_constraint, or JsonSchemaOptions(value_checks=False))")
        if max_rollback is not None:
            max_rollback = whole_number("max_rollback", max_rollback, 0)
        self.grammar = grammar
        self.vocab = vocab
        self._eng: Runtime = grammar.engine  # the byte-level runtime
        self._masks = engine_for(grammar)  # token masks over it
        self._vt = vocab_table(vocab)
        if self._masks.native:
            self._masks.counted.prepare(self._vt)  # ready by the first maxLength string
        self._tb = self._vt.token_bytes
        self._nvocab = self._vt.vocab_size
        self._eos = frozenset(int(x) for x in vocab.eos_token_ids)
        # free configurations met so far (shared by the grammar's matchers on this vocabulary)
        self._free = self._masks.free_states(self._vt)
        self._steps = self._masks.step_shortcuts(self._vt)
        self._max_rollback = max_rollback
        self._bm_ok: Target | None = None  # the last bitmask checked
        self._hist: list[int] = []
        self._epoch = 0
        # masks of settled configurations met by this matcher (epoch ``_seen_epoch``): a
        # configuration met again (a string's content, an array's separator) skips the
        # engine's cache and its bookkeeping
        self._seen: dict[int, NDArray[np.uint32]] = {}
        self._seen_epoch = -1
        self.reset()

    # -- engine epochs ----------------------------------------------------------------------
    # The engine may flush its tables (memory budget) and renumber configurations; ``_hist``
    # holds ids of epoch ``_epoch``. Every step checks the epoch before and after (a cheap
    # comparison) and, when it moved, translates the history and redoes the step holding the
    # engine lock, under which no other thread can flush.
    def _sync(self) -> None:
        """Translate the history to the engine's current epoch (hold the engine lock)."""
        eng = self._eng
        if self._epoch != eng.epoch:
            self._hist[:] = eng.translate(self._epoch, self._hist)
            self._epoch = eng.epoch

    # -- core verbs ---------------------------------------------------------------------
    def _token_id(self, token_id: object) -> int:
        """``token_id`` as an int in ``[0, vocab_size)``, else :class:`MatcherUsageError` (an
        id outside the vocabulary is a caller bug, not a grammar verdict)."""
        tid = token_id if type(token_id) is int else whole_number("token id", token_id, 0)
        if not 0 <= tid < self._nvocab:
            raise MatcherUsageError(f"token id {tid} is outside the vocabulary "
                                    f"[0, {self._nvocab})")
        return tid

    def _advance(self, cid: int, tid: int) -> int:
        if cid == _TERMINATED:
            return -1
        if tid in self._eos:
            return _TERMINATED if self._eng.is_accepting(cid) else -1
        free = self._steps.get(cid)
        if free is not None and free.jumps is not None:  # free text: a lookup, no walk
            return free.jumps.get(tid, free.usual)
        if not (0 <= tid < len(self._tb)):
            return -1
        data = self._tb[tid]
        if not data:
            return -1
        return self._eng.walk(cid, data, self._epoch)

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token. Returns False (state unchanged) if the grammar forbids it;
        raises :class:`~structgen.errors.MatcherUsageError` for an id that is not an integer
        in ``[0, vocab_size)``."""
        tid = token_id
        if type(tid) is not int or not 0 <= tid < self._nvocab:
            tid = self._token_id(tid)
        eng = self._eng
        ep = self._epoch
        if ep == eng.epoch:
            h = self._hist
            cid = h[-1]
            tb = self._tb
            if cid >= 0 and tid < len(tb) and tid not in self._eos:  # _advance, inlined
                free = self._steps.get(cid)
                if free is not None and free.jumps is not None:
                    nxt = free.jumps.get(tid, free.usual)
                else:
                    data = tb[tid]
                    nxt = eng.walk(cid, data, ep) if data else -1
            else:
                nxt = self._advance(cid, tid)
            if nxt != STALE and eng.epoch == ep:
                if nxt == -1:
                    return False
                h.append(nxt)
                if eng.epoch == ep:  # else a flush may have described the history without it
                    if self._max_rollback is not None:
                        self._trim()
                    return True
                h.pop()
        with eng.lock:  # the tables were flushed: redo the step where no other thread can
            self._sync()
            nxt = self._advance(self._hist[-1], tid)
            self._sync()  # the step itself may have flushed (nxt is then of the new epoch)
            if nxt == -1:
                return False
            self._push(nxt)
            return True

    def _push(self, cid: int) -> None:
        self._hist.append(cid)
        self._trim()

    def _trim(self) -> None:
        h = self._hist
        mr = self._max_rollback
        if mr is not None and len(h) > mr + 1:
            del h[: len(h) - mr - 1]

    def accept_tokens(self, token_ids: Iterable[int]) -> int:
        """Accept tokens in order, stopping at the first rejected one; returns how many."""
        n = 0
        for t in token_ids:
            if not self.accept_token(t):
                break
            n += 1
        return n

    def validate_tokens(self, token_ids: Iterable[object], *, budget: int | None = None) -> int:
        """How many leading tokens of ``token_ids`` would be accepted; the state is unchanged.
        With ``budget`` (tokens left, the first of ``token_ids`` included), a token must also
        keep the budget rule (:mod:`structgen.masks.budget`) at its position."""
        ids = [self._token_id(t) for t in token_ids]
        eng = self._eng
        if budget is not None:
            with eng.lock:
                self._sync()
                return self._count_within(self._hist[-1], ids, int(budget))
        ep = self._epoch
        if ep == eng.epoch:
            n = self._count_valid(self._hist[-1], ids)
            if n >= 0 and eng.epoch == ep:
                return n
        with eng.lock:
            self._sync()
            return self._count_valid(self._hist[-1], ids)

    def _count_valid(self, cid: int, ids: list[int]) -> int:
        """How many of ``ids`` are accepted in turn from ``cid``; -1 when a walk came back
        STALE (the caller redoes it under the lock)."""
        n = 0
        for t in ids:
            cid = self._advance(cid, t)
            if cid == STALE:
                return -1
            if cid == -1:
                break
            n += 1
        return n

    def _count_within(self, cid: int, ids: list[int], budget: int) -> int:
        """:meth:`_count_valid` under the budget rule (hold the engine lock; steps never
        flush)."""
        eng = self._eng
        bt = self._masks.budget_table(self._vt)
        n = 0
        for t in ids:
            left = budget - n
            if cid == _TERMINATED or left <= 0:
                break
            if t in self._eos:
                if not eng.is_accepting(cid):
                    break
                cid = _TERMINATED
                n += 1
                continue
            data = self._tb[t] if 0 <= t < len(self._tb) else None
            if not data:
                break
            nxt = cid
            for b in data:
                nxt = eng.step(nxt, b)
                if nxt < 0:
                    break
            if nxt < 0 or not bt.allows(cid, nxt, left):
                break
            cid = nxt
            n += 1
        return n

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (EOS included). Raises
        :class:`~structgen.errors.MatcherUsageError` (a ValueError) for a negative count or
        more tokens than the history holds (bounded by ``max_rollback``)."""
        if type(num_tokens) is not int:
            num_tokens = whole_number("num_tokens", num_tokens, 0)
        if num_tokens < 0 or num_tokens > len(self._hist) - 1:
            raise MatcherUsageError(f"cannot roll back {num_tokens} tokens: only "
                                    f"{len(self._hist) - 1} can be rolled back")
        if num_tokens:
            del self._hist[-num_tokens:]

    def fork(self) -> Matcher:
        """An independent copy of this matcher (shares the compiled grammar and caches)."""
        m = Matcher.__new__(Matcher)
        m.grammar = self.grammar
        m.vocab = self.vocab
        m._eng = self._eng
        m._masks = self._masks
        m._vt = self._vt
        m._tb = self._tb
        m._nvocab = self._nvocab
        m._eos = self._eos
        m._free = self._free
        m._steps = self._steps
        m._max_rollback = self._max_rollback
        m._bm_ok = None
        m._seen = {}
        m._seen_epoch = -1
        with self._eng.lock:
            m._hist = list(self._hist)
            m._epoch = self._epoch
            self._eng.register(m)
        return m

    def reset(self) -> None:
        """Back to the start state (as a fresh request)."""
        eng = self._eng
        with eng.lock:
            self._hist = [eng.start]
            self._epoch = eng.epoch
            eng.register(self)

    @property
    def num_accepted(self) -> int:
        """Tokens accepted and still rollback-able (the history length)."""
        return len(self._hist) - 1

    # -- masks ------------------------------------------------------------------------------
    def _mask_words(self) -> NDArray[np.uint32]:
        cid = self._hist[-1]
        vt = self._vt
        if cid == _TERMINATED:
            bits = np.zeros(vt.num_words * 32, dtype=bool)
            bits[vt.eos_ids] = True
            return np.packbits(bits, bitorder="little").view(np.uint32)
        eng = self._eng
        ep = self._epoch
        if ep == eng.epoch:
            seen = self._seen
            if self._seen_epoch == ep:
                m = seen.get(cid)
                if m is not None:
                    return m
            m = self._masks.token_mask_at(cid, vt, ep)
            if m is not None and eng.epoch == ep:
                free = self._free.get(cid)
                if free is None or free.visits >= 0:
                    self._note(cid, m, free)
                elif free.jumps is None:  # settled: nothing more to count
                    if self._seen_epoch != ep or len(seen) >= _SEEN_MAX:
                        seen.clear()
                        self._seen_epoch = ep
                    seen[cid] = m
                return m
        with eng.lock:
            self._sync()
            return self._masks.token_mask(self._hist[-1], vt)

    def _note(self, cid: int, words: NDArray[np.uint32], free: FreeState | None) -> None:
        """A mask of ``cid`` (current configuration, ``words`` its mask) was asked for: find
        out once whether ``cid`` is free, and count the visit (:meth:`_visit`), so that free
        text gets its step shortcut whichever way its masks are read."""
        if free is None:
            eng = self._eng
            with eng.lock:
                if self._epoch != eng.epoch or self._hist[-1] != cid:
                    return
                free = self._masks.free_state(cid, self._vt, words)
        if free.visits >= 0:
            self._visit(free)

    def _cached_words(self) -> NDArray[np.uint32] | None:
        """The current mask's words if the engine has them cached (no walk), else None."""
        cid = self._hist[-1]
        if cid == _TERMINATED or cid < 0:
            return None
        eng = self._eng
        ep = self._epoch
        if ep != eng.epoch:
            return None
        m = self._masks.cached_mask(cid, self._vt)
        return m if eng.epoch == ep else None

    def forbidden_token_ids(self) -> NDArray[np.int64] | None:
        """The token ids the grammar forbids now when they are few (at most
        :data:`~structgen.masks.engine.FREE_MAX_FORBIDDEN`: free text between triggers, say),
        else None. Ascending int64, read-only; EOS is among them when the input may not end
        here. Setting these logits to -inf is exactly what the mask does (for logits no wider
        than the vocabulary), at a cost that does not grow with the vocabulary; after the
        first visit of a configuration this is a lookup. None once terminated."""
        cid = self._hist[-1]
        if cid < 0:
            return None
        eng = self._eng
        ep = self._epoch
        if ep == eng.epoch:
            free = self._free.get(cid)
            if free is not None and eng.epoch == ep:
                if free.visits >= 0:
                    self._visit(free)
                return free.forbidden
        with eng.lock:
            self._sync()
            words = self._masks.token_mask(self._hist[-1], self._vt)
            self._sync()  # the mask may have flushed the tables first
            return self._masks.free_state(self._hist[-1], self._vt, words).forbidden

    def _visit(self, free: FreeState) -> None:
        """Count a visit of a free configuration; a configuration visited often gets its
        token steps (:meth:`Engine.add_jumps <structgen.masks.engine.Engine.add_jumps>`)."""
        free.visits += 1
        if free.visits >= FREE_JUMPS_AFTER:
            eng = self._eng
            with eng.lock:
                self._sync()
                if self._free.get(self._hist[-1]) is free:
                    self._masks.add_jumps(self._hist[-1], self._vt, free)

    def get_bitmask_words(self) -> NDArray[np.uint32]:
        """The current mask as packed uint32 words ``[ceil(vocab_size/32)]`` (read-only view)."""
        return self._mask_words()

    def fill_bitmask(self, bitmask: Bitmask, row: int = 0, *, budget: int | None = None) -> None:
        """Write the current mask into ``bitmask[row]`` (int32 ``[rows, W]``, torch or numpy,
        ``W >= ceil(vocab_size/32)``). With ``budget`` (tokens left, this position included)
        the mask is narrowed by the budget rule (:meth:`budget_mask_words`).

        After termination only EOS is allowed. The tensor may be on any device; CPU
        tensors and numpy arrays are written without a copy through a numpy view. Columns
        beyond ``ceil(vocab_size/32)`` (a model whose logits are wider than the matcher's
        vocabulary) are zeroed: tokens outside the vocabulary are never allowed. Raises
        :class:`~structgen.errors.MatcherUsageError` for anything but a writable 2-d int32
        array or tensor that wide, or a row outside ``[0, rows)`` (no negative indices).
        """
        ok = self._bm_ok
        # checked once per buffer (and again if a CPU tensor's storage moved: resize_, set_;
        # only CPU tensors record a pointer, numpy arrays -1)
        if ok is None or ok[0] is not bitmask or (ok[4] >= 0 and cast("Tensor", bitmask).data_ptr() != ok[4]):
            ok = self._bm_ok = bitmask_target(bitmask, self._vt.num_words)
        _, host, rows, wide, _ptr = ok
        if type(row) is not int or not 0 <= row < rows:
            row = row_index(row, rows)
        words = self._mask_words() if budget is None else self._budget_words(budget)[0]  # uint32
        if host is not None:  # numpy array or CPU tensor: written through the cached uint32 view
            if wide:
                write_row(host[row], words, words.shape[0], True)
                return
            try:
                host[row] = words
            except ValueError:
                write_row(host[row], words, words.shape[0], False)  # raises the usage error
            return
        # a device tensor: the tensor's own constructor (this layer never imports torch)
        assert not isinstance(bitmask, np.ndarray)  # numpy arrays have a host view
        nw = words.shape[0]
        bitmask[row, :nw].copy_(bitmask.new_tensor(words.view(np.int32), device="cpu"), non_blocking=False)
        if wide:
            bitmask[row, nw:].zero_()

    def start_look_ahead(self, *, max_configs: int = LOOK_AHEAD_CONFIGS,
                         max_depth: int = LOOK_AHEAD_DEPTH) -> None:
        """Prepare, on a background thread, the masks of the configurations up to
        ``max_depth`` bytes ahead (nearest first, at most ``max_configs`` new ones), so that
        the next token's mask is likely cached when it comes
        (:mod:`structgen.masks.lookahead`). Call it once this step's mask is read, while the
        model computes the next logits; it returns at once and stops by itself when this
        matcher moves on. The masks are the same with or without it."""
        max_configs = whole_number("max_configs", max_configs, 0)
        max_depth = whole_number("max_depth", max_depth, 0)
        cid = self._hist[-1]
        if cid < 0 or self._epoch != self._eng.epoch or not max_configs or not max_depth:
            return
        submit(self, LookAheadJob(self, cid, self._epoch, self._masks, self._eng, self._vt,
                                  max_configs, max_depth))

    def allowed_token_ids(self, *, budget: int | None = None) -> list[int]:
        """All token ids allowed now (EOS included when accepting), ascending; with
        ``budget``, under the budget rule (:meth:`budget_mask_words`)."""
        words = self._mask_words() if budget is None else self._budget_words(budget)[0]
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        ids = np.nonzero(bits)[0]
        out: list[int] = ids[ids < self._vt.vocab_size].tolist()
        return out

    # -- token budget (structgen.masks.budget) ---------------------------------------------
    def _budget_words(self, budget: int) -> tuple[NDArray[np.uint32], bool]:
        """(the mask under the budget rule with ``budget`` tokens left, whether the rule
        removed a token the grammar allows)."""
        eng = self._eng
        vt = self._vt
        with eng.lock:
            self._sync()
            cid = self._hist[-1]
            if cid == _TERMINATED:
                return self._mask_words(), False
            words = self._masks.token_mask(cid, vt)
            if self._epoch != eng.epoch:  # the mask flushed the tables first
                self._sync()
                cid = self._hist[-1]
                words = self._masks.token_mask(cid, vt)
            bt = self._masks.budget_table(vt)
            budget = int(budget)
            return bt.mask(cid, words, budget), bt.narrows(cid, budget)

    def budget_mask_words(self, budget: int) -> tuple[NDArray[np.uint32], bool]:
        """The current mask under the budget rule (:mod:`structgen.masks.budget`) with
        ``budget`` tokens left, this position included, as packed uint32 words; and whether
        the rule removed a token the grammar allows here. A token is kept when the first
        shortest completion after it, tokenized greedily, plus EOS fits in ``budget - 1``."""
        return self._budget_words(budget)

    def budget_narrows(self, budget: int) -> bool:
        """Whether the budget rule with ``budget`` tokens left removes a token the grammar
        allows here (the second item of :meth:`budget_mask_words`, without building the mask)."""
        eng = self._eng
        with eng.lock:
            self._sync()
            cid = self._hist[-1]
            if cid == _TERMINATED:
                return False
            return self._masks.budget_table(self._vt).narrows(cid, int(budget))

    def tokens_to_finish(self, limit: int | None = None) -> int:
        """Tokens the budget rule needs to end from here, EOS included: the greedy
        tokenization of the first shortest completion, plus one (0 once terminated;
        :data:`~structgen.masks.budget.UNREACHABLE` + 1 when no completion can be spelled).

        With ``limit`` (the budget it is compared with): exact when at most ``limit``; above
        it, a number above ``limit`` that may be only a lower bound, because counting stops
        there -- so a constraint whose shortest output is huge costs about ``limit`` tokens'
        work, not its length. Without, the count is exact whatever it costs. Raises
        :class:`~structgen.errors.CompileLimitError` (or its timeout) when the constraint's
        automaton is too large to measure (see :mod:`structgen.grammar.completion`)."""
        cap = None
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)):
                raise MatcherUsageError(f"limit must be an integer or None, not {limit!r}")
            cap = int(limit) - 1
        eng = self._eng
        with eng.lock:
            self._sync()
            cid = self._hist[-1]
            if cid == _TERMINATED:
                return 0
            return self._masks.budget_table(self._vt).tokens_needed(cid, cap) + 1

    def is_token_allowed(self, token_id: int) -> bool:
        """Whether the grammar allows ``token_id`` now (state unchanged); out-of-vocabulary
        ids raise :class:`~structgen.errors.MatcherUsageError`."""
        return self.validate_tokens((token_id,)) == 1

    # -- forced continuations ------------------------------------------------------------
    def viable_prefix_length(self, data: bytes) -> int:
        """Length of the longest prefix of ``data`` (bytes) the grammar allows from here."""
        eng = self._eng
        with eng.lock:  # stepping never flushes; holding the lock keeps others from it
            self._sync()
            cid = self._hist[-1]
            if cid == _TERMINATED:
                return 0
            for i, b in enumerate(data):
                cid = eng.step(cid, b)
                if cid < 0:
                    return i
            return len(data)

    def forced_bytes(self, limit: int = 4096, *, after: bytes = b"") -> bytes:
        """The bytes the grammar alone determines from here: the longest string that every
        continuation starts with (stops where the input could also end). With ``after``: the
        forced bytes following the bytes ``after`` (empty if ``after`` is not allowed)."""
        eng = self._eng
        with eng.lock:  # no other thread flushes meanwhile; the walk may (then: new ids)
            cid = self._config_after(after)
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

    def must_end_after(self, data: bytes = b"") -> bool:
        """True when, after the bytes ``data`` from here, the output can only end (it is
        complete and no byte may follow): EOS is then the one token allowed. False when
        ``data`` is not allowed. Does not advance the matcher."""
        eng = self._eng
        with eng.lock:
            cid = self._config_after(data)
            return cid >= 0 and bool(eng.is_accepting(cid)) and eng.live_bytes(cid).shape[0] == 0

    def _config_after(self, data: bytes) -> int:
        """The configuration after the bytes ``data`` from the current one, or -1 when they
        are not allowed or the matcher has terminated. The caller holds the engine lock."""
        self._sync()
        cid = self._hist[-1]
        if cid == _TERMINATED:
            return -1
        if data:
            cid = self._eng.walk(cid, data)
            self._sync()
        return cid if cid >= 0 else -1

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
        eng = self._eng
        ep = self._epoch
        cid = self._hist[-1]
        if ep == eng.epoch:
            ok = cid != _TERMINATED and eng.is_accepting(cid)
            if eng.epoch == ep:
                return ok
        with eng.lock:
            self._sync()
            cid = self._hist[-1]
            return cid != _TERMINATED and eng.is_accepting(cid)

    def is_terminated(self) -> bool:
        """True once EOS has been accepted."""
        return self._hist[-1] == _TERMINATED

    def __repr__(self) -> str:
        return (f"Matcher(accepted={self.num_accepted}, accepting={self.is_accepting()}, "
                f"terminated={self.is_terminated()})")


def fill_bitmasks(matchers: Iterable[Matcher | None], bitmask: Bitmask, rows: Iterable[object] | None = None,
                  *, executor: Executor | None = None) -> None:
    """Write the current mask of each matcher into one packed bitmask: ``matchers[i]`` into
    row ``rows[i]`` (default ``i``) of ``bitmask`` (int32 ``[R, ceil(V/32)]``, torch on any
    device or numpy, at least ``ceil(V/32)`` columns: columns beyond a matcher's vocabulary
    are zeroed); a ``None`` matcher sets its row to all ones (every token allowed). Rows must
    be distinct and in ``[0, R)``; misuse raises :class:`~structgen.errors.MatcherUsageError`.

    Masks already cached cost a lookup each. The others are computed per engine (matchers of
    one grammar share an engine, whose walks are serialised by its lock); with an
    ``executor`` (a :class:`concurrent.futures.Executor`, e.g. a ``ThreadPoolExecutor``) the
    engines with work run in parallel, the compiled trie walks releasing the GIL. The rows
    are then written in one copy (one host-to-device transfer for a CUDA tensor)."""
    ms = list(matchers)
    nw = 0
    for m in ms:
        if m is not None and not isinstance(m, Matcher):
            raise MatcherUsageError(f"fill_bitmasks takes Matchers (or None), not {type(m).__name__}")
        if m is not None:
            nw = max(nw, m._vt.num_words)
    bitmask_kind(bitmask, nw)
    nrows = int(bitmask.shape[0])
    rws = list(range(len(ms))) if rows is None else [whole_number("row", r, 0) for r in rows]
    if len(rws) != len(ms):
        raise MatcherUsageError(f"{len(ms)} matchers but {len(rws)} rows")
    for r in rws:
        row_index(r, nrows)
    if len(set(rws)) != len(rws):
        raise MatcherUsageError("fill_bitmasks was given the same row twice")
    if not ms:
        return
    words: list[NDArray[np.uint32] | None] = [None] * len(ms)
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
            m = ms[i]
            if m is not None:  # (pending holds matchers only)
                words[i] = m._mask_words()

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
            block[i, w.shape[0]:] = 0  # columns beyond the vocabulary: never allowed
    if isinstance(bitmask, np.ndarray):
        if not bitmask.flags.writeable:
            raise MatcherUsageError("bitmask is a read-only array")
        bitmask[rws] = block
        return
    # Tensors are built with the destination's own constructors (new_tensor), so this layer
    # never imports torch.
    src = bitmask.new_tensor(block, device="cpu")
    dst = bitmask.new_tensor(rws, device="cpu").long()
    if bitmask.device.type == "cpu":
        bitmask.index_copy_(0, dst, src)
    else:  # one pinned host-to-device copy for every row
        dev = bitmask.device
        bitmask.index_copy_(0, dst.to(dev), src.pin_memory().to(dev, non_blocking=True))


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
