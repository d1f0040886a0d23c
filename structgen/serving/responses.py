"""``POST /v1/responses``: OpenAI's Responses API on the same engine as chat completions.

The route is stateless. ``store`` is accepted but nothing is stored (the answer says
``"store": false``), so ``previous_response_id`` and ``conversation`` are refused with a 400:
the client sends the whole conversation in ``input`` every time, earlier output items
included (what the ``openai-agents`` and ``pydantic-ai`` clients do when ``store`` is off or
the server is not OpenAI's).

A request becomes the :class:`~structgen.serving.engine.EngineRequest` a chat request would:

* ``input``: a string (one user message) or a list of items: messages (``role`` ``user``,
  ``system``, ``developer`` or ``assistant``; ``content`` a string or ``input_text`` /
  ``output_text`` parts), ``function_call`` items (grouped into one assistant message's
  ``tool_calls``, together with an assistant message right before them) and
  ``function_call_output`` items (tool messages). ``reasoning`` items are skipped (this server
  writes none; another server's are opaque to it). ``instructions`` is a system message in
  front;
* ``text.format``: ``text``, ``json_object``, ``json_schema`` (flat: ``{"type":
  "json_schema", "name", "schema", "strict"}``), and structgen's ``grammar`` / ``regex``
  extensions (``{"type": "grammar", "grammar": LARK, "start"}``, ``{"type": "regex",
  "regex"}``);
* ``tools``: function tools, flat (``{"type": "function", "name", "description",
  "parameters", "strict"}``; arguments always validate against ``parameters``); any other tool
  type (``web_search``, ``file_search``, ...) is a 400 naming ``tools[i].type``.
  ``tool_choice`` is ``auto`` / ``required`` / ``none`` / ``{"type": "function", "name"}``;
* ``max_output_tokens``, ``temperature``, ``top_p``, ``parallel_tool_calls``, ``stream``, and
  ``seed`` (a structgen extension, as on chat). ``metadata`` and ``user`` are echoed;
  ``reasoning`` (effort, summary) and ``include`` are accepted and ignored, except where they
  ask for what this server cannot give (``message.output_text.logprobs``).

The answer is a ``response`` object whose ``output`` holds an assistant ``message`` item
(``output_text`` content) and/or ``function_call`` items; ``status`` is ``incomplete`` with
``incomplete_details.reason = "max_output_tokens"`` when the output was cut at the budget. No
``reasoning`` item is written: the Responses route never asks the model to think first.
``usage`` has OpenAI's fields plus the ``structgen`` extension of chat completions.

With ``stream: true`` the answer is server-sent events, each an ``event: <type>`` line and a
``data:`` line holding the event with its ``sequence_number``: ``response.created``,
``response.in_progress``, then per output item ``response.output_item.added``, for a message
``response.content_part.added``, ``response.output_text.delta`` events,
``response.output_text.done``, ``response.content_part.done``, for a call
``response.function_call_arguments.delta`` events and ``.done``, then
``response.output_item.done``; last ``response.completed`` (or ``response.incomplete``) with the
whole response. A generation error is an ``error`` event and ``response.failed``. A client
that goes away cancels its request, as on the chat route.

:mod:`structgen.serving.app` registers the route (:func:`add_responses_route`) and lends it
its HTTP helpers (:class:`RouteSupport`): the app imports this module, so this module cannot
import the app (the package has no import cycles).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias, TypedDict

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import Field

from structgen.calls.plan import OutputStream
from structgen.config import MAX_COUNT
from structgen.errors import ConfigError, RequestCancelledError, StructgenError
from structgen.json_types import JsonObject
from structgen.serving.api_errors import ApiError, SafeJSONResponse
from structgen.serving.engine import Engine
from structgen.serving.protocol import (
    ChatMessage,
    ResponseFormat,
    _Model,
    constraint_of,
    speculative_usage,
)
from structgen.serving.submission import ChoiceResult, EngineRequest, RequestHandle

__all__ = ["ResponsesRequest", "RouteSupport", "TextFormat", "add_responses_route"]

_log = logging.getLogger("uvicorn.error")  # where the chat routes report unexpected errors

#: Request fields this route refuses when they ask for something (value -> neutral test).
_UNSUPPORTED: dict[str, Callable[[object], bool]] = {
    "background": lambda v: v in (None, False),
    "prompt": lambda v: v is None,
    "top_logprobs": lambda v: v in (None, 0),
    "max_tool_calls": lambda v: v is None,
    "truncation": lambda v: v in (None, "disabled"),
}

#: The roles an input message may have (a tool's answer is a ``function_call_output`` item).
_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
#: Content part types whose ``text`` is read; others (images, files, audio) are refused.
_TEXT_PARTS = ("input_text", "output_text", "text")

#: The ``param`` of an error of the shared chat machinery -> this route's name for that field.
_PARAM_NAMES = {
    "messages": "input",
    "prompt": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "response_format.json_schema": "text.format.schema",
    "response_format.json_schema.schema": "text.format.schema",
    "response_format.grammar": "text.format.grammar",
    "response_format.regex": "text.format.regex",
}


class TextFormat(_Model):
    """``text.format``: ``type`` ``text``, ``json_object`` or ``json_schema`` (with ``name``,
    ``schema``, ``strict``: flat, unlike chat's ``response_format.json_schema``), or structgen's
    ``grammar`` (Lark text, ``start`` rule) and ``regex``."""

    type: Literal["text", "json_object", "json_schema", "grammar", "regex"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, object] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None
    grammar: str | None = None
    start: str = "start"
    regex: str | None = None

    def response_format(self) -> ResponseFormat:
        """The chat ``response_format`` that asks for the same output."""
        fields: dict[str, object] = {"type": self.type, "grammar": self.grammar, "start": self.start,
                                  "regex": self.regex}
        if self.type == "json_schema":
            if self.schema_ is None:
                raise ConfigError("text.format: type json_schema needs a schema", key="text.format.schema")
            fields["json_schema"] = {"name": self.name or "output", "description": self.description,
                                     "schema": self.schema_, "strict": self.strict}
        return ResponseFormat.model_validate(fields)


class TextConfig(_Model):
    """``text``: ``format`` (:class:`TextFormat`); ``verbosity`` is accepted and ignored."""

    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(_Model):
    """``POST /v1/responses`` (see the module's text for what each field does here)."""

    model: str | None = None
    input: str | list[dict[str, object]]
    instructions: str | None = None
    text: TextConfig | None = None
    tools: list[dict[str, object]] | None = None
    tool_choice: str | dict[str, object] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, object] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: dict[str, object] | None = None
    include: list[str] | None = None

    def refuse_unsupported(self) -> None:
        """A 400 (ConfigError naming the field) for what this stateless server cannot do."""
        for name in ("previous_response_id", "conversation"):
            if getattr(self, name) is not None:
                raise ConfigError(f"{name}: structgen serve is stateless and stores no responses or "
                                  "conversations; send the whole conversation in input instead (earlier "
                                  "output items included)", key=name)
        extra = self.model_extra or {}
        for name, neutral in _UNSUPPORTED.items():
            if name in extra and not neutral(extra[name]):
                raise ConfigError(f"{name}: not supported by structgen serve", key=name)
        if "message.output_text.logprobs" in (self.include or []):
            raise ConfigError("include: message.output_text.logprobs is not supported by structgen serve",
                              key="include")

    def function_tools(self) -> list[dict[str, object]] | None:
        """``tools`` as chat function specs (``{"type": "function", "function": {...}}``);
        a tool of another type is refused, naming ``tools[i].type``."""
        if not self.tools:
            return None
        out: list[dict[str, object]] = []
        for i, tool in enumerate(self.tools):
            kind = tool.get("type")
            if kind != "function":
                raise ConfigError(f"tools[{i}].type: {kind!r} tools are not supported by structgen serve; "
                                  "give function tools", key=f"tools[{i}].type")
            if "function" in tool:  # chat's nested shape: taken as it is
                out.append(tool)
                continue
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                raise ConfigError(f"tools[{i}].name: a function tool needs a name", key=f"tools[{i}].name")
            spec = {"name": tool["name"], "description": tool.get("description") or "",
                    "parameters": tool.get("parameters")}
            out.append({"type": "function", "function": spec})
        return out

    def engine_tool_choice(self) -> str | dict[str, object]:
        """``tool_choice`` as the engine takes it (``{"type": "function", "name"}`` is already
        one of its forms); other choice types (built-in tools, ``allowed_tools``) are refused."""
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") != "function":
            raise ConfigError(f"tool_choice.type: {choice.get('type')!r} is not supported by structgen "
                              "serve; give auto, required, none or {\"type\": \"function\", \"name\": ...}",
                              key="tool_choice.type")
        if not self.tools and choice not in (None, "none", "auto"):
            raise ConfigError("tool_choice: needs tools", key="tool_choice")
        return "auto" if choice is None else choice

    def message_dicts(self) -> list[dict[str, object]]:
        """``instructions`` and ``input`` as chat messages for the chat template (through
        :meth:`ChatMessage.template_dict`, as on the chat route)."""
        messages: list[dict[str, object]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        items: list[dict[str, object]] = (
            [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input)
        if not items:
            raise ConfigError("input: give a string or at least one item", key="input")
        call_names: dict[str, str] = {}  # call_id -> function name, for the tool messages
        for i, item in enumerate(items):
            kind = item.get("type", "message")
            where = f"input[{i}]"
            if kind == "message":
                role = item.get("role")
                if role not in _MESSAGE_ROLES:
                    raise ConfigError(f"{where}.role: give one of {', '.join(_MESSAGE_ROLES)} (a tool's "
                                      "answer is a function_call_output item)", key=f"{where}.role")
                content = _item_text(item.get("content"), f"{where}.content")
                messages.append({"role": role, "content": content})
            elif kind == "function_call":
                call = _tool_call(item, where)
                call_names[call["id"]] = call["function"]["name"]
                last = messages[-1] if messages else None
                # one assistant turn: its text and the calls that follow it, as chat writes it
                calls = last.get("tool_calls") if last is not None and last["role"] == "assistant" else None
                if isinstance(calls, list):
                    calls.append(call)
                elif last is not None and last["role"] == "assistant":
                    last["tool_calls"] = [call]
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                call_id = item.get("call_id")
                if not isinstance(call_id, str):
                    raise ConfigError(f"{where}.call_id: give the call_id of the function_call answered",
                                      key=f"{where}.call_id")
                message: dict[str, object] = {"role": "tool", "tool_call_id": call_id,
                           "content": _item_text(item.get("output"), f"{where}.output")}
                if call_id in call_names:
                    message["name"] = call_names[call_id]
                messages.append(message)
            elif kind == "reasoning":
                continue  # never written by this server; another server's is opaque here
            else:
                hint = " (this server is stateless: send the item itself)" if kind == "item_reference" else ""
                raise ConfigError(f"{where}.type: {kind!r} items are not supported by structgen serve{hint}",
                                  key=f"{where}.type")
        if not any(m["role"] != "system" for m in messages):
            raise ConfigError("input: no message to answer", key="input")
        return [ChatMessage.model_validate(m).template_dict(k) for k, m in enumerate(messages)]


def _item_text(content: object, where: str) -> str:
    """The text of a message's ``content`` or a call output's ``output``: a string, or a list
    of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ConfigError(f"{where}: give a string or a list of input_text parts", key=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):  # an earlier answer's refusal
            out.append(part["refusal"])
        elif kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        else:
            raise ConfigError(f"{where}[{j}].type: {kind!r} content is not supported by structgen serve; "
                              "only text parts are", key=f"{where}[{j}].type")
    return "".join(out)


class _Function(TypedDict):
    name: str
    arguments: str


class _ToolCallEntry(TypedDict):
    """A chat ``tool_calls`` entry."""

    id: str
    type: str
    function: _Function


def _text_field(item: dict[str, object], name: str, where: str) -> str:
    """``item[name]``, which a function_call item must have as a string."""
    value = item.get(name)
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{name}: a function_call item needs {name} (a string)",
                          key=f"{where}.{name}")
    return value


def _tool_call(item: dict[str, object], where: str) -> _ToolCallEntry:
    """A ``function_call`` input item as a chat ``tool_calls`` entry."""
    call_id, name, arguments = (_text_field(item, k, where) for k in ("call_id", "name", "arguments"))
    try:
        json.loads(arguments or "{}")
    except ValueError as e:
        raise ConfigError(f"{where}.arguments: not JSON ({e})", key=f"{where}.arguments") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass
class RouteSupport:
    """What :func:`structgen.serving.app.create_app` lends this route (the app imports this
    module, so this module cannot import the app):

    ``require_json(request)``: a 415 unless the body is JSON, ``read_body(request)``: the
    request's JSON object (checked: size, deadline, hostile input), ``parse(model_class,
    data)``: the body as a request model (a 400 naming the first bad field),
    ``api_error(structgen_error)``: the HTTP error for a typed structgen error,
    ``error``: the app's error class (``error(status, message, type=, code=)``; the app answers
    it as an OpenAI error object), ``client_gone``: what ``read_body`` raises when the client
    drops mid-body, ``collect(handle, request)``: a request's results, raising
    :class:`asyncio.CancelledError` (and cancelling it) if the client goes away,
    ``on_client_gone()``: counts a client that went away."""

    require_json: Callable[[Request], None]
    read_body: Callable[[Request], Awaitable[JsonObject]]
    parse: Callable[[type[ResponsesRequest], JsonObject], ResponsesRequest]
    api_error: Callable[[StructgenError], ApiError]
    error: type[ApiError]
    client_gone: type[Exception]
    collect: Callable[[RequestHandle, Request], Awaitable[list[ChoiceResult]]]
    on_client_gone: Callable[[], None]


def add_responses_route(app: FastAPI, engine: Engine, *, model_name: str, support: RouteSupport) -> None:
    """Serve ``POST /v1/responses`` on ``app`` from ``engine`` under the model id
    ``model_name``."""

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        try:
            return await _answer(request, engine, model_name, support)
        except support.client_gone:
            support.on_client_gone()
            return Response(status_code=499)  # nobody reads it: the client is gone
        except RecursionError:
            # a request too deep for whatever walked it is the client's doing (as on chat)
            raise support.error(400, "the request is nested too deeply to process",
                                code="invalid_request") from None
        except support.error:
            raise
        except Exception:  # noqa: BLE001 - a bug: logged with its traceback, answered in JSON
            _log.exception("request failed")
            raise support.error(500, "internal server error (logged on the server)", type="server_error",
                                code="internal_error") from None


def _renamed(error: ApiError) -> ApiError:
    """An error of the shared chat machinery with its ``param`` named as this route names it
    (``messages`` -> ``input``, ``max_tokens`` -> ``max_output_tokens``, ...)."""
    fields = error.body["error"]
    param = fields.get("param")
    if isinstance(param, str):
        if param.endswith("].function.parameters"):  # flat tools here
            param = param.replace("].function.parameters", "].parameters")
        fields["param"] = _PARAM_NAMES.get(param, param)
    return error


async def _answer(request: Request, engine: Engine, model_name: str, support: RouteSupport) -> Response:
    support.require_json(request)
    data = await support.read_body(request)
    req = support.parse(ResponsesRequest, data)
    try:
        req.refuse_unsupported()
        fmt = req.text.format if req.text is not None else None
        er = EngineRequest(constraint_of(fmt.response_format() if fmt is not None else None),
                           messages=req.message_dicts(), max_tokens=req.max_output_tokens,
                           temperature=req.temperature, top_p=req.top_p, seed=req.seed)
        tool_choice = req.engine_tool_choice()
        tools = req.function_tools()
        if tools:
            er.tools, er.tool_choice = tools, tool_choice
            er.parallel_tool_calls = True if req.parallel_tool_calls is None else req.parallel_tool_calls
        # the client's address names its share of the preparation workers; a client that goes
        # away stops its preparation
        handle = await engine.submit(er, client=request.client.host if request.client else None,
                                     disconnected=request.is_disconnected)
    except RequestCancelledError:
        raise support.client_gone() from None
    except StructgenError as e:
        raise _renamed(support.api_error(e)) from None
    shape = _Shape(req, model=req.model or model_name, created=int(handle.created))
    if req.stream:
        return StreamingResponse(_stream(handle, shape, support.on_client_gone),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        results = await support.collect(handle, request)
    except asyncio.CancelledError:
        raise support.client_gone() from None
    r = results[0]
    if r.reason == "error":
        raise support.error(500, f"generation failed: {r.error}", type="server_error", code="internal_error")
    return SafeJSONResponse(shape.finished(_output(r), handle, r))


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


class _OutputText(TypedDict):
    type: str
    text: str
    annotations: list[object]
    logprobs: list[object]


class _MessageItem(TypedDict):
    """An output item of type ``message``."""

    type: str
    id: str
    status: str
    role: str
    content: list[_OutputText]


class _CallItem(TypedDict):
    """An output item of type ``function_call``."""

    type: str
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


_Item: TypeAlias = "_MessageItem | _CallItem"


class _Where(TypedDict):
    """Where an item is, as its events name it."""

    item_id: str
    output_index: int


def _message_item(text: str, status: str) -> _MessageItem:
    return {"type": "message", "id": _id("msg_"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(call_id: str, name: str, arguments: str, status: str) -> _CallItem:
    return {"type": "function_call", "id": _id("fc_"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _output(r: ChoiceResult) -> list[_Item]:
    """The output items of a finished choice: with tools, a complete output split into its
    free text (a message, if any) and its validated calls, as the chat route splits it."""
    status = "completed" if r.finish_reason != "length" else "incomplete"
    if r.parts is None:
        return [_message_item(r.text, status)]
    _thought, text, calls, _errors = r.parts
    items: list[_Item] = [_message_item(text, status)] if text or not calls else []
    for call in calls:
        items.append(_call_item(call.id, call.name, call.arguments_json(), status))
    return items


def _function_of(tool: dict[str, object]) -> dict[str, object]:
    """The ``function`` of a chat function spec (:meth:`ResponsesRequest.function_tools`)."""
    function = tool.get("function")
    return function if isinstance(function, dict) else {}


class _Shape:
    """The parts of a response object that do not depend on the output (echoes of the
    request), and the whole object once the output is known."""

    def __init__(self, req: ResponsesRequest, *, model: str, created: int) -> None:
        self.created = created
        fmt = req.text.format if req.text is not None else None
        tools = [{"type": "function", "name": f.get("name"), "description": f.get("description") or None,
                  "parameters": f.get("parameters"), "strict": True}
                 for f in map(_function_of, req.function_tools() or [])]
        self.head: dict[str, object] = {
            "id": _id("resp_"), "object": "response", "created_at": created, "status": "in_progress",
            "background": False, "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": model, "output": [],
            "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
            "previous_response_id": None, "reasoning": None, "store": False,  # nothing is stored
            "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_unset=True) if fmt
                     else {"type": "text"}},
            "tool_choice": "auto" if req.tool_choice is None else req.tool_choice, "tools": tools,
            "truncation": "disabled", "usage": None, "user": req.user, "metadata": req.metadata or {}}

    def in_progress(self) -> dict[str, object]:
        """The response before any output."""
        return dict(self.head)

    def finished(self, output: Sequence[_Item], handle: RequestHandle,
                 r: ChoiceResult) -> dict[str, object]:
        """The whole response: ``output``, status, usage."""
        cut = r.finish_reason == "length"
        out_tokens = len(r.tokens)
        usage = {"input_tokens": handle.prompt_tokens, "output_tokens": out_tokens,
                 "total_tokens": handle.prompt_tokens + out_tokens,
                 "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": 0},
                 "structgen": speculative_usage([r])}
        return {**self.head, "status": "incomplete" if cut else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
                "output": output, "usage": usage}

    def failed(self, message: str) -> dict[str, object]:
        """The response of a generation that failed."""
        return {**self.head, "status": "failed", "error": {"code": "server_error", "message": message}}


class _EventWriter:
    """The Responses stream events of one output, numbered as they are written, and the
    output items they build (the items of the final response)."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[_Item] = []
        self.message: _MessageItem | None = None  # the message item being written
        self.call: _CallItem | None = None     # the function_call item being written
        self.call_items: dict[int, _CallItem] = {}  # the stream's call index -> its item

    def event(self, kind: str, **fields: object) -> str:
        """One server-sent event: ``event: <type>`` and the JSON ``data``."""
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    def _where(self, item: _Item) -> _Where:
        return {"item_id": item["id"], "output_index": self.output.index(item)}

    def _add(self, item: _Item) -> str:
        self.output.append(item)
        return self.event("response.output_item.added", output_index=len(self.output) - 1, item=item)

    def open_message(self) -> Iterator[str]:
        """Open a message item (after a call: the call is done)."""
        yield from self.close_call("completed")
        self.message = item = _message_item("", "in_progress")
        part = item["content"].pop()  # added with its own event
        yield self._add(item)
        item["content"].append(part)
        yield self.event("response.content_part.added", **self._where(item), content_index=0, part=part)

    def text(self, delta: str) -> Iterator[str]:
        """Answer text, into the open message item (opened first if there is none)."""
        if not delta:
            return
        if self.message is None:
            yield from self.open_message()
        assert self.message is not None
        self.message["content"][0]["text"] += delta
        yield self.event("response.output_text.delta", **self._where(self.message), content_index=0,
                         delta=delta, logprobs=[])

    def start_call(self, index: int, call_id: str, name: str) -> Iterator[str]:
        """A new function_call item (the open message or call is done)."""
        yield from self.close_message("completed")
        yield from self.close_call("completed")
        self.call = self.call_items[index] = _call_item(call_id, name, "", "in_progress")
        yield self._add(self.call)

    def arguments(self, index: int, delta: str) -> Iterator[str]:
        """A piece of call ``index``'s arguments."""
        item = self.call_items.get(index)
        if item is None or not delta:
            return
        item["arguments"] += delta
        yield self.event("response.function_call_arguments.delta", **self._where(item), delta=delta)

    def close_message(self, status: str) -> Iterator[str]:
        """Finish the open message item, if any."""
        item, self.message = self.message, None
        if item is None:
            return
        part = item["content"][0]
        where = self._where(item)
        yield self.event("response.output_text.done", **where, content_index=0, text=part["text"],
                         logprobs=[])
        yield self.event("response.content_part.done", **where, content_index=0, part=part)
        item["status"] = status
        yield self.event("response.output_item.done", output_index=where["output_index"], item=item)

    def close_call(self, status: str) -> Iterator[str]:
        """Finish the open function_call item, if any."""
        item, self.call = self.call, None
        if item is None:
            return
        where = self._where(item)
        yield self.event("response.function_call_arguments.done", **where, name=item["name"],
                         arguments=item["arguments"])
        item["status"] = status
        yield self.event("response.output_item.done", output_index=where["output_index"], item=item)

    def close(self, status: str) -> Iterator[str]:
        """Finish every open item; an output with no item gets an empty message (as the
        non-streamed answer has)."""
        if not self.output:
            yield from self.open_message()
        yield from self.close_message(status)
        yield from self.close_call(status)


async def _stream(handle: RequestHandle, shape: _Shape, on_gone: Callable[[], None]) -> AsyncIterator[str]:
    """The request's Responses events (see the module's text); the request is cancelled if
    the stream is torn down (its client went away) before it finished."""
    w = _EventWriter()
    reader = OutputStream(handle.plan) if handle.plan is not None else None
    finished = False

    def events(pieces: Iterable[tuple[object, ...]]) -> Iterator[str]:
        for e in pieces:
            if e[0] == "content":
                yield from w.text(str(e[1]))
            elif e[0] == "call":
                index, call_id, name = e[1:4]
                assert isinstance(index, int) and isinstance(call_id, str) and isinstance(name, str)
                yield from w.start_call(index, call_id, name)
            elif e[0] == "arguments":
                index, delta = e[1:3]
                assert isinstance(index, int) and isinstance(delta, str)
                yield from w.arguments(index, delta)
            # ("reasoning", ...) never comes: this route does not ask for reasoning

    try:
        yield w.event("response.created", response=shape.in_progress())
        yield w.event("response.in_progress", response=shape.in_progress())
        async for ev in handle.events():
            if ev.kind == "delta":
                if reader is None:
                    for chunk in w.text(ev.text):
                        yield chunk
                else:
                    for chunk in events(reader.feed(ev.text)):
                        yield chunk
                continue
            r = ev.result
            assert r is not None
            finished = True
            if r.reason == "error":
                message = f"generation failed: {r.error}"
                yield w.event("error", code="server_error", message=message, param=None)
                yield w.event("response.failed", response=shape.failed(message))
                return
            if reader is not None:
                for chunk in events(reader.feed("", final=True)):
                    yield chunk
            status = "incomplete" if r.finish_reason == "length" else "completed"
            for chunk in w.close(status):
                yield chunk
            kind = "response.incomplete" if status == "incomplete" else "response.completed"
            yield w.event(kind, response=shape.finished(w.output, handle, r))
    finally:
        if not finished:
            handle.cancel()  # the client went away (or the response was torn down)
            on_gone()

