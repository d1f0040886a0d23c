"""``structgen serve`` driven by the client libraries people point at an OpenAI-compatible
server: openai, instructor, langchain-openai, pydantic-ai, litellm and openai-agents, each
unchanged, against a real uvicorn server on 127.0.0.1 (issue 39, item 8).

The model is a tiny randomly initialised Llama over GPT-2's tokenizer (tests/_tiny_lm.py): its
words are noise, so every schema here is one whose grammar alone makes each output a valid
instance (enums, bounded integers, booleans), and each test asserts what the library hands
back: a Pydantic object, or a value ``jsonschema`` validates. The Responses API of these
libraries is tests/test_responses_api.py's.

The mixed run at the end is the ``/metrics`` oracle (item 6): the validity it reports equals
a count made client-side from the answers themselves.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from types import SimpleNamespace
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from _servers import running  # noqa: E402

pytestmark = pytest.mark.assets

KEY = "test-key"
PROMPT = "Ticket 7: the login page is down. Give the ticket as JSON."


class Ticket(BaseModel):
    """What every structured request asks for: the grammar alone makes it valid."""

    status: Literal["open", "closed", "pending"]
    # not int with ge/le: the grammar of JSON Schema's "integer" also writes 3.0 (an integer to
    # JSON Schema), which instructor's strict validation refuses
    priority: Literal[1, 2, 3, 4, 5]
    urgent: bool


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris", "Lima"]}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server(tokenizer_by_alias):
    """The server wired as ``structgen serve`` wires it: the engine's finished sequences feed
    the run metrics (here a registry of its own) that ``/metrics`` exports."""
    from _tiny_lm import build_tiny_llama

    from structgen.cli.serve import _observer
    from structgen.generation.model import CausalLM
    from structgen.metrics import Metrics
    from structgen.serving.app import create_app
    from structgen.serving.engine import Engine

    tok = tokenizer_by_alias("gpt2")
    lm = CausalLM(build_tiny_llama(tok, "random"), tok)
    metrics = Metrics(parent=None)
    engine = Engine(lm, max_running=4, max_queued=16, default_max_tokens=64, compile_workers=2,
                    on_result=_observer(metrics))
    app = create_app(engine, model_name="tiny", api_key=KEY, metrics=metrics)
    with running(app) as url:
        yield SimpleNamespace(url=url, base=url + "/v1", metrics=metrics,
                              client=openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0,
                                                    timeout=120))


def _messages(text: str = PROMPT) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _ticket_format() -> dict:
    return {"type": "json_schema", "json_schema": {"name": "Ticket", "schema": Ticket.model_json_schema(),
                                                   "strict": True}}


# -- openai -------------------------------------------------------------------------------------
def test_openai_parse_stream_and_forced_tools(server) -> None:
    parsed = server.client.chat.completions.parse(model="tiny", messages=_messages(), response_format=Ticket)
    assert isinstance(parsed.choices[0].message.parsed, Ticket)
    chunks = list(server.client.chat.completions.create(model="tiny", messages=_messages(),
                                                        response_format=_ticket_format(), stream=True,
                                                        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    Ticket.model_validate_json(text)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    r = server.client.chat.completions.create(model="tiny", messages=_messages("Weather in Oslo?"),
                                              tools=[WEATHER_TOOL], tool_choice="required")
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER_TOOL["function"]["parameters"])


# -- instructor ---------------------------------------------------------------------------------
def test_instructor_json_schema_and_tools_modes(server) -> None:
    instructor = pytest.importorskip("instructor")
    for mode in (instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS):
        client = instructor.from_openai(server.client, mode=mode)
        ticket = client.chat.completions.create(model="tiny", messages=_messages(), response_model=Ticket,
                                                max_retries=0)
        assert isinstance(ticket, Ticket), mode


# -- langchain-openai ---------------------------------------------------------------------------
def test_langchain_structured_output_stream_and_bound_tools(server) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=server.base, api_key=KEY, model="tiny", max_retries=0,
                                      timeout=120)
    structured = llm.with_structured_output(Ticket, method="json_schema")
    assert isinstance(structured.invoke(PROMPT), Ticket)
    streamed = list(structured.stream(PROMPT))
    assert streamed and isinstance(streamed[-1], Ticket)
    bound = llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather")
    message = bound.invoke("Weather in Oslo?")
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    jsonschema.validate(message.tool_calls[0]["args"], WEATHER_TOOL["function"]["parameters"])


# -- pydantic-ai --------------------------------------------------------------------------------
def test_pydantic_ai_native_and_tool_output(server) -> None:
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("tiny", provider=OpenAIProvider(base_url=server.base, api_key=KEY))
    native = pydantic_ai.Agent(model, output_type=pydantic_ai.NativeOutput(Ticket), retries=0)
    assert isinstance(native.run_sync(PROMPT).output, Ticket)
    # the default output mode: an output tool the model must call (tool_choice "required")
    by_tool = pydantic_ai.Agent(model, output_type=Ticket, retries=0)
    assert isinstance(by_tool.run_sync(PROMPT).output, Ticket)


# -- litellm ------------------------------------------------------------------------------------
def test_litellm_response_format_and_tools(server) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost map from the network
    litellm = pytest.importorskip("litellm")
    common = {"model": "openai/tiny", "api_base": server.base, "api_key": KEY, "num_retries": 0}
    r = litellm.completion(messages=_messages(), response_format=Ticket, **common)
    Ticket.model_validate_json(r.choices[0].message.content)
    r = litellm.completion(messages=_messages("Weather in Oslo?"), tools=[WEATHER_TOOL],
                           tool_choice="required", **common)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])


# -- openai-agents ------------------------------------------------------------------------------
def test_openai_agents_chat_completions_output_type(server) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    model = agents.OpenAIChatCompletionsModel(model="tiny", openai_client=openai.AsyncOpenAI(
        base_url=server.base, api_key=KEY, max_retries=0, timeout=120))
    agent = agents.Agent(name="triage", instructions="File the ticket.", model=model, output_type=Ticket)
    result = asyncio.run(agents.Runner.run(agent, PROMPT, max_turns=2))
    assert isinstance(result.final_output, Ticket)


# -- /metrics against a client-side count ---------------------------------------------------------
def _run_metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    out = {}
    for m in re.finditer(r"^(structgen_\w+)(\{[^}]*\})? (\S+)$", text, re.M):
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def _delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_metrics_validity_equals_a_client_side_count(server) -> None:
    """A mixed run: plain chat (never judged, cut at max_tokens or not), json_schema requests
    that end complete, and json_schema requests cut by a max_tokens below their shortest output.
    /metrics counts what the client counts: valid = finish_reason "stop" and the content validates."""
    schema = Ticket.model_json_schema()
    client = server.client

    def constrained(max_tokens: int | None) -> bool:
        limit = {"max_tokens": max_tokens} if max_tokens else {}
        r = client.chat.completions.create(model="tiny", messages=_messages(),
                                           response_format=_ticket_format(), **limit)
        choice = r.choices[0]
        if choice.finish_reason != "stop":
            return False
        try:
            jsonschema.validate(json.loads(choice.message.content), schema)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True

    before = _run_metrics(server.url)
    # a healthy run: plain chat cut at max_tokens does not count, every constrained output is valid
    for _ in range(2):
        client.chat.completions.create(model="tiny", messages=_messages("hello"), max_tokens=4)
    healthy = [constrained(None) for _ in range(3)]
    assert all(healthy)
    mid = _run_metrics(server.url)
    assert _delta(mid, before, 'structgen_requests_total{status="valid"}') == 3
    assert _delta(mid, before, 'structgen_requests_total{status="unchecked"}') == 2
    assert _delta(mid, before, 'structgen_requests_total{status="incomplete"}') == 0
    if not before.get('structgen_requests_total{status="valid"}') and \
            not before.get('structgen_requests_total{status="incomplete"}'):
        assert mid["structgen_output_validity_ratio"] == 1.0
        assert mid['structgen_alert{alert="min_validity"}'] == 0
    # then some constrained outputs cut at max_tokens: finish_reason "length", not valid
    mixed = [constrained(3), constrained(None), constrained(3)]
    after = _run_metrics(server.url)
    verdicts = healthy + mixed
    valid = _delta(after, before, 'structgen_requests_total{status="valid"}')
    judged = valid + _delta(after, before, 'structgen_requests_total{status="invalid"}') + \
        _delta(after, before, 'structgen_requests_total{status="incomplete"}')
    assert (valid, judged) == (sum(verdicts), len(verdicts))
    served = 'structgen_serve_constrained_outputs_total{validity="%s"}'
    assert _delta(after, before, served % "valid") == sum(verdicts)
    assert _delta(after, before, served % "incomplete") == 2
    total_valid = after['structgen_requests_total{status="valid"}']
    total_judged = total_valid + after['structgen_requests_total{status="invalid"}'] + \
        after['structgen_requests_total{status="incomplete"}']
    assert after["structgen_output_validity_ratio"] == pytest.approx(total_valid / total_judged)
