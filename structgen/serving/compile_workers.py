"""Cold constraint compiles in worker processes, for ``structgen serve``.

A compile that is not in any cache is pure Python for most of its time. On a thread of the
server it holds the GIL against the scheduler thread (every decode step of every running
request waits for it), it can only be stopped where it checks, and what it allocates stays
in the server's heap. In a worker process it shares nothing: the server waits for the answer
on a pipe, a request that is cancelled or past its deadline gets its worker killed (the work
stops at once, whatever it was doing, and its memory goes back to the system), and a worker
whose memory grew past :data:`RECYCLE_RSS_BYTES` is replaced after its job.

The worker compiles with :func:`structgen.frontends.constraint.compile_constraint` and sends
back the :class:`~structgen.grammar.compiled.CompiledGrammar` (it pickles its rules' automata,
not its lazily built tables) or the typed error, rebuilt field by field on this side so that
errors whose constructors take keyword arguments survive the trip. Workers are started with
fresh interpreters (never ``fork``: the server holds threads and torch) when the engine
starts, each warmed with a small compile so that loading the native kernels is not charged to
a request.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

from structgen import limits
from structgen.config import CompileOptions, JsonSchemaOptions
from structgen.errors import CompileTimeoutError, RequestCancelledError, StructgenError
from structgen.frontends.constraint import compile_constraint
from structgen.grammar.compiled import CompiledGrammar

__all__ = ["CompileWorkers", "RECYCLE_RSS_BYTES"]

#: A worker whose resident memory is above this after a job is replaced by a fresh one.
RECYCLE_RSS_BYTES = 1 << 30
_POLL_S = 0.02  # how often a waiting compile checks its request's cancellation and deadline


def _worker_main(inbox: Connection, outbox: Connection) -> None:
    """The loop of one worker process: compile what arrives, answer, until the pipe closes."""
    try:
        compile_constraint("json", {"type": "object", "properties": {"a": {"type": "string"}}})
        compile_constraint("grammar", 'start: "a" | "b"')
    except Exception:  # noqa: BLE001 - warming is best effort
        pass
    outbox.send(("ready", os.getpid()))
    while True:
        try:
            job = inbox.recv()
        except (EOFError, OSError):
            return
        kind, spec, start, json_options, compile_options = job
        try:
            grammar = compile_constraint(kind, spec, start=start, json_options=json_options,
                                         compile_options=compile_options)
            answer: tuple[object, ...] = ("ok", grammar)
        except StructgenError as e:
            answer = ("error", type(e).__module__, type(e).__qualname__, e.args, dict(vars(e)))
        except RecursionError:
            answer = ("error", "structgen.errors", "CompileLimitError",
                      ("constraint nested too deeply to compile",), {})
        except Exception as e:  # noqa: BLE001 - a bug: reported as an error, the worker lives on
            answer = ("bug", f"{type(e).__name__}: {e}")
        outbox.send(answer)


def _rebuild(module: str, qualname: str, args: tuple[object, ...],
             fields: dict[str, object]) -> BaseException:
    """The typed error a worker raised, rebuilt without calling its constructor."""
    cls = getattr(importlib.import_module(module), qualname)
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(fields)
    return err


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _Worker:
    """One worker: ``python -m structgen.serving.compile_workers IN OUT``, jobs and answers
    over two pipes. A fresh interpreter rather than ``multiprocessing``: spawning would import
    the server's ``__main__`` module again in the child, forking would copy its threads."""

    def __init__(self) -> None:
        jobs_r, jobs_w = os.pipe()
        answers_r, answers_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "structgen.serving.compile_workers", str(jobs_r), str(answers_w)],
                pass_fds=(jobs_r, answers_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, close_fds=True)
        except BaseException:
            for fd in (jobs_w, answers_r):
                os.close(fd)
            raise
        finally:
            os.close(jobs_r)
            os.close(answers_w)
        self.send_conn = Connection(jobs_w, readable=False)
        self.conn = Connection(answers_r, writable=False)
        self.ready = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a kill is not refused
            pass
        self.send_conn.close()
        self.conn.close()


