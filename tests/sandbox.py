"""Run untrusted inputs through structgen in a resource-limited worker subprocess.

Shared by the fuzz suite (``tests/test_fuzz_*.py``) and the bad-input battery
(``tests/bad_inputs.py``). One :class:`Sandbox` owns one worker process, started with
an ``RLIMIT_AS`` (address space) limit, that reads cases as JSON lines on stdin and
answers one JSON line per case on a private pipe. Each case runs under its own SIGALRM
deadline; the parent enforces a hard deadline on top (a case stuck in C code that ignores the
alarm), so one bad input can neither take down pytest nor stall it. A worker that dies or hangs
is replaced and the remaining cases continue in the new one.

Outcome classes (:attr:`Outcome.outcome`):

* ``ok``      -- a result (for the CLI: exit 0 or 1, or exit 2 with one ``error:`` line);
* ``typed``   -- a :class:`structgen.errors.StructgenError` subclass;
* ``crash``   -- any other exception (``error`` / ``where`` name it), or a broken CLI contract;
* ``hang``    -- past the case's time limit;
* ``memory``  -- ``MemoryError`` under the address-space limit, or the worker died of it;
* ``died``    -- the worker process died some other way (signal, exit) while running the case.

Handlers (``Case.kind``): ``schema``, ``lark``, ``regex``, ``config``, ``cli`` (in-process
``structgen.cli.main``) and ``call`` (``module:function`` with keyword arguments: cases that
need their own code, e.g. the battery's generation and asset cases). Side effects: a case may
write files in its ``cwd`` (a folder the caller owns); the worker changes into it and back.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTCOMES = ("ok", "typed", "crash", "hang", "memory", "died")


@dataclass
class Case:
    """One input: ``kind`` picks the handler, ``payload`` its JSON-serialisable arguments."""

    kind: str
    payload: Any
    label: str = ""
    timeout_s: float | None = None  # None: the sandbox's default
    cwd: str | None = None  # folder to run in (the worker changes into it and back)
    env: dict[str, str] = field(default_factory=dict)  # set for this case only


@dataclass
class Outcome:
    """What one case did. ``where`` is the innermost structgen frame of a crash
    (``file:line in function``), ``frames`` the innermost few frames of any traceback."""

    label: str
    kind: str
    outcome: str
    error: str = ""  # exception type name (or "exit N" / "signal N")
    message: str = ""
    where: str = ""
    frames: list[str] = field(default_factory=list)
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)  # handler extras (exit code, stderr, ...)

    @property
    def signature(self) -> str:
        """A crash's cause, for grouping: exception type and innermost structgen frame."""
        return f"{self.outcome}:{self.error}@{self.where}"


# ---------------------------------------------------------------------------------------------
# known causes (issue 26 items 1-11, fixed on other branches): outcomes that are tracked there
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KnownCause:
    """A tracked cause: ``item`` is its number in issue 26, or 0 for a new cause this suite
    found whose fix belongs in a file another hardening branch is changing (reported there)."""

    item: int
    name: str
    matches: Callable[[Case, Outcome], bool]


def _text_of(case: Case) -> str:
    return json.dumps(case.payload, ensure_ascii=False, default=str)


def _stack(o: Outcome) -> str:
    return " ".join(o.frames) + " " + o.where


#: Crashes whose cause is one of issue 26's reproductions (fixed on the hardening branches):
#: the fuzz tests tolerate these and list them; delete an entry once its fix is merged.
KNOWN_CAUSES: tuple[KnownCause, ...] = (
    # Empty: every cause found so far is fixed. Add an entry (issue item, description,
    # predicate) only to track a cause that is being fixed elsewhere, and remove it with the fix.
)


def known_cause(case: Case, outcome: Outcome) -> KnownCause | None:
    """The issue-26 item that explains a non-typed ``outcome``, or None (a new cause)."""
    if outcome.outcome in ("ok", "typed"):
        return None
    return next((k for k in KNOWN_CAUSES if k.matches(case, outcome)), None)


