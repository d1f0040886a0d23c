"""Room for the runtime tables' next doubling, made ahead on a background thread.

A runtime table that fills up is doubled: copied into fresh memory. The first touch of fresh memory
costs page faults, and with transparent huge pages a compaction of physical memory: about 60 ms
for a 32 MB table on the machines measured (``benchmarks/results/``), paid inside one token's
mask. Once a big table is half full, :class:`Spares` allocates and touches its next
size on a thread of its own (numpy releases the GIL while it fills), so that the doubling only
copies into memory that is already there (about 3 ms for 32 MB).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["SPARE_MIN_BYTES", "WAIT_MAX_S", "Spares"]

#: Tables whose next size is smaller than this are doubled in place: their faults cost little.
SPARE_MIN_BYTES = 4 << 20

#: The longest a doubling waits for room still being made (seconds); past it, it makes its own.
WAIT_MAX_S = 0.5

#: One wanted array: (table name, shape, dtype, fill value or None: any content will do).
Wanted = tuple[str, tuple[int, ...], np.dtype[np.generic], object]


class Spares:
    """Arrays made ahead for the tables' next doubling, by table name. Thread-safe: one
    background thread per group of tables at a time makes them; :meth:`take` hands one over
    (or None)."""

    def __init__(self) -> None:
        self._ready: dict[str, NDArray[np.generic]] = {}
        self._lock = threading.Lock()
        self._busy: dict[str, threading.Event] = {}  # groups whose arrays are being made -> set when done

    def wait(self, group: str, timeout: float = WAIT_MAX_S) -> None:
        """Wait (at most ``timeout`` seconds) until the arrays being made for ``group`` are
        done. A doubling that finds its room half made waits for the rest: making it again
        on the caller's thread costs the whole allocation, and both would fault pages at
        once."""
        done = self._busy.get(group)
        if done is not None:
            done.wait(timeout)

    def take(self, name: str, shape: tuple[int, ...],
             dtype: np.dtype[np.generic]) -> NDArray[np.generic] | None:
        """The array made for ``name`` if it has this shape and dtype, else None."""
        a = self._ready.pop(name, None)
        return a if a is not None and a.shape == shape and a.dtype == dtype else None

    def nbytes(self) -> int:
        """Bytes held by arrays made and not yet taken."""
        return sum(a.nbytes for a in list(self._ready.values()))

    def prepare(self, group: str, wanted: Sequence[Wanted]) -> bool:
        """Make the ``wanted`` arrays of ``group`` (the biggest first) on a background thread.
        False when that group's are being made already (ask again later)."""
        with self._lock:
            if group in self._busy:
                return False
            todo = [w for w in wanted if not self._has(w)]
            if not todo:
                return True
            todo.sort(key=lambda w: -int(np.prod(w[1])) * w[2].itemsize)
            for w in todo:  # an array of an earlier size is of no use any more
                self._ready.pop(w[0], None)
            done = self._busy[group] = threading.Event()
        threading.Thread(target=self._make, args=(group, todo, done), daemon=True,
                         name="structgen-table-room").start()
        return True

    def _has(self, w: Wanted) -> bool:
        a = self._ready.get(w[0])
        return a is not None and a.shape == w[1] and a.dtype == w[2]

    def _make(self, group: str, todo: list[Wanted], done: threading.Event) -> None:
        try:
            for name, shape, dtype, fill in todo:
                a = np.empty(shape, dtype=dtype)
                a.fill(0 if fill is None else fill)  # touches every page
                self._ready[name] = a
        except MemoryError:  # no room now: the doubling allocates then, as without spares
            pass
        finally:
            with self._lock:
                self._busy.pop(group, None)
            done.set()
