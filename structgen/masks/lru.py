"""A map bounded by the bytes of its values, least recently used first out: the mask engine's
token-mask and split-walk caches (:class:`~structgen.masks.engine.Engine`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["ByteLru"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLru(Generic[K, V]):
    """An LRU map bounded by the bytes of its values (the caller states each value's size;
    the newest entry always stays). Callers hold the engine lock around :meth:`put`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._d: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def peek(self, key: K) -> V | None:
        """The value of ``key`` or None, without making it the most recently used."""
        hit = self._d.get(key)
        return None if hit is None else hit[0]

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used) or None."""
        hit = self._d.get(key)
        if hit is None:
            return None
        self._d.move_to_end(key)
        return hit[0]

    def put(self, key: K, value: V, nbytes: int) -> None:
        """Store ``value`` (``nbytes`` large) under ``key``, dropping the least recently used
        entries while over the limit."""
        old = self._d.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._d[key] = (value, nbytes)
        self.bytes += nbytes
        while self.bytes > self.limit and len(self._d) > 1:
            _, (_v, n) = self._d.popitem(last=False)
            self.bytes -= n

    def clear(self) -> None:
        """Drop every entry."""
        self._d.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self) -> Iterator[K]:
        return iter(self._d)
