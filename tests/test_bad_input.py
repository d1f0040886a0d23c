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
from structgen import limits
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
    # a step clock (1 ms a read) instead of the machine's: the 0.05 s strike comes after a
    # fixed amount of work (the compiled kernels get the time left as a step budget), so it is
    # the timeout that fires however fast the machine is, not the state limit
    with limits.use_clock(limits.StepClock(step=0.001)):
        raises(CompileTimeoutError, lambda: structgen.compile_json_schema(
            schema, compile_options=CompileOptions(timeout_s=0.05)), seconds=60)


def test_compile_timeout_names_the_schema_location() -> None:
    big = {"type": "string", "pattern": "^(a|b)*a(a|b){18}$", "maxLength": 60}
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"$ref": "#/$defs/big"}},
              "additionalProperties": False, "$defs": {"big": big}}
    # the integer automaton and the object lowering have process-wide one-time set-up: do it
    # first, so that the short timeout below fires in the expensive part of this schema
    # whatever ran before
    structgen.compile_json_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                                   "additionalProperties": False})
    # a step clock (1 ms a read): where the deadline strikes depends on how often the compiler
    # read the clock, not on the machine. 5 ms is the 7th read, while lowering the $ref at
    # #/properties/s (reads 2-9 are the lowering's, one per subschema step); 0.3 s lets the
    # lowering finish and strikes inside the pattern's automaton, whose kernel gets the time
    # left as its step budget
    for timeout in (0.005, 0.3):  # fires while lowering the schema / while building the automaton
        with limits.use_clock(limits.StepClock(step=0.001)):
            e = raises(CompileTimeoutError, lambda t=timeout: structgen.compile_json_schema(
                schema, compile_options=CompileOptions(timeout_s=t)), seconds=60)
        assert isinstance(e, CompileTimeoutError)
        assert e.pointer in ("#/properties/s", "#/$defs/big") and e.pointer in str(e)


# ---------------------------------------------------------------------------
# every failure names the schema location and the keyword responsible
# ---------------------------------------------------------------------------

def located(exc: type[BaseException], schema: Any, seconds: float = 60, **copts: Any) -> tuple[str, str]:
    """Compile ``schema`` expecting ``exc``; its (pointer, keyword), both in the message."""
    e = raises(exc, lambda: structgen.compile_json_schema(  # open objects: no strict retry
        schema, compile_options=CompileOptions(**copts) if copts else None,
        for_generation=False), seconds=seconds)
    pointer, keyword = e.pointer, e.keyword  # type: ignore[attr-defined]
    assert pointer and keyword, str(e)
    assert pointer in str(e) and keyword in str(e), str(e)
    return pointer, keyword


def test_unsatisfiable_schema_names_the_empty_subschema_and_keyword() -> None:
    # "dims" requires a and b, and oneOf wants exactly one of {a}, {b} present: with both
    # present both branches match, so no object is valid at #/properties/dims (required)
    dims = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"], "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "dims": dims},
              "required": ["name", "dims"]}
    assert located(SchemaError, schema) == ("#/properties/dims", "oneOf")
    # the same through $ref: the contradiction lives in the definition
    schema = {"$defs": {"s": {"type": "string", "minLength": 3, "maxLength": 2}}, "type": "object",
              "properties": {"x": {"$ref": "#/$defs/s"}}, "required": ["x"]}
    ptr, kw = located(SchemaError, schema)
    assert ptr == "#/$defs/s" and kw in ("minLength", "maxLength")
    # at the root
    assert located(SchemaError, {"allOf": [{"type": "string"}, {"type": "integer"}]}) == ("#", "allOf")
    ptr, kw = located(SchemaError, {"type": "integer", "minimum": 10, "maximum": 1})
    assert ptr == "#" and kw in ("minimum", "maximum")


def test_intersection_limit_names_the_keyword_intersected() -> None:
    # a length bound intersected with a pattern whose DFA has 2**9 states: the product
    # automaton is what exceeds the limit, made for `pattern` at #/properties/code
    pat = "^(a|b)*a(a|b){8}$"
    schema = {"type": "object", "properties": {"n": {"type": "integer"},
                                               "code": {"type": "string", "pattern": pat, "maxLength": 60}}}
    assert located(CompileLimitError, schema, max_states=2000) == ("#/properties/code", "pattern")
    schema = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 60,
                                                         "not": {"pattern": pat}}}}
    assert located(CompileLimitError, schema, max_states=2000) == ("#/properties/code", "not")


def test_automaton_size_limit_names_the_keyword_that_makes_the_size() -> None:
    small = {"max_states": 2000}
    # a length bound on a plain string is a counted repetition (compact, however long), and so is
    # one on a pattern that is a single class repeated; the same bound on another pattern is a
    # product automaton that grows with the bound: the pattern is named
    plain = {"type": "object", "properties": {"name": {"type": "string"},
                                              "blob": {"type": "string", "maxLength": 5000}}}
    structgen.compile_json_schema(plain, compile_options=CompileOptions(**small))
    run = {"type": "object", "properties": {"name": {"type": "string"}, "blob": {
        "type": "string", "pattern": "^[a-z]*$", "maxLength": 5000}}}
    structgen.compile_json_schema(run, compile_options=CompileOptions(**small))
    blob = {"type": "object", "properties": {"name": {"type": "string"}, "blob": {
        "type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 5000}}}
    assert located(CompileLimitError, blob, **small) == ("#/properties/blob", "pattern")
    xs = {"type": "object", "properties": {"name": {"type": "string"}, "xs": {
        "type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}},
        "maxItems": 5000}}}
    assert located(CompileLimitError, xs, **small) == ("#/properties/xs", "maxItems")
    extra = {"type": "object", "properties": {"a": {
        "type": "object", "properties": {"x": {"type": "integer"}},
        "additionalProperties": {"type": "array", "items": {"type": "object", "properties": {
            "a": {"type": "string"}}}, "maxItems": 3000}}}}
    assert located(CompileLimitError, extra, **small) == ("#/properties/a/additionalProperties", "maxItems")
    # forty properties of the same size: no one of them is to blame, the object is
    many = {"type": "object", "properties": {"a": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "maxLength": 40} for i in range(40)}}}}
    assert located(CompileLimitError, many, **small) == ("#/properties/a", "properties")
    # seven property-name patterns: 2**7 regions of undeclared keys
    pats = {"type": "object", "properties": {"a": {"type": "object", "patternProperties": {
        f"^k{i}": {"type": "integer"} for i in range(7)}}}}
    assert located(CompileLimitError, pats, max_states=1000) == ("#/properties/a", "patternProperties")


