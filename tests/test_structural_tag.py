"""Structural tags (structgen.calls.structural_tag): the language of each format, checked
against hand-written cases and, for tool calls, against an independent parser (a regular
expression for the tag frame and ``jsonschema`` for the arguments) over random walks."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from structgen.calls.structural_tag import compile_structural_tag
from structgen.errors import ConfigError, UnsupportedFeatureError

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city"], "additionalProperties": False}


def _tag(name: str, newline: bool = True, schema: object = WEATHER) -> dict:
    nl = "\n" if newline else ""
    return {"type": "tag", "begin": f'<tool_call>{nl}{{"name": "{name}", "arguments": ',
            "content": {"type": "json_schema", "json_schema": schema, "style": "json"},
            "end": f"}}{nl}</tool_call>"}


def _st(fmt: dict) -> dict:
    return {"type": "structural_tag", "format": fmt}


HERMES = _st({"type": "tags_with_separator", "tags": [_tag("get_weather"), _tag("get_weather", False)],
              "separator": "\n", "at_least_one": True, "stop_after_first": False})


def _call(city: str, nl: bool = True) -> str:
    n = "\n" if nl else ""
    return f'<tool_call>{n}{{"name": "get_weather", "arguments": {{"city":"{city}"}}}}{n}</tool_call>'


@pytest.mark.parametrize("text, ok", [
    (_call("Oslo"), True),
    (_call("Oslo", False), True),
    (_call("Oslo") + "\n" + _call("Rome", False), True),
    ("", False),                                                    # at_least_one
    (_call("Oslo") + _call("Rome"), False),                         # the separator is missing
    (_call("Oslo").replace('"Oslo"}', '"Oslo","x":1}'), False),     # strict arguments
    (_call("Oslo").replace("get_weather", "get_time"), False),      # another tool
    (_call("Oslo") + " and more", False),                           # nothing after the tags
])
def test_tags_with_separator(text: str, ok: bool) -> None:
    assert compile_structural_tag(HERMES).accepts(text) is ok


def test_stop_after_first_and_optional() -> None:
    one = _st({"type": "tags_with_separator", "tags": [_tag("get_weather")], "separator": "",
               "at_least_one": False, "stop_after_first": True})
    g = compile_structural_tag(json.dumps(one))  # JSON text works as well as a dict
    assert g.accepts("") and g.accepts(_call("A"))
    assert not g.accepts(_call("A") + _call("B"))


def test_triggered_tags_free_text() -> None:
    st = _st({"type": "triggered_tags", "triggers": ["<tool_call>"],
              "tags": [_tag("get_weather", False)], "at_least_one": False, "stop_after_first": False})
    g = compile_structural_tag(st)
    assert g.accepts("just text")
    assert g.accepts("let me check " + _call("Oslo", False) + " done")
    assert g.accepts(_call("A", False) + _call("B", False))
    assert not g.accepts('text <tool_call>{"name": "other"')      # a trigger opens a tag
    assert not g.accepts("text <tool_call> not a call")
    required = dict(st["format"], at_least_one=True, stop_after_first=True)
    g1 = compile_structural_tag(_st(required))
    assert not g1.accepts("just text")
    assert g1.accepts("so: " + _call("A", False))
    assert not g1.accepts("so: " + _call("A", False) + " more")   # ends after the first tag


def test_tag_with_any_text_stops_at_the_end_marker() -> None:
    g = compile_structural_tag(_st({"type": "sequence", "elements": [
        {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
        {"type": "const_string", "value": "answer: "},
        {"type": "regex", "pattern": "[0-9]+"}]}))
    assert g.accepts("<think>a < b</think>answer: 42")
    assert not g.accepts("<think>x</think>y</think>answer: 1")
    assert not g.accepts("<think>x</think>answer: x")


def test_or_optional_star_plus_and_end_alternatives() -> None:
    g = compile_structural_tag(_st({"type": "sequence", "elements": [
        {"type": "or", "elements": [{"type": "const_string", "value": "a"},
                                    {"type": "const_string", "value": "b"}]},
        {"type": "optional", "content": {"type": "const_string", "value": "?"}},
        {"type": "star", "content": {"type": "const_string", "value": "x"}},
        {"type": "plus", "content": {"type": "const_string", "value": "y"}},
        {"type": "tag", "begin": "[", "content": {"type": "json_schema", "json_schema": True},
         "end": ["]", "]]"]}]}))
    for text in ("ay[1]", "b?xxy[{}]]", "ayyy[\"s\"]"):
        assert g.accepts(text), text
    for text in ("a[1]", "cy[1]", "ay[1", "ay[1]]]"):
        assert not g.accepts(text), text


@pytest.mark.parametrize("fmt, keyword", [
    ({"type": "grammar", "grammar": 'root ::= "a"'}, "grammar"),
    ({"type": "token_triggered_tags", "trigger_tokens": [1], "tags": []}, "token_triggered_tags"),
    ({"type": "json_schema", "json_schema": True, "style": "qwen_xml"}, "style"),
    ({"type": "json_schema", "json_schema": True, "any_order": True}, "any_order"),
])
def test_unsupported_formats_are_refused_with_their_pointer(fmt: dict, keyword: str) -> None:
    with pytest.raises(UnsupportedFeatureError) as info:
        compile_structural_tag(_st({"type": "sequence", "elements": [
            {"type": "const_string", "value": "x"}, fmt]}))
    assert info.value.keyword == keyword
    assert info.value.pointer == "/format/elements/1"


@pytest.mark.parametrize("spec", ["not json", "[]", {"type": "structural_tag"},
                                  _st({"type": "sequence", "elements": []}),
                                  _st({"type": "tag", "begin": 3, "content": {"type": "any_text"},
                                       "end": ""}),
                                  _st({"type": "triggered_tags", "triggers": ["<a>"],
                                       "tags": [_tag("f")]})])
def test_malformed_tags_are_typed_errors(spec: object) -> None:
    with pytest.raises((ConfigError, UnsupportedFeatureError)):
        compile_structural_tag(spec)


def test_random_walks_are_valid_tool_calls() -> None:
    """Random byte walks through the compiled grammar, each finished when the grammar allows
    it, parse as tool calls whose arguments validate (an oracle independent of the grammar)."""
    g = compile_structural_tag(HERMES)
    eng = g.engine
    frame = re.compile(r'<tool_call>(\n?)\{"name": "get_weather", "arguments": (.*?)\}\1</tool_call>', re.S)
    rng = random.Random(7)
    for _ in range(40):
        cid = eng.start
        out = bytearray()
        while True:
            live = eng.live_bytes(cid)
            if eng.is_accepting(cid) and (not len(live) or rng.random() < 0.5):
                break
            b = int(live[rng.randrange(len(live))])
            out.append(b)
            cid = eng.step(cid, b)
            assert len(out) < 5000
        text = out.decode("utf-8")
        rest = text
        found = 0
        while rest:
            m = frame.match(rest)
            assert m, text
            jsonschema.validate(json.loads(m.group(2)), WEATHER)
            found += 1
            rest = rest[m.end():]
            if rest:
                assert rest.startswith("\n"), text
                rest = rest[1:]
        assert found >= 1
