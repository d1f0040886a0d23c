"""Lowering number-set formulas (:mod:`structgen.frontends.json_schema.formulas`) to IR: the
number half of :class:`~structgen.frontends.json_schema.lower.Lowering`.

Polarity as in :mod:`structgen.frontends.json_schema.lower`: at ``+`` the language is a subset
of the schema's, at ``-`` a superset.

Spelling (``JsonSchemaOptions.number_spelling``): ``"all"`` (validation) keeps every literal
the value constraints allow. ``"canonical"`` (generation) narrows the ``+`` languages, so that
what a model writes is what strict parsers read:

* an integer constraint gives integer literals ``-?(0|[1-9][0-9]*)`` only (no fraction, no
  exponent, no ``-0``), of at most :data:`INT_DIGITS` digits, or as many as the largest bound
  (or one more than the largest ``multipleOf``) of that constraint has;
* any other number has at most :data:`MANTISSA_DIGITS` digits before the exponent (a lone
  ``0`` before the point not counted), at most :data:`EXPONENT_DIGITS` exponent digits and
  no negative zero (when that leaves nothing and every multiple of its ``multipleOf`` is an
  integer, it is written as an integer is);
* an ``enum``/``const`` value is written one way: an integral value as an integer literal,
  another as ``json.dumps`` writes it.

Where a constraint leaves no canonical literal (``"minimum": 1e1000`` for a number, or a
canonical automaton over :data:`~structgen.frontends.json_schema.numbers.MAX_DFA_STATES`
states), that constraint keeps its full language; so does a whole number formula whose
canonical language comes out as nothing. The narrowing never adds a literal: every canonical
output is valid under ``"all"``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable
from fractions import Fraction
from typing import TypeVar

from structgen.config import JsonSchemaOptions
from structgen.errors import CompileLimitError
from structgen.frontends.json_schema import numbers as numeric
from structgen.frontends.json_schema.document import SchemaDoc
from structgen.grammar import ir

__all__ = ["EXPONENT_DIGITS", "INT_DIGITS", "MANTISSA_DIGITS", "NumberLowering", "canonical_spelling",
           "number_spellings", "trie"]

#: digits of a canonical integer when the constraint's bounds need no more (int64 range)
INT_DIGITS = 19
#: digits of a canonical number's mantissa (what a double round-trips)
MANTISSA_DIGITS = 17
#: digits of a canonical number's exponent (doubles reach 1e308 and 5e-324)
EXPONENT_DIGITS = 3

_K = TypeVar("_K", bound=Hashable)  # a symbol of a trie


def number_spellings(v: float) -> list[str]:
    """The texts ``json.dumps`` produces for Python numbers equal to ``v``."""
    out: dict[str, None] = {}
    if isinstance(v, int):
        out[str(v)] = None
        try:
            f = float(v)
        except OverflowError:
            f = None
        if f is not None and f == v:
            out[json.dumps(f)] = None
    else:
        if v != v or v in (float("inf"), float("-inf")):
            return []
        out[json.dumps(v)] = None
        if v.is_integer():
            out[str(int(v))] = None
    if v == 0:
        out["-0.0"] = None
        out["0.0"] = None
    return list(out)


def canonical_spelling(v: float) -> str | None:
    """The one text generation writes for number ``v``: an integral value as an integer
    literal (``3.0`` -> ``3``, ``-0.0`` -> ``0``), another as ``json.dumps`` writes it;
    None for a non-finite float."""
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        return str(int(v)) if v.is_integer() else json.dumps(v)
    return str(v)


def trie(seqs: Iterable[tuple[_K, ...]], leaf: Callable[[_K], ir.Expr]) -> ir.Expr:
    """Alternation of symbol sequences as a trie (shared prefixes factored), iteratively.
    A run of nodes with one child each (a long name's unshared tail) becomes one sequence,
    made once rather than re-flattened at every node."""
    root: dict = {}
    END = object()
    for s in seqs:
        node = root
        for sym in s:
            node = node.setdefault(sym, {})
        node[END] = True

    def run(child: dict) -> tuple[list[_K], dict]:  # the symbols of a one-child run, its last node
        syms: list[_K] = []
        while len(child) == 1 and END not in child:
            ((sym, child),) = child.items()
            syms.append(sym)
        return syms, child

    # post-order without recursion, over the nodes where runs end
    result: dict[int, ir.Expr] = {}
    runs: dict[int, list[tuple[_K, list[_K], dict]]] = {}  # per node: its children's runs
    stack: list[tuple[dict, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if not done:
            stack.append((node, True))
            runs[id(node)] = [(k, *run(ch)) for k, ch in node.items() if k is not END]
            stack.extend((last, False) for _k, _syms, last in runs[id(node)])
            continue
        alts = [ir.seq(leaf(k), *(leaf(x) for x in syms), result[id(last)])
                for k, syms, last in runs[id(node)]]
        if END in node:
            alts.append(ir.EMPTY)
        result[id(node)] = ir.alt(*alts)
    return result[id(root)]


def _finite(v: object) -> bool:
    return not (isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))))


def _digits(x: float | Fraction) -> int:
    """Digits of the integer part of ``|x|`` rounded up."""
    return len(str(math.ceil(abs(Fraction(x)))))


class NumberLowering:
    """The number languages of a :class:`~structgen.frontends.json_schema.lower.Lowering`
    (a mixin: it uses the lowering's options, document, cache and :meth:`note`)."""

    opt: JsonSchemaOptions
    doc: SchemaDoc
    _cache: dict[Hashable, ir.Expr]
    expr_kw: dict[ir.Expr, str]
    note: Callable[[ir.Expr, str], ir.Expr]

    def number_all(self) -> ir.Expr:
        """Every JSON number (cached)."""
        e = self._cache.get("num")
        if e is None:
            e = self._cache["num"] = numeric.number_expr()
        return e

    def number_any(self) -> ir.Expr:
        """Every number at ``+`` polarity: :meth:`number_all` in its allowed spellings."""
        if self.opt.number_spelling != "canonical":
            return self.number_all()
        e = self._cache.get("num_canon")
        if e is None:
            e = self._cache["num_canon"] = numeric.number_expr(
                max_mantissa_digits=MANTISSA_DIGITS, max_exponent_digits=EXPONENT_DIGITS,
                negative_zero=False)
        return e

    def spellings(self, v: float) -> list[str]:
        """The texts number value ``v`` may be written as at ``+`` polarity."""
        if self.opt.number_spelling != "canonical":
            return number_spellings(v)
        text = canonical_spelling(v)
        return [] if text is None else [text]

    def safe_number(self) -> ir.Expr:
        """Integer literals, and plain decimals with at most 15 digits in all."""
        e = self._cache.get("safe")
        if e is None:
            d = ir.byte_range(0x30, 0x39)
            nz = ir.byte_range(0x31, 0x39)
            ints = ir.seq(ir.opt(ir.lit("-")), ir.alt(ir.lit("0"), ir.seq(nz, ir.star(d))))
            decs = []
            decs.append(ir.seq(ir.lit("0."), ir.rep(d, 1, 14)))
            for i in range(1, 15):
                decs.append(ir.seq(nz, ir.rep(d, i - 1, i - 1), ir.lit("."), ir.rep(d, 1, 15 - i)))
            e = ir.alt(ints, ir.seq(ir.opt(ir.lit("-")), ir.alt(*decs)))
            self._cache["safe"] = e
        return e

    def lower_num(self, f: tuple, pos: bool) -> ir.Expr:
        """Number literals. ``pos``: subset (True) / superset (False) of the language."""
        canon = pos and self.opt.number_spelling == "canonical"
        e = self._lower_num(f, pos, canon)
        if canon and e == ir.NEVER:
            e = self._lower_num(f, pos, False)  # nothing canonical: the full language
        return e

    def _lower_num(self, f: tuple, pos: bool, canon: bool) -> ir.Expr:
        key = ("num", f, pos, canon)
        got = self._cache.get(key)
        if got is not None:
            return got
        tag = f[0]
        num = numeric
        if tag == "T":
            e = self.number_any() if canon else self.number_all()
        elif tag == "F":
            e = ir.NEVER
        elif tag == "lits":
            if canon:
                texts = sorted({t for v in f[1] for t in self.spellings(v)})
                e = trie((tuple(t.encode()) for t in texts), lambda b: ir.byteset([b]))
            elif pos:
                texts = sorted({t for v in f[1] for t in number_spellings(v)})
                if self.doc.drafts[0] in ("3", "4"):
                    # draft-03/04: 2.0 is not an integer, and whether "integer" applied to
                    # these values is no longer known here: integral values are written
                    # as integer literals only (a narrowing; never an invalid "2.0")
                    texts = [t for t in texts
                             if not (("." in t or "e" in t or "E" in t) and float(t).is_integer())]
                e = trie((tuple(t.encode()) for t in texts), lambda b: ir.byteset([b]))
            else:
                exact = [num.number_expr(v, v) for v in sorted(f[1]) if _finite(v)]
                e = ir.alt(*exact, self.not_safe())
            self.note(e, "enum")
        elif tag == "c":
            _, lo, lo_x, hi, hi_x, integer, mults = f
            kw = ("multipleOf" if mults else ("exclusiveMinimum" if lo_x else "minimum") if lo is not None
                  else ("exclusiveMaximum" if hi_x else "maximum") if hi is not None else "type")
            e = self._canonical_c(f) if canon else ir.NEVER
            if e != ir.NEVER:
                self.note(e, kw)
                self._cache[key] = e
                return e
            ms = sorted(mults) or [None]
            e = num.number_expr(lo, hi, exclusive_minimum=lo_x, exclusive_maximum=hi_x,
                                multiple_of=ms[0], integer_only=integer)
            self.note(e, kw)
            for m in ms[1:]:
                e_m = num.number_expr(lo, hi, exclusive_minimum=lo_x, exclusive_maximum=hi_x,
                                      multiple_of=m, integer_only=integer)
                e = self.note(ir.and_(e, e_m), "multipleOf")
            if integer and pos and self.doc.drafts[0] in ("3", "4"):
                # draft-03/04: "integer" is a number written without fraction or exponent
                # (1.0 and 1e2 are not integers there, as jsonschema's Draft4Validator
                # says). Only at + polarity: at - the wider language keeps `not` sound.
                e = self.note(ir.and_(e, self.int_literal()), kw)
            if not pos:
                e = self.note(ir.alt(e, self.not_safe()), kw)
        elif tag == "and":
            items = [self._lower_num(x, pos, canon) for x in sorted(f[1], key=repr)]
            e = items[0]
            for x in items[1:]:
                e = self.note(ir.and_(e, x), self.expr_kw.get(x, "allOf"))
        elif tag == "or":
            e = self.note(ir.alt(*(self._lower_num(x, pos, canon) for x in sorted(f[1], key=repr))), "anyOf")
        else:
            universe = self.safe_number() if pos else self.number_all()
            if canon:
                got = self._cache.get("safe_canon")
                if got is None:
                    got = self._cache["safe_canon"] = ir.and_(self.safe_number(), self.number_any())
                universe = got
            e = self.note(ir.diff(universe, self._lower_num(f[1], not pos, False)), "not")
        self._cache[key] = e
        return e

    def _canonical_c(self, f: tuple) -> ir.Expr:
        """The canonical literals of constraint ``f``; NEVER when there are none (or their
        automaton is too large, or a bound is not finite): the caller keeps the full language."""
        _, lo, lo_x, hi, hi_x, integer, mults = f
        if not all(_finite(x) for x in (lo, hi, *mults) if x is not None):
            return ir.NEVER
        num = numeric
        ms = sorted(mults) or [None]
        try:
            if integer:
                digits = max([INT_DIGITS] + [_digits(x) for x in (lo, hi) if x is not None]
                             + [sum(_digits(m) for m in mults) + 1])
                parts = [num.integer_expr(lo, hi, exclusive_minimum=lo_x, exclusive_maximum=hi_x,
                                          multiple_of=m, max_digits=digits, negative_zero=False)
                         for m in ms]
            else:
                parts = [num.number_expr(lo, hi, exclusive_minimum=lo_x, exclusive_maximum=hi_x,
                                         multiple_of=m, max_mantissa_digits=MANTISSA_DIGITS,
                                         max_exponent_digits=EXPONENT_DIGITS, negative_zero=False)
                         for m in ms]
        except CompileLimitError:
            return ir.NEVER
        if any(p == ir.NEVER for p in parts):
            if not integer and mults and all(isinstance(m, int) or m.is_integer() for m in mults):
                # every multiple is an integer: integer literals, as long as the bounds need
                # (e.g. "minimum": 1e30 with "multipleOf": 100, where exponent forms are out)
                return self._canonical_c(f[:5] + (True, mults))
            return ir.NEVER
        e = parts[0]
        for p in parts[1:]:
            e = self.note(ir.and_(e, p), "multipleOf")
        return e

    def int_literal(self) -> ir.Expr:
        """Integer literals: ``-?(0|[1-9][0-9]*)``."""
        return ir.seq(ir.opt(ir.lit("-")), ir.alt(ir.lit("0"), ir.seq(ir.byte_range(0x31, 0x39),
                                                                     ir.star(ir.byte_range(0x30, 0x39)))))

    def not_safe(self) -> ir.Expr:
        """Numbers outside :meth:`safe_number` (exponents, long fractions)."""
        return ir.diff(self.number_all(), self.safe_number())
