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

Finite sets are evaluated with the validator's own semantics (a pattern's search in its
dialect, :class:`~structgen.frontends.json_schema.patterns.Pattern`; Python numeric
comparison, jsonschema's ``multipleOf``, its format checker), so ``enum``/``const`` combined
with anything else is exact.

Modules: the string and number formulas are in :mod:`structgen.frontends.json_schema.formulas`,
nodes, records and :class:`TS` in :mod:`structgen.frontends.json_schema.records`; this module
holds the :class:`Normalizer`, which builds them from schema locations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from structgen import limits
from structgen.errors import CompileLimitError, CompileTimeoutError, SchemaError, UnsupportedFeatureError
from structgen.frontends.json_schema.document import Loc, SchemaDoc, escape_token
from structgen.frontends.json_schema.formulas import (
    ST,
    KeyIndex,
    num_and,
    num_empty,
    num_not,
    num_or,
    s_and,
    s_empty,
    s_lits,
    s_not,
    s_or,
    value_key,
)
from structgen.frontends.json_schema.keywords import applicator_keyword
from structgen.frontends.json_schema.records import (
    ARR_TOP,
    BOTTOM,
    FALSE,
    OBJ_TOP,
    TOP,
    TRUE,
    TS,
    Arr,
    Node,
    Obj,
    arr_canon,
    arr_norm,
    const_ts,
    drop_subsumed,
    exists_obj,
    n_and,
    n_not,
    n_or,
    obj_canon,
    only,
)
from structgen.frontends.json_schema.type_keywords import TypeKeywords

#: Deepest chain of subschemas applied in place ($ref to $ref to ..., allOf inside allOf, ...)
#: the normaliser follows; deeper is a CompileLimitError (it recurses once per level).
MAX_INPLACE_DEPTH = 150

__all__ = ["MAX_DNF", "MAX_INPLACE_DEPTH", "Normalizer"]

# ---------------------------------------------------------------------------
# The normaliser: schema locations -> TS, with meet / join / complement
# ---------------------------------------------------------------------------

_OLD = ("3", "4", "6", "7")
MAX_DNF = 256


