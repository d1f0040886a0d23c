"""The OpenAI-compatible HTTP application of ``structgen serve`` (FastAPI) and its runner.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /health`` and ``GET /metrics`` (Prometheus text: the engine's gauges and counters, then
the run metrics of :mod:`structgen.tools.metrics` when the caller passes them). With an API
key every route but ``/health`` needs ``Authorization: Bearer KEY``.

Errors are OpenAI error objects ``{"error": {"message", "type", "param", "code"}}``; a schema
error adds ``keyword`` and ``pointer``. Status codes: 400 a malformed body, an unknown or
unsupported field, an invalid or unsupported schema / grammar / regex, a prompt too long for
the context or a ``max_tokens`` below what the constraint needs; 401 a missing or wrong API
key; 413 a body over ``max_body_bytes``; 422 a constraint whose compilation passes a limit
(states, rules, time: ``compile:`` in the configuration); 429 the queue is full; 503 the
server is shutting down.

A client that goes away (a closed stream, or a dropped connection while waiting for a
non-streamed answer) cancels its request: its rows leave the batch at the next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from structgen.errors import (
    CompileLimitError,
    ConfigError,
    SchemaError,
    StructgenError,
)
from structgen.generation.tool_calls import OutputStream
from structgen.serving.engine import (
    ChoiceResult,
    Engine,
    EngineClosedError,
    EngineRequest,
    RequestHandle,
    ServerBusyError,
)
from structgen.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    constraint_of,
    speculative_usage,
)

__all__ = ["ApiError", "create_app", "run_server", "DEFAULT_MAX_BODY_BYTES"]

#: Largest request body accepted (bytes); larger bodies get a 413.
DEFAULT_MAX_BODY_BYTES = 4 << 20
_POLL_S = 0.1  # how often a non-streamed request checks that its client is still there


class ApiError(Exception):
    """An error answered as an OpenAI error object with HTTP ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",  # noqa: A002
                 param: str | None = None, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type, "param": param, "code": code, **extra}}


def _api_error(e: StructgenError) -> ApiError:
    """The HTTP answer to a typed structgen error."""
    if isinstance(e, ServerBusyError):
        return ApiError(429, str(e), type="rate_limit_error", code="queue_full")
    if isinstance(e, EngineClosedError):
        return ApiError(503, str(e), type="server_error", code="unavailable")
    if isinstance(e, CompileLimitError):
        return ApiError(422, str(e), param="response_format", code="compile_limit",
                        keyword=getattr(e, "keyword", None), pointer=getattr(e, "pointer", None))
    if isinstance(e, SchemaError):
        code = "unsupported_keyword" if type(e).__name__ == "UnsupportedFeatureError" else "invalid_schema"
        return ApiError(400, str(e), param="response_format.json_schema.schema", code=code,
                        keyword=e.keyword, pointer=e.pointer)
    if isinstance(e, ConfigError):
        return ApiError(400, str(e), param=e.key, code="invalid_value")
    name = type(e).__name__
    codes = {"GrammarError": "invalid_grammar", "GrammarSyntaxError": "invalid_grammar",
             "RegexError": "invalid_regex", "ContextLengthError": "context_length_exceeded",
             "TokenBudgetError": "max_tokens_too_small"}
    param = {"ContextLengthError": "messages", "TokenBudgetError": "max_tokens"}.get(name, "response_format")
    return ApiError(400, str(e), param=param, code=codes.get(name, "invalid_request"))


