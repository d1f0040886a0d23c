"""``structgen serve`` under hostile input (issue 44, the HTTP layer): a real server process
(:func:`structgen.serving.app.run_server` on 127.0.0.1, a free port, the tiny model of
tests/_tiny_lm.py) probed with httpx and raw sockets.

Oracles: the HTTP status (never a 5xx for anything a client sends), the body (an OpenAI error
object ``{"error": {"message", "type", "param", "code"}}`` for every 4xx, naming the field
where one is at fault; a completion for a 200), the wall clock (slow senders and idle
connections are closed within the configured timeouts while a normal request is served) and
the server's own stderr, which must never hold a ``Traceback``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.assets

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 1.0
MAX_CONNECTIONS = 32
MAX_BODY_BYTES = 300_000

# The server process: the tiny "biased" model (constrained outputs finish within a few dozen
# tokens), short timeouts so that the slow-client tests take seconds.
_SERVER = """
import sys
sys.path.insert(0, {tests!r})
from _tiny_lm import build_tiny_llama
from structgen.generation.model import CausalLM
from structgen.assets.store import load_tokenizer
from structgen.serving.app import create_app, run_server
from structgen.serving.engine import Engine

tok = load_tokenizer("gpt2")
engine = Engine(CausalLM(build_tiny_llama(tok, "biased"), tok), max_running=4, max_queued=64,
                default_max_tokens=8, compile_workers=2)
app = create_app(engine, model_name="tiny", max_body_bytes={max_body}, body_timeout_s={body})
run_server(app, host="127.0.0.1", port={port}, log_level="info", keep_alive_s={keep_alive},
           max_connections={max_connections}, header_timeout_s={header})
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tokenizer_by_alias, tmp_path_factory):
    tokenizer_by_alias("gpt2")  # fetched (or the module skipped) before the server needs it
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve-hostile") / "server.log"
    script = _SERVER.format(tests=str(TESTS), port=port, max_body=MAX_BODY_BYTES, body=BODY_TIMEOUT_S,
                            keep_alive=KEEP_ALIVE_S, max_connections=MAX_CONNECTIONS,
                            header=HEADER_TIMEOUT_S)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield SimpleNamespace(url=url, port=port, proc=proc, log=lambda: log_path.read_text(errors="replace"))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    assert "Traceback" not in log_path.read_text(errors="replace")


def _no_traceback(server) -> None:
    log = server.log()
    assert "Traceback" not in log, log[-4000:]


def _post(server, body: Any, path: str = "/v1/chat/completions", *, raw: bytes | None = None,
          headers: dict[str, str] | None = None, client: Any = None) -> Any:
    content = raw if raw is not None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    return (client or httpx).post(server.url + path, content=content, headers=hdrs, timeout=60)


def _error(r: Any, status: int | None = None) -> dict[str, Any]:
    """The OpenAI error object of a 4xx response (asserting its shape)."""
    assert 400 <= r.status_code < 500 if status is None else r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert {"type", "param", "code"} <= set(err)
    return err


def _metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    m = re.search(rf"^structgen_serve_{name} (\S+)$", text, re.M)
    assert m, text
    return float(m.group(1))


