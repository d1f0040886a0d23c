"""The OpenAI-compatible HTTP application of ``structgen serve`` (FastAPI) and its runner.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(:mod:`structgen.serving.responses`), ``GET /v1/models``,
``GET /health`` and ``GET /metrics`` (Prometheus text: the engine's gauges and counters, then
the run metrics of :mod:`structgen.metrics` when the caller passes them). With an API
key every route but ``/health`` needs ``Authorization: Bearer KEY``.

Errors are OpenAI error objects ``{"error": {"message", "type", "param", "code"}}``; a schema
error adds ``keyword`` and ``pointer``. Status codes: 400 a malformed body, an unknown or
unsupported field, an invalid or unsupported schema / grammar / regex, a prompt too long for
the context or, with ``"on_max_tokens": "refuse"``, a ``max_tokens`` below the shortest valid
output (by default such a request is answered 200, cut at ``max_tokens``); 401 a missing or wrong API
key; 408 a body not received within ``body_timeout_s``; 413 a body over ``max_body_bytes``; 415
a POST whose ``Content-Type`` is not JSON; 421 a ``Host`` header not on ``allowed_hosts``; 422
a constraint whose compilation passes a limit (states, rules, time: ``compile:`` in the
configuration); 429 the queue is full; 431 a request head over :data:`MAX_HEAD_BYTES`; 503 the
server is shutting down or has ``max_connections`` open.

A client that goes away (a closed stream, or a dropped connection while waiting for a
non-streamed answer) cancels its request: its rows leave the batch at the next step. It is
counted (``structgen_serve_client_disconnects_total`` on ``/metrics``), never logged as a
traceback.

Hostile input (docs/security.md, "The HTTP server"): no request body makes the server answer
5xx. A body nested past :data:`MAX_BODY_DEPTH`, a non-finite number or a lone UTF-16 surrogate
(``"\\ud800"``) anywhere in it is a 400 before any field is read; the request models are strict
(a string is never a number or a boolean). POST routes take ``Content-Type: application/json``
only (else 415: an HTML form cannot post here without a CORS preflight); the ``Host`` header must
be on the allow-list (else 421: DNS rebinding). :func:`run_server` adds what uvicorn lacks:
deadlines for a request's head (:class:`uvicorn.Config` ``http=`` :func:`protocol_class`) and
body (408), a cap on open connections (503), and OpenAI error objects for malformed HTTP.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from structgen.calls.plan import OutputStream
from structgen.errors import (
    CompileLimitError,
    ConfigError,
    EngineClosedError,
    RequestCancelledError,
    SchemaError,
    ServerBusyError,
    StructgenError,
)
from structgen.generation.results import TokenLogprob
from structgen.json_types import JsonObject, JsonValue
from structgen.serving.api_errors import ApiError, SafeJSONResponse
from structgen.serving.engine import Engine
from structgen.serving.http_messages import http_message
from structgen.serving.logprobs import chat_logprobs, completion_logprobs
from structgen.serving.partial_events import PARTIAL_KEY, PartialChunks, partial_chunks
from structgen.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    constraint_of,
    speculative_usage,
)
from structgen.serving.responses import RouteSupport, add_responses_route
from structgen.serving.server import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_CONNECTIONS,
    MAX_HEAD_BYTES,
    protocol_class,
    run_server,
    server_config,
)
from structgen.serving.submission import ChoiceResult, EngineRequest, RequestHandle
from structgen.serving.validity import VALIDITIES

__all__ = ["ApiError", "create_app", "default_allowed_hosts", "protocol_class", "run_server",
           "server_config", "DEFAULT_BODY_TIMEOUT_S", "DEFAULT_HEADER_TIMEOUT_S", "DEFAULT_KEEP_ALIVE_S",
           "DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_CONNECTIONS", "LOOPBACK_HOSTS", "MAX_BODY_DEPTH",
           "MAX_HEAD_BYTES"]

#: Largest request body accepted (bytes); larger bodies get a 413.
DEFAULT_MAX_BODY_BYTES = 4 << 20
#: Seconds a client has to send a request's whole body once its head is in; then 408.
DEFAULT_BODY_TIMEOUT_S = 30.0
#: Deepest nesting of arrays and objects a request body may have. A real request needs a few
#: levels of envelope plus its schema (whose own limit, ``JsonSchemaOptions.max_depth``, is
#: 128); far below the depth at which Python's recursion limit would strike in code that walks it.
MAX_BODY_DEPTH = 256
#: Host names every server answers to unless ``allowed_hosts`` says otherwise.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_POLL_S = 0.1  # how often a non-streamed request checks that its client is still there
# uvicorn's error log: an unexpected exception is reported where uvicorn reports its own
_log = logging.getLogger("uvicorn.error")


_Model = TypeVar("_Model", bound=BaseModel)


class _MetricsSource(Protocol):
    """Metrics ``/metrics`` appends to the engine's (:func:`structgen.metrics.process_metrics`)."""

    def to_prometheus(self) -> str:
        """The metrics in the Prometheus text format."""
        ...


