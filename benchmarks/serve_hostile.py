"""Hostile-input audit of ``structgen serve`` (issue 44): a real server under hostile requests,
hostile constraints, hostile connections, and normal traffic beside hostile work.

    python -m benchmarks.serve_hostile            # full audit (about 15-25 min on 2 shared cores)
    python -m benchmarks.serve_hostile --smoke    # 14 fast probes (under a minute), writes nothing
    python -m benchmarks.serve_hostile --only body,connection --no-fail

A ``python -m structgen serve`` subprocess serves a tiny random Llama over GPT-2's tokenizer
(``bench_suite.tiny_model``, saved to a temporary folder; ``--model`` serves another)
on 127.0.0.1 at a free port, with an API key, ``--max-queued 8`` and a compile budget of
``--compile-timeout-s`` seconds (the ``compile:`` section of a generated ``--config`` file). Its
working folder is a temporary folder holding a canary JSON file and a canary Lark grammar
(each with a secret string), and a counting HTTP server listens on 127.0.0.1: a constraint that
makes the server fetch a URL or read a file shows up as a hit, as the secret in the answer, or
as the canary's access time moving.

Every probe talks raw HTTP/1.1 over a socket (so a body can be malformed, a header foreign,
a sender slow) and is watched the same way: the server's resident memory (``VmRSS`` of
``/proc/PID/status``) sampled every 0.1 s, its stderr (a ``Traceback`` printed while the probe
ran or settled), its CPU time after the probe (the server must go idle within ``--settle-s``
seconds; if not, it is restarted and the probe counts as ``runaway``), whether it is still
alive. A server whose memory passes ``--kill-rss-mb`` is killed (and restarted) so that the
audit cannot take the machine down. Each probe states the answer issue 44 expects:

* request bodies: malformed JSON, JSON nested 10,000 deep, lone surrogates (``\\ud800``
  escaped) in content / prompt / model / stop / a schema key / a grammar literal / a tool name,
  wrong types, huge numbers, ``n`` above ``--max-queued`` -> 400; empty messages, unknown roles
  -> 400; a body over ``--max-body-bytes`` -> 413; a wrong Content-Type -> 415; a foreign
  ``Host`` (DNS rebinding) -> 421 (or 403); a missing or wrong API key -> 401. Every 4xx/5xx
  must be an OpenAI error object ``{"error": {"message": ...}}``;
* constraints (``response_format`` json_schema / regex / grammar, tools): the exponential
  pattern ``^(a|b)*a(a|b){20}$`` (in ``pattern``, ``patternProperties``, ``propertyNames``, a
  regex format, a Lark terminal, a tool's parameters; also 200, measured on its NFA),
  ``minLength`` = ``maxLength`` = 1e9,
  a Lark grammar of 40 rules each doubling the one below, a 1 MB Lark literal, deep schemas,
  a 100,000-value enum, recursive ``$ref`` loops, ``$ref`` to ``http://127.0.0.1:PORT`` and
  ``file://`` (never fetched), Lark ``%import`` of files -> 400 or 422 with an error object
  within the compile budget (``--compile-timeout-s`` + 5 s), never a hang, never +200 MB. The
  size-only cases (deep but finite schemas, the huge enum) may also be answered 200;
* connections: 8 slow senders at 1 byte/s (4 slow in the head, 4 in the body) and idle
  connections must be closed by the server (the seconds are reported; still open after
  ``--slow-cap-s`` / ``--idle-cap-s`` is a hang); 300 connections holding half a request head,
  then a fresh request, then the 300 complete their heads -> those over the server's limit
  refused, closed or answered 503, the fresh request answered 200 or 503, never a crash (all
  300 answered 200 counts as ``wrong``: the bar assumes a connection limit below
  ``--connections``); a client that drops mid-body -> no traceback, the server still answers;
  bytes that are not HTTP (garbage, a TLS ClientHello, a 100 KB header, no Host, bad chunking)
  -> 400 (431) with a JSON error object; 3 clients that go away 0.5 s after sending hostile
  constraints -> the server's CPU work stops (idle within 2 s; the same kinds of request, with
  the clients staying, are timed first for comparison);
* concurrency: a small json_schema request (``max_tokens`` 16) is timed alone, then again
  while 2 and then 4 hostile constraint requests are in flight; each must be answered within
  ``--latency-factor`` times its median alone (at least the median + 1 s).

Outcome classes, one per probe (the first that applies, in this order; every flag is kept):
``crash`` the server process died; ``memory`` RSS grew 200 MB or more, or passed 3 GB;
``fetched`` a URL or the canary file was read; ``hang`` no answer within ``--timeout-s`` (a
connection left open past its cap); ``runaway`` the server kept working after the probe (not
idle within ``--settle-s``, or after the client left); ``dropped`` the connection closed or was
reset without an answer where one was due; ``5xx`` a 5xx that was not expected; ``traceback``
a ``Traceback`` in the server's stderr; ``slow`` answered, but after the compile budget or the
latency bar; ``wrong`` another status than expected (a 200 where a 4xx was due), or an error
that is not an OpenAI error object (plain text); ``ok`` the expected status, with an error object
for a 4xx/5xx. The exit status is 1 when any probe is not ``ok`` (use it as a check), unless
``--no-fail``; 2 when the server cannot start.

Writes ``benchmarks/results/serve-hostile.json`` (the shared envelope of
``benchmarks/common/envelope.py``, the table, every probe) and ``serve-hostile.md`` beside it (the
table, the failures, the machine's load average at the start and the end); ``--smoke`` writes
nothing unless ``--out`` is given. Prints the table (categories x classes) as markdown.
Side effects: a temporary folder (removed), the server subprocess and a local HTTP server
(stopped), up to ``--connections`` + 20 sockets.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import secrets
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT
from benchmarks.common.smoke_model import save_smoke_model

CATEGORIES = ("control", "body", "constraint", "connection", "concurrency")
# failure classes by precedence, then ok
CLASSES = ("crash", "memory", "fetched", "hang", "runaway", "dropped", "5xx", "traceback", "slow", "wrong")
COLUMNS = ("probes", "ok", *CLASSES)
SECRET = "CANARY-44-" + "d41f0e"
MEMORY_GROWTH_MB = 200
MEMORY_ABS_MB = 3072
EVIL = "^(a|b)*a(a|b){20}$"  # the DFA of this pattern has 2^21 states
# the budget check measures the pattern on its NFA, never building that DFA: a valid
# constraint with a short output, so an answer within the budget (200) is right, as is a limit
EVIL_EXPECT = (200, 400, 422)
EVIL_WHY = "an answer within the budget (measured on the NFA), or a compile limit"
IDLE_AFTER_LEAVING_S = 2.0  # the server's CPU is idle this soon after hostile clients leave

# ---------------------------------------------------------------------------------------------
# the server under audit, and what watches it
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``python -m structgen serve`` as a subprocess: start, readiness, RSS, CPU, stderr, stop."""

    def __init__(self, model: str, cwd: Path, config: Path, key: str, max_queued: int,
                 max_body: int, extra: list[str]) -> None:
        self.port = _free_port()
        self.key = key
        self.max_queued = max_queued
        self.max_body = max_body
        self.cmd = [sys.executable, "-m", "structgen", "serve", "--model", model, "--host", "127.0.0.1",
                    "--port", str(self.port), "--api-key", key, "--config", str(config),
                    "--max-queued", str(max_queued), "--max-running", "4",
                    "--max-body-bytes", str(max_body), "--log-level", "warning", *extra]
        self.cwd = cwd
        self.log_path = cwd / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.killed_for_memory: float | None = None

    def start(self, timeout: float = 300) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, stdout=log, stderr=log, env=env,
                                     start_new_session=True)
        log.close()
        self.starts += 1
        self.killed_for_memory = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"structgen serve exited ({self.proc.returncode}):\n{self.log_tail()}")
            a = exchange(self.port, request(self, "GET", "/health"), 2.0)
            if a.status == 200:
                # warm up (first forward, first compile, allocator pools), so that a probe's
                # memory growth is the probe's own
                exchange(self.port, request(self, "POST", "/v1/chat/completions", normal_body()), 60.0)
                return
            time.sleep(0.3)
        raise RuntimeError(f"structgen serve not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s (a draining server may wait on a runaway compile)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def restart(self) -> None:
        self.stop()
        self.start()

    def rss_mb(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as f:  # type: ignore[union-attr]
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            pass
        return None

    def cpu_s(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/stat", encoding="ascii") as f:  # type: ignore[union-attr]
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, AttributeError, IndexError, ValueError):
            return None

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 3000) -> str:
        text = self.log_since(0)
        return text[-n:]


class Watch:
    """Samples the server's RSS every 0.1 s while open; kills it past ``kill_mb``."""

    def __init__(self, server: Server, kill_mb: float) -> None:
        self.server = server
        self.kill_mb = kill_mb
        self.start_mb = server.rss_mb() or 0.0
        self.max_mb = self.start_mb
        self.killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            mb = self.server.rss_mb()
            if mb is None:
                continue
            self.max_mb = max(self.max_mb, mb)
            if mb > self.kill_mb and not self.killed:
                self.killed = True
                self.server.killed_for_memory = mb
                self.server.kill()

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return self.max_mb - self.start_mb


def settle(server: Server, cap: float, window: float = 0.5, busy_fraction: float = 0.1) -> float | None:
    """Seconds until the server's CPU use over ``window`` falls below ``busy_fraction`` of a
    core, or None when it stays busy for ``cap`` seconds (or dies)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < cap:
        c0 = server.cpu_s()
        time.sleep(window)
        c1 = server.cpu_s()
        if c0 is None or c1 is None:
            return None
        if c1 - c0 < busy_fraction * window:
            return round(time.monotonic() - t0, 2)
    return None


class Watchers:
    """A counting HTTP server and the canary files in the server's working folder."""

    def __init__(self, folder: Path) -> None:
        self.hits = 0
        watchers = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                watchers.hits += 1
                body = json.dumps({"type": "string", "description": SECRET}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.canary_json = folder / "canary.json"
        self.canary_json.write_text(json.dumps({"type": "string", "const": SECRET}))
        self.canary_lark = folder / "canary.lark"
        self.canary_lark.write_text(f'SECRET: "{SECRET}"\nstart: SECRET\n')
        (folder / "sub").mkdir()
        (folder / "sub" / "canary.lark").write_text(f'SECRET: "{SECRET}"\n')

    def _files(self) -> list[Path]:
        return [self.canary_json, self.canary_lark, self.canary_lark.parent / "sub" / "canary.lark"]

    def rearm(self) -> None:
        """atime below mtime, so that relatime records the next read."""
        for p in self._files():
            m = p.stat().st_mtime
            os.utime(p, (m - 3600, m))

    def snapshot(self) -> tuple[int, list[float]]:
        return self.hits, [p.stat().st_atime for p in self._files()]

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


# ---------------------------------------------------------------------------------------------
# raw HTTP/1.1
# ---------------------------------------------------------------------------------------------


@dataclass
class Answer:
    """What came back on one connection: ``status`` None when no HTTP answer came;
    ``error``: ``timeout``, ``reset``, ``closed`` (closed without an answer), ``refused``,
    ``not_http``."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None
    wall: float = 0.0


def request(server: Server, method: str, path: str, body: Any = None,
            headers: dict[str, str | None] | None = None) -> bytes:
    """The bytes of one request with the server's Host and API key (``headers``: overrides,
    None removes one). A dict or list body is JSON with ``ensure_ascii`` (a lone surrogate is
    sent escaped, as ``\\ud800``)."""
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    hdr: dict[str, str] = {"Host": f"127.0.0.1:{server.port}", "Authorization": f"Bearer {server.key}",
                           "Connection": "close"}
    if body is not None:
        hdr["Content-Type"] = "application/json"
        hdr["Content-Length"] = str(len(body))
    for k, v in (headers or {}).items():
        if v is None:
            hdr.pop(k, None)
        else:
            hdr[k] = v
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdr.items()) + "\r\n"
    return head.encode("latin-1") + (body or b"")


def _parse_head(raw: bytes) -> tuple[int | None, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return None, {}
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


def _dechunk(data: bytes) -> bytes | None:
    """The body of a complete chunked transfer, or None while incomplete."""
    out, i = b"", 0
    while True:
        j = data.find(b"\r\n", i)
        if j < 0:
            return None
        try:
            size = int(data[i:j].split(b";")[0], 16)
        except ValueError:
            return data  # not chunked after all: take it raw
        if size == 0:
            return out if data.find(b"\r\n", j + 2) >= 0 or data.endswith(b"\r\n") else None
        if len(data) < j + 2 + size + 2:
            return None
        out += data[j + 2:j + 2 + size]
        i = j + 2 + size + 2


def read_answer(sock: socket.socket, deadline: float, answer: Answer) -> Answer:
    """Read one HTTP response from ``sock`` into ``answer`` until it is complete, the server
    closes, or ``deadline``."""
    buf = b""
    head_end = -1
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            answer.error = "timeout"
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            answer.error = "timeout"
            break
        except (ConnectionResetError, BrokenPipeError):
            answer.error = "reset"
            break
        except OSError as e:
            answer.error = f"reset ({e.__class__.__name__})"
            break
        if not chunk:
            if head_end < 0:
                answer.error = "closed" if not buf else "not_http"
            break
        buf += chunk
        if head_end < 0 and b"\r\n\r\n" in buf:
            head_end = buf.index(b"\r\n\r\n")
            answer.status, answer.headers = _parse_head(buf[:head_end])
            if answer.status is None:
                answer.error = "not_http"
                break
        if head_end >= 0:
            body = buf[head_end + 4:]
            cl = answer.headers.get("content-length")
            if cl is not None and cl.isdigit() and len(body) >= int(cl):
                break
            if "chunked" in answer.headers.get("transfer-encoding", "") and _dechunk(body) is not None:
                break
    if head_end >= 0 and answer.status is not None:
        body = buf[head_end + 4:]
        if "chunked" in answer.headers.get("transfer-encoding", ""):
            body = _dechunk(body) or body
        answer.body = body
        if answer.error == "reset" or answer.error == "timeout":
            # an answer whose head came: a complete status counts, the body may be cut
            answer.error = None if answer.error == "reset" else answer.error
    elif buf and answer.error is None:
        answer.error = "not_http"
        answer.body = buf
    return answer


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def exchange(port: int, data: bytes, timeout: float) -> Answer:
    """Send ``data`` on a new connection (stopping early if the server answers first) and
    read the answer; never raises."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    answer = Answer()
    try:
        sock = connect(port, min(timeout, 5.0))
    except ConnectionRefusedError:
        answer.error, answer.wall = "refused", time.monotonic() - t0
        return answer
    except OSError as e:
        answer.error, answer.wall = f"refused ({e.__class__.__name__})", time.monotonic() - t0
        return answer
    try:
        view = memoryview(data)
        i = 0
        while i < len(data):
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break  # the server answered (or closed) before the whole request was sent
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                i += sock.send(view[i:i + 65536])
            except TimeoutError:
                answer.error = "timeout"
                break
            except OSError:
                break
        if answer.error is None:
            read_answer(sock, deadline, answer)
    finally:
        sock.close()
    answer.wall = round(time.monotonic() - t0, 3)
    return answer


def error_object(body: bytes) -> bool:
    """Whether ``body`` is an OpenAI error object ``{"error": {"message": str, ...}}``."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and isinstance(data.get("error"), dict) and \
        isinstance(data["error"].get("message"), str)


# ---------------------------------------------------------------------------------------------
# probes
# ---------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    """What a probe needs at run time."""

    server: Server
    watchers: Watchers
    args: argparse.Namespace
    timeout: float


@dataclass
class Result:
    """A probe's own findings; the runner adds the server-side ones (memory, traceback, ...)."""

    status: int | None = None
    error: str | None = None
    wall: float | None = None
    body: str = ""
    flags: list[tuple[str, str]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Probe:
    category: str
    name: str
    expect: str  # the expectation, in words (what issue 44 asks for)
    run: Callable[[Ctx], Result]
    smoke: bool = False
    budget: bool = False  # a constraint: answered within the compile budget
    settle: bool = True   # the runner waits for the server to go idle afterwards


def classify_answer(a: Answer, expect: tuple[int, ...], *, budget_s: float | None = None,
                    answer_due: bool = True) -> Result:
    """The flags of one HTTP answer against the expected statuses."""
    r = Result(status=a.status, error=a.error, wall=a.wall,
               body=a.body[:400].decode("utf-8", "replace"))
    want = "/".join(str(s) for s in expect)
    if a.error == "timeout":
        r.flags.append(("hang", f"no answer within {a.wall:.1f} s ({want} due)"))
    elif a.status is None:
        if answer_due:
            r.flags.append(("dropped", f"connection {a.error} without an answer ({want} due)"))
    else:
        if a.status >= 500 and a.status not in expect:
            r.flags.append(("5xx", f"{a.status} where {want} is due"))
        elif a.status not in expect:
            r.flags.append(("wrong", f"{a.status} where {want} is due"))
        if a.status >= 400 and not error_object(a.body):
            ctype = a.headers.get("content-type", "?")
            r.flags.append(("wrong", f"the {a.status} is not an OpenAI error object ({ctype}: "
                                     f"{a.body[:60]!r})"))
        if budget_s is not None and a.wall > budget_s:
            r.flags.append(("slow", f"answered after {a.wall:.1f} s, over the compile budget "
                                    f"({budget_s:.0f} s)"))
    return r


def http_probe(category: str, name: str, expect: tuple[int, ...], build: Callable[[Ctx], bytes],
               why: str, *, smoke: bool = False, budget: bool = False) -> Probe:
    """A probe of one request/answer: ``build`` makes the raw request bytes."""

    def run(ctx: Ctx) -> Result:
        a = exchange(ctx.server.port, build(ctx), ctx.timeout)
        b = ctx.args.compile_timeout_s + 5 if budget else None
        return classify_answer(a, expect, budget_s=b)

    return Probe(category, name, f"{'/'.join(map(str, expect))}: {why}", run, smoke, budget)


def chat(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "Say hi."}],
                            "max_tokens": 16}
    body.update(fields)
    return body


