"""Generation spells numbers canonically (``number_spelling="canonical"``), validation accepts
every JSON spelling: an ``integer`` is generated as an integer literal (no ``3.0``, ``3e0`` or
``-0``, which strict parsers such as a Pydantic ``int`` field reject) of bounded length, a
``number`` with at most 17 mantissa and 3 exponent digits."""

from __future__ import annotations

import itertools
import json
import random
import re

import jsonschema
import pytest

import structgen
from structgen import JsonSchemaOptions
from structgen.errors import ConfigError
from structgen.integrations import compile_constraint

INT_LITERAL = re.compile(r"-?(0|[1-9][0-9]*)")
JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
BYTES = structgen.Vocabulary([bytes([b]) for b in range(256)] + [None], eos_token_ids=[256])


def _gen(schema):
    return compile_constraint("json", schema)


def _val(schema):
    return structgen.compile_json_schema(schema, for_generation=False)


def _walks(grammar, n: int, seed: int = 0, *, bounded: bool = True, max_len: int = 400) -> list[str]:
    """``n`` random walks through ``grammar`` over a byte vocabulary, each ended at EOS. A
    walk longer than ``max_len`` fails when ``bounded`` (canonical numbers are finite), else
    is dropped."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m = structgen.Matcher(grammar, BYTES)
        data = bytearray()
        ended = False
        while len(data) <= max_len:
            ids = m.allowed_token_ids()
            assert ids, bytes(data)
            if 256 in ids and (len(ids) == 1 or rng.random() < 0.3):
                ended = True
                break
            tid = rng.choice([i for i in ids if i != 256])
            assert m.accept_token(tid)
            data.append(tid)
        assert ended or not bounded, bytes(data)
        if ended:
            out.append(data.decode())
    return out


def _is_negative_zero(s: str) -> bool:
    return s.startswith("-") and float(s) == 0


# ---------------------------------------------------------------------------------------------
# integers
# ---------------------------------------------------------------------------------------------

def test_integer_generation_writes_integer_literals_validation_keeps_every_spelling() -> None:
    schema = {"type": "integer"}
    gen, val = _gen(schema), _val(schema)
    good = ["0", "42", "-7", "9" * 19, "-" + "9" * 19, "1" + "0" * 18]
    bad = ["3.0", "-0", "-0.0", "3e0", "1E2", "-0e7304881155", "1" + "0" * 19, "9" * 20, "-" + "9" * 20]
    for s in good + bad:
        jsonschema.validate(json.loads(s), schema)  # all are valid integers
        assert val.accepts(s), s
    for s in good:
        assert gen.accepts(s), s
    for s in bad:
        assert not gen.accepts(s), s


def test_integer_brute_force_short_strings() -> None:
    """Every string of up to 4 bytes over number bytes: generation accepts exactly the
    integer literals other than ``-0``; validation every integer literal and only JSON
    numbers with an integral value (its exponent forms are narrowed: numbers.py)."""
    schema = {"type": "integer"}
    gen, val = _gen(schema), _val(schema)
    for n in range(1, 5):
        for chars in itertools.product("-0129.e+", repeat=n):
            s = "".join(chars)
            literal = INT_LITERAL.fullmatch(s) is not None and s != "-0"
            assert gen.accepts(s) == literal, s
            integral = JSON_NUMBER.fullmatch(s) is not None and float(s).is_integer()
            if INT_LITERAL.fullmatch(s) or "." in s and integral:
                assert val.accepts(s), s
            if val.accepts(s):
                assert integral, s


def test_bounded_integer_is_exactly_the_range_as_literals() -> None:
    schema = {"type": "integer", "minimum": 10, "maximum": 20}
    gen, val = _gen(schema), _val(schema)
    candidates = [str(i) for i in range(-30, 60)]
    candidates += [f"{i}.0" for i in range(5, 25)] + [f"{i}e0" for i in range(5, 25)]
    candidates += ["1e1", "2E1", "1.5e1", "0010", "+15", "-0", "15.5", "1.0e1", "20.00"]
    for s in candidates:
        is_literal = INT_LITERAL.fullmatch(s) is not None and s != "-0"
        expected = is_literal and 10 <= int(s) <= 20
        assert gen.accepts(s) == expected, s
        if expected:
            jsonschema.validate(json.loads(s), schema)
    for s in ["10.0", "1e1", "2E1", "1.5e1", "20.00"]:
        assert val.accepts(s), s  # validation: still every spelling


@pytest.mark.parametrize("schema, accepted, rejected", [
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, ["1", "2"], ["0", "3", "1.0", "2e0"]),
    ({"type": "integer", "minimum": -2.5, "maximum": 0.5}, ["-2", "-1", "0"], ["-3", "1", "-0", "-2.0"]),
    ({"type": "integer", "multipleOf": 7}, ["0", "-14", "7" * 19], ["7.0", "7e0", "-0", "7" * 20]),
    ({"type": "integer", "minimum": 0}, ["0", "9" * 19], ["-1", "1" + "0" * 19]),
    ({"type": "integer", "maximum": -1}, ["-1", "-" + "9" * 19], ["0", "-1.0", "-1" + "0" * 19]),
    # bounds that need more digits are honoured: up to as many digits as the largest bound
    ({"type": "integer", "minimum": 10**25}, ["1" + "0" * 25, "9" * 26], ["9" * 25, "1" + "0" * 26]),
    ({"type": "integer", "maximum": -(10**30)}, ["-1" + "0" * 30, "-" + "9" * 31],
     ["-1" + "0" * 31, "-1e30"]),
    ({"type": "integer", "minimum": 1e30},  # the float 1e30 is 1000000000000000019884624838656
     [str(int(1e30)), "2" + "0" * 30], ["1" + "0" * 30, "1e30", "1e31"]),
    # no integer literal is both 10**30 and the double 1e30: the full language ("1e30")
    ({"type": "integer", "minimum": 1e30, "maximum": 1e30}, ["1e30"], ["1" + "0" * 30]),
    ({"type": "integer", "multipleOf": 1000, "minimum": 1}, ["1000", "9" * 16 + "000"],
     ["1e3", "1" + "0" * 19]),
])
def test_integer_constraints(schema, accepted, rejected) -> None:
    gen, val = _gen(schema), _val(schema)
    for s in accepted:
        jsonschema.validate(json.loads(s), schema)
        assert gen.accepts(s), (schema, s)
        assert val.accepts(s), (schema, s)
    for s in rejected:
        assert not gen.accepts(s), (schema, s)


def test_nineteen_digits_then_the_integer_must_end() -> None:
    m = structgen.Matcher(_gen({"type": "integer"}), BYTES)
    assert m.accept_tokens(list(b"1" * 19)) == 19
    assert m.allowed_token_ids() == [256]


# ---------------------------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------------------------

def test_number_has_bounded_mantissa_and_exponent() -> None:
    schema = {"type": "number"}
    gen, val = _gen(schema), _val(schema)
    good = ["0", "0.0", "1.5", "-0.5", "1.2345678901234567", "12345678901234567", "0.00000000000000001",
            "1e308", "-2.5E-300", "5e-324", "1.7976931348623157e308", "12345678901234567e+999",
            "1.5e07", "3.0", "1e2"]
    bad = ["1.23456789012345678", "123456789012345678", "0.000000000000000001", "1e1000", "1e0001",
           "-0", "-0.0", "-0e5", "-0.000E-3", "12345678901234567.1"]
    for s in good + bad:
        assert val.accepts(s), s
    for s in good:
        assert gen.accepts(s), s
    for s in bad:
        assert not gen.accepts(s), s


def test_number_brute_force_short_strings() -> None:
    schema = {"type": "number"}
    gen = _gen(schema)
    for n in range(1, 6):
        for chars in itertools.product("-05.e", repeat=n):
            s = "".join(chars)
            expected = JSON_NUMBER.fullmatch(s) is not None and not _is_negative_zero(s)
            assert gen.accepts(s) == expected, s


@pytest.mark.parametrize("schema, accepted, rejected", [
    ({"type": "number", "minimum": 0, "maximum": 1}, ["0", "0.5", "1", "1.0", "1e0", "0.12345678901234567"],
     ["-0.0", "1.01", "0.123456789012345678"]),
    ({"type": "number", "exclusiveMinimum": 0}, ["0.1", "1e308", "12345678901234567"],
     ["0", "-1", "1e1000", "123456789012345678"]),
    ({"type": "number", "multipleOf": 0.25}, ["0.25", "-1.5", "2", "2.50"], ["0.3", "-0", "-0.00"]),
    # integral multiples beyond 2**53 have no short canonical form: integer literals
    ({"type": "number", "minimum": 1e30, "multipleOf": 100}, [str(int(1e30) // 100 * 100 + 100)],
     ["1e30", "1" + "0" * 30, "1" + "0" * 31]),
    # nothing canonical in range: the constraint keeps its full language
    ({"type": "number", "minimum": 10**1000}, ["1e1000", "1" + "0" * 1000], ["1e999"]),
])
def test_number_constraints(schema, accepted, rejected) -> None:
    gen, val = _gen(schema), _val(schema)
    for s in accepted:
        assert val.accepts(s), (schema, s)
        assert gen.accepts(s), (schema, s)
    for s in rejected:
        assert not gen.accepts(s), (schema, s)


def test_enum_and_const_numbers_have_one_spelling() -> None:
    schema = {"enum": [3, 2.5, 4.0, -0.0, 1e20, "x"]}
    gen, val = _gen(schema), _val(schema)
    assert {s for s in ["3", "3.0", "2.5", "4", "4.0", "0", "-0.0", "0.0", str(10**20), "1e+20", '"x"']
            if gen.accepts(s)} == {"3", "2.5", "4", "0", str(10**20), '"x"'}
    for s in ["3.0", "4.0", "-0.0", "0.0", "1e+20"]:
        assert val.accepts(s), s
    const = {"type": "integer", "const": 5}
    assert _gen(const).accepts("5") and not _gen(const).accepts("5.0")
    assert _val(const).accepts("5.0")


def test_unique_items_over_numbers_spell_values_canonically() -> None:
    schema = {"type": "array", "items": {"enum": [1, 2.0]}, "uniqueItems": True}
    gen, val = _gen(schema), _val(schema)
    assert gen.accepts("[1,2]") and gen.accepts("[2,1]")
    assert not gen.accepts("[1.0,2]") and not gen.accepts("[1,2.0]")
    assert val.accepts("[1.0,2]") and not val.accepts("[1,1.0]")


# ---------------------------------------------------------------------------------------------
# sampled outputs are valid and parse as the right Python types
# ---------------------------------------------------------------------------------------------

SAMPLED = [
    {"type": "integer"},
    {"type": "integer", "minimum": -5, "exclusiveMaximum": 100},
    {"type": "integer", "multipleOf": 3, "maximum": 1000},
    {"type": "integer", "minimum": 10**22},
    {"type": "number"},
    {"type": "number", "minimum": -1.5, "maximum": 2.25},
    {"type": "number", "multipleOf": 0.5},
    {"type": ["integer", "string"], "maxLength": 3},
    {"not": {"type": "integer", "multipleOf": 2}, "type": "integer", "maximum": 10**30},
    {"type": "number", "not": {"multipleOf": 2}},
    {"anyOf": [{"type": "integer", "maximum": 0}, {"type": "number", "minimum": 100}]},
    {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"}},
     "required": ["n", "x"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
    {},
]


def _integer_schema(schema) -> bool:
    return schema.get("type") == "integer"


@pytest.mark.parametrize("i", range(len(SAMPLED)))
def test_random_walks_are_valid_and_parse(i: int) -> None:
    schema = SAMPLED[i]
    gen, val = _gen(schema), _val(schema)
    texts = _walks(gen, 40, seed=i, bounded=schema != {})
    assert texts
    for text in texts:
        value = json.loads(text)
        jsonschema.validate(value, schema)
        assert val.accepts(text), text
        if _integer_schema(schema):
            assert type(value) is int, text
        for s in re.findall(r"-?[0-9][0-9.eE+-]*", text) if not text.startswith('"') else ():
            assert not _is_negative_zero(s), text
            if "e" not in s.lower():
                assert len(s.lstrip("-").replace(".", "").lstrip("0")) <= 26, text


def test_pydantic_strict_model_reads_generated_output() -> None:
    pydantic = pytest.importorskip("pydantic")

    class M(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(strict=True, extra="forbid")
        n: int
        k: int = pydantic.Field(ge=0, le=300)
        x: float
        items: list[int]

    gen = _gen(M.model_json_schema())
    for text in _walks(gen, 60, seed=7):
        m = M.model_validate_json(text)
        assert json.loads(text)["n"] == m.n
    # validation (every spelling) still accepts what strict Pydantic rejects
    text = '{"n":3.0,"k":1,"x":1,"items":[]}'
    assert _val(M.model_json_schema()).accepts(text)
    assert not gen.accepts(text)
    with pytest.raises(pydantic.ValidationError):
        M.model_validate_json(text)


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("alias", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_real_models_write_integers_json_parsers_read_exactly(model_dir_by_alias, alias: str) -> None:
    """A Pydantic ``int`` field from real models (the default one, and the small one that once
    wrote a 232-digit population), asked for a number with no end: at most 19 digits, and the
    value Pydantic reads is the one written."""
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        population: int

    model_dir_by_alias(alias)
    r = structgen.generate(alias, schema=City, max_new_tokens=64, messages=[
        {"role": "user", "content": "A city whose population is the first 300 digits of pi, "
                                    "written out in full."}])
    assert r.value is not None, (r.text, r.finish_reason)
    digits = str(abs(json.loads(r.text)["population"]))
    assert len(digits) <= 19, r.text
    assert City.model_validate_json(r.text).population == json.loads(r.text)["population"]


# ---------------------------------------------------------------------------------------------
# the option
# ---------------------------------------------------------------------------------------------

def test_option_resolution_and_overrides() -> None:
    assert JsonSchemaOptions().number_spelling is None
    assert JsonSchemaOptions().for_generation().number_spelling == "canonical"
    assert JsonSchemaOptions().for_validation().number_spelling == "all"
    assert JsonSchemaOptions(number_spelling="all").for_generation().number_spelling == "all"
    with pytest.raises(ConfigError):
        JsonSchemaOptions(number_spelling="exact")
    schema = {"type": "integer"}
    # generation with every spelling, validation with canonical ones: as asked
    every = JsonSchemaOptions(number_spelling="all")
    assert compile_constraint("json", schema, json_options=every).accepts("3.0")
    assert not structgen.compile_json_schema(schema, number_spelling="canonical",
                                             for_generation=False).accepts("3.0")
    assert not structgen.compile_json_schema(schema).accepts("3.0")
    assert structgen.compile_json_schema(schema, for_generation=False).accepts("3.0")
    assert not compile_constraint("json", schema, for_generation=True).accepts("3.0")
    assert compile_constraint("json", schema, for_generation=False).accepts("3.0")