# ---------------------------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------------------------

class Sandbox:
    """A worker subprocess under ``memory_mb`` of address space, running cases one at a time.

    ``timeout_s`` is the default per-case limit (SIGALRM in the worker; the parent kills the
    worker ``grace_s`` later if no answer came). ``warm_up``: compile a few small grammars before
    the first case (JIT compilation is then nobody's time; set it off when limits are generous
    and start-up time matters). Use as a context manager, or call
    :meth:`close`. ``env``: extra environment of the worker (e.g. ``STRUCTGEN_CACHE``).
    """

    def __init__(self, *, memory_mb: int = 1536, timeout_s: float = 10.0, grace_s: float = 5.0,
                 env: dict[str, str] | None = None, imports: Iterable[str] = ("structgen.cli",),
                 startup_s: float = 300.0, warm_up: bool = True) -> None:
        self.memory_mb = memory_mb
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.env = dict(env or {})
        self.imports = list(imports)
        self.startup_s = startup_s
        self.warm_up = warm_up
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buf = b""
        self.restarts = 0
        self._scratch_dir: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **self.env}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")]
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-X", "utf8", str(Path(__file__).resolve()), "--worker", str(self.memory_mb),
             "warm" if self.warm_up else "cold", *self.imports],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
            start_new_session=True, cwd=self._scratch())
        self._buf = b""
        # imports and warm-up (JIT compilation) are not any case's time: wait for "ready"
        if self._read_line(time.monotonic() + self.startup_s) != b'"ready"':
            tail = self._stderr_tail()
            self._kill()
            raise RuntimeError(f"the sandbox worker did not start: {tail}")
        return self._proc

    def _scratch(self) -> str:
        """The worker's working folder: a temporary one, so that a case writing relative paths
        (CLI argument vectors) never writes into the checkout."""
        if self._scratch_dir is None:
            self._scratch_dir = tempfile.TemporaryDirectory(prefix="structgen-sandbox-")
        return self._scratch_dir.name

    def _stderr_tail(self, n: int = 2000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-n:]

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.wait(5)
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(Exception):
                stream.close()  # type: ignore[union-attr]

    def close(self) -> None:
        """Stop the worker (if running)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(Exception):
                proc.stdin.close()  # type: ignore[union-attr]
                proc.wait(5)
        self._kill()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._scratch_dir is not None:
            self._scratch_dir.cleanup()
            self._scratch_dir = None

    def _read_line(self, deadline: float) -> bytes | None:
        """One answer line, or None when the deadline passed or the worker died."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def run(self, case: Case) -> Outcome:
        """Run one case; never raises for anything the case does."""
        timeout = case.timeout_s or self.timeout_s
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                self.restarts += 1
                self._kill()
            self._start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        message = json.dumps({"kind": case.kind, "payload": case.payload, "timeout_s": timeout,
                              "cwd": case.cwd, "env": case.env}) + "\n"
        t0 = time.monotonic()
        try:
            proc.stdin.write(message.encode("utf-8", "surrogatepass"))
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker is gone: reported below
        line = self._read_line(t0 + timeout + self.grace_s)
        seconds = time.monotonic() - t0
        if line is not None:
            data = json.loads(line)
            return Outcome(label=case.label, kind=case.kind, seconds=seconds, **data)
        # no answer: hung past the hard deadline, or died
        alive = proc.poll() is None
        self._kill()
        self.restarts += 1
        tail = self._stderr_tail()
        if alive:
            return Outcome(case.label, case.kind, "hang", "timeout", f"no answer within {seconds:.1f} s",
                           seconds=seconds, detail={"stderr": tail})
        rc = proc.returncode
        memory = rc == -signal.SIGKILL or any(w in tail for w in (
            "MemoryError", "bad_alloc", "Cannot allocate memory", "out of memory"))
        error = f"signal {-rc}" if rc is not None and rc < 0 else f"exit {rc}"
        return Outcome(case.label, case.kind, "memory" if memory else "died", error,
                       tail.strip().splitlines()[-1][:300] if tail.strip() else "", seconds=seconds,
                       detail={"stderr": tail})

    def run_all(self, cases: Iterable[Case]) -> list[Outcome]:
        return [self.run(c) for c in cases]