def post(body: Any, path: str = "/v1/chat/completions", **headers: str | None) -> Callable[[Ctx], bytes]:
    """A ``build`` for a POST of ``body`` (a callable of the context, or a value)."""

    def build(ctx: Ctx) -> bytes:
        b = body(ctx) if callable(body) else body
        return request(ctx.server, "POST", path, b, {k.replace("_", "-"): v for k, v in headers.items()})

    return build


SMALL_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                 "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"], "additionalProperties": False}


def schema_fmt(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def normal_body() -> dict[str, Any]:
    return chat(messages=[{"role": "user", "content": "Extract: Bob is 42. JSON:"}],
                response_format=schema_fmt(SMALL_SCHEMA))


def deep_json(depth: int) -> str:
    return json.dumps(chat())[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"


def doubling_lark(rules: int, lit: str = "a") -> str:
    lines = [f'r0: "{lit}"'] + [f"r{i}: r{i - 1} r{i - 1}" for i in range(1, rules)]
    return f"start: r{rules - 1}\n" + "\n".join(lines) + "\n"


def evil(x: str, y: str, n: int = 20) -> str:
    return f"^({x}|{y})*{x}({x}|{y}){{{n}}}$"


def body_probes() -> list[Probe]:
    P, B = http_probe, "body"
    sur = "\ud800"
    tool = {"type": "function", "function": {"name": sur, "parameters": {"type": "object"}}}
    return [
        P(B, "malformed JSON", (400,), post(b'{"messages": [{"role": "user", "content": "hi"'),
          "invalid_json", smoke=True),
        P(B, "JSON nested 10,000 deep", (400,), post(deep_json(10_000)), "too deep, refused", smoke=True),
        P(B, "JSON nested 100,000 deep", (400,), post(deep_json(100_000)), "too deep, refused"),
        P(B, "lone surrogate in content", (400,),
          post(chat(messages=[{"role": "user", "content": "hi " + sur}])), "not valid Unicode", smoke=True),
        P(B, "lone surrogate in prompt", (400,), post({"model": "tiny", "prompt": sur, "max_tokens": 4},
                                                      "/v1/completions"), "not valid Unicode"),
        P(B, "lone surrogate in model", (400,), post(chat(model=sur)), "not valid Unicode"),
        P(B, "lone surrogate in stop", (400,), post(chat(stop=[sur])), "not valid Unicode"),
        P(B, "lone surrogate in a schema key", (400,),
          post(chat(response_format=schema_fmt({"type": "object", "properties": {sur: {"type": "integer"}},
                                                "required": [sur]}))), "not valid Unicode"),
        P(B, "lone surrogate in a grammar literal", (400,),
          post(chat(response_format={"type": "grammar", "grammar": f'start: "{sur}"'})), "not valid Unicode"),
        P(B, "lone surrogate in a tool name", (400,), post(chat(tools=[tool])), "not valid Unicode"),
        P(B, "stream: \"yes\"", (400,), post(chat(stream="yes")), "wrong type (no coercion)"),
        P(B, "max_tokens: true", (400,), post(chat(max_tokens=True)), "wrong type (no coercion)",
          smoke=True),
        P(B, "n: \"2\"", (400,), post(chat(n="2")), "wrong type (no coercion)"),
        P(B, "temperature: \"x\"", (400,), post(chat(temperature="x")), "wrong type"),
        P(B, "messages: a string", (400,), post(chat(messages="hi")), "wrong type"),
        P(B, "max_tokens: 10**30", (400,), post(chat(max_tokens=10**30)), "out of range"),
        P(B, "max_tokens: 1e30 (float)", (400,), post(chat(max_tokens=1e30)), "out of range"),
        P(B, "temperature: 1e308", (400,), post(chat(temperature=1e308)), "out of range"),
        P(B, "seed: 10**100", (400,), post(chat(seed=10**100)), "out of range"),
        P(B, "n: 10**20", (400,), post(chat(n=10**20)), "out of range"),
        P(B, "a 5,000-digit integer", (400,),
          post(json.dumps(chat())[:-1] + ', "max_tokens": ' + "9" * 5000 + "}"),
          "out of range"),
        P(B, "n above --max-queued", (400,), lambda ctx: post(chat(n=ctx.server.max_queued * 2))(ctx),
          "can never be admitted: a 400, not a 429"),
        P(B, "empty messages", (400,), post(chat(messages=[])), "nothing to answer"),
        P(B, "unknown role", (400,), post(chat(messages=[{"role": "wizard", "content": "hi"}])),
          "roles are system/user/assistant/tool/developer"),
        P(B, "message without a role", (400,), post(chat(messages=[{"content": "hi"}])), "role is required"),
        P(B, "body over the size limit", (413,),
          lambda ctx: post(json.dumps(chat(user="x" * (ctx.server.max_body + 1024))))(ctx),
          "request_too_large", smoke=True),
        P(B, "declared Content-Length 100 MB, nothing sent", (413,),
          lambda ctx: request(ctx.server, "POST", "/v1/chat/completions", None,
                              {"Content-Type": "application/json", "Content-Length": str(100 << 20)}),
          "refused from the header, at once"),
        P(B, "chunked body over the size limit", (413,),
          lambda ctx: _chunked(ctx, ctx.server.max_body + 65536),
          "request_too_large"),
        P(B, "Content-Type: text/plain", (415,), post(chat(), Content_Type="text/plain"),
          "unsupported media type", smoke=True),
        P(B, "Content-Type: form", (415,), post(chat(), Content_Type="application/x-www-form-urlencoded"),
          "unsupported media type"),
        P(B, "Content-Type: multipart", (415,), post(chat(), Content_Type="multipart/form-data; boundary=x"),
          "unsupported media type"),
        P(B, "Host: evil.example (DNS rebinding)", (421, 403), post(chat(), Host="evil.example"),
          "a loopback server answers only loopback Host names", smoke=True),
        P(B, "Host: evil.example:PORT", (421, 403),
          lambda ctx: post(chat(), Host=f"evil.example:{ctx.server.port}")(ctx),
          "a loopback server answers only loopback Host names"),
        P(B, "no API key", (401,), post(chat(), Authorization=None), "invalid_api_key", smoke=True),
        P(B, "wrong API key", (401,), post(chat(), Authorization="Bearer nope"), "invalid_api_key"),
        P(B, "API key with non-ASCII bytes", (401,), post(chat(), Authorization="Bearer cl\xe9\xff"),
          "invalid_api_key"),
        P(B, "no API key on /metrics", (401,),
          lambda ctx: request(ctx.server, "GET", "/metrics", None, {"Authorization": None}),
          "invalid_api_key"),
    ]


def _chunked(ctx: Ctx, size: int) -> bytes:
    head = request(ctx.server, "POST", "/v1/chat/completions", b"",
                   {"Content-Length": None, "Transfer-Encoding": "chunked"})
    piece = b" " * 65536
    chunks = b"".join(b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(size // len(piece) + 1))
    return head + chunks + b"0\r\n\r\n"


def constraint_probes() -> list[Probe]:
    C = "constraint"

    def P(name: str, fmt: Any, why: str, expect: tuple[int, ...] = (400, 422), *, smoke: bool = False,
          **extra: Any) -> Probe:
        def body(ctx: Ctx) -> Any:
            f = fmt(ctx) if callable(fmt) else fmt
            return chat(response_format=f, **extra) if f is not None else chat(**extra)
        return http_probe(C, name, expect, post(body), why, smoke=smoke, budget=True)

    def nest(depth: int, key: str) -> Any:
        s: Any = {"type": "integer"}
        for _ in range(depth):
            s = {"type": "object", "properties": {"a": s}, "required": ["a"]} if key == "properties" \
                else {"type": "array", "items": s, "minItems": 1}
        return s

    evil_tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": evil("k", "l")}},
        "required": ["s"]}}}
    return [
        P("pattern (a|b)*a(a|b){20}", schema_fmt({"type": "string", "pattern": EVIL}),
          EVIL_WHY, expect=EVIL_EXPECT),
        P("patternProperties (a|b)*a(a|b){20}", schema_fmt(
            {"type": "object", "patternProperties": {evil("c", "d"): {"type": "integer"}},
             "minProperties": 1}),
          EVIL_WHY, expect=EVIL_EXPECT),
        P("propertyNames pattern (a|b)*a(a|b){20}", schema_fmt(
            {"type": "object", "propertyNames": {"pattern": evil("e", "f")}, "minProperties": 1}),
          EVIL_WHY, expect=EVIL_EXPECT),
        P("regex format (a|b)*a(a|b){20}", {"type": "regex", "regex": evil("g", "h")},
          EVIL_WHY, expect=EVIL_EXPECT),
        P("Lark terminal (a|b)*a(a|b){20}",
          {"type": "grammar", "grammar": "start: X\nX: /(i|j)*i(i|j){20}/\n"}, EVIL_WHY, expect=EVIL_EXPECT),
        P("tool parameters with (a|b)*a(a|b){20}", None, EVIL_WHY, expect=EVIL_EXPECT, tools=[evil_tool],
          tool_choice="required"),
        P("minLength = maxLength = 1e9",
          schema_fmt({"type": "string", "minLength": 10**9, "maxLength": 10**9}),
          "limit, or max_tokens too small: never an allocation"),
        P("minItems = maxItems = 1e9", schema_fmt({"type": "array", "items": {"type": "integer"},
                                                   "minItems": 10**9, "maxItems": 10**9}),
          "limit, or max_tokens too small"),
        P("Lark: 40 rules, each doubling the one below", {"type": "grammar", "grammar": doubling_lark(40)},
          "2^39-byte language: a limit or max_tokens too small, not an expansion"),
        P("Lark: a 1 MB literal", {"type": "grammar", "grammar": 'start: "' + "ab" * (1 << 19) + '"'},
          "limit or max_tokens too small", expect=(400, 413, 422)),
        P("schema nested 300 deep (properties)", schema_fmt(nest(300, "properties")),
          "a limit or max_tokens too small, or an answer within the budget", expect=(200, 400, 422)),
        P("schema nested 500 deep (items)", schema_fmt(nest(500, "items")),
          "a limit or max_tokens too small, or an answer within the budget", expect=(200, 400, 422)),
        P("enum of 100,000 strings", schema_fmt({"enum": [f"value-{i:06d}" for i in range(100_000)]}),
          "an answer or a limit within the budget", expect=(200, 400, 422)),
        P("recursive $ref to itself", schema_fmt({"$ref": "#"}), "a loop that never produces a byte"),
        P("recursive $ref loop a -> b -> a", schema_fmt(
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
             "$ref": "#/$defs/a"}),
          "a loop that never produces a byte"),
        P("$ref to http://127.0.0.1:PORT", lambda ctx: schema_fmt(
            {"$ref": f"http://127.0.0.1:{ctx.watchers.port}/schema.json"}), "refused, never fetched",
          smoke=True),
        P("$id http base, relative $ref", lambda ctx: schema_fmt(
            {"$id": f"http://127.0.0.1:{ctx.watchers.port}/root.json", "$ref": "other.json"}),
          "refused, never fetched"),
        P("$ref to file:// canary", lambda ctx: schema_fmt({"$ref": ctx.watchers.canary_json.as_uri()}),
          "refused, never read"),
        P("Lark %import canary (working folder)", {"type": "grammar",
                                                   "grammar": "%import canary.SECRET\nstart: SECRET\n"},
          "refused, never read", smoke=True),
        P("Lark %import .sub.canary (relative)", {"type": "grammar",
                                                  "grammar": "%import .sub.canary.SECRET\nstart: SECRET\n"},
          "refused: grammar text has no folder"),
        P("Lark %import with ../ path", {"type": "grammar",
                                         "grammar": "%import ..canary.SECRET\nstart: SECRET\n"},
          "refused: no .. in an import path"),
    ]


