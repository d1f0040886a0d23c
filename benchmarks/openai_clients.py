"""The OpenAI client libraries against ``structgen serve`` (issue 39): about 50 scenarios with
openai, instructor, langchain-openai, pydantic-ai, litellm and openai-agents, each library used
as its documentation shows, unchanged.

    python -m benchmarks.openai_clients                 # the default model (CPU), about 10-20 min
    python -m benchmarks.openai_clients --smoke         # a tiny random model, under two minutes
    python -m benchmarks.openai_clients --only openai,litellm

The script starts ``python -m structgen serve`` itself (``--model``, default the package's
default model, on 127.0.0.1 at a free port, with an API key) and puts a recording proxy in
front of it: every library talks to the proxy, which forwards each request and notes the
status code of each answer, so that the count of 5xx covers every request any library sent,
retries included (the libraries are also told not to retry). Each scenario records

* the status codes its requests got;
* an exception raised inside the library: its type and message, classed ``model`` when it is
  the library's verdict on what the model wrote (an agent that kept calling tools past its turn
  limit, an output that failed the library's validation after its retries) and ``protocol``
  otherwise (the library could not read the server's answer, or the server refused);
* its checks, each true or false: what the library handed back (a Pydantic object, JSON that
  ``jsonschema`` validates, tool calls whose arguments validate against their tool), and the
  issue's specific checks:

  - the tool round trip answers from the tool's result: ``get_weather`` returns
    "-7 C and snowing" and the final answer mentions -7 or snow;
  - developer instructions reach the prompt: with a ``developer`` message ``usage.prompt_tokens``
    equals that of the same instruction sent as ``system`` and differs from the prompt without
    it (and whether the model obeyed it, for information);
  - tools + ``response_format`` are accepted (200) and the final answer is valid;
  - ``logprobs`` are returned;
  - ``tool_choice="auto"`` returns ``tool_calls`` on the README's weather example
    ("Weather in Oslo?" with a ``get_weather(city)`` tool);
  - ``max_tokens`` below the shortest valid output gives 200 and ``finish_reason: "length"``.

A scenario passes when its library raised nothing and every check holds. The bars (issue 39):
0 answers with status 5xx; 0 protocol exceptions; each of the specific checks above true.

Writes ``benchmarks/results/openai-clients-<model>-cpu.json`` (the shared envelope of
``benchmarks/common/envelope.py``, every scenario) and ``.md`` beside it (per library, the bars, the
failures); ``--smoke`` writes only ``--out`` when given. Exit status 0 (1 when a bar failed and
``--fail`` is given); 2 when the server cannot start.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT
from benchmarks.common.smoke_model import save_smoke_model

KEY = "battery-key"
LIBRARIES = ("openai", "instructor", "langchain", "pydantic_ai", "litellm", "openai_agents")
TOOL_RESULT = "-7 C and snowing"
# headers of the upstream answer the proxy does not copy (it writes its own framing)
HOP_HEADERS = ("transfer-encoding", "connection", "content-length", "server", "date")
# exceptions that are a library's verdict on the model's output, not on the server's protocol
MODEL_EXCEPTIONS = {"MaxTurnsExceeded", "UsageLimitExceeded", "InstructorRetryException",
                    "IncompleteOutputException", "UnexpectedModelBehavior", "ModelBehaviorError",
                    "OutputParserException", "LengthFinishReasonError"}


# ---------------------------------------------------------------------------------------------
# the server and the recording proxy in front of it
# ---------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``python -m structgen serve`` as a subprocess on 127.0.0.1."""

    def __init__(self, model: str, config: Path | None, log: Path, extra: list[str]) -> None:
        self.port = _free_port()
        self.cmd = [sys.executable, "-m", "structgen", "serve", "--model", model, "--host", "127.0.0.1",
                    "--port", str(self.port), "--api-key", KEY, "--log-level", "warning", *extra]
        if config is not None:
            self.cmd += ["--config", str(config)]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 600) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=log, stderr=log, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"structgen serve exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"structgen serve not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM (the server drains), then SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


class Proxy:
    """A forwarding HTTP proxy on 127.0.0.1 that records the status of every answer (and
    streams answers through as they come: server-sent events stay live)."""

    def __init__(self, upstream_port: int) -> None:
        self.statuses: list[int] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "accept-encoding", "content-length")}
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=900)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                except OSError as e:
                    proxy.note(599)  # no answer at all: counted with the 5xx
                    self.send_error(502, f"upstream: {e}")
                    return
                proxy.note(resp.status)
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_HEADERS:
                        self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                conn.close()

            do_GET = do_POST = _forward  # noqa: N815 - http.server's names

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # a library that closes its connection early (a cancelled stream) is not news
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def note(self, status: int) -> None:
        with self.lock:
            self.statuses.append(status)

    def mark(self) -> int:
        with self.lock:
            return len(self.statuses)

    def since(self, mark: int) -> list[int]:
        with self.lock:
            return self.statuses[mark:]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------------------------------