def _deep_list(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


# ---------------------------------------------------------------- 1. no 500 from the body

def test_deep_nesting_is_400_not_500(server) -> None:
    deep = b'{"messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    err = _error(_post(server, None, raw=deep), 400)
    assert err["code"] == "invalid_json"
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert _error(_post(server, None, raw=b"[" * 10_000 + b"]" * 10_000, path=path), 400)["code"] == \
            "invalid_json"
    # deep, but within what json.loads reads: inside a schema, a content part, a tool spec
    schema_body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "o", "schema": {"type": "array", "items": _deep_list(600)}}}}
    err = _error(_post(server, schema_body), 400)
    assert err["code"] == "invalid_json" and err["param"] == "response_format"
    parts = {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": _deep_list(400)}]}]}
    assert _error(_post(server, parts), 400)["param"] == "messages"
    tools = {**CHAT, "tools": [{"type": "function",
                                "function": {"name": "f", "parameters": _deep_list(500)}}]}
    assert _error(_post(server, tools), 400)["param"] == "tools"
    # schemas as deep as the body allows: the compiler answers (a completion, or its own limit)
    for depth in (100, 240):
        chain: dict[str, Any] = {"type": "integer"}
        for _ in range(depth):
            chain = {"type": "array", "items": chain}
        r = _post(server, {**CHAT, "max_tokens": 8, "response_format": {
            "type": "json_schema", "json_schema": {"name": "o", "schema": chain}}})
        assert r.status_code == 200 or _error(r), r.text
    # NaN, Infinity and overflowing numbers are not JSON numbers a request may hold
    for raw in (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
                b'{"messages": [{"role": "user", "content": "hi"}], "top_p": -Infinity}',
                b'{"messages": [{"role": "user", "content": "hi"}], "metadata": {"x": [1e999]}}'):
        err = _error(_post(server, None, raw=raw), 400)
        assert err["param"] in ("temperature", "top_p", "metadata.x.0"), err
    _no_traceback(server)


def test_lone_surrogates_are_refused_at_the_door(server) -> None:
    bad = "ok\ud800"
    grammar = {"type": "grammar", "grammar": 'start: "a' + bad + '"'}
    schema_key = {"type": "json_schema", "json_schema": {"name": "o", "schema": {
        "type": "object", "properties": {bad: {"type": "string"}}}}}
    schema_value = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"enum": ["a", bad]}}}
    tool = [{"type": "function",
             "function": {"name": "f", "description": bad, "parameters": {"type": "object"}}}]
    cases = [
        ({**CHAT, "messages": [{"role": "user", "content": bad}]}, "/v1/chat/completions",
         "messages.0.content"),
        ({**CHAT, "messages": [{"role": bad, "content": "x"}]}, "/v1/chat/completions", "messages.0.role"),
        ({**CHAT, "messages": [{"role": "user", "content": "x", "name": bad}]}, "/v1/chat/completions",
         "messages.0.name"),
        ({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": bad}]}]},
         "/v1/chat/completions", "messages.0.content.0.text"),
        ({**CHAT, "model": bad}, "/v1/chat/completions", "model"),
        ({**CHAT, "stop": ["a", bad]}, "/v1/chat/completions", "stop.1"),
        ({**CHAT, "response_format": grammar}, "/v1/chat/completions", "response_format.grammar"),
        ({**CHAT, "response_format": {"type": "regex", "regex": bad}}, "/v1/chat/completions",
         "response_format.regex"),
        ({**CHAT, "response_format": schema_key}, "/v1/chat/completions",
         "response_format.json_schema.schema.properties.ok\\ud800"),
        ({**CHAT, "response_format": schema_value}, "/v1/chat/completions",
         "response_format.json_schema.schema.enum.1"),
        ({**CHAT, "tools": tool}, "/v1/chat/completions", "tools.0.function.description"),
        ({**CHAT, "user": bad}, "/v1/chat/completions", "user"),
        ({"prompt": bad, "max_tokens": 4}, "/v1/completions", "prompt"),
        ({"prompt": ["x", bad], "max_tokens": 4}, "/v1/completions", "prompt.1"),
    ]
    for body, path, param in cases:
        raw = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as "\ud800"
        assert b"\\ud800" in raw
        err = _error(_post(server, None, raw=raw, path=path), 400)
        assert (err["code"], err["param"]) == ("invalid_unicode", param), (path, err)
    # a surrogate pair is a character, not an error
    r = _post(server, {**CHAT, "messages": [{"role": "user", "content": "\U0001f600"}]})
    assert r.status_code == 200, r.text
    _no_traceback(server)


# ---------------------------------------------------------------- 2. strict request types

def test_strings_are_not_booleans_or_numbers(server) -> None:
    cases = [("stream", "yes"), ("stream", 1), ("max_tokens", True), ("max_tokens", "4"), ("max_tokens", 4.0),
             ("n", "2"), ("temperature", "0.5"), ("temperature", True), ("seed", 1.5), ("seed", "7"),
             ("logprobs", "x"), ("top_p", "1"), ("reasoning", "true"), ("parallel_tool_calls", "no"),
             ("max_completion_tokens", "8"), ("thinking_budget", 2.5), ("user", 5), ("model", 7),
             ("stream_options", {"include_usage": "yes"}), ("max_tokens", 10**30)]
    for field, value in cases:
        err = _error(_post(server, {**CHAT, field: value}), 400)
        assert err["param"] is not None and err["param"].split(".")[0] == field, (field, value, err)
    for field, value in [("n", "2"), ("max_tokens", True), ("echo", "yes"), ("best_of", 2)]:
        body = {"prompt": "x", "max_tokens": 4, field: value}
        err = _error(_post(server, body, path="/v1/completions"), 400)
        assert err["param"] == field, (field, value, err)
    # a union field names itself, not the union member Pydantic tried
    assert _error(_post(server, {**CHAT, "stop": 5}), 400)["param"] == "stop"
    assert _error(_post(server, {**CHAT, "messages": [{"role": "user", "content": [5]}]}),
                  400)["param"] == "messages.0.content.0"
    assert _error(_post(server, {"max_tokens": 4}, path="/v1/completions"), 400)["param"] == "prompt"
    # JSON has one number type: an integer is a valid temperature
    for body in ({**CHAT, "temperature": 1, "top_p": 1, "seed": 3}, {**CHAT, "temperature": 0.5, "n": 2}):
        r = _post(server, body)
        assert r.status_code == 200 and r.json()["choices"], r.text
    _no_traceback(server)


# ---------------------------------------------------------------- 3. browser-facing safety

def test_posts_need_a_json_content_type(server) -> None:
    body = json.dumps(CHAT).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                  "application/jsonx", "text/json", ""):
        r = httpx.post(server.url + "/v1/chat/completions", content=body, headers={"Content-Type": ctype},
                       timeout=30)
        assert _error(r, 415)["code"] == "unsupported_media_type", ctype
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "x"}', timeout=30)  # no header
    assert _error(r, 415)["code"] == "unsupported_media_type"
    for ctype in ("application/json; charset=utf-8", "Application/JSON", "application/json;charset=UTF-8"):
        r = httpx.post(server.url + "/v1/chat/completions", content=body, headers={"Content-Type": ctype},
                       timeout=60)
        assert r.status_code == 200, (ctype, r.text)
    _no_traceback(server)


