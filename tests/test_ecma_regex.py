"""JSON Schema ``pattern``, ``patternProperties`` and ``propertyNames`` read as ECMA-262.

ECMA-262 is the default ``JsonSchemaOptions.regex_dialect``; ``"python"`` keeps Python's ``re``.

Oracles, none of them structgen's regex code:

* hand tables of ECMA-262 semantics, written from the specification: ``\\d`` is ``[0-9]`` and
  ``\\w`` ``[A-Za-z0-9_]`` (CharacterClassEscape), ``\\s`` is WhiteSpace (TAB, VT, FF, ZWNBSP
  U+FEFF and the Zs spaces) plus LineTerminator (LF, CR, U+2028, U+2029), ``.`` is anything
  but a LineTerminator, ``$`` is the end of the input (no multiline);
* Node's ``RegExp`` (an independent ECMAScript engine) checks those tables where ``node`` is
  installed;
* Python's ``re`` for ``regex_dialect="python"``, which must keep ``re``'s meaning.

Paths: validation (the grammar in validation's language accepts a document, in every JSON
spelling), finite sets (``enum`` with a pattern and declared property names under
``patternProperties``, where single strings are tested), property-name languages
(``patternProperties`` with ``additionalProperties``, ``propertyNames``), and generation (the
canonical language; the token masks of a :class:`~structgen.masks.matcher.Matcher` over a toy
vocabulary, and random walks through them, which never produce a string the dialect rejects).
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
import string
import subprocess
import unicodedata
from functools import lru_cache

import pytest
from _toy_vocab import ToyVocab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen.config import JsonSchemaOptions
from structgen.errors import ConfigError, SchemaError, UnsupportedFeatureError
from structgen.frontends.constraint import compile_constraint
from structgen.frontends.json_schema.patterns import Pattern, python_pattern
from structgen.json_schema import compile_json_schema, schema_warnings
from structgen.masks.matcher import Matcher

DIALECTS = ("ecma262", "python")

# ---------------------------------------------------------------------------
# ECMA-262 character sets, by hand from the specification (not from structgen's tables)
# ---------------------------------------------------------------------------

ZS = {0x20, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x202F, 0x205F, 0x3000}  # Unicode's Zs
LINE_TERMINATORS = {0x0A, 0x0D, 0x2028, 0x2029}
WHITE_SPACE = {0x09, 0x0B, 0x0C, 0xFEFF} | ZS
ECMA_SPACE = WHITE_SPACE | LINE_TERMINATORS
WORD = set(string.ascii_letters + string.digits + "_")

# characters on which ECMA-262 and Python's re disagree, and some on which they agree
PROBES = [
    "a", "Z", "_", "0", "9", "-", " ", "/", "{", '"', "\\", "\x00", "\x03", "\x08",
    "\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u180e",
    "\u2000", "\u200a", "\u200b", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff",
    "\u00e9", "\u00df", "\u00c9", "\u017f", "\u212a", "\u0663", "\u07c0", "\u09ea", "\uff10",
    "\U0001F600", "\U0001D7CE",
]


def is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def is_word(c: str) -> bool:
    return c in WORD


def is_space(c: str) -> bool:
    return ord(c) in ECMA_SPACE


# single-character patterns: (ECMA source, what it matches), each used as ^X$
CLASSES = {
    "\\d": is_digit,
    "\\D": lambda c: not is_digit(c),
    "\\w": is_word,
    "\\W": lambda c: not is_word(c),
    "\\s": is_space,
    "\\S": lambda c: not is_space(c),
    ".": lambda c: ord(c) not in LINE_TERMINATORS,
    "[^]": lambda c: True,
    "[\\d\\s]": lambda c: is_digit(c) or is_space(c),
    "[^\\w\\s]": lambda c: not (is_word(c) or is_space(c)),
    "\\p{L}": lambda c: unicodedata.category(c).startswith("L"),
    "\\P{Letter}": lambda c: not unicodedata.category(c).startswith("L"),
    "\\p{Nd}": lambda c: unicodedata.category(c) == "Nd",
    "\\p{digit}": lambda c: unicodedata.category(c) == "Nd",  # the Test-Suite's alias
}
NOT_PYTHON = {"[^]", "\\p{L}", "\\P{Letter}", "\\p{Nd}", "\\p{digit}"}  # re rejects these

# whole patterns, searched: (pattern, string, ECMA-262 verdict, Node flags or None: not ES syntax)
ROWS = [
    ("^abc$", "abc", True, "u"),
    ("^abc$", "abc\n", False, "u"),  # $ is the end of the input, not before a final newline
    ("abc$", "xabc", True, "u"),
    ("abc$", "abc\r\n", False, "u"),
    ("^abc", "x\nabc", False, "u"),  # ^ only at the start (no multiline)
    ("^abc", "abc\n", True, "u"),
    ("^a.c$", "a\u2028c", False, "u"),
    ("^a.c$", "a\x85c", True, "u"),  # NEL is no ECMA line terminator
    ("^a.c$", "a\U0001F600c", True, "u"),  # code points, not UTF-16 units
    ("^\\cJ$", "\n", True, "u"),
    ("^\\cc$", "\x03", True, "u"),
    ("^\\cC$", "\\cC", False, "u"),
    ("^a\\0b$", "a\x00b", True, "u"),
    ("^\\t$", "\t", True, "u"),
    ("^\\t$", "\\t", False, "u"),
    ("^\\u00e9$", "\u00e9", True, "u"),
    ("^\\u{1F600}$", "\U0001F600", True, "u"),
    ("^\\uD83D\\uDE00$", "\U0001F600", True, "u"),  # a surrogate pair escape is one code point
    ("^\\x41$", "A", True, "u"),
    ("^[\\b]$", "\x08", True, "u"),
    ("^a{,2}$", "a{,2}", True, ""),  # Annex B: not a quantifier
    ("^a{,2}$", "aa", False, ""),
    ("^\\-\\_\\/$", "-_/", True, ""),  # Annex B identity escapes
    ("^[\\w-.]+$", "a-b.c", True, ""),  # Annex B: a class escape as a range end is a union
    ("^\\p{Letter}cole$", "\u00e9cole", True, "u"),
    ("\\p{Letter}cole", "\u00c9COLE", False, "u"),
    ("^\\p{Lu}", "\u00c9t\u00e9", True, "u"),
    ("^\\p{gc=Nd}+$", "\u06634", True, "u"),
    ("^(?<y>\\d{4})-\\d\\d$", "2024-01", True, "u"),
    ("^(?<y>\\d{4})-\\d\\d$", "\u0662\u0660\u0662\u0664-01", False, "u"),
    ("\\d", "\u0663", False, "u"),
    ("\\w+\\s\\w+", "caf\u00e9\ufeffbar", False, "u"),
    ("\\w+\\s\\w+", "cafe\ufeffbar", True, "u"),
    ("^\\S+$", "a\x1cb", True, "u"),  # U+001C is \s for re, not for ECMA
    ("^(?:a|b)*c?$", "abab", True, "u"),
    ("(?i)^stra\u00dfe$", "STRA\u00dfE", True, None),  # leading (?i): an extension
]

# Python-only syntax: an error under ECMA-262 that says so; Python's meaning under "python"
PYTHON_ONLY = ["^a\\Z", "\\Aa", "(?P<n>a)", "(?P<n>a)(?P=n)", "(?x)a b", "\\N{DIGIT ONE}",
               "\\U0001F600", "\\a", "(?#note)a"]
# possessive quantifiers: not ECMA-262, and not expressible for the Python dialect either
POSSESSIVE = ["a++", "a*+", "a?+"]
# valid ECMA-262 that no grammar expresses exactly: the same error in both dialects
UNSUPPORTED = ["(?=a)", "(?<=a)b", "(a)\\1", "\\bfoo", "a\\B"]


def python_verdict(pattern: str, s: str) -> bool:
    return re.search(pattern, s) is not None


def compact(value: object) -> str:
    """``value`` as the grammar spells it (compact separators, declared names unescaped)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def spellings(s: str) -> set[str]:
    """The JSON string literal ``s`` in several spellings (raw, \\u escapes in both cases)."""
    ascii_ = json.dumps(s)
    return {json.dumps(s, ensure_ascii=False), ascii_,
            re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(), ascii_)}


