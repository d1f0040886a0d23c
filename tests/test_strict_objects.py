"""Strict mode (``JsonSchemaOptions.strict``, generation's default): objects get only their
declared keys, prefix arrays no extra items; never an invalid value, never an empty language.

Oracles: ``jsonschema`` with the original schema (every strict output is valid) and with a
hand-written closed twin of each schema (``additionalProperties: false``,
``unevaluatedProperties: false``, ``items: false`` placed where the documented rules close):
the strict grammar accepts exactly the twin's valid values. Candidate values come from
``hypothesis`` (keys drawn from the schema's names plus undeclared ones) and from
``hypothesis_jsonschema.from_schema``; random schemas from tests/test_json_schema.py check
that strict is a narrowing of the open grammar and that every value it accepts is valid.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_json_schema import EXAMPLES, _schemas, json_values

import structgen
from structgen.config import JsonSchemaOptions
from structgen.errors import CompileLimitError, ConfigError, SchemaError, UnsupportedFeatureError
from structgen.frontends.constraint import compile_constraint
from structgen.json_schema import canonical_json, compile_json_schema, schema_warnings


def _valid(schema: Any, x: Any) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema).is_valid(x)


def strict(schema: Any) -> Any:
    return compile_json_schema(schema, strict=True, for_generation=False)


def open_(schema: Any) -> Any:
    return compile_json_schema(schema, for_generation=False)


CAT = {"properties": {"kind": {"const": "cat"}, "meow": {"type": "string"}}, "required": ["kind"]}
DOG = {"properties": {"kind": {"const": "dog"}, "bark": {"type": "integer"}}, "required": ["kind"]}
X_STRINGS = {"^x_": {"type": "string"}}

# (name, schema, closed twin, values the strict grammar must accept, values it must reject)
CASES: list[tuple[str, Any, Any, list[Any], list[Any]]] = [
    ("properties",
     {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name"]},
     {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name"], "additionalProperties": False},
     [{"name": "a"}, {"name": "a", "age": 1}],
     [{"name": "a", "languages": [17, 18, 19]}, {"name": "a", "zz": 1}]),
    ("allOf",
     {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "integer"}}}]},
     {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "integer"}}}],
      "unevaluatedProperties": False},
     [{"a": 1, "b": 2}, {"a": 1}, {"b": 2}, {}, 3, "a"],
     [{"a": 1, "zz": 2}, {"zz": 1}]),
    ("anyOf",
     {"anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     {"anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]}],
      "unevaluatedProperties": False},
     [{"a": 1}, {"b": "x"}, {"a": 1, "b": "x"}],
     # b is only declared by the branch that fails here: not evaluated, not allowed
     [{"a": 1, "b": 2}, {"a": 1, "zz": 1}]),
    ("oneOf discriminated",
     {"oneOf": [CAT, DOG]},
     {"oneOf": [CAT, DOG], "unevaluatedProperties": False},
     [{"kind": "cat", "meow": "a"}, {"kind": "dog", "bark": 1}],
     [{"kind": "cat", "bark": 1}, {"kind": "dog", "meow": "a"}]),
    ("$ref and nesting",
     {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
      "type": "object", "properties": {"p": {"$ref": "#/$defs/P"},
                                       "q": {"type": "array", "items": {"$ref": "#/$defs/P"}},
                                       "meta": {"type": "object"}}},
     {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}},
                      "additionalProperties": False}},
      "type": "object", "properties": {"p": {"$ref": "#/$defs/P"},
                                       "q": {"type": "array", "items": {"$ref": "#/$defs/P"}},
                                       "meta": {"type": "object"}},
      "additionalProperties": False},
     [{"p": {"x": 1}, "q": [{"x": 2}, {}]}, {"meta": {"anything": [1]}}],
     [{"p": {"y": 1}}, {"q": [{"x": 1, "y": 2}]}, {"zz": 1}]),
    ("$ref in place",
     {"$defs": {"B": {"properties": {"b": {"type": "integer"}}}},
      "$ref": "#/$defs/B", "properties": {"a": {"type": "integer"}}},
     {"$defs": {"B": {"properties": {"b": {"type": "integer"}}}},
      "$ref": "#/$defs/B", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False},
     [{"a": 1, "b": 2}],
     [{"a": 1, "zz": 2}]),
    ("if/then/else",
     {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}},
      "if": {"properties": {"kind": {"const": "a"}}},
      "then": {"properties": {"x": {"type": "integer"}}}, "else": {"properties": {"y": {"type": "string"}}}},
     {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}},
      "if": {"properties": {"kind": {"const": "a"}}},
      "then": {"properties": {"x": {"type": "integer"}}}, "else": {"properties": {"y": {"type": "string"}}},
      "unevaluatedProperties": False},
     [{"kind": "a", "x": 1}, {"kind": "b", "y": "s"}],
     [{"kind": "a", "y": "s"}, {"kind": "b", "x": 1}]),
    ("dependentSchemas",
     {"type": "object", "properties": {"card": {"type": "string"}},
      "dependentSchemas": {"card": {"properties": {"billing": {"type": "string"}}, "required": ["billing"]}}},
     {"type": "object", "properties": {"card": {"type": "string"}},
      "dependentSchemas": {"card": {"properties": {"billing": {"type": "string"}}, "required": ["billing"]}},
      "unevaluatedProperties": False},
     [{"card": "c", "billing": "b"}, {}],
     [{"billing": "b"}, {"card": "c", "billing": "b", "zz": 1}]),
    ("patternProperties",
     {"type": "object", "properties": {"id": {"type": "integer"}}, "patternProperties": X_STRINGS},
     {"type": "object", "properties": {"id": {"type": "integer"}}, "patternProperties": X_STRINGS,
      "additionalProperties": False},
     [{"id": 1, "x_1": "a"}],
     [{"id": 1, "zz": "a"}]),
    ("required names count as declared",
     {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
     {"type": "object", "properties": {"a": {"type": "integer"}, "b": True}, "required": ["a", "b"],
      "additionalProperties": False},
     [{"a": 1, "b": [1, {"c": 2}]}],
     [{"a": 1, "b": 2, "zz": 3}]),
    ("prefixItems",
     {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
     {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
     [[], [1], [1, "a"]],
     [[1, "a", 3], [1, "a", "b"]]),
    ("prefixItems of true",
     {"prefixItems": [True, True]},
     {"prefixItems": [True, True], "items": False},
     [[1, "a"], [None]],
     [[1, 2, 3]]),
    ("draft-04 array items",
     {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array",
      "items": [{"type": "integer"}, {"type": "string"}]},
     {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array",
      "items": [{"type": "integer"}, {"type": "string"}], "additionalItems": False},
     [[1, "a"]],
     [[1, "a", 3]]),
    ("prefixItems with contains",
     {"type": "array", "prefixItems": [{"type": "integer"}], "contains": {"type": "string"}},
     {"type": "array", "prefixItems": [{"type": "integer"}], "contains": {"type": "string"},
      "unevaluatedItems": False},
     [[1, "a"], [1, "a", "b"], [1, "a", "b", "c"]],
     [[1, "a", 2]]),
    # left open: nothing declared, or the schema says what other keys / items may be
    ("nothing declared", {"type": "object"}, {"type": "object"}, [{"zz": 1}], []),
    ("additionalProperties true",
     {"properties": {"a": {}}, "additionalProperties": True},
     {"properties": {"a": {}}, "additionalProperties": True}, [{"a": 1, "zz": 2}], []),
    ("additionalProperties schema",
     {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
     {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}}, [{"a": "s", "zz": 2}],
     [{"zz": "s"}]),
    ("unevaluatedProperties given",
     {"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": {"type": "integer"}},
     {"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": {"type": "integer"}},
     [{"a": "s", "zz": 2}], [{"zz": "s"}]),
    ("items given",
     {"prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
     {"prefixItems": [{"type": "string"}], "items": {"type": "integer"}}, [["a", 1, 2]], []),
    ("plain array", {"type": "array"}, {"type": "array"}, [[1, "a", None]], []),
    # conflicts: closing would change what the schema can hold, so these stay open
    ("minProperties beyond the declared names",
     {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 3},
     {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 3},
     [{"a": 1, "b": 2, "zz": 3}], []),
    ("minItems beyond the prefix",
     {"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 3},
     {"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 3},
     [[1, 2, 3]], []),
]
CONFLICTS = {"minProperties beyond the declared names": "minProperties 3",
             "minItems beyond the prefix": "minItems 3"}


def _names(schema: Any, out: set[str]) -> set[str]:
    """Every property name and string the schema mentions (keys for candidate objects)."""
    if isinstance(schema, dict):
        for k, v in schema.items():
            if k in ("properties", "dependentSchemas"):
                out |= set(v)
            if k == "required":
                out |= set(v)
            _names(v, out)
    elif isinstance(schema, list):
        for v in schema:
            _names(v, out)
    elif isinstance(schema, str) and len(schema) < 8 and not schema.startswith(("#", "^", "http")):
        out.add(schema)
    return out


def _candidates(schema: Any) -> st.SearchStrategy[Any]:
    names = sorted(_names(schema, set()) | {"zz", "x_1"})
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(names + ["", "s"]))
    values = st.recursive(scalars, lambda c: st.one_of(
        st.lists(c, max_size=4), st.dictionaries(st.sampled_from(names), c, max_size=4)), max_leaves=8)
    try:
        from hypothesis_jsonschema import from_schema

        # a copy: from_schema rewrites its argument; it reads drafts 4-7 (2020-12 keywords
        # such as prefixItems are ignored there: the oracle decides anyway)
        return st.one_of(values, from_schema(copy.deepcopy(schema)))
    except Exception:  # noqa: BLE001 - hypothesis-jsonschema cannot read every schema
        return values


def _serialise(x: Any, schema: Any) -> str:
    return canonical_json(x, schema)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hand_picked_values(case: tuple) -> None:
    _name, schema, twin, accept, reject = case
    cg, cg_open = strict(schema), open_(schema)
    for x in accept:
        assert _valid(schema, x) and _valid(twin, x), x  # the test data itself
        assert cg.accepts(_serialise(x, schema)), x
    for x in reject:
        assert not _valid(twin, x), x
        assert not cg.accepts(_serialise(x, schema)), x
        if _valid(schema, x):
            assert cg_open.accepts(_serialise(x, schema)), x  # what strict takes away


_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_strict_accepts_exactly_the_closed_twin(case: tuple, data: st.DataObject) -> None:
    name, schema, twin, _a, _r = case
    cg, cg_open = strict(schema), open_(schema)
    if name not in _STRATEGIES:
        _STRATEGIES[name] = _candidates(schema)
    for _ in range(6):
        try:
            x = data.draw(_STRATEGIES[name])
        except Exception:  # noqa: BLE001 - from_schema could not draw
            continue
        text = _serialise(x, schema)
        ok, ok_open = cg.accepts(text), cg_open.accepts(text)
        if ok:
            assert _valid(schema, x), (schema, text)  # never an invalid value
            assert ok_open, (schema, text)  # a narrowing
        # strict = open grammar and closed twin (the open grammar has documented narrowings of
        # its own, such as distinct keys under minProperties)
        assert ok == (ok_open and _valid(twin, x)), (schema, text)
        event("accepted" if ok else "rejected")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=_schemas(), values=st.lists(json_values, min_size=8, max_size=16))
def test_random_schemas_strict_is_a_sound_narrowing(schema: Any, values: list[Any]) -> None:
    try:
        cg_open = open_(schema)
    except (UnsupportedFeatureError, CompileLimitError):
        return
    except SchemaError as e:
        if "unsatisfiable" in str(e):
            return
        raise
    cg = strict(schema)  # never unsatisfiable where the open schema is not
    validator = jsonschema.Draft202012Validator(schema)
    for x in values:
        text = _serialise(x, schema)
        if cg.accepts(text):
            event("accepted")
            assert cg_open.accepts(text), (schema, text)
            assert validator.is_valid(x), (schema, text)


@pytest.mark.parametrize("name", sorted(CONFLICTS))
def test_conflicts_stay_open_with_a_warning(name: str) -> None:
    # a schema of its own: equal grammars share one object and its metadata, which the last
    # compilation writes (here the open one of the other tests)
    schema = {**next(c[1] for c in CASES if c[0] == name), "description": "conflict"}
    warnings = schema_warnings(strict(schema))
    assert any(w.startswith("strict:") and CONFLICTS[name] in w for w in warnings), warnings


def test_closing_that_would_empty_the_schema_compiles_it_open() -> None:
    # "a" can hold no value (two levels down, past the per-object check); minProperties 2 then
    # needs an undeclared key, which only the open grammar allows
    dead = {"type": "object", "required": ["x"],
            "properties": {"x": {"type": "object", "required": ["y"], "properties": {"y": False}}}}
    schema = {"type": "object", "properties": {"a": dead, "b": {}}, "minProperties": 2}
    cg = strict(schema)
    assert any("compiled open" in w for w in schema_warnings(cg))
    assert _valid(schema, {"b": 1, "zz": 2}) and cg.accepts('{"b":1,"zz":2}')
    with pytest.raises(SchemaError, match="unsatisfiable"):  # a truly empty schema still is an error
        strict({"type": "object", "properties": {"a": False}, "required": ["a"]})


def test_a_schema_strict_mode_cannot_compile_is_compiled_open(monkeypatch: pytest.MonkeyPatch) -> None:
    from structgen.frontends.json_schema import strict as strict_module

    def refuse(self: Any, node: Any) -> Any:
        raise UnsupportedFeatureError("too hard when closed", pointer="#", keyword="anyOf")

    monkeypatch.setattr(strict_module.Closer, "language", refuse)
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "title": "fallback"}
    cg = strict(schema)
    assert any("does not compile" in w for w in schema_warnings(cg))
    assert cg.accepts('{"k":1,"zz":2}')


def test_generation_defaults_to_strict_validation_does_not() -> None:
    schema = CASES[0][1]
    person = '{"name":"Bob","languages":[17,18,19]}'
    assert _valid(schema, json.loads(person))
    generating = compile_constraint("json", schema)
    assert not generating.accepts(person)
    assert generating.accepts('{"name":"Bob","age":42}')
    assert compile_constraint("json", schema, for_generation=False).accepts(person)
    assert compile_json_schema(schema, for_generation=False).accepts(person)
    assert not compile_json_schema(schema).accepts(person)  # the mask front door generates
    opt_out = compile_constraint("json", schema, json_options=JsonSchemaOptions(strict=False))
    assert opt_out.accepts(person)
    assert JsonSchemaOptions().for_generation().strict is True
    assert JsonSchemaOptions().for_validation().strict is False
    assert JsonSchemaOptions(strict=False).for_generation().strict is False
    with pytest.raises(ConfigError, match="strict"):
        JsonSchemaOptions(strict="yes")  # type: ignore[arg-type]


def test_pydantic_models_are_closed_through_refs_optionals_and_unions() -> None:
    from typing import Literal

    from pydantic import BaseModel

    class Addr(BaseModel):
        city: str

    class Cat(BaseModel):
        kind: Literal["cat"]
        meow: str

    class Dog(BaseModel):
        kind: Literal["dog"]
        bark: int

    class Person(BaseModel):
        name: str
        addr: Addr | None = None
        pet: Cat | Dog

    schema = Person.model_json_schema()
    cg = compile_constraint("json", Person)
    good = [{"name": "a", "addr": {"city": "x"}, "pet": {"kind": "cat", "meow": "m"}},
            {"name": "a", "pet": {"kind": "dog", "bark": 1}}]
    bad = [{"name": "a", "addr": {"city": "x", "zip": 1}, "pet": {"kind": "cat", "meow": "m"}},
           {"name": "a", "addr": None, "pet": {"kind": "cat", "meow": "m", "bark": 1}},
           {"name": "a", "pet": {"kind": "dog", "bark": 1}, "x": 1}]
    for x in good + bad:
        assert _valid(schema, x)  # pydantic's schema leaves every object open
    assert all(cg.accepts(_serialise(x, schema)) for x in good)
    assert not any(cg.accepts(_serialise(x, schema)) for x in bad)


def test_compile_cache_keeps_strict_and_open_apart() -> None:
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}}
    a, b = strict(schema), open_(schema)
    assert a is not b and a is strict(schema) and b is open_(schema)
    assert not a.accepts('{"zz":1}') and b.accepts('{"zz":1}')


def test_forced_text_after_the_last_declared_key() -> None:
    # a byte-level vocabulary: after "ok" nothing but the closing brace can follow
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "ok": {"type": "boolean"}},
              "required": ["name", "ok"]}
    vocab = structgen.Vocabulary([bytes([b]) for b in range(256)] + [None], eos_token_ids=[256])
    m = structgen.Matcher(compile_constraint("json", schema), vocab)
    prefix = b'{"name":"Bob",'
    assert m.accept_tokens(list(prefix)) == len(prefix)
    assert m.forced_bytes() == b'"ok":'
    m.accept_tokens(list(b'"ok":true'))
    assert m.forced_bytes() == b"}"
    loose_grammar = compile_constraint("json", schema, json_options=JsonSchemaOptions(strict=False))
    loose = structgen.Matcher(loose_grammar, vocab)
    loose.accept_tokens(list(prefix + b'"ok":true'))
    assert loose.forced_bytes() == b""  # "," and another key, or "}"


# ---------------------------------------------------------------------------------------------
# generation with a tiny model, the CLI flag and the configuration key
# ---------------------------------------------------------------------------------------------

OPEN_PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 99}},
               "required": ["name"]}
PROMPT = "Person JSON:"
# the open language lets the tiny model start a key of its own after "name"
UNDECLARED_KEY = re.compile(r'\{"name":"[^"]*","(?!age")')


@pytest.fixture(scope="module")
def tiny_lm(tokenizer_by_alias: Any) -> Any:
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    return CausalLM(build_tiny_llama(tok, "random"), tok)


@pytest.mark.assets
def test_generate_emits_no_undeclared_key_unless_strict_false(tiny_lm: Any) -> None:
    closed = structgen.generate(tiny_lm, schema=OPEN_PERSON, prompt=PROMPT, max_new_tokens=24)
    assert closed.finish_reason == "stop", closed.text
    assert set(closed.value) <= {"name", "age"}
    jsonschema.validate(closed.value, OPEN_PERSON)
    loose = structgen.generate(tiny_lm, schema=OPEN_PERSON, prompt=PROMPT, max_new_tokens=24, strict=False)
    assert UNDECLARED_KEY.match(loose.text), loose.text
    streamed = "".join(structgen.stream(tiny_lm, schema=OPEN_PERSON, prompt=PROMPT, max_new_tokens=24,
                                        strict=False))
    assert streamed == loose.text


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_by_alias: Any) -> Path:
    from _tiny_lm import build_tiny_llama

    tok = tokenizer_by_alias("gpt2")
    d = tmp_path_factory.mktemp("tiny-llama-strict")
    build_tiny_llama(tok, "random").save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _cli_text(capsys: pytest.CaptureFixture[str], *argv: Any) -> str:
    from structgen.cli import main

    rc = main([str(a) for a in argv])
    out = capsys.readouterr().out
    assert rc in (0, 1), out
    return json.loads(out.splitlines()[0])["text"]


@pytest.mark.assets
def test_cli_strict_flag_and_config_key(model_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(OPEN_PERSON))
    off = tmp_path / "off.yaml"
    off.write_text("json_schema:\n  strict: false\n")
    base = ["generate", "--model", model_dir, "--schema", schema_file, "--prompt", PROMPT,
            "--max-new-tokens", 24]
    closed = _cli_text(capsys, *base)
    assert set(json.loads(closed)) <= {"name", "age"}
    assert _cli_text(capsys, *base, "--strict") == closed
    loose = _cli_text(capsys, *base, "--no-strict")
    assert UNDECLARED_KEY.match(loose), loose
    assert _cli_text(capsys, *base, "--config", off) == loose
    assert _cli_text(capsys, *base, "--config", off, "--strict") == closed


def test_config_key_is_checked_with_its_line(tmp_path: Path) -> None:
    from structgen.settings import load_settings

    good = tmp_path / "good.yaml"
    good.write_text("json_schema:\n  strict: false\n")
    assert load_settings(good).json_schema.strict is False
    bad = tmp_path / "bad.yaml"
    bad.write_text("json_schema:\n  whitespace: compact\n  strict: sometimes\n")
    with pytest.raises(ConfigError) as e:
        load_settings(bad)
    assert f"{bad}:3: json_schema.strict" in str(e.value)


def test_integrations_take_strict() -> None:
    from structgen.integrations import StructgenBackend

    vocab = structgen.Vocabulary([bytes([b]) for b in range(256)] + [None], eos_token_ids=[256])
    schema = CASES[0][1]
    person = '{"name":"Bob","languages":[17]}'
    assert not StructgenBackend(vocab=vocab).compile("json", schema).accepts(person)
    assert StructgenBackend(vocab=vocab, strict=False).compile("json", schema).accepts(person)
    options = JsonSchemaOptions(strict=False)
    assert StructgenBackend(vocab=vocab, json_options=options).compile("json", schema).accepts(person)
    assert not StructgenBackend(vocab=vocab, json_options=options, strict=True).compile(
        "json", schema).accepts(person)
