"""A Boolean algebra of JSON Schema languages (the semantic core of the front-end).

Every schema location is normalised into a :class:`TS` ("typed set"): the set of JSON
values it accepts, split by JSON type:

* ``null``/``bools``: finite sets;
* ``num``/``str``: formulas over *regular* atoms (bounds, integrality, ``multipleOf``;
  lengths, patterns, formats; finite literal sets), closed under and/or/not, lowered to
  regular IR with ``ir.and_``/``ir.diff``;
* ``arr``/``obj``: unions (DNF) of structural records (:class:`Arr`, :class:`Obj`) whose
  children are lazy *nodes* (schema locations and and/or/not combinations of them).

Intersection, union and complement are exact on records (complement of an object record
is a union of "violation" records: a count out of range, a required key missing, some key
whose value violates its schema, ...), so ``allOf``, ``anyOf``, ``oneOf``, ``not`` and
``if``/``then``/``else`` are exact, also for recursive schemas: children stay symbolic, and
the lowering creates one grammar rule per (node, key-order context), which terminates
because nodes are Boolean combinations of finitely many locations.

Evaluation annotations for ``unevaluatedProperties``/``unevaluatedItems`` are tracked per
record (``Obj.ev``, ``Arr.ev_*``) as a *lower bound* of what the validator would have
evaluated; using a lower bound can only reject more, never accept an invalid instance.

Finite sets are evaluated with the validator's own semantics (``re.search`` for
patterns, Python numeric comparison, jsonschema's ``multipleOf``, its format checker),
so ``enum``/``const`` combined with anything else is exact.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from structgen.errors import CompileLimitError, CompileTimeoutError, SchemaError, UnsupportedFeatureError
from structgen.frontends.json_schema.document import Loc, SchemaDoc, escape_token

#: Deepest chain of subschemas applied in place ($ref to $ref to ..., allOf inside allOf, ...)
#: the normaliser follows; deeper is a CompileLimitError (it recurses once per level).
MAX_INPLACE_DEPTH = 150

__all__ = ["TS", "Arr", "Obj", "Normalizer", "TRUE", "FALSE", "TOP", "BOTTOM",
           "n_and", "n_or", "n_not", "value_key", "key_value", "s_member", "num_member",
           "s_and", "s_or", "s_not", "lits_of"]

# ---------------------------------------------------------------------------
# Nodes: lazily normalised schema expressions (hashable tuples)
#   ("T",) ("F",) ("ref", Loc, scope) ("const", value_key) ("and", frozenset)
#   ("or", frozenset) ("not", node) ("ts", TS)
# ---------------------------------------------------------------------------

Node = tuple
TRUE: Node = ("T",)
FALSE: Node = ("F",)


def n_and(*nodes: Node) -> Node:
    parts: set[Node] = set()
    for n in nodes:
        if n == FALSE:
            return FALSE
        if n == TRUE:
            continue
        if n[0] == "and":
            parts |= n[1]
        else:
            parts.add(n)
    if not parts:
        return TRUE
    for p in parts:
        if p[0] == "not" and p[1] in parts:
            return FALSE
    if len(parts) == 1:
        return next(iter(parts))
    return ("and", frozenset(parts))


def n_or(*nodes: Node) -> Node:
    parts: set[Node] = set()
    for n in nodes:
        if n == TRUE:
            return TRUE
        if n == FALSE:
            continue
        if n[0] == "or":
            parts |= n[1]
        else:
            parts.add(n)
    if not parts:
        return FALSE
    for p in parts:
        if p[0] == "not" and p[1] in parts:
            return TRUE
    if len(parts) == 1:
        return next(iter(parts))
    return ("or", frozenset(parts))


def n_not(n: Node) -> Node:
    if n == TRUE:
        return FALSE
    if n == FALSE:
        return TRUE
    if n[0] == "not":
        return n[1]
    return ("not", n)


# ---------------------------------------------------------------------------
# JSON values as hashable keys with JSON Schema equality (1 == 1.0, true != 1,
# object key order irrelevant)
# ---------------------------------------------------------------------------

def value_key(v: Any) -> tuple:
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


def key_value(k: tuple) -> Any:
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
#   ("and", frozenset) ("or", frozenset) ("not", f)
# ---------------------------------------------------------------------------

ST: tuple = ("T",)
SF: tuple = ("F",)


def s_lits(names: Iterable[str]) -> tuple:
    fs = frozenset(names)
    return ("lits", fs) if fs else SF


def s_and(*fs: tuple) -> tuple:
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
    if f == ST:
        return SF
    if f == SF:
        return ST
    if f[0] == "not":
        return f[1]
    if f[0] == "c" and not f[3] and not f[4]:  # lengths only: complement the interval
        parts = []
        if f[1] > 0:
            parts.append(("c", 0, f[1] - 1, frozenset(), frozenset()))
        if f[2] is not None:
            parts.append(("c", f[2] + 1, None, frozenset(), frozenset()))
        return s_or(*parts)
    return ("not", f)


_FORMAT_CHECKER: Any = None


def _format_ok(name: str, s: str) -> bool:
    global _FORMAT_CHECKER
    if _FORMAT_CHECKER is None:
        from jsonschema import Draft202012Validator
        _FORMAT_CHECKER = Draft202012Validator.FORMAT_CHECKER
    return bool(_FORMAT_CHECKER.conforms(s, name))


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
        for p in f[3]:
            if re.search(p, s) is None:
                return False
        return all(_format_ok(fm, s) for fm in f[4])
    if tag == "and":
        return all(s_member(x, s) for x in f[1])
    if tag == "or":
        return any(s_member(x, s) for x in f[1])
    if tag == "not":
        return not s_member(f[1], s)
    raise AssertionError(tag)


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

def num_c(lo: Any = None, lo_excl: bool = False, hi: Any = None, hi_excl: bool = False,
          integer: bool = False, multiples: Iterable[Any] = ()) -> tuple:
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




def _is_multiple(x: Any, m: Any) -> bool:
    """Exact decimal multipleOf (as the specification and
    :mod:`structgen.frontends.json_schema.numbers` define it).

    A float stands for the decimal of its ``repr`` (``0.1`` is 1/10). jsonschema divides
    floats instead and can reject e.g. ``19.99`` for ``multipleOf: 0.01``; structgen
    follows the specification there (documented deviation).
    """
    if isinstance(x, float) and not math.isfinite(x):
        return False
    return (_dec(x) / _dec(m)).denominator == 1


def _dec(v: Any) -> Fraction:
    return Fraction(v) if isinstance(v, int) else Fraction(repr(v))


def num_member(f: tuple, x: Any) -> bool:
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


# ---------------------------------------------------------------------------
# Structural records
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Arr:
    """Arrays: item ``i`` is in ``prefix[i]`` (or ``rest`` past the prefix); the length is in
    ``[min_items, max_items]``; for each ``(C, lo, hi, start)`` in ``contains`` the number of
    items at index >= start that are in C is in ``[lo, hi]``; ``unique`` = uniqueItems.

    ``ev_prefix``/``ev_all``/``ev_nodes`` are a lower bound of the evaluated items (index
    below ev_prefix, all items, items in one of ev_nodes) for ``unevaluatedItems``.
    """

    prefix: tuple[Node, ...] = ()
    rest: Node = TRUE
    min_items: int = 0
    max_items: int | None = None
    contains: tuple[tuple[Node, int, int | None, int], ...] = ()
    unique: bool = False
    ev_prefix: int = 0
    ev_all: bool = False
    ev_nodes: tuple[Node, ...] = ()

    def item(self, i: int) -> Node:
        return self.prefix[i] if i < len(self.prefix) else self.rest


@dataclass(frozen=True)
class Obj:
    """Objects: for every ``(K, S)`` in ``props``, each present key in key set K has a
    value in S; ``required`` keys are present; the size is in ``[min_props, max_props]``;
    for each ``(K, S, lo, hi)`` in ``exists`` the number of keys in K whose value is in S
    is in ``[lo, hi]``. ``ev`` is a lower bound of the evaluated key set."""

    props: tuple[tuple[tuple, Node], ...] = ()
    required: frozenset[str] = frozenset()
    min_props: int = 0
    max_props: int | None = None
    exists: tuple[tuple[tuple, Node, int, int | None], ...] = ()
    ev: tuple = SF


ARR_TOP = Arr()
OBJ_TOP = Obj()


@dataclass(frozen=True)
class TS:
    """A schema's language split by JSON type (see module docstring)."""

    null: bool = True
    bools: frozenset[bool] = frozenset((False, True))
    num: tuple = ST
    str: tuple = ST
    arr: tuple[Arr, ...] = (ARR_TOP,)
    obj: tuple[Obj, ...] = (OBJ_TOP,)