# -- connections -----------------------------------------------------------------------------


def slow_senders(ctx: Ctx) -> Result:
    """8 connections sending a request at 1 byte/s (4 slow in the head, 4 slow in the body);
    the server must close each within its timeouts. Meanwhile a /health request must be
    answered."""
    cap = ctx.args.slow_cap_s
    full = request(ctx.server, "POST", "/v1/chat/completions", chat())
    head_len = full.index(b"\r\n\r\n") + 4
    socks: list[tuple[socket.socket, int, str]] = []
    for i in range(ctx.args.slow_senders):
        s = connect(ctx.server.port)
        start = 0 if i % 2 == 0 else head_len  # even: slow head; odd: whole head at once, slow body
        if start:
            s.sendall(full[:start])
        socks.append((s, start, "head" if start == 0 else "body"))
    t0 = time.monotonic()
    closed: dict[int, tuple[float, str]] = {}
    sent = [pos for _, pos, _ in socks]
    health: Answer | None = None
    while len(closed) < len(socks) and time.monotonic() - t0 < cap:
        tick = time.monotonic()
        for i, (s, _, _) in enumerate(socks):
            if i in closed:
                continue
            readable, _, _ = select.select([s], [], [], 0)
            how = None
            if readable:
                a = read_answer(s, time.monotonic() + 2.0, Answer())
                if a.status is not None:
                    how = f"answered {a.status}" + ("" if error_object(a.body) else " (not an error object)")
                else:
                    how = a.error or "closed"
            elif sent[i] < len(full):
                try:
                    s.send(full[sent[i]:sent[i] + 1])
                    sent[i] += 1
                except OSError:
                    how = "reset on send"
            if how:
                closed[i] = (round(time.monotonic() - t0, 1), how)
        if health is None and time.monotonic() - t0 > 3:
            health = exchange(ctx.server.port, request(ctx.server, "GET", "/health"), ctx.timeout)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    for s, _, _ in socks:
        s.close()
    times = sorted(c[0] for c in closed.values())
    r = Result(wall=round(time.monotonic() - t0, 1),
               error=f"closed after {times[0]}-{times[-1]} s" if times else "none closed")
    r.details = {"cap_s": cap, "senders": [
        {"slow_in": kind, "bytes_sent": sent[i], "closed_after_s": closed.get(i, (None,))[0],
         "how": closed.get(i, (None, "still open at the cap"))[1]} for i, (_, _, kind) in enumerate(socks)],
        "health_during": None if health is None else {"status": health.status, "wall": health.wall}}
    still = [i for i in range(len(socks)) if i not in closed]
    if still:
        r.flags.append(("hang", f"{len(still)} of {len(socks)} slow senders still open after {cap:.0f} s "
                                f"(slow in the {'/'.join(sorted({socks[i][2] for i in still}))})"))
    plain = [i for i, (_, how) in closed.items() if "not an error object" in how]
    if plain:
        r.flags.append(("wrong", f"{len(plain)} answer(s) to slow senders not an OpenAI error object"))
    if health is not None and health.status != 200:
        r.flags.append(("dropped" if health.status is None else "wrong",
                        f"/health during the slow senders: {health.status or health.error}"))
    r.details["closed_s"] = times
    return r


