"""The JSON escape layer (structgen.frontends.json_escape) and its use by every string language.

Oracles are independent of the code under test: ``json.loads`` decides what a spelling
decodes to, a plain Python simulation decides membership of the decoded value, and
``jsonschema`` (with the draft's format checker) decides validity of whole instances.
Escape variants are written by this file's own writer (every character as ``\\uXXXX`` in
lower or upper case, ``\\/``, surrogate pairs, a random mix), not by structgen.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen import compile_json_schema
from structgen.frontends.json_escape import json_class, json_content, json_dfa, spellings
from structgen.grammar import ir
from structgen.grammar.compiler import compile_grammar
from structgen.json_schema import canonical_json

SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n",
         "\r": "\\r", "\t": "\\t"}


def validating_grammar(schema, **options):
    """The schema in validation's language (every spelling of every valid document)."""
    return compile_json_schema(schema, for_generation=False, **options)


def u_escape(ch: str, upper: bool) -> str:
    cp = ord(ch)
    if cp > 0xFFFF:
        hi, lo = divmod(cp - 0x10000, 0x400)
        text = f"\\u{0xD800 + hi:04x}\\u{0xDC00 + lo:04x}"
    else:
        text = f"\\u{cp:04x}"
    return text.upper().replace("\\U", "\\u") if upper else text


def spell(ch: str, how: str, rng: random.Random) -> str:
    """One spelling of ``ch``: "raw" (escaped only where JSON demands), "u" / "U" (hex
    escape in lower / upper case), "short" (the short escape if any), "mix" (random)."""
    if how == "mix":
        how = rng.choice(["raw", "u", "U", "short", "mixcase"])
    if how == "short" and ch in SHORT:
        return SHORT[ch]
    if how in ("u", "U"):
        return u_escape(ch, how == "U")
    if how == "mixcase":
        return "".join(c.upper() if c.isalpha() and c != "u" and rng.random() < 0.5 else c
                       for c in u_escape(ch, False))
    return json.dumps(ch, ensure_ascii=False)[1:-1]


def write_variant(value, how: str, rng: random.Random) -> str:
    """``value`` as JSON text with every string (keys too) spelled per ``how``."""
    if isinstance(value, str):
        return '"' + "".join(spell(c, how, rng) for c in value) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(write_variant(k, how, rng) + ":" + write_variant(v, how, rng)
                              for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(write_variant(v, how, rng) for v in value) + "]"
    return json.dumps(value)


VARIANTS = ("u", "U", "short", "mix")


def compiled(e: ir.Expr):
    return compile_grammar(ir.Grammar({"s": e}, "s"))


# ---------------------------------------------------------------------------
# code-point classes
# ---------------------------------------------------------------------------

INTERESTING = [0x00, 0x08, 0x09, 0x0A, 0x1F, 0x20, 0x22, 0x2F, 0x41, 0x5C, 0x7F, 0x80, 0x7FF,
               0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF]
code_points = st.one_of(st.sampled_from(INTERESTING), st.integers(0, 0x10FFFF)).filter(
    lambda c: not 0xD800 <= c <= 0xDFFF)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(code_points, st.integers(0, 300)), min_size=1, max_size=3),
       st.lists(code_points, min_size=4, max_size=12))
def test_json_class_accepts_exactly_the_spellings_of_its_members(ranges, probes):
    rs = [(lo, min(lo + n, 0x10FFFF)) for lo, n in ranges]
    member = lambda cp: any(lo <= cp <= hi and not 0xD800 <= cp <= 0xDFFF for lo, hi in rs)  # noqa: E731
    cg = compiled(json_class(rs))
    rng = random.Random(0)
    for cp in probes + [lo for lo, _ in rs]:
        ch = chr(cp)
        for how in ("raw", "u", "U", "short", "mixcase"):
            text = spell(ch, how, rng)
            assert json.loads('"' + text + '"') == ch
            assert cg.accepts(text) == member(cp), (hex(cp), text)