def summarize(cases: list[Case], outcomes: list[Outcome]) -> tuple[list[tuple[Case, Outcome]],
                                                                    list[tuple[Case, Outcome, KnownCause]]]:
    """(new failures, known failures) among the outcomes that are neither ``ok`` nor ``typed``."""
    new, known = [], []
    for c, o in zip(cases, outcomes):
        if o.outcome in ("ok", "typed"):
            continue
        k = known_cause(c, o)
        if k is None:
            new.append((c, o))
        else:
            known.append((c, o, k))
    return new, known


def reproducers(failures: list[tuple[Case, Outcome]], limit: int = 20) -> str:
    """One block per distinct cause (signature): the smallest input that shows it."""
    groups: dict[str, tuple[Case, Outcome, int]] = {}
    for c, o in failures:
        size = len(_text_of(c))
        sig = o.signature
        if sig not in groups:
            groups[sig] = (c, o, 1)
        else:
            best, bo, n = groups[sig]
            groups[sig] = (c, o, n + 1) if size < len(_text_of(best)) else (best, bo, n + 1)
    lines = [f"{len(failures)} failing input(s), {len(groups)} distinct cause(s):"]
    for sig, (c, o, n) in list(groups.items())[:limit]:
        shown = _text_of(c)
        shown = shown if len(shown) <= 600 else shown[:600] + f"... ({len(shown)} chars)"
        lines.append(f"- {sig} x{n}: {o.error}: {o.message[:300]}")
        lines.append(f"    kind={c.kind} label={c.label!r} input={shown}")
        if o.frames:
            lines.append("    frames: " + " <- ".join(reversed(o.frames[-4:])))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# worker side
# ---------------------------------------------------------------------------------------------

class _Timeout(BaseException):
    """Raised by SIGALRM in the worker: BaseException, so ``except Exception`` cannot eat it."""


class NonFiniteAccepted(Exception):
    """A handler's property check: a configuration accepted a NaN or infinite number."""


class OutOfRangeAccepted(Exception):
    """A handler's property check: a configuration accepted an integer no platform type holds."""


class CliContractBroken(Exception):
    """The CLI returned an exit code other than 0/1/2, or exit 2 without exactly one error line."""


def _frames(tb: Any) -> tuple[str, list[str]]:
    """(innermost structgen frame, innermost 6 frames) of a traceback, as file:line in func."""
    entries = traceback.extract_tb(tb)
    frames = [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in entries]
    ours = [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in entries
            if f"{os.sep}structgen{os.sep}" in f.filename]
    return (ours[-1] if ours else (frames[-1] if frames else "")), frames[-6:]


def _bytes(value: Any) -> bytes:
    """File contents from a case: a str (UTF-8, lone surrogates kept) or {"b64": ...}."""
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    return str(value).encode("utf-8", "surrogatepass")


def _handle_schema(payload: dict[str, Any]) -> dict[str, Any]:
    from structgen.config import CompileOptions
    from structgen.json_schema import compile_json_schema
    from structgen.validation import Document, SchemaValidator

    schema = payload["schema"]
    detail: dict[str, Any] = {}
    if payload.get("validate", True):
        validator = SchemaValidator(schema, use_grammar=False)
        if "instance" in payload:
            detail["valid"] = validator.validate(Document(1, payload["instance"]), "<fuzz>").valid
    options = CompileOptions(timeout_s=payload.get("compile_timeout_s", 2.0),
                             max_states=payload.get("max_states", 50_000))
    grammar = compile_json_schema(schema, compile_options=options)
    for sample in payload.get("samples", []):
        grammar.accepts(sample)
        grammar.accepts_prefix(sample)
    return detail