def test_host_header_allow_list(server) -> None:
    port = server.port
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example",
                 "[::2]", "10.0.0.1"):
        for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
            r = httpx.request(method, server.url + path,
                              headers={"Host": host, "Content-Type": "application/json"},
                              content=json.dumps(CHAT).encode() if method == "POST" else None, timeout=30)
            assert _error(r, 421)["code"] == "invalid_host", (host, path)
    for host in ("localhost", f"localhost:{port}", "127.0.0.1", f"127.0.0.1:{port}", f"[::1]:{port}", "[::1]",
                 "LOCALHOST.", f"localhost.:{port}"):
        r = httpx.get(server.url + "/health", headers={"Host": host}, timeout=30)
        assert r.status_code == 200, (host, r.text)
    _no_traceback(server)


def test_host_rules_and_defaults() -> None:
    from structgen.serving.app import _host_rule, default_allowed_hosts

    assert default_allowed_hosts("0.0.0.0") == ("*",) and default_allowed_hosts("::") == ("*",)
    assert set(default_allowed_hosts("192.168.1.5")) == {"localhost", "127.0.0.1", "::1", "192.168.1.5"}
    local = _host_rule(default_allowed_hosts("127.0.0.1"))
    assert local("127.0.0.1:8000", None) and local("[::1]:8000", None) and not local("evil.example", None)
    anyone = _host_rule("*")
    assert anyone("evil.example", None)
    listed = _host_rule("api.example.org, *.internal.example,[::1]")
    assert listed("API.example.org:443", None) and listed("a.b.internal.example", None)
    assert listed("[::1]:80", None)
    assert not listed("internal.example", None) and not listed("localhost", None)
    assert not listed("api.example.org.evil.example", None)
    default = _host_rule(None)  # create_app's default: loopback and the socket's own address
    assert default("localhost:1", "10.1.2.3") and default("10.1.2.3:8000", "10.1.2.3")
    assert not default("10.9.9.9", "10.1.2.3") and default(None, "10.1.2.3")


def test_responses_survive_lone_surrogates() -> None:
    """No response can fail while it is encoded: text that cannot be UTF-8 goes out escaped."""
    from structgen.serving.app import ApiError

    body = ApiError(400, "bad \ud800 text").response().body
    assert body.isascii() and json.loads(body)["error"]["message"] == "bad \ud800 text"
    assert ApiError(400, "caf\u00e9").response().body == \
        b'{"error":{"message":"caf\xc3\xa9","type":"invalid_request_error","param":null,"code":null}}'