# what the scenarios ask for
# ---------------------------------------------------------------------------------------------
def _models() -> dict[str, Any]:
    """The Pydantic models of the scenarios (built here: pydantic is imported late)."""
    from pydantic import BaseModel, Field

    class Ticket(BaseModel):
        """A support ticket."""

        status: Literal["open", "closed", "pending"]
        priority: int = Field(ge=1, le=5)
        summary: str = Field(max_length=60)

    class Weather(BaseModel):
        """A weather report."""

        city: str = Field(max_length=30)
        temperature_c: int = Field(ge=-60, le=60)
        conditions: str = Field(max_length=40)

    class Person(BaseModel):
        """A person."""

        name: str = Field(max_length=30)
        age: int = Field(ge=0, le=120)

    return {"Ticket": Ticket, "Weather": Weather, "Person": Person}


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"], "additionalProperties": False}}}
TICKET_TEXT = "Ticket: the login page is down for every user since 9am. It is still open and urgent."
PERSON_TEXT = "Ada Lovelace was 36 years old when she died."


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return TOOL_RESULT


def _mentions_tool_result(text: str | None) -> bool:
    text = (text or "").lower()
    return "-7" in text or "snow" in text or "minus 7" in text


@dataclass
class Context:
    """What a scenario gets: the proxy's base URL, the model name, the Pydantic models and
    the token limits of this run."""

    base: str
    model: str
    models: dict[str, Any]
    max_tokens: int
    smoke: bool

    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on this run's one event loop (async clients the libraries cache
        outlive a scenario; a loop per scenario would be closed under them)."""
        return self.loop.run_until_complete(coroutine)

    def openai(self) -> Any:
        import openai

        return openai.OpenAI(base_url=self.base, api_key=KEY, max_retries=0, timeout=600)

    def async_openai(self) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=self.base, api_key=KEY, max_retries=0, timeout=600)

    def chat(self, messages: list[dict[str, Any]], **kw: Any) -> Any:
        kw.setdefault("max_tokens", self.max_tokens)
        return self.openai().chat.completions.create(model=self.model, messages=messages, **kw)


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _schema_format(model: Any) -> dict[str, Any]:
    schema = model.model_json_schema()
    return {"type": "json_schema", "json_schema": {"name": model.__name__, "schema": schema, "strict": True}}


def _valid(model: Any, text: str | None) -> bool:
    try:
        model.model_validate_json(text or "")
    except Exception:  # noqa: BLE001 - pydantic's ValidationError
        return False
    return True


# ---------------------------------------------------------------------------------------------
# the scenarios: each returns its checks {name: bool}; an exception is the library's
# ---------------------------------------------------------------------------------------------
Checks = dict[str, Any]
SCENARIOS: list[tuple[str, str, Callable[[Context], Checks]]] = []


def scenario(library: str, name: str) -> Callable[[Callable[[Context], Checks]], Callable[[Context], Checks]]:
    """Register a scenario of ``library`` under ``name``."""

    def register(fn: Callable[[Context], Checks]) -> Callable[[Context], Checks]:
        SCENARIOS.append((library, name, fn))
        return fn

    return register


# -- openai -------------------------------------------------------------------------------------
@scenario("openai", "chat")
def _openai_chat(c: Context) -> Checks:
    r = c.chat(_user("Say hello in one short sentence."))
    return {"content": isinstance(r.choices[0].message.content, str), "usage": r.usage.completion_tokens > 0}


@scenario("openai", "chat_stream_usage")
def _openai_stream(c: Context) -> Checks:
    chunks = list(c.chat(_user("Count to five."), stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    return {"text": bool(text), "finish_reason": finish in (["stop"], ["length"]),
            "usage_chunk": chunks[-1].usage is not None}


@scenario("openai", "parse_pydantic")
def _openai_parse(c: Context) -> Checks:
    Ticket = c.models["Ticket"]
    r = c.openai().chat.completions.parse(model=c.model, messages=_user(TICKET_TEXT), response_format=Ticket)
    return {"parsed": isinstance(r.choices[0].message.parsed, Ticket)}


@scenario("openai", "json_object")
def _openai_json_object(c: Context) -> Checks:
    r = c.chat(_user(PERSON_TEXT + " Answer in JSON."), response_format={"type": "json_object"})
    try:
        ok = isinstance(json.loads(r.choices[0].message.content), dict)
    except ValueError:
        ok = False
    return {"json_object": ok or r.choices[0].finish_reason == "length"}


@scenario("openai", "json_schema_stream")
def _openai_schema_stream(c: Context) -> Checks:
    Person = c.models["Person"]
    chunks = list(c.chat(_user(PERSON_TEXT), response_format=_schema_format(Person), stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return {"valid": _valid(Person, text)}


@scenario("openai", "tools_required")
def _openai_tools_required(c: Context) -> Checks:
    r = c.chat(_user("Weather in Oslo?"), tools=[WEATHER_TOOL], tool_choice="required")
    calls = r.choices[0].message.tool_calls or []
    return {"tool_calls": bool(calls) and calls[0].function.name == "get_weather",
            "arguments_json": all(isinstance(json.loads(x.function.arguments), dict) for x in calls),
            "finish_reason": r.choices[0].finish_reason == "tool_calls"}


@scenario("openai", "tools_named")
def _openai_tools_named(c: Context) -> Checks:
    r = c.chat(_user("Weather in Paris?"), tools=[WEATHER_TOOL],
               tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = r.choices[0].message.tool_calls or []
    return {"tool_calls": [x.function.name for x in calls] == ["get_weather"]}


@scenario("openai", "tools_auto_weather")
def _openai_tools_auto(c: Context) -> Checks:
    """The README's weather example: tool_choice auto must return tool_calls."""
    r = c.chat(_user("Weather in Oslo?"), tools=[WEATHER_TOOL], tool_choice="auto")
    calls = r.choices[0].message.tool_calls or []
    return {"auto_tool_calls": bool(calls) and calls[0].function.name == "get_weather"}


