"""Room for the runtime tables' next doubling, made ahead on a background thread.

A runtime table that fills up is doubled: copied into fresh memory. The first touch of fresh memory
costs page faults, and with transparent huge pages a compaction of physical memory: about 60 ms
for a 32 MB table on the machines measured (``benchmarks/results/``), paid inside one token's
mask. Once a big table is half full, :class:`Spares` allocates and touches its next
size on a thread of its own (numpy releases the GIL while it fills), so that the doubling only
copies into memory that is already there (about 3 ms for 32 MB).

The 1 KiB rows of the two biggest tables (the transition rows of configurations and of rule
states) are written whole when their state is interned, so they need no copy at all: once such
a table is past :data:`RESERVE_FROM_BYTES`, :func:`reserve` maps address space for it up to
the runtime's table budget, and each doubling is a wider view of that mapping. Its pages are
faulted in as rows come into use, a few microseconds at a time, instead of tens of
milliseconds inside one token's mask. A process with an address-space limit
(``RLIMIT_AS``) gets no reservations: it doubles by copying, as above.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Sequence

try:
    import resource
except ImportError:  # pragma: no cover - not a POSIX system
    resource = None  # type: ignore[assignment]

import numpy as np
from numpy.typing import NDArray

__all__ = ["SPARE_MIN_BYTES", "WAIT_MAX_S", "Spares", "RESERVE_FROM_BYTES", "RESERVE_MAX_BYTES", "reserve",
           "can_reserve", "Reservations"]

#: Tables whose next size is smaller than this are doubled in place: their faults cost little.
SPARE_MIN_BYTES = 4 << 20

#: The longest a doubling waits for room still being made (seconds); past it, it makes its own.
WAIT_MAX_S = 0.5

#: A lazily written table gets its address space reserved once it grows past this size.
RESERVE_FROM_BYTES = 1 << 20

#: The most address space one reservation takes (the table budget caps it below that).
RESERVE_MAX_BYTES = 1 << 30


def can_reserve() -> bool:
    """Whether :func:`reserve` may map address space ahead: a POSIX system (anonymous
    mappings whose pages are committed when first written) and no ``RLIMIT_AS``, under which
    reserved address space would crowd out real allocations."""
    if resource is None or getattr(mmap, "MAP_ANONYMOUS", None) is None:
        return False
    return bool(resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY)


def reserve(rows: int, dims: tuple[int, ...], dtype: np.dtype[np.generic]) -> NDArray[np.generic] | None:
    """An array of ``rows`` rows of shape ``dims`` over anonymous memory that is mapped but
    not yet touched (every page reads zero and costs nothing until it is written), or None
    where reserving is not possible or not wanted (an address-space limit, no anonymous
    mappings, no room)."""
    if not can_reserve():
        return None
    nbytes = rows * int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    try:
        area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError, OverflowError, MemoryError):
        return None
    return np.frombuffer(area, dtype=dtype).reshape((rows,) + dims)


def _row_bytes(table: NDArray[np.generic]) -> int:
    return int(table.itemsize * table[0].size)


class Reservations:
    """The reservations of one set of lazily written tables, by table name: each up to
    ``limit_bytes`` (capped at :data:`RESERVE_MAX_BYTES`; 0, or an address-space limit: none).
    Callers hold the tables' lock."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = min(limit_bytes, RESERVE_MAX_BYTES) if can_reserve() else 0
        # table name -> its whole reservation; None: none to be had, or outgrown (copied from then on)
        self._areas: dict[str, NDArray[np.generic] | None] = {}

    def covers(self, name: str, table: NDArray[np.generic], rows: int) -> bool:
        """Whether ``table`` (table ``name``) grown to ``rows`` rows is a view of its reservation
        (made already, or to be made then, the table being that big), not a copy."""
        if not self.limit:
            return False
        if name in self._areas:
            area = self._areas[name]
            return area is not None and area.shape[0] >= rows
        return rows * _row_bytes(table) >= RESERVE_FROM_BYTES

    def widen(self, name: str, table: NDArray[np.generic], rows: int) -> NDArray[np.generic] | None:
        """``table`` (table ``name``) grown to ``rows`` rows as a view of its reservation, made
        here (and the rows so far copied into it, once) if it has none; None where it must be
        copied instead."""
        if not self.covers(name, table, rows):
            return None
        area = self._areas.get(name)
        if area is None:
            area = reserve(max(rows, self.limit // _row_bytes(table)), table.shape[1:], table.dtype)
            self._areas[name] = area
            if area is None:
                return None
            area[: table.shape[0]] = table
        if 2 * rows > area.shape[0]:
            self._areas[name] = None  # its next doubling is past the reservation: a copy
        return area[:rows]


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