def test_serve_cli_flags() -> None:
    from structgen.cli import _parser
    from structgen.cli._common import _Usage
    from structgen.cli.serve import _allowed_hosts

    args = _parser().parse_args(["serve"])
    assert (args.max_connections, args.keep_alive_timeout, args.header_timeout, args.body_timeout) == \
        (256, 5.0, 10.0, 30.0)
    assert _allowed_hosts(args) == ("localhost", "127.0.0.1", "::1")
    assert _allowed_hosts(_parser().parse_args(["serve", "--host", "0.0.0.0"])) == ("*",)
    assert _allowed_hosts(_parser().parse_args(["serve", "--host", "10.0.0.5"]))[-1] == "10.0.0.5"
    given = _parser().parse_args(["serve", "--host", "0.0.0.0",
                                  "--allowed-hosts", "api.example.org, 10.0.0.5"])
    assert _allowed_hosts(given) == ("api.example.org", "10.0.0.5")
    with pytest.raises(_Usage):
        _allowed_hosts(_parser().parse_args(["serve", "--allowed-hosts", " , "]))
    for bad in (["--header-timeout", "nan"], ["--body-timeout", "0"], ["--keep-alive-timeout", "-1"],
                ["--max-connections", "0"]):
        with pytest.raises(SystemExit):
            _parser().parse_args(["serve", *bad])


# ---------------------------------------------------------------- 4. connections

def _slow_sender(port: int, first: bytes, rest: bytes, report: dict[str, Any], key: str) -> None:
    """Send ``first`` at once, then ``rest`` one byte a second; record when the server
    closed the connection and what it answered."""
    start = time.monotonic()
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        if first:
            s.sendall(first)
        s.settimeout(1.0)
        for i in range(30):
            try:
                if i < len(rest):
                    s.sendall(rest[i:i + 1])
                data = s.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # reset or broken pipe: closed
                break
            if not data:
                break
            got += data
            # an answer came: what is left is the close
    report[key] = (time.monotonic() - start, got)


def test_slow_senders_and_idle_connections_are_closed_in_time(server) -> None:
    port = server.port
    body = json.dumps(CHAT).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    report: dict[str, Any] = {}
    threads = [threading.Thread(target=_slow_sender, args=(port, b"", head + body, report, f"head{i}"))
               for i in range(8)]
    threads += [threading.Thread(target=_slow_sender, args=(port, head, body, report, f"body{i}"))
                for i in range(4)]
    threads += [threading.Thread(target=_slow_sender, args=(port, b"", b"", report, "silent"))]
    for t in threads:
        t.start()
    time.sleep(0.5)
    # meanwhile a normal request is served, and its idle keep-alive connection then closed
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        start = time.monotonic()
        s.sendall(head + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, answer
            answer += chunk
        served = time.monotonic() - start
        assert answer.startswith(b"HTTP/1.1 200"), answer
        s.settimeout(30)
        idle = time.monotonic()
        assert s.recv(1) == b""  # closed by the server after the keep-alive timeout
        idle = time.monotonic() - idle
    for t in threads:
        t.join(40)
    assert served < HEADER_TIMEOUT_S + 5
    assert KEEP_ALIVE_S - 0.2 <= idle <= KEEP_ALIVE_S + 3, idle
    limit = HEADER_TIMEOUT_S + 3  # the deadline plus scheduling slack on a busy 2-core machine
    for key, (elapsed, got) in report.items():
        assert elapsed <= limit + (1 if key.startswith("body") else 0), (key, elapsed, got)
        if key.startswith("head"):
            assert HEADER_TIMEOUT_S - 0.2 <= elapsed, (key, elapsed)
            # part of a head arrived: the close comes with a 408 error object
            assert got.startswith(b"HTTP/1.1 408"), (key, got)
            assert b'"code":"request_timeout"' in got.replace(b" ", b""), got
        elif key.startswith("body"):
            assert got.startswith(b"HTTP/1.1 408"), (key, got)
            assert b'"request_timeout"' in got
        else:  # a silent connection is closed without an answer
            assert got == b"" and HEADER_TIMEOUT_S - 0.2 <= elapsed, (key, elapsed, got)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    _no_traceback(server)


def test_an_unread_body_after_an_early_answer_is_bounded(server) -> None:
    """A 415 is answered before the body is read; the rest of that body must still arrive in
    time, else the connection is closed (the head deadline)."""
    port = server.port
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 1000\r\n\r\n")
    report: dict[str, Any] = {}
    _slow_sender(port, head + b"x", b"y" * 100, report, "drain")
    elapsed, got = report["drain"]
    assert got.startswith(b"HTTP/1.1 415") and elapsed <= HEADER_TIMEOUT_S + 3, (elapsed, got)
    _no_traceback(server)


def test_connections_past_the_cap_get_a_json_503(server) -> None:
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)  # the server has accepted them all
        for _ in range(3):  # one more, silent: answered and closed at once, not at the head deadline
            start = time.monotonic()
            got = _raw_exchange(server.port, b"")
            assert time.monotonic() - start < HEADER_TIMEOUT_S / 2, got
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503") and b"content-type: application/json" in head.lower(), got
            assert json.loads(body)["error"]["code"] == "too_many_connections"
        r = httpx.get(server.url + "/health", timeout=10)
        err = _error_5xx(r, 503)
        assert err["code"] == "too_many_connections" and err["type"] == "server_error"
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    _no_traceback(server)