def idle_connection(after_request: bool) -> Callable[[Ctx], Result]:
    def run(ctx: Ctx) -> Result:
        cap = ctx.args.idle_cap_s
        s = connect(ctx.server.port)
        t0 = time.monotonic()
        first = None
        if after_request:
            s.sendall(request(ctx.server, "GET", "/health", headers={"Connection": "keep-alive"}))
            first = read_answer(s, time.monotonic() + ctx.timeout, Answer())
            t0 = time.monotonic()
        how, after = "still open at the cap", None
        s.settimeout(cap)
        try:
            while True:
                data = s.recv(4096)
                if not data:
                    how = "closed"
                    break
                how = f"answered {data[:12]!r}"
        except TimeoutError:
            pass
        except OSError:
            how = "reset"
        if how != "still open at the cap":
            after = round(time.monotonic() - t0, 1)
        s.close()
        r = Result(wall=after, error=how, details={"closed_after_s": after, "how": how, "cap_s": cap,
                                                   "request_status": first.status if first else None})
        if first is not None and first.status != 200:
            r.flags.append(("wrong", f"the keep-alive request got {first.status or first.error}"))
        if after is None:
            r.flags.append(("hang", f"still open after {cap:.0f} s idle"))
        return r
    return run


def many_connections(ctx: Ctx) -> Result:
    """``--connections`` connections, each with half a request head sent; then a fresh request
    on a new connection; then every held connection completes its head. Over the server's
    limit a connection must be refused, closed or answered 503; the fresh request answered
    (200, or 503 when it is over the limit itself); the server alive."""
    n = ctx.args.connections
    socks: list[socket.socket] = []
    refused = 0
    partial = (f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{ctx.server.port}\r\n"
               f"Authorization: Bearer {ctx.server.key}\r\n").encode()
    t0 = time.monotonic()
    for _ in range(n):
        try:
            s = connect(ctx.server.port, 2.0)
            s.sendall(partial)
            socks.append(s)
        except OSError:
            refused += 1
    time.sleep(1.0)
    fresh = exchange(ctx.server.port, request(ctx.server, "POST", "/v1/chat/completions", normal_body()),
                     ctx.timeout)
    counts: dict[str, int] = {}
    deadline = time.monotonic() + ctx.timeout
    for s in socks:
        try:
            s.sendall(b"Connection: close\r\n\r\n")
        except OSError:
            pass
    for s in socks:
        a = read_answer(s, deadline, Answer())
        key = str(a.status) if a.status is not None else (a.error or "closed")
        counts[key] = counts.get(key, 0) + 1
        s.close()
    r = classify_answer(fresh, (200, 503))
    r.wall = round(time.monotonic() - t0, 1)
    limited = refused + sum(v for k, v in counts.items() if k not in ("200", "timeout"))
    r.details = {"connections": n, "refused_at_connect": refused, "held_answers": counts,
                 "fresh_request": {"status": fresh.status, "error": fresh.error, "wall": fresh.wall}}
    if counts.get("timeout"):
        r.flags.append(("hang", f"{counts['timeout']} held connections got no answer within "
                                f"{ctx.timeout:.0f} s"))
    if not limited:
        r.flags.append(("wrong", f"all {n} held connections answered 200: no connection limit below {n}"))
    return r