@scenario("openai", "tools_no_parallel")
def _openai_tools_no_parallel(c: Context) -> Checks:
    r = c.chat(_user("Weather in Oslo and in Lima?"), tools=[WEATHER_TOOL], tool_choice="required",
               parallel_tool_calls=False)
    return {"one_call": len(r.choices[0].message.tool_calls or []) == 1}


def _round_trip(c: Context, **final_kw: Any) -> tuple[Any, Any]:
    """get_weather called, its result sent back, the final answer: (first, final) responses."""
    messages: list[dict[str, Any]] = _user("What is the weather in Oslo right now?")
    first = c.chat(messages, tools=[WEATHER_TOOL], tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": call.id, "type": "function",
                      "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                 {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]
    final = c.chat(messages, tools=[WEATHER_TOOL], **final_kw)
    return first, final


@scenario("openai", "tool_round_trip")
def _openai_round_trip(c: Context) -> Checks:
    _first, final = _round_trip(c, tool_choice="none")
    return {"answers_from_tool_result": _mentions_tool_result(final.choices[0].message.content)}


@scenario("openai", "tools_and_response_format")
def _openai_tools_and_format(c: Context) -> Checks:
    Weather = c.models["Weather"]
    _first, final = _round_trip(c, tool_choice="auto", response_format=_schema_format(Weather))
    msg = final.choices[0].message
    return {"accepted": True, "final_answer_valid": bool(msg.tool_calls) or _valid(Weather, msg.content)}


@scenario("openai", "developer_instructions")
def _openai_developer(c: Context) -> Checks:
    # the oracle is the same instruction sent as a system message: OpenAI treats developer as
    # system, so the prompt must be the same length, and differ from the prompt without it (not
    # necessarily longer: Qwen's template drops its default system text when one is given)
    question = _user("What fruit do you like?")
    rule = "Always answer with exactly one word: PINEAPPLE."
    plain = c.chat(question, max_tokens=8)
    told = c.chat([{"role": "developer", "content": rule}, *question], max_tokens=8)
    as_system = c.chat([{"role": "system", "content": rule}, *question], max_tokens=8)
    return {"reaches_prompt": told.usage.prompt_tokens == as_system.usage.prompt_tokens
            != plain.usage.prompt_tokens,
            "obeyed (information)": "pineapple" in (told.choices[0].message.content or "").lower()}


@scenario("openai", "system_instructions")
def _openai_system(c: Context) -> Checks:
    question = _user("What fruit do you like?")
    plain = c.chat(question, max_tokens=8)
    told = c.chat([{"role": "system", "content": "Always answer with one word: PINEAPPLE."}, *question],
                  max_tokens=8)
    return {"reaches_prompt": told.usage.prompt_tokens != plain.usage.prompt_tokens,
            "obeyed (information)": "pineapple" in (told.choices[0].message.content or "").lower()}


@scenario("openai", "logprobs")
def _openai_logprobs(c: Context) -> Checks:
    r = c.chat(_user("Say hi."), max_tokens=8, logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs
    content = lp.content if lp is not None else None
    return {"logprobs_returned": bool(content) and all(t.logprob <= 0 for t in content)}


@scenario("openai", "max_tokens_too_small")
def _openai_small_budget(c: Context) -> Checks:
    r = c.chat(_user(TICKET_TEXT), response_format=_schema_format(c.models["Ticket"]), max_tokens=3)
    return {"status_200_length": r.choices[0].finish_reason == "length"}


@scenario("openai", "max_completion_tokens")
def _openai_max_completion(c: Context) -> Checks:
    r = c.openai().chat.completions.create(model=c.model, messages=_user("Tell me a long story."),
                                           max_completion_tokens=5)
    return {"limit_kept": r.usage.completion_tokens <= 5}


@scenario("openai", "n_and_seed")
def _openai_n_seed(c: Context) -> Checks:
    a = c.chat(_user("Pick a colour."), n=2, seed=7, temperature=0.8, max_tokens=8)
    b = c.chat(_user("Pick a colour."), n=2, seed=7, temperature=0.8, max_tokens=8)
    texts = [x.message.content for x in a.choices]
    return {"two_choices": len(texts) == 2, "seeded": texts == [x.message.content for x in b.choices]}


@scenario("openai", "stop")
def _openai_stop(c: Context) -> Checks:
    r = c.chat(_user("Count: 1, 2, 3, 4, 5, 6"), stop=["4"], max_tokens=24)
    return {"stop_not_in_text": "4" not in (r.choices[0].message.content or "")}


@scenario("openai", "legacy_completions")
def _openai_completions(c: Context) -> Checks:
    r = c.openai().completions.create(model=c.model, prompt="The capital of France is", max_tokens=6)
    return {"text": isinstance(r.choices[0].text, str)}


@scenario("openai", "responses_api")
def _openai_responses(c: Context) -> Checks:
    r = c.openai().responses.create(model=c.model, input="Say hello.", max_output_tokens=c.max_tokens)
    return {"output_text": isinstance(r.output_text, str)}


@scenario("openai", "async_parallel")
def _openai_async(c: Context) -> Checks:
    Person = c.models["Person"]

    async def run() -> list[Any]:
        client = c.async_openai()
        return await asyncio.gather(*[client.chat.completions.parse(
            model=c.model, messages=_user(PERSON_TEXT), response_format=Person) for _ in range(3)])

    return {"all_parsed": all(isinstance(r.choices[0].message.parsed, Person) for r in c.run(run()))}


# -- instructor ---------------------------------------------------------------------------------
def _instructor(c: Context, mode_name: str) -> Any:
    import instructor

    return instructor.from_openai(c.openai(), mode=getattr(instructor.Mode, mode_name))


for _mode in ("JSON_SCHEMA", "TOOLS", "JSON", "MD_JSON"):
    def _instructor_mode(c: Context, mode: str = _mode) -> Checks:
        Person = c.models["Person"]
        person = _instructor(c, mode).chat.completions.create(
            model=c.model, messages=_user(PERSON_TEXT), response_model=Person, max_retries=1,
            max_tokens=c.max_tokens)
        return {"validated_object": isinstance(person, Person)}

    scenario("instructor", f"mode_{_mode.lower()}")(_instructor_mode)


@scenario("instructor", "partial_stream")
def _instructor_partial(c: Context) -> Checks:
    Ticket = c.models["Ticket"]
    parts = list(_instructor(c, "JSON_SCHEMA").chat.completions.create_partial(
        model=c.model, messages=_user(TICKET_TEXT), response_model=Ticket, max_tokens=c.max_tokens))
    final_valid = bool(parts) and _valid(Ticket, parts[-1].model_dump_json())
    return {"partials": bool(parts), "final_valid": final_valid}


@scenario("instructor", "with_completion")
def _instructor_with_completion(c: Context) -> Checks:
    Ticket = c.models["Ticket"]
    ticket, raw = _instructor(c, "TOOLS").chat.completions.create_with_completion(
        model=c.model, messages=_user(TICKET_TEXT), response_model=Ticket, max_retries=1,
        max_tokens=c.max_tokens)
    return {"validated_object": isinstance(ticket, Ticket), "raw_usage": raw.usage.total_tokens > 0}


@scenario("instructor", "async_json_schema")
def _instructor_async(c: Context) -> Checks:
    import instructor

    Person = c.models["Person"]
    client = instructor.from_openai(c.async_openai(), mode=instructor.Mode.JSON_SCHEMA)
    person = c.run(client.chat.completions.create(model=c.model, messages=_user(PERSON_TEXT),
                                                        response_model=Person, max_retries=1,
                                                        max_tokens=c.max_tokens))
    return {"validated_object": isinstance(person, Person)}


# -- langchain-openai ---------------------------------------------------------------------------
def _langchain(c: Context, **kw: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=c.base, api_key=KEY, model=c.model, max_retries=0, timeout=600,
                      max_tokens=c.max_tokens, **kw)


@scenario("langchain", "invoke")
def _lc_invoke(c: Context) -> Checks:
    return {"content": isinstance(_langchain(c).invoke("Say hello.").content, str)}


@scenario("langchain", "stream")
def _lc_stream(c: Context) -> Checks:
    return {"chunks": len(list(_langchain(c).stream("Count to three."))) > 0}


for _method in ("json_schema", "function_calling", "json_mode"):
    def _lc_structured(c: Context, method: str = _method) -> Checks:
        Person = c.models["Person"]
        prompt = PERSON_TEXT + (" Answer in JSON with keys name and age." if method == "json_mode" else "")
        out = _langchain(c).with_structured_output(Person, method=method).invoke(prompt)
        return {"validated_object": isinstance(out, Person)}

    scenario("langchain", f"structured_{_method}")(_lc_structured)


@scenario("langchain", "structured_stream")
def _lc_structured_stream(c: Context) -> Checks:
    Ticket = c.models["Ticket"]
    parts = list(_langchain(c).with_structured_output(Ticket, method="json_schema").stream(TICKET_TEXT))
    return {"final_valid": bool(parts) and isinstance(parts[-1], Ticket)}


@scenario("langchain", "bind_tools_round_trip")
def _lc_round_trip(c: Context) -> Checks:
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = _langchain(c)
    messages: list[Any] = [HumanMessage("What is the weather in Oslo right now?")]
    ai = llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather").invoke(messages)
    call = ai.tool_calls[0]
    messages += [ai, ToolMessage(TOOL_RESULT, tool_call_id=call["id"])]
    final = llm.bind_tools([WEATHER_TOOL], tool_choice="none").invoke(messages)
    return {"tool_call": call["name"] == "get_weather",
            "answers_from_tool_result": _mentions_tool_result(final.content)}


@scenario("langchain", "bind_tools_any")
def _lc_any(c: Context) -> Checks:
    ai = _langchain(c).bind_tools([get_weather], tool_choice="any").invoke("Weather in Oslo?")
    return {"tool_call": [x["name"] for x in ai.tool_calls] == ["get_weather"]}


@scenario("langchain", "batch")
def _lc_batch(c: Context) -> Checks:
    outs = _langchain(c).batch(["Say one.", "Say two.", "Say three."])
    return {"three_answers": len(outs) == 3 and all(isinstance(o.content, str) for o in outs)}


# -- pydantic-ai --------------------------------------------------------------------------------
def _pydantic_ai_model(c: Context) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(c.model, provider=OpenAIProvider(base_url=c.base, api_key=KEY))


def _agent_settings(c: Context) -> dict[str, Any]:
    return {"max_tokens": c.max_tokens}


@scenario("pydantic_ai", "text_output")
def _pai_text(c: Context) -> Checks:
    from pydantic_ai import Agent

    out = Agent(_pydantic_ai_model(c), model_settings=_agent_settings(c)).run_sync("Say hello.").output
    return {"text": isinstance(out, str)}


@scenario("pydantic_ai", "native_output")
def _pai_native(c: Context) -> Checks:
    from pydantic_ai import Agent, NativeOutput

    Person = c.models["Person"]
    agent = Agent(_pydantic_ai_model(c), output_type=NativeOutput(Person), model_settings=_agent_settings(c))
    return {"validated_object": isinstance(agent.run_sync(PERSON_TEXT).output, Person)}


@scenario("pydantic_ai", "tool_output")
def _pai_tool_output(c: Context) -> Checks:
    from pydantic_ai import Agent

    Ticket = c.models["Ticket"]
    agent = Agent(_pydantic_ai_model(c), output_type=Ticket, model_settings=_agent_settings(c))
    return {"validated_object": isinstance(agent.run_sync(TICKET_TEXT).output, Ticket)}


@scenario("pydantic_ai", "prompted_output")
def _pai_prompted(c: Context) -> Checks:
    from pydantic_ai import Agent, PromptedOutput

    Person = c.models["Person"]
    agent = Agent(_pydantic_ai_model(c), output_type=PromptedOutput(Person),
                  model_settings=_agent_settings(c))
    return {"validated_object": isinstance(agent.run_sync(PERSON_TEXT).output, Person)}


@scenario("pydantic_ai", "tool_round_trip")
def _pai_round_trip(c: Context) -> Checks:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(c), tools=[get_weather], model_settings=_agent_settings(c),
                  instructions="Use get_weather for weather questions, then answer from its result.")
    result = agent.run_sync("What is the weather in Oslo right now?")
    called = any(getattr(p, "tool_name", None) == "get_weather" for m in result.all_messages()
                 for p in getattr(m, "parts", []))
    return {"tool_called": called, "answers_from_tool_result": _mentions_tool_result(result.output)}


@scenario("pydantic_ai", "run_stream")
def _pai_stream(c: Context) -> Checks:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(c), model_settings=_agent_settings(c))

    async def run() -> list[str]:
        async with agent.run_stream("Count to three.") as result:
            return [t async for t in result.stream_text(delta=True)]

    return {"deltas": isinstance(c.run(run()), list)}