TOP = TS()
BOTTOM = TS(False, frozenset(), SF, SF, (), ())


def only(**parts: Any) -> TS:
    """TOP except for the given parts (a keyword that constrains one type)."""
    return replace(TOP, **parts)


def of_types(types: Iterable[str]) -> TS:
    ts = BOTTOM
    for t in types:
        if t == "null":
            ts = replace(ts, null=True)
        elif t == "boolean":
            ts = replace(ts, bools=frozenset((False, True)))
        elif t == "number":
            ts = replace(ts, num=ST)
        elif t == "integer":
            ts = replace(ts, num=num_or(ts.num, num_c(integer=True)))
        elif t == "string":
            ts = replace(ts, str=ST)
        elif t == "array":
            ts = replace(ts, arr=(ARR_TOP,))
        elif t == "object":
            ts = replace(ts, obj=(OBJ_TOP,))
    return ts


def const_ts(key: tuple) -> TS:
    tag = key[0]
    if tag == "z":
        return replace(BOTTOM, null=True)
    if tag == "b":
        return replace(BOTTOM, bools=frozenset((key[1],)))
    if tag == "n":
        return replace(BOTTOM, num=("lits", frozenset((key[1],))))
    if tag == "s":
        return replace(BOTTOM, str=("lits", frozenset((key[1],))))
    if tag == "a":
        items = tuple(("const", k) for k in key[1])
        n = len(items)
        return replace(BOTTOM, arr=(Arr(prefix=items, rest=FALSE, min_items=n, max_items=n),))
    names = [k for k, _ in key[1]]
    props = tuple((s_lits((k,)), ("const", v)) for k, v in sorted(key[1], key=lambda kv: kv[0]))
    props += ((s_not(s_lits(names)), FALSE),) if names else ((ST, FALSE),)
    return replace(BOTTOM, obj=(Obj(props=props, required=frozenset(names),
                                    min_props=len(names), max_props=len(names)),))


# ---------------------------------------------------------------------------
# The normaliser: schema locations -> TS, with meet / join / complement
# ---------------------------------------------------------------------------

_OLD = ("3", "4", "6", "7")
MAX_DNF = 256

# formats each old draft defines; any other name is an unknown format there (an annotation)
_F4 = frozenset({"date-time", "email", "hostname", "ipv4", "ipv6", "uri"})
_F6 = _F4 | {"uri-reference", "uri-template", "json-pointer"}
_F7 = _F6 | {"date", "time", "idn-email", "idn-hostname", "iri", "iri-reference", "relative-json-pointer",
             "regex"}
_DRAFT_FORMATS = {"3": _F4 | {"date", "time", "host-name", "ip-address"}, "4": _F4, "6": _F6, "7": _F7}