def test_spellings_of_one_code_point():
    cg = compiled(json_class([(0x2F, 0x2F)]))
    for text in ["/", "\\/", "\\u002f", "\\u002F"]:
        assert cg.accepts(text)
    for text in ["\\u002", "\\U002F", "\\x2f", "//"]:
        assert not cg.accepts(text)
    astral = compiled(json_class([(0x1F600, 0x1F600)]))
    for text in ["😀", "\\ud83d\\ude00", "\\uD83D\\uDE00", "\\uD83d\\udE00"]:
        assert astral.accepts(text), text
    for text in ["\\ud83d", "\\ude00", "\\ude00\\ud83d", "\\u1f600"]:
        assert not astral.accepts(text), text
    assert set(spellings(0x2F)) == {"/", "\\/", "\\u002f", "\\u002F"}
    assert spellings(0x2F, "canonical") == ["/"]
    assert set(spellings(0x0A, "canonical")) == {"\\n"}
    assert set(spellings(0x01, "canonical")) == {"\\u0001"}


def test_lone_surrogate_escapes_are_rejected():
    # json.loads decodes them to a lone surrogate (no UTF-8 form); documented narrowing
    cg = validating_grammar({"type": "string"})
    assert json.loads('"\\ud800"') == "\ud800"
    for text in ['"\\ud800"', '"\\udc00"', '"a\\ud800b"', '"\\ud800\\u0041"']:
        assert not cg.accepts(text), text
    assert cg.accepts('"\\ud800\\udc00"')


def test_canonical_mode_is_what_json_dumps_writes():
    rng = random.Random(1)
    cg = compiled(ir.star(json_class([(0, 0x10FFFF)], "canonical")))
    for _ in range(200):
        s = "".join(chr(rng.choice([rng.randrange(0, 0x80), rng.randrange(0x80, 0xD800),
                                    rng.randrange(0x10000, 0x110000)])) for _ in range(4))
        canonical = json.dumps(s, ensure_ascii=False)[1:-1]
        assert cg.accepts(canonical), canonical
        other = write_variant(s, "U", rng)[1:-1]
        assert cg.accepts(other) == (other == canonical)


# ---------------------------------------------------------------------------
# explicit automata over raw UTF-8
# ---------------------------------------------------------------------------

ALPHABET = ["a", "-", "/", '"', "\\", "\n", "\x01", "é", "€", "😀", "\U0010FFFF"]


def utf8_dfa(cp_trans: list[dict[str, int]], accept: set[int]) -> ir.Dfa:
    """A byte-level DFA from a code-point DFA, by expanding each character's UTF-8 bytes
    into a chain of fresh states (plain Python, independent of json_escape)."""
    trans: list[dict[int, int]] = [dict() for _ in cp_trans]
    for q, edges in enumerate(cp_trans):
        for ch, t in edges.items():
            data = ch.encode("utf-8")
            cur = q
            for b in data[:-1]:
                if b not in trans[cur]:
                    trans.append({})
                    trans[cur][b] = len(trans) - 1
                cur = trans[cur][b]
            trans[cur][data[-1]] = t
    return ir.Dfa(0, accept, [[(b, b, t) for b, t in sorted(e.items())] for e in trans])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 5).flatmap(lambda n: st.tuples(
    st.lists(st.dictionaries(st.sampled_from(ALPHABET), st.integers(0, n - 1), max_size=6),
             min_size=n, max_size=n),
    st.sets(st.integers(0, n - 1), min_size=1))),
    st.lists(st.text(alphabet=ALPHABET, max_size=5), min_size=5, max_size=10),
    st.randoms(use_true_random=False))
def test_json_dfa_accepts_the_spellings_of_exactly_its_language(machine, words, rng):
    cp_trans, accept = machine

    def member(w: str) -> bool:
        q = 0
        for ch in w:
            if ch not in cp_trans[q]:
                return False
            q = cp_trans[q][ch]
        return q in accept

    e = json_dfa(utf8_dfa(cp_trans, accept))
    if e == ir.NEVER:
        assert not any(member(w) for w in words)
        return
    cg = compiled(e)
    for w in words:
        for how in ("raw", *VARIANTS):
            text = write_variant(w, how, rng)[1:-1]
            assert json.loads('"' + text + '"') == w
            assert cg.accepts(text) == member(w), (w, text)


def test_json_content_rejects_raw_non_ascii_byte_sets():
    with pytest.raises(Exception, match="outside ASCII"):
        json_content(ir.lit("é"))