class CompileWorkers:
    """Up to ``processes`` worker processes compiling constraints (see the module docstring).
    :meth:`compile` blocks its calling thread; call it from a preparation thread."""

    def __init__(self, processes: int) -> None:
        self.processes = max(1, processes)
        self._idle: list[_Worker] = []
        self._started = 0
        self._cond = threading.Condition()
        self._closed = False
        self.killed = 0  # workers killed for a cancelled or late job

    def start(self) -> None:
        """Start every worker now (they load and warm up in the background), so that the
        first request does not wait for a process to start."""
        with self._cond:
            while self._started < self.processes and not self._closed:
                self._idle.append(_Worker())
                self._started += 1

    def _take(self, deadline: float | None) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RequestCancelledError("the server is shutting down")
                if self._idle:
                    return self._idle.pop()
                if self._started < self.processes:
                    self._started += 1
                    break
                self._cond.wait(_POLL_S)
                self._check(deadline)
        try:
            return _Worker()
        except BaseException:
            with self._cond:
                self._started -= 1
                self._cond.notify()
            raise

    def _give_back(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None or self._closed:
                self._started -= 1
                if worker is not None:
                    worker.kill()
            else:
                self._idle.append(worker)
            self._cond.notify()

    @staticmethod
    def _check(deadline: float | None) -> None:
        limits.check()  # RequestCancelledError once the request's scope is cancelled
        if deadline is not None and limits.now() > deadline:
            raise CompileTimeoutError("grammar compilation did not finish before the request's deadline "
                                      "(--prepare-timeout / CompileOptions.timeout_s)")

    def _answer(self, worker: _Worker, deadline: float | None) -> tuple[object, ...]:
        """The worker's next message, waited for within the request's limits."""
        while not worker.conn.poll(_POLL_S):
            self._check(deadline)
            if not worker.alive():
                raise RuntimeError("a compile worker process died")
        answer = worker.conn.recv()
        assert isinstance(answer, tuple)  # what _worker_main sends
        return answer

    def compile(self, kind: str, spec: object, *, start: str, json_options: JsonSchemaOptions,
                compile_options: CompileOptions | None) -> CompiledGrammar:
        """The compiled grammar of one constraint, compiled in a worker process, within the
        current :func:`structgen.limits.scope` (its deadline, and ``compile_options.timeout_s``;
        once it is cancelled the worker is killed and
        :class:`~structgen.errors.RequestCancelledError` raised). Raises the worker's typed
        error as it was raised there."""
        timeout = getattr(compile_options, "timeout_s", None)
        deadline = limits.deadline_within(None if timeout is None else limits.now() + timeout + 1.0)
        worker = self._take(deadline)
        try:
            if not worker.ready:  # its warm-up; a request does not wait for it past its limits
                self._answer(worker, deadline)
                worker.ready = True
            worker.send_conn.send((kind, spec, start, json_options, compile_options))
            answer = self._answer(worker, deadline)
        except BaseException:
            worker.kill()
            self.killed += 1
            self._give_back(None)
            raise
        if _rss_bytes(worker.process.pid) > RECYCLE_RSS_BYTES:
            worker.kill()
            self._give_back(None)
        else:
            self._give_back(worker)
        status, *rest = answer
        if status == "ok" and isinstance(rest[0], CompiledGrammar):
            return rest[0]
        if status == "error":
            module, qualname, args, fields = rest
            assert isinstance(module, str) and isinstance(qualname, str)
            assert isinstance(args, tuple) and isinstance(fields, dict)
            raise _rebuild(module, qualname, args, fields)
        raise RuntimeError(f"compile worker: {rest[0]}")

    def close(self) -> None:
        """Stop every worker (jobs in flight end with RequestCancelledError)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for w in idle:
            w.kill()


if __name__ == "__main__":  # a worker: python -m structgen.serving.compile_workers IN OUT
    _worker_main(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