# -- litellm ------------------------------------------------------------------------------------
def _litellm(c: Context, **kw: Any) -> Any:
    import litellm

    return litellm.completion(model=f"openai/{c.model}", api_base=c.base, api_key=KEY, num_retries=0,
                              max_tokens=c.max_tokens, **kw)


@scenario("litellm", "completion")
def _ll_plain(c: Context) -> Checks:
    return {"content": isinstance(_litellm(c, messages=_user("Say hello.")).choices[0].message.content, str)}


@scenario("litellm", "stream")
def _ll_stream(c: Context) -> Checks:
    chunks = list(_litellm(c, messages=_user("Count to three."), stream=True))
    return {"chunks": bool(chunks)}


@scenario("litellm", "response_format_pydantic")
def _ll_pydantic(c: Context) -> Checks:
    Person = c.models["Person"]
    r = _litellm(c, messages=_user(PERSON_TEXT), response_format=Person)
    return {"valid": _valid(Person, r.choices[0].message.content)}


@scenario("litellm", "response_format_dict")
def _ll_dict(c: Context) -> Checks:
    Ticket = c.models["Ticket"]
    r = _litellm(c, messages=_user(TICKET_TEXT), response_format=_schema_format(Ticket))
    return {"valid": _valid(Ticket, r.choices[0].message.content)}