def _handle_lark(payload: dict[str, Any]) -> dict[str, Any]:
    from structgen.config import CompileOptions
    from structgen.frontends.lark import compile_lark

    options = CompileOptions(timeout_s=payload.get("compile_timeout_s", 2.0),
                             max_states=payload.get("max_states", 50_000))
    grammar = compile_lark(payload["text"], start=payload.get("start", "start"), compile_options=options)
    return {"accepts": [grammar.accepts(s) for s in payload.get("samples", [])]}


def _handle_regex(payload: dict[str, Any]) -> dict[str, Any]:
    from structgen.frontends.regex import compile_regex_grammar

    grammar = compile_regex_grammar(payload["pattern"])
    return {"accepts": [grammar.accepts(s) for s in payload.get("samples", [])]}


def _handle_config(payload: dict[str, Any]) -> dict[str, Any]:
    from dataclasses import fields as dc_fields

    from structgen.settings import loads_settings

    settings = loads_settings(payload["text"], "fuzz.yaml")
    # the property beyond "no crash": what was accepted is usable (issue 26 item 6)
    for section in dc_fields(settings):
        obj = getattr(settings, section.name)
        for f in dc_fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise NonFiniteAccepted(f"{section.name}.{f.name} = {value!r} accepted")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
                raise OutOfRangeAccepted(f"{section.name}.{f.name} = {value} accepted")
    return {}


def _handle_cli(payload: dict[str, Any]) -> dict[str, Any]:
    """``structgen.cli.main(argv)`` in-process, with stdin/stdout/stderr captured.

    The CLI contract: exit 0/1/2; exit 2 prints exactly one ``error:`` line on stderr (a
    grammar's caret excerpt below it is allowed) and never a traceback."""
    from structgen.cli import main

    for name, content in payload.get("files", {}).items():
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_bytes(content))
    stdin = io.TextIOWrapper(io.BytesIO(_bytes(payload.get("stdin", ""))), encoding="utf-8")
    out_raw, err_raw = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_raw, encoding="utf-8", errors="backslashreplace", write_through=True)
    err = io.TextIOWrapper(err_raw, encoding="utf-8", errors="backslashreplace", write_through=True)
    old = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin, out, err
    try:
        rc = main(list(payload["argv"]))
    except SystemExit as e:  # main() must return, not exit
        rc = e.code if isinstance(e.code, int) else -1
        raise CliContractBroken(f"main() raised SystemExit({e.code!r})") from None
    finally:
        sys.stdin, sys.stdout, sys.stderr = old
    stderr = err_raw.getvalue().decode("utf-8", "replace")
    stdout = out_raw.getvalue().decode("utf-8", "replace")
    detail = {"rc": rc, "stderr": stderr[-1000:], "stdout": stdout[-4000:]}
    if rc not in (0, 1, 2):
        raise CliContractBroken(f"exit code {rc!r}; stderr: {stderr[-300:]!r}")
    if "Traceback (most recent call last)" in stderr:
        raise CliContractBroken(f"traceback on stderr: {stderr[-300:]!r}")
    if rc == 2:
        lines = [ln for ln in stderr.splitlines() if ": note: " not in ln and ": warning: " not in ln]
        errors = [ln for ln in lines if ": error: " in ln]
        # `structgen compile` keeps a grammar error's caret excerpt on the lines below it
        caret = payload["argv"][:1] == ["compile"] and len(errors) == 1 and lines[0] == errors[0]
        if len(errors) != 1 or (len(lines) != 1 and not caret):
            raise CliContractBroken(f"exit 2 without exactly one error line: {stderr[-300:]!r}")
        detail["typed"] = True
    return detail


def _handle_call(payload: dict[str, Any]) -> Any:
    import importlib

    module, _, name = payload["func"].partition(":")
    return getattr(importlib.import_module(module), name)(**payload.get("kwargs", {}))


