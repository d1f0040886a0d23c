"""``structgen serve``: a real uvicorn server on 127.0.0.1 (a free port) and the official
``openai`` client, unchanged.

Oracles: ``jsonschema`` (with formats) for validity; :func:`structgen.generate` on the same
model, alone, for the greedy text of each request served in a shared batch; the non-streamed
response for the joined stream; the HTTP status codes the OpenAI API documents. The model is
a tiny randomly initialised Llama over GPT-2's tokenizer (tests/_tiny_lm.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from _servers import free_port, tiny_server  # noqa: E402

import structgen  # noqa: E402

pytestmark = pytest.mark.assets

KEY = "test-key"
ROOT = Path(__file__).resolve().parents[1]

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"enum": ["open", "closed", "pending"]},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                               "maxItems": 3}},
     "required": ["status", "tags"]},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                      "mail": {"type": "string", "format": "email"},
                                      "ok": {"type": "boolean"}},
     "required": ["when", "mail", "ok"]},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
]
PROMPTS = ["Extract: Bob is 42. JSON:", "Ticket open, tags db. JSON:", "Meeting on 2024-05-01, bob@x.org",
           "Numbers: 1, 2.5, 3"]
GRAMMAR = 'start: "SELECT " COL ("," COL)* " FROM t"\nCOL: /[a-z]{1,6}/\n'


@pytest.fixture(scope="module")
def server(tokenizer_by_alias):
    with tiny_server(tokenizer_by_alias("gpt2"), api_key=KEY) as srv:
        yield srv


def _fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def _chat(client, prompt: str, **kw):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}], **kw)


def _gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^structgen_serve_(running_sequences|queued_sequences) (\S+)$", text, re.M)}


def _wait_idle(url: str, timeout: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        g = _gauges(url)
        if g["running_sequences"] == 0 and g["queued_sequences"] == 0 or time.monotonic() > deadline:
            return g
        time.sleep(0.1)


def test_json_schema_responses_validate_and_equal_generate_alone(server) -> None:
    cases = [(SCHEMAS[i % len(SCHEMAS)], PROMPTS[i % len(PROMPTS)] + " x" * i) for i in range(10)]
    with ThreadPoolExecutor(10) as pool:  # concurrent: they share the running batch
        responses = list(pool.map(lambda c: _chat(server.client, c[1], response_format=_fmt(c[0]),
                                                  max_tokens=60), cases))
    checker = jsonschema.FormatChecker()
    for (schema, prompt), r in zip(cases, responses):
        text = r.choices[0].message.content
        jsonschema.validate(json.loads(text), schema, format_checker=checker)
        assert r.choices[0].finish_reason == "stop"
        alone = structgen.generate(server.lm, schema=schema, messages=[{"role": "user", "content": prompt}],
                                   max_new_tokens=60)
        assert text == alone.text
        assert r.usage.completion_tokens == len(alone.tokens)
        ext = r.usage.model_extra["structgen"]
        assert ext["forward_passes"] >= 1 and ext["tokens_per_pass"] > 0
    assert server.engine.counters.joins > 1  # requests joined a running batch


def test_stream_joined_equals_non_streamed(server) -> None:
    for fmt, prompt in [(_fmt(SCHEMAS[1]), PROMPTS[1]), ({"type": "grammar", "grammar": GRAMMAR}, "SQL:"),
                        ({"type": "regex", "regex": r"[0-9]{3}-[a-z]{2,5}"}, "Code:"), (None, "Hello")]:
        kw = {"response_format": fmt} if fmt else {}
        full = _chat(server.client, prompt, max_tokens=40, **kw)
        chunks = list(_chat(server.client, prompt, max_tokens=40, stream=True,
                            stream_options={"include_usage": True}, **kw))
        joined = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert joined == full.choices[0].message.content
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == [full.choices[0].finish_reason]
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    sql = _chat(server.client, "SQL:", max_tokens=40, response_format={"type": "grammar", "grammar": GRAMMAR})
    assert re.fullmatch(r"SELECT [a-z]{1,6}(,[a-z]{1,6})* FROM t", sql.choices[0].message.content)
    comp = server.client.completions.create(model="tiny", prompt="Code:", max_tokens=20,
                                            extra_body={"response_format": {"type": "regex",
                                                                            "regex": r"[0-9]{3}-[a-z]{2,5}"}})
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,5}", comp.choices[0].text)
    streamed = server.client.completions.create(model="tiny", prompt="Hi", max_tokens=15, stream=True)
    plain = server.client.completions.create(model="tiny", prompt="Hi", max_tokens=15)
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text
    assert plain.choices[0].finish_reason in ("stop", "length")


def test_stop_strings_n_and_models(server) -> None:
    full = _chat(server.client, "Hello", max_tokens=30).choices[0].message.content
    if len(full) > 6:
        stop = full[3:5]
        cut = _chat(server.client, "Hello", max_tokens=30, stop=[stop]).choices[0]
        assert cut.message.content == full[: full.index(stop)] and cut.finish_reason == "stop"
        joined = "".join(c.choices[0].delta.content or "" for c in
                         _chat(server.client, "Hello", max_tokens=30, stop=stop, stream=True) if c.choices)
        assert joined == cut.message.content
    two = _chat(server.client, PROMPTS[0], max_tokens=60, n=2, response_format=_fmt(SCHEMAS[0]))
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].message.content == two.choices[1].message.content  # greedy
    sampled = _chat(server.client, PROMPTS[0], max_tokens=60, n=3, temperature=1.0, seed=7,
                    response_format=_fmt(SCHEMAS[0]))
    for c in sampled.choices:
        jsonschema.validate(json.loads(c.message.content), SCHEMAS[0])
    assert [m.id for m in server.client.models.list().data] == ["tiny"]


def _post(url: str, body: bytes | dict, key: str | None = KEY, path: str = "/v1/chat/completions"):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers=headers, timeout=60)


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather forecast for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {
            "zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}},
]
_PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _calls(calls) -> list[tuple[str, object]]:
    """(name, arguments) of OpenAI tool calls, each validated against its tool's schema."""
    out = []
    for c in calls or []:
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, _PARAMS[c.function.name])
        out.append((c.function.name, args))
    return out