class _ClientGone(Exception):
    """The client closed its connection before its request was read or answered."""


@dataclass
class _HttpCounters:
    """Counters of the HTTP layer (the engine keeps its own); touched on the event loop only."""

    client_disconnects: int = 0


def _api_error(e: StructgenError) -> ApiError:
    """The HTTP answer to a typed structgen error."""
    if isinstance(e, ServerBusyError):
        return ApiError(429, str(e), type="rate_limit_error", code="queue_full")
    if isinstance(e, EngineClosedError):
        return ApiError(503, str(e), type="server_error", code="unavailable")
    if isinstance(e, CompileLimitError):
        return ApiError(422, http_message(e), param="response_format", code="compile_limit",
                        keyword=getattr(e, "keyword", None), pointer=getattr(e, "pointer", None))
    if isinstance(e, SchemaError):
        code = "unsupported_keyword" if type(e).__name__ == "UnsupportedFeatureError" else "invalid_schema"
        return ApiError(400, str(e), param=e.param or "response_format.json_schema.schema", code=code,
                        keyword=e.keyword, pointer=e.pointer)
    if isinstance(e, ConfigError):
        return ApiError(400, str(e), param=e.key, code="invalid_value")
    name = type(e).__name__
    codes = {"GrammarError": "invalid_grammar", "GrammarSyntaxError": "invalid_grammar",
             "RegexError": "invalid_regex", "ContextLengthError": "context_length_exceeded",
             "TokenBudgetError": "max_tokens_too_small"}
    param = {"ContextLengthError": "messages", "TokenBudgetError": "max_tokens"}.get(name, "response_format")
    return ApiError(400, http_message(e), param=param, code=codes.get(name, "invalid_request"))