@scenario("litellm", "tools_required")
def _ll_tools(c: Context) -> Checks:
    r = _litellm(c, messages=_user("Weather in Oslo?"), tools=[WEATHER_TOOL], tool_choice="required")
    calls = r.choices[0].message.tool_calls or []
    return {"tool_calls": bool(calls) and calls[0].function.name == "get_weather"}


@scenario("litellm", "tool_round_trip")
def _ll_round_trip(c: Context) -> Checks:
    messages: list[dict[str, Any]] = _user("What is the weather in Oslo right now?")
    first = _litellm(c, messages=messages, tools=[WEATHER_TOOL], tool_choice="required")
    msg = first.choices[0].message
    call = msg.tool_calls[0]
    messages += [msg.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]
    final = _litellm(c, messages=messages, tools=[WEATHER_TOOL], tool_choice="none")
    return {"answers_from_tool_result": _mentions_tool_result(final.choices[0].message.content)}


@scenario("litellm", "acompletion")
def _ll_async(c: Context) -> Checks:
    import litellm

    r = c.run(litellm.acompletion(model=f"openai/{c.model}", api_base=c.base, api_key=KEY, num_retries=0,
                                        max_tokens=c.max_tokens, messages=_user("Say hello.")))
    return {"content": isinstance(r.choices[0].message.content, str)}