def drop_mid_body(rst: bool) -> Callable[[Ctx], Result]:
    def run(ctx: Ctx) -> Result:
        body = json.dumps(chat(user="x" * 4000)).encode()
        data = request(ctx.server, "POST", "/v1/chat/completions", body)
        s = connect(ctx.server.port)
        s.sendall(data[:len(data) - len(body) + 1000])
        time.sleep(0.5)
        if rst:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
        time.sleep(1.0)
        health = exchange(ctx.server.port, request(ctx.server, "GET", "/health"), ctx.timeout)
        r = Result(status=health.status, wall=health.wall, details={"health_after": health.status})
        if health.status != 200:
            r.flags.append(("dropped" if health.status is None else "wrong",
                            f"/health after the drop: {health.status or health.error}"))
        return r
    return run


def garbage(data: bytes | Callable[[Ctx], bytes],
            expect: tuple[int, ...] = (400,)) -> Callable[[Ctx], Result]:
    def run(ctx: Ctx) -> Result:
        raw = data(ctx) if callable(data) else data
        return classify_answer(exchange(ctx.server.port, raw, ctx.timeout), expect)
    return run


def disconnect_while_preparing(ctx: Ctx) -> Result:
    """Send 3 hostile constraints (each takes seconds to refuse), go away after 0.5 s, then
    watch the server's CPU: its work on them must stop (idle within ``IDLE_AFTER_LEAVING_S``
    of the disconnect). Not exercised when every one was answered before the disconnect."""
    def kinds(nonce: int, x: str, y: str) -> list[dict[str, Any]]:
        return [schema_fmt({"type": "array", "items": {"type": "integer"}, "minItems": 10**9 - nonce,
                            "maxItems": 10**9 - nonce}),
                schema_fmt({"type": "string", "pattern": evil(x, y, 21)}),
                {"type": "grammar", "grammar": doubling_lark(40, f"{x}{nonce}")}]

    nonce = secrets.randbelow(10**6)
    fmts, fmts_stay = kinds(nonce, "m", "n"), kinds(nonce + 1, "o", "p")
    # the same kinds of request (other values, so no cache answers them), clients staying
    stay = [threading.Thread(target=lambda f=f: stayed.append(exchange(
        ctx.server.port, request(ctx.server, "POST", "/v1/chat/completions", chat(response_format=f)),
        ctx.timeout))) for f in fmts_stay]
    stayed: list[Answer] = []
    for t in stay:
        t.start()
    for t in stay:
        t.join()
    settle(ctx.server, ctx.args.settle_s)
    cpu_sent = ctx.server.cpu_s() or 0.0
    socks = []
    for f in fmts:
        s = connect(ctx.server.port)
        s.sendall(request(ctx.server, "POST", "/v1/chat/completions", chat(response_format=f)))
        socks.append(s)
    time.sleep(0.5)
    early = sum(bool(select.select([s], [], [], 0)[0]) for s in socks)
    cpu_left = ctx.server.cpu_s() or 0.0
    for s in socks:
        s.close()
    t0 = time.monotonic()
    idle = settle(ctx.server, ctx.args.disconnect_watch_s)
    r = Result(wall=round(time.monotonic() - t0, 1),
               error="all answered before the disconnect: not exercised" if early == len(socks) else
               f"idle {idle} s after the disconnect" if idle is not None else "still busy",
               details={"requests": len(socks), "answered_before_disconnect": early, "idle_after_s": idle,
                        "server_cpu_s_before_disconnect": round(cpu_left - cpu_sent, 2),
                        "answered_in_s_when_staying": [a.wall for a in stayed],
                        "statuses_when_staying": [a.status or a.error for a in stayed],
                        "watch_s": ctx.args.disconnect_watch_s, "bar_s": IDLE_AFTER_LEAVING_S})
    if early < len(socks) and (idle is None or idle > IDLE_AFTER_LEAVING_S):
        r.flags.append(("runaway", "the server kept working after the clients left: "
                                   + (f"still busy after {ctx.args.disconnect_watch_s:.0f} s" if idle is None
                                      else f"idle only after {idle} s")))
    return r


