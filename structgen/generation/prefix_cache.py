"""Saved KV states of prompt prefixes, so that a prompt starting with tokens already prefilled
skips their prefill.

Requests to one model often share a long start: a system prompt, a tool list, few-shot
examples, the earlier turns of a conversation. A :class:`PrefixCache` keeps, in host memory,
the backend's KV state of such prefixes, keyed by their token ids at block boundaries (a
multiple of :data:`BLOCK` tokens; each key is a chain of block hashes, so finding the longest
saved prefix of a prompt is one pass over it), bounded in bytes and evicted least recently
used. A backend asks :meth:`PrefixCache.lookup` for the longest saved prefix of a prompt,
restores it, prefills the rest, and saves the states :meth:`PrefixCache.plan` names on the way.

Which prefixes to save: a snapshot costs a copy of the KV state up to that point, so the cache
saves where reuse is likely rather than at every block:

- the prompt's own last boundary (the same prompt again: a retry, ``n`` choices, a benchmark);
- the end of the part the caller says later prompts share (``shared_prefix``: the conversation
  before the last message, see :func:`structgen.generation.api.conversation_prefix`);
- the end of what the prompt shares with recently seen prompts (the point where two prompts
  branch, as a radix tree of the prompts would show; the first prompt of a batch that shares a
  system prompt with the others saves it for them).

Exactness is the backend's business: a restored state must be the bytes a fresh prefill
computes, and the positions after it must be computed as a fresh prefill computes them (see
:meth:`structgen.generation.llamacpp.LlamaCppLM.prefill`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["BLOCK", "DEFAULT_PREFIX_CACHE_MB", "PrefixCache", "PrefixCacheStats"]

#: Prefix lengths the cache saves are multiples of this many tokens.
BLOCK = 64
#: The default memory bound of a model's prefix cache, in MiB.
DEFAULT_PREFIX_CACHE_MB = 512
_RECENT = 64  # prompts remembered to find where new prompts branch from them


@dataclass
class PrefixCacheStats:
    """Counters of a :class:`PrefixCache` (since it was made)."""

    lookups: int = 0
    hits: int = 0
    tokens_reused: int = 0    # prompt tokens restored instead of prefilled
    tokens_looked_up: int = 0  # prompt tokens of every lookup
    saved: int = 0
    evicted: int = 0
    restore_failures: int = 0  # hits the backend could not load (counted as misses)
    entries: int = 0
    bytes: int = 0


#: a backend's saved KV state (transformers: per-layer key and value tensors; llama.cpp: a
#: sequence's state bytes)
S = TypeVar("S")


@dataclass
class _Entry(Generic[S]):
    tokens: tuple[int, ...]
    state: S
    nbytes: int


def _chain(tokens: Sequence[int], upto: int, block: int) -> list[int]:
    """``h[i]``: the hash of ``tokens[: (i + 1) * block]``, for every full block up to ``upto``."""
    out = []
    h = 0
    for lo in range(0, upto - block + 1, block):
        h = hash((h, tuple(tokens[lo: lo + block])))
        out.append(h)
    return out


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache(Generic[S]):
    """KV states of prompt prefixes (see the module docstring), thread-safe.

    ``max_bytes``: the memory bound (0 disables the cache: nothing is saved or found).
    ``block``: saved prefix lengths are multiples of it (default :data:`BLOCK`).
    ``variant``, given to every call, keeps states apart that must not mix (a backend's
    settings that change the computed values, e.g. flash attention on or off).
    """

    def __init__(self, max_bytes: int = DEFAULT_PREFIX_CACHE_MB << 20, block: int = BLOCK) -> None:
        self.max_bytes = int(max_bytes)
        self.block = int(block)
        self._entries: OrderedDict[tuple[Hashable, int, int], _Entry[S]] = OrderedDict()
        self._recent: deque[tuple[int, ...]] = deque(maxlen=_RECENT)
        self._lock = threading.Lock()
        self.stats = PrefixCacheStats()

    def __deepcopy__(self, memo: dict[int, object]) -> PrefixCache[S]:
        # a copy of the model (a stock copy, a peer in a benchmark) computes its own states
        return PrefixCache(self.max_bytes, block=self.block)

    def __reduce__(self) -> tuple[type[PrefixCache[S]], tuple[int, int]]:
        # saved states are host copies tied to this process's backend objects: not sent along
        return (PrefixCache, (self.max_bytes, self.block))

    @property
    def enabled(self) -> bool:
        """Whether anything can be saved."""
        return self.max_bytes > 0

    def lookup(self, variant: Hashable, tokens: Sequence[int],
               allowed: Callable[[int], bool]) -> tuple[int, S | None]:
        """The longest saved prefix of ``tokens`` whose length ``allowed(length)`` accepts:
        ``(length, state)``, or ``(0, None)``."""
        if not self.enabled:
            return 0, None
        chain = _chain(tokens, len(tokens), self.block)
        with self._lock:
            self.stats.lookups += 1
            self.stats.tokens_looked_up += len(tokens)
            for i in range(len(chain) - 1, -1, -1):
                length = (i + 1) * self.block
                if not allowed(length):
                    continue
                key = (variant, length, chain[i])
                entry = self._entries.get(key)
                if entry is not None and entry.tokens == tuple(tokens[:length]):
                    self._entries.move_to_end(key)
                    self.stats.hits += 1
                    self.stats.tokens_reused += length
                    return length, entry.state
        return 0, None

    def restore_failed(self, length: int) -> None:
        """The backend could not load the state :meth:`lookup` just gave (``length`` tokens):
        count that lookup as a miss."""
        with self._lock:
            self.stats.hits -= 1
            self.stats.tokens_reused -= length
            self.stats.restore_failures += 1

    def note(self, prompts: Sequence[Sequence[int]]) -> None:
        """Remember prompts about to be prefilled, so :meth:`plan` sees where each branches
        from the others (call it for every prompt of a batch before prefilling any)."""
        if not self.enabled:
            return
        with self._lock:
            for p in prompts:
                t = tuple(p)
                if t and t not in self._recent:
                    self._recent.append(t)

    def plan(self, variant: Hashable, tokens: Sequence[int], start: int, allowed: Callable[[int], bool],
             shared_prefix: int = 0, min_gap: int = 1) -> list[int]:
        """Prefix lengths of ``tokens`` to save while prefilling from ``start`` (ascending,
        each a multiple of ``block`` above ``start`` that ``allowed`` accepts and that is not
        saved yet), each at least ``min_gap`` above ``start`` and the length before it (a
        backend whose decodes must keep a minimum size; a later length too close is dropped)."""
        if not self.enabled:
            return []
        n = len(tokens)
        t = tuple(tokens)
        points = {n, min(max(0, shared_prefix), n)}
        with self._lock:
            points.update(min(_common(t, r), n) for r in self._recent if r != t)
            chain = _chain(tokens, n, self.block)
            out = []
            for p in points:
                length = p - p % self.block
                # the largest allowed block boundary at or below the point
                while length > start and not allowed(length):
                    length -= self.block
                if length > start and (variant, length, chain[length // self.block - 1]) not in self._entries:
                    out.append(length)
        kept: list[int] = []
        for length in sorted(set(out)):
            if length - (kept[-1] if kept else start) >= min_gap:
                kept.append(length)
        return kept

    def save(self, variant: Hashable, tokens: Sequence[int], state: S, nbytes: int) -> None:
        """Keep ``state`` (``nbytes`` of memory) as the KV state of ``tokens`` (a multiple of
        ``block`` long); evicts the least recently used states beyond the bound."""
        n = len(tokens)
        if not self.enabled or n == 0 or n % self.block or nbytes > self.max_bytes:
            return
        key = (variant, n, _chain(tokens, n, self.block)[-1])
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.stats.bytes -= old.nbytes
            self._entries[key] = _Entry(tuple(tokens), state, int(nbytes))
            self.stats.bytes += int(nbytes)
            self.stats.saved += 1
            while self.stats.bytes > self.max_bytes and self._entries:
                _, gone = self._entries.popitem(last=False)
                self.stats.bytes -= gone.nbytes
                self.stats.evicted += 1
            self.stats.entries = len(self._entries)

    def clear(self) -> None:
        """Drop every saved state."""
        with self._lock:
            self._entries.clear()
            self._recent.clear()
            self.stats.bytes = 0
            self.stats.entries = 0