def _error_5xx(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json", r.headers
    return r.json()["error"]


# ---------------------------------------------------------------- 5. quiet disconnects

def test_client_dropping_mid_body_is_counted_not_logged(server) -> None:
    before = _metric(server, "client_disconnects_total")
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n")
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(head + b'{"messages": [{"role": "user", "content": "')
            time.sleep(0.2)  # the app is reading the body
    # and a stream dropped after its first event
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=30,
                      json={**CHAT, "max_tokens": 200, "stream": True}) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    deadline = time.monotonic() + 10
    while _metric(server, "client_disconnects_total") < before + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(server, "client_disconnects_total") >= before + 3
    _no_traceback(server)


# ---------------------------------------------------------------- 6. malformed HTTP

def _raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            got += chunk
    return got


def test_malformed_http_gets_a_json_400(server) -> None:
    for garbage in (b"GARBAGE\r\n\r\n", b"\x00\xff\xfe junk \r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header Line\r\n\r\n",
                    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n",
                    b"GET /health HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
                    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40)):  # a TLS ClientHello
        got = _raw_exchange(server.port, garbage)
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), got[:200]
        assert b"content-type: application/json" in head.lower()
        err = json.loads(body)["error"]
        assert err == {"message": err["message"], "type": "invalid_request_error", "param": None,
                       "code": "bad_request"}
    # a head over 16 KiB, whether it ends or not (h11 itself limits only one that arrives in pieces)
    for head in (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
                 b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 20_000):
        got = _raw_exchange(server.port, head)
        assert got.startswith(b"HTTP/1.1 431"), got[:200]
        assert json.loads(got.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_header_too_large"
    # a head just under the limit, with a body bigger than it, is a request like any other
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 40_000}]}).encode()
    r = httpx.post(server.url + "/v1/chat/completions", content=body, timeout=60,
                   headers={"Content-Type": "application/json", "X-Pad": "p" * 15_000})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    _no_traceback(server)


# ---------------------------------------------------------------- 7. every field, hostile values

_HOSTILE: list[Any] = [None, True, False, 0, -1, 1.5, -0.0, 1e308, -1e308, 10**30, -(10**30), 2**63, "",
                       "NaN", "-Infinity", "1e999", "x" * 100_000, "\ud800", "\x00", [], [None], [[[]]],
                       _deep_list(200), {}, {"": None}, {"type": "\ud800"}]

