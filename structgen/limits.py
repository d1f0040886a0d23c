"""Work limits of one request: the clock deadlines read, a deadline, and cancellation.

Everything a request makes structgen do before its first token -- lowering a schema,
building automata, the token-budget check, the first masks -- runs inside loops that read
:func:`check` (or a stride of it). A :func:`scope` puts a deadline and a cancellation test
around such work, so that a server can stop the preparation of a request whose client went
away, and so that no piece of it runs longer than the request's own deadline; with no scope
:func:`check` costs one context-variable read.

The clock is :func:`time.monotonic` unless a caller installs another with :func:`use_clock`.
Tests use a :class:`StepClock` (each read advances it by a fixed step): where a time limit
strikes then depends only on how many times the code read the clock, never on how fast the
machine is.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from structgen.errors import RequestCancelledError

__all__ = ["Scope", "StepClock", "check", "current", "deadline_within", "new_stop_cell", "now", "scope",
           "stop_cell", "use_clock"]

_clock: Callable[[], float] = time.monotonic


def now() -> float:
    """The current time (seconds) of the clock every structgen deadline is measured with."""
    return _clock()


@contextmanager
def use_clock(clock: Callable[[], float]) -> Iterator[None]:
    """Read ``clock`` instead of :func:`time.monotonic` for every deadline inside the block
    (process-wide: the work may run on other threads)."""
    global _clock
    saved = _clock
    _clock = clock
    try:
        yield
    finally:
        _clock = saved


class StepClock:
    """A clock that advances by ``step`` seconds every time it is read (deterministic
    deadlines in tests)."""

    def __init__(self, step: float = 1e-3, start: float = 0.0) -> None:
        self.step = step
        self.t = start
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        self.t += self.step
        return self.t


def new_stop_cell() -> np.ndarray:
    """A stop cell (int8 ``[1]``, 0): whoever cancels a request sets it to 1, from any thread;
    Python loops read it through :func:`check`, compiled kernels directly (they take
    :func:`stop_cell` as an argument)."""
    return np.zeros(1, dtype=np.int8)


_NEVER = new_stop_cell()  # the cell of work outside any cancellable scope: never set


@dataclass(frozen=True)
class Scope:
    """The limits of the work in progress: ``deadline`` (a :func:`now` value, or None),
    ``cancelled`` (a test that is true once nobody wants the result, or None) and ``cell``
    (a stop cell, :func:`new_stop_cell`, or None)."""

    deadline: float | None = None
    cancelled: Callable[[], bool] | None = None
    cell: np.ndarray | None = None


_current: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("structgen_limits", default=None)


def current() -> Scope | None:
    """The innermost :func:`scope` of this thread (None outside any)."""
    return _current.get()


@contextmanager
def scope(*, timeout_s: float | None = None, deadline: float | None = None,
          cancelled: Callable[[], bool] | None = None, cell: np.ndarray | None = None) -> Iterator[Scope]:
    """Run the block under a deadline (``timeout_s`` seconds from now, or ``deadline``, a
    :func:`now` value; the earlier of the two) and a cancellation test and/or stop cell. A
    scope inside another keeps the earlier deadline, both tests and the outer cell (when it
    gives none of its own)."""
    outer = _current.get()
    if outer is not None and cell is None:
        cell = outer.cell
    if timeout_s is not None:
        deadline = now() + timeout_s if deadline is None else min(deadline, now() + timeout_s)
    tests = cancelled
    if outer is not None:
        if outer.deadline is not None:
            deadline = outer.deadline if deadline is None else min(deadline, outer.deadline)
        if outer.cancelled is not None:
            tests = outer.cancelled if cancelled is None else (
                lambda a=outer.cancelled, b=cancelled: a() or b())
    token = _current.set(Scope(deadline, tests, cell))
    try:
        yield _current.get()  # type: ignore[misc]
    finally:
        _current.reset(token)


def deadline_within(deadline: float | None) -> float | None:
    """``deadline`` (a :func:`now` value or None) brought forward to the current scope's."""
    sc = _current.get()
    if sc is None or sc.deadline is None:
        return deadline
    return sc.deadline if deadline is None else min(deadline, sc.deadline)


def check() -> None:
    """Raise :class:`~structgen.errors.RequestCancelledError` when the current scope's
    request was cancelled. (Deadlines are checked by the loops that own them, which know what
    to name in their error; they take the scope's deadline through :func:`deadline_within`.)"""
    sc = _current.get()
    if sc is None:
        return
    if (sc.cell is not None and sc.cell[0]) or (sc.cancelled is not None and sc.cancelled()):
        raise RequestCancelledError("the request was cancelled (its client went away)")


def stop_cell() -> np.ndarray:
    """The current scope's stop cell, for a compiled kernel to poll (a cell never set outside
    a scope that has one)."""
    sc = _current.get()
    return _NEVER if sc is None or sc.cell is None else sc.cell