# -- openai-agents ------------------------------------------------------------------------------
def _agents_model(c: Context) -> Any:
    import agents

    agents.set_tracing_disabled(True)
    return agents.OpenAIChatCompletionsModel(model=c.model, openai_client=c.async_openai())


def _agent(c: Context, **kw: Any) -> Any:
    import agents

    kw.setdefault("model_settings", agents.ModelSettings(max_tokens=c.max_tokens))
    return agents.Agent(name="assistant", model=_agents_model(c), **kw)


def _run_agent(c: Context, agent: Any, prompt: str) -> Any:
    import agents

    return c.run(agents.Runner.run(agent, prompt, max_turns=4))


@scenario("openai_agents", "text_output")
def _oa_text(c: Context) -> Checks:
    result = _run_agent(c, _agent(c, instructions="Be brief."), "Say hello.")
    return {"text": isinstance(result.final_output, str)}


@scenario("openai_agents", "output_type")
def _oa_output_type(c: Context) -> Checks:
    Person = c.models["Person"]
    agent = _agent(c, instructions="Extract the person.", output_type=Person)
    out = _run_agent(c, agent, PERSON_TEXT).final_output
    return {"validated_object": isinstance(out, Person)}


@scenario("openai_agents", "function_tool_round_trip")
def _oa_round_trip(c: Context) -> Checks:
    import agents

    tool = agents.function_tool(get_weather)
    agent = _agent(c, instructions="Use get_weather for weather questions, then answer from its result.",
                   tools=[tool],
                   model_settings=agents.ModelSettings(max_tokens=c.max_tokens, tool_choice="auto"),
                   tool_use_behavior="run_llm_again")
    result = _run_agent(c, agent, "What is the weather in Oslo right now?")
    called = any(getattr(i, "type", "") == "tool_call_output_item" for i in result.new_items)
    return {"tool_called": called,
            "answers_from_tool_result": _mentions_tool_result(str(result.final_output))}


@scenario("openai_agents", "forced_tool_stops")
def _oa_forced(c: Context) -> Checks:
    import agents

    agent = agents.Agent(name="weather", model=_agents_model(c), tools=[agents.function_tool(get_weather)],
                         model_settings=agents.ModelSettings(max_tokens=c.max_tokens, tool_choice="required"),
                         tool_use_behavior="stop_on_first_tool")
    return {"tool_result_is_output": _run_agent(c, agent, "Weather in Oslo?").final_output == TOOL_RESULT}