_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "o", "strict": True, "schema": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
_TOOLS = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
_BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", CHAT),
    "parts": ("/v1/chat/completions", {**CHAT, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    "schema": ("/v1/chat/completions", {**CHAT, "max_tokens": 24, "response_format": _SCHEMA_FORMAT}),
    "grammar": ("/v1/chat/completions",
                {**CHAT, "response_format": {"type": "grammar", "grammar": 'start: "a"'}}),
    "regex": ("/v1/chat/completions", {**CHAT, "response_format": {"type": "regex", "regex": "[ab]{1,3}"}}),
    "tools": ("/v1/chat/completions", {**CHAT, "max_tokens": 24, "tools": _TOOLS, "tool_choice": "auto"}),
    "reasoning": ("/v1/chat/completions",
                  {**CHAT, "max_tokens": 16, "reasoning": True, "thinking_budget": 4}),
    "stream": ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    "completion": ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 4}),
}
_FIELDS: list[tuple[str, str]] = [
    ("chat", "model"), ("chat", "messages"), ("chat", "messages.0"), ("chat", "messages.0.role"),
    ("chat", "messages.0.content"), ("chat", "messages.0.name"), ("parts", "messages.0.content.0"),
    ("parts", "messages.0.content.0.type"), ("parts", "messages.0.content.0.text"), ("chat", "max_tokens"),
    ("chat", "max_completion_tokens"), ("chat", "temperature"), ("chat", "top_p"), ("chat", "seed"),
    ("chat", "stop"), ("chat", "n"), ("chat", "stream"), ("stream", "stream_options"),
    ("stream", "stream_options.include_usage"), ("chat", "response_format"),
    ("schema", "response_format.type"),
    ("schema", "response_format.json_schema"), ("schema", "response_format.json_schema.name"),
    ("schema", "response_format.json_schema.schema"), ("schema", "response_format.json_schema.strict"),
    ("schema", "response_format.json_schema.schema.properties.a"), ("grammar", "response_format.grammar"),
    ("grammar", "response_format.start"), ("regex", "response_format.regex"), ("tools", "tools"),
    ("tools", "tools.0"), ("tools", "tools.0.type"), ("tools", "tools.0.function"),
    ("tools", "tools.0.function.name"),
    ("tools", "tools.0.function.parameters"), ("tools", "tool_choice"), ("tools", "parallel_tool_calls"),
    ("reasoning", "reasoning"), ("reasoning", "thinking_budget"), ("chat", "user"), ("chat", "logprobs"),
    ("chat", "top_logprobs"), ("chat", "logit_bias"), ("chat", "presence_penalty"), ("chat", "functions"),
    ("chat", "function_call"), ("chat", "metadata"), ("completion", "prompt"), ("completion", "max_tokens"),
    ("completion", "echo"), ("completion", "suffix"), ("completion", "best_of"), ("completion", "logprobs"),
]


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    node: Any = out
    steps = [int(p) if p.isdigit() else p for p in path.split(".")]
    for step in steps[:-1]:
        node = node[step]
    node[steps[-1]] = value
    return out


# Slow, not wrong (a 400 after about 40 s on a 2-core machine): the token-budget check of a
# 100 KB regex literal grows with the square of its length (30 KB: 6 s). Left out to keep this
# test fast; it belongs to the engine's preparation, which its deadline bounds.
_SLOW = {("regex", "response_format.regex", 100_000)}


def test_every_field_with_hostile_values(server) -> None:
    cases = [(base, field, value) for base, field in _FIELDS for value in _HOSTILE
             if (base, field, len(value) if isinstance(value, str) else None) not in _SLOW]
    local = threading.local()

    def probe(case: tuple[str, str, Any]) -> tuple[str, str, Any, int, str, str]:
        base, field, value = case
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=120)
        path, body = _BASES[base]
        r = _post(server, _with(body, field, value), path, client=local.client)
        return base, field, value, r.status_code, r.headers.get("content-type", ""), r.text

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(probe, cases))
    problems = []
    codes: dict[int, int] = {}
    for base, field, value, status, ctype, text in results:
        codes[status] = codes.get(status, 0) + 1
        shown = repr(value)[:40]
        if status >= 500:
            problems.append(f"{base} {field}={shown}: {status} {text[:200]}")
        elif status >= 400:
            try:
                err = json.loads(text)["error"]
                assert isinstance(err["message"], str) and {"type", "param", "code"} <= set(err)
            except (ValueError, KeyError, TypeError, AssertionError):
                problems.append(f"{base} {field}={shown}: {status} without an error object: {text[:200]}")
        elif ctype.startswith("text/event-stream"):
            if not text.rstrip().endswith("data: [DONE]") or '"error"' in text:
                problems.append(f"{base} {field}={shown}: a broken stream: {text[-200:]}")
        elif status != 200 or "choices" not in json.loads(text):
            problems.append(f"{base} {field}={shown}: {status} {text[:200]}")
    assert not problems, "\n".join(problems[:40])
    assert codes.get(200, 0) > 0 and codes.get(400, 0) > len(cases) // 2, codes
    _no_traceback(server)