def _options(dialect: str, language: str) -> JsonSchemaOptions:
    o = JsonSchemaOptions(regex_dialect=dialect, formats="annotation")
    return o.for_validation() if language == "validation" else o.for_generation()


@lru_cache(maxsize=None)
def _compiled(schema_json: str, dialect: str, language: str = "validation"):
    return compile_json_schema(json.loads(schema_json), options=_options(dialect, language))


def compiled(schema: dict, dialect: str, language: str = "validation"):
    return _compiled(json.dumps(schema), dialect, language)


def verdicts(pattern: str, dialect: str) -> dict[str, bool]:
    """The expected verdict of ``^pattern$`` on every probe, in ``dialect``."""
    if dialect == "ecma262":
        return {c: CLASSES[pattern](c) for c in PROBES}
    return {c: python_verdict(f"^{pattern}$", c) for c in PROBES}


def _class_cases() -> list[tuple[str, str]]:
    return [(p, d) for p in CLASSES for d in DIALECTS if d == "ecma262" or p not in NOT_PYTHON]


# ---------------------------------------------------------------------------
# The option
# ---------------------------------------------------------------------------

def test_option_default_and_validation() -> None:
    assert JsonSchemaOptions().regex_dialect == "ecma262"
    assert JsonSchemaOptions(regex_dialect="python").regex_dialect == "python"
    with pytest.raises(ConfigError) as ei:
        JsonSchemaOptions(regex_dialect="pcre")
    assert ei.value.key == "regex_dialect"
    from structgen.settings import loads_settings

    assert loads_settings("json_schema:\n  regex_dialect: python\n").json_schema.regex_dialect == "python"