@scenario("openai_agents", "streamed")
def _oa_streamed(c: Context) -> Checks:
    import agents

    agent = _agent(c, instructions="Be brief.")

    async def run() -> int:
        result = agents.Runner.run_streamed(agent, "Count to three.", max_turns=2)
        return sum([1 async for _ in result.stream_events()])

    return {"events": c.run(run()) > 0}


@scenario("openai_agents", "responses_model")
def _oa_responses(c: Context) -> Checks:
    import agents

    agents.set_tracing_disabled(True)
    model = agents.OpenAIResponsesModel(model=c.model, openai_client=c.async_openai())
    agent = agents.Agent(name="assistant", model=model, instructions="Be brief.",
                         model_settings=agents.ModelSettings(max_tokens=c.max_tokens))
    return {"text": isinstance(_run_agent(c, agent, "Say hello.").final_output, str)}


# ---------------------------------------------------------------------------------------------
# running and reporting
# ---------------------------------------------------------------------------------------------
# the specific checks: (library, scenario, check) -> the bar's name
BARS = {
    "tool round trip answers from the tool's result": [
        ("openai", "tool_round_trip", "answers_from_tool_result")],
    "developer instructions reach the prompt": [("openai", "developer_instructions", "reaches_prompt")],
    "tools + response_format accepted, final answer valid": [
        ("openai", "tools_and_response_format", "accepted"),
        ("openai", "tools_and_response_format", "final_answer_valid")],
    "logprobs returned": [("openai", "logprobs", "logprobs_returned")],
    "tool_choice=auto returns tool_calls (README weather example)": [
        ("openai", "tools_auto_weather", "auto_tool_calls")],
    "max_tokens too small gives 200 length": [("openai", "max_tokens_too_small", "status_200_length")],
}


@dataclass
class Outcome:
    """One scenario's record."""

    library: str
    name: str
    statuses: list[int] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    exception: dict[str, str] | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.exception is None and all(v for k, v in self.checks.items() if "(information)" not in k)


def run_scenario(ctx: Context, proxy: Proxy, library: str, name: str,
                 fn: Callable[[Context], Checks]) -> Outcome:
    """Run one scenario; an exception is recorded, never raised."""
    out = Outcome(library, name)
    mark = proxy.mark()
    t0 = time.perf_counter()
    try:
        out.checks = {k: bool(v) for k, v in fn(ctx).items()}
    except Exception as e:  # noqa: BLE001 - a library's exception is what this records
        kind = "model" if type(e).__name__ in MODEL_EXCEPTIONS else "protocol"
        out.exception = {"type": f"{type(e).__module__}.{type(e).__name__}", "kind": kind,
                         "message": " ".join(str(e).split())[:600],
                         "where": traceback.format_exc(limit=-3)[-1500:]}
    out.seconds = round(time.perf_counter() - t0, 3)
    time.sleep(0.05)  # the proxy notes a streamed answer's status before its body ends
    out.statuses = proxy.since(mark)
    return out


def _kind(o: Outcome) -> str | None:
    """The kind of a scenario's exception (``protocol`` / ``model``), None without one."""
    return None if o.exception is None else o.exception["kind"]


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    """Per library and overall: scenarios, passed, exceptions by kind, statuses; the bars."""
    by_lib: dict[str, Any] = {}
    for lib in LIBRARIES:
        mine = [o for o in outcomes if o.library == lib]
        if not mine:
            continue
        by_lib[lib] = {"scenarios": len(mine), "passed": sum(o.passed for o in mine),
                       "protocol_exceptions": sum(_kind(o) == "protocol" for o in mine),
                       "model_exceptions": sum(_kind(o) == "model" for o in mine),
                       "statuses": dict(sorted(Counter(str(s) for o in mine for s in o.statuses).items()))}
    statuses = Counter(s for o in outcomes for s in o.statuses)
    index = {(o.library, o.name): o for o in outcomes}
    bars: dict[str, Any] = {
        "no 5xx": {"value": sum(n for s, n in statuses.items() if s >= 500), "met": None},
        "no protocol exception in a library": {
            "value": sum(v["protocol_exceptions"] for v in by_lib.values()), "met": None}}
    for bar in bars.values():
        bar["met"] = bar["value"] == 0
    for bar, parts in BARS.items():
        got = []
        for lib, name, check in parts:
            o = index.get((lib, name))
            got.append(None if o is None else (o.exception is None and bool(o.checks.get(check))))
        bars[bar] = {"value": got, "met": None if None in got else all(got)}
    return {"libraries": by_lib, "scenarios": len(outcomes), "passed": sum(o.passed for o in outcomes),
            "statuses": {str(k): v for k, v in sorted(statuses.items())}, "bars": bars}