def _require_json(request: Request) -> None:
    """A 415 unless the request says its body is JSON. Browsers send ``text/plain``,
    ``multipart/form-data`` and ``application/x-www-form-urlencoded`` from any page without
    asking the server first (a "simple" CORS request); ``application/json`` needs a preflight
    this server never grants, so this check is what stops a web page from posting here."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        shown = media_type or "none"
        raise ApiError(415, f"Content-Type must be application/json (got {shown})",
                       code="unsupported_media_type")


async def _json_body(request: Request, limit: int, timeout_s: float | None) -> JsonObject:
    """The request's body parsed as a JSON object, read within ``timeout_s`` seconds in all:
    a 413 past ``limit`` bytes, a 408 past the deadline (and the connection is closed: its
    sender is too slow to wait for), :class:`_ClientGone` when the client drops mid-body, a
    400 for anything that is not a JSON object :func:`_check_body` accepts."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes is over the limit of {limit} bytes",
                       code="request_too_large")

    async def read() -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes",
                               code="request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        # asyncio.wait_for rather than asyncio.timeout: the package supports Python 3.10
        raw = await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body was not received within {timeout_s:g} s",
                       code="request_timeout", headers={"Connection": "close"}) from None
    except ClientDisconnect:
        raise _ClientGone() from None
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ApiError(400, f"the request body is nested more than {MAX_BODY_DEPTH} levels deep",
                       code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    _check_body(data)
    return data


def _dotted(path: tuple[str | int, ...]) -> str | None:
    """``("messages", 0, "content")`` -> ``"messages.0.content"`` (None for the body itself)."""
    return ".".join(str(p) for p in path) or None


def _printable(key: str) -> str:
    """A dict key as it can be shown in an error (lone surrogates as ``\\udXXX``)."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def _is_utf8(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (it holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_body(data: JsonObject) -> None:
    """A 400 naming the first offending field (document order) of a parsed body that nests
    past :data:`MAX_BODY_DEPTH`, holds a non-finite number (``NaN``, ``Infinity``, ``1e999``:
    Python's ``json`` reads them all) or a string or key with a lone UTF-16 surrogate (JSON's
    ``"\\ud800"`` escape decodes to one; a tokenizer, a regex compiler or a UTF-8 response would
    fail on it later, far from here). One iterative walk, so no body can exhaust the stack and
    every field, whatever reads it later, is covered."""
    stack: list[tuple[JsonValue, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if not _is_utf8(value):
                raise ApiError(400, f"{_dotted(path)}: the text holds a lone UTF-16 surrogate (not "
                               "Unicode text)", param=_dotted(path), code="invalid_unicode")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ApiError(400, f"{_dotted(path)}: numbers must be finite", param=_dotted(path),
                               code="invalid_value")
        elif isinstance(value, (dict, list)):
            if len(path) >= MAX_BODY_DEPTH:
                raise ApiError(400, f"the request body is nested more than {MAX_BODY_DEPTH} levels deep "
                               f"(at {_dotted(path)})", param=_dotted(path[:1]), code="invalid_json")
            if isinstance(value, dict):
                for key in value:
                    if not _is_utf8(key):
                        where = _dotted((*path, _printable(key)))
                        raise ApiError(400, f"{where}: the key holds a lone UTF-16 surrogate (not "
                                       "Unicode text)", param=where, code="invalid_unicode")
                items: Iterable[tuple[str | int, JsonValue]] = value.items()
            else:
                items = enumerate(value)
            # pushed in reverse so that the walk meets fields in document order
            stack.extend((item, (*path, key)) for key, item in reversed(list(items)))


def _error_path(loc: tuple[str | int, ...], data: JsonValue, missing: bool) -> tuple[str | int, ...]:
    """The part of a Pydantic error location that names fields of the body: Pydantic also
    puts the member of a union it tried in the location (``("stop", "list[str]", 0)``), which
    is no field. Each step is kept only where the body has it (a missing field: the last step)."""
    out: list[str | int] = []
    node = data
    for i, step in enumerate(loc):
        if isinstance(node, dict) and isinstance(step, str) and step in node:
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            node = node[step]
        elif missing and i == len(loc) - 1:
            pass
        else:
            continue
        out.append(step)
    return tuple(out)


def _parse(cls: type[_Model], data: JsonObject) -> _Model:
    """``data`` validated as the request model ``cls``; a 400 naming the first bad field.
    Of the errors Pydantic reports for that field (one per member of a union), the one that
    reached deepest names it: ``content: [5]`` is ``messages.0.content.0`` (not a dict), more
    use than ``messages.0.content`` (not a string)."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        errors = e.errors(include_url=False, include_input=False)
        located = [(_error_path(tuple(err.get("loc", ())), data, err.get("type") == "missing"), err)
                   for err in errors]
        field = located[0][0][:1]
        path, err = max((x for x in located if x[0][:1] == field), key=lambda x: len(x[0]))
        param = _dotted(path)
        raise ApiError(400, f"{param}: {err.get('msg')}" if param else str(err.get("msg")), param=param,
                       code="invalid_value") from None


def _host_name(value: str) -> str:
    """The host of a ``Host`` header or allow-list entry, without port, brackets or a final
    dot, lower case: ``"[::1]:8000"`` -> ``"::1"``, ``"LocalHost.:80"`` -> ``"localhost"``."""
    value = value.strip().lower()
    if value.startswith("["):  # an IPv6 literal, maybe with a port
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:  # name:port (two or more colons: a bare IPv6 address)
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def default_allowed_hosts(bind_host: str) -> tuple[str, ...]:
    """The ``Host`` names a server listening on ``bind_host`` answers to by default: the
    loopback names and the bind address itself; ``("*",)`` (any) for a wildcard address
    (``0.0.0.0``, ``::``), which is reached under names this process cannot know."""
    if bind_host in ("", "0.0.0.0", "::", "[::]"):
        return ("*",)
    return tuple(dict.fromkeys((*LOOPBACK_HOSTS, _host_name(bind_host))))


def _host_rule(allowed_hosts: str | Iterable[str] | None) -> Callable[[str | None, str | None], bool]:
    """A test ``(Host header, local address of the connection) -> allowed?`` for an
    allow-list: names (case-insensitive, ports ignored), ``*.example.org`` for subdomains,
    ``*`` for any. None: :data:`LOOPBACK_HOSTS` plus the address the connection came in on (an
    IP literal naming this very socket cannot be a rebound DNS name). A request without a
    ``Host`` header (HTTP/1.0) passes: browsers always send one."""
    if isinstance(allowed_hosts, str):
        allowed_hosts = allowed_hosts.split(",")
    names = None if allowed_hosts is None else {_host_name(h) for h in allowed_hosts if h.strip()}
    if names is not None and "*" in names:
        return lambda _host, _local: True
    exact = set(LOOPBACK_HOSTS) if names is None else {n for n in names if not n.startswith("*.")}
    suffixes = () if names is None else tuple(n[1:] for n in names if n.startswith("*."))

    def allowed(host: str | None, local: str | None) -> bool:
        if host is None:
            return True
        name = _host_name(host)
        if name in exact or (suffixes and name.endswith(suffixes)):
            return True
        return names is None and local is not None and name == _host_name(local)

    return allowed


def _usage(handle: RequestHandle, results: list[ChoiceResult]) -> dict[str, object]:
    completion = sum(len(r.tokens) for r in results)
    return {"prompt_tokens": handle.prompt_tokens, "completion_tokens": completion,
            "total_tokens": handle.prompt_tokens + completion, "structgen": speculative_usage(results)}


def _raise_on_error(results: list[ChoiceResult]) -> None:
    for r in results:
        if r.reason == "error":
            raise ApiError(500, f"generation failed: {r.error}", type="server_error", code="internal_error")


async def _collect(handle: RequestHandle, request: Request) -> list[ChoiceResult]:
    """Every choice's result, cancelling the request if the client goes away meanwhile."""
    task = asyncio.ensure_future(handle.results())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise asyncio.CancelledError()
    finally:
        if not task.done():
            handle.cancel()
            task.cancel()


def _sse(data: object) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def _chat_message(handle: RequestHandle, r: ChoiceResult) -> dict[str, object]:
    """``{"message", "finish_reason"}`` of a chat choice: with tools, a complete output split
    into its free text and its validated calls (``finish_reason`` ``"tool_calls"`` when it
    has any)."""
    if r.parts is None:
        return {"message": {"role": "assistant", "content": r.text}, "finish_reason": r.finish_reason}
    thought, text, calls, _errors = r.parts
    message: dict[str, object] = {"role": "assistant", "content": text or None}
    if handle.plan is not None and handle.plan.reasoning:
        message["reasoning_content"] = thought
    if calls:
        message["tool_calls"] = [c.openai() for c in calls]
    return {"message": message, "finish_reason": "tool_calls" if calls else r.finish_reason}


async def _stream(handle: RequestHandle, *, chat: bool, rid: str, model: str, include_usage: bool,
                  on_gone: Callable[[], None] | None = None,
                  partial: PartialChunks | None = None) -> AsyncIterator[str]:
    """OpenAI server-sent events: chunks as text is committed, a finish chunk per choice,
    optionally a usage chunk, then ``[DONE]``. ``on_gone`` is called if the stream is torn
    down (its client went away) before every choice finished. ``partial``: add each chunk's
    typed partial events (:mod:`structgen.serving.partial_events`)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    head = {"id": rid, "object": obj, "created": int(handle.created), "model": model}
    results: list[ChoiceResult] = []
    # logprobs: each delta's entries ride on the next chunk of their choice (with tools, whatever
    # chunk the delta's text produced first: content, reasoning or a call)
    lp_pending: dict[int, list[TokenLogprob]] = {}
    lp_offset: dict[int, int] = {}

    def take_lp(index: int) -> dict[str, object] | None:
        entries = lp_pending.pop(index, None)
        if not entries:
            return None
        if chat:
            return chat_logprobs(entries)
        out = completion_logprobs(entries, lp_offset.get(index, 0))
        lp_offset[index] = lp_offset.get(index, 0) + sum(len(e.token) for e in entries)
        return out

    def choice(index: int, text: str | None, finish: str | None, first: bool = False) -> dict[str, object]:
        if chat:
            delta: dict[str, object] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": take_lp(index)}
        return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": take_lp(index)}

    # with tools or reasoning, a choice's reasoning, content and calls stream as the output is
    # read (OutputStream)
    calls_in = {i: OutputStream(handle.plan) for i in range(handle.n)} if handle.plan else {}

    def call_chunks(index: int, events: Iterable[tuple[object, ...]]) -> Iterator[str]:
        for e in events:
            if e[0] == "content":
                yield _sse({**head, "choices": [choice(index, str(e[1]), None)]})
                continue
            if e[0] == "reasoning":
                yield _sse({**head, "choices": [{"index": index, "delta": {"reasoning_content": e[1]},
                                                 "finish_reason": None, "logprobs": take_lp(index)}]})
                continue
            if e[0] == "call":
                tc = {"index": e[1], "id": e[2], "type": "function",
                      "function": {"name": e[3], "arguments": ""}}
            else:
                tc = {"index": e[1], "function": {"arguments": e[2]}}
            yield _sse({**head, "choices": [{"index": index, "delta": {"tool_calls": [tc]},
                                             "finish_reason": None, "logprobs": take_lp(index)}]})

    try:
        if chat:
            for i in range(handle.n):
                yield _sse({**head, "choices": [choice(i, "", None, first=True)]})
        async for ev in handle.events():
            if ev.kind == "delta":
                if ev.logprobs:
                    lp_pending.setdefault(ev.index, []).extend(ev.logprobs)
                if handle.plan is None:
                    chunk = {**head, "choices": [choice(ev.index, ev.text, None)]}
                    if partial is not None:
                        chunk[PARTIAL_KEY] = partial.events(ev.index, ev.text)
                    yield _sse(chunk)
                else:
                    for line in call_chunks(ev.index, calls_in[ev.index].feed(ev.text)):
                        yield line
                continue
            res = ev.result
            assert res is not None
            results.append(res)
            if res.reason == "error":
                yield _sse({"error": {"message": f"generation failed: {res.error}", "type": "server_error",
                                      "param": None, "code": "internal_error"}})
                continue
            finish = res.finish_reason
            reader = calls_in.get(ev.index)
            if reader is not None:
                for line in call_chunks(ev.index, reader.feed("", final=True)):
                    yield line
                if reader.call_ids() and res.complete:
                    finish = "tool_calls"
            chunk = {**head, "choices": [choice(ev.index, None if chat else "", finish)]}
            if partial is not None:  # a number that ends the output completes here
                chunk[PARTIAL_KEY] = partial.events(ev.index, "", final=True)
            yield _sse(chunk)
        if include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(handle, results)})
        yield "data: [DONE]\n\n"
    finally:
        if len(results) < handle.n:
            handle.cancel()  # the client went away (or the response was torn down)
            if on_gone is not None:
                on_gone()


def create_app(engine: Engine, *, model_name: str, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, metrics: _MetricsSource | None = None,
               drain_timeout_s: float = 30.0, allowed_hosts: str | Iterable[str] | None = None,
               body_timeout_s: float | None = DEFAULT_BODY_TIMEOUT_S) -> FastAPI:
    """The FastAPI application serving ``engine`` under the model id ``model_name``.

    ``api_key``: required as a bearer token on every route but ``/health`` (None: open).
    ``metrics``: an object with ``to_prometheus()`` (e.g.
    :func:`structgen.metrics.process_metrics`) appended to ``/metrics``. The engine is
    started with the application and closed (draining, at most ``drain_timeout_s``) when it
    shuts down. ``allowed_hosts``: the names the ``Host`` header may give, on every route
    (a list or a comma-separated string; ``*.example.org`` for subdomains; ``"*"``: any); None:
    :data:`LOOPBACK_HOSTS` and the address the connection came in on (see
    :func:`default_allowed_hosts` for a server's bind address). ``body_timeout_s``: seconds a
    client has to send a request body (None: no limit)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: engine.close(drain=True, timeout=drain_timeout_s))
            c = engine.counters
            print(f"structgen serve: stopped ({sum(c.requests.values())} sequences served, "
                  f"{c.requests.get('cancelled', 0)} cancelled)", file=sys.stderr, flush=True)

    app = FastAPI(title="structgen serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, default_response_class=SafeJSONResponse)
    app.state.engine = engine
    counters = app.state.http_counters = _HttpCounters()
    host_allowed = _host_rule(allowed_hosts)

    def client_gone() -> None:
        counters.client_disconnects += 1

    @app.exception_handler(ApiError)
    async def _on_api_error(_request: Request, e: ApiError) -> Response:
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _on_http_error(_request: Request, e: StarletteHTTPException) -> Response:
        codes = {404: "not_found", 405: "method_not_allowed"}
        return ApiError(e.status_code, str(e.detail), code=codes.get(e.status_code)).response()

    @app.middleware("http")
    async def _gate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        # the Host check comes first and covers /health too: a page that rebinds its own DNS
        # name to 127.0.0.1 must not learn even whether a server is there
        local = request.scope.get("server")
        if not host_allowed(request.headers.get("host"), local[0] if local else None):
            return ApiError(421, "the Host header names a host this server does not serve (see "
                            "--allowed-hosts)", code="invalid_host").response()
        if api_key and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), api_key.encode()):
                return ApiError(401, "missing or invalid API key (Authorization: Bearer KEY)",
                                code="invalid_api_key").response()
        return await call_next(request)

    @app.get("/health")
    async def health() -> Response:
        if engine.failure is not None:
            return SafeJSONResponse({"status": "failed", "error": str(engine.failure)}, status_code=503)
        return SafeJSONResponse({"status": "ok", "running": engine.running, "queued": engine.queued})

    @app.get("/v1/models")
    async def models() -> Response:
        return SafeJSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "structgen"}]})

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        text = _engine_metrics(engine) + _http_metrics(counters)
        if metrics is not None:
            text += metrics.to_prometheus()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def run(request: Request, chat: bool) -> Response:
        try:
            return await answer(request, chat)
        except _ClientGone:
            client_gone()
            return Response(status_code=499)  # nobody reads it: the client is gone
        except RecursionError:
            # whatever walked the request recursively (json, a validator, a compiler): the
            # request was too deep for it, which is the client's doing, not a server fault
            raise ApiError(400, "the request is nested too deeply to process",
                           code="invalid_request") from None
        except ApiError:
            raise
        except Exception:  # noqa: BLE001 - a bug: logged with its traceback, answered in JSON
            _log.exception("request failed")
            raise ApiError(500, "internal server error (logged on the server)", type="server_error",
                           code="internal_error") from None

    async def answer(request: Request, chat: bool) -> Response:
        _require_json(request)
        data = await _json_body(request, max_body_bytes, body_timeout_s)
        req: ChatCompletionRequest | CompletionRequest = (
            _parse(ChatCompletionRequest, data) if chat else _parse(CompletionRequest, data))
        try:
            req.refuse_unsupported()
            partial = partial_chunks(req, req.n)
            er = EngineRequest(constraint_of(req.response_format), max_tokens=req.budget()
                               if isinstance(req, ChatCompletionRequest) else req.max_tokens,
                               temperature=req.temperature, top_p=req.top_p,
                               seed=req.seed, stop=req.stops(), n=req.n, on_budget=req.on_budget())
            er.logprobs = req.logprob_count()
            if isinstance(req, ChatCompletionRequest):  # chat
                if req.tools:
                    er.tools = req.tools
                    er.tool_choice = "auto" if req.tool_choice is None else req.tool_choice
                    er.parallel_tool_calls = req.parallel_tool_calls is not False
                if req.reasoning:
                    er.reasoning, er.thinking_budget = True, req.thinking_budget
                er.messages = req.message_dicts()
            else:
                er.prompt = req.prompt_text()
            # the client's address names its share of the preparation workers; a client that
            # goes away stops its preparation
            handle = await engine.submit(er, client=request.client.host if request.client else None,
                                         disconnected=request.is_disconnected)
        except RequestCancelledError:
            raise _ClientGone() from None
        except StructgenError as e:
            raise _api_error(e) from None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        model = req.model or model_name
        if req.stream:
            return StreamingResponse(_stream(handle, chat=chat, rid=rid, model=model,
                                             include_usage=req.include_usage(), on_gone=client_gone,
                                             partial=partial),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            results = await _collect(handle, request)
        except asyncio.CancelledError:
            raise _ClientGone() from None
        _raise_on_error(results)
        if chat:
            choices = [{"index": r.index, **_chat_message(handle, r), "logprobs": chat_logprobs(r.logprobs)}
                       for r in results]
        else:
            choices = [{"index": r.index, "text": r.text, "finish_reason": r.finish_reason,
                        "logprobs": completion_logprobs(r.logprobs)} for r in results]
        return SafeJSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                  "created": int(handle.created), "model": model, "choices": choices,
                                  "usage": _usage(handle, results), "system_fingerprint": None})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await run(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await run(request, chat=False)

    add_responses_route(app, engine, model_name=model_name, support=RouteSupport(
        require_json=_require_json, read_body=lambda r: _json_body(r, max_body_bytes, body_timeout_s),
        parse=_parse, api_error=_api_error, error=ApiError, client_gone=_ClientGone, collect=_collect,
        on_client_gone=client_gone))
    return app


def _http_metrics(counters: _HttpCounters) -> str:
    """The HTTP layer's counters in the Prometheus text format."""
    name = "structgen_serve_client_disconnects_total"
    return (f"# HELP {name} Requests whose client went away before the answer was complete "
            f"(mid-body, while waiting, mid-stream).\n# TYPE {name} counter\n"
            f"{name} {counters.client_disconnects}\n")


def _engine_metrics(engine: Engine) -> str:
    """The engine's gauges and counters in the Prometheus text format."""
    c = engine.counters
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP structgen_serve_{name} {help_text}")
        lines.append(f"# TYPE structgen_serve_{name} {kind}")
        for labels, value in samples:
            lines.append(f"structgen_serve_{name}{labels} {value}")

    family("running_sequences", "gauge", "Sequences in the running batch.", [("", engine.running)])
    family("queued_sequences", "gauge", "Sequences compiling or waiting for a batch row.",
           [("", engine.queued)])
    family("max_running_sequences", "gauge", "Rows of the running batch (admission limit).",
           [("", engine.max_running)])
    family("rejected_requests_total", "counter", "Requests refused with 429 (queue full).",
           [("", c.rejected)])
    family("finished_sequences_total", "counter", "Finished sequences by how they ended.",
           [(f'{{reason="{k}"}}', v) for k, v in sorted(c.requests.items())] or [('{reason="stop"}', 0)])
    family("steps_total", "counter", "Batched target forward passes.", [("", c.steps)])
    family("step_rows_total", "counter", "Rows summed over the batched steps (mean batch = rows / steps).",
           [("", c.step_rows)])
    family("output_tokens_total", "counter", "Tokens committed to outputs.", [("", c.output_tokens)])
    family("joins_total", "counter", "Times new sequences joined the running batch.", [("", c.joins)])
    family("constrained_outputs_total", "counter", "Finished outputs of requests with a constraint "
           "(response_format, tools) by verdict: valid, invalid, incomplete = cut at max_tokens.",
           [(f'{{validity="{k}"}}', c.outputs.get(k, 0)) for k in VALIDITIES])
    pc = getattr(engine.lm, "prefix_cache", None)
    if pc is not None:  # the model's cache of shared prompt prefixes
        st = pc.stats
        family("prefix_cache_lookups_total", "counter", "Prompts looked up in the prefix cache.",
               [("", st.lookups)])
        family("prefix_cache_hits_total", "counter", "Prompts that restored a saved prefix.", [("", st.hits)])
        family("prefix_cache_restore_failures_total", "counter",
               "Saved prefixes the backend refused to load (prefilled instead).", [("", st.restore_failures)])
        family("prefix_cache_reused_tokens_total", "counter",
               "Prompt tokens restored from the prefix cache instead of prefilled.", [("", st.tokens_reused)])
        family("prefix_cache_prompt_tokens_total", "counter", "Prompt tokens of every lookup.",
               [("", st.tokens_looked_up)])
        family("prefix_cache_bytes", "gauge", "Memory held by saved prefix states.", [("", st.bytes)])
        family("prefix_cache_capacity_bytes", "gauge", "The prefix cache's memory bound.",
               [("", pc.max_bytes)])
        family("prefix_cache_entries", "gauge", "Saved prefix states.", [("", st.entries)])
        family("prefix_cache_evictions_total", "counter", "Saved states dropped for memory.",
               [("", st.evicted)])
    return "\n".join(lines) + "\n"
