"""Which schema keyword a location's trouble comes from: shared by the normaliser and diagnostics.

Pure look-ups on a loaded :class:`~structgen.frontends.json_schema.document.SchemaDoc` (no
normalisation), used to name a keyword in an error: the normaliser
(:mod:`structgen.frontends.json_schema.algebra`) names the applicator behind a combination that
grows too large, and :mod:`structgen.frontends.json_schema.diagnostics` names the keyword behind
an unsatisfiable subschema or an automaton limit. Both import this module; it imports neither.
"""

from __future__ import annotations

import json

from structgen.errors import StructgenError
from structgen.frontends.json_schema.document import Loc, SchemaDoc
from structgen.json_types import JsonValue

__all__ = ["OLD_DRAFTS", "applicator_keyword", "json_size", "keyword_at", "loc_of", "node_at",
           "structural_keyword"]

#: drafts whose ``$ref`` hides its siblings (draft 7 and older)
OLD_DRAFTS = ("3", "4", "6", "7")

# keywords holding subschemas, for naming the keyword that makes a location large
_STRUCTURAL = (
    "properties", "patternProperties", "additionalProperties", "items", "prefixItems",
    "additionalItems", "contains", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
    "dependentSchemas", "dependencies", "propertyNames", "unevaluatedProperties",
    "unevaluatedItems", "$ref", "$dynamicRef", "definitions", "$defs",
)
_CONSTRAINTS = (
    "pattern", "format", "maxLength", "minLength", "enum", "const", "multipleOf", "maximum",
    "minimum", "exclusiveMaximum", "exclusiveMinimum", "maxItems", "minItems", "uniqueItems",
    "maxProperties", "minProperties", "required", "type",
)


def loc_of(doc: SchemaDoc, pointer: str) -> Loc | None:
    """The location a user-facing pointer (``#/a/b`` or ``uri#/a/b``) names, or None."""
    uri, sep, frag = pointer.partition("#")
    if not sep:
        return None
    if not uri:
        return Loc(0, frag)
    root = doc.resources.get(uri)
    return Loc(root.doc, frag) if root is not None and root.ptr == "" else None


def node_at(doc: SchemaDoc, loc: Loc) -> JsonValue:
    """The schema value at ``loc``, or None where ``doc`` cannot resolve it."""
    try:
        return doc.node(loc)
    except StructgenError:
        return None


def json_size(v: object) -> int:
    """Length of ``v``'s JSON text: how large a keyword's value is (0 when it cannot be
    serialised)."""
    try:
        return len(json.dumps(v, default=str))
    except (TypeError, ValueError, RecursionError):
        return 0


def structural_keyword(doc: SchemaDoc | None, pointer: str | None) -> str | None:
    """The keyword of the schema at ``pointer`` whose value is largest among those holding
    subschemas (``$ref`` counts its target); failing that its first constraint keyword;
    failing that the innermost keyword on the pointer (:func:`keyword_at`)."""
    if not pointer:
        return None
    node = None
    loc = loc_of(doc, pointer) if doc is not None else None
    if loc is not None:
        node = node_at(doc, loc)  # type: ignore[arg-type]
    if isinstance(node, dict) and node:
        if "$ref" in node and doc is not None and doc.draft(loc) in OLD_DRAFTS:  # type: ignore[arg-type]
            return "$ref"  # draft <= 7: the siblings of $ref are ignored
        best, size = None, -1
        for kw in _STRUCTURAL:
            if kw not in node or kw in ("definitions", "$defs"):
                continue
            v = node[kw]
            if kw in ("$ref", "$dynamicRef") and doc is not None:
                try:
                    v = doc.node(doc.resolve(v, loc))  # type: ignore[arg-type]
                except StructgenError:
                    pass
            n = json_size(v)
            if n > size:
                best, size = kw, n
        if best is not None:
            return best
        for kw in _CONSTRAINTS:
            if kw in node:
                return kw
    return keyword_at(pointer)


_APPLICATORS = ("oneOf", "anyOf", "allOf", "not", "if", "then", "else", "$ref", "dependentSchemas",
                "dependencies")


def applicator_keyword(doc: SchemaDoc | None, pointer: str | None) -> str | None:
    """The applicator keyword (``oneOf``, ``anyOf``, ``allOf``, ``not``, ``if``, ``$ref``...)
    of the schema at ``pointer`` with the largest value, else :func:`structural_keyword`."""
    loc = loc_of(doc, pointer) if doc is not None and pointer else None
    node = node_at(doc, loc) if loc is not None else None  # type: ignore[arg-type]
    if isinstance(node, dict):
        present = [kw for kw in _APPLICATORS if kw in node]
        if present:
            return max(present, key=lambda kw: json_size(node[kw]))
    return structural_keyword(doc, pointer)


def keyword_at(pointer: str) -> str | None:
    """The innermost schema keyword on a JSON pointer (``#/properties/a/anyOf/2`` ->
    ``anyOf``; a property or definition name is skipped), or None at the root."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.partition("#")[2].split("/") if p]
    kw = None
    i = 0
    while i < len(parts):
        p = parts[i]
        kw = p
        # keywords whose next segment is a name or an index, not a keyword
        i += 2 if p in _NAMED_CHILDREN or (i + 1 < len(parts) and parts[i + 1].isdigit()) else 1
    return kw


_NAMED_CHILDREN = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                             "dependencies", "dependentRequired"})
