"""Regular expressions -> grammar IR, exact at the level of UTF-8 bytes.

Two dialects:

* ``"python"``: Python :mod:`re` syntax and semantics for ``str`` patterns (used for Lark
  terminals). ``\\d``, ``\\w`` and ``\\s`` are Unicode-aware exactly as ``re`` defines
  them (computed by running ``re`` itself over every code point); IGNORECASE uses
  ``re``'s case equivalence (simple lowercase plus ``re``'s table of extra cases).
  Extensions over ``re``: ``\\p{..}``/``\\P{..}`` general categories, ``(?<name>..)``
  and ``\\z``.
* ``"ecma"``: ECMA-262 syntax (JSON Schema ``pattern``), matched by code point.
  ``\\u{..}``, ``\\p{..}`` and surrogate-pair escapes are always accepted (as with the
  ``u`` flag); the ``u`` flag additionally makes identity escapes strict. ``\\d``/``\\w``
  are ASCII, ``\\s`` is WhiteSpace + LineTerminator, ``.`` excludes the four line
  terminators, ``$`` is the very end (``^``/``$`` see line terminators only with ``m``).
  Modifier groups (``(?i:..)``, ``(?-s:..)``; flags ``i``, ``m``, ``s``) are accepted, and
  as an extension the same flags set globally at the start (``(?i)``). Python-only syntax
  (``\\A``, ``\\Z``, ``(?P<name>..)``, possessive quantifiers, ``(?x)``) is an error that
  says so.
  The ``i`` flag uses the same case equivalence as the Python dialect (close to ECMA's
  ``u``-mode simple case folding), applied to every set including ``\\w`` and ``\\p``.
  Annex B leniency kept without the ``u`` flag: a ``{`` that does not start a quantifier
  is a literal, ``[\\w-.]`` is a union, other non-alphanumeric characters may be escaped;
  legacy octal escapes and unknown letter escapes are always errors.

Everything that would change the language in a way the IR cannot express (backrefs,
lookaround, word boundaries, conditionals, atomic groups, possessive quantifiers,
anchors that are not at the start/end of a top-level alternative) raises
:class:`~structgen.errors.RegexError` with the 0-based offset of the construct.

Encodings (what a matched code point becomes in the byte language):

* ``"utf8"``: its UTF-8 bytes; surrogates U+D800..U+DFFF are never matched.
* ``"json"``: any way it may appear *inside* a JSON string literal: raw UTF-8 (except
  ``"``, ``\\`` and U+0000..U+001F, which are only escaped), the short escapes
  (``\\" \\\\ \\/ \\b \\f \\n \\r \\t``), ``\\uXXXX`` with hex digits of either case for
  every BMP code point, and a ``\\uD8xx\\uDCxx`` surrogate-pair escape for astral code
  points. Lone surrogate escapes are never accepted. This is the escape layer of
  :mod:`structgen.frontends.json_escape` (``json_class``), which every string language shares.
* ``"json-canonical"``: the one spelling ``json.dumps(s, ensure_ascii=False)`` writes (raw
  UTF-8; ``\\"``, ``\\\\`` and control characters escaped): what generation uses.

Code-point sets become compact IR: ranges are split into sub-ranges that share UTF-8
(or hex-digit) prefixes, common prefixes are factored and siblings with equal tails
merged, so "any code point" is a handful of alternatives. Encoded sets are cached per
process (:func:`char_class_expr`), so compiling a typical schema pattern takes well
under a millisecond once the Unicode tables are built.

Patterns are parsed by :mod:`structgen.frontends.regex_parser` (its node classes and
:func:`parse_regex` are importable from here too); this module lowers the trees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from structgen.errors import RegexError
from structgen.frontends import json_escape
from structgen.frontends import unicode_data as ud
from structgen.frontends.regex_parser import (
    ECMA_LINE_TERMINATORS,
    MAX_REPEAT,
    NEWLINE,
    Alternation,
    Anchor,
    CharSet,
    Concat,
    Group,
    Quantified,
    RegexNode,
    parse_regex,
)
from structgen.grammar import ir
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.compiler import compile_grammar

__all__ = [
    "MAX_REPEAT", "RegexNode", "CharSet", "Concat", "Alternation", "Quantified", "Group",
    "Anchor", "parse_regex", "compile_regex", "char_class_expr", "any_char_expr",
    "compile_regex_grammar",
]

_ENCODINGS = ("utf8", "json", "json-canonical")


# ---------------------------------------------------------------------------
# Code-point sets -> byte-level IR
# ---------------------------------------------------------------------------

def char_class_expr(ranges: Sequence[tuple[int, int]], encoding: str = "utf8") -> ir.Expr:
    """IR for exactly one code point out of the inclusive code-point ``ranges``.

    Surrogates (U+D800..U+DFFF) are dropped. ``encoding``: ``"utf8"`` (the code point's
    UTF-8 bytes) or ``"json"`` (any spelling of it inside a JSON string literal; see the
    module docstring). An empty set gives :data:`ir.NEVER`. Results are cached.
    """
    if encoding not in _ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r} (expected one of {_ENCODINGS})")
    for lo, hi in ranges:
        if not (0 <= lo and hi <= ud.MAX_CODE_POINT):
            raise ValueError(f"code-point range out of bounds: {lo}-{hi}")
    rs = ud.intersect(ud.normalize(ranges), ud.NON_SURROGATE)
    if not rs:
        return ir.NEVER
    if encoding == "utf8":
        return json_escape.utf8_class(rs)
    return json_escape.json_class(rs, "canonical" if encoding == "json-canonical" else "all")


def any_char_expr(encoding: str = "utf8", *, exclude_newline: bool = False) -> ir.Expr:
    """IR for any one code point (except ``\\n`` if ``exclude_newline``) in ``encoding``."""
    return char_class_expr(ud.complement(NEWLINE) if exclude_newline else ud.ALL, encoding)


# ---------------------------------------------------------------------------
# Lowering: RegexNode -> IR, with anchors resolved
# ---------------------------------------------------------------------------

_START_RANK = {None: 0, "bol": 1, "bos": 2}
_END_RANK = {None: 0, "eol": 1, "eos_nl": 2, "eos": 3}


@dataclass
class _Piece:
    """A part of the language whose strings start/end at anchored positions.

    ``start``/``end``: the strictest anchor kind that must hold before/after ``expr``
    (None: unanchored); positions are for error messages.
    """

    start: str | None
    expr: ir.Expr
    end: str | None
    start_pos: int | None = None
    end_pos: int | None = None


def _merge(pieces: list[_Piece]) -> list[_Piece]:
    """One piece per (start, end) anchor kind, alternating the expressions."""
    groups: dict[tuple[str | None, str | None], list[_Piece]] = {}
    for p in pieces:
        groups.setdefault((p.start, p.end), []).append(p)
    out = []
    for (start, end), ps in groups.items():
        expr = ps[0].expr if len(ps) == 1 else ir.alt(*(p.expr for p in ps))
        out.append(_Piece(start, expr, end, ps[0].start_pos, ps[0].end_pos))
    return out


class _Lowerer:
    def __init__(self, pattern: str, encoding: str) -> None:
        self.pattern = pattern
        self.encoding = encoding

    def error(self, message: str, pos: int | None) -> RegexError:
        return RegexError(message, pattern=self.pattern, position=pos)

    def lower(self, node: RegexNode) -> list[_Piece]:
        if isinstance(node, CharSet):
            return [_Piece(None, char_class_expr(node.ranges, self.encoding), None)]
        if isinstance(node, Group):
            return self.lower(node.item)
        if isinstance(node, Anchor):
            if node.kind in ("bos", "bol"):
                return [_Piece(node.kind, ir.EMPTY, None, node.position, None)]
            return [_Piece(None, ir.EMPTY, node.kind, None, node.position)]
        if isinstance(node, Alternation):
            return _merge([p for it in node.items for p in self.lower(it)])
        if isinstance(node, Concat):
            parts = [self.lower(it) for it in node.items]
            if all(len(ps) == 1 and ps[0].start is None and ps[0].end is None for ps in parts):
                return [_Piece(None, ir.seq(*(ps[0].expr for ps in parts)), None)]
            acc = [_Piece(None, ir.EMPTY, None)]
            for right in parts:
                acc = _merge([self.combine(x, y) for x in acc for y in right])
            return acc
        if isinstance(node, Quantified):
            inner = self.lower(node.item)
            if all(p.start is None and p.end is None for p in inner):
                return [_Piece(None, ir.rep(inner[0].expr if len(inner) == 1
                                            else ir.alt(*(p.expr for p in inner)),
                                            node.min, node.max), None)]
            if node.max == 0:
                return [_Piece(None, ir.EMPTY, None)]
            if node.max == 1:
                extra = [_Piece(None, ir.EMPTY, None)] if node.min == 0 else []
                return _merge(inner + extra)
            bad = next(p for p in inner if p.start is not None or p.end is not None)
            raise self.error("anchors inside a repeated group are not supported",
                             bad.start_pos if bad.start_pos is not None else bad.end_pos)
        raise TypeError(f"unknown regex node {type(node).__name__}")

    def combine(self, x: _Piece, y: _Piece) -> _Piece:
        if x.end is not None and y.expr != ir.EMPTY:
            raise self.error("end anchor is followed by more pattern (anchors are only "
                             "supported at the start/end of a top-level alternative)", x.end_pos)
        if y.start is not None and x.expr != ir.EMPTY:
            raise self.error("start anchor is preceded by more pattern (anchors are only "
                             "supported at the start/end of a top-level alternative)", y.start_pos)
        start = x.start if _START_RANK[x.start] >= _START_RANK[y.start] else y.start
        end = x.end if _END_RANK[x.end] >= _END_RANK[y.end] else y.end
        return _Piece(start, ir.seq(x.expr, y.expr), end,
                      x.start_pos if x.start_pos is not None else y.start_pos,
                      y.end_pos if y.end_pos is not None else x.end_pos)


@lru_cache(maxsize=8)
def _any_star(encoding: str) -> ir.Expr:
    return ir.star(any_char_expr(encoding))


def compile_regex(pattern: str, *, dialect: str = "python", flags: str = "",
                  encoding: str = "utf8", search: bool = False) -> ir.Expr:
    """Compile ``pattern`` to an IR expression over bytes.

    ``search=False``: the language of strings the pattern fully matches (``re.fullmatch``);
    ``^``/``$``/``\\A``/``\\Z`` at the start/end of a top-level alternative are then
    trivially satisfied. ``search=True``: strings in which the pattern matches somewhere
    (``re.search``, JSON Schema ``pattern``): an unanchored side gets "any code-point
    sequence" (newlines included), ``^`` (``\\A``) pins the start, ``$`` pins the end
    (Python: end or before a final ``\\n``; ECMA: end), multiline anchors allow a line
    boundary. An anchor anywhere else raises :class:`RegexError`. See :func:`parse_regex`
    for ``dialect``/``flags`` and the module docstring for ``encoding``.
    """
    if encoding not in _ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r} (expected one of {_ENCODINGS})")
    node = parse_regex(pattern, dialect=dialect, flags=flags)
    try:
        pieces = _Lowerer(pattern, encoding).lower(node)
    except RecursionError:
        raise RegexError("pattern is nested too deeply", pattern=pattern) from None
    if not search:
        return ir.alt(*(p.expr for p in pieces))
    anys = _any_star(encoding)
    lt = char_class_expr(NEWLINE if dialect == "python" else ECMA_LINE_TERMINATORS, encoding)
    nl = char_class_expr(NEWLINE, encoding)
    out: list[ir.Expr] = []
    for p in pieces:
        prefix = {None: anys, "bos": ir.EMPTY, "bol": ir.opt(ir.seq(anys, lt))}[p.start]
        suffix = {None: anys, "eos": ir.EMPTY, "eos_nl": ir.opt(nl),
                  "eol": ir.opt(ir.seq(lt, anys))}[p.end]
        out.append(ir.seq(prefix, p.expr, suffix))
    return ir.alt(*out)


def compile_regex_grammar(pattern: str, **kw: Any) -> CompiledGrammar:
    """``compile_regex(pattern, **kw)`` as the start rule of a grammar, compiled to an automaton."""
    return compile_grammar(ir.Grammar({"start": compile_regex(pattern, **kw)}, "start"))
