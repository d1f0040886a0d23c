"""The keywords of one JSON type, read into the parts of a typed set.

:class:`TypeKeywords` is a mixin of :class:`~structgen.frontends.json_schema.algebra.Normalizer`:
it reads ``type``, ``enum``/``const``, the number keywords, the string keywords (lengths,
``pattern``, ``format``, with the formats each draft defines: :data:`DRAFT_FORMATS`) and the
array and object keywords of one schema object into :class:`~structgen.frontends.json_schema.records.TS`
parts and records, reporting what cannot be enforced through the normaliser.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from structgen.errors import CompileLimitError, SchemaError
from structgen.frontends.json_schema.formulas import SF, ST, num_and, num_c, s_lits, s_not, s_or, value_key
from structgen.frontends.json_schema.patterns import Pattern
from structgen.frontends.json_schema.records import (
    ARR_TOP,
    FALSE,
    OBJ_TOP,
    TOP,
    TRUE,
    TS,
    Arr,
    Node,
    Obj,
    arr_norm,
    const_ts,
    of_types,
    only,
)

__all__ = ["DRAFT_FORMATS", "TypeKeywords"]

# formats each old draft defines; any other name is an unknown format there (an annotation)
_F4 = frozenset({"date-time", "email", "hostname", "ipv4", "ipv6", "uri"})
_F6 = _F4 | {"uri-reference", "uri-template", "json-pointer"}
_F7 = _F6 | {"date", "time", "idn-email", "idn-hostname", "iri", "iri-reference", "relative-json-pointer",
             "regex"}
DRAFT_FORMATS = {"3": _F4 | {"date", "time", "host-name", "ip-address"}, "4": _F4, "6": _F6, "7": _F7}


class TypeKeywords:
    """Per-type keywords -> typed-set parts, for a
    :class:`~structgen.frontends.json_schema.algebra.Normalizer` (a mixin: it uses the
    normaliser's options, error reporting and meet)."""

    formats: str
    max_enum: int
    regex_dialect: str
    _kws: list[str | None]
    format_supported: Callable[[str], bool | None]
    pattern_check: Callable[[str, str], str | None]
    meet: Callable[[TS, TS], TS]
    normalize: Callable[[Node], TS]
    unsupported: Callable[[str, str, str], None]
    _prune_obj: Callable[[tuple[Obj, ...]], tuple[Obj, ...]]

    def _type_kw(self, node: dict, ptr: str) -> TS:
        if "type" not in node:
            return TOP
        t = node["type"]
        names = [t] if isinstance(t, str) else t
        ok = {"null", "boolean", "integer", "number", "string", "array", "object"}
        if not isinstance(names, list) or not all(isinstance(x, str) and x in ok for x in names):
            raise SchemaError(f"invalid type {t!r}", pointer=ptr, keyword="type")
        return of_types(names)

    def _enum(self, values: object, ptr: str) -> TS:
        if not isinstance(values, list):
            raise SchemaError("enum must be an array", pointer=ptr, keyword="enum")
        if len(values) > self.max_enum:
            raise CompileLimitError(f"enum with {len(values)} values exceeds max_enum={self.max_enum} "
                                    f"at {ptr}", pointer=ptr, keyword="enum")
        null = False
        bools: set[bool] = set()
        nums: set[int | float] = set()
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

    def _number(self, node: dict, kw: str, ptr: str) -> int | float:
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
        """Can ``p`` be evaluated in :attr:`regex_dialect` and can the grammar express it exactly?"""
        err = self.pattern_check(p, self.regex_dialect)
        if err is not None:
            self.unsupported(kw, ptr, f"pattern {p!r} {err}")
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
        pats: frozenset[Pattern] = frozenset()
        if "pattern" in node:
            p = node["pattern"]
            if not isinstance(p, str):
                raise SchemaError("pattern must be a string", pointer=ptr, keyword="pattern")
            if self._pattern_ok(p, "pattern", ptr):
                pats = frozenset((Pattern(p, self.regex_dialect),))
        fmts: frozenset[str] = frozenset()
        if "format" in node and self.formats == "enforce":
            fm = node["format"]
            if not isinstance(fm, str):
                raise SchemaError("format must be a string", pointer=ptr, keyword="format")
            known = DRAFT_FORMATS.get(draft or "")
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

    def _arr_kw(self, node: dict, ptr: str, child: Callable[..., Node]) -> Arr | None:
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
        return arr_norm(rec) or Arr(min_items=1, max_items=0)

    def _obj_kw(self, node: dict, ptr: str, child: Callable[..., Node], ts: TS) -> TS:
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
                f: tuple = ("c", 0, None, frozenset((Pattern(p, self.regex_dialect),)), frozenset())
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
        deps: list[tuple[str, object, tuple[str, str]]] = []
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
