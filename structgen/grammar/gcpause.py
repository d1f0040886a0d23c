"""Pausing Python's cyclic garbage collector around compilation.

Compiling a grammar allocates many short-lived container objects (IR nodes, NFA lists).
In a process that also holds torch, transformers and a tokenizer (hundreds of thousands of
tracked objects), those allocations trigger full collections that scan the whole heap: a
pause of a few hundred milliseconds that has nothing to do with the grammar. Reference
counting still frees almost everything; the few cycles left are collected after the pause.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]

_lock = threading.Lock()
_depth = 0
_resume = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable automatic collection for the duration (re-entrant and thread-safe: the
    collector is re-enabled when the last paused section ends, and only if it was enabled
    when the first began)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