async def _json_body(request: Request, limit: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes is over the limit of {limit} bytes",
                       code="request_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body is over the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    try:
        data = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return data


def _parse(cls: Any, data: dict[str, Any]) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise ApiError(400, f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")), param=loc or None,
                       code="invalid_value") from None


def _usage(handle: RequestHandle, results: list[ChoiceResult]) -> dict[str, Any]:
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


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def _chat_message(handle: RequestHandle, r: ChoiceResult) -> dict[str, Any]:
    """``{"message", "finish_reason"}`` of a chat choice: with tools, a complete output split
    into its free text and its validated calls (``finish_reason`` ``"tool_calls"`` when it
    has any)."""
    plan = handle.plan
    if plan is None or not r.complete:
        return {"message": {"role": "assistant", "content": r.text}, "finish_reason": r.finish_reason}
    thought, text, calls, _errors = plan.split(r.text)  # constrained calls parse and validate
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if plan.reasoning:
        message["reasoning_content"] = thought
    if calls:
        message["tool_calls"] = [c.openai() for c in calls]
    return {"message": message, "finish_reason": "tool_calls" if calls else r.finish_reason}


async def _stream(handle: RequestHandle, *, chat: bool, rid: str, model: str,
                  include_usage: bool) -> AsyncIterator[str]:
    """OpenAI server-sent events: chunks as text is committed, a finish chunk per choice,
    optionally a usage chunk, then ``[DONE]``."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    head = {"id": rid, "object": obj, "created": int(handle.created), "model": model}
    results: list[ChoiceResult] = []

    def choice(index: int, text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}

    # with tools or reasoning, a choice's reasoning, content and calls stream as the output is
    # read (OutputStream)
    calls_in = {i: OutputStream(handle.plan) for i in range(handle.n)} if handle.plan else {}

    def call_chunks(index: int, events: list[tuple[Any, ...]]) -> Iterator[str]:
        for e in events:
            if e[0] == "content":
                yield _sse({**head, "choices": [choice(index, e[1], None)]})
                continue
            if e[0] == "reasoning":
                yield _sse({**head, "choices": [{"index": index, "delta": {"reasoning_content": e[1]},
                                                 "finish_reason": None, "logprobs": None}]})
                continue
            if e[0] == "call":
                tc = {"index": e[1], "id": e[2], "type": "function",
                      "function": {"name": e[3], "arguments": ""}}
            else:
                tc = {"index": e[1], "function": {"arguments": e[2]}}
            yield _sse({**head, "choices": [{"index": index, "delta": {"tool_calls": [tc]},
                                             "finish_reason": None, "logprobs": None}]})

    try:
        if chat:
            for i in range(handle.n):
                yield _sse({**head, "choices": [choice(i, "", None, first=True)]})
        async for ev in handle.events():
            if ev.kind == "delta":
                if handle.plan is None:
                    yield _sse({**head, "choices": [choice(ev.index, ev.text, None)]})
                else:
                    for chunk in call_chunks(ev.index, calls_in[ev.index].feed(ev.text)):
                        yield chunk
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
                for chunk in call_chunks(ev.index, reader.feed("", final=True)):
                    yield chunk
                if reader.call_ids() and res.complete:
                    finish = "tool_calls"
            yield _sse({**head, "choices": [choice(ev.index, None if chat else "", finish)]})
        if include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(handle, results)})
        yield "data: [DONE]\n\n"
    finally:
        if len(results) < handle.n:
            handle.cancel()  # the client went away (or the response was torn down)


def create_app(engine: Engine, *, model_name: str, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, metrics: Any = None,
               drain_timeout_s: float = 30.0) -> FastAPI:
    """The FastAPI application serving ``engine`` under the model id ``model_name``.

    ``api_key``: required as a bearer token on every route but ``/health`` (None: open).
    ``metrics``: an object with ``to_prometheus()`` (e.g.
    :func:`structgen.tools.metrics.process_metrics`) appended to ``/metrics``. The engine is
    started with the application and closed (draining, at most ``drain_timeout_s``) when it
    shuts down."""

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
                  openapi_url=None)
    app.state.engine = engine

    @app.exception_handler(ApiError)
    async def _on_api_error(_request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body, status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http_error(_request: Request, e: StarletteHTTPException) -> JSONResponse:
        err = ApiError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None)
        return JSONResponse(err.body, status_code=e.status_code)

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Response:
        if api_key and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), api_key.encode()):
                err = ApiError(401, "missing or invalid API key (Authorization: Bearer KEY)",
                               code="invalid_api_key")
                return JSONResponse(err.body, status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.failure is not None:
            return JSONResponse({"status": "failed", "error": str(engine.failure)}, status_code=503)
        return JSONResponse({"status": "ok", "running": engine.running, "queued": engine.queued})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "structgen"}]})

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        text = _engine_metrics(engine)
        if metrics is not None:
            text += metrics.to_prometheus()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def run(request: Request, chat: bool) -> Response:
        data = await _json_body(request, max_body_bytes)
        req = _parse(ChatCompletionRequest if chat else CompletionRequest, data)
        try:
            req.refuse_unsupported()
            er = EngineRequest(constraint_of(req.response_format), max_tokens=req.budget() if chat
                               else req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                               seed=req.seed, stop=req.stops(), n=req.n)
            if chat and req.tools:
                er.tools = req.tools
                er.tool_choice = "auto" if req.tool_choice is None else req.tool_choice
                er.parallel_tool_calls = True if req.parallel_tool_calls is None else req.parallel_tool_calls
            if chat and req.reasoning:
                er.reasoning, er.thinking_budget = True, req.thinking_budget
            if chat:
                er.messages = req.message_dicts()
            else:
                er.prompt = req.prompt_text()
            handle = await engine.submit(er)
        except StructgenError as e:
            raise _api_error(e) from None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        model = req.model or model_name
        if req.stream:
            return StreamingResponse(_stream(handle, chat=chat, rid=rid, model=model,
                                             include_usage=req.include_usage()),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            results = await _collect(handle, request)
        except asyncio.CancelledError:
            return Response(status_code=499)  # nobody reads it: the client is gone
        _raise_on_error(results)
        if chat:
            choices = [{"index": r.index, **_chat_message(handle, r), "logprobs": None} for r in results]
        else:
            choices = [{"index": r.index, "text": r.text, "finish_reason": r.finish_reason,
                        "logprobs": None} for r in results]
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": int(handle.created), "model": model, "choices": choices,
                             "usage": _usage(handle, results), "system_fingerprint": None})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await run(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await run(request, chat=False)

    return app


def _engine_metrics(engine: Engine) -> str:
    """The engine's gauges and counters in the Prometheus text format."""
    c = engine.counters
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, Any]]) -> None:
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
    return "\n".join(lines) + "\n"


def run_server(app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
               graceful_timeout_s: float = 30.0) -> None:
    """Serve ``app`` with uvicorn until SIGINT / SIGTERM; open requests get up to
    ``graceful_timeout_s`` to finish (the engine drains), then the process exits."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=int(graceful_timeout_s), access_log=False)
    uvicorn.Server(config).run()
