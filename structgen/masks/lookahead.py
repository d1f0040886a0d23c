"""Masks of the configurations a few bytes ahead, made while the model computes its next step.

A new grammar's first request pays for every configuration's first mask: a walk of the
vocabulary each time the parse reaches an object's start, a key, a value. The model's forward
pass leaves the CPU idle for milliseconds per token (on a GPU, the whole pass), and the next
token's configuration is among those a few bytes ahead of the current one. So
:meth:`Matcher.start_look_ahead <structgen.masks.matcher.Matcher.start_look_ahead>` hands the
current configuration to one process-wide background thread, which walks its byte
successors breadth first (nearest first) and computes the mask and free state of each
configuration not yet cached. When the model's token comes, its mask is then usually a cache
look-up.

The work is done in units of one configuration, each under the grammar's lock (the engine's
caches are guarded by it), and a job is dropped as soon as its matcher has moved on (it
accepted a token, rolled back or was reset), its tables were flushed, or it has done
``max_configs`` configurations. A step that comes while a unit runs waits at most for that
one unit. The masks go into the engine's bounded cache, so look-ahead never grows memory past
the cache's budget.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from structgen.grammar.runtime import Runtime
    from structgen.masks.engine import Engine
    from structgen.masks.vocab_table import VocabTable

__all__ = ["LOOK_AHEAD_CONFIGS", "LOOK_AHEAD_DEPTH", "LookAheadJob", "submit", "wait_idle"]

#: Configurations a job prepares at most (new masks; cached ones do not count).
LOOK_AHEAD_CONFIGS = 256
#: Bytes ahead of the current configuration a job looks at most (a JSON key with its quotes).
LOOK_AHEAD_DEPTH = 8
_VISITED_MAX = 4  # configurations visited per new one prepared, at most (cached ones cost look-ups)


class LookAheadJob:
    """The breadth-first walk from one matcher's configuration ``cid`` (epoch ``epoch``)."""

    __slots__ = ("holder", "cid", "epoch", "engine", "runtime", "vt", "max_configs", "max_depth",
                 "queue", "seen", "made", "visited")

    def __init__(self, holder: object, cid: int, epoch: int, engine: Engine, runtime: Runtime,
                 vt: VocabTable, max_configs: int, max_depth: int) -> None:
        self.holder = weakref.ref(holder)  # the matcher: the job ends when it moves on
        self.cid = cid
        self.epoch = epoch
        self.engine = engine
        self.runtime = runtime
        self.vt = vt
        self.max_configs = max_configs
        self.max_depth = max_depth
        self.queue: deque[tuple[int, int]] = deque([(cid, 0)])  # (configuration, depth)
        self.seen = {cid}
        self.made = 0  # configurations whose mask this job computed
        self.visited = 0

    def current(self) -> bool:
        """Is the matcher still at the configuration this job started from (same epoch)?"""
        m = self.holder()
        if m is None or self.runtime.epoch != self.epoch:
            return False
        hist = m._hist  # type: ignore[attr-defined]
        return bool(hist) and hist[-1] == self.cid and m._epoch == self.epoch  # type: ignore[attr-defined]

    def unit(self) -> bool:
        """Prepare the next configuration in breadth-first order (its mask and free state,
        where not cached); False when the job is done."""
        rt, eng, vt = self.runtime, self.engine, self.vt
        if (not self.queue or self.made >= self.max_configs
                or self.visited >= _VISITED_MAX * self.max_configs or not self.current()):
            return False
        cid, depth = self.queue.popleft()
        with rt.lock:
            if rt.epoch != self.epoch:
                return False
            fresh = False
            if depth:  # the starting configuration's mask was read already
                fresh = eng.mask_cache.peek((vt.key, cid)) is None
                words = eng.token_mask(cid, vt)
                if rt.epoch != self.epoch:  # the mask flushed the tables: ids changed
                    return False
                eng.free_state(cid, vt, words)  # what the step reads next to the mask
            if depth < self.max_depth:
                rt.fill_row(cid)  # every byte's successor known (interned if new)
                row = rt.tab.trans[cid]
                for nxt in np.unique(row[row >= 0]).tolist():
                    if nxt not in self.seen:
                        self.seen.add(nxt)
                        self.queue.append((nxt, depth + 1))
        self.visited += 1
        self.made += fresh
        return True


class _Worker:
    """One daemon thread running the jobs of every matcher, one unit at a time in turn."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: dict[int, LookAheadJob] = {}  # id(matcher) -> its newest job
        self._thread: threading.Thread | None = None
        self._idle = False  # the thread waits for a job

    def submit(self, key: int, job: LookAheadJob) -> None:
        # on the decode loop's path: a dictionary store, and a wake-up only when idle
        self._jobs[key] = job  # a matcher's older job is replaced: only its newest counts
        if self._idle or self._thread is None:
            with self._cond:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name="structgen-look-ahead")
                    self._thread.start()
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    # idle is raised before the look: a job stored after it gets its wake-up,
                    # a job stored before it is seen here
                    self._idle = True
                    if self._jobs:
                        break
                    self._cond.wait()
                self._idle = False
                key = next(iter(self._jobs))
                job = self._jobs.pop(key)  # taken; put back below unless finished
            try:
                more = job.unit()
            except Exception:  # noqa: BLE001 - look-ahead is an optimisation: the step itself
                more = False   # computes whatever is missing, and reports its own errors
            if more:
                with self._cond:
                    self._jobs.setdefault(key, job)  # round robin: behind the other matchers
            # hand the interpreter over between units: a decode loop whose forward pass just
            # ended waits for one unit at most, not for the interpreter's switch interval
            time.sleep(0)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no job is left and the thread is waiting (True), at most ``timeout`` s."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self._jobs and (self._thread is None or self._idle):
                return True
            time.sleep(0.001)
        return False


_WORKER = _Worker()


def submit(holder: object, job: LookAheadJob) -> None:
    """Queue ``job`` for ``holder`` (a matcher), replacing its earlier one."""
    _WORKER.submit(id(holder), job)


def wait_idle(timeout: float = 10.0) -> bool:
    """Wait until every queued look-ahead job has ended (tests and benchmarks); False when
    ``timeout`` seconds passed first."""
    return _WORKER.wait_idle(timeout)
