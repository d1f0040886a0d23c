"""Tool calling: tool specs, formats, and outputs of the tool grammars.

Oracles: ``jsonschema`` for the arguments of every call; the format's own parser for the
calls (checked on hand-written outputs first); random walks through the matcher's masks over
a small vocabulary for "every output the grammar admits": complete outputs parse, validate,
hold at least one call under "required" and none under "none". Generation with a tiny random
Llama: greedy speculative == plain, and the result's parts.
"""

from __future__ import annotations

import json
import random
from typing import Literal

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen.calls.formats import normalize_tools, tool_choice_name, tool_format, tool_from
from structgen.calls.plan import plan_output
from structgen.errors import ConfigError
from structgen.masks.matcher import Matcher
from structgen.masks.vocab import Vocabulary


def get_weather(city: str, unit: Literal["c", "f"] = "c") -> str:
    """Current weather in a city.

    Args:
        city: the city name
        unit: temperature unit
    """
    return city


ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}}
NESTED = {"name": "book", "parameters": {"type": "object", "properties": {
    "guest": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                               "tags": {"type": "array", "items": {"enum": ["vip", "late"]},
                                                        "maxItems": 2}},
              "required": ["name"]},
    "nights": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["guest", "nights"]}}
TOOLS = normalize_tools([get_weather, ADD, NESTED])


def test_tool_specs() -> None:
    w = tool_from(get_weather)
    assert w.name == "get_weather" and w.description == "Current weather in a city."
    assert w.parameters["required"] == ["city"]
    assert w.parameters["properties"]["unit"] == {"enum": ["c", "f"], "description": "temperature unit"}
    assert tool_from(ADD).openai()["function"]["name"] == "add"
    pydantic = pytest.importorskip("pydantic")

    class Lookup(pydantic.BaseModel):
        """Look a word up."""

        word: str

    t = tool_from(Lookup)
    assert t.name == "Lookup" and t.description == "Look a word up." and "word" in t.parameters["properties"]
    with pytest.raises(ConfigError):
        normalize_tools([ADD, ADD])
    with pytest.raises(ConfigError):
        tool_choice_name({"name": "nope"}, TOOLS)
    with pytest.raises(ConfigError):
        tool_choice_name("sometimes", TOOLS)


@pytest.mark.parametrize("fmt,text,calls", [
    ("hermes", 'Let me add. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
     [("add", {"a": 1, "b": 2})]),
    ("llama3",
     '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 3, "b": 4}}',
     [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]', [("add", {"a": 1, "b": 2})]),
    ("hermes", "no call here", []),
    ("llama3", ' {"name": "add", "parameters": {"a": 1, "b": 2}}', []),  # not at the start: text
    ("hermes", 'x <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> y '
               '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
     [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]),
])
def test_formats_accept_and_parse(fmt: str, text: str, calls: list) -> None:
    f = tool_format(fmt)
    assert f.parse(text).calls == calls
    plan = plan_output(tools=TOOLS, tool_choice="auto", tool_format=fmt)
    m = Matcher(plan.grammar, VOCAB)
    ids = _bytes_tokens(text.encode())
    assert m.accept_tokens(ids) == len(ids) and m.is_accepting()
    if calls:  # "none" refuses every output with a call
        m = Matcher(plan_output(tools=TOOLS, tool_choice="none", tool_format=fmt).grammar, VOCAB)
        assert not (m.accept_tokens(ids) == len(ids) and m.is_accepting())


# a small vocabulary: every printable ASCII byte and newline, plus tokens that hold whole
# markers, markers merged with the text around them, and pieces of the envelope
_PIECES = ["<tool_call>", "<tool_call>\n", "\n</tool_call>", "</tool_call>", ". <tool", "_call>\n{",
           '{"name": "', '", "arguments": ', '", "parameters": ', "}\n</tool_call>", "[TOOL_CALLS]",
           "[TOOL_CALLS][{", "get_weather", "add", "book", '"city":"', '"a":', '"b":', '"guest":{"name":"',
           '"nights":', '"tags":["', "vip", "late", '"unit":"', '"}', "}}", "}; {", "}]", ", {", "<think>\n",
           "</think>", "</think>\n\n"]
_TOKENS = [bytes([b]) for b in range(32, 127)] + [b"\n"] + [p.encode() for p in _PIECES]
VOCAB = Vocabulary(_TOKENS + [None], [len(_TOKENS)])
EOS = len(_TOKENS)
_LONG = {i for i, t in enumerate(_TOKENS) if len(t) > 1}


def _bytes_tokens(data: bytes) -> list[int]:
    return [_TOKENS.index(bytes([b])) for b in data]


def _random_output(grammar, rng: random.Random, limit: int = 400) -> str | None:
    """A random walk through the masks: structural tokens preferred, EOS now and then;
    None when it does not finish within ``limit`` tokens."""
    m = Matcher(grammar, VOCAB)
    out: list[int] = []
    for _ in range(limit):
        allowed = m.allowed_token_ids()
        assert allowed, "a live state always allows some token"
        if EOS in allowed and rng.random() < 0.15:
            return VOCAB.decode_bytes(out).decode("utf-8")
        long = [t for t in allowed if t in _LONG]
        pick = rng.choice(long if long and rng.random() < 0.7 else allowed)
        if pick == EOS:
            return VOCAB.decode_bytes(out).decode("utf-8")
        assert m.accept_token(pick)
        out.append(pick)
    return None


def _check_calls(fmt_name: str, text: str, choice: str, parallel: bool) -> None:
    parsed = tool_format(fmt_name).parse(text)
    assert not parsed.errors, (text, parsed.errors)
    by_name = {t.name: t for t in TOOLS}
    for name, args in parsed.calls:
        jsonschema.validate(args, by_name[name].parameters)
    if choice == "required":
        assert parsed.calls
    if choice == "none":
        assert not parsed.calls
    if not parallel:
        assert len(parsed.calls) <= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["hermes", "llama3", "mistral"]), st.sampled_from(["auto", "required", "none"]),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_every_admitted_output_has_valid_calls(fmt: str, choice: str, parallel: bool, seed: int) -> None:
    plan = plan_output(tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel, tool_format=fmt)
    text = _random_output(plan.grammar, random.Random(seed))
    if text is not None:
        _check_calls(fmt, text, choice, parallel)
        reasoning, free, calls, errors = plan.split(text)
        assert not errors and len(calls) == len(tool_format(fmt).parse(text).calls)