# ---------------------------------------------------------------------------
# whole schemas: every escape variant of a valid instance accepted, of an invalid one rejected
# ---------------------------------------------------------------------------

STRING_SCHEMAS = [
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "time"},
    {"type": "string", "format": "uri"},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "hostname"},
    {"type": "string", "format": "ipv4"},
    {"type": "string", "format": "ipv6"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "duration"},
    {"type": "string", "pattern": "^[a-z/]+-\\d{2}$"},
    {"type": "string", "pattern": "😀|é+"},
    {"type": "string", "minLength": 2, "maxLength": 4},
    {"enum": ["a/b", "http://x.org/", "\u00e9t\u00e9", "😀", "q\"\\"]},
    {"const": "http:/\u2028/schema.org"},
    {"type": "string", "format": "uri", "maxLength": 30},
    {"type": "string", "format": "date-time", "pattern": "^2"},
    {"not": {"type": "string", "format": "uuid"}},
]


def object_schema(fields: list[int]) -> dict:
    props = {f"k/{i}\u00e9": STRING_SCHEMAS[i] for i in fields}
    return {"type": "object", "properties": props, "required": sorted(props)[:1],
            "additionalProperties": {"type": "string", "format": "date"}}


schemas = st.one_of(st.sampled_from(STRING_SCHEMAS),
                    st.lists(st.integers(0, len(STRING_SCHEMAS) - 1), min_size=1, max_size=3,
                             unique=True).map(object_schema))

_COMPILED: dict[str, object] = {}


def compiled_schema(schema: dict):
    key = json.dumps(schema, sort_keys=True)
    if key not in _COMPILED:
        _COMPILED[key] = validating_grammar(schema)
    return _COMPILED[key]


def validator(schema: dict):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large])
@given(st.data())
def test_escape_variants_of_valid_instances_are_accepted(data):
    from hypothesis_jsonschema import from_schema

    schema = data.draw(schemas)
    instance = data.draw(from_schema(schema))
    if not validator(schema).is_valid(instance):
        return  # the generator is looser than the format checker
    cg = compiled_schema(schema)
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    # structgen's grammars take declared keys first, in declaration order
    canonical = canonical_json(instance, schema)
    assert cg.accepts(canonical)
    instance = json.loads(canonical)
    for how in VARIANTS:
        text = write_variant(instance, how, rng)
        assert json.loads(text) == instance
        assert cg.accepts(text), (schema, text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas, st.one_of(
    st.text(alphabet=st.sampled_from(list("0123456789-:T.Zaz/@x\u00e9😀\"\\ ")), max_size=25),
    st.dictionaries(st.sampled_from(["k/0\u00e9", "k/3\u00e9", "k/13\u00e9", "zz"]),
                    st.text(alphabet=st.sampled_from(list("09-:a/T")), max_size=12), max_size=3)),
    st.randoms(use_true_random=False))
def test_escape_variants_of_invalid_instances_are_rejected(schema, instance, rng):
    valid = validator(schema).is_valid(instance)
    cg = compiled_schema(schema)
    for how in VARIANTS:
        text = write_variant(instance, how, rng)
        assert json.loads(text) == instance
        if not valid:
            assert not cg.accepts(text), (schema, text)


def test_reported_rejections_are_fixed():
    # the cases of issue 32: format and const strings spelled with escapes
    dt = validating_grammar({"type": "string", "format": "date-time"})
    assert dt.accepts('"' + "".join(f"\\u{ord(c):04x}" for c in "2001-02-03T04:05:06Z") + '"')
    uri = validating_grammar({"type": "string", "format": "uri"})
    assert uri.accepts('"http:\\/\\/schema.org"')
    const = validating_grammar({"const": {"a/b": "x"}})
    assert const.accepts('{"a\\/b":"\\u0078"}')
    assert not const.accepts('{"a\\/b":"\\u0079"}')
    obj = validating_grammar({"type": "object", "properties": {"id": {"type": "string"}},
                               "additionalProperties": False})
    assert obj.accepts('{"\\u0069d":"x"}')
    assert not obj.accepts('{"\\u0069e":"x"}')
