"""``POST /v1/responses`` (OpenAI's Responses API) of ``structgen serve``: a real uvicorn
server on 127.0.0.1 (a free port) and the real clients, unchanged: ``openai``
(``responses.create`` / ``parse`` / ``stream``), ``openai-agents`` (``OpenAIResponsesModel``)
and ``pydantic-ai`` (``OpenAIResponsesModel``).

Oracles: ``jsonschema`` for the validity of structured output and call arguments; the
non-streamed response for the joined stream (greedy); the documented event order; the
messages the engine was given (and the prompt they render to) for the conversion of input
items. The model is a tiny randomly initialised Llama over GPT-2's tokenizer
(tests/_tiny_lm.py), so tools are called with ``tool_choice="required"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import jsonschema
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from _servers import tiny_server  # noqa: E402

pydantic = pytest.importorskip("pydantic")

pytestmark = pytest.mark.assets

KEY = "test-key"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The forecast for a city.",
          "parameters": WEATHER, "strict": True},
         {"type": "function", "name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}]
PARAMS = {t["name"]: t["parameters"] for t in TOOLS}


class City(pydantic.BaseModel):
    """What the client libraries parse (no integer field: the schema's integers may be written
    with an exponent, ``-0e12``, valid JSON Schema that Pydantic's JSON parser refuses)."""

    name: str = pydantic.Field(max_length=10)
    sunny: bool


@pytest.fixture(scope="module")
def server(tokenizer_by_alias):
    with tiny_server(tokenizer_by_alias("gpt2"), api_key=KEY) as srv:
        yield srv


@pytest.fixture
def submitted(server, monkeypatch):
    """The EngineRequests the server submits during a test."""
    seen = []
    submit = server.engine.submit

    async def recording(request, **kw):
        seen.append(request)
        return await submit(request, **kw)

    monkeypatch.setattr(server.engine, "submit", recording)
    return seen


def _post(url: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(url + "/v1/responses", content=json.dumps(body), headers=headers, timeout=60)


def _calls(output) -> list[tuple[str, object]]:
    """(name, arguments) of a response's function_call items, each validated."""
    out = []
    for item in output:
        if item.type == "function_call":
            args = json.loads(item.arguments)
            jsonschema.validate(args, PARAMS[item.name])
            out.append((item.name, args))
    return out


def test_text_input_and_instructions(server, submitted) -> None:
    r = server.client.responses.create(model="tiny", input="Hello there", max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.status in ("completed", "incomplete") and r.error is None
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert item.content[0].type == "output_text" and item.content[0].text == r.output_text
    u = r.usage
    assert u.output_tokens <= 12 and u.total_tokens == u.input_tokens + u.output_tokens
    assert r.usage.input_tokens_details.cached_tokens == 0
    assert r.store is False  # accepted, nothing stored
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert submitted[-1].messages == [{"role": "user", "content": "Hello there"}]
    parts = [{"type": "input_text", "text": "H"}, {"type": "input_text", "text": "i"}]
    r = server.client.responses.create(model="tiny", instructions="Be brief.", max_output_tokens=4,
                                       input=[{"role": "user", "content": parts}], store=True,
                                       metadata={"k": "v"}, user="u1", reasoning={"effort": None},
                                       include=[])
    assert submitted[-1].messages == [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"}]
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 4 and r.metadata == {"k": "v"} and r.instructions == "Be brief."


def test_json_schema_format_and_parse(server) -> None:
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = server.client.responses.create(model="tiny", input="Bob is 42. JSON:", text={"format": fmt},
                                       max_output_tokens=60)
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.status == "completed" and r.text.format.type == "json_schema" and r.text.format.name == "person"
    obj = server.client.responses.create(model="tiny", input="JSON:", max_output_tokens=40,
                                         text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(obj.output_text), dict)
    parsed = server.client.responses.parse(model="tiny", input="Ann is 7.", text_format=City,
                                           max_output_tokens=60)
    assert isinstance(parsed.output_parsed, City)


def test_function_call_then_round_trip(server, submitted) -> None:
    from structgen.generation.api import prompt_ids

    r = server.client.responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS,
                                       tool_choice="required", max_output_tokens=80)
    calls = _calls(r.output)
    assert calls and r.status == "completed"
    fc = [o for o in r.output if o.type == "function_call"]
    assert all(c.id.startswith("fc_") and c.call_id.startswith("call_") for c in fc)
    assert all(c.status == "completed" for c in fc)
    assert [t.name for t in r.tools] == ["get_weather", "get_time"] and r.tool_choice == "required"
    named = server.client.responses.create(model="tiny", input="Time?", tools=TOOLS, max_output_tokens=60,
                                           tool_choice={"type": "function", "name": "get_time"})
    assert {n for n, _ in _calls(named.output)} == {"get_time"}

    # the round trip: the call goes back with its output, as the agents clients send it
    history = [{"role": "user", "content": "Weather in Paris?"},
               *[o.model_dump(exclude_none=True) for o in fc],
               *[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 21 C"} for c in fc]]
    r2 = server.client.responses.create(model="tiny", input=history, tools=TOOLS, tool_choice="none",
                                        max_output_tokens=8)
    assert r2.output[0].type == "message" and not _calls(r2.output)
    messages = submitted[-1].messages
    assert messages[0] == {"role": "user", "content": "Weather in Paris?"}
    assert messages[1]["role"] == "assistant"  # the calls, grouped into one assistant message
    assert [c["id"] for c in messages[1]["tool_calls"]] == [c.call_id for c in fc]
    sent_arguments = [c["function"]["arguments"] for c in messages[1]["tool_calls"]]
    assert sent_arguments == [json.loads(c.arguments) for c in fc]
    tool_messages = messages[2:]
    assert [m["tool_call_id"] for m in tool_messages] == [c.call_id for c in fc]
    assert all(m["role"] == "tool" and m["content"] == "sunny, 21 C" for m in tool_messages)
    ids = prompt_ids(server.lm, None, messages)
    assert "sunny, 21 C" in server.lm.tokenizer.decode(ids)
    assert r2.usage.input_tokens == len(ids)


def _events(server, **kw) -> list:
    return list(server.client.responses.create(model="tiny", stream=True, **kw))


def _check_order(events, final_type: str = "response.completed") -> None:
    """Sequence numbers count up from 0; the documented order, item by item."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == final_type
    body = kinds[2:-1]
    i = 0
    while i < len(body):
        assert body[i] == "response.output_item.added"
        item = events[2 + i].item
        j = body.index("response.output_item.done", i)
        inner = body[i + 1:j]
        if item.type == "message":
            assert inner[0] == "response.content_part.added"
            assert inner[-2:] == ["response.output_text.done", "response.content_part.done"]
            assert set(inner[1:-2]) <= {"response.output_text.delta"}
        else:
            assert inner[-1] == "response.function_call_arguments.done"
            assert set(inner[:-1]) <= {"response.function_call_arguments.delta"}
        i = j + 1


def test_stream_equals_non_streamed(server) -> None:
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    for kw in [{"input": "Hello", "max_output_tokens": 20},
               {"input": "Bob is 42. JSON:", "text": {"format": fmt}, "max_output_tokens": 60}]:
        whole = server.client.responses.create(model="tiny", temperature=0, **kw)
        events = _events(server, temperature=0, **kw)
        _check_order(events, "response.incomplete" if whole.status == "incomplete" else "response.completed")
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == whole.output_text
        done = [e.text for e in events if e.type == "response.output_text.done"]
        assert done == [whole.output_text]
        final = events[-1].response
        assert final.output_text == whole.output_text and final.status == whole.status
        assert final.usage.output_tokens == whole.usage.output_tokens
    kw = {"input": "Weather in Paris?", "tools": TOOLS, "tool_choice": "required", "max_output_tokens": 80,
          "temperature": 0}
    whole = server.client.responses.create(model="tiny", **kw)
    events = _events(server, **kw)
    _check_order(events)
    args = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(args) > len([o for o in whole.output if o.type == "function_call"])  # arrives in pieces
    assert _calls(events[-1].response.output) == _calls(whole.output)
    # the raw wire format: an event line naming each data line's type
    with httpx.stream("POST", server.url + "/v1/responses", timeout=60,
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
                      content=json.dumps({"input": "Hi", "stream": True, "max_output_tokens": 3})) as resp:
        blocks = [b for b in resp.read().decode().split("\n\n") if b.strip()]
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert event_line == "event: " + json.loads(data_line.removeprefix("data: "))["type"]


def test_stream_helper_parses(server) -> None:
    with server.client.responses.stream(model="tiny", input="Ann is 7.", text_format=City,
                                        max_output_tokens=60) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    assert isinstance(final.output_parsed, City)


def test_refusals(server) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        server.client.responses.create(model="tiny", input="Hi", previous_response_id="resp_123")
    assert e.value.body["param"] == "previous_response_id" and "stateless" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        server.client.responses.create(model="tiny", input="Hi", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools[0].type"
    bad_schema = {"type": "json_schema", "name": "x", "schema": {"type": "object", "properties": {
        "a": {"type": "strin"}}}}
    r = _post(server.url, {"input": "Hi", "text": {"format": bad_schema}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format.schema"
    image = {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}
    r = _post(server.url, {"input": [image]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content[0].type"
    r = _post(server.url, {"input": [{"type": "item_reference", "id": "msg_1"}]})
    assert r.status_code == 400 and "stateless" in r.json()["error"]["message"]
    assert _post(server.url, {"input": "Hi", "tool_choice": "required"}).status_code == 400
    assert _post(server.url, {"input": "Hi", "include": ["message.output_text.logprobs"]}).status_code == 400
    assert _post(server.url, {"input": []}).status_code == 400
    assert _post(server.url, {"input": "Hi", "max_output_tokens": "9"}).status_code == 400
    assert _post(server.url, {"input": "Hi"}, key=None).status_code == 401
    # the app's hostile-input checks cover this route too
    plain = httpx.post(server.url + "/v1/responses", content=b'{"input": "Hi"}', timeout=60,
                       headers={"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"})
    assert plain.status_code == 415
    r = httpx.post(server.url + "/v1/responses", content=b'{"input": "\\ud800"}', timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_unicode"
    ok = _post(server.url, {"input": "Hi", "max_output_tokens": 2, "store": False, "unknown_field": 1,
                            "reasoning": {"effort": "low", "summary": None}})
    assert ok.status_code == 200 and ok.json()["status"] == "incomplete"


def _agents():
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # never upload traces
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    return agents


def test_openai_agents(server) -> None:
    agents = _agents()
    from agents.models.openai_responses import OpenAIResponsesModel

    called = []

    @agents.function_tool
    def get_weather(city: str, days: int) -> str:
        """The forecast for a city."""
        called.append((city, days))
        return f"sunny in {city}"

    async def main():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        model = OpenAIResponsesModel(model="tiny", openai_client=client)
        extract = agents.Agent(name="extract", instructions="Name the city.", model=model,
                               output_type=City, model_settings=agents.ModelSettings(max_tokens=60))
        city = await agents.Runner.run(extract, "Paris is sunny.")
        # the tool round trip: turn 1 must call (required), turn 2 (tool_choice back to auto)
        # gets the call and its output back as input items and answers in text
        caller = agents.Agent(name="caller", model=model, tools=[get_weather],
                              model_settings=agents.ModelSettings(tool_choice="required", max_tokens=40))
        weather = await agents.Runner.run(caller, "Weather in Paris?", max_turns=3)
        streamed = agents.Runner.run_streamed(extract, "Paris is sunny.")
        kinds = [event.type async for event in streamed.stream_events()]
        await client.close()
        return city, weather, streamed, kinds

    city, weather, streamed, kinds = asyncio.run(main())
    assert isinstance(city.final_output, City)
    assert isinstance(streamed.final_output, City) and "raw_response_event" in kinds
    items = [type(i).__name__ for i in weather.new_items]
    assert items[:2] == ["ToolCallItem", "ToolCallOutputItem"] and items[-1] == "MessageOutputItem"
    # the SDK parsed the arguments into the tool's typed parameters before calling it
    assert called and all(isinstance(c, str) and isinstance(d, int) for c, d in called)
    assert isinstance(weather.final_output, str)


def test_pydantic_ai(server) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIResponsesModel("tiny", provider=OpenAIProvider(base_url=server.url + "/v1", api_key=KEY))
    agent = Agent(model, output_type=NativeOutput(City), model_settings={"max_tokens": 60})
    result = agent.run_sync("Ann is 7.")
    assert isinstance(result.output, City)

    async def streamed():
        async with agent.run_stream("Ann is 7.") as run:
            return await run.get_output()

    assert isinstance(asyncio.run(streamed()), City)


def test_closed_stream_cancels_the_request(server) -> None:
    """A client that closes its stream early cancels its request (its rows leave the batch)."""
    cancelled = server.engine.counters.requests.get("cancelled", 0)
    with httpx.stream("POST", server.url + "/v1/responses", timeout=60,
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
                      content=json.dumps({"input": "Tell a long story", "stream": True,
                                          "max_output_tokens": 900})) as resp:
        for line in resp.iter_lines():
            if "response.output_text.delta" in line:
                break  # gone after the first piece of text
    deadline = time.monotonic() + 30
    while server.engine.counters.requests.get("cancelled", 0) == cancelled:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.05)


def test_input_items_become_chat_messages() -> None:
    """Consecutive function_call items (and the assistant message before them) make one
    assistant turn; each output a tool message naming its call; reasoning items are skipped."""
    from structgen.serving.responses import ResponsesRequest

    req = ResponsesRequest.model_validate({"instructions": "Sys.", "input": [
        {"type": "message", "role": "user", "content": "Two cities?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_time", "arguments": '{"zone": "UTC"}'},
        {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": '{"zone": "CET"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "12:00"},
        {"type": "function_call_output", "call_id": "call_b",
         "output": [{"type": "input_text", "text": "13:00"}]},
        {"role": "developer", "content": "Answer briefly."}]})
    calls = [{"id": c, "type": "function", "function": {"name": "get_time", "arguments": {"zone": z}}}
             for c, z in (("call_a", "UTC"), ("call_b", "CET"))]
    assert req.message_dicts() == [
        {"role": "system", "content": "Sys."}, {"role": "user", "content": "Two cities?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": calls},
        {"role": "tool", "content": "12:00", "name": "get_time", "tool_call_id": "call_a"},
        {"role": "tool", "content": "13:00", "name": "get_time", "tool_call_id": "call_b"},
        {"role": "developer", "content": "Answer briefly."}]
