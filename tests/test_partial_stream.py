"""Typed partial streaming (issue 41): the JSON event reader, ``stream(partial=True)`` and
``stream_model``.

The oracle is the final text: the events are a function of it (any split of the text into
pieces gives the same events as feeding it whole), every ``value`` event equals
``json.loads(final)`` at its pointer, and every partial document only holds values of the
final one.
"""

from __future__ import annotations

import enum
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import structgen
from structgen.errors import ConfigError, ModelValidationError
from structgen.generation.partial import PartialJsonReader, json_pointer

NESTED_SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string"},
        "kind": {"enum": ["a", "b/c", "d~e"]},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "n": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}},
            "ok": {"type": ["boolean", "null"]}}, "required": ["n"]}},
        "opt": {"type": "integer"}},
     "required": ["name", "items"]},
    {"type": "array", "items": {"type": "array", "items": {"type": ["integer", "string", "null"]}}},
    {"type": "object", "additionalProperties": {"type": "number"}},
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


def read_all(pieces: list[str], *, string_deltas: bool = False) -> tuple[list, PartialJsonReader, list]:
    """Feed ``pieces``; returns the events, the reader and the snapshot of the document
    after each piece's events (checked against the final value)."""
    reader = PartialJsonReader(string_deltas=string_deltas)
    events, snapshots = [], []
    for piece in pieces:
        events += reader.feed(piece)
        snapshots.append(json.loads(json.dumps(reader.document)))
    events += reader.finish()
    return events, reader, snapshots


def at(doc, pointer: str):
    for part in pointer.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    return doc


def is_subdocument(part, final) -> bool:
    """Every value ``part`` holds is ``final``'s at the same place (containers may be shorter)."""
    if isinstance(part, dict):
        return isinstance(final, dict) and all(k in final and is_subdocument(v, final[k])
                                               for k, v in part.items())
    if isinstance(part, list):
        return isinstance(final, list) and len(part) <= len(final) and \
            all(is_subdocument(v, f) for v, f in zip(part, final))
    return part == final and type(part) is type(final)


def split(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def check_events(text: str, pieces: list[str]) -> None:
    final = json.loads(text)
    whole, _, _ = read_all([text], string_deltas=True)
    events, reader, snapshots = read_all(pieces, string_deltas=True)
    assert reader.complete and reader.document == final
    plain = [e for e in events if e.kind != "string_delta"]
    assert plain == [e for e in whole if e.kind != "string_delta"]  # a function of the final text
    begun: list[str] = []
    deltas: dict[str, str] = {}
    for e in events:
        if e.kind == "begin":
            begun.append(e.pointer)
        elif e.kind == "string_delta":
            deltas[e.pointer] = deltas.get(e.pointer, "") + e.value
        else:
            value = at(final, e.pointer)
            assert e.value == value and type(e.value) is type(value), (e, value)
            if isinstance(value, str):
                assert deltas.get(e.pointer, "") == value
    # every value begins once, in document order
    assert begun == [e.pointer for e in whole if e.kind == "begin"]
    assert len(begun) == sum(1 for e in plain if e.kind != "begin")
    for snap in snapshots:
        assert snap is None or is_subdocument(snap, final)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values, cuts=st.lists(st.integers(0, 400), max_size=30),
       style=st.sampled_from(["default", "compact", "indent", "ascii"]))
def test_events_do_not_depend_on_the_split(value, cuts, style) -> None:
    text = {"default": lambda v: json.dumps(v, ensure_ascii=False),
            "compact": lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")),
            "indent": lambda v: json.dumps(v, ensure_ascii=False, indent=2),
            "ascii": lambda v: json.dumps(v)}[style](value)
    check_events(text, split(text, cuts))


@pytest.mark.parametrize("schema", range(len(NESTED_SCHEMAS)))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_events_over_schema_instances(schema, data) -> None:
    from hypothesis_jsonschema import from_schema

    instance = data.draw(from_schema(NESTED_SCHEMAS[schema]))
    text = json.dumps(instance, ensure_ascii=data.draw(st.booleans()))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=40))
    check_events(text, split(text, cuts))


