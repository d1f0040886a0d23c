"""Formulas over JSON Schema's regular atoms: sets of strings and sets of numbers.

The per-type languages of :mod:`structgen.frontends.json_schema.algebra` for strings and
numbers are formulas closed under and/or/not (so ``not``, ``oneOf`` and ``if``/``then``/``else``
stay exact), simplified as they are built:

* string sets (also used for sets of property names): finite literal sets and constraints on
  length, ``pattern`` and ``format``;
* number sets: finite literal sets and intervals with integrality and ``multipleOf``.

Membership of one value (:func:`s_member`, :func:`num_member`) follows the validator's own
semantics (:meth:`Pattern.search <structgen.frontends.json_schema.patterns.Pattern.search>`,
the pattern's search in its dialect; Python numeric comparison, jsonschema's ``multipleOf``
and format checker), which is what makes ``enum``/``const`` combined with anything else exact.
:func:`value_key` / :func:`key_value` turn JSON values into hashable keys with JSON Schema
equality and back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import TYPE_CHECKING

from structgen.errors import SchemaError
from structgen.frontends.json_schema import idn
from structgen.frontends.json_schema.jsonschema_import import import_jsonschema
from structgen.json_types import JsonValue

if TYPE_CHECKING:  # pragma: no cover
    from jsonschema import FormatChecker

__all__ = ["SF", "ST", "KeyIndex", "key_value", "lits_of", "num_and", "num_c", "num_empty", "num_member",
           "num_not", "num_or", "s_and", "s_atoms", "s_empty", "s_eval_assign", "s_lits", "s_member", "s_not",
           "s_or", "value_key"]

# ---------------------------------------------------------------------------
# JSON values as hashable keys with JSON Schema equality (1 == 1.0, true != 1,
# object key order irrelevant)
# ---------------------------------------------------------------------------

def value_key(v: object) -> tuple:
    """The hashable key of JSON value ``v`` under JSON Schema equality (``1 == 1.0``,
    ``true != 1``, object key order ignored). Raises SchemaError for a non-JSON value."""
    if v is None:
        return ("z",)
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", v)
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, list):
        return ("a", tuple(value_key(x) for x in v))
    if isinstance(v, dict):
        return ("o", frozenset((k, value_key(x)) for k, x in v.items()))
    raise SchemaError(f"not a JSON value: {type(v).__name__}")


def key_value(k: tuple) -> JsonValue:
    """The JSON value of key ``k`` (inverse of :func:`value_key`; object keys sorted)."""
    tag = k[0]
    if tag == "z":
        return None
    if tag in ("b", "n", "s"):
        return k[1]
    if tag == "a":
        return [key_value(x) for x in k[1]]
    return {name: key_value(x) for name, x in sorted(k[1], key=lambda kv: kv[0])}


# ---------------------------------------------------------------------------
# String-set formulas (also used for sets of property names)
#   ("T",) ("F",) ("lits", frozenset[str]) ("c", minlen, maxlen|None, patterns, formats)
#   (patterns: a frozenset of patterns.Pattern; formats: a frozenset of format names)
#   ("and", frozenset) ("or", frozenset) ("not", f)
# ---------------------------------------------------------------------------

ST: tuple = ("T",)
SF: tuple = ("F",)


def s_lits(names: Iterable[str]) -> tuple:
    """The string set holding exactly ``names`` (empty: :data:`SF`)."""
    fs = frozenset(names)
    return ("lits", fs) if fs else SF


def s_and(*fs: tuple) -> tuple:
    """The intersection of string formulas, simplified: literal sets are filtered by the
    other conjuncts, length/pattern/format constraints merged into one."""
    parts: list[tuple] = []
    for f in fs:
        if f == SF:
            return SF
        if f == ST:
            continue
        parts.extend(f[1] if f[0] == "and" else (f,))
    lits = [p for p in parts if p[0] == "lits"]
    if lits:
        base = frozenset.intersection(*(p[1] for p in lits))
        others = [p for p in parts if p[0] != "lits"]
        return s_lits(s for s in base if all(s_member(o, s) for o in others))
    cs = [p for p in parts if p[0] == "c"]
    if len(cs) > 1:
        lo = max(c[1] for c in cs)
        his = [c[2] for c in cs if c[2] is not None]
        hi = min(his) if his else None
        if hi is not None and lo > hi:
            return SF
        merged = ("c", lo, hi, frozenset().union(*(c[3] for c in cs)), frozenset().union(*(c[4] for c in cs)))
        parts = [p for p in parts if p[0] != "c"] + [merged]
    uniq = frozenset(parts)
    if not uniq:
        return ST
    for p in uniq:
        if p[0] == "not" and p[1] in uniq:
            return SF
    if len(uniq) == 1:
        return next(iter(uniq))
    return ("and", uniq)


def s_or(*fs: tuple) -> tuple:
    """The union of string formulas, simplified (literal sets merged, ``x | not x`` is
    :data:`ST`)."""
    parts: list[tuple] = []
    for f in fs:
        if f == ST:
            return ST
        if f == SF:
            continue
        parts.extend(f[1] if f[0] == "or" else (f,))
    lits = [p for p in parts if p[0] == "lits"]
    if len(lits) > 1:
        merged = s_lits(frozenset().union(*(p[1] for p in lits)))
        parts = [p for p in parts if p[0] != "lits"] + [merged]
    uniq = frozenset(parts)
    if not uniq:
        return SF
    for p in uniq:
        if p[0] == "not" and p[1] in uniq:
            return ST
    if len(uniq) == 1:
        return next(iter(uniq))
    return ("or", uniq)


def s_not(f: tuple) -> tuple:
    """The complement of string formula ``f`` (pushed through literal sets and length
    bounds where that stays simple)."""
    if f == ST:
        return SF
    if f == SF:
        return ST
    if f[0] == "not":
        return f[1]
    if f[0] == "c" and not f[3] and not f[4]:  # lengths only: complement the interval
        parts: list[tuple] = []
        if f[1] > 0:
            parts.append(("c", 0, f[1] - 1, frozenset(), frozenset()))
        if f[2] is not None:
            parts.append(("c", f[2] + 1, None, frozenset(), frozenset()))
        return s_or(*parts)
    return ("not", f)


_FORMAT_CHECKER: FormatChecker | None = None


def _format_ok(name: str, s: str) -> bool:
    global _FORMAT_CHECKER
    if _FORMAT_CHECKER is None:
        _FORMAT_CHECKER = import_jsonschema().Draft202012Validator.FORMAT_CHECKER
    if not _FORMAT_CHECKER.conforms(s, name):
        return False
    if name not in ("hostname", "idn-hostname", "idn-email"):
        return True
    # jsonschema leaves A-labels and most of idn-email unchecked; the grammar's value checks do not
    check = {"hostname": idn.hostname_ok, "idn-hostname": idn.idn_hostname_ok, "idn-email": idn.idn_email_ok}
    try:
        return check[name](s)
    except (ValueError, UnicodeError):
        return False


def s_member(f: tuple, s: str) -> bool:
    """Does the string ``s`` belong to the formula (validator semantics)?"""
    tag = f[0]
    if tag == "T":
        return True
    if tag == "F":
        return False
    if tag == "lits":
        return s in f[1]
    if tag == "c":
        n = len(s)
        if n < f[1] or (f[2] is not None and n > f[2]):
            return False
        for p in f[3]:  # patterns.Pattern atoms
            if not p.search(s):
                return False
        return all(_format_ok(fm, s) for fm in f[4])
    if tag == "and":
        return all(s_member(x, s) for x in f[1])
    if tag == "or":
        return any(s_member(x, s) for x in f[1])
    if tag == "not":
        return not s_member(f[1], s)
    raise AssertionError(tag)


class KeyIndex:
    """Which of a sequence of property-name formulas a name belongs to, found without
    evaluating every formula: literal sets (``properties``, ``required``) are looked up, only
    the others (patterns, complements) are evaluated. An object of hundreds of declared
    properties asks this for each of its names."""

    __slots__ = ("_general", "_lits")

    def __init__(self, keys: Iterable[tuple]) -> None:
        self._lits: dict[str, list[int]] = {}
        self._general: list[tuple[int, tuple]] = []
        for i, k in enumerate(keys):
            if k[0] == "lits":
                for name in k[1]:
                    self._lits.setdefault(name, []).append(i)
            elif k[0] != "F":
                self._general.append((i, k))

    def holding(self, name: str) -> list[int]:
        """The positions, ascending, of the formulas that ``name`` belongs to (what
        :func:`s_member` says of each)."""
        hits = self._lits.get(name, [])
        more = [i for i, k in self._general if s_member(k, name)]
        if not more:
            return hits
        return sorted(hits + more) if hits else more


def s_empty(f: tuple) -> bool:
    """Provably empty string formula (False when unknown)."""
    if f == SF:
        return True
    if f[0] == "lits":
        return not f[1]
    if f[0] == "c":
        return f[2] is not None and f[1] > f[2]
    if f[0] == "or":
        return all(s_empty(x) for x in f[1])
    if f[0] == "and":
        return any(s_empty(x) for x in f[1])
    return False


def lits_of(f: tuple) -> set[str]:
    """Every literal string mentioned by a formula."""
    out: set[str] = set()
    stack = [f]
    while stack:
        x = stack.pop()
        if x[0] == "lits":
            out |= x[1]
        elif x[0] in ("and", "or"):
            stack.extend(x[1])
        elif x[0] == "not":
            stack.append(x[1])
    return out


def s_atoms(f: tuple, out: dict[tuple, None]) -> None:
    """Collect the non-literal leaves ("c" atoms) of a formula."""
    stack = [f]
    while stack:
        x = stack.pop()
        if x[0] == "c":
            out.setdefault(x, None)
        elif x[0] in ("and", "or"):
            stack.extend(x[1])
        elif x[0] == "not":
            stack.append(x[1])


def s_eval_assign(f: tuple, assign: dict[tuple, bool]) -> bool:
    """Evaluate a formula for a key that is none of its literals, given atom values."""
    tag = f[0]
    if tag == "T":
        return True
    if tag in ("F", "lits"):
        return False
    if tag == "c":
        return assign[f]
    if tag == "and":
        return all(s_eval_assign(x, assign) for x in f[1])
    if tag == "or":
        return any(s_eval_assign(x, assign) for x in f[1])
    return not s_eval_assign(f[1], assign)


# ---------------------------------------------------------------------------
# Number-set formulas
#   ("T",) ("F",) ("lits", frozenset[number]) ("c", lo, lo_excl, hi, hi_excl, integer, multiples)
#   ("and", ...) ("or", ...) ("not", f)
# ---------------------------------------------------------------------------

def num_c(lo: float | None = None, lo_excl: bool = False, hi: float | None = None, hi_excl: bool = False,
          integer: bool = False, multiples: Iterable[float] = ()) -> tuple:
    """A number constraint: the interval ``lo..hi`` (each end optional, open when
    ``*_excl``), integers only when ``integer``, and multiples of every value in ``multiples``."""
    return ("c", lo, lo_excl, hi, hi_excl, integer, frozenset(multiples))


def _num_c_merge(a: tuple, b: tuple) -> tuple:
    lo, lo_x = a[1], a[2]
    if b[1] is not None and (lo is None or b[1] > lo or (b[1] == lo and b[2])):
        lo, lo_x = b[1], b[2]
    hi, hi_x = a[3], a[4]
    if b[3] is not None and (hi is None or b[3] < hi or (b[3] == hi and b[4])):
        hi, hi_x = b[3], b[4]
    return ("c", lo, lo_x, hi, hi_x, a[5] or b[5], a[6] | b[6])


def num_and(*fs: tuple) -> tuple:
    """The intersection of number formulas, simplified (literal sets filtered, interval
    constraints merged)."""
    parts: list[tuple] = []
    for f in fs:
        if f == SF:
            return SF
        if f == ST:
            continue
        parts.extend(f[1] if f[0] == "and" else (f,))
    lits = [p for p in parts if p[0] == "lits"]
    if lits:
        base = lits[0][1]
        for p in lits[1:]:
            base = frozenset(x for x in base if x in p[1])
        others = [p for p in parts if p[0] != "lits"]
        keep = frozenset(x for x in base if all(num_member(o, x) for o in others))
        return ("lits", keep) if keep else SF
    cs = [p for p in parts if p[0] == "c"]
    if len(cs) > 1:
        m = cs[0]
        for c in cs[1:]:
            m = _num_c_merge(m, c)
        parts = [p for p in parts if p[0] != "c"] + [m]
    uniq = frozenset(parts)
    if not uniq:
        return ST
    for p in uniq:
        if p[0] == "not" and p[1] in uniq:
            return SF
    if any(p[0] == "c" and _num_c_empty(p) for p in uniq):
        return SF
    if len(uniq) == 1:
        return next(iter(uniq))
    return ("and", uniq)


def num_or(*fs: tuple) -> tuple:
    """The union of number formulas, simplified (literal sets merged, adjacent intervals
    joined)."""
    parts: list[tuple] = []
    for f in fs:
        if f == ST:
            return ST
        if f == SF:
            continue
        parts.extend(f[1] if f[0] == "or" else (f,))
    lits = [p for p in parts if p[0] == "lits"]
    if len(lits) > 1:
        merged = ("lits", frozenset().union(*(p[1] for p in lits)))
        parts = [p for p in parts if p[0] != "lits"] + [merged]
    plain = [p for p in parts if p[0] == "c" and not p[5] and not p[6]]
    if len(plain) > 1:
        merged_iv = _merge_intervals(plain)
        if merged_iv is None:
            return ST
        parts = [p for p in parts if not (p[0] == "c" and not p[5] and not p[6])] + merged_iv
    uniq = frozenset(parts)
    if not uniq:
        return SF
    for p in uniq:
        if p[0] == "not" and p[1] in uniq:
            return ST
    if len(uniq) == 1:
        return next(iter(uniq))
    return ("or", uniq)


def _lo_key(c: tuple) -> tuple:
    # order lower bounds: None (-inf) first; inclusive before exclusive at the same value
    return (0, 0, 0) if c[1] is None else (1, c[1], 1 if c[2] else 0)


def _merge_intervals(cs: list[tuple]) -> list[tuple] | None:
    """Union of plain interval atoms as disjoint intervals; None when it is every number."""
    cs = sorted(cs, key=_lo_key)
    out: list[tuple] = []
    for c in cs:
        if out:
            last = out[-1]
            hi, hi_x = last[3], last[4]
            touch = hi is None or c[1] is None or c[1] < hi or (c[1] == hi and not (hi_x and c[2]))
            if touch:
                if hi is None or (c[3] is not None and (c[3] < hi or (c[3] == hi and (not hi_x or c[4])))):
                    pass  # c inside last
                else:
                    last = ("c", last[1], last[2], c[3], c[4], False, frozenset())
                out[-1] = last
                continue
        out.append(c)
    if len(out) == 1 and out[0][1] is None and out[0][3] is None:
        return None
    return out


def num_not(f: tuple) -> tuple:
    """Complement; bounds are complemented exactly as intervals (no automaton difference)."""
    if f == ST:
        return SF
    if f == SF:
        return ST
    if f[0] == "not":
        return f[1]
    if f[0] == "c" and not f[6]:
        _, lo, lo_x, hi, hi_x, integer, _m = f
        parts = []
        if lo is not None:
            parts.append(num_c(hi=lo, hi_excl=not lo_x))
        if hi is not None:
            parts.append(num_c(lo=hi, lo_excl=not hi_x))
        if integer:
            inside = num_c(lo, lo_x, hi, hi_x)
            parts.append(num_and(inside, ("not", num_c(integer=True))) if inside != num_c()
                         else ("not", num_c(integer=True)))
        return num_or(*parts)
    return ("not", f)




def _is_multiple(x: float, m: float) -> bool:
    """Exact decimal multipleOf (as the specification and
    :mod:`structgen.frontends.json_schema.numbers` define it).

    A float stands for the decimal of its ``repr`` (``0.1`` is 1/10). jsonschema divides
    floats instead and can reject e.g. ``19.99`` for ``multipleOf: 0.01``; structgen
    follows the specification there (documented deviation).
    """
    if isinstance(x, float) and not math.isfinite(x):
        return False
    return (_dec(x) / _dec(m)).denominator == 1


def _dec(v: float) -> Fraction:
    return Fraction(v) if isinstance(v, int) else Fraction(repr(v))


def num_member(f: tuple, x: float) -> bool:
    """Does number ``x`` belong to formula ``f`` (validator semantics: Python comparison,
    jsonschema's ``multipleOf``)?"""
    tag = f[0]
    if tag == "T":
        return True
    if tag == "F":
        return False
    if tag == "lits":
        return x in f[1]
    if tag == "c":
        _, lo, lo_x, hi, hi_x, integer, mults = f
        if lo is not None and (x < lo or (lo_x and x == lo)):
            return False
        if hi is not None and (x > hi or (hi_x and x == hi)):
            return False
        if integer and not (isinstance(x, int) or (isinstance(x, float) and x.is_integer())):
            return False
        return all(_is_multiple(x, m) for m in mults)
    if tag == "and":
        return all(num_member(p, x) for p in f[1])
    if tag == "or":
        return any(num_member(p, x) for p in f[1])
    return not num_member(f[1], x)


def _num_c_empty(c: tuple) -> bool:
    _, lo, lo_x, hi, hi_x, integer, _m = c
    if lo is None or hi is None:
        return False
    if lo > hi or (lo == hi and (lo_x or hi_x)):
        return True
    if integer and math.isfinite(lo) and math.isfinite(hi):
        a = math.floor(lo) + 1 if lo_x else math.ceil(lo)
        b = math.ceil(hi) - 1 if hi_x else math.floor(hi)
        return a > b
    return False


def num_empty(f: tuple) -> bool:
    """True when formula ``f`` surely accepts no number (False may still be empty under
    ``not``: a sound answer for pruning, not a decision procedure)."""
    if f == SF:
        return True
    if f[0] == "lits":
        return not f[1]
    if f[0] == "c":
        return _num_c_empty(f)
    if f[0] == "or":
        return all(num_empty(x) for x in f[1])
    if f[0] == "and":
        return any(num_empty(x) for x in f[1])
    return False