def connection_probes() -> list[Probe]:
    K = "connection"
    tls = bytes.fromhex("16030100a5010000a10303") + os.urandom(32) + b"\x00" * 64
    return [
        Probe(K, "8 slow senders at 1 byte/s", "closed by the server within its timeouts (seconds reported)",
              slow_senders),
        Probe(K, "idle keep-alive after a request", "closed within the keep-alive timeout",
              idle_connection(True)),
        Probe(K, "idle connection, no bytes sent", "closed within a timeout", idle_connection(False)),
        Probe(K, "300 open connections", "over the limit: refused or 503; a fresh request answered; no crash",
              many_connections),
        Probe(K, "client drops mid-body (FIN)", "no traceback, server fine", drop_mid_body(False),
              smoke=True),
        Probe(K, "client drops mid-body (RST)", "no traceback, server fine", drop_mid_body(True)),
        Probe(K, "garbage bytes instead of HTTP", "400 with a JSON error object",
              garbage(b"GARBAGE \x00\xff\xfe nonsense\r\n\r\n"), smoke=True),
        Probe(K, "a TLS ClientHello on the plain port", "400 with a JSON error object", garbage(tls)),
        Probe(K, "a 100 KB header line", "431 or 400 with a JSON error object",
              garbage(lambda ctx: request(ctx.server, "GET", "/health", headers={"X-Big": "a" * 100_000}),
                      (400, 431))),
        Probe(K, "HTTP/1.1 without Host", "400 with a JSON error object",
              garbage(lambda ctx: request(ctx.server, "GET", "/health", headers={"Host": None}))),
        Probe(K, "Content-Length and Transfer-Encoding both", "400 with a JSON error object",
              garbage(lambda ctx: request(ctx.server, "POST", "/v1/chat/completions", b"0\r\n\r\n",
                                          {"Transfer-Encoding": "chunked"}))),
        Probe(K, "invalid chunk size", "400 with a JSON error object",
              garbage(lambda ctx: request(ctx.server, "POST", "/v1/chat/completions", b"",
                                          {"Content-Length": None, "Transfer-Encoding": "chunked"})
                      + b"zz\r\n{}\r\n0\r\n\r\n")),
        Probe(K, "disconnect while hostile requests are prepared",
              f"the work stops (idle within {IDLE_AFTER_LEAVING_S:.0f} s)",
              disconnect_while_preparing, settle=False),
    ]


def control_probes() -> list[Probe]:
    return [
        http_probe("control", "normal json_schema request", (200,), post(normal_body()), "answered",
                   smoke=True),
        Probe("control", "GET /health", "200", garbage(lambda ctx: request(ctx.server, "GET", "/health"),
                                                       (200,)), smoke=True),
        http_probe("control", "Host: localhost:PORT", (200,),
                   lambda ctx: post(normal_body(), Host=f"localhost:{ctx.server.port}")(ctx),
                   "a loopback name"),
    ]


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------


def primary(flags: list[tuple[str, str]]) -> str:
    names = {f for f, _ in flags}
    for c in CLASSES:
        if c in names:
            return c
    return "ok"


def _traceback_lines(text: str) -> list[str]:
    """The exception line after each ``Traceback`` of ``text``."""
    out: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            for later in lines[i + 1:]:
                if later and not later.startswith((" ", "\t", "Traceback", "During handling", "The above")):
                    out.append(later[:200])
                    break
    return out