def test_one_character_at_a_time_with_escapes_and_numbers() -> None:
    text = ('{"a~/b": [1, {"s": "q\\"\\\\\\u00e9\\ud83d\\ude00 \\n"}, -2.5e-3, [], {}, [[]]],'
            ' "t": true, "f": false, "z": null, "n": 120}')
    check_events(text, list(text))
    events, _, _ = read_all(list(text), string_deltas=True)
    kinds = [(e.kind, e.pointer) for e in events if e.kind != "string_delta"]
    assert kinds[:4] == [("begin", ""), ("begin", "/a~0~1b"), ("begin", "/a~0~1b/0"), ("value", "/a~0~1b/0")]
    assert ("end", "/a~0~1b/5/0") in kinds and kinds[-1] == ("end", "")
    emoji = [e.value for e in events if e.kind == "string_delta" and e.pointer == "/a~0~1b/1/s"]
    assert "😀" in emoji and all("\ud83d" not in d for d in emoji)  # a surrogate pair is never split


def test_events_arrive_with_their_closing_character() -> None:
    reader = PartialJsonReader()
    assert [e.kind for e in reader.feed('{"a": "x')] == ["begin", "begin"]
    assert [(e.kind, e.value) for e in reader.feed('y", "n": 1')] == [("value", "xy"), ("begin", None)]
    assert reader.document == {"a": "xy"}  # a number is not complete before the next character
    assert [(e.kind, e.pointer, e.value) for e in reader.feed("2}")] == \
        [("value", "/n", 12), ("end", "", {"a": "xy", "n": 12})]
    assert reader.complete and reader.finish() == []
    top = PartialJsonReader()
    assert [e.kind for e in top.feed("-1.5")] == ["begin"]
    assert [(e.kind, e.value) for e in top.finish()] == [("value", -1.5)] and top.complete


def test_not_json_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot come here"):
        PartialJsonReader().feed('{"a" 1}')
    with pytest.raises(ConfigError):
        PartialJsonReader().feed("[1] 2")
    assert json_pointer("/a", "b/c~") == "/a/b~1c~0" and json_pointer("", 3) == "/3"


def test_reader_cost_per_character() -> None:
    """The reader is linear: a ~10 KB document in 4-character pieces reads in well under a
    millisecond per token's worth of text (generation takes tens of milliseconds a token)."""
    doc = {"items": [{"id": i, "name": f"item \"{i}\" é", "score": i / 7, "tags": ["x", "y"],
                      "ok": i % 2 == 0, "none": None} for i in range(120)]}
    text = json.dumps(doc, ensure_ascii=False)
    pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
    read_all(pieces[:50])  # warm up
    reader = PartialJsonReader()
    start = time.perf_counter()
    for piece in pieces:
        reader.feed(piece)
    elapsed = time.perf_counter() - start
    assert reader.document == doc
    per_piece = elapsed / len(pieces)
    print(f"{len(text)} chars: {elapsed * 1e3:.2f} ms, {per_piece * 1e6:.2f} us per 4-char piece")
    assert per_piece < 1e-3


# --- generation -----------------------------------------------------------------------------

