"""Strict mode: close the objects and arrays a schema leaves open (generation's default).

A schema that lists properties but says nothing about other keys allows any other key, and a
small model will happily invent some. Strict mode (:attr:`~structgen.config.JsonSchemaOptions.strict`)
narrows the language at every *instance position* (the root, and each property value, array
item, ... the lowering makes a rule for), after every in-place applicator has been combined:

* an object record keeps only the keys ``unevaluatedProperties`` would count as evaluated there
  (names and patterns of ``properties``/``patternProperties``, through ``allOf``, ``anyOf``,
  ``oneOf``, ``$ref``, ``if``/``then``/``else`` and ``dependentSchemas``: the record's ``ev``
  lower bound) plus the names the record requires. A record that already evaluates every key
  (``additionalProperties`` or ``unevaluatedProperties`` given, even ``true``) is untouched, and
  so is one that declares nothing (``{"type": "object"}``);
* an array record with a declared prefix (``prefixItems``, or array-form ``items``) and neither
  ``items``/``additionalItems`` nor ``unevaluatedItems`` keeps no item past the prefix, except
  items matched by ``contains`` (which ``unevaluatedItems`` counts as evaluated too).

Closing only ever removes values, and a record is closed only when every value it held keeps a
closed counterpart (drop the undeclared keys / the items past the prefix): so a record whose
``minProperties``, ``minItems`` or counted ``contains``/pattern keys could need the dropped
part stays open, and a note is added to the compiled grammar's warnings. Every output of a
strict grammar is valid under the original schema.
"""

from __future__ import annotations

from dataclasses import replace

from structgen.frontends.json_schema.algebra import Normalizer
from structgen.frontends.json_schema.formulas import (
    SF,
    ST,
    lits_of,
    s_and,
    s_empty,
    s_lits,
    s_member,
    s_not,
    s_or,
)
from structgen.frontends.json_schema.records import (
    FALSE,
    TS,
    Arr,
    Node,
    Obj,
    arr_canon,
    arr_norm,
    n_and,
    n_or,
    obj_canon,
)

__all__ = ["Closer"]


class Closer:
    """The strict language of nodes at instance positions (memoised per node); notes on the
    records left open go to the normaliser's warnings."""

    def __init__(self, norm: Normalizer) -> None:
        self.norm = norm
        self._memo: dict[Node, TS] = {}

    def language(self, node: Node) -> TS:
        """The normalised language of ``node``, its object and array records closed."""
        got = self._memo.get(node)
        if got is None:
            ts = self.norm.normalize(node)
            obj = tuple(dict.fromkeys(self._close_obj(r) for r in ts.obj))
            arr = tuple(dict.fromkeys(self._close_arr(r) for r in ts.arr))
            got = self._memo[node] = replace(ts, obj=obj, arr=arr) if (obj, arr) != (ts.obj, ts.arr) else ts
        return got

    def _note(self, what: str, why: str) -> None:
        self.norm.warnings.append(f"strict: the {what} at {self.norm.where()} is left open: {why}")

    # -- objects ---------------------------------------------------------------------------
    def _close_obj(self, r: Obj) -> Obj:
        if r.ev == ST:
            return r  # additionalProperties / unevaluatedProperties evaluate every key already
        allowed = s_or(r.ev, s_lits(r.required))
        if allowed == SF:
            return r  # declares nothing: an open object is what the schema asks for
        why = self._obj_conflict(r, allowed)
        if why:
            self._note("object", why)
            return r
        return obj_canon(replace(r, props=r.props + ((s_not(allowed), FALSE),)))

    def _obj_conflict(self, r: Obj, allowed: tuple) -> str | None:
        """Why dropping the keys outside ``allowed`` could empty record ``r`` (None: it cannot;
        every object of ``r`` minus those keys is still one of ``r``, or enough declared names
        are there to add)."""
        outside = s_not(allowed)
        for k, _s, lo, _hi in r.exists:
            if lo > 0 and not s_empty(s_and(k, outside)):
                return "it needs a count of keys that undeclared names could make up"
        if r.min_props > len(r.required):
            names = [n for n in sorted(lits_of(allowed)) if s_member(allowed, n)]
            usable = sum(1 for n in names if self._name_possible(r, n))
            if r.min_props > usable:
                return (f"minProperties {r.min_props} is more than the {usable} declared "
                        "names can give")
        return None

    def _name_possible(self, r: Obj, name: str) -> bool:
        v = n_and(*(s for k, s in r.props if s_member(k, name)))
        return v != FALSE and not self.norm.is_empty(v, 1)

    # -- arrays ----------------------------------------------------------------------------
    def _close_arr(self, r: Arr) -> Arr:
        if r.ev_all or r.ev_prefix == 0:
            return r  # items/additionalItems given, or no prefix declared
        why = self._arr_conflict(r)
        if why:
            self._note("array", why)
            return r
        extra: Node = n_or(*r.ev_nodes)  # FALSE when there is no contains
        prefix = tuple(r.item(i) for i in range(r.ev_prefix))  # arr_norm trims the prefix
        closed = arr_norm(replace(r, prefix=prefix, rest=n_and(r.rest, extra), ev_all=True))
        return r if closed is None else arr_canon(closed)

    @staticmethod
    def _arr_conflict(r: Arr) -> str | None:
        """Why dropping the items past the prefix that match no ``contains`` could empty record
        ``r`` (None: it cannot)."""
        if len(r.prefix) > r.ev_prefix:
            return "its item constraints reach past the declared prefix"
        if r.min_items > r.ev_prefix:
            return f"minItems {r.min_items} is more than the {r.ev_prefix} prefix items"
        for c, lo, _hi, start in r.contains:
            if lo > 0 and (c not in r.ev_nodes or start > r.ev_prefix):
                return "it needs items past the prefix to be counted"
        return None