def markdown(summary: dict[str, Any], outcomes: list[Outcome], envelope: dict[str, Any], model: str) -> str:
    lines = [f"# OpenAI client libraries against structgen serve ({model}, CPU)", "",
             f"`{' '.join(envelope['command'])}` at `{envelope['commit']}`, {envelope['date']}; "
             f"{envelope['machine']['cpu']}, {envelope['machine']['cores']} cores, load average "
             f"{envelope['machine']['load_average']}. "
             "Method: `benchmarks/README.md` (OpenAI client libraries).",
             "", "| library | scenarios | passed | protocol exceptions | model exceptions | statuses |",
             "|---|---:|---:|---:|---:|---|"]
    for lib, row in summary["libraries"].items():
        lines.append(f"| {lib} | {row['scenarios']} | {row['passed']} | {row['protocol_exceptions']} | "
                     f"{row['model_exceptions']} | {row['statuses']} |")
    lines += ["", "| bar (issue 39) | value | met |", "|---|---|---|"]
    for bar, row in summary["bars"].items():
        lines.append(f"| {bar} | {row['value']} | {row['met']} |")
    failed = [o for o in outcomes if not o.passed]
    if failed:
        lines += ["", "| library | scenario | statuses | failed checks | exception |",
                  "|---|---|---|---|---|"]
        for o in failed:
            bad = ", ".join(k for k, v in o.checks.items() if not v and "(information)" not in k)
            exc = "" if o.exception is None else f"{o.exception['kind']}: {o.exception['type']}: " \
                                                 f"{o.exception['message'][:160]}"
            lines.append(f"| {o.library} | {o.name} | {o.statuses} | {bad} | {exc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny random model; writes only --out")
    ap.add_argument("--out", type=Path, default=None,
                    help="results JSON (default benchmarks/results/openai-clients-<model>-cpu.json, "
                         ".md beside it)")
    ap.add_argument("--model", default=None,
                    help="model alias or folder (default: the package's default model)")
    ap.add_argument("--only", default=None, help=f"comma-separated libraries of {', '.join(LIBRARIES)}")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="max_tokens of each request (default 256; smoke 48)")
    ap.add_argument("--fail", action="store_true", help="exit 1 when a bar is not met")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm fetches no cost map
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    only = set(args.only.split(",")) if args.only else set(LIBRARIES)
    unknown = only - set(LIBRARIES)
    if unknown:
        ap.error(f"--only: unknown libraries {sorted(unknown)}")
    max_tokens = args.max_tokens or (48 if args.smoke else 256)
    from structgen.generation.api import DEFAULT_MODEL

    with tempfile.TemporaryDirectory(prefix="structgen-clients-") as tmp:
        folder = Path(tmp)
        if args.smoke and args.model is None:
            model = str(folder / "tiny")
            save_smoke_model(Path(model))
            label = "tiny"
        else:
            model = args.model or DEFAULT_MODEL
            label = Path(model).name if os.sep in model else model
        config = folder / "serve.yaml"
        config.write_text(f"generation:\n  max_new_tokens: {max_tokens}\n", encoding="utf-8")
        server = Server(model, config, folder / "server.log", ["--max-running", "4"])
        try:
            server.start()
        except RuntimeError as e:
            print(f"openai_clients: {e}", file=sys.stderr)
            return 2
        proxy = Proxy(server.port)
        ctx = Context(proxy.base, "tiny" if label == "tiny" else label, _models(), max_tokens, args.smoke)
        outcomes: list[Outcome] = []
        t0 = time.perf_counter()
        try:
            for library, name, fn in SCENARIOS:
                if library not in only:
                    continue
                o = run_scenario(ctx, proxy, library, name, fn)
                outcomes.append(o)
                flag = "ok " if o.passed else "BAD"
                why = "" if o.passed else (o.exception["type"] if o.exception else
                                           ",".join(k for k, v in o.checks.items() if not v))
                print(f"{flag} {library:14s} {name:28s} {o.seconds:7.2f}s {o.statuses} {why}", flush=True)
        finally:
            proxy.close()
            server.stop()
            log_tail = server.log_tail()
    summary = summarize(outcomes)
    report = {"mode": "smoke" if args.smoke else "full", "model": label, "max_tokens": max_tokens,
              "runtime_s": round(time.perf_counter() - t0, 1), **summary,
              "outcomes": [o.__dict__ | {"passed": o.passed} for o in outcomes],
              "versions": {d: envelope_lib.package_version(d) for d in
                           ("openai", "instructor", "langchain-openai", "langchain-core", "pydantic-ai-slim",
                            "litellm", "openai-agents")},
              "server_log_tail": log_tail[-3000:]}
    default_out = ROOT / "benchmarks" / "results" / f"openai-clients-{label}-cpu.json"
    out = args.out or (None if args.smoke else default_out)
    md = markdown(summary, outcomes, envelope, label)
    print(md)
    if out is not None:
        envelope_lib.write(out, envelope, report)
        out.with_suffix(".md").write_text(md, encoding="utf-8")
    met = all(b["met"] is not False for b in summary["bars"].values())
    return 1 if args.fail and not met else 0


if __name__ == "__main__":
    sys.exit(main())