def guarded(ctx: Ctx, category: str, name: str, expect: str, body: Callable[[], Result],
            settle_after: bool = True) -> dict[str, Any]:
    """Run ``body`` under the watch (RSS, stderr, network, canary, liveness) and classify."""
    server = ctx.server
    if not server.alive():
        server.start()
    ctx.watchers.rearm()
    hits0, atimes0 = ctx.watchers.snapshot()
    log0 = server.log_size()
    t0 = time.monotonic()
    with Watch(server, ctx.args.kill_rss_mb) as w:
        try:
            res = body()
        except Exception as e:  # noqa: BLE001 - an audit bug must not stop the audit
            res = Result(flags=[("wrong", f"the probe itself failed: {type(e).__name__}: {e}")])
        settled = settle(server, ctx.args.settle_s) if settle_after and server.alive() else None
    flags = list(res.flags)
    killed = server.killed_for_memory
    died = not server.alive()
    if killed is not None:
        flags.append(("memory", f"RSS passed {ctx.args.kill_rss_mb:.0f} MB ({killed:.0f} MB): "
                                "killed by the audit"))
    elif died:
        flags.append(("crash", f"the server exited ({server.proc.returncode if server.proc else '?'})"))
    if w.growth_mb >= MEMORY_GROWTH_MB or w.max_mb >= MEMORY_ABS_MB:
        if killed is None:
            flags.append(("memory", f"RSS +{w.growth_mb:.0f} MB (max {w.max_mb:.0f} MB)"))
    if settle_after and not died and settled is None:
        flags.append(("runaway", f"still busy {ctx.args.settle_s:.0f} s after the probe"))
    time.sleep(0.2)
    log = server.log_since(log0)
    tbs = _traceback_lines(log) if "Traceback" in log else []
    if "Traceback" in log:
        flags.append(("traceback", "; ".join(tbs[:3]) or "Traceback in stderr"))
    hits1, atimes1 = ctx.watchers.snapshot()
    if hits1 > hits0:
        flags.append(("fetched", f"{hits1 - hits0} request(s) to the counting HTTP server"))
    if SECRET in res.body:
        flags.append(("fetched", "the canary secret appeared in the answer"))
    elif atimes1 != atimes0:
        flags.append(("fetched", "a canary file was read (atime moved)"))
    restarted = None
    still_busy = any(f == "runaway" for f, _ in res.flags) and settle(server, ctx.args.settle_s) is None
    if died or (settle_after and settled is None) or still_busy:
        restarted = "died" if died else "runaway"
        server.restart()
    cls = primary(flags)
    record = {"category": category, "name": name, "expect": expect, "class": cls,
              "flags": sorted({f for f, _ in flags}), "reasons": [f"{f}: {why}" for f, why in flags],
              "status": res.status, "error": res.error, "wall_s": res.wall,
              "probe_s": round(time.monotonic() - t0, 2), "settle_s": settled,
              "rss_start_mb": round(w.start_mb), "rss_max_mb": round(w.max_mb),
              "rss_growth_mb": round(w.growth_mb), "tracebacks": tbs[:5], "restarted": restarted,
              "answer": res.body[:300]}
    if res.details:
        record["details"] = res.details
    status = res.status if res.status is not None else (res.error or "-")
    print(f"  {category:11s} {name[:52]:52s} {str(status)[:24]:>24s} {str(res.wall):>7s}s  {cls}"
          + (f"  ({next(w for f, w in flags if f == cls)[:90]})" if cls != "ok" else ""), flush=True)
    return record


def run_probe(ctx: Ctx, probe: Probe) -> dict[str, Any]:
    return guarded(ctx, probe.category, probe.name, probe.expect, lambda: probe.run(ctx), probe.settle)


def _hostile_round(ctx: Ctx, bodies: list[dict[str, Any]], normal: bytes, repeats: int,
                   normals: list[tuple[Answer, int]]) -> Callable[[], Result]:
    """The body of one concurrency round: the hostile requests ``bodies`` in threads, and
    meanwhile the ``normal`` request, one at a time, appended to ``normals`` with the number
    of hostile requests still in flight when it was sent: at least ``repeats`` of them, and
    more (up to 10x) while hostile ones are in flight."""
    server = ctx.server
    results: list[Answer | None] = [None] * len(bodies)

    def send(i: int) -> None:
        data = request(server, "POST", "/v1/chat/completions", bodies[i])
        results[i] = exchange(server.port, data, ctx.timeout)

    def body() -> Result:
        threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(bodies))]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        time.sleep(0.3)  # the hostile requests are being prepared
        while len(normals) < repeats or (any(t.is_alive() for t in threads) and len(normals) < 10 * repeats):
            in_flight = sum(t.is_alive() for t in threads)
            normals.append((exchange(server.port, normal, ctx.timeout), in_flight))
        for t in threads:
            t.join()
        return Result(wall=round(time.monotonic() - t0, 1), details={"hostile": [
            {"kind": b["response_format"]["type"], "status": a.status if a else None,
             "error": a.error if a else None, "wall": a.wall if a else None}
            for b, a in zip(bodies, results)]})

    return body