class Normalizer(TypeKeywords):
    """Turns nodes into :class:`TS` values (memoised), reporting unsupported features."""

    def __init__(self, doc: SchemaDoc, *, formats: str = "enforce", lenient: bool = False,
                 max_enum: int = 5000, format_supported: Callable[[str], bool | None] | None = None,
                 pattern_check: Callable[[str, str], str | None] | None = None, annotations: bool = False,
                 regex_dialect: str = "ecma262") -> None:
        self.doc = doc
        # track evaluation annotations precisely (anyOf branch subsets, a lone "if"): needed by
        # unevaluated* and by strict mode (which closes objects to their evaluated keys)
        self.annotations = annotations or doc.uses_unevaluated
        self.formats = formats
        self.lenient = lenient
        self.max_enum = max_enum
        self.warnings: list[str] = []
        self._memo: dict[Node, TS] = {}
        self._active: set[Node] = set()
        self._pos: list[str] = ["#"]  # pointer of the schema being normalised (for errors)
        self._kws: list[str | None] = [None]  # keyword being normalised there (for errors)
        # limits.now() value past which normalisation raises CompileTimeoutError (set by
        # the lowering; None: no limit) and the limit in seconds, for the message
        self.deadline: float | None = None
        self.time_limit = 0.0
        self._tick = 0
        self.format_supported = format_supported or (lambda name: True)
        # (pattern, dialect) -> why it cannot be evaluated or compiled exactly, or None
        self.pattern_check = pattern_check or (lambda p, dialect: None)
        # how patterns are read: a JsonSchemaOptions.regex_dialect value (the lowering sets
        # its own, so that both build the same pattern atoms)
        self.regex_dialect = regex_dialect

    # -- error reporting ----------------------------------------------------------
    def unsupported(self, keyword: str, pointer: str, message: str) -> None:
        """Raise UnsupportedFeatureError, or record a warning in lenient mode."""
        if self.lenient:
            self.warnings.append(f"{pointer} [{keyword}]: {message} (ignored: lenient mode)")
            return
        raise UnsupportedFeatureError(message, pointer=pointer, keyword=keyword)

    def where(self) -> str:
        """The JSON pointer of the schema location being normalised (``#`` at the root)."""
        return self._pos[-1]

    def keyword(self) -> str | None:
        """The keyword being normalised at :meth:`where` (None when not known)."""
        return self._kws[-1]

    def enter(self, pointer: str) -> None:
        """Push the schema location being worked on (error messages name it)."""
        self._pos.append(pointer)
        self._kws.append(None)

    def leave(self) -> None:
        """Pop the location entered last (pairs with :meth:`enter`)."""
        self._pos.pop()
        self._kws.pop()

    def check_deadline(self) -> None:
        """Raise CompileTimeoutError past :attr:`deadline`, naming the innermost schema
        location (and keyword) being normalised."""
        limits.check()  # the request was cancelled: stop here
        if self.deadline is not None and limits.now() > self.deadline:
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
        """The node of the schema at ``loc`` (resolved in ``scope``, for ``$dynamicRef``)."""
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
        """The :class:`TS` language of node ``n`` (memoised per node)."""
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
        """True when ``ts`` surely accepts no value (children examined ``depth`` levels down;
        False may still be empty: an answer for pruning, not a decision procedure)."""
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
        if o.required:
            keys = KeyIndex(k for k, _s in o.props)
            holding = {r: keys.holding(r) for r in o.required}
            if any(o.props[i][1] == FALSE for ids in holding.values() for i in ids):
                return True
            if depth > 0:
                for ids in holding.values():
                    if self.is_empty(n_and(*(o.props[i][1] for i in ids)), depth):
                        return True
        for _k, s, lo, hi in o.exists:
            if hi is not None and lo > hi:
                return True
            if lo > 0 and s == FALSE:
                return True
        return False

    # -- meet / join / complement ------------------------------------------------------
    def meet(self, a: TS, b: TS) -> TS:
        """The intersection of languages ``a`` and ``b``."""
        if a == TOP:
            return b
        if b == TOP or a == b:
            return a
        if a == BOTTOM or b == BOTTOM:
            return BOTTOM
        arr = self._dnf(self._arr_meet(x, y) for x in a.arr for y in b.arr)
        obj = self._dnf(self._obj_meet(x, y) for x in a.obj for y in b.obj)
        return TS(a.null and b.null, a.bools & b.bools, num_and(a.num, b.num), s_and(a.str, b.str), arr, obj)

    def join(self, a: TS, b: TS) -> TS:
        """The union of languages ``a`` and ``b``."""
        if a == BOTTOM:
            return b
        if b == BOTTOM or a == b:
            return a
        return TS(a.null or b.null, a.bools | b.bools, num_or(a.num, b.num), s_or(a.str, b.str),
                  self._dnf(a.arr + b.arr), self._dnf(a.obj + b.obj))

    def complement(self, a: TS) -> TS:
        """The complement of language ``a`` (object and array records become unions of
        violation records)."""
        if a == TOP:
            return BOTTOM
        if a == BOTTOM:
            return TOP
        arr: tuple[Arr, ...] = (ARR_TOP,)
        for r in a.arr:
            alts = self._arr_violations(r)
            arr = self._dnf(self._arr_meet(x, y) for x in arr for y in alts)
        obj: tuple[Obj, ...] = (OBJ_TOP,)
        for ro in a.obj:
            alts_o = self._obj_violations(ro)
            obj = self._dnf(self._obj_meet(x, y) for x in obj for y in alts_o)
        return TS(not a.null, frozenset((False, True)) - a.bools, num_not(a.num), s_not(a.str), arr, obj)

    def _dnf(self, recs: Iterable[Arr | Obj | None]) -> tuple:
        """Canonicalise, prune provably empty records, dedup and drop subsumed ones."""
        if self.deadline is not None:
            self._tick_deadline()
        out: dict[Arr | Obj, None] = {}
        for r in recs:
            if r is None:
                continue
            if isinstance(r, Obj):
                r = obj_canon(r)
                if self._obj_empty(r, 0):
                    continue
            else:
                r = arr_canon(r)
                if self._arr_empty(r, 0):
                    continue
            out[r] = None
            if len(out) > 16 * MAX_DNF:
                break
        lst = drop_subsumed(list(out), self.check_deadline if self.deadline is not None else None)
        if len(lst) > MAX_DNF:
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
        return arr_norm(Arr(tuple(n_and(a.item(i), b.item(i)) for i in range(n)), n_and(a.rest, b.rest),
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
                out.append(exists_obj(k, s, 0, lo - 1))
            if hi is not None:
                out.append(exists_obj(k, s, hi + 1, None))
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
            elif self.annotations:
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
        if self.annotations and 1 < len(parts) <= 5:
            # every subset of matching branches contributes its annotations together
            try:
                for mask in range(1, 1 << len(parts)):
                    term = TOP
                    for i, p in enumerate(parts):
                        if mask >> i & 1:
                            term = self.meet(term, p)
                    acc = self.join(acc, term)
                return acc
            except UnsupportedFeatureError:
                if self.doc.uses_unevaluated:
                    raise
                acc = BOTTOM  # only strict mode wanted them: fewer annotations, a stricter language
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

    def _unevaluated_items(self, ts: TS, u: Node) -> TS:
        out: list[Arr] = []
        for r in ts.arr:
            if r.ev_all:
                out.append(r)
                continue
            extra = n_or(u, *r.ev_nodes)
            n = max(len(r.prefix), r.ev_prefix)
            prefix = tuple(r.item(i) if i < r.ev_prefix else n_and(r.item(i), extra) for i in range(n))
            rec = arr_norm(replace(r, prefix=prefix, rest=n_and(r.rest, extra), ev_all=True))
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