def test_dialects_never_share_a_grammar() -> None:
    schema = {"type": "string", "pattern": "^\\w$"}
    ecma = compile_json_schema(schema, options=_options("ecma262", "validation"))
    py = compile_json_schema(schema, options=_options("python", "validation"))
    assert ecma is not py
    assert py.accepts('"\u00e9"') and not ecma.accepts('"\u00e9"')
    # and the cached grammars come back for the right dialect
    assert compile_json_schema(schema, options=_options("ecma262", "validation")) is ecma
    assert not compile_json_schema(schema, options=_options("ecma262", "validation")).accepts('"\u00e9"')


def test_regex_constraint_kind_keeps_python_re() -> None:
    """``compile_constraint("regex", ...)`` is not JSON Schema: Python's re, full match."""
    g = compile_constraint("regex", "\\w\\d")
    assert g.accepts("\u00e9\u0663".encode())
    assert g.accepts(b"a1")


# ---------------------------------------------------------------------------
# Validation: single-character classes, then whole patterns
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,dialect", _class_cases())
def test_pattern_validation(pattern: str, dialect: str) -> None:
    cg = compiled({"type": "string", "pattern": f"^{pattern}$"}, dialect)
    for c, want in verdicts(pattern, dialect).items():
        for text in spellings(c):
            assert cg.accepts(text) == want, (pattern, dialect, c, text)


@pytest.mark.parametrize("pattern,s,want,_flags", ROWS)
def test_whole_patterns(pattern: str, s: str, want: bool, _flags: str | None) -> None:
    cg = compiled({"type": "string", "pattern": pattern}, "ecma262")
    for text in spellings(s):
        assert cg.accepts(text) == want, (pattern, s, text)
    assert Pattern(pattern).search(s) == want
    gen = compiled({"type": "string", "pattern": pattern}, "ecma262", "generation")
    assert gen.accepts(json.dumps(s, ensure_ascii=False)) == want


@pytest.mark.parametrize("pattern,s", [(p, s) for p, s, _w, _f in ROWS])
def test_python_dialect_is_re(pattern: str, s: str) -> None:
    try:
        want = python_verdict(pattern, s)
    except re.error:
        with pytest.raises(UnsupportedFeatureError, match="not a valid Python regex"):
            compiled({"type": "string", "pattern": pattern}, "python")
        return
    try:
        cg = compiled({"type": "string", "pattern": pattern}, "python")
    except SchemaError as e:  # re matches lone surrogates only: no JSON string is valid
        assert "unsatisfiable" in str(e) and not want
        return
    for text in spellings(s):
        assert cg.accepts(text) == want, (pattern, s, text)
    assert Pattern(pattern, "python").search(s) == want


def test_python_pattern() -> None:
    """The re spelling of a pattern, for validators that run Python's re (jsonschema)."""
    assert python_pattern("\\w\\Z", "python") == "\\w\\Z"
    assert python_pattern("\\w\\Z") is None  # not ECMA-262
    for pattern, s, want, _flags in ROWS:
        source = python_pattern(pattern)
        assert source is not None and (re.search(source, s) is not None) == want, (pattern, s)