def test_tool_calls_validate_and_stream_like_the_answer(server) -> None:
    """tools through the official client: "required" yields calls that validate against their
    tool's schema (finish_reason tool_calls); the streamed calls equal the non-streamed ones; a
    named tool is the one called; "none" yields no call."""
    kw = {"tools": TOOLS, "tool_choice": "required", "max_tokens": 80}
    r = _chat(server.client, "What will the weather be in Paris?", **kw)
    choice = r.choices[0]
    calls = _calls(choice.message.tool_calls)
    assert calls and choice.finish_reason == "tool_calls"
    assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls)
    chunks = list(_chat(server.client, "What will the weather be in Paris?", stream=True, **kw))
    deltas = [tc for ck in chunks for ch in ck.choices for tc in (ch.delta.tool_calls or [])]
    joined: dict[int, dict] = {}  # what a client does: id and name once, arguments in pieces
    for d in deltas:
        if d.id is not None:
            assert d.index not in joined and d.type == "function" and d.function.name
            joined[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
        joined[d.index]["arguments"] += d.function.arguments or ""
    assert len(deltas) > len(joined)  # the arguments arrive as they are generated
    assert [(j["name"], j["arguments"]) for j in joined.values()] == \
        [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    streamed = [SimpleNamespace(function=SimpleNamespace(name=j["name"], arguments=j["arguments"]))
                for j in joined.values()]
    assert _calls(streamed) == calls
    assert [ch.finish_reason for ck in chunks for ch in ck.choices if ch.finish_reason] == ["tool_calls"]
    named = _chat(server.client, "Time?", tools=TOOLS, max_tokens=60,
                  tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert {n for n, _ in _calls(named.choices[0].message.tool_calls)} == {"get_time"}
    none = _chat(server.client, "Hello", tools=TOOLS, tool_choice="none", max_tokens=30)
    assert not none.choices[0].message.tool_calls and none.choices[0].finish_reason != "tool_calls"


def test_error_status_codes(server) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as bad:
        bad_type = {"type": "object", "properties": {"a": {"type": "strin"}}}
        _chat(server.client, "x", response_format=_fmt(bad_type))
    err = bad.value.body
    assert err["keyword"] == "type" and err["pointer"] == "#/properties/a" and err["code"] == "invalid_schema"
    lookahead = {"type": "string", "pattern": "(?=a)b"}
    r = _post(server.url, {"messages": msgs, "response_format": _fmt(lookahead)})
    assert r.status_code == 400
    e = r.json()["error"]
    assert e["code"] == "unsupported_keyword" and e["keyword"] == "pattern" and e["pointer"] == "#"
    assert _post(server.url, b'{"messages": [').status_code == 400            # malformed JSON
    assert _post(server.url, {"messages": "hi"}).status_code == 400           # wrong type
    assert _post(server.url, {"messages": msgs, "max_tokens": 0}).status_code == 400
    r = _post(server.url, {"messages": msgs, "tools": TOOLS, "tool_choice": {"name": "nope"}})
    assert r.status_code == 400 and "tool_choice" in r.json()["error"]["message"]
    assert _post(server.url, {"messages": msgs, "functions": [{"name": "f"}]}).status_code == 400
    assert _post(server.url, {"messages": msgs, "logprobs": True, "top_logprobs": 21}).status_code == 400
    r = _post(server.url, {"messages": msgs, "max_tokens": 2, "response_format": _fmt(SCHEMAS[0]),
                           "on_max_tokens": "refuse"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "max_tokens_too_small"
    assert _post(server.url, {"messages": msgs, "on_max_tokens": "never"}).status_code == 400
    big = {"messages": [{"role": "user", "content": "x" * 200_000}]}
    assert _post(server.url, big).status_code == 413
    assert _post(server.url, {"messages": msgs}, key=None).status_code == 401
    assert _post(server.url, {"messages": msgs}, key="wrong").status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200               # no key needed
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert _post(server.url, {"messages": msgs}, path="/v1/nothing").status_code == 404


def test_max_tokens_below_the_shortest_output_is_cut_like_openai(server) -> None:
    """OpenAI's answer to a max_tokens too small for the output: 200, the text cut at
    max_tokens, finish_reason "length", streamed or not; ``on_max_tokens: "refuse"`` gives
    structgen's 400 instead, in the HTTP API's terms (no Python parameter names)."""
    fmt = _fmt(SCHEMAS[0])
    r = _chat(server.client, "Bob, 42", response_format=fmt, max_tokens=3)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and r.usage.completion_tokens == 3
    assert choice.message.content.startswith("{")
    chunks = list(_chat(server.client, "Bob, 42", response_format=fmt, max_tokens=3, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    # "cut": no steering at all, even where max_tokens is enough
    r = _chat(server.client, "Bob, 42", response_format=fmt, max_tokens=30,
              extra_body={"on_max_tokens": "cut"})
    assert r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as bad:
        _chat(server.client, "Bob, 42", response_format=fmt, max_tokens=3,
              extra_body={"on_max_tokens": "refuse"})
    message = bad.value.body["message"]
    assert message.startswith("max_tokens=3 is below the shortest valid output (at least ")
    assert bad.value.body["param"] == "max_tokens"
    for python_name in ("max_new_tokens", "on_budget", "="):
        assert python_name not in message.replace("max_tokens=3", ""), message
    long_prompt = "word " * 3000  # past the tiny model's context
    with pytest.raises(openai.BadRequestError) as bad:
        _chat(server.client, long_prompt, max_tokens=5)
    message = bad.value.body["message"]
    assert "max_tokens is 5" in message and "max_new_tokens" not in message


def test_error_messages_name_the_http_api_not_python() -> None:
    """The typed errors the engine raises name the Python API; the server's answers name
    max_tokens and the --config limits instead."""
    from structgen.errors import CompileLimitError, ContextLengthError, TokenBudgetError
    from structgen.serving.http_messages import http_message

    errors = [TokenBudgetError("max_new_tokens=3 is too small; pass on_budget='cut'", needed=12,
                               max_new_tokens=3),
              ContextLengthError("max_new_tokens ...", prompt_tokens=1000, max_new_tokens=40,
                                 context_length=1024),
              CompileLimitError("enum with 9000 values exceeds max_enum=5000 at #/x"),
              CompileLimitError("grammar has 9 rules, more than CompileOptions.max_rules=5")]
    messages = [http_message(e) for e in errors]
    assert messages[0].startswith("max_tokens=3 is below the shortest valid output (at least 12 tokens")
    assert "lower max_tokens to at most 24" in messages[1]
    assert "json_schema.max_enum limit of 5000" in messages[2]
    assert "compile.max_rules limit of 5" in messages[3]
    for m in messages:
        assert not re.search(r"max_new_tokens|on_budget|CompileOptions|\b(max_enum|max_rules)=", m), m


def test_compile_past_its_limit_is_422(server) -> None:
    from structgen.config import CompileOptions

    engine = server.engine
    old = engine.compile_options
    engine.compile_options = CompileOptions(max_states=50)
    try:
        r = _post(server.url, {"messages": [{"role": "user", "content": "x"}],
                               "response_format": _fmt(SCHEMAS[2])})
    finally:
        engine.compile_options = old
    assert r.status_code == 422 and r.json()["error"]["code"] == "compile_limit"


def test_full_queue_gets_429_and_server_recovers(server) -> None:
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 40}

    async def burst() -> list[int]:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
            rs = await asyncio.gather(*(c.post(server.url + "/v1/chat/completions", json=body)
                                        for _ in range(40)))
            return [r.status_code for r in rs]

    codes = asyncio.run(burst())
    assert set(codes) <= {200, 429} and codes.count(429) > 0 and codes.count(200) >= 4
    assert _wait_idle(server.url) == {"running_sequences": 0, "queued_sequences": 0}
    assert _chat(server.client, "hi", max_tokens=5).choices[0].finish_reason in ("stop", "length")


def test_clients_that_disconnect_free_their_rows(server) -> None:
    rng = random.Random(0)
    plans = [(rng.random() < 0.6, rng.randint(0, 12), rng.uniform(0.0, 0.3)) for _ in range(100)]

    def client(plan) -> None:
        stream, after_chunks, after_s = plan
        body = {"model": "tiny", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 60,
                "stream": stream, "response_format": _fmt(SCHEMAS[plan[1] % len(SCHEMAS)])}
        headers = {"Authorization": f"Bearer {KEY}"}
        try:
            if stream:
                with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=headers,
                                  timeout=60) as r:
                    for i, _line in enumerate(r.iter_lines()):
                        if i >= after_chunks:
                            break  # closes the connection mid-stream
            else:
                httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers,
                           timeout=max(after_s, 0.01))
        except httpx.TimeoutException:
            pass  # the client gave up: that is the disconnect

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(client, plans))
    assert _wait_idle(server.url) == {"running_sequences": 0, "queued_sequences": 0}
    assert server.engine.counters.requests.get("cancelled", 0) > 0
    assert server.engine.failure is None
    r = _chat(server.client, PROMPTS[0], max_tokens=60, response_format=_fmt(SCHEMAS[0]))
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMAS[0])


def test_slow_compile_does_not_stall_other_requests(server) -> None:
    """A request whose compile is held back finishes after one that arrived later."""
    from structgen.serving.engine import Constraint, EngineRequest

    engine = server.engine
    gate = threading.Event()
    slow = {"type": "object", "properties": {"held": {"type": "boolean"}}, "required": ["held"]}
    original = engine.compile

    def compile_(c):
        if c.spec == slow:
            assert gate.wait(60)
        return original(c)

    async def main() -> list[str]:
        order: list[str] = []

        async def one(name: str, schema: dict) -> None:
            h = await engine.submit(EngineRequest(Constraint("json", schema), prompt="x", max_tokens=40))
            await h.results()
            order.append(name)
            if name == "fast":
                gate.set()

        await asyncio.gather(one("slow", slow), one("fast", SCHEMAS[0]))
        return order

    engine.compile = compile_
    try:
        assert asyncio.run(main()) == ["fast", "slow"]
    finally:
        engine.compile = original


def _start(folder: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STRUCTGEN_API_KEY": KEY}
    return subprocess.Popen([sys.executable, "-m", "structgen", "serve", "--model", str(folder), "--port",
                             str(port), "--log-level", "warning"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_health(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "server exited"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("server did not become healthy")


def test_server_killed_mid_run_restarts(tmp_path, tokenizer_by_alias) -> None:
    from _tiny_lm import save_tiny_model

    folder = save_tiny_model(tmp_path / "model", tokenizer_by_alias("gpt2"), "biased")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    proc = _start(folder, port)
    try:
        _wait_health(url, proc)
        # what the server loaded before serving is out of the cyclic collector's reach
        text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        frozen = re.search(r"^structgen_gc_frozen_objects (\d+)", text, re.M)
        assert frozen is not None and int(frozen.group(1)) > 10_000, text[-2000:]
        first = _chat(client, PROMPTS[0], max_tokens=40, response_format=_fmt(SCHEMAS[0]))
        stream = _chat(client, "go", max_tokens=200, stream=True)
        next(iter(stream))
        proc.send_signal(signal.SIGKILL)  # mid-run: a stream is open
        proc.wait(30)
        with pytest.raises(Exception):  # noqa: B017 - whatever the client raises for a dead server
            list(stream)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    proc = _start(folder, port)
    try:
        _wait_health(url, proc)
        again = _chat(client, PROMPTS[0], max_tokens=40, response_format=_fmt(SCHEMAS[0]))
        assert again.choices[0].message.content == first.choices[0].message.content
        stream = _chat(client, "go", max_tokens=100, stream=True)
        chunks = [next(iter(stream))]
        proc.send_signal(signal.SIGTERM)  # graceful: the open stream is served to its end
        chunks += list(stream)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
        assert proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after draining
        assert "structgen serve: stopped" in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_reasoning_then_schema_and_its_stream(server) -> None:
    """reasoning=True (extra_body): message.reasoning_content holds the thinking and the content
    validates against response_format; streamed, the reasoning_content and content deltas join
    to the non-streamed message; the output equals structgen.generate with the same options."""
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    kw = {"response_format": _fmt(schema), "max_tokens": 60,
          "extra_body": {"reasoning": True, "thinking_budget": 8}}
    r = _chat(server.client, "Think, then answer:", **kw)
    msg = r.choices[0].message
    reasoning = msg.model_extra["reasoning_content"]
    assert isinstance(reasoning, str) and r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(msg.content), schema)
    alone = structgen.generate(server.lm, schema=schema, reasoning=True, thinking_budget=8, max_new_tokens=60,
                               messages=[{"role": "user", "content": "Think, then answer:"}])
    assert (msg.content, reasoning) == (alone.text, alone.reasoning)
    chunks = list(_chat(server.client, "Think, then answer:", stream=True, **kw))
    deltas = [ch.delta for ck in chunks for ch in ck.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == msg.content
    with pytest.raises(openai.BadRequestError, match="thinking_budget"):
        _chat(server.client, "x", extra_body={"thinking_budget": 3})