HANDLERS: dict[str, Callable[[Any], Any]] = {
    "schema": _handle_schema, "lark": _handle_lark, "regex": _handle_regex,
    "config": _handle_config, "cli": _handle_cli, "call": _handle_call,
}


@contextlib.contextmanager
def _case_context(cwd: str | None, env: dict[str, str], timeout_s: float) -> Iterator[None]:
    def alarm(_signum: int, _frame: Any) -> None:
        raise _Timeout(f"no result within {timeout_s} s")

    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    here = os.getcwd()
    if cwd:
        os.chdir(cwd)
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(here)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_case_here(message: dict[str, Any]) -> dict[str, Any]:
    """Run one case in this process; the answer dict of :class:`Outcome` fields (no label)."""
    from structgen.errors import StructgenError

    kind = message["kind"]
    result: dict[str, Any] = {"outcome": "ok"}
    try:
        with _case_context(message.get("cwd"), message.get("env") or {}, float(message["timeout_s"])):
            detail = HANDLERS[kind](message["payload"])
        if isinstance(detail, dict):
            result["detail"] = json.loads(json.dumps(detail, default=repr))
            if detail.get("typed"):
                result["outcome"] = "typed"
    except _Timeout as e:
        where, frames = _frames(e.__traceback__)
        result.update(outcome="hang", error="timeout", message=str(e), where=where, frames=frames)
    except MemoryError as e:
        where, frames = _frames(e.__traceback__)
        result.update(outcome="memory", error="MemoryError", message=str(e)[:300], where=where,
                      frames=frames)
    except StructgenError as e:
        result.update(outcome="typed", error=type(e).__name__, message=" ".join(str(e).split())[:300])
    except BaseException as e:  # noqa: BLE001 - the point: classify anything else as a crash
        if isinstance(e, KeyboardInterrupt):
            raise
        where, frames = _frames(e.__traceback__)
        result.update(outcome="crash", error=type(e).__name__, message=" ".join(str(e).split())[:300],
                      where=where, frames=frames)
    return result


def _warm_up() -> None:
    """Import and JIT-compile what most cases use, so no case pays (or times out on) it."""
    from structgen.frontends.lark import compile_lark
    from structgen.frontends.regex import compile_regex_grammar
    from structgen.json_schema import compile_json_schema
    from structgen.settings import loads_settings
    from structgen.validation import SchemaValidator

    SchemaValidator({"type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$"}}})
    for grammar in (compile_json_schema({"type": "array", "items": {"type": "integer"}}),
                    compile_lark('start: "a"+'), compile_regex_grammar("(ab)*c")):
        grammar.accepts("[1,2]")
        grammar.accepts_prefix("ab")
    loads_settings("generation:\n  seed: 1\n")


def _worker(memory_mb: int, warm: bool, imports: list[str]) -> None:
    """Import, warm up, then limit the address space to ``memory_mb`` and serve cases.

    The limit is set after the warm-up: compiling the JIT kernels (LLVM) on a cold cache needs
    more than a case may use, and is no case's doing."""
    import importlib
    import resource

    # the protocol gets a private copy of stdout; fd 1 itself goes to /dev/null so that stray
    # prints (and C libraries writing to fd 1) cannot corrupt it
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="surrogatepass", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w", encoding="utf-8")
    for name in imports:
        importlib.import_module(name)
    if warm:
        _warm_up()
    limit = memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    proto.write('"ready"\n')
    for line in sys.stdin.buffer:
        message = json.loads(line.decode("utf-8", "surrogatepass"))
        answer = run_case_here(message)
        proto.write(json.dumps(answer) + "\n")


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    _worker(int(sys.argv[2]), sys.argv[3] == "warm", sys.argv[4:])


def as_json(outcome: Outcome) -> dict[str, Any]:
    return asdict(outcome)
