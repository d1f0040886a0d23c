"""Nodes and structural records: the symbolic half of the JSON Schema algebra.

A *node* is a lazily normalised schema expression (a hashable tuple): a schema location, a
constant, or an and/or/not combination of nodes. A :class:`TS` ("typed set") is a schema's
language split by JSON type; its array and object parts are unions of records
(:class:`Arr`, :class:`Obj`) whose children are nodes, so recursive schemas stay finite.

This module holds the shapes and the operations that need no schema: node combinators
(:func:`n_and`, :func:`n_or`, :func:`n_not`), record canonicalisation and the syntactic
subsumption test that keeps unions small (:func:`drop_subsumed`). The
:class:`~structgen.frontends.json_schema.algebra.Normalizer` builds them from schemas.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from structgen.frontends.json_schema.formulas import SF, ST, num_c, num_or, s_lits, s_not

__all__ = ["ARR_TOP", "BOTTOM", "FALSE", "OBJ_TOP", "TOP", "TRUE", "TS", "Arr", "Node", "Obj", "arr_canon",
           "arr_norm", "const_ts", "drop_subsumed", "exists_obj", "n_and", "n_not", "n_or", "obj_canon",
           "of_types", "only"]

# ---------------------------------------------------------------------------
# Nodes: lazily normalised schema expressions (hashable tuples)
#   ("T",) ("F",) ("ref", Loc, scope) ("const", value_key) ("and", frozenset)
#   ("or", frozenset) ("not", node) ("ts", TS)
# ---------------------------------------------------------------------------

Node = tuple
TRUE: Node = ("T",)
FALSE: Node = ("F",)


def n_and(*nodes: Node) -> Node:
    """The conjunction of nodes, flattened and simplified (FALSE absorbs, TRUE vanishes)."""
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
    """The disjunction of nodes, flattened and simplified (TRUE absorbs, FALSE vanishes)."""
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
    """The negation of node ``n`` (double negation and constants folded)."""
    if n == TRUE:
        return FALSE
    if n == FALSE:
        return TRUE
    if n[0] == "not":
        return n[1]
    return ("not", n)


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
        """The node item ``i`` must satisfy (``rest`` past the prefix)."""
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
    """The language of a ``type`` keyword: every value of the named JSON types."""
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
    """The language holding only the JSON value of :func:`value_key` key ``key``."""
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


def exists_obj(k: tuple, s: Node, lo: int, hi: int | None) -> Obj:
    """The object record "between ``lo`` and ``hi`` keys in key set ``k`` have a value
    in ``s``" (when ``hi == 0``: no key in ``k`` has such a value; ``0..inf``: no constraint)."""
    if lo == 0 and hi == 0:
        return Obj(props=((k, n_not(s)),))
    if lo == 0 and hi is None:
        return OBJ_TOP
    return Obj(exists=((k, s, lo, hi),))


def arr_norm(r: Arr) -> Arr | None:
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


def obj_canon(o: Obj) -> Obj:
    """Object record ``o`` in canonical form: one value node per key set (conjoined), TRUE
    entries dropped, entries sorted, so equal records compare equal."""
    merged: dict[tuple, Node] = {}
    for k, v in o.props:
        merged[k] = n_and(merged[k], v) if k in merged else v
    props = tuple(sorted(((k, v) for k, v in merged.items() if v != TRUE), key=repr))
    exists = tuple(sorted(set(o.exists), key=repr))
    if props == o.props and exists == o.exists:
        return o
    return replace(o, props=props, exists=exists)


def arr_canon(a: Arr) -> Arr:
    """Array record ``a`` with its ``contains`` terms and evaluated nodes sorted and
    deduplicated, so equal records compare equal."""
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


def drop_subsumed(recs: list[Any], check: Callable[[], None] | None = None) -> list[Any]:
    """``recs`` (records of one kind) without those syntactically included in another one:
    the union is unchanged and stays small. Quadratic, so skipped above 3,000 records;
    ``check`` (a deadline check) runs every 64 records."""
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