def test_multiline_modifier_uses_ecma_line_terminators() -> None:
    """``(?m)`` (an extension) makes ^ and $ see all four line terminators, as ECMA's m flag."""
    for pattern in ("(?m)^b$", "(?m)^b", "(?m)b$"):
        cg = compiled({"type": "string", "pattern": pattern}, "ecma262")
        for sep in ("\n", "\r", "\u2028", "\u2029", "\x85", "x"):
            s = f"a{sep}b{sep}c"
            want = ord(sep) in LINE_TERMINATORS
            assert cg.accepts(json.dumps(s)) == want, (pattern, repr(sep))
            assert Pattern(pattern).search(s) == want, (pattern, repr(sep))


# ---------------------------------------------------------------------------
# Finite sets: the normaliser tests single strings
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,dialect", _class_cases())
def test_enum_with_pattern(pattern: str, dialect: str) -> None:
    cg = compiled({"enum": PROBES + [1, None], "pattern": f"^{pattern}$"}, dialect)
    for c, want in verdicts(pattern, dialect).items():
        assert cg.accepts(json.dumps(c)) == want, (pattern, dialect, c)
    assert cg.accepts("1") and cg.accepts("null")


@pytest.mark.parametrize("pattern,dialect", _class_cases())
def test_declared_names_under_pattern_properties(pattern: str, dialect: str) -> None:
    """A declared name matched by a patternProperties pattern gets that schema too."""
    cg = compiled({"type": "object", "properties": {c: True for c in PROBES},
                   "patternProperties": {f"^{pattern}$": {"type": "integer"}}}, dialect)
    for c, matched in verdicts(pattern, dialect).items():
        assert cg.accepts(compact({c: 1})), (pattern, c)
        assert cg.accepts(compact({c: "s"})) == (not matched), (pattern, dialect, c)


# ---------------------------------------------------------------------------
# Property-name languages
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,dialect", _class_cases())
def test_pattern_properties_keys(pattern: str, dialect: str) -> None:
    cg = compiled({"type": "object", "patternProperties": {f"^{pattern}$": {"type": "integer"}},
                   "additionalProperties": {"type": "string"}}, dialect)
    for c, matched in verdicts(pattern, dialect).items():
        for key in spellings(c):
            assert cg.accepts("{" + key + ":1}") == matched, (pattern, dialect, key)
            assert cg.accepts("{" + key + ':"s"}') == (not matched), (pattern, dialect, key)


@pytest.mark.parametrize("pattern,dialect", _class_cases())
def test_property_names_pattern(pattern: str, dialect: str) -> None:
    cg = compiled({"type": "object", "propertyNames": {"pattern": f"^{pattern}$"}}, dialect)
    for c, want in verdicts(pattern, dialect).items():
        assert cg.accepts(compact({c: 0})) == want, (pattern, dialect, c)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", PYTHON_ONLY + POSSESSIVE)
def test_python_only_syntax_is_an_ecma_error(pattern: str) -> None:
    for schema, pointer, keyword in (
            ({"properties": {"x": {"type": "string", "pattern": pattern}}}, "#/properties/x", "pattern"),
            ({"patternProperties": {pattern: True}}, "#", "patternProperties"),
            ({"propertyNames": {"pattern": pattern}}, "#/propertyNames", "pattern")):
        with pytest.raises(UnsupportedFeatureError) as ei:
            compiled(schema, "ecma262")
        assert (ei.value.pointer, ei.value.keyword) == (pointer, keyword), str(ei.value)
        assert "is not a valid ECMA-262 regular expression" in str(ei.value)
        assert repr(pattern) in str(ei.value)


@pytest.mark.parametrize("pattern", [p for p in PYTHON_ONLY if "(?P=" not in p])  # no backrefs
def test_python_only_syntax_keeps_its_meaning_in_the_python_dialect(pattern: str) -> None:
    cg = compiled({"type": "string", "pattern": pattern}, "python")
    for s in ("a", "1", "\U0001F600", "\x07", "ab", "aa", "xa", "a\n"):
        assert cg.accepts(json.dumps(s)) == python_verdict(pattern, s), (pattern, s)


@pytest.mark.parametrize("pattern,dialect", [(p, d) for p in UNSUPPORTED for d in DIALECTS]
                         + [(p, "python") for p in POSSESSIVE])
def test_unsupported_constructs_keep_their_error(pattern: str, dialect: str) -> None:
    with pytest.raises(UnsupportedFeatureError, match="cannot be compiled to a grammar") as ei:
        compiled({"type": "string", "pattern": pattern}, dialect)
    assert "not supported" in str(ei.value)
    assert (ei.value.pointer, ei.value.keyword) == ("#", "pattern")


