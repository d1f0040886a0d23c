"""JSON Schema ``pattern`` keywords as languages of JSON string content, and as tests of one string.

A pattern is searched anywhere in the decoded string. It is read in one of two dialects
(``JsonSchemaOptions.regex_dialect``):

* ``"ecma262"`` (the default, what JSON Schema specifies): the ``"ecma"`` dialect of
  :mod:`structgen.frontends.regex`, matched by code point (ASCII ``\\d``/``\\w``, ECMA's
  ``\\s``, ``.`` excluding the four line terminators, ``$`` only at the very end, ``\\p{..}``);
* ``"python"``: Python's :mod:`re` (``re.search``, what the ``jsonschema`` package does).

Its language here is over the JSON *spelling* of the string, in the escape forms the grammar
allows (:mod:`structgen.frontends.json_escape`): :func:`compile_pattern`, used by the lowering
(:mod:`structgen.frontends.json_schema.lower`). A :class:`Pattern` -- what string formulas hold
-- tests one string (:meth:`Pattern.search`, for finite sets: ``enum``, ``const``, declared
property names). For an ECMA pattern that test runs Python's ``re`` on a translation of the
parsed pattern (:func:`python_pattern`), in which every character set is spelled out as
code-point ranges, so the test and the grammar agree by construction. :func:`pattern_error`,
used by the normaliser, rejects the patterns that cannot be evaluated or compiled exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from structgen.errors import RegexError
from structgen.frontends import regex
from structgen.grammar import ir
from structgen.json_types import JsonObject, JsonValue

__all__ = ["CONTENT_ENCODING", "DIALECTS", "Pattern", "class_run", "compile_pattern", "pattern_error",
           "python_pattern", "schema_for_re_validators"]

#: the regex compiler's encoding of JSON string content, per ``string_escapes`` mode
CONTENT_ENCODING = {"all": "json", "canonical": "json-canonical"}

#: ``regex_dialect`` option value -> dialect of :mod:`structgen.frontends.regex`
DIALECTS = {"ecma262": "ecma", "python": "python"}


def _dialect(dialect: str) -> str:
    try:
        return DIALECTS[dialect]
    except KeyError:
        raise ValueError(f"unknown regex dialect {dialect!r} (expected one of {tuple(DIALECTS)})") from None


@dataclass(frozen=True, order=True)
class Pattern:
    """A ``pattern`` (or ``patternProperties`` key) with the dialect it is read in: the pattern
    atom of string formulas, so that a formula carries its own matching semantics."""

    source: str
    dialect: str = "ecma262"

    def search(self, s: str) -> bool:
        """Does the pattern match somewhere in ``s``? False for a pattern that cannot be
        evaluated (the normaliser has rejected it, or it is ignored in lenient mode)."""
        rx = _searcher(self.source, self.dialect)
        return rx is not None and rx.search(s) is not None


@lru_cache(maxsize=1024)
def compile_pattern(p: str, escapes: str = "all", dialect: str = "ecma262") -> ir.Expr:
    """The JSON Schema ``pattern`` ``p`` (searched, in ``dialect``) over JSON string content
    spelled with ``escapes`` (see :mod:`structgen.frontends.json_escape`). Cached (1,024
    patterns); raises :class:`~structgen.errors.RegexError` for a pattern it cannot express."""
    return regex.compile_regex(p, dialect=_dialect(dialect), search=True,
                                  encoding=CONTENT_ENCODING[escapes])


def class_run(p: str, dialect: str = "ecma262") -> tuple[tuple[tuple[int, int], ...], int, int | None] | None:
    """``(ranges, lo, hi)`` where pattern ``p`` is one character class repeated between its
    two anchors (``^[a-z0-9_]{2,30}$``, ``^\\d+$``): its strings are exactly the runs of
    ``lo`` to ``hi`` code points out of ``ranges`` (``hi`` None: no bound); else None. A length
    bound on the same string then narrows the run (``maxLength`` counts the same code points)
    instead of being intersected with it as a second automaton."""
    try:
        node = regex.parse_regex(p, dialect=_dialect(dialect))
    except RegexError:
        return None
    while isinstance(node, regex.Group):
        node = node.item
    if not isinstance(node, regex.Concat) or len(node.items) != 3:
        return None
    start, run, end = node.items
    while isinstance(run, regex.Group):
        run = run.item
    if not (isinstance(start, regex.Anchor) and start.kind == "bos" and isinstance(end, regex.Anchor)
            and end.kind == "eos" and isinstance(run, regex.Quantified)):
        return None
    item = run.item
    while isinstance(item, regex.Group):
        item = item.item
    if not isinstance(item, regex.CharSet):
        return None
    return tuple((int(a), int(b)) for a, b in item.ranges), run.min, run.max


def pattern_error(p: str, dialect: str = "ecma262") -> str | None:
    """Why ``p`` cannot be evaluated or compiled exactly in ``dialect``, as the end of a
    sentence starting with the pattern (None if it can)."""
    if dialect == "python":
        try:
            re.compile(p)
        except re.error as e:
            return f"is not a valid Python regex ({e}); the validator cannot evaluate it"
    try:
        compile_pattern(p, "all", dialect)
    except RegexError as e:
        if dialect == "ecma262" and "not supported" not in e.message:
            return ("is not a valid ECMA-262 regular expression (JSON Schema's dialect; "
                    f"regex_dialect='python' reads patterns with Python's re): {e}")
        return f"cannot be compiled to a grammar: {e}"
    return None


# ---------------------------------------------------------------------------
# ECMA pattern -> an equivalent Python re pattern (to test single strings)
# ---------------------------------------------------------------------------

_LT = "\\n\\r\\u2028\\u2029"  # ECMA's line terminators, in re syntax
_ANCHORS = {"bos": "\\A", "eos": "\\Z", "eos_nl": "(?=\\n?\\Z)",
            "bol": f"(?:\\A|(?<=[{_LT}]))", "eol": f"(?=[{_LT}]|\\Z)"}


def _cp(c: int) -> str:
    return f"\\U{c:08x}"


def _py_source(node: regex.RegexNode) -> str:
    """``re`` syntax matching exactly what the parsed ``node`` matches (flags already applied)."""
    rx = regex
    if isinstance(node, rx.CharSet):
        if not node.ranges:
            return "(?!)"
        if len(node.ranges) == 1 and node.ranges[0][0] == node.ranges[0][1]:
            return _cp(node.ranges[0][0])
        return "[" + "".join(_cp(lo) if lo == hi else f"{_cp(lo)}-{_cp(hi)}" for lo, hi in node.ranges) + "]"
    if isinstance(node, rx.Concat):
        return "".join(_py_source(x) for x in node.items)
    if isinstance(node, rx.Alternation):
        return "(?:" + "|".join(_py_source(x) for x in node.items) + ")"
    if isinstance(node, rx.Group):
        return "(?:" + _py_source(node.item) + ")"
    if isinstance(node, rx.Quantified):
        hi = "" if node.max is None else str(node.max)
        return "(?:" + _py_source(node.item) + f"){{{node.min},{hi}}}"
    if isinstance(node, rx.Anchor):
        return _ANCHORS[node.kind]
    raise TypeError(f"unknown regex node {type(node).__name__}")


@lru_cache(maxsize=1024)
def python_pattern(p: str, dialect: str = "ecma262") -> str | None:
    """A Python :mod:`re` pattern whose ``search`` is ``p``'s in ``dialect`` (``p`` itself for
    ``"python"``), or None where ``p`` cannot be evaluated. For an ECMA-262 pattern every
    character set is spelled out as code-point ranges (a general category is hundreds of them)
    and every group is non-capturing. Cached (1,024 patterns)."""
    if dialect == "python":
        return p
    try:
        return _py_source(regex.parse_regex(p, dialect=_dialect(dialect)))
    except (RegexError, RecursionError):
        return None


@lru_cache(maxsize=1024)
def _searcher(p: str, dialect: str) -> re.Pattern[str] | None:
    """``re.compile(python_pattern(p, dialect))``, or None where that fails."""
    source = python_pattern(p, dialect)
    try:
        return None if source is None else re.compile(source)
    except (re.error, RecursionError, OverflowError):
        return None


# keywords whose values are instances, not schemas: a "pattern" key there is data
_INSTANCE_KEYWORDS = frozenset({"const", "enum", "examples", "default"})


def schema_for_re_validators(schema: JsonValue, dialect: str = "ecma262",
                             renamed: dict[str, str] | None = None) -> JsonValue:
    """A copy of ``schema`` for validators that read patterns with Python's :mod:`re` (the
    ``jsonschema`` package): every ``pattern`` value and ``patternProperties`` key becomes
    :func:`python_pattern`'s translation, so such a validator judges patterns as ``dialect``
    does (and as structgen's grammar does). A pattern that cannot be translated is kept as it
    is (the grammar reports it). Values of ``const``, ``enum``, ``examples`` and ``default``
    are data and stay untouched; ``schema`` itself is not changed. ``renamed``, when given,
    gets translation -> original for every pattern that changed (to show users their own
    patterns in the validator's messages)."""
    if dialect == "python":
        return schema

    def translate(p: str) -> str:
        if not isinstance(p, str):
            return p
        out = python_pattern(p, dialect) or p
        if renamed is not None and out != p:
            renamed[out] = p
        return out

    def walk(node: JsonValue) -> JsonValue:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        out: JsonObject = {}
        for key, value in node.items():
            if key in _INSTANCE_KEYWORDS:
                out[key] = value
            elif key == "pattern" and isinstance(value, str):
                out[key] = translate(value)
            elif key == "patternProperties" and isinstance(value, dict):
                out[key] = {translate(k): walk(v) for k, v in value.items()}
            else:
                out[key] = walk(value)
        return out

    return walk(schema)
