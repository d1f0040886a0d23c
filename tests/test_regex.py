"""structgen.frontends.regex against independent oracles.

Oracles: Python's ``re`` (python dialect, full match and search), ``json.dumps`` (the
JSON-string encoding), ``unicodedata`` (\\p classes), Python's UTF-8 codec (byte-level
encoding of code-point sets). The IR is evaluated with the automaton when it is
importable, else with the reference interpreter ``structgen.grammar.ir.reference_accepts``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import unicodedata
import warnings
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from structgen.errors import RegexError
from structgen.frontends import unicode_data as ud
from structgen.frontends.regex import (
    MAX_REPEAT,
    CharSet,
    any_char_expr,
    char_class_expr,
    compile_regex,
    parse_regex,
)
from structgen.grammar import ir

try:
    from structgen.grammar.compiler import compile_grammar
except ImportError:  # pragma: no cover - before the automaton exists
    compile_grammar = None
if os.environ.get("STRUCTGEN_TEST_REFERENCE_ORACLE"):  # evaluate with the IR interpreter only
    compile_grammar = None

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def accepter(expr: ir.Expr):
    """bytes -> bool for the language of ``expr``."""
    if expr == ir.NEVER:  # the automaton refuses empty languages
        return lambda data: False
    g = ir.Grammar({"s": expr}, "s")
    if compile_grammar is not None:
        cg = compile_grammar(g)
        return cg.accepts
    return lambda data: ir.reference_accepts(g, data)


@lru_cache(maxsize=None)
def regex_accepter(pattern: str, **kw):
    return accepter(compile_regex(pattern, **kw))


def _cached(pattern: str, **kw):
    return regex_accepter(pattern, **dict(sorted(kw.items())))


def strings(alphabet: str, max_len: int):
    for n in range(max_len + 1):
        for t in itertools.product(alphabet, repeat=n):
            yield "".join(t)


# ---------------------------------------------------------------------------
# Python dialect vs re: exhaustive short strings + hypothesis longer ones
# ---------------------------------------------------------------------------

PY_CASES = [
    ("abc", "abcx"),
    ("a|b|cd", "abcd"),
    ("a*", "ab"),
    ("a+b?", "ab"),
    ("(ab)*c", "abc"),
    ("a{2,3}", "ab"),
    ("a{2}", "ab"),
    ("a{,2}b", "ab"),
    ("a{2,}", "ab"),
    ("a{}", "a{}"),
    ("a{1", "a{1"),
    ("(?:a|bc){1,3}", "abc"),
    ("[a-c]+", "abcd"),
    ("[^a-c]", "abcd\n"),
    ("[]a]+", "]ab"),
    ("[a-]+", "a-b"),
    ("[\\-a]+", "-ab"),
    ("[\\]\\\\]", "]\\a"),
    ("a.b", "ab\n"),
    ("(?s)a.b", "ab\n"),
    ("\\d+", "1a\u0663\u00b2"),
    ("\\w+", "a_1 \u00e9-\u00b2"),
    ("\\s", " \t\n\u00a0\u2028\x1cx"),
    ("\\D\\W\\S", "1 a_\u00a0"),
    ("[\\d\\s]+", "1 a\t"),
    ("[^\\W\\d]+", "a1_ \u00e9"),
    ("\\x41\\u00e9\\U0001F600", "A\u00e9\U0001F600x"),
    ("\\N{GREEK SMALL LETTER ALPHA}+", "\u03b1a"),
    ("\\0\\07\\101", "\x00\x07Aa"),
    ("[\\1-\\3]", "\x01\x02\x03\x04"),
    ("\\.\\*\\+\\?\\(\\)\\{\\}\\|\\^\\$", ".*+?(){}|^$"),
    ("a|", "ab"),
    ("(a|)b", "ab"),
    ("()", "a"),
    ("x*?y+?z??", "xyz"),
    ("a{1,2}?b", "ab"),
    ("^ab$", "ab\n"),
    ("^a|b$", "ab\n"),
    ("\\Aab\\Z", "ab\n"),
    ("(^a|b)c", "abc"),
    ("(?:^a)?b", "ab"),
    ("(?m)^ab$", "ab\n"),
    ("(?m)^a", "a\nb"),
    ("(?m)b$", "b\na"),
    ("a$", "a\n"),
    ("$", "a\n"),
    ("^", "a\n"),
    ("^$", "a\n"),
    ("(?i)abc", "aAbBcK"),
    ("(?i)[a-k]+", "aAkK\u212a"),
    ("(?i)s", "sS\u017fx"),
    ("(?i)[^s]", "sS\u017fx"),
    ("(?i)\u00df", "\u00df\u1e9esS"),
    ("(?i)[\u0130]", "iI\u0130\u0131"),
    ("(?i)\u03c3+", "\u03c3\u03c2\u03a3s"),
    ("(?i:a)b", "aAbB"),
    ("a(?i:b)c", "aAbBcC"),
    ("(?i)a(?-i:b)", "aAbB"),
    ("(?a)\\w+", "a\u00e91_"),
    ("(?a)(?i)k", "kK\u212a"),
    ("(?x) a b # comment\n c", "abc "),
    ("(?x)[ ]a\\ ", " a"),
    ("(?x)a *", "a "),
    ("(?P<x>a)(?#comment)b", "ab"),
    ("\U0001F600+|\u00e9", "\U0001F600\u00e9a"),
    ("[\u00e0-\U0001F600]", "a\u00e0\u0800\uffff\U0001F600\U0001F601"),
    ("[^\x00-\x7f]+", "a\u00e9\u20ac\U00010000"),
]


@pytest.mark.parametrize("pattern,alphabet", PY_CASES)
def test_python_dialect_matches_re_exhaustively(pattern: str, alphabet: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rx = re.compile(pattern)
    full = _cached(pattern)
    srch = _cached(pattern, search=True)
    max_len = 4 if len(alphabet) <= 4 else 3
    for s in strings(alphabet, max_len):
        data = s.encode()
        assert full(data) == (rx.fullmatch(s) is not None), (pattern, s, "fullmatch")
        assert srch(data) == (rx.search(s) is not None), (pattern, s, "search")


@pytest.mark.parametrize("pattern,alphabet", PY_CASES[::3])
@SETTINGS
@given(data=st.data())
def test_python_dialect_matches_re_hypothesis(pattern: str, alphabet: str, data) -> None:
    s = data.draw(st.text(alphabet=alphabet, max_size=12))
    rx = re.compile(pattern)
    assert _cached(pattern)(s.encode()) == (rx.fullmatch(s) is not None)
    assert _cached(pattern, search=True)(s.encode()) == (rx.search(s) is not None)


# random patterns from a small grammar, compared with re
_ATOMS = ["a", "b", "[ab]", "[^a]", ".", "\\d", "\\n", "(?:)", "[a-c]", "\\w", "\u00e9",
          "\U0001F600", "\\s", "A"]
_QUANTS = ["*", "+", "?", "{2}", "{1,2}", "{0,3}", "*?", "{2,}", "??"]


def _patterns():
    def extend(children):
        return st.one_of(
            st.lists(children, min_size=2, max_size=3).map("".join),
            st.lists(children, min_size=2, max_size=3).map(lambda xs: "(?:" + "|".join(xs) + ")"),
            st.tuples(children, st.sampled_from(_QUANTS)).map(lambda t: "(?:" + t[0] + ")" + t[1]),
            children.map(lambda x: "(" + x + ")"),
        )
    body = st.recursive(st.sampled_from(_ATOMS), extend, max_leaves=6)
    return st.tuples(st.sampled_from(["", "(?i)", "(?s)", "(?m)"]), st.sampled_from(["", "^", "\\A"]),
                     body, st.sampled_from(["", "$", "\\Z"]), st.sampled_from(["", "|b$", "|^a"]),
                     ).map("".join)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=_patterns(), texts=st.lists(st.text(alphabet="ab1 \n\u00e9A_\U0001F600", max_size=7),
                                          min_size=4, max_size=8))
def test_random_patterns_match_re(pattern: str, texts: list[str]) -> None:
    rx = re.compile(pattern)
    full = accepter(compile_regex(pattern))
    srch = accepter(compile_regex(pattern, search=True))
    for s in texts + ["", "a", "b\n", "ab"]:
        assert full(s.encode()) == (rx.fullmatch(s) is not None), (pattern, s)
        assert srch(s.encode()) == (rx.search(s) is not None), (pattern, s)


# ---------------------------------------------------------------------------
# Character sets: exact against re / unicodedata over every code point
# ---------------------------------------------------------------------------

def _re_set(pattern: str) -> ud.RangeSet:
    allchars = ud._all_chars()
    m = re.fullmatch(r"((?:\(\?[a-z]+\))*)(.*)", pattern, re.DOTALL)
    assert m is not None
    rx = re.compile(f"{m.group(1)}(?:{m.group(2)})+")
    return tuple((m.start(), m.end() - 1) for m in rx.finditer(allchars))


@pytest.mark.parametrize("pattern", [
    "\\d", "\\w", "\\s", "\\D", "\\W", "\\S", ".", "(?s).", "[^\\W\\d]", "[\\s\\d]",
    "(?a)\\w", "(?a)\\s", "(?a)\\d",
    "(?i)[a-z]", "(?i)[^a-z]", "(?i)k", "(?i)[\u0100-\u017f]", "(?i)[\u0370-\u03ff]",
    "(?i)[\u0400-\u04ff]", "(?i)[\u1e00-\u1fff]", "(?i)[\u2100-\u2c7f]",
    "(?i)[\U00010400-\U0001044f]", "(?a)(?i)[a-z]", "(?i)[^\u00b5]",
])
def test_char_sets_equal_re_over_all_code_points(pattern: str) -> None:
    node = parse_regex(pattern)
    assert isinstance(node, CharSet)
    assert node.ranges == _re_set(pattern)


@lru_cache(maxsize=1)
def _cased() -> list[int]:
    import _sre

    return sorted(set(ud._fold_tables()[0])
                  | {cp for cp in range(ud.MAX_CODE_POINT + 1) if _sre.unicode_iscased(cp)})


def test_case_fold_of_every_cased_literal_agrees_with_re() -> None:
    # every cased code point: our class of c is exactly what re's IGNORECASE
    # literal c matches among the candidates (our class plus the str case mappings of c)
    for cp in _cased():
        c = chr(cp)
        rs = parse_regex(re.escape(c), flags="i").ranges
        ours = {x for lo, hi in rs for x in range(lo, hi + 1)}
        cands = set(ours)
        for f in (c.lower(), c.upper(), c.title(), c.casefold(), c.swapcase()):
            if len(f) == 1:
                cands.add(ord(f))
        rx = re.compile(re.escape(c), re.IGNORECASE)
        theirs = {x for x in cands if rx.fullmatch(chr(x))}
        assert ours == theirs, (hex(cp), sorted(map(hex, ours ^ theirs)))


@SETTINGS
@given(cp=st.integers(0, ud.MAX_CODE_POINT),
       cat=st.sampled_from(["L", "Lu", "Ll", "Lt", "Lm", "Lo", "N", "Nd", "Nl", "No", "P", "Pd",
                            "S", "Sm", "Z", "Zs", "C", "Cc", "Cn", "M", "Mn", "Letter",
                            "Uppercase_Letter", "Decimal_Number", "Punctuation"]))
def test_property_classes_follow_unicodedata(cp: int, cat: str) -> None:
    short = ud.CATEGORY_ALIASES.get(cat, cat)
    expected = unicodedata.category(chr(cp)).startswith(short)
    for dialect in ("python", "ecma"):
        assert ud.contains(parse_regex(f"\\p{{{cat}}}", dialect=dialect).ranges, cp) == expected
        assert ud.contains(parse_regex(f"\\P{{{cat}}}", dialect=dialect).ranges, cp) != expected


# ---------------------------------------------------------------------------
# Byte-level encodings
# ---------------------------------------------------------------------------

_BOUNDARIES = [0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF, 0xE000, 0xFFFF, 0x10000,
               0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFF]
_cps = st.one_of(st.sampled_from(_BOUNDARIES), st.integers(0, ud.MAX_CODE_POINT),
                 st.integers(0, 0x1000)).filter(lambda c: not 0xD800 <= c <= 0xDFFF)
_range_sets = st.lists(st.tuples(_cps, _cps).map(lambda t: (min(t), max(t))), min_size=0, max_size=5)


@FAST
@given(ranges=_range_sets, probes=st.lists(_cps, min_size=1, max_size=20))
def test_char_class_expr_utf8_membership(ranges, probes) -> None:
    rs = ud.normalize(ranges)
    acc = accepter(char_class_expr(ranges))
    for cp in probes + [lo for lo, _ in rs] + [hi for _, hi in rs] + [hi + 1 for _, hi in rs]:
        if cp > ud.MAX_CODE_POINT or 0xD800 <= cp <= 0xDFFF:
            continue
        assert acc(chr(cp).encode()) == ud.contains(rs, cp), hex(cp)


def test_any_char_is_exactly_valid_utf8_up_to_two_bytes() -> None:
    acc = accepter(any_char_expr())
    for n in (1, 2):
        for t in itertools.product(range(256), repeat=n):
            data = bytes(t)
            try:
                ok = len(data.decode("utf-8")) == 1
            except UnicodeDecodeError:
                ok = False
            assert acc(data) == ok, data


@SETTINGS
@given(data=st.binary(min_size=3, max_size=4))
def test_any_char_is_exactly_valid_utf8_three_four_bytes(data: bytes) -> None:
    try:
        ok = len(data.decode("utf-8")) == 1
    except UnicodeDecodeError:
        ok = False
    assert accepter_any()(data) == ok


@lru_cache(maxsize=1)
def accepter_any():
    return accepter(any_char_expr())


def test_any_char_rejects_surrogates_and_overlongs() -> None:
    acc = accepter_any()
    for bad in (b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\x80", b"\xe0\x80\x80",
                b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80"):
        assert not acc(bad)
    assert not accepter(any_char_expr(exclude_newline=True))(b"\n")
    assert accepter(any_char_expr(exclude_newline=True))(b"\r")


def _json_spellings(cp: int) -> list[str]:
    """Every way json.dumps-style writers may spell one code point inside a string."""
    c = chr(cp)
    out = {json.dumps(c)[1:-1], json.dumps(c, ensure_ascii=False)[1:-1]}
    if cp <= 0xFFFF:
        out |= {f"\\u{cp:04x}", f"\\u{cp:04X}", f"\\u{cp:04x}".upper().replace("\\U", "\\u")}
    else:
        v = cp - 0x10000
        hi, lo = 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)
        out |= {f"\\u{hi:04x}\\u{lo:04x}", f"\\u{hi:04X}\\u{lo:04X}", f"\\u{hi:04x}\\u{lo:04X}"}
    if c == "/":
        out.add("\\/")
    return sorted(out)


@FAST
@given(ranges=_range_sets, probes=st.lists(_cps, min_size=1, max_size=10))
def test_char_class_expr_json_membership(ranges, probes) -> None:
    rs = ud.normalize(ranges)
    acc = accepter(char_class_expr(ranges, "json"))
    for cp in probes + [0x22, 0x5C, 0x2F, 0x0A, 0x01, 0x1F, 0x20]:
        for spelling in _json_spellings(cp):
            assert acc(spelling.encode()) == ud.contains(rs, cp), (hex(cp), spelling)


def test_json_encoding_rejects_raw_specials_and_bad_escapes() -> None:
    acc = accepter(any_char_expr("json"))
    for bad in ("\x00", "\x1f", '"', "\\", "\n", "\\x41", "\\u12", "\\ud800", "\\udc00",
                "\\ud800\\u0041", "\\U0041", "\\a", "\\'"):
        assert not acc(bad.encode()), bad
    for good in ("\x7f", "\\u0000", "\\/", "\\ud83d\\ude00", "\U0001F600", "\u2028"):
        assert acc(good.encode()), good


JSON_CASES = [
    ("a+", 'a"\\/'),
    ('[^"]*', 'a"\\\n'),
    ("\\d{2}", "12a\u0663"),
    (".*", 'a\n"\\\x01\u2028\U0001F600'),
    ("[\\x00-\\x1f]+", "\x00\x01\n\t\x1fa"),
    ("(?i)[a-z/]+", "aZ/\\"),
    ("\U0001F600|\u00e9+", "\U0001F600\u00e9a"),
    ("x$", "x\n"),
]


@pytest.mark.parametrize("pattern,alphabet", JSON_CASES)
@SETTINGS
@given(data=st.data())
def test_json_encoding_matches_re_on_every_spelling(pattern: str, alphabet: str, data) -> None:
    s = data.draw(st.text(alphabet=alphabet, max_size=6))
    rx = re.compile(pattern)
    for search in (False, True):
        acc = _cached(pattern, encoding="json", search=search)
        expected = (rx.search(s) if search else rx.fullmatch(s)) is not None
        variants = {json.dumps(s)[1:-1], json.dumps(s, ensure_ascii=False)[1:-1],
                    json.dumps(s)[1:-1].replace("/", "\\/"),
                    re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(),
                           json.dumps(s)[1:-1]),
                    "".join(data.draw(st.sampled_from(_json_spellings(ord(c)))) for c in s)}
        for v in variants:
            assert acc(v.encode()) == expected, (pattern, s, v, search)


# ---------------------------------------------------------------------------
# ECMA dialect (JSON Schema pattern)
# ---------------------------------------------------------------------------

ECMA_CASES = [
    # (pattern, flags, accepted by search, rejected by search)
    ("^\\d{3}-\\d{4}$", "", ["555-1234"], ["555-12345", "\u0663\u0663\u0663-1234", "555-1234\n"]),
    ("^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$", "", ["a.b@c.de"], ["a@b.c", "a@b.cd\n"]),
    ("\\p{L}+", "", ["x\u00e9", "1a2"], ["123", ""]),
    ("^\\p{Lu}", "u", ["\u00c9t\u00e9"], ["\u00e9t\u00e9"]),
    ("\\w", "", ["_"], ["\u00e9", " "]),
    ("\\s", "", ["\ufeff", "\u2028", "\u00a0"], ["\x1c", "x"]),
    ("^a.c$", "", ["abc"], ["a\nc", "a\rc", "a\u2028c"]),
    ("^a.c$", "s", ["a\nc", "a\u2028c"], ["ac"]),
    ("^abc$", "i", ["ABC", "aBc"], ["ab"]),
    ("^\\u{1F600}\\uD83D\\uDE00\\u00e9$", "", ["\U0001F600\U0001F600\u00e9"], ["\u00e9"]),
    ("^[^]$", "", ["\n", "x"], ["", "xy"]),
    ("^[]$", "", [], ["", "x"]),
    ("^\\cJ$", "", ["\n"], ["J"]),
    ("^(?<year>\\d{4})-\\d{2}$", "", ["2024-01"], ["24-01"]),
    ("^a{,2}$", "", ["a{,2}"], ["aa"]),
    ("^a\\-b\\/$", "", ["a-b/"], ["ab"]),
    ("^[\\w-.]+$", "", ["a-b.c_1"], ["a b", "\u00e9"]),
    ("^a|b$", "m", ["x\nb\ny", "a", "x\ra", "b\u2029"], ["x", "ba\n"]),
    # u+i: \w gains U+017F and U+212A, \W loses them; \P{Lu} is folded after complementing
    ("^\\w$", "iu", ["\u017f", "\u212a", "k"], ["\u00e9"]),
    ("^\\W$", "iu", [" "], ["\u017f", "\u212a", "s", "S"]),
    ("^\\P{Lu}$", "iu", ["B", "b", "1"], []),
    ("^\\p{Lu}$", "iu", ["B", "b"], ["1"]),
]


@pytest.mark.parametrize("pattern,flags,good,bad", ECMA_CASES)
def test_ecma_search_hand_cases(pattern: str, flags: str, good: list[str], bad: list[str]) -> None:
    # (the JSON spelling of all letters is a large automaton: utf8 only for \p{L})
    for encoding in ("utf8",) if "\\p{L}" in pattern else ("utf8", "json"):
        acc = _cached(pattern, dialect="ecma", flags=flags, search=True, encoding=encoding)
        for s in good:
            data = s.encode() if encoding == "utf8" else json.dumps(s)[1:-1].encode()
            assert acc(data), (pattern, s, encoding)
        for s in bad:
            data = s.encode() if encoding == "utf8" else json.dumps(s)[1:-1].encode()
            assert not acc(data), (pattern, s, encoding)


@pytest.mark.parametrize("pattern", ["^ab*$", "a|b", "^(?:a|bc)+", "[ab]{2}$", "\\d\\w\\s"])
def test_ecma_ascii_patterns_agree_with_re_ascii(pattern: str) -> None:
    # for ASCII classes ECMA == re with re.ASCII, except that ECMA $ is a strict end
    rx = re.compile(pattern.replace("$", "\\Z").replace("\\s", "[\\s\\xa0\\ufeff\\u2028]"), re.ASCII)
    acc = _cached(pattern, dialect="ecma", search=True)
    for s in strings("abc1 \n\u2028", 4):
        assert acc(s.encode()) == (rx.search(s) is not None), (pattern, s)


NODE_PATTERNS = [
    ("^\\d{3}-\\d{4}$", "u"), ("\\p{L}+", "u"), ("^[^a-z]+$", "iu"), ("\\w\\W", "iu"),
    ("^.$", "u"), ("^.$", "su"), ("^(?:a|b\\u{1F600})*$", "u"), ("\\P{Ll}\\s", "iu"),
    ("^a$|^b", "mu"), ("[\\s\\S]{2}$", "u"), ("^\\uD83D\\uDE00+", "u"), ("(?<n>a)[\\b]", "u"),
    ("\\cJ\\x41\\0", "u"), ("[^\\w\\d]", "iu"), ("^[\\u00e0-\\u{1F600}]$", "iu"),
]


@pytest.mark.skipif(shutil.which("node") is None, reason="node (an independent ECMAScript engine) not found")
def test_ecma_u_mode_agrees_with_node() -> None:
    texts = ["".join(t) for n in range(3)
             for t in itertools.product("aB1 \n\u00e9\u2028\U0001F600\u017f\u212a\x08A", repeat=n)]
    script = (
        "const d = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "process.stdout.write(JSON.stringify(d.p.map(([p, f]) => {"
        " const r = new RegExp(p, f); return d.t.map(t => r.test(t)); })));"
    )
    out = subprocess.run(["node", "-e", script], input=json.dumps({"p": NODE_PATTERNS, "t": texts}),
                         capture_output=True, text=True, timeout=60, check=True)
    results = json.loads(out.stdout)
    for (pattern, flags), expected in zip(NODE_PATTERNS, results):
        acc = _cached(pattern, dialect="ecma", flags=flags, search=True)
        for t, exp in zip(texts, expected):
            assert acc(t.encode()) == exp, (pattern, flags, t)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

# invalid for re as well: (pattern, expected position)
PY_INVALID = [
    ("(", 0), ("a)", 1), ("(a|b", 0), ("[a", 0), ("[z-a]", 1), ("*a", 0), ("a**", 2),
    ("a{2}{3}", 4), ("a{3,2}", 1), ("{1}", 0), ("a|*", 2), ("(?i)a(?s)b", 5), ("\\q", 0),
    ("[a-\\d]", 1), ("[\\A]", 1), ("(?P<1>a)", 4), ("\\8", 0), ("\\400", 0), ("^*", 1),
    ("\\x4", 0), ("\\u12", 0), ("\\N{NOT A NAME}", 0), ("(?", 2), ("(?P<a>x)(?P<a>y)", 12),
    ("(?L)a", 2),
]

# valid for re, but unsupported here (language not expressible, or explicit limits)
PY_UNSUPPORTED = [
    ("(a)\\1", 3), ("(?P<n>a)(?P=n)", 8), ("a(?=b)", 1), ("a(?!b)", 1), ("(?<=a)b", 0),
    ("(?<!a)b", 0), ("\\bfoo", 0), ("a\\B", 1), ("(a)?(?(1)b|c)", 4), ("(?>a)", 0), ("a*+", 2),
    ("a$b", 1), ("a^b", 1), ("(?:^a)*", 3), ("a(^b)", 2), ("(?:a$)+", 4), (f"a{{{MAX_REPEAT + 1}}}", 1),
    (f"a{{1,{MAX_REPEAT + 1}}}", 1),
]


@pytest.mark.parametrize("pattern,pos", PY_INVALID)
def test_python_invalid_patterns_raise_with_position(pattern: str, pos: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(re.error):
            re.compile(pattern)
    with pytest.raises(RegexError) as ei:
        compile_regex(pattern)
    assert ei.value.position == pos, str(ei.value)
    assert ei.value.pattern == pattern


@pytest.mark.parametrize("pattern,pos", PY_UNSUPPORTED)
def test_python_unsupported_constructs_raise_with_position(pattern: str, pos: int) -> None:
    re.compile(pattern)
    with pytest.raises(RegexError) as ei:
        compile_regex(pattern, search=True)
    assert ei.value.position == pos, str(ei.value)


@pytest.mark.parametrize("pattern,flags,pos", [
    ("\\1", "", 0), ("(a)\\k<a>", "", 3), ("(?<=a)", "", 0), ("\\b", "", 0), ("a**", "", 2),
    ("\\q", "", 0), ("\\a", "", 0), ("[b-a]", "", 1), ("\\p{Greek}", "", 0), ("\\p{Script=Latin}", "", 0),
    ("\\u{110000}", "", 0), ("\\@", "u", 0), ("[\\w-.]", "u", 1), ("a{", "u", 1), ("a}", "u", 1),
    ("\\x", "", 0),
    ("\\01", "", 0), ("(?P<a>x)", "", 2), ("(?#c)", "", 2), ("a{5,1}", "", 1), ("\\p{letter}", "", 0),
    ("^a|b^", "m", 4),
])
def test_ecma_errors(pattern: str, flags: str, pos: int) -> None:
    with pytest.raises(RegexError) as ei:
        compile_regex(pattern, dialect="ecma", flags=flags, search=True)
    assert ei.value.position == pos, str(ei.value)


@pytest.mark.parametrize("pattern,pos,says", [
    ("a\\Z", 1, "not ECMA-262"), ("\\Aa", 0, "not ECMA-262"), ("[\\Z]", 1, "not ECMA-262"),
    ("(?P<n>a)", 2, "(?<name>...)"), ("(?P=n)", 2, "Python syntax"), ("a++", 2, "Python syntax"),
    ("a{2}+", 4, "Python syntax"), ("(?x)a b", 2, "ECMA-262 modifiers"), ("(?u:a)", 2, "ECMA-262 modifiers"),
])
def test_ecma_errors_name_python_only_syntax(pattern: str, pos: int, says: str) -> None:
    with pytest.raises(RegexError) as ei:
        compile_regex(pattern, dialect="ecma", search=True)
    assert ei.value.position == pos and says in ei.value.message, str(ei.value)


def test_ecma_modifier_groups() -> None:
    """ES2025 modifiers ``(?i:..)``, ``(?-i:..)``; a leading ``(?i)`` is an extension."""
    for pattern, good, bad in (("^(?i:a)b$", ["ab", "Ab"], ["aB"]), ("(?i)^a(?-i:b)$", ["Ab"], ["AB"]),
                               ("^(?s:.)$", ["\n", "\u2028"], []), ("(?m)^b$", ["a\u2028b"], ["ab"])):
        acc = _cached(pattern, dialect="ecma", search=True)
        for t in good:
            assert acc(t.encode()), (pattern, t)
        for t in bad:
            assert not acc(t.encode()), (pattern, t)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        compile_regex("a", dialect="perl")
    with pytest.raises(ValueError):
        compile_regex("a", encoding="latin1")
    with pytest.raises(RegexError):
        compile_regex("a", flags="q")
    with pytest.raises(ValueError):
        char_class_expr([(0, 0x110000)])


# ---------------------------------------------------------------------------
# Shape of the IR
# ---------------------------------------------------------------------------

def _size(e: ir.Expr) -> int:
    seen: set[int] = set()

    def walk(x: ir.Expr) -> int:
        if id(x) in seen:
            return 0
        seen.add(id(x))
        kids = list(getattr(x, "items", ()))
        if isinstance(x, ir.Repeat):
            kids.append(x.item)
        return 1 + sum(walk(k) for k in kids)

    return walk(e)


def test_ir_is_compact() -> None:
    anyc = any_char_expr()
    assert isinstance(anyc, ir.Alt) and len(anyc.items) <= 8
    assert _size(any_char_expr("json")) < 100
    assert _size(compile_regex("\\p{L}", dialect="ecma")) < 2000
    assert _size(compile_regex("(?i)[a-z]+")) < 20
    assert _size(compile_regex("(?i)[^a-z]")) < 60
    assert _size(compile_regex("\\p{L}", dialect="ecma", encoding="json")) < 6000


def test_backslash_z_is_end_of_string() -> None:
    assert compile_regex("a\\z", search=True) == compile_regex("a\\Z", search=True)


def test_quantifiers_use_repeat_nodes() -> None:
    e = compile_regex(f"a{{{MAX_REPEAT}}}")
    assert isinstance(e, ir.Repeat) and e.min == e.max == MAX_REPEAT
    e = compile_regex("(?:ab){2,}")
    assert isinstance(e, ir.Repeat) and e.min == 2 and e.max is None


def test_compile_regex_grammar() -> None:
    if compile_grammar is None:
        pytest.skip("structgen.grammar.compiler not available")
    from structgen.frontends.regex import compile_regex_grammar

    cg = compile_regex_grammar("^\\d{3}-\\d{4}$", dialect="ecma", search=True)
    assert cg.accepts(b"555-1234")
    assert not cg.accepts(b"555-123")


@given(st.text(max_size=5))
@settings(max_examples=40, deadline=None)
def test_escaped_literal_matches_itself(s: str) -> None:
    assume(not any(0xD800 <= ord(c) <= 0xDFFF for c in s))
    acc = accepter(compile_regex(re.escape(s)))
    assert acc(s.encode())
    assert not acc((s + "x").encode())