def concurrency(ctx: Ctx, rounds: list[int], repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Normal requests alone, then while ``k`` hostile constraint requests are in flight."""
    server = ctx.server
    if not server.alive():
        server.start()
    normal = request(server, "POST", "/v1/chat/completions", normal_body())
    for _ in range(2):  # compile the schema, warm the model
        exchange(server.port, normal, ctx.timeout)
    alone = [exchange(server.port, normal, ctx.timeout) for _ in range(repeats)]
    lat = [a.wall for a in alone if a.status == 200]
    if not lat:
        return [], {"error": "the normal request failed alone: "
                             f"{[a.status or a.error for a in alone]}"}
    base = statistics.median(lat)
    bar = max(ctx.args.latency_factor * base, base + 1.0)
    summary: dict[str, Any] = {"alone_s": lat, "alone_median_s": round(base, 3), "bar_s": round(bar, 3),
                               "rounds": []}
    records: list[dict[str, Any]] = []
    letters = iter("pqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

    def hostile(i: int) -> dict[str, Any]:
        x, y = next(letters), next(letters)
        kinds = [  # the slowest to refuse first
            {"type": "grammar", "grammar": doubling_lark(40, x + y)},
            schema_fmt({"type": "string", "pattern": evil(x, y)}),
            schema_fmt({"type": "array", "items": {"type": "integer"}, "minItems": 10**9 - i,
                        "maxItems": 10**9 - i}),
            {"type": "regex", "regex": evil(x, y)},
        ]
        return chat(response_format=kinds[i % len(kinds)])

    for k in rounds:
        bodies = [hostile(i) for i in range(k)]
        normals: list[tuple[Answer, int]] = []
        rec = guarded(ctx, "concurrency", f"{k} hostile requests in flight (server side)",
                      "no memory growth, no traceback, no crash, idle after",
                      _hostile_round(ctx, bodies, normal, repeats, normals))
        records.append(rec)
        for j, (a, in_flight) in enumerate(normals):
            r = classify_answer(a, (200,))
            if a.status == 200 and a.wall > bar:
                r.flags.append(("slow", f"{a.wall:.2f} s beside {in_flight} hostile, alone {base:.2f} s "
                                        f"(bar {bar:.2f} s)"))
            cls = primary(r.flags)
            records.append({"category": "concurrency", "name": f"normal request {j + 1} beside {k} hostile",
                            "expect": f"200 within {bar:.2f} s ({ctx.args.latency_factor}x alone)",
                            "class": cls, "flags": sorted({f for f, _ in r.flags}),
                            "reasons": [f"{f}: {why}" for f, why in r.flags], "status": a.status,
                            "error": a.error, "wall_s": a.wall, "hostile_in_flight": in_flight})
            label = f"normal request beside {k} hostile ({in_flight} in flight)"
            print(f"  {'concurrency':11s} {label:52s} {str(a.status or a.error):>24s} {a.wall:7.2f}s  {cls}",
                  flush=True)
        ok = [a.wall for a, _ in normals if a.status == 200]
        med = statistics.median(ok) if ok else None
        summary["rounds"].append({"hostile": k, "latencies_s": [a.wall for a, _ in normals],
                                  "statuses": [a.status or a.error for a, _ in normals],
                                  "in_flight": [n for _, n in normals],
                                  "median_s": None if med is None else round(med, 3),
                                  "median_over_alone": None if med is None else round(med / base, 2)})
    return records, summary


def table_of(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    rows = {c: dict.fromkeys(COLUMNS, 0) for c in CATEGORIES}
    for r in records:
        row = rows[r["category"]]
        row["probes"] += 1
        row[r["class"]] += 1
    rows = {c: row for c, row in rows.items() if row["probes"]}
    rows["total"] = {k: sum(row[k] for row in rows.values()) for k in COLUMNS}
    return rows


def markdown(rows: dict[str, dict[str, int]]) -> str:
    lines = ["| category | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(str(row[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="14 fast probes (under a minute); writes nothing")
    ap.add_argument("--out", type=Path, default=None,
                    help="results JSON (default benchmarks/results/serve-hostile.json, .md beside it; "
                         "--smoke: not written)")
    ap.add_argument("--model", default=None,
                    help="model alias or folder to serve (default: a tiny random Llama)")
    ap.add_argument("--only", default=None, help=f"comma-separated categories of {', '.join(CATEGORIES)}")
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="per-probe answer timeout (default 30; smoke 10)")
    ap.add_argument("--compile-timeout-s", type=float, default=10.0,
                    help="the server's compile budget (compile.timeout_s of its --config; default 10)")
    ap.add_argument("--settle-s", type=float, default=10.0,
                    help="seconds the server may stay busy after a probe before it is restarted (runaway)")
    ap.add_argument("--kill-rss-mb", type=float, default=3500.0,
                    help="kill (and restart) the server past this RSS (memory); default 3500")
    ap.add_argument("--max-queued", type=int, default=8, help="the server's --max-queued (default 8)")
    ap.add_argument("--max-body-bytes", type=int, default=4 << 20, help="the server's --max-body-bytes")
    ap.add_argument("--slow-senders", type=int, default=8)
    ap.add_argument("--slow-cap-s", type=float, default=45.0, help="how long slow senders are kept up")
    ap.add_argument("--idle-cap-s", type=float, default=30.0, help="how long an idle connection is watched")
    ap.add_argument("--connections", type=int, default=300)
    ap.add_argument("--disconnect-watch-s", type=float, default=15.0,
                    help="how long the CPU is watched after a client leaves mid-preparation")
    ap.add_argument("--latency-factor", type=float, default=3.0,
                    help="a normal request beside hostile ones may take this times its median alone")
    ap.add_argument("--repeats", type=int, default=5, help="normal requests per concurrency measurement")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for structgen serve (repeatable), e.g. a new limit flag")
    ap.add_argument("--no-fail", action="store_true", help="exit 0 even when probes fail")
    ap.add_argument("--no-table", action="store_true", help="do not print the markdown table")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    load_start = [round(x, 2) for x in os.getloadavg()]
    timeout = args.timeout_s or (10.0 if args.smoke else 30.0)
    only = set(args.only.split(",")) if args.only else set(CATEGORIES)
    unknown = only - set(CATEGORIES)
    if unknown:
        ap.error(f"--only: unknown categories {', '.join(sorted(unknown))}")
    probes = [p for p in (*control_probes(), *body_probes(), *constraint_probes(), *connection_probes())
              if p.category in only or p.category == "control"]
    if args.smoke:
        probes = [p for p in probes if p.smoke]
    t_start = time.monotonic()
    tmp = tempfile.TemporaryDirectory(prefix="structgen-hostile-")
    folder = Path(tmp.name)
    watchers = Watchers(folder)
    config = folder / "serve.yaml"
    config.write_text(f"compile:\n  timeout_s: {args.compile_timeout_s}\n")
    server: Server | None = None
    records: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    try:
        model = args.model
        if model is None:
            print("building the tiny model ...", flush=True)
            save_smoke_model(folder / "tiny")
            model = str(folder / "tiny")
        server = Server(model, folder, config, "hostile-" + secrets.token_hex(8), args.max_queued,
                        args.max_body_bytes, args.server_arg)
        print(f"starting {' '.join(server.cmd[1:4])} on port {server.port} ...", flush=True)
        try:
            server.start()
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"ready after {time.monotonic() - t_start:.1f} s (RSS {server.rss_mb():.0f} MB); "
              f"{len(probes)} probes, timeout {timeout:.0f} s", flush=True)
        ctx = Ctx(server, watchers, args, timeout)
        for p in probes:
            records.append(run_probe(ctx, p))
        if "concurrency" in only and not args.smoke:
            recs, summary = concurrency(ctx, [2, 4], args.repeats)
            records += recs
    finally:
        if server is not None:
            log_tail = server.log_tail(4000)
            server.stop()
            starts = server.starts
        else:
            log_tail, starts = "", 0
        watchers.close()
        tmp.cleanup()
    runtime = round(time.monotonic() - t_start, 1)
    rows = table_of(records)
    load_end = [round(x, 2) for x in os.getloadavg()]
    failures = [r for r in records if r["class"] != "ok"]
    table = markdown(rows)
    if not args.no_table:
        print()
        print(table)
    print(f"\n{len(records)} probes, {len(failures)} not ok; {runtime:.0f} s; "
          f"server started {starts} time(s); "
          f"load average {load_start} -> {load_end}", flush=True)
    report = {"mode": "smoke" if args.smoke else "full", "table": rows, "runtime_s": runtime,
              "server_starts": starts, "load_average_start": load_start, "load_average_end": load_end,
              "settings": {"timeout_s": timeout, "compile_timeout_s": args.compile_timeout_s,
                           "settle_s": args.settle_s, "kill_rss_mb": args.kill_rss_mb,
                           "max_queued": args.max_queued, "max_body_bytes": args.max_body_bytes,
                           "slow_cap_s": args.slow_cap_s, "idle_cap_s": args.idle_cap_s,
                           "connections": args.connections, "latency_factor": args.latency_factor,
                           "model": args.model or "tiny random Llama (benchmarks/bench_suite.py tiny_model)",
                           "server_args": args.server_arg},
              "concurrency": summary, "cases": records, "server_log_tail": log_tail}
    out = args.out or (None if args.smoke else ROOT / "benchmarks" / "results" / "serve-hostile.json")
    if out is not None:
        envelope_lib.write(out, envelope, report)
        md = out.with_suffix(".md")
        lines = [f"# structgen serve under hostile input (issue 44): {report['mode']} run",
                 "", f"`{' '.join(envelope['command'])}` at `{envelope['commit']}`, {envelope['date']}; "
                 f"{envelope['machine']['cpu']}, {envelope['machine']['cores']} cores; load average "
                 f"(os.getloadavg, 1/5/15 min) {load_start} at the start, {load_end} at the end; "
                 f"{runtime:.0f} s, server started {starts} time(s).", "", table, "",
                 "Classes: see `benchmarks/README.md` (hostile-input audit) and the script's docstring.", ""]
        if summary.get("rounds"):
            lines += [f"Normal request alone: median {summary['alone_median_s']} s "
                      f"(bar {summary['bar_s']} s); "
                      + "; ".join(f"beside {r['hostile']} hostile: median {r['median_s']} s "
                                  f"({r['median_over_alone']}x), statuses {r['statuses']}"
                                  for r in summary["rounds"]), ""]
        if failures:
            lines += ["| category | probe | expected | got | class | why |", "|---|---|---|---|---|---|"]
            for r in failures:
                got = r["status"] if r["status"] is not None else (r["error"] or "-")
                why = "; ".join(r["reasons"])[:200].replace("|", "\\|")
                lines.append(f"| {r['category']} | {r['name']} | {r['expect']} | {got} | {r['class']} "
                             f"| {why} |")
        md.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {out} and {md}")
    return 0 if args.no_fail or not failures else 1


if __name__ == "__main__":
    sys.exit(main())