def test_named_tool_choice_and_reasoning() -> None:
    plan = plan_output(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
                       tool_format="hermes")
    for seed in range(5):
        text = _random_output(plan.grammar, random.Random(seed))
        if text is not None:
            calls = tool_format("hermes").parse(text).calls
            assert calls and all(name == "add" for name, _ in calls)
    plan = plan_output(tools=TOOLS, tool_choice="required", reasoning=True, tool_format="hermes")
    m = Matcher(plan.grammar, VOCAB)
    assert m.forced_bytes() == b"<think>\n"
    text = ('<think>\nI should add </think\n> numbers</think>\n<tool_call>\n'
            '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    ids = _bytes_tokens(text.encode())
    assert m.accept_tokens(ids) == len(ids) and m.is_accepting()
    reasoning, free, calls, errors = plan.split(text)
    assert reasoning == "I should add </think\n> numbers" and calls[0].arguments == {"a": 1, "b": 2}
    assert not errors and free == ""
    m.rollback(len(ids))  # the answer must follow the first </think>: no call inside reasoning
    bad = _bytes_tokens(b'<think>\n</think>hello')
    assert m.accept_tokens(bad) < len(bad)


def test_reasoning_with_schema_and_opened_block() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    plan = plan_output(schema=schema, reasoning=True, prompt_text="<|im_start|>assistant\n<think>\n")
    m = Matcher(plan.grammar, VOCAB)
    assert m.forced_bytes() == b""  # the template opened the block: thinking starts at once
    text = 'hmm</think>\n{"x":3}'
    ids = _bytes_tokens(text.encode())
    assert m.accept_tokens(ids) == len(ids) and m.is_accepting()
    assert plan.split(text)[:2] == ("hmm", '{"x":3}')


@pytest.mark.assets
def test_generate_with_tools_tiny_model(tokenizer_by_alias) -> None:
    from _tiny_lm import build_tiny_llama

    import structgen
    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    lm = CausalLM(build_tiny_llama(tok, "biased"), tok)
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    for choice in ("required", "none", {"name": "add"}):
        kw = dict(messages=msgs, tools=TOOLS, tool_choice=choice, max_new_tokens=60, tool_format="hermes")
        plain = structgen.generate(lm, speculative=False, **kw)
        spec = structgen.generate(lm, **kw)
        assert spec.tokens == plain.tokens  # greedy speculative == plain
        assert spec.complete and spec.error is None
        if choice == "none":
            assert spec.tool_calls == []
        else:
            assert spec.tool_calls
            for call in spec.tool_calls:
                jsonschema.validate(call.arguments, {t.name: t for t in TOOLS}[call.name].parameters)
                assert call.id.startswith("call_") and json.loads(call.openai()["function"]["arguments"]) \
                    == call.arguments
    r = structgen.generate(lm, messages=msgs, reasoning=True, max_new_tokens=40,
                           schema={"type": "object", "properties": {"x": {"type": "integer"}},
                                   "required": ["x"]})
    assert r.complete and r.reasoning is not None and isinstance(r.value["x"], (int, float))


@pytest.mark.assets
def test_stream_with_tools_and_reasoning_tiny_model(tokenizer_by_alias) -> None:
    """structgen.stream with tools / reasoning: the joined events equal generate()'s result
    (reasoning, text, each call's name and arguments text), the ids of the streamed calls are
    those of the final result, and the tokens are generate()'s."""
    from _tiny_lm import build_tiny_llama

    import structgen
    from structgen.generation.api import StreamEvent
    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    lm = CausalLM(build_tiny_llama(tok, "biased"), tok)
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    cases = [dict(tools=TOOLS, tool_choice="required", tool_format="hermes"),
             dict(tools=TOOLS, tool_choice={"name": "add"}, tool_format="mistral", reasoning=True),
             dict(reasoning=True, schema=schema, thinking_budget=8)]
    for kw in cases:
        want = structgen.generate(lm, messages=msgs, max_new_tokens=60, **kw)
        events = list(structgen.stream(lm, messages=msgs, max_new_tokens=60, **kw))
        assert all(isinstance(e, StreamEvent) for e in events) and events[-1].kind == "done"
        done = events[-1].result
        assert done.tokens == want.tokens and done.text == want.text and done.reasoning == want.reasoning
        assert want.complete and done.error is None
        assert "".join(e.text for e in events if e.kind == "content") == want.text
        assert "".join(e.text for e in events if e.kind == "reasoning") == (want.reasoning or "")
        heads = [e for e in events if e.kind == "tool_call"]
        assert [(e.index, e.name) for e in heads] == [(k, c.name) for k, c in enumerate(want.tool_calls)]
        assert [e.id for e in heads] == [c.id for c in done.tool_calls]
        for k, call in enumerate(done.tool_calls):
            text = "".join(e.text for e in events if e.kind == "arguments" and e.index == k)
            assert json.loads(text) == call.arguments == want.tool_calls[k].arguments
            assert text == call.openai()["function"]["arguments"]
        if kw.get("schema"):
            assert done.value == want.value
    assert kw.get("tools") is None and all(isinstance(t, str) for t in structgen.stream(
        lm, messages=msgs, max_new_tokens=20, schema=schema))  # without tools: text as before


@pytest.mark.assets
def test_thinking_budget_tiny_model(tokenizer_by_alias) -> None:
    from _tiny_lm import build_tiny_llama

    import structgen
    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    lm = CausalLM(build_tiny_llama(tok, "random"), tok)
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    kw = dict(prompt="Think, then answer:", reasoning=True, thinking_budget=6, schema=schema,
              max_new_tokens=60)
    plain = structgen.generate(lm, speculative=False, **kw)
    spec = structgen.generate(lm, **kw)
    assert spec.tokens == plain.tokens and spec.complete and spec.error is None
    # the marker is forced right after the budget: it ends within the next few tokens
    opened = tok.decode(spec.tokens).index("<think>\n") + len("<think>\n")
    n_open = next(i for i in range(len(spec.tokens) + 1) if len(tok.decode(spec.tokens[:i])) >= opened)
    text = spec.extra["raw_text"]
    before = tok.decode(spec.tokens[:n_open + 6])  # the reasoning tokens the budget allows
    end = text.index("</think>") + len("</think>")
    assert len(before) <= end and "</think>".endswith(text[len(before):end]), text
    with pytest.raises(ConfigError):
        structgen.generate(lm, prompt="x", thinking_budget=-1, reasoning=True)


def test_special_control_token_writes_its_marker() -> None:
    class Tok:  # the tokenizer's view of the special ids
        def convert_ids_to_tokens(self, i: int) -> str:
            return {0: "[TOOL_CALLS]", 1: "<s>"}[i]

    toks = [None, None] + _TOKENS
    vocab = Vocabulary(toks + [None], [len(toks)], special_ids=[0, 1])
    plan = plan_output(tools=TOOLS, tool_choice="required", tool_format="mistral")
    given = plan.vocabulary(vocab, Tok())
    assert given.token_bytes[0] == b"[TOOL_CALLS]" and given.token_bytes[1] is None
    m = Matcher(plan.grammar, given)
    body = [2 + _TOKENS.index(bytes([b])) for b in b'[{"name": "add", "arguments": {"a": 1, "b": 2}}]']
    assert m.accept_tokens([0] + body) == len(body) + 1 and m.is_accepting()
    assert plan.split(given.decode_bytes([0] + body).decode())[2][0].arguments == {"a": 1, "b": 2}