PARTIAL_SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 8},
    "kind": {"enum": ["open", "closed"]},
    "rows": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -50, "maximum": 500}, "w": {"type": "number"}},
        "required": ["x", "w"], "additionalProperties": False}},
    "note": {"type": ["string", "null"], "maxLength": 6}},
    "required": ["title", "kind", "rows"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny_lm(tokenizer_by_alias):
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    return CausalLM(build_tiny_llama(tok, "random"), tok)


@pytest.mark.assets
@pytest.mark.parametrize("prompt", ["Rows as JSON:", "Give a record:"])
def test_stream_partial_matches_generate(tiny_lm, prompt) -> None:
    plain = structgen.generate(tiny_lm, schema=PARTIAL_SCHEMA, prompt=prompt, max_new_tokens=90)
    events = list(structgen.stream(tiny_lm, schema=PARTIAL_SCHEMA, prompt=prompt, max_new_tokens=90,
                                   partial=True, string_deltas=True))
    assert events[-1].kind == "done" and events[-1].result.text == plain.text
    assert events[-1].result.value == plain.value
    text = "".join(e.text for e in events if e.kind == "content")
    assert text == plain.text
    final = json.loads(text)
    # each event comes in the step whose text holds its closing character: replaying the
    # text step by step through a fresh reader gives the same events at the same steps
    replay = PartialJsonReader(string_deltas=True)
    expected: list = []
    seen: list = []
    for e in events:
        if e.kind == "content":
            assert [(x.kind, x.pointer, x.value) for x in seen] == expected
            expected, seen = [(x.kind, x.pointer, x.value) for x in replay.feed(e.text)], []
        elif e.kind != "done":
            seen.append(e)
            if e.kind in ("value", "end"):
                assert e.value == at(final, e.pointer)
            assert is_subdocument(json.loads(json.dumps(e.partial)), final)
    assert [(x.kind, x.pointer, x.value) for x in seen] == expected + \
        [(x.kind, x.pointer, x.value) for x in replay.finish()]


@pytest.mark.assets
def test_partial_needs_a_schema(tiny_lm) -> None:
    with pytest.raises(ConfigError, match="partial"):
        next(structgen.stream(tiny_lm, regex="[a-z]+", prompt="x", partial=True))
    with pytest.raises(ConfigError, match="string_deltas"):
        next(structgen.stream(tiny_lm, schema=PARTIAL_SCHEMA, prompt="x", string_deltas=True))


@pytest.mark.assets
def test_stream_model_partials_agree_with_the_final_instance(tiny_lm) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Kind(str, enum.Enum):
        OPEN = "open"
        CLOSED = "closed"

    class Row(pydantic.BaseModel):
        x: int = pydantic.Field(ge=-50, le=500)
        w: float

    class Inner(pydantic.BaseModel):
        label: str = pydantic.Field(max_length=5)
        row: Row

    class Record(pydantic.BaseModel):
        title: str = pydantic.Field(max_length=8)
        kind: Kind
        inner: Inner
        rows: list[Row] = pydantic.Field(max_length=2)

    for prompt in ["Record:", "Another record please:"]:
        expected = structgen.generate_model(tiny_lm, Record, prompt, max_new_tokens=120)
        got = list(structgen.stream_model(tiny_lm, Record, prompt, max_new_tokens=120))
        assert got and got[-1] == expected
        assert isinstance(got[-1].kind, Kind)
        for part in got[:-1]:
            assert isinstance(part, Record)
            check_partial_model(part, got[-1])


def check_partial_model(part, final) -> None:
    import pydantic

    for name in part.model_fields_set:
        value = getattr(part, name)
        if isinstance(value, pydantic.BaseModel) and value != getattr(final, name):
            check_partial_model(value, getattr(final, name))  # a nested partial instance
        else:
            assert value == getattr(final, name), name


@pytest.mark.assets
def test_stream_model_cut_short_is_typed(tiny_lm) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Many(pydantic.BaseModel):
        values: list[int] = pydantic.Field(min_length=30)

    with pytest.raises(ModelValidationError) as info:
        list(structgen.stream_model(tiny_lm, Many, "numbers:", max_new_tokens=5, on_budget="cut"))
    assert info.value.finish_reason == "length"


# --- structgen serve ------------------------------------------------------------------------

TICKET = {"type": "object", "properties": {
    "status": {"enum": ["open", "closed", "pending"]},
    "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    "labels": {"type": "array", "maxItems": 2, "items": {"enum": ["ui", "db"]}}},
    "required": ["status", "priority", "labels"], "additionalProperties": False}


@pytest.fixture(scope="module")
def served(tiny_lm):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    openai = pytest.importorskip("openai")
    from _servers import running

    from structgen.serving.app import create_app
    from structgen.serving.engine import Engine

    engine = Engine(tiny_lm, max_running=2, max_queued=8, default_max_tokens=64, compile_workers=1)
    with running(create_app(engine, model_name="tiny")) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def _ticket_stream(client, **extra):
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "A ticket as JSON."}], stream=True,
        max_tokens=60, response_format={"type": "json_schema",
                                        "json_schema": {"name": "ticket", "schema": TICKET}}, **extra)


@pytest.mark.assets
def test_serve_partial_events_reach_the_openai_client(served) -> None:
    replay = PartialJsonReader()
    text, events = "", []
    for chunk in _ticket_stream(served, stream_options={"structgen_partial": True}):
        step = (chunk.model_extra or {}).get("structgen_partial")
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            text += delta
            # a chunk carries the events its own text completes
            assert [(e["kind"], e["pointer"]) for e in step] == \
                [(e.kind, e.pointer) for e in replay.feed(delta)]
        events += step or []
    final = json.loads(text)
    values = {e["pointer"]: e["value"] for e in events if e["kind"] == "value"}
    assert values["/status"] == final["status"] and values["/priority"] == final["priority"]
    assert all(values[f"/labels/{i}"] == v for i, v in enumerate(final["labels"]))
    assert events[0] == {"kind": "begin", "pointer": ""} and events[-1] == {"kind": "end", "pointer": ""}


@pytest.mark.assets
def test_serve_plain_client_is_unaffected(served) -> None:
    for chunk in _ticket_stream(served):
        assert "structgen_partial" not in (chunk.model_extra or {})
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError, match="structgen_partial"):
        served.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       stream=True, stream_options={"structgen_partial": True})