class Normalizer:
    """Turns nodes into :class:`TS` values (memoised), reporting unsupported features."""

    def __init__(self, doc: SchemaDoc, *, formats: str = "enforce", lenient: bool = False,
                 max_enum: int = 5000, format_supported: Any = None,
                 pattern_check: Any = None) -> None:
        self.doc = doc
        self.formats = formats
        self.lenient = lenient
        self.max_enum = max_enum
        self.warnings: list[str] = []
        self._memo: dict[Node, TS] = {}
        self._active: set[Node] = set()
        self._pos: list[str] = ["#"]  # pointer of the schema being normalised (for errors)
        self._kws: list[str | None] = [None]  # keyword being normalised there (for errors)
        # time.monotonic() value past which normalisation raises CompileTimeoutError (set by
        # the lowering; None: no limit) and the limit in seconds, for the message
        self.deadline: float | None = None
        self.time_limit = 0.0
        self._tick = 0
        self.format_supported = format_supported or (lambda name: True)
        self.pattern_check = pattern_check or (lambda p: None)

    # -- error reporting ----------------------------------------------------------
    def unsupported(self, keyword: str, pointer: str, message: str) -> None:
        """Raise UnsupportedFeatureError, or record a warning in lenient mode."""
        if self.lenient:
            self.warnings.append(f"{pointer} [{keyword}]: {message} (ignored: lenient mode)")
            return
        raise UnsupportedFeatureError(message, pointer=pointer, keyword=keyword)

    def where(self) -> str:
        return self._pos[-1]

    def keyword(self) -> str | None:
        """The keyword being normalised at :meth:`where` (None when not known)."""
        return self._kws[-1]

    def enter(self, pointer: str) -> None:
        """Push the schema location being worked on (error messages name it)."""
        self._pos.append(pointer)
        self._kws.append(None)

    def leave(self) -> None:
        self._pos.pop()
        self._kws.pop()

    def check_deadline(self) -> None:
        """Raise CompileTimeoutError past :attr:`deadline`, naming the innermost schema
        location (and keyword) being normalised."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            where, kw = self.where(), self.keyword()
            what = f"keyword {kw!r} of the schema at {where}" if kw else f"the schema at {where}"
            raise CompileTimeoutError(f"grammar compilation exceeded its time limit of "
                                      f"{round(self.time_limit, 2):g} s while lowering {what} "
                                      "(CompileOptions.timeout_s)", pointer=where, keyword=kw)

    def _tick_deadline(self) -> None:
        self._tick += 1
        if self._tick & 31 == 0:
            self.check_deadline()

    # -- node construction ------------------------------------------------------------
    def ref_node(self, loc: Loc, scope: tuple[str, ...] = ()) -> Node:
        node = self.doc.node(loc)
        if node is True:
            return TRUE
        if node is False:
            return FALSE
        if not self.doc.has_dynamic:
            scope = ()
        return ("ref", loc, scope)

    # -- normalisation ----------------------------------------------------------------
    def normalize(self, n: Node) -> TS:
        got = self._memo.get(n)
        if got is not None:
            return got
        if n in self._active:
            ptr = self.doc.pointer(n[1]) if n[0] == "ref" else self.where()
            raise SchemaError("circular reference: the schema refers to itself without an "
                              "intervening property or item", pointer=ptr, keyword="$ref")
        if len(self._active) >= MAX_INPLACE_DEPTH:
            # each level recurses through normalize/_schema: refuse before the stack overflows
            ptr = self.doc.pointer(n[1]) if n[0] == "ref" else self.where()
            raise CompileLimitError(f"schema applies more than {MAX_INPLACE_DEPTH} subschemas in place "
                                    "($ref, allOf, anyOf, oneOf, not, if/then/else) one inside another "
                                    "(MAX_INPLACE_DEPTH)", pointer=ptr)
        self._active.add(n)
        try:
            ts = self._normalize(n)
        finally:
            self._active.discard(n)
        self._memo[n] = ts
        return ts

    def _normalize(self, n: Node) -> TS:
        tag = n[0]
        if tag == "T":
            return TOP
        if tag == "F":
            return BOTTOM
        if tag == "const":
            return const_ts(n[1])
        if tag == "ts":
            return n[1]
        if tag == "and":
            ts = TOP
            for m in sorted(n[1], key=repr):
                ts = self.meet(ts, self.normalize(m))
            return ts
        if tag == "or":
            ts = BOTTOM
            for m in sorted(n[1], key=repr):
                ts = self.join(ts, self.normalize(m))
            return ts
        if tag == "not":
            return self.complement(self.normalize(n[1]))
        if tag == "ref":
            self.check_deadline()
            self.enter(self.doc.pointer(n[1]))
            try:
                return self._schema(n[1], n[2])
            finally:
                self.leave()
        raise AssertionError(tag)

    def is_empty(self, n: Node, depth: int = 2) -> bool:
        """Provably empty node (conservative; never normalises a node in progress)."""
        if n == FALSE:
            return True
        if n == TRUE or depth <= 0 or n in self._active:
            return False
        try:
            ts = self.normalize(n)
        except CompileTimeoutError:
            raise
        except (UnsupportedFeatureError, CompileLimitError):
            return False
        return self.ts_empty(ts, depth - 1)

    def ts_empty(self, ts: TS, depth: int = 1) -> bool:
        if ts.null or ts.bools or not num_empty(ts.num) or not s_empty(ts.str):
            return False
        if any(not self._arr_empty(a, depth) for a in ts.arr):
            return False
        return all(self._obj_empty(o, depth) for o in ts.obj)

    # -- records: emptiness ------------------------------------------------------------
    def _arr_empty(self, a: Arr, depth: int = 1) -> bool:
        if a.max_items is not None and a.min_items > a.max_items:
            return True
        for i in range(a.min_items):
            if i >= len(a.prefix) and a.rest == FALSE:
                return True
            if depth > 0 and self.is_empty(a.item(i), depth):
                return True
            if i >= len(a.prefix):
                break
        for c, lo, hi, start in a.contains:
            if hi is not None and lo > hi:
                return True
            if lo > 0 and a.max_items is not None and a.max_items - start < lo:
                return True
            if lo > 0 and c == FALSE:
                return True
        return False

    def _obj_empty(self, o: Obj, depth: int = 1) -> bool:
        if o.max_props is not None and (o.min_props > o.max_props or len(o.required) > o.max_props):
            return True
        for r in o.required:
            for k, s in o.props:
                if s == FALSE and s_member(k, r):
                    return True
        if depth > 0:
            for r in o.required:
                v = n_and(*(s for k, s in o.props if s_member(k, r)))
                if self.is_empty(v, depth):
                    return True
        for _k, s, lo, hi in o.exists:
            if hi is not None and lo > hi:
                return True
            if lo > 0 and s == FALSE:
                return True
        return False

    # -- meet / join / complement ------------------------------------------------------
    def meet(self, a: TS, b: TS) -> TS:
        if a == TOP:
            return b
        if b == TOP or a == b:
            return a
        if a == BOTTOM or b == BOTTOM:
            return BOTTOM
        arr = self._dnf(self._arr_meet(x, y) for x in a.arr for y in b.arr)
        obj = self._dnf(self._obj_meet(x, y) for x in a.obj for y in b.obj)
        return TS(a.null and b.null, a.bools & b.bools, num_and(a.num, b.num), s_and(a.str, b.str),
                  self._prune_arr(arr), self._prune_obj(obj))

    def join(self, a: TS, b: TS) -> TS:
        if a == BOTTOM:
            return b
        if b == BOTTOM or a == b:
            return a
        return TS(a.null or b.null, a.bools | b.bools, num_or(a.num, b.num), s_or(a.str, b.str),
                  self._dnf(a.arr + b.arr), self._dnf(a.obj + b.obj))

    def complement(self, a: TS) -> TS:
        if a == TOP:
            return BOTTOM
        if a == BOTTOM:
            return TOP
        arr: tuple[Arr, ...] = (ARR_TOP,)
        for r in a.arr:
            alts = self._arr_violations(r)
            arr = self._prune_arr(self._dnf(self._arr_meet(x, y) for x in arr for y in alts))
        obj: tuple[Obj, ...] = (OBJ_TOP,)
        for r in a.obj:
            alts_o = self._obj_violations(r)
            obj = self._prune_obj(self._dnf(self._obj_meet(x, y) for x in obj for y in alts_o))
        return TS(not a.null, frozenset((False, True)) - a.bools, num_not(a.num), s_not(a.str), arr, obj)

    def _dnf(self, recs: Iterable[Any]) -> tuple:
        """Canonicalise, prune provably empty records, dedup and drop subsumed ones."""
        if self.deadline is not None:
            self._tick_deadline()
        out: dict[Any, None] = {}
        for r in recs:
            if r is None:
                continue
            if isinstance(r, Obj):
                r = _obj_canon(r)
                if self._obj_empty(r, 0):
                    continue
            else:
                r = _arr_canon(r)
                if self._arr_empty(r, 0):
                    continue
            out[r] = None
            if len(out) > 16 * MAX_DNF:
                break
        lst = _drop_subsumed(list(out), self.check_deadline if self.deadline is not None else None)
        if len(lst) > MAX_DNF:
            from structgen.frontends.json_schema.diagnostics import applicator_keyword

            kw = self.keyword() or applicator_keyword(self.doc, self.where()) or "anyOf"
            raise UnsupportedFeatureError(
                f"combination of applicators needs more than {MAX_DNF} alternatives (keyword {kw!r} "
                "and the applicators it combines with)", pointer=self.where(), keyword=kw)
        return tuple(lst)

    def _prune_arr(self, recs: tuple[Arr, ...]) -> tuple[Arr, ...]:
        return self._dnf(recs)

    def _prune_obj(self, recs: tuple[Obj, ...]) -> tuple[Obj, ...]:
        return self._dnf(recs)

    def _arr_meet(self, a: Arr, b: Arr) -> Arr | None:
        if a == ARR_TOP:
            return b
        if b == ARR_TOP:
            return a
        n = max(len(a.prefix), len(b.prefix))
        his = [h for h in (a.max_items, b.max_items) if h is not None]
        return _arr_norm(Arr(tuple(n_and(a.item(i), b.item(i)) for i in range(n)), n_and(a.rest, b.rest),
                             max(a.min_items, b.min_items), min(his) if his else None,
                             tuple(dict.fromkeys(a.contains + b.contains)), a.unique or b.unique,
                             max(a.ev_prefix, b.ev_prefix), a.ev_all or b.ev_all,
                             tuple(dict.fromkeys(a.ev_nodes + b.ev_nodes))))

    def _obj_meet(self, a: Obj, b: Obj) -> Obj | None:
        if a == OBJ_TOP:
            return b
        if b == OBJ_TOP:
            return a
        lo = max(a.min_props, b.min_props)
        his = [h for h in (a.max_props, b.max_props) if h is not None]
        hi = min(his) if his else None
        if hi is not None and lo > hi:
            return None
        return Obj(tuple(dict.fromkeys(a.props + b.props)), a.required | b.required, lo, hi,
                   tuple(dict.fromkeys(a.exists + b.exists)), s_or(a.ev, b.ev))

    def _arr_violations(self, r: Arr) -> list[Arr]:
        out: list[Arr] = []
        if r.min_items > 0:
            out.append(Arr(max_items=r.min_items - 1))
        if r.max_items is not None:
            out.append(Arr(min_items=r.max_items + 1))
        for i, p in enumerate(r.prefix):
            if p != TRUE:
                out.append(Arr(prefix=(TRUE,) * i + (n_not(p),), min_items=i + 1))
        if r.rest != TRUE:
            out.append(Arr(contains=((n_not(r.rest), 1, None, len(r.prefix)),)))
        for c, lo, hi, start in r.contains:
            if lo > 0:
                out.append(Arr(contains=((c, 0, lo - 1, start),)))
            if hi is not None:
                out.append(Arr(contains=((c, hi + 1, None, start),)))
        if r.unique and (r.max_items is None or r.max_items > 1):
            self.unsupported("uniqueItems", self.where(),
                             "uniqueItems cannot be negated (a grammar cannot express 'has duplicates')")
        return out

    def _obj_violations(self, r: Obj) -> list[Obj]:
        out: list[Obj] = []
        if r.min_props > 0:
            out.append(Obj(max_props=r.min_props - 1))
        if r.max_props is not None:
            out.append(Obj(min_props=r.max_props + 1))
        for name in sorted(r.required):
            out.append(Obj(props=((s_lits((name,)), FALSE),)))
        for k, s in r.props:
            if s == TRUE:
                continue
            if k[0] == "lits" and len(k[1]) == 1:
                out.append(Obj(props=((k, n_not(s)),), required=k[1]))
            elif k[0] == "lits":
                for name in sorted(k[1]):
                    out.append(Obj(props=((s_lits((name,)), n_not(s)),), required=frozenset((name,))))
            else:
                out.append(Obj(exists=((k, n_not(s), 1, None),)))
        for k, s, lo, hi in r.exists:
            if lo > 0:
                out.append(_exists_obj(k, s, 0, lo - 1))
            if hi is not None:
                out.append(_exists_obj(k, s, hi + 1, None))
        return out

    # -- keywords -> TS ----------------------------------------------------------------
    def _schema(self, loc: Loc, scope: tuple[str, ...]) -> TS:
        doc = self.doc
        node = doc.node(loc)
        ptr = doc.pointer(loc)
        if node is True:
            return TOP
        if node is False:
            return BOTTOM
        if not isinstance(node, dict):
            raise SchemaError(f"a schema must be an object or a boolean, not {type(node).__name__}",
                              pointer=ptr)
        if doc.has_dynamic:
            res = doc.resource_uri(loc)
            if res not in scope:
                scope = scope + (res,)
        draft = doc.draft(loc)
        kws = self._kws  # kws[-1]: the keyword being normalised here (error messages)
        if draft in _OLD and "$ref" in node:
            kws[-1] = "$ref"
            return self.normalize(self.ref_node(doc.resolve(node["$ref"], loc), scope))

        def sub(*path: str | int) -> Loc:
            return Loc(loc.doc, loc.ptr + "".join("/" + escape_token(str(p)) for p in path))

        def child(*path: str | int) -> Node:
            return self.ref_node(sub(*path), scope)

        ts = TOP
        kws[-1] = "type"
        ts = self.meet(ts, self._type_kw(node, ptr))
        if "enum" in node:
            kws[-1] = "enum"
            ts = self.meet(ts, self._enum(node["enum"], ptr))
        if "const" in node:
            kws[-1] = "const"
            ts = self.meet(ts, const_ts(value_key(node["const"])))
        num = self._num_kw(node, ptr)
        if num != ST:
            ts = self.meet(ts, only(num=num))
        st = self._str_kw(node, ptr, draft)
        if st != ST:
            ts = self.meet(ts, only(str=st))
        kws[-1] = "items"
        arr = self._arr_kw(node, ptr, child)
        if arr is not None:
            ts = self.meet(ts, only(arr=self._prune_arr((arr,))))
        kws[-1] = "properties"
        ts = self._obj_kw(node, ptr, child, ts)

        # in-place applicators
        if "$ref" in node:
            kws[-1] = "$ref"
            ts = self.meet(ts, self.normalize(self.ref_node(doc.resolve(node["$ref"], loc), scope)))
        if "$dynamicRef" in node:
            kws[-1] = "$dynamicRef"
            ref = node["$dynamicRef"]
            if not isinstance(ref, str):
                raise SchemaError("$dynamicRef must be a string", pointer=ptr, keyword="$dynamicRef")
            target = doc.dynamic_target(ref, loc, scope)
            ts = self.meet(ts, self.normalize(self.ref_node(target, scope)))
        if "$recursiveRef" in node:
            self.unsupported("$recursiveRef", ptr, "$recursiveRef (draft 2019-09) is not supported")
        for kw in ("allOf", "anyOf", "oneOf"):
            if kw in node:
                kws[-1] = kw
                subs = node[kw]
                if not isinstance(subs, list) or not subs:
                    raise SchemaError(f"{kw} must be a non-empty array", pointer=ptr, keyword=kw)
                parts = [self.normalize(child(kw, i)) for i in range(len(subs))]
                if kw == "allOf":
                    for p in parts:
                        ts = self.meet(ts, p)
                elif kw == "anyOf":
                    ts = self.meet(ts, self._any_of(parts))
                else:
                    ts = self.meet(ts, self._one_of(parts))
        if "not" in node:
            kws[-1] = "not"
            ts = self.meet(ts, self.complement(self.normalize(child("not"))))
        if "if" in node:
            kws[-1] = "if"
            cond = self.normalize(child("if"))
            then = self.normalize(child("then")) if "then" in node else TOP
            els = self.normalize(child("else")) if "else" in node else TOP
            if then != TOP or els != TOP:
                ts = self.meet(ts, self.join(self.meet(cond, then), self.meet(self.complement(cond), els)))
            elif doc.uses_unevaluated:
                # no assertion, but a successful "if" still contributes annotations
                try:
                    ts = self.meet(ts, self.join(cond, self.complement(cond)))
                except UnsupportedFeatureError:
                    pass  # fewer annotations: stricter, still sound
        # unevaluated* come last: they see every other keyword's annotations
        if "unevaluatedItems" in node:
            kws[-1] = "unevaluatedItems"
            ts = self._unevaluated_items(ts, child("unevaluatedItems"))
        if "unevaluatedProperties" in node:
            kws[-1] = "unevaluatedProperties"
            ts = self._unevaluated_props(ts, child("unevaluatedProperties"))
        return ts

    def _any_of(self, parts: list[TS]) -> TS:
        acc = BOTTOM
        if self.doc.uses_unevaluated and 1 < len(parts) <= 5:
            # every subset of matching branches contributes its annotations together
            for mask in range(1, 1 << len(parts)):
                term = TOP
                for i, p in enumerate(parts):
                    if mask >> i & 1:
                        term = self.meet(term, p)
                acc = self.join(acc, term)
            return acc
        for p in parts:
            acc = self.join(acc, p)
        return acc

    def _one_of(self, parts: list[TS]) -> TS:
        acc = BOTTOM
        comps = [self.complement(p) for p in parts]
        for i, p in enumerate(parts):
            term = p
            for j in range(len(parts)):
                if j != i:
                    term = self.meet(term, comps[j])
                    if term == BOTTOM:
                        break
            acc = self.join(acc, term)
        return acc

    def _type_kw(self, node: dict, ptr: str) -> TS:
        if "type" not in node:
            return TOP
        t = node["type"]
        names = [t] if isinstance(t, str) else t
        ok = {"null", "boolean", "integer", "number", "string", "array", "object"}
        if not isinstance(names, list) or not all(isinstance(x, str) and x in ok for x in names):
            raise SchemaError(f"invalid type {t!r}", pointer=ptr, keyword="type")
        return of_types(names)

    def _enum(self, values: Any, ptr: str) -> TS:
        if not isinstance(values, list):
            raise SchemaError("enum must be an array", pointer=ptr, keyword="enum")
        if len(values) > self.max_enum:
            raise CompileLimitError(f"enum with {len(values)} values exceeds max_enum={self.max_enum} "
                                    f"at {ptr}", pointer=ptr, keyword="enum")
        null = False
        bools: set[bool] = set()
        nums: set[Any] = set()
        strs: set[str] = set()
        arr: list[Arr] = []
        obj: list[Obj] = []
        for v in values:
            if v is None:
                null = True
            elif isinstance(v, bool):
                bools.add(v)
            elif isinstance(v, (int, float)):
                nums.add(v)
            elif isinstance(v, str):
                strs.add(v)
            else:
                t = const_ts(value_key(v))
                arr += t.arr
                obj += t.obj
        return TS(null, frozenset(bools), ("lits", frozenset(nums)) if nums else SF,
                  s_lits(strs), tuple(dict.fromkeys(arr)), tuple(dict.fromkeys(obj)))

    def _number(self, node: dict, kw: str, ptr: str) -> Any:
        v = node[kw]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and
                                                                      not math.isfinite(v)):
            raise SchemaError(f"{kw} must be a number", pointer=ptr, keyword=kw)
        return v

    def _num_kw(self, node: dict, ptr: str) -> tuple:
        f = ST
        lo = hi = None
        lo_x = hi_x = False
        if "minimum" in node:
            lo = self._number(node, "minimum", ptr)
        if "maximum" in node:
            hi = self._number(node, "maximum", ptr)
        for kw, is_lo in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
            if kw not in node:
                continue
            v = node[kw]
            if isinstance(v, bool):  # draft-04 form modifies minimum/maximum
                if v:
                    if is_lo:
                        lo_x = lo is not None
                    else:
                        hi_x = hi is not None
                continue
            v = self._number(node, kw, ptr)
            c = num_c(lo=v, lo_excl=True) if is_lo else num_c(hi=v, hi_excl=True)
            f = num_and(f, c)
        if lo is not None or hi is not None:
            f = num_and(f, num_c(lo, lo_x, hi, hi_x))
        if "multipleOf" in node:
            m = self._number(node, "multipleOf", ptr)
            if m <= 0:
                raise SchemaError("multipleOf must be > 0", pointer=ptr, keyword="multipleOf")
            f = num_and(f, num_c(multiples=(m,)))
        return f

    def _pattern_ok(self, p: str, kw: str, ptr: str) -> bool:
        """Can the validator evaluate ``p`` and can the grammar express it exactly?"""
        try:
            re.compile(p)
        except re.error as e:
            self.unsupported(kw, ptr, f"pattern {p!r} is not a valid Python regex ({e}); "
                             "the validator cannot evaluate it")
            return False
        err = self.pattern_check(p)
        if err is not None:
            self.unsupported(kw, ptr, f"pattern {p!r} cannot be compiled to a grammar: {err}")
            return False
        return True

    def _nonneg(self, node: dict, kw: str, ptr: str) -> int:
        v = node[kw]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (isinstance(v, float)
                                                                              and not v.is_integer()):
            raise SchemaError(f"{kw} must be a non-negative integer", pointer=ptr, keyword=kw)
        return int(v)

    def _str_kw(self, node: dict, ptr: str, draft: str | None = None) -> tuple:
        lo = self._nonneg(node, "minLength", ptr) if "minLength" in node else 0
        hi = self._nonneg(node, "maxLength", ptr) if "maxLength" in node else None
        pats: frozenset[str] = frozenset()
        if "pattern" in node:
            p = node["pattern"]
            if not isinstance(p, str):
                raise SchemaError("pattern must be a string", pointer=ptr, keyword="pattern")
            if self._pattern_ok(p, "pattern", ptr):
                pats = frozenset((p,))
        fmts: frozenset[str] = frozenset()
        if "format" in node and self.formats == "enforce":
            fm = node["format"]
            if not isinstance(fm, str):
                raise SchemaError("format must be a string", pointer=ptr, keyword="format")
            known = _DRAFT_FORMATS.get(draft or "")
            if known is not None and fm not in known:
                pass  # not a format of the schema's draft: an annotation there (e.g. uuid in draft 6)
            elif self.format_supported(fm) is True:
                fmts = frozenset((fm,))
            elif self.format_supported(fm) is None:
                pass  # the validator does not check this format either: annotation only
            else:
                self.unsupported("format", ptr, f"format {fm!r} cannot be enforced by the grammar")
        if lo == 0 and hi is None and not pats and not fmts:
            return ST
        if hi is not None and lo > hi:
            return SF
        return ("c", lo, hi, pats, fmts)

    def _arr_kw(self, node: dict, ptr: str, child: Any) -> Arr | None:
        prefix: tuple[Node, ...] = ()
        rest: Node = TRUE
        ev_prefix = 0
        ev_all = False
        items = node.get("items")
        if isinstance(items, list):  # draft <= 2019-09 tuple form
            prefix = tuple(child("items", i) for i in range(len(items)))
            ev_prefix = len(prefix)
            if "additionalItems" in node:
                rest = child("additionalItems")
                ev_all = True
        else:
            if "prefixItems" in node:
                pre = node["prefixItems"]
                if not isinstance(pre, list):
                    raise SchemaError("prefixItems must be an array", pointer=ptr, keyword="prefixItems")
                prefix = tuple(child("prefixItems", i) for i in range(len(pre)))
                ev_prefix = len(prefix)
            if "items" in node:
                if not isinstance(items, (dict, bool)):
                    raise SchemaError("items must be a schema", pointer=ptr, keyword="items")
                rest = child("items")
                ev_all = True
        lo = self._nonneg(node, "minItems", ptr) if "minItems" in node else 0
        hi = self._nonneg(node, "maxItems", ptr) if "maxItems" in node else None
        contains: tuple = ()
        ev_nodes: tuple[Node, ...] = ()
        if "contains" in node:
            c = child("contains")
            cmin = self._nonneg(node, "minContains", ptr) if "minContains" in node else 1
            cmax = self._nonneg(node, "maxContains", ptr) if "maxContains" in node else None
            if cmin > 0 or cmax is not None:
                contains = ((c, cmin, cmax, 0),)
            ev_nodes = (c,)
        unique = False
        if "uniqueItems" in node:
            if not isinstance(node["uniqueItems"], bool):
                raise SchemaError("uniqueItems must be a boolean", pointer=ptr, keyword="uniqueItems")
            unique = node["uniqueItems"]
        rec = Arr(prefix, rest, lo, hi, contains, unique, ev_prefix, ev_all, ev_nodes)
        if rec == ARR_TOP:
            return None
        return _arr_norm(rec) or Arr(min_items=1, max_items=0)

    def _obj_kw(self, node: dict, ptr: str, child: Any, ts: TS) -> TS:
        props: list[tuple[tuple, Node]] = []
        ev_parts: list[tuple] = []
        names: list[str] = []
        pats: list[tuple] = []
        if "properties" in node:
            pr = node["properties"]
            if not isinstance(pr, dict):
                raise SchemaError("properties must be an object", pointer=ptr, keyword="properties")
            for k in pr:
                props.append((s_lits((k,)), child("properties", k)))
                names.append(k)
            if names:
                ev_parts.append(s_lits(names))
        if "patternProperties" in node:
            pp = node["patternProperties"]
            if not isinstance(pp, dict):
                raise SchemaError("patternProperties must be an object", pointer=ptr,
                                  keyword="patternProperties")
            for p in pp:
                if not self._pattern_ok(p, "patternProperties", ptr):
                    continue
                f = ("c", 0, None, frozenset((p,)), frozenset())
                props.append((f, child("patternProperties", p)))
                pats.append(f)
                ev_parts.append(f)
        if "additionalProperties" in node:
            known = s_or(s_lits(names), *pats)
            props.append((s_not(known), child("additionalProperties")))
            ev_parts.append(ST)
        required: frozenset[str] = frozenset()
        if "required" in node:
            req = node["required"]
            if not isinstance(req, list) or not all(isinstance(x, str) for x in req):
                raise SchemaError("required must be an array of strings", pointer=ptr, keyword="required")
            required = frozenset(req)
        lo = self._nonneg(node, "minProperties", ptr) if "minProperties" in node else 0
        hi = self._nonneg(node, "maxProperties", ptr) if "maxProperties" in node else None
        if "propertyNames" in node:
            self._kws[-1] = "propertyNames"
            pn = self.normalize(child("propertyNames"))
            if pn.str != ST:
                props.append((s_not(pn.str), FALSE))
        rec = Obj(tuple(props), required, lo, hi, (), s_or(*ev_parts))
        if rec != OBJ_TOP:
            ts = self.meet(ts, only(obj=self._prune_obj((rec,))))
        # dependencies
        deps: list[tuple[str, Any, tuple]] = []
        for kw in ("dependentRequired", "dependentSchemas", "dependencies"):
            d = node.get(kw)
            if d is None:
                continue
            if not isinstance(d, dict):
                raise SchemaError(f"{kw} must be an object", pointer=ptr, keyword=kw)
            for k, v in d.items():
                deps.append((k, v, (kw, k)))
        for k, v, path in deps:
            self._kws[-1] = path[0]
            absent = Obj(props=((s_lits((k,)), FALSE),))
            if isinstance(v, list):
                if not all(isinstance(x, str) for x in v):
                    raise SchemaError("dependentRequired values must be arrays of strings",
                                      pointer=ptr, keyword=path[0])
                dep = only(obj=(absent, Obj(required=frozenset((k, *v)))))
            elif isinstance(v, (dict, bool)) and path[0] != "dependentRequired":
                sub_ts = self.normalize(child(*path))
                present = self.meet(only(obj=(Obj(required=frozenset((k,))),)), sub_ts)
                dep = only(obj=(absent,) + present.obj)
            else:
                raise SchemaError(f"invalid {path[0]} value for {k!r}", pointer=ptr, keyword=path[0])
            ts = self.meet(ts, dep)
        return ts

    def _unevaluated_items(self, ts: TS, u: Node) -> TS:
        out: list[Arr] = []
        for r in ts.arr:
            if r.ev_all:
                out.append(r)
                continue
            extra = n_or(u, *r.ev_nodes)
            n = max(len(r.prefix), r.ev_prefix)
            prefix = tuple(r.item(i) if i < r.ev_prefix else n_and(r.item(i), extra) for i in range(n))
            rec = _arr_norm(replace(r, prefix=prefix, rest=n_and(r.rest, extra), ev_all=True))
            if rec is not None:
                out.append(rec)
        return replace(ts, arr=self._prune_arr(tuple(dict.fromkeys(out))))

    def _unevaluated_props(self, ts: TS, u: Node) -> TS:
        if u == TRUE:
            return replace(ts, obj=tuple(replace(r, ev=ST) for r in ts.obj))
        out: list[Obj] = []
        for r in ts.obj:
            if r.ev == ST:
                out.append(r)
                continue
            out.append(replace(r, props=r.props + ((s_not(r.ev), u),), ev=ST))
        return replace(ts, obj=tuple(dict.fromkeys(out)))


def _exists_obj(k: tuple, s: Node, lo: int, hi: int | None) -> Obj:
    if lo == 0 and hi == 0:
        return Obj(props=((k, n_not(s)),))
    if lo == 0 and hi is None:
        return OBJ_TOP
    return Obj(exists=((k, s, lo, hi),))


def _arr_norm(r: Arr) -> Arr | None:
    """Canonicalise an array record (FALSE items bound the length); None if empty."""
    prefix, rest, hi = r.prefix, r.rest, r.max_items
    if rest == FALSE:
        hi = len(prefix) if hi is None else min(hi, len(prefix))
    for i, p in enumerate(prefix):
        if p == FALSE:
            hi = i if hi is None else min(hi, i)
            break
    if hi is not None:
        prefix = prefix[:hi]
    while prefix and prefix[-1] == rest:
        prefix = prefix[:-1]
    if hi is not None and r.min_items > hi:
        return None
    return replace(r, prefix=prefix, rest=rest, max_items=hi)


def _obj_canon(o: Obj) -> Obj:
    merged: dict[tuple, Node] = {}
    for k, v in o.props:
        merged[k] = n_and(merged[k], v) if k in merged else v
    props = tuple(sorted(((k, v) for k, v in merged.items() if v != TRUE), key=repr))
    exists = tuple(sorted(set(o.exists), key=repr))
    if props == o.props and exists == o.exists:
        return o
    return replace(o, props=props, exists=exists)


def _arr_canon(a: Arr) -> Arr:
    contains = tuple(sorted(set(a.contains), key=repr))
    ev_nodes = tuple(sorted(set(a.ev_nodes), key=repr))
    if contains == a.contains and ev_nodes == a.ev_nodes:
        return a
    return replace(a, contains=contains, ev_nodes=ev_nodes)


def _implies(sa: Node, sb: Node) -> bool:
    """Syntactically, does node ``sa`` imply node ``sb``?"""
    return sb == TRUE or sa == sb or sa == FALSE or (sa[0] == "and" and (sb in sa[1] or (
        sb[0] == "and" and sb[1] <= sa[1])))


def _obj_le(a: Obj, b: Obj) -> bool:
    """Syntactically, is every object of ``a`` one of ``b``?"""
    return _obj_le_facts(_obj_facts(a), _obj_facts(b))


def _arr_le(a: Arr, b: Arr) -> bool:
    if b.min_items > a.min_items:
        return False
    if b.max_items is not None and (a.max_items is None or a.max_items > b.max_items):
        return False
    if (b.unique and not a.unique) or not set(b.contains) <= set(a.contains):
        return False
    if a.ev_prefix > b.ev_prefix or (a.ev_all and not b.ev_all) or not set(a.ev_nodes) <= set(b.ev_nodes):
        return False
    n = max(len(a.prefix), len(b.prefix))
    return all(_implies(a.item(i), b.item(i)) for i in range(n)) and _implies(a.rest, b.rest)


def _obj_facts(a: Obj) -> tuple[Any, ...]:
    """What :func:`_obj_le` reads of ``a``, in the shapes it compares (built once per record)."""
    return (a.required, a.min_props, a.max_props, a.ev, frozenset(a.exists), dict(a.props), a.props)


def _obj_le_facts(fa: tuple[Any, ...], fb: tuple[Any, ...]) -> bool:
    """:func:`_obj_le` on :func:`_obj_facts`."""
    if not (fb[0] <= fa[0] and fb[1] <= fa[1]):
        return False
    if fb[2] is not None and (fa[2] is None or fa[2] > fb[2]):
        return False
    if not (fb[3] == ST or fa[3] == SF or fa[3] == fb[3]):
        return False
    if not fb[4] <= fa[4]:
        return False
    ap = fa[5]
    for k, v in fb[6]:
        va = ap.get(k)
        if va is None or not _implies(va, v):
            return False
    return True


def _drop_subsumed(recs: list[Any], check: Callable[[], None] | None = None) -> list[Any]:
    n = len(recs)
    if n < 2 or n > 3000:
        return recs
    if isinstance(recs[0], Obj):
        facts = [_obj_facts(r) for r in recs]
        le: Callable[[Any, Any], bool] = _obj_le_facts
        # ``a <= b`` needs b's required keys, exists terms and property key sets among a's: one bit per
        # such item, so a pair is compared only when ``sig[b] & ~sig[a] == 0`` (cheap integer test).
        bit: dict[Any, int] = {}
        sig = []
        for f in facts:
            m = 0
            for x in f[0]:
                m |= 1 << bit.setdefault(("r", x), len(bit))
            for x in f[4]:
                m |= 1 << bit.setdefault(("e", x), len(bit))
            for k, _v in f[6]:
                m |= 1 << bit.setdefault(("p", k), len(bit))
            sig.append(m)
    else:
        facts, le = recs, _arr_le
        sig = [0] * n
    keep: list[Any] = []
    for i, r in enumerate(facts):
        if check is not None and i & 63 == 63:
            check()  # quadratic in the number of records: a deadline check now and then
        na = ~sig[i]
        if any(le(r, facts[j]) and not (j > i and le(facts[j], r))
               for j in [j for j, s in enumerate(sig) if not s & na and j != i]):
            continue
        keep.append(recs[i])
    return keep