def test_lenient_mode_drops_an_invalid_pattern_with_a_warning() -> None:
    cg = compile_json_schema({"type": "string", "pattern": "^a\\Z"},
                             options=JsonSchemaOptions(lenient=True).for_validation())
    assert cg.accepts('"b"')
    assert any("ECMA-262" in w for w in schema_warnings(cg))


# ---------------------------------------------------------------------------
# Generation: the canonical language, token masks and random walks
# ---------------------------------------------------------------------------

def _vocab() -> tuple[ToyVocab, dict[str, int]]:
    """Every single byte, plus one token per probe whose canonical JSON spelling is longer
    than one byte; EOS last. Returns the vocabulary and probe -> its token id."""
    tokens: list[bytes | None] = [bytes([b]) for b in range(256)]
    ids: dict[str, int] = {}
    for c in PROBES:
        spelled = json.dumps(c, ensure_ascii=False)[1:-1].encode()
        if len(spelled) == 1:
            ids[c] = spelled[0]
        else:
            ids[c] = len(tokens)
            tokens.append(spelled)
    tokens.append(None)
    return ToyVocab(tokens, (len(tokens) - 1,), len(tokens)), ids


@pytest.mark.parametrize("pattern,dialect", _class_cases())
def test_generation_masks(pattern: str, dialect: str) -> None:
    schema = {"type": "string", "pattern": f"^{pattern}$"}
    expected = verdicts(pattern, dialect)
    cg = compiled(schema, dialect, "generation")
    for c, want in expected.items():
        assert cg.accepts(json.dumps(c, ensure_ascii=False)) == want, (pattern, dialect, c)
    g = compile_constraint("json", schema, json_options=JsonSchemaOptions(regex_dialect=dialect))
    vocab, ids = _vocab()
    m = Matcher(g, vocab)
    assert m.accept_token(ord('"'))
    allowed = set(m.allowed_token_ids())
    for c, want in expected.items():
        assert (ids[c] in allowed) == want, (pattern, dialect, c)


WALK_PATTERN = "^\\W\\s\\D.\\w\\S$"


def _walk_ok(value: str, dialect: str) -> bool:
    if dialect == "python":
        return python_verdict(WALK_PATTERN, value)
    checks = (CLASSES["\\W"], CLASSES["\\s"], CLASSES["\\D"], CLASSES["."], CLASSES["\\w"], CLASSES["\\S"])
    return len(value) == len(checks) and all(f(c) for f, c in zip(checks, value))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_random_walks_produce_only_matching_strings(dialect: str) -> None:
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": WALK_PATTERN}},
              "required": ["v"], "additionalProperties": False}
    g = compile_constraint("json", schema, json_options=JsonSchemaOptions(regex_dialect=dialect))
    vocab, ids = _vocab()
    probe_ids = set(ids.values())
    eos = vocab.eos_token_ids[0]
    rng = random.Random(7)
    produced = set()
    for _walk in range(40):
        m = Matcher(g, vocab)
        out = []
        while not m.is_accepting():
            allowed = [t for t in m.allowed_token_ids() if t != eos]
            assert allowed and len(out) < 200
            favoured = [t for t in allowed if t in probe_ids]
            t = rng.choice(favoured if favoured and rng.random() < 0.8 else allowed)
            assert m.accept_token(t)
            out.append(vocab.token_bytes[t])
        value = json.loads(b"".join(out))["v"]
        assert _walk_ok(value, dialect), (dialect, value)
        produced.add(value)
    assert len(produced) > 20
    if dialect == "ecma262":  # the walks reach the characters where the dialects differ
        assert any(set(v) & {"\ufeff", "\u00e9", "\u0663", "\x85", "\u2028"} for v in produced)


# ---------------------------------------------------------------------------
# Property test: random patterns built from ECMA atoms vs the same pattern spelled for re
# ---------------------------------------------------------------------------

def _re_class(chars: set[int]) -> str:
    return "[" + "".join(f"\\U{c:08x}" for c in sorted(chars)) + "]"


