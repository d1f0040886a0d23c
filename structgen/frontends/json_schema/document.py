"""JSON Schema documents: loading, indexing, ``$ref`` resolution and key ordering.

This module knows schema *documents*, not grammars. It

* parses schema text (JSON errors become :class:`~structgen.errors.SchemaError` with a
  line and column), indexes every subschema with its base URI, ``$id`` resources,
  ``$anchor`` and ``$dynamicAnchor`` names, and checks the nesting depth;
* resolves ``$ref`` / ``$dynamicRef`` values (JSON pointers with ``~0``/``~1`` and
  percent-encoding, ``$id``-relative URIs, anchors, and remote documents when the caller
  supplied them) to :class:`Loc` values;
* defines the *canonical key order* shared by :func:`structgen.frontends.json_schema.compiler.canonical_json`
  and the grammar lowering: at an instance position, the relevant schema locations are
  closed under the in-place applicators (``$ref``, ``allOf``, ``anyOf``, ``oneOf``, ``not``,
  ``if``/``then``/``else``, ``dependentSchemas``); the *declared* names are the
  ``properties`` keys of those schemas in document order, then their ``required`` names.
  Declared keys come first, in that order; every other key follows in instance order.

Locations are ``Loc(doc, ptr)``: the index of a loaded document and an RFC 6901 pointer
(escaped form) into it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple
from urllib.parse import unquote, urldefrag, urljoin

from structgen.errors import CompileLimitError, SchemaError
from structgen.frontends.json_schema.patterns import Pattern
from structgen.json_types import JsonObject, JsonValue

__all__ = ["Loc", "SchemaDoc", "parse_schema_text", "escape_token", "subschemas", "DEFAULT_BASE"]

DEFAULT_BASE = "https://structgen.invalid/root.json"

# keyword -> how it holds subschemas
_SCHEMA_MAP_KW = ("$defs", "definitions", "properties", "patternProperties", "dependentSchemas")
_SCHEMA_ONE_KW = ("additionalProperties", "unevaluatedProperties", "propertyNames", "additionalItems",
                  "unevaluatedItems", "contains", "not", "if", "then", "else", "contentSchema")
_SCHEMA_LIST_KW = ("allOf", "anyOf", "oneOf", "prefixItems")

DRAFT_URIS = {
    "draft2020-12": "2020-12",
    "draft/2020-12": "2020-12",
    "draft/2019-09": "2019-09",
    "draft-07": "7",
    "draft-06": "6",
    "draft-04": "4",
    "draft-03": "3",
}


class Loc(NamedTuple):
    """A schema location: document index and escaped JSON pointer."""

    doc: int
    ptr: str


def escape_token(token: str) -> str:
    """Escape one JSON-pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def _unescape_token(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def parse_schema_text(text: str) -> JsonValue:
    """Parse JSON text; malformed JSON raises SchemaError naming line and column."""
    try:
        value: JsonValue = json.loads(text)
        return value
    except RecursionError:
        raise CompileLimitError("invalid JSON schema text: nested too deeply to parse",
                                pointer="#") from None
    except json.JSONDecodeError as e:
        lines = text.splitlines() or [""]
        line = lines[e.lineno - 1] if 0 < e.lineno <= len(lines) else ""
        caret = f"\n  {line}\n  {' ' * (e.colno - 1)}^"
        raise SchemaError(f"invalid JSON schema text: {e.msg} (line {e.lineno}, column {e.colno})"
                          + caret) from None


def _draft_of(schema: object, default: str) -> str:
    if isinstance(schema, dict):
        uri = schema.get("$schema")
        if isinstance(uri, str):
            for key, draft in DRAFT_URIS.items():
                if key in uri:
                    return draft
    return default


def join_uri(base: str, ref: str) -> str:
    """Resolve ``ref`` against ``base`` (also for non-hierarchical schemes like urn:)."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*:", ref):
        return ref
    if ref.startswith("#"):
        return urldefrag(base)[0] + ref
    if ref == "":
        return urldefrag(base)[0]
    return urljoin(base, ref)


class SchemaDoc:
    """A set of loaded schema documents (the root one first) with their index.

    ``remotes`` maps absolute URIs (without fragment) to schema documents that ``$ref``
    may load; any other remote reference is a :class:`SchemaError`.
    """

    def __init__(self, root: JsonValue, *, remotes: Mapping[str, JsonValue] | None = None,
                 max_depth: int = 128) -> None:
        self.docs: list[JsonValue] = []
        self.drafts: list[str] = []
        self.max_depth = max_depth
        self.remotes = dict(remotes or {})
        self.resources: dict[str, Loc] = {}
        self.anchors: dict[tuple[str, str], Loc] = {}
        self.dynamic_anchors: dict[tuple[str, str], Loc] = {}
        self.bases: dict[Loc, str] = {}  # subschema location -> base URI in effect there
        self.resource_of: dict[Loc, str] = {}  # subschema location -> its resource URI
        self.has_dynamic = False
        self.uses_unevaluated = False
        self._node_cache: dict[Loc, JsonValue] = {}
        self._applicable_memo: dict[tuple[Loc, ...], list[Loc]] = {}
        self._declared_memo: dict[tuple[Loc, ...], list[str]] = {}
        self._load(root, DEFAULT_BASE, default_draft="2020-12")

    # -- loading and indexing ---------------------------------------------------
    def _load(self, schema: JsonValue, uri: str, default_draft: str) -> int:
        idx = len(self.docs)
        self.docs.append(schema)
        draft = _draft_of(schema, default_draft)
        self.drafts.append(draft)
        base = urldefrag(uri)[0]
        self.resources.setdefault(base, Loc(idx, ""))
        self._index(idx, schema, base, draft)
        return idx

    def draft(self, loc: Loc) -> str:
        """The draft the document holding ``loc`` is read as (``"3"`` .. ``"7"``, ``"2019-09"``,
        ``"2020-12"``)."""
        return self.drafts[loc.doc]

    def _index(self, doc: int, schema: JsonValue, base: str, draft: str) -> None:
        stack: list[tuple[JsonValue, str, str, int]] = [(schema, "", base, 0)]
        old = draft in ("3", "4", "6", "7")
        while stack:
            node, ptr, base, depth = stack.pop()
            if depth > self.max_depth:
                raise CompileLimitError(
                    f"schema nesting deeper than max_depth={self.max_depth} at {ptr or '#'}",
                    pointer=ptr or "#")
            loc = Loc(doc, ptr)
            if not isinstance(node, dict):
                self.bases[loc] = base
                self.resource_of[loc] = base
                continue
            id_kw = "id" if draft in ("3", "4") else "$id"
            sid = node.get(id_kw)
            if old and "$ref" in node:
                sid = None  # draft <= 7: $ref siblings (including $id) are ignored
            if isinstance(sid, str):
                if sid.startswith("#") and old:
                    self.anchors[(base, sid[1:])] = loc  # draft-06/07 plain-name $id
                else:
                    base = urldefrag(join_uri(base, sid))[0]
                    self.resources.setdefault(base, loc)
            self.bases[loc] = base
            self.resource_of[loc] = base
            if "unevaluatedItems" in node or "unevaluatedProperties" in node:
                self.uses_unevaluated = True
            anchor = node.get("$anchor")
            if isinstance(anchor, str):
                self.anchors.setdefault((base, anchor), loc)
            danchor = node.get("$dynamicAnchor")
            if isinstance(danchor, str):
                self.anchors.setdefault((base, danchor), loc)
                self.dynamic_anchors.setdefault((base, danchor), loc)
                self.has_dynamic = True
            if old and "$ref" in node:
                # only definitions are still reachable by pointer
                children: list[tuple[JsonValue, str]] = []
                defs = node.get("definitions")
                if isinstance(defs, dict):
                    children += [(v, f"{ptr}/definitions/{escape_token(k)}") for k, v in defs.items()]
            else:
                children = list(subschemas(node, ptr))
            for child, cptr in children:
                stack.append((child, cptr, base, depth + 1))

    # -- access -----------------------------------------------------------------
    def node(self, loc: Loc) -> JsonValue:
        """The schema value at ``loc`` (SchemaError if the pointer does not exist)."""
        if loc in self._node_cache:
            return self._node_cache[loc]
        cur = self.docs[loc.doc]
        if loc.ptr:
            for raw in loc.ptr.split("/")[1:]:
                tok = _unescape_token(raw)
                if isinstance(cur, dict) and tok in cur:
                    cur = cur[tok]
                elif isinstance(cur, list) and re.fullmatch(r"0|[1-9][0-9]*", tok) and int(tok) < len(cur):
                    cur = cur[int(tok)]
                else:
                    raise SchemaError(f"JSON pointer {loc.ptr!r} does not exist", pointer=loc.ptr)
        self._node_cache[loc] = cur
        return cur

    def base_of(self, loc: Loc) -> str:
        """The base URI in force at ``loc``: that of the innermost enclosing ``$id``, else
        the default base."""
        ptr = loc.ptr
        while True:
            got = self.bases.get(Loc(loc.doc, ptr))
            if got is not None:
                return got
            if not ptr:
                return DEFAULT_BASE
            ptr = ptr.rsplit("/", 1)[0]

    def resource_uri(self, loc: Loc) -> str:
        """The URI of the resource ``loc`` belongs to (its base URI)."""
        return self.base_of(loc)

    def pointer(self, loc: Loc) -> str:
        """A user-facing pointer: ``#/a/b`` for the root document, ``uri#/a/b`` for others."""
        if loc.doc == 0:
            return "#" + loc.ptr
        uri = next((u for u, l in self.resources.items() if l == Loc(loc.doc, "")), "?")
        return f"{uri}#{loc.ptr}"

    # -- references -------------------------------------------------------------
    def resolve(self, ref: object, at: Loc, keyword: str = "$ref") -> Loc:
        """Resolve a ``$ref``-like value found at ``at`` to the target location."""
        if not isinstance(ref, str):
            raise SchemaError(f"{keyword} must be a string", pointer=self.pointer(at), keyword=keyword)
        target = join_uri(self.base_of(at), ref)
        uri, frag = urldefrag(target)
        res = self.resources.get(uri)
        if res is None:
            doc = self.remotes.get(uri)
            if doc is None:
                raise SchemaError(f"cannot resolve {keyword} {ref!r} (remote or unknown resource {uri!r}; "
                                  "remote references are not fetched)", pointer=self.pointer(at),
                                  keyword=keyword)
            self._load(doc, uri, default_draft=self.drafts[at.doc])
            res = self.resources[uri]
        frag = unquote(frag)
        if frag == "":
            return res
        if frag.startswith("/"):
            loc = Loc(res.doc, res.ptr + frag)
            try:
                self.node(loc)
            except SchemaError:
                raise SchemaError(f"{keyword} {ref!r} points to nothing", pointer=self.pointer(at),
                                  keyword=keyword) from None
            return loc
        got = self.anchors.get((uri, frag))
        if got is None:
            raise SchemaError(f"{keyword} {ref!r}: unknown anchor {frag!r}", pointer=self.pointer(at),
                              keyword=keyword)
        return got

    def dynamic_target(self, ref: str, at: Loc, scope: tuple[str, ...]) -> Loc:
        """Resolve ``$dynamicRef`` with the dynamic scope (outermost resource first)."""
        static = self.resolve(ref, at, "$dynamicRef")
        frag = unquote(urldefrag(join_uri(self.base_of(at), ref))[1])
        if not frag or frag.startswith("/"):
            return static
        node = self.node(static)
        if not (isinstance(node, dict) and node.get("$dynamicAnchor") == frag):
            return static
        for uri in scope:
            got = self.dynamic_anchors.get((uri, frag))
            if got is not None:
                return got
        return static

    # -- canonical key order ------------------------------------------------------
    def applicable(self, locs: Iterable[Loc]) -> list[Loc]:
        """Close ``locs`` under the in-place applicators (static resolution), in order."""
        locs = tuple(locs)
        got = self._applicable_memo.get(locs)
        if got is None:
            got = self._applicable_memo[locs] = self._applicable(locs)
        return got

    def _applicable(self, locs: tuple[Loc, ...]) -> list[Loc]:
        out: list[Loc] = []
        seen: set[Loc] = set()
        stack = list(reversed(list(locs)))
        while stack:
            loc = stack.pop()
            if loc in seen:
                continue
            seen.add(loc)
            out.append(loc)
            node = self.node(loc)
            if not isinstance(node, dict):
                continue
            nxt: list[Loc] = []
            old = self.draft(loc) in ("3", "4", "6", "7")
            for kw in ("$ref", "$dynamicRef"):
                if kw in node:
                    try:
                        nxt.append(self.resolve(node[kw], loc, kw))
                    except SchemaError:
                        pass
            if not (old and "$ref" in node):
                for kw in ("allOf", "anyOf", "oneOf"):
                    branches = node.get(kw)
                    if isinstance(branches, list):
                        nxt += [Loc(loc.doc, f"{loc.ptr}/{kw}/{i}") for i in range(len(branches))]
                for kw in ("not", "if", "then", "else"):
                    if kw in node:
                        nxt.append(Loc(loc.doc, f"{loc.ptr}/{kw}"))
                for kw in ("dependentSchemas", "dependencies"):
                    deps = node.get(kw)
                    if isinstance(deps, dict):
                        nxt += [Loc(loc.doc, f"{loc.ptr}/{kw}/{escape_token(k)}")
                                for k, v in deps.items() if isinstance(v, (dict, bool))]
            stack.extend(reversed(nxt))
        return out

    def _eff(self, loc: Loc) -> dict | None:
        node = self.node(loc)
        if not isinstance(node, dict):
            return None
        if "$ref" in node and self.draft(loc) in ("3", "4", "6", "7"):
            return {"$ref": node["$ref"]}
        return node

    def declared_names(self, ctx: tuple[Loc, ...]) -> list[str]:
        """Declared property names at a position (see module docstring), in order."""
        got = self._declared_memo.get(ctx)
        if got is None:
            got = self._declared_memo[ctx] = self._declared_names(ctx)
        return got

    def _declared_names(self, ctx: tuple[Loc, ...]) -> list[str]:
        nodes = [n for n in (self._eff(l) for l in self.applicable(ctx)) if n is not None]
        names: dict[str, None] = {}
        for n in nodes:
            props = n.get("properties")
            if isinstance(props, dict):
                for k in props:
                    names.setdefault(k, None)
        for n in nodes:
            req = n.get("required")
            if isinstance(req, list):
                for k in req:
                    if isinstance(k, str):
                        names.setdefault(k, None)
        return list(names)

    def ctx_patterns(self, ctx: tuple[Loc, ...]) -> list[str]:
        """patternProperties patterns of the applicable schemas (they refine child contexts)."""
        pats: dict[str, None] = {}
        for l in self.applicable(ctx):
            n = self._eff(l)
            if n is not None and isinstance(n.get("patternProperties"), dict):
                for p in n["patternProperties"]:
                    pats.setdefault(p, None)
        return list(pats)

    def child_ctx(self, ctx: tuple[Loc, ...], key: str | None,
                  matches: Mapping[str, bool] | None = None) -> tuple[Loc, ...]:
        """Schema locations that apply to the value of property ``key``.

        ``matches`` says which of the :meth:`ctx_patterns` the key matches; needed for a key
        that is not declared (``key=None``), computed here for a named key when None (reading
        the patterns as ECMA-262).
        """
        out: list[Loc] = []
        for l in self.applicable(ctx):
            n = self._eff(l)
            if n is None:
                continue
            props = n.get("properties")
            in_props = isinstance(props, dict) and key is not None and key in props
            if in_props:
                out.append(Loc(l.doc, f"{l.ptr}/properties/{escape_token(key)}"))  # type: ignore[arg-type]
            matched = False
            pp = n.get("patternProperties")
            if isinstance(pp, dict):
                for p in pp:
                    if matches is not None:
                        hit = matches.get(p, False)
                    else:
                        hit = key is not None and _safe_search(p, key)
                    if hit:
                        matched = True
                        out.append(Loc(l.doc, f"{l.ptr}/patternProperties/{escape_token(p)}"))
            if not in_props and not matched:
                for kw in ("additionalProperties", "unevaluatedProperties"):
                    if isinstance(n.get(kw), (dict, bool)):
                        out.append(Loc(l.doc, f"{l.ptr}/{kw}"))
        return _dedup(out)

    def prefix_len(self, ctx: tuple[Loc, ...]) -> int:
        """Number of positional item schemas among the applicable schemas."""
        m = 0
        for l in self.applicable(ctx):
            n = self._eff(l)
            if n is None:
                continue
            if isinstance(n.get("prefixItems"), list):
                m = max(m, len(n["prefixItems"]))
            if isinstance(n.get("items"), list):
                m = max(m, len(n["items"]))
        return m

    def item_ctx(self, ctx: tuple[Loc, ...], index: int) -> tuple[Loc, ...]:
        """Schema locations that apply to array item ``index`` (for key ordering)."""
        out: list[Loc] = []
        for l in self.applicable(ctx):
            n = self._eff(l)
            if n is None:
                continue
            pre = n.get("prefixItems")
            items = n.get("items")
            if isinstance(items, list):
                if index < len(items):
                    out.append(Loc(l.doc, f"{l.ptr}/items/{index}"))
                elif isinstance(n.get("additionalItems"), (dict, bool)):
                    out.append(Loc(l.doc, f"{l.ptr}/additionalItems"))
            elif isinstance(pre, list) and index < len(pre):
                out.append(Loc(l.doc, f"{l.ptr}/prefixItems/{index}"))
            elif isinstance(items, (dict, bool)):
                out.append(Loc(l.doc, f"{l.ptr}/items"))
            for kw in ("contains", "unevaluatedItems"):
                if isinstance(n.get(kw), (dict, bool)):
                    out.append(Loc(l.doc, f"{l.ptr}/{kw}"))
        return _dedup(out)



def _dedup(locs: list[Loc]) -> tuple[Loc, ...]:
    return tuple(dict.fromkeys(locs))


def _safe_search(pattern: str, s: str) -> bool:
    """Does ECMA-262 ``pattern`` match in ``s`` (False if it cannot be evaluated)? The
    lowering passes matches in the schema's own dialect instead."""
    return Pattern(pattern).search(s)


def subschemas(node: JsonObject, ptr: str) -> Iterable[tuple[JsonValue, str]]:
    """The direct subschemas of the schema object ``node`` at JSON pointer ``ptr``: each with
    its own JSON pointer."""
    for kw in _SCHEMA_MAP_KW:
        v = node.get(kw)
        if isinstance(v, dict):
            for k, sub in v.items():
                yield sub, f"{ptr}/{kw}/{escape_token(k)}"
    deps = node.get("dependencies")
    if isinstance(deps, dict):
        for k, sub in deps.items():
            if isinstance(sub, (dict, bool)):
                yield sub, f"{ptr}/dependencies/{escape_token(k)}"
    for kw in _SCHEMA_ONE_KW:
        if kw in node and isinstance(node[kw], (dict, bool)):
            yield node[kw], f"{ptr}/{kw}"
    items = node.get("items")
    if isinstance(items, (dict, bool)):
        yield items, f"{ptr}/items"
    elif isinstance(items, list):
        for i, sub in enumerate(items):
            yield sub, f"{ptr}/items/{i}"
    for kw in _SCHEMA_LIST_KW:
        v = node.get(kw)
        if isinstance(v, list):
            for i, sub in enumerate(v):
                yield sub, f"{ptr}/{kw}/{i}"
