"""A token cap on the text before a marker: :class:`CappedMatcher`.

Some limits are counted in tokens, which a byte-level grammar cannot express: a thinking
budget ("at most N tokens of reasoning, then ``</think>``") or a cap on the free text before a
trigger. A :class:`CappedMatcher` is a :class:`~structgen.masks.matcher.Matcher` over the same
grammar with one more rule: once ``cap`` tokens have been accepted and ``marker`` has not yet
occurred in the output, the next tokens must spell the rest of the marker (continuing a
partial match the text already ends with), a token that completes it being free to carry on
into whatever the grammar allows after it. Before the cap and after the marker the masks are
the grammar's own. With ``count_after`` (e.g. the opening ``<think>`` a grammar writes first),
tokens count only once the output holds that text (the token completing it not counted). The
marker must be allowed by the grammar wherever the cap can strike (free text is).

Every verb keeps the matcher's contract (masks, accept, validate, rollback, fork, the budget
rule), so speculative decoding runs unchanged and greedy speculative output equals plain
decoding with the same cap. The tokens that can continue the marker from each partial match
are found once per vocabulary and marker (one pass over the vocabulary) and cached.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from structgen.errors import MatcherUsageError
from structgen.grammar.compiled import CompiledGrammar
from structgen.masks.matcher import Matcher
from structgen.masks.vocab import VocabLike
from structgen.masks.vocab_table import VocabTable

__all__ = ["CappedMatcher"]

_CANDIDATES: dict[tuple[str, bytes], list[NDArray[np.uint32]]] = {}
#: per history entry: the text's tail, whether the marker occurred, tokens counted so far, the
#: tail searched for ``count_after`` while it has not occurred (None once it has)
_Mark = tuple[bytes, bool, int, bytes | None]
_LOCK = threading.Lock()


def _candidate_words(vt: VocabTable, marker: bytes) -> list[NDArray[np.uint32]]:
    """For each partial match length ``k`` (0 <= k < len(marker)): the packed mask of tokens
    whose bytes are a prefix of ``marker[k:]`` or start with it."""
    key = (vt.key, marker)
    with _LOCK:
        got = _CANDIDATES.get(key)
    if got is not None:
        return got
    out: list[NDArray[np.uint32]] = []
    for k in range(len(marker)):
        rest = marker[k:]
        bits = np.zeros(vt.num_words * 32, dtype=bool)
        for tid, data in enumerate(vt.token_bytes):
            if data and (rest.startswith(data) or data.startswith(rest)):
                bits[tid] = True
        out.append(np.packbits(bits, bitorder="little").view(np.uint32))
    with _LOCK:
        _CANDIDATES[key] = out
    return out


def _partial(tail: bytes, marker: bytes) -> int:
    """Length of the longest suffix of ``tail`` that is a proper prefix of ``marker``."""
    for k in range(min(len(tail), len(marker) - 1), 0, -1):
        if tail.endswith(marker[:k]):
            return k
    return 0


class CappedMatcher(Matcher):
    """A :class:`~structgen.masks.matcher.Matcher` that forces ``marker`` (bytes or str) once
    ``cap`` tokens have been accepted without it (see the module docstring)."""

    __slots__ = ("marker", "cap", "count_after", "_marks", "_cand")

    def __init__(self, grammar: CompiledGrammar, vocab: VocabLike, *, marker: bytes | str, cap: int,
                 count_after: bytes | str | None = None, max_rollback: int | None = None) -> None:
        if isinstance(marker, str):
            marker = marker.encode("utf-8")
        if isinstance(count_after, str):
            count_after = count_after.encode("utf-8")
        self.count_after = bytes(count_after) if count_after else b""
        if not marker:
            raise MatcherUsageError("CappedMatcher needs a non-empty marker")
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise MatcherUsageError(f"cap must be an integer >= 0, not {cap!r}")
        self.marker = bytes(marker)
        self.cap = cap
        self._marks: list[_Mark] = [self._first()]
        super().__init__(grammar, vocab, max_rollback=max_rollback)
        self._cand = _candidate_words(self._vt, self.marker)

    # -- marker bookkeeping: per history entry (the text's tail, whether the marker occurred,
    # tokens counted so far, the tail searched for count_after while it has not occurred:
    # None once it has) ------------------------------------------------------------------------
    def _first(self) -> _Mark:
        return b"", False, 0, (b"" if self.count_after else None)

    def _after(self, mark: _Mark, tid: int) -> _Mark:
        tail, seen, n, otail = mark
        data = b"" if tid in self._eos else (self._tb[tid] or b"")
        if otail is not None:  # not counting yet
            text = otail + data
            if self.count_after in text:
                return b"", False, 0, None
            keep = len(self.count_after) - 1
            return b"", False, 0, (text[-keep:] if keep else b"")
        if seen or not data:
            return tail, seen, n + 1, None
        text = tail + data
        if self.marker in text:
            return b"", True, n + 1, None
        return text[-(len(self.marker) - 1):] if len(self.marker) > 1 else b"", False, n + 1, None

    def _forcing(self) -> bool:
        tail, seen, n, otail = self._marks[-1]
        return otail is None and not seen and n >= self.cap and not self.is_terminated()

    def _candidates_now(self) -> NDArray[np.uint32]:
        return self._cand[_partial(self._marks[-1][0], self.marker)]

    def _sync_marks(self) -> None:
        """Keep the marks as long as the history (the base class trims the history past
        ``max_rollback``; each mark holds its own token count)."""
        extra = len(self._marks) - len(self._hist)
        if extra > 0:
            del self._marks[:extra]

    # -- verbs ----------------------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        """As :meth:`Matcher.accept_token`, refusing tokens off the marker once forcing."""
        tid = self._token_id(token_id)
        if self._forcing() and not _has(self._candidates_now(), tid):
            return False
        mark = self._marks[-1]
        if not super().accept_token(tid):
            return False
        self._marks.append(self._after(mark, tid))
        self._sync_marks()
        return True

    def validate_tokens(self, token_ids: Iterable[object], *, budget: int | None = None) -> int:
        """As :meth:`Matcher.validate_tokens`, with the cap (state unchanged)."""
        ids = [self._token_id(t) for t in token_ids]
        f = self.fork()
        n = 0
        for t in ids:
            left = None if budget is None else int(budget) - n
            if left is not None and f.validate_tokens_plain([t], left) != 1:
                break
            if not f.accept_token(t):
                break
            n += 1
        return n

    def validate_tokens_plain(self, ids: list[int], budget: int) -> int:
        """The base class's validation under the budget rule (no cap)."""
        return Matcher.validate_tokens(self, ids, budget=budget)

    def rollback(self, num_tokens: int) -> None:
        """As :meth:`Matcher.rollback`."""
        super().rollback(num_tokens)
        if num_tokens:
            del self._marks[-int(num_tokens):]

    def reset(self) -> None:
        """Back to the start state."""
        super().reset()
        self._marks = [self._first()]

    def fork(self) -> CappedMatcher:
        """An independent copy (same grammar, marker and cap)."""
        base = Matcher.fork(self)
        m = CappedMatcher.__new__(CappedMatcher)
        for name in Matcher.__slots__:
            if name != "__weakref__":
                object.__setattr__(m, name, getattr(base, name))
        m.marker, m.cap, m.count_after, m._cand = self.marker, self.cap, self.count_after, self._cand
        m._marks = list(self._marks)
        m._eng.register(m)
        return m

    # -- masks ----------------------------------------------------------------------------------
    def _mask_words(self) -> NDArray[np.uint32]:
        words = super()._mask_words()
        return words & self._candidates_now() if self._forcing() else words

    def forbidden_token_ids(self) -> NDArray[np.int64] | None:
        """As :meth:`Matcher.forbidden_token_ids`; None while the marker is forced."""
        if self._forcing():
            return None
        return super().forbidden_token_ids()

    def _cached_words(self) -> NDArray[np.uint32] | None:
        if self._forcing():
            return None
        return super()._cached_words()

    def _budget_words(self, budget: int) -> tuple[NDArray[np.uint32], bool]:
        words, narrowed = super()._budget_words(budget)
        return (words & self._candidates_now(), narrowed) if self._forcing() else (words, narrowed)

    def forced_bytes(self, limit: int = 4096, *, after: bytes = b"") -> bytes:
        """As :meth:`Matcher.forced_bytes`; while forcing, the rest of the marker comes first."""
        if after or not self._forcing():
            return super().forced_bytes(limit, after=after)
        rest = self.marker[_partial(self._marks[-1][0], self.marker):]
        if self.viable_prefix_length(rest) < len(rest):
            return b""
        return (rest + super().forced_bytes(limit, after=rest))[:limit]


def _has(words: NDArray[np.uint32], tid: int) -> bool:
    return bool((int(words[tid >> 5]) >> (tid & 31)) & 1)