# ECMA source -> an re pattern with the ECMA meaning, spelled from the hand tables
ATOMS = {
    "\\d": "[0-9]", "\\D": "[^0-9]", "\\w": "[A-Za-z0-9_]", "\\W": "[^A-Za-z0-9_]",
    "\\s": _re_class(ECMA_SPACE), "\\S": "[^" + _re_class(ECMA_SPACE)[1:],
    ".": "[^\\n\\r\\u2028\\u2029]", "a": "a", "\\u00e9": "\u00e9", "\\cJ": "\\n",
    "[^\\s\\d]": "[^" + _re_class(ECMA_SPACE | set(range(0x30, 0x3A)))[1:],
}
QUANTIFIERS = ["", "", "?", "*", "+", "{2}", "{1,2}"]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(atoms=st.lists(st.tuples(st.sampled_from(sorted(ATOMS)), st.sampled_from(QUANTIFIERS)),
                      min_size=1, max_size=4),
       start=st.booleans(), end=st.booleans(),
       texts=st.lists(st.text(alphabet=st.sampled_from(PROBES), max_size=5), min_size=6, max_size=12))
def test_random_patterns_agree_with_the_hand_tables(atoms, start, end, texts) -> None:
    ecma = ("^" if start else "") + "".join(a + q for a, q in atoms) + ("$" if end else "")
    oracle = re.compile(("\\A" if start else "") + "".join(f"(?:{ATOMS[a]}){q}" for a, q in atoms)
                        + ("\\Z" if end else ""))
    wants = [oracle.search(s) is not None for s in texts]
    cg = compiled({"type": "string", "pattern": ecma}, "ecma262")
    for s, want in zip(texts, wants):
        assert cg.accepts(json.dumps(s)) == want, (ecma, s)
    if not any(wants):  # no enum value matches: the normaliser finds the schema empty
        with pytest.raises(SchemaError, match="unsatisfiable"):
            compiled({"enum": texts, "pattern": ecma}, "ecma262")
        return
    enum = compiled({"enum": texts, "pattern": ecma}, "ecma262")
    for s, want in zip(texts, wants):
        assert enum.accepts(json.dumps(s)) == want, (ecma, s)


# ---------------------------------------------------------------------------
# The hand tables against an independent ECMAScript engine
# ---------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("node") is None, reason="node (an ECMAScript engine) not found")
def test_hand_tables_agree_with_node() -> None:
    cases = [(p, f, s) for p, s, _w, f in ROWS if f is not None]
    cases += [(f"^{p}$", "u", c) for p in CLASSES if p != "\\p{digit}" for c in PROBES]
    script = ("const d = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "process.stdout.write(JSON.stringify(d.map(([p, f, s]) => new RegExp(p, f).test(s))));")
    out = subprocess.run(["node", "-e", script], input=json.dumps(cases), capture_output=True, text=True,
                         timeout=60, check=True)
    got = json.loads(out.stdout)
    want = [w for _p, _s, w, f in ROWS if f is not None]
    want += [CLASSES[p](c) for p in CLASSES if p != "\\p{digit}" for c in PROBES]
    bad = [(p, f, s, g) for (p, f, s), g, w in zip(cases, got, want) if g != w]
    assert not bad, bad


def test_structgen_validate_reads_patterns_as_ecma262() -> None:
    """`structgen validate`'s jsonschema verdict follows the same dialect as the grammar: a
    non-ASCII digit does not match ``\\d``, ``\\p{L}`` is a valid pattern, a final newline is not
    an end, and messages show the schema's own pattern."""
    from structgen.validation import SchemaValidator, iter_documents

    def verdicts(schema: dict, values: list) -> list[bool]:
        validator = SchemaValidator(schema)
        text = "\n".join(json.dumps(v, ensure_ascii=False) for v in values).encode()
        return [r.valid for r in (validator.validate(d, "-") for d in iter_documents(io.BytesIO(text)))]

    digits = {"type": "string", "pattern": "^\\d+$"}
    assert verdicts(digits, ["123", "\u0663", "12\n"]) == [True, False, False]
    assert verdicts({"type": "string", "pattern": "^\\p{L}+$"}, ["abc\u00e9", "a1"]) == [True, False]
    assert verdicts({"type": "object", "patternProperties": {"^\\w+$": {"type": "integer"}},
                     "additionalProperties": False}, [{"ab_1": 1}, {"\u00e9": 1}]) == [True, False]
    validator = SchemaValidator({"type": "string", "pattern": "^\\d+$"})
    result = next(validator.validate(d, "-") for d in iter_documents(io.BytesIO('"\u0663"'.encode())))
    assert any("'^\\\\d+$'" in e.message for e in result.errors), [e.message for e in result.errors]
    assert result.grammar is False  # the grammar agrees: no "structgen grammar gap" note
    assert not any("gap" in n for n in result.notes)