def test_lowering_timeout_names_the_innermost_location_and_keyword() -> None:
    # the second oneOf branch of itemsObject refers back to the root, which has oneOf and
    # dependencies of its own: its complement (for oneOf) is what takes the time
    def fmt(t: str, fs: list[str]) -> dict:
        return {"properties": {"type": {"enum": [t]}, "format": {"enum": fs}}}
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "oneOf": [{"required": ["type"]}, {"required": ["$ref"]}],
        "properties": {"type": {"type": "string"}, "$ref": {"type": "string"}, "format": {"type": "string"},
                       "items": {"$ref": "#/definitions/itemsObject"}},
        "dependencies": {"format": {"oneOf": [fmt("integer", ["int32", "int64"]),
                                              fmt("number", ["float", "double"]),
                                              fmt("string", ["byte", "date", "date-time"])]}},
        "definitions": {"itemsObject": {"oneOf": [
            {"type": "object", "required": ["$ref"], "properties": {"$ref": {"type": "string"}},
             "additionalProperties": False},
            {"allOf": [{"$ref": "#"}, {"required": ["type"], "properties": {"type": {}, "format": {}},
                                       "additionalProperties": False}]}]}},
    }
    # A step clock (2 ms a read) makes the strike depend only on how often the lowering read
    # the clock, never on the machine's speed (on a slow machine a 0.5 s wall-clock deadline
    # struck at "#" "dependencies" instead). Left alone, this schema's lowering reads the clock
    # about 455 times before it gives up (too many alternatives); most of those reads are made
    # while complementing itemsObject's oneOf, in runs of about 20 broken by a few reads
    # elsewhere. 0.52 s is the 260th read, inside the run from the 251st to the 270th.
    clock = limits.StepClock(step=0.002)
    with limits.use_clock(clock):
        assert located(CompileTimeoutError, schema, timeout_s=0.52) == ("#/definitions/itemsObject", "oneOf")
    assert clock.reads < 300  # the deadline is honoured while normalising, too


def test_automaton_timeout_names_the_rule_location_and_keyword() -> None:
    structgen.compile_json_schema({"type": "string", "pattern": "^[a-c]+$"})  # warm the regex tables
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {
        "type": "string", "pattern": "^(a|b)*a(a|b){18}$", "maxLength": 60}}}
    # a step clock (1 ms a read): the lowering reads it fewer than twenty times, so the pattern's
    # automaton starts with nearly all of the 0.5 s left, which its kernel gets as a step budget
    # too small for 2**19 states: the timeout strikes there on any machine
    with limits.use_clock(limits.StepClock(step=0.001)):
        assert located(CompileTimeoutError, schema, timeout_s=0.5) == ("#/properties/s", "pattern")


def test_structural_keyword_fallback() -> None:
    from structgen.frontends.json_schema.document import SchemaDoc
    from structgen.frontends.json_schema.keywords import structural_keyword

    big = {"properties": {f"p{i}": {"type": "integer"} for i in range(20)}}
    doc = SchemaDoc({"properties": {"a": {"type": "string"}},
                     "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
                     "$defs": {"big": big}, "$ref": "#/$defs/big"})
    assert structural_keyword(doc, "#") == "$ref"  # its target is the largest subschema here
    assert structural_keyword(SchemaDoc({"type": "array", "items": big, "contains": {"type": "integer"}}),
                              "#") == "items"
    assert structural_keyword(doc, "#/properties/a") == "type"
    assert structural_keyword(doc, "#/$defs/big") == "properties"


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


def test_applicator_explosion_names_an_applicator() -> None:
    """allOf of nine two-way anyOfs over object shapes needs 2^9 = 512 alternatives (more
    than the normaliser keeps): the error names the applicator and where it is."""
    branches = [{"anyOf": [{"type": "object", "required": [f"a{i}"]},
                           {"type": "object", "required": [f"b{i}"], "properties": {f"a{i}": False}}]}
                for i in range(9)]
    schema = {"type": "object", "properties": {"x": {"allOf": branches}}}
    e = raises(UnsupportedFeatureError, lambda: structgen.compile_json_schema(schema))
    assert isinstance(e, UnsupportedFeatureError)
    assert e.pointer is not None and e.pointer.startswith("#/properties/x")
    assert e.keyword in ("allOf", "anyOf")
    assert e.keyword in str(e)


def test_compile_grammar_rejects_source_text() -> None:
    """compile_grammar takes the IR; Lark or schema text passed to it is a TypeError that names
    the front-ends, not an AttributeError from deep inside the compiler."""
    for wrong in ('start: "a"\n', {"type": "string"}, None):
        with pytest.raises(TypeError, match="compile_lark"):
            structgen.compile_grammar(wrong)  # type: ignore[arg-type]
