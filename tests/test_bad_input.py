"""Bad input gets a typed error with a location -- never a hang, a crash or a wrong answer.

Each case runs under a wall-clock guard (SIGALRM) so a hang fails the test instead of
stalling CI.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import structgen
from structgen.config import CompileOptions
from structgen.errors import (
    CompileLimitError,
    CompileTimeoutError,
    GrammarError,
    GrammarSyntaxError,
    RegexError,
    SchemaError,
    StructgenError,
    UnsupportedFeatureError,
)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def boom(_s: int, _f: Any) -> None:
        raise AssertionError(f"no answer within {seconds} s (hang)")

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def raises(exc: type[BaseException], fn: Callable[[], Any], seconds: float = 60) -> BaseException:
    with deadline(seconds), pytest.raises(exc) as info:
        fn()
    return info.value


def test_malformed_json_text_has_line_and_column() -> None:
    e = raises(SchemaError, lambda: structgen.compile_json_schema('{"type": "object",\n "properties": {'))
    assert "line" in str(e).lower()


def test_unknown_ref_names_the_ref() -> None:
    e = raises(SchemaError, lambda: structgen.compile_json_schema(
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}))
    assert "missing" in str(e)
    assert isinstance(e, SchemaError) and "/properties/a" in e.pointer


def test_wrong_keyword_type_names_keyword_and_pointer() -> None:
    e = raises(SchemaError, lambda: structgen.compile_json_schema(
        {"type": "object", "properties": {"a": {"type": "string", "maxLength": "ten"}}}))
    assert isinstance(e, SchemaError)
    assert e.keyword == "maxLength" and "/properties/a" in e.pointer


def test_contradictory_bounds_at_root_is_an_error() -> None:
    e = raises(SchemaError, lambda: structgen.compile_json_schema(
        {"type": "integer", "minimum": 10, "maximum": 1}))
    assert isinstance(e, SchemaError)


def test_contradictory_bounds_below_root_compile_to_exact_language() -> None:
    # an optional property that can never be present: jsonschema-correct, not an error
    g = structgen.compile_json_schema({"type": "object", "properties": {
        "a": {"type": "string", "minLength": 5, "maxLength": 2}}, "additionalProperties": False})
    assert g.accepts("{}") and not g.accepts('{"a":"xyz"}')


def test_invalid_regex_pattern_is_located() -> None:
    e = raises(StructgenError, lambda: structgen.compile_json_schema(
        {"type": "string", "pattern": "a(b"}))
    assert isinstance(e, (SchemaError, RegexError))
    text = str(e)
    assert "pattern" in text or "regex" in text.lower()


def test_backreference_is_unsupported_not_ignored() -> None:
    raises((UnsupportedFeatureError, RegexError, SchemaError),  # type: ignore[arg-type]
           lambda: structgen.compile_json_schema({"type": "string", "pattern": "^(a)\\1$"}))


def test_ten_thousand_value_enum_compiles_or_fails_cleanly() -> None:
    values = [f"value-{i:05d}" for i in range(10_000)]
    with deadline(120):
        try:
            g = structgen.compile_json_schema({"enum": values})
        except CompileLimitError:
            return
    assert g.accepts(json.dumps("value-09999")) and not g.accepts(json.dumps("value-10000"))


def test_deep_nesting_no_crash() -> None:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(200):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"],
                  "additionalProperties": False}
    with deadline(120):
        try:
            g = structgen.compile_json_schema(schema)
        except StructgenError:
            return  # a typed error (depth limit) is acceptable
    doc = '{"a":' * 200 + "1" + "}" * 200
    assert g.accepts(doc)


def test_regex_whose_dfa_explodes_is_determinised_lazily() -> None:
    # (a|b)*a(a|b){n}: the minimal DFA needs 2**(n+1) states. Rules are determinised lazily,
    # so compiling is linear and only the DFA states a request visits are ever built.
    schema = {"type": "string", "pattern": "^(a|b)*a(a|b){24}$"}
    with deadline(60):
        g = structgen.compile_json_schema(
            schema, compile_options=CompileOptions(max_states=20_000, timeout_s=20))
    oracle = re.compile(schema["pattern"])
    for s in ("bbbbba" + "ab" * 12, "a" + "b" * 24, "b" * 30, "a" * 24, "ab" * 20):
        assert g.accepts(json.dumps(s)) == bool(oracle.search(s)), s
    assert g.num_dfa_states < 2_000


def test_intersection_whose_dfa_explodes_hits_the_limit() -> None:
    # a length bound intersected with the exploding pattern needs the product automaton
    # eagerly: that is where the state limit applies
    schema = {"type": "string", "pattern": "^(a|b)*a(a|b){24}$", "maxLength": 60}
    raises(CompileLimitError, lambda: structgen.compile_json_schema(
        schema, compile_options=CompileOptions(max_states=20_000, timeout_s=20)), seconds=120)


def test_compile_timeout_is_configurable() -> None:
    schema = {"type": "string", "pattern": "^(a|b)*a(a|b){18}$", "maxLength": 60}
    raises(CompileLimitError, lambda: structgen.compile_json_schema(
        schema, compile_options=CompileOptions(timeout_s=0.05)), seconds=60)


def test_compile_timeout_names_the_schema_location() -> None:
    big = {"type": "string", "pattern": "^(a|b)*a(a|b){18}$", "maxLength": 60}
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"$ref": "#/$defs/big"}},
              "additionalProperties": False, "$defs": {"big": big}}
    for timeout in (0.01, 0.3):  # fires while lowering the schema / while building the automaton
        e = raises(CompileTimeoutError, lambda t=timeout: structgen.compile_json_schema(
            schema, compile_options=CompileOptions(timeout_s=t)), seconds=60)
        assert isinstance(e, CompileTimeoutError)
        assert e.pointer in ("#/properties/s", "#/$defs/big") and e.pointer in str(e)


def test_unsupported_keyword_names_keyword_and_pointer() -> None:
    e = raises(UnsupportedFeatureError, lambda: structgen.compile_json_schema(
        {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "object"},
                                                  "uniqueItems": True}}}))
    assert isinstance(e, UnsupportedFeatureError)
    assert e.keyword == "uniqueItems" and "/properties/xs" in e.pointer


def test_lark_syntax_error_has_line_column_caret() -> None:
    text = 'start: "a" b\nb: "x" | | )\n'
    e = raises(GrammarSyntaxError, lambda: structgen.compile_lark(text))
    assert isinstance(e, GrammarError)
    assert e.line == 2 and e.column is not None
    assert "^" in str(e)


def test_lark_undefined_rule() -> None:
    raises(GrammarError, lambda: structgen.compile_lark('start: "a" missing_rule\n'))


def test_lark_left_recursion_is_handled_or_reported() -> None:
    with deadline(60):
        g = structgen.compile_lark('start: start "+" NUM | NUM\nNUM: /[0-9]+/\n')
    assert g.accepts("1+22+3") and not g.accepts("1++2")
