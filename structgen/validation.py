"""Validate JSON instances against a JSON Schema: jsonschema's verdict plus the compiled grammar's.

This is the engine behind ``structgen validate``. It never imports torch or transformers.

Two independent checks run on every instance:

* semantic: jsonschema's validator for the schema's ``$schema`` (Draft 2020-12 when absent), with
  its format checker on, so ``format`` keywords are checked as far as jsonschema can;
* grammar: the schema compiled by :func:`structgen.compile_json_schema` in validation's language
  (``for_generation=False``: every JSON spelling, open objects) must accept the canonical
  serialisation of the instance (:func:`structgen.json_schema.canonical_json`), i.e. the text
  structgen itself would generate for that value. When the schema cannot be compiled (for
  example an :class:`~structgen.errors.UnsupportedFeatureError`), a note says so and only the
  semantic check counts.

An instance is valid when jsonschema finds no error and the grammar (when available) accepts it.

References: every jsonschema validator here is built by :func:`jsonschema_validator`, with a
``referencing.Registry`` that holds only the remotes the caller passes and a retriever that refuses
everything else; :func:`check_references` rejects, before any validation, a ``$ref`` that leaves the
schema. So validating never opens a URL or a file (jsonschema's default retriever would do both).

Input may be one JSON document per file or JSON Lines (see :func:`iter_documents`).
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, NoReturn
from urllib.parse import urldefrag

from structgen.errors import CompileLimitError, SchemaError, StructgenError, UnsupportedFeatureError
from structgen.frontends.json_schema.document import Loc, SchemaDoc, join_uri, subschemas
from structgen.frontends.json_schema.jsonschema_import import import_jsonschema
from structgen.frontends.json_schema.limits import MAX_INSTANCE_DEPTH, check_schema_depth, json_depth
from structgen.frontends.json_schema.patterns import schema_for_re_validators
from structgen.frontends.json_schema.source import decode_utf8, parse_json
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar_cache import compile_json_schema_cached
from structgen.json_types import JsonObject, JsonValue

if TYPE_CHECKING:  # pragma: no cover
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator
    from referencing import Registry

__all__ = [
    "Document",
    "InstanceError",
    "InstanceResult",
    "SchemaValidator",
    "check_references",
    "format_path",
    "format_pointer",
    "iter_documents",
    "jsonschema_validator",
    "reference_registry",
    "validate_stream",
]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Table budget (bytes) of the engine a :class:`SchemaValidator` checks instances with.
VALIDATE_TABLE_BYTES = 8 << 20
_MAX_REPR = 60


# ---------------------------------------------------------------------------------------------
# Locations
# ---------------------------------------------------------------------------------------------

def format_path(path: Iterable[str | int]) -> str:
    """A ``$``-rooted JSON path: ``$.items[3].price``; odd keys as ``$['a key']``.

    Integers are array indices. Keys that are identifiers use dot notation; any other key is
    quoted with single quotes, backslash and quote escaped.
    """
    out = ["$"]
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENT.match(part):
            out.append(f".{part}")
        else:
            escaped = part.replace("\\", "\\\\").replace("'", "\\'")
            out.append(f"['{escaped}']")
    return "".join(out)


def format_pointer(path: Iterable[str | int]) -> str:
    """The RFC 6901 JSON pointer of ``path`` (``""`` for the root)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _short(value: object) -> str:
    """A JSON rendering of ``value`` cut to a readable length."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Reading documents
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Document:
    """One instance read from input.

    line: 1-based line where the instance starts (for a parse failure: where it failed).
    value: the parsed value (meaningless when ``error`` is set).
    error: why the text is not a JSON instance, or None.
    text: the instance's source text when it spans several lines (used to give each
        validation error the line of the value it concerns), else None.
    """

    line: int
    value: JsonValue = None
    error: str | None = None
    text: str | None = None


def _line_document(raw: bytes, lineno: int, first: bool) -> Document:
    text, err = decode_utf8(raw, strip_bom=first)
    if err is not None or text is None:
        return Document(lineno, error=err)
    value, perr, _, col = parse_json(text)
    if perr is not None:
        return Document(lineno, error=f"invalid JSON: {perr} (column {col})")
    return Document(lineno, value)


def _is_container_line(raw: bytes) -> bool:
    s = raw.strip()
    if not s or s[:1] not in (b"{", b"["):
        return False
    text, err = decode_utf8(raw, strip_bom=False)
    return err is None and text is not None and parse_json(text)[1] is None


def iter_documents(stream: IO[bytes]) -> Iterator[Document]:
    """Instances in ``stream``, read lazily.

    * If the first non-blank line is a complete JSON value, the input is JSON Lines: every
      non-blank line is one instance, read and yielded one at a time (huge files stream).
    * Otherwise the whole input is read as one JSON document. If that fails and some other line
      is a complete JSON object or array, the input is taken as JSON Lines with a broken line;
      if not, one parse error is yielded at the line and column the parser stopped at.
    * Empty input yields one error (there is nothing to validate).

    ``NaN``/``Infinity`` are rejected (not JSON); a UTF-8 byte order mark is skipped.
    """
    lines = iter(stream)
    head: list[bytes] = []
    lineno = 0
    first_raw: bytes | None = None
    for raw in lines:
        lineno += 1
        head.append(raw)
        if raw.strip():
            first_raw = raw
            break
    if first_raw is None:
        yield Document(1, error="empty input: no JSON instance")
        return
    start = lineno
    doc = _line_document(first_raw, start, first=start == 1)
    if doc.error is None:
        yield doc
        for raw in lines:
            lineno += 1
            if raw.strip():
                yield _line_document(raw, lineno, first=False)
        return

    # Not a one-line value: one multi-line document, or JSON Lines whose first line is broken.
    head.extend(lines)
    data = b"".join(head)
    text, _ = decode_utf8(data, strip_bom=True)
    if text is not None:
        value, perr, eline, ecol = parse_json(text)
        if perr is None:
            yield Document(start, value, text=text)
            return
    if any(_is_container_line(raw) for raw in head[start:]):
        for i, raw in enumerate(head, start=1):
            if raw.strip():
                yield _line_document(raw, i, first=i == 1)
        return
    if text is None:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            yield Document(data.count(b"\n", 0, e.start) + 1, error=f"invalid UTF-8: {e.reason}")
        return
    yield Document(eline, error=f"invalid JSON: {perr} (column {ecol})")


# ---------------------------------------------------------------------------------------------
# Line numbers of values inside a multi-line document
# ---------------------------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null")


def _value_lines(text: str) -> dict[tuple[str | int, ...], int]:
    """Map each JSON path in ``text`` (already known to parse) to the 1-based line of its value.

    Duplicate keys keep the last occurrence, as :func:`json.loads` does. Returns an empty map
    for inputs nested too deeply for recursion.
    """
    newlines = [m.start() for m in re.finditer("\n", text)]
    out: dict[tuple[str | int, ...], int] = {}

    def line_of(pos: int) -> int:
        return bisect.bisect_left(newlines, pos) + 1

    def skip(pos: int) -> int:
        m = _WS.match(text, pos)
        assert m is not None
        return m.end()

    def value(pos: int, path: tuple[str | int, ...]) -> int:
        pos = skip(pos)
        out[path] = line_of(pos)
        ch = text[pos]
        if ch == '"':
            return int(json.decoder.scanstring(text, pos + 1)[1])  # type: ignore[attr-defined]
        if ch == "{":
            pos = skip(pos + 1)
            if text[pos] == "}":
                return pos + 1
            while True:
                pos = skip(pos)
                key, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
                pos = skip(pos) + 1  # ':'
                pos = skip(value(pos, (*path, key)))
                if text[pos] == "}":
                    return pos + 1
                pos += 1  # ','
        if ch == "[":
            pos = skip(pos + 1)
            if text[pos] == "]":
                return pos + 1
            i = 0
            while True:
                pos = skip(value(pos, (*path, i)))
                i += 1
                if text[pos] == "]":
                    return pos + 1
                pos += 1
        m = _SCALAR.match(text, pos)
        if m is None:  # pragma: no cover - text was parsed by json.loads before
            raise ValueError(f"unexpected character at offset {pos}")
        return m.end()

    try:
        value(0, ())
    except (RecursionError, ValueError, IndexError):
        return {}
    return out


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InstanceError:
    """One reason an instance is invalid.

    path: ``$``-rooted JSON path of the offending value (``$`` for parse errors).
    pointer: the same location as an RFC 6901 JSON pointer.
    message: what is wrong.
    keyword: the schema keyword that failed (``"json"`` for a parse error, ``"grammar"`` when
        only the compiled grammar rejects the instance).
    line: 1-based line in the input where the offending value starts.
    """

    path: str
    pointer: str
    message: str
    keyword: str
    line: int

    def as_dict(self) -> JsonObject:
        """The error as a JSON-ready dict (path, pointer, keyword, message, line)."""
        return {"path": self.path, "pointer": self.pointer, "keyword": self.keyword,
                "message": self.message, "line": self.line}


@dataclass
class InstanceResult:
    """Verdict on one instance.

    grammar: the compiled grammar's verdict on the canonical serialisation (None when the
        grammar check did not run: no compiled grammar, or the instance did not parse).
    notes: remarks that do not change validity (e.g. the grammar accepts an instance
        jsonschema rejects).
    """

    source: str
    line: int
    errors: list[InstanceError] = field(default_factory=list)
    grammar: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """True when no error was found."""
        return not self.errors

    def as_dict(self) -> JsonObject:
        """The verdict as a JSON-ready dict (the ``--json`` line of ``structgen validate``)."""
        return {"file": self.source, "line": self.line, "valid": self.valid,
                "errors": [e.as_dict() for e in self.errors], "grammar": self.grammar,
                "notes": list(self.notes)}


def _validator_class(schema: JsonValue) -> tuple[type[Validator], str | None]:
    """jsonschema validator class for ``schema``'s ``$schema`` (2020-12 default), and a note."""
    jsonschema = import_jsonschema()

    default = jsonschema.Draft202012Validator
    if not isinstance(schema, dict) or "$schema" not in schema:
        return default, None
    uri = schema["$schema"]
    if not isinstance(uri, str):
        raise SchemaError("$schema must be a string", pointer="/$schema", keyword="$schema")

    def norm(u: str) -> str:
        return u.rstrip("#").replace("https://", "").replace("http://", "")

    known = {}
    for cls in (jsonschema.Draft4Validator, jsonschema.Draft6Validator, jsonschema.Draft7Validator,
                jsonschema.Draft201909Validator, jsonschema.Draft202012Validator):
        meta = cls.META_SCHEMA
        known[norm(meta.get("$id") or meta.get("id"))] = cls
    cls = known.get(norm(uri))
    if cls is None:
        return default, f"unknown $schema {uri!r}: validating as JSON Schema draft 2020-12"
    return cls, None


# ---------------------------------------------------------------------------------------------
# References: only the schema itself and the remotes the caller hands over
# ---------------------------------------------------------------------------------------------

_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _metaschema_uris() -> frozenset[str]:
    """URIs of the JSON Schema metaschemas jsonschema ships (resolved from memory, no I/O)."""
    from jsonschema_specifications import REGISTRY

    return frozenset(uri.rstrip("#") for uri in REGISTRY)


def check_references(schema: JsonValue, remotes: Mapping[str, JsonValue] | None = None) -> None:
    """Raise :class:`~structgen.errors.SchemaError` for the first ``$ref`` / ``$dynamicRef``
    whose target lies outside ``schema``, ``remotes`` and the JSON Schema metaschemas.

    The error names the reference and the JSON pointer of the subschema holding it. Nothing is
    fetched or opened: this is how structgen keeps a schema from reaching the network or the
    file system (``http://``, ``file://``, relative URIs against a remote ``$id``...). Pure
    computation over ``schema``; iterative, so deep schemas cannot overflow the stack.
    """
    if not isinstance(schema, dict):
        return
    remote_uris = {urldefrag(u)[0] for u in (remotes or {})}
    # max_depth: this walk is iterative; nesting limits are the compiler's business
    doc = SchemaDoc(schema, max_depth=1 << 30)
    allowed = set(doc.resources) | remote_uris
    metaschemas: frozenset[str] | None = None
    # every indexed subschema, plus what in-document references reach outside the index
    # (e.g. "#/x/y" under a keyword that is not a schema keyword): jsonschema follows those too
    todo: list[Loc] = list(doc.bases)
    seen = set(todo)
    i = 0
    while i < len(todo):
        loc = todo[i]
        i += 1
        node = doc.node(loc)
        if not isinstance(node, dict):
            continue
        for kw in _REF_KEYWORDS:
            ref = node.get(kw)
            if not isinstance(ref, str):
                continue
            uri = urldefrag(join_uri(doc.base_of(loc), ref))[0]
            if uri in doc.resources:
                try:
                    target = doc.resolve(ref, loc, kw)
                except SchemaError:  # a dangling in-document pointer: jsonschema reports it
                    continue
                stack = [target]
                while stack:
                    t = stack.pop()
                    if t in seen:
                        continue
                    seen.add(t)
                    todo.append(t)
                    sub = doc.node(t)
                    if isinstance(sub, dict):
                        stack.extend(Loc(t.doc, p) for _, p in subschemas(sub, t.ptr))
                continue
            if uri in allowed:
                continue
            if metaschemas is None:
                metaschemas = _metaschema_uris()
            if uri.rstrip("#") in metaschemas:
                continue
            target_note = "" if uri == urldefrag(ref)[0] else f" (resolved: {uri!r})"
            raise SchemaError(f"{kw} {ref!r}{target_note} refers outside this schema; structgen never "
                              "fetches remote or file references (pass that document in "
                              "remotes= to allow it)", pointer=doc.pointer(loc), keyword=kw)


def reference_registry(remotes: Mapping[str, JsonValue] | None = None) -> Registry[JsonValue]:
    """A :class:`referencing.Registry` holding exactly ``remotes`` (URI -> schema document).

    Its retriever refuses every other URI without any network or file access, replacing
    jsonschema's default one (``urlopen`` with no timeout, which also reads ``file://``).
    """
    from referencing import Registry, Resource
    from referencing.exceptions import NoSuchResource
    from referencing.jsonschema import DRAFT202012

    def refuse(uri: str) -> NoReturn:
        raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs class mypy cannot see

    registry: Registry[JsonValue] = Registry(retrieve=refuse)  # type: ignore[call-arg]
    for uri, document in (remotes or {}).items():
        resource = Resource.from_contents(document, default_specification=DRAFT202012)
        registry = registry.with_resource(uri, resource)
    return registry


def jsonschema_validator(schema: JsonValue, cls: type[Validator] | None = None, *,
                         remotes: Mapping[str, JsonValue] | None = None,
                         format_checker: object = None) -> Validator:
    """A jsonschema validator for ``schema`` that cannot reach outside ``schema`` and ``remotes``.

    ``cls`` defaults to the class for ``schema``'s ``$schema`` (Draft 2020-12 when absent).
    Raises :class:`~structgen.errors.SchemaError` (see :func:`check_references`) for a reference
    to anything else. Every jsonschema validator structgen builds comes from here.
    """
    if cls is None:
        cls = _validator_class(schema)[0]
    check_references(schema, remotes)
    return cls(schema, registry=reference_registry(remotes), format_checker=format_checker)


class SchemaValidator:
    """Validates instances against one schema (jsonschema + compiled grammar).

    Construction checks the schema against its metaschema and raises
    :class:`~structgen.errors.SchemaError` (with the JSON pointer of the bad keyword) when it is
    malformed, or when a ``$ref`` points outside the schema and ``remotes`` (a mapping of
    absolute URIs to schema documents the caller hands over): nothing is ever fetched from the
    network or read from a file. With ``use_grammar`` the schema is also compiled, once; compile
    failures become entries of :attr:`notes` and turn the grammar check off. With
    ``grammar_cache`` the compiled grammar comes from (and goes to) the disk cache of
    :mod:`structgen.grammar_cache` (the command line's choice).
    """

    def __init__(self, schema: JsonValue, *, use_grammar: bool = True,
                 remotes: Mapping[str, JsonValue] | None = None, grammar_cache: bool = False) -> None:
        jsonschema = import_jsonschema()

        if not isinstance(schema, (dict, bool)):
            raise SchemaError(f"a JSON Schema is an object or a boolean, not {type(schema).__name__}")
        self.schema: JsonObject | bool = schema
        self.remotes = dict(remotes or {})
        self.notes: list[str] = []
        check_schema_depth(schema)  # before any recursive code (jsonschema's) sees it
        cls, note = _validator_class(schema)
        if note:
            self.notes.append(note)
        # jsonschema reads patterns with Python's re; JSON Schema's (and the grammar's) dialect
        # is ECMA-262: jsonschema gets each pattern translated, messages show the original
        self._renamed: dict[str, str] = {}
        re_schema = schema_for_re_validators(schema, renamed=self._renamed)
        re_remotes = {uri: schema_for_re_validators(doc, renamed=self._renamed)
                      for uri, doc in self.remotes.items()}
        try:
            cls.check_schema(re_schema)
        except RecursionError:
            # jsonschema checks a schema against its metaschema recursively, several frames
            # per level: a schema nested about a hundred subschemas deep exhausts the stack
            raise CompileLimitError("schema nested too deeply for jsonschema's validator to check it",
                                    pointer="#") from None
        except jsonschema.exceptions.SchemaError as e:
            pointer = format_pointer(e.absolute_path)
            raise SchemaError(f"not a valid JSON Schema: {_one_line(e.message)}", pointer=pointer,
                              keyword=str(e.validator)) from None
        self._validator = jsonschema_validator(re_schema, cls, remotes=re_remotes,
                                               format_checker=cls.FORMAT_CHECKER)
        self._grammar: CompiledGrammar | None = None
        self._canonical: Callable[[JsonValue, JsonObject | bool], str] | None = None
        self._grammar_cache = grammar_cache
        if use_grammar:
            self._compile()

    @property
    def grammar_available(self) -> bool:
        """Whether the compiled-grammar check runs."""
        return self._grammar is not None

    def _compile(self) -> None:
        try:  # imported here: a missing compiler (or a test's stand-in) turns the check off
            from structgen.frontends.json_schema.compiler import canonical_json, compile_json_schema
        except ImportError as e:
            self.notes.append(f"grammar check unavailable (structgen.frontends.json_schema.compiler: {e}); "
                              "only jsonschema's verdict counts")
            return
        try:
            if self._grammar_cache:
                self._grammar = compile_json_schema_cached(self.schema, remotes=self.remotes,
                                                           for_generation=False)
            else:
                self._grammar = compile_json_schema(self.schema, for_generation=False,
                                                    remotes=self.remotes or None)
        except UnsupportedFeatureError as e:
            self.notes.append(f"grammar check off: the schema uses a feature structgen cannot "
                              f"compile exactly ({_one_line(str(e))}); only jsonschema's verdict counts")
            return
        except StructgenError as e:
            self.notes.append(f"grammar check off: compiling the schema failed "
                              f"({type(e).__name__}: {_one_line(str(e))}); only jsonschema's verdict counts")
            return
        except Exception as e:  # a structgen bug: say so, but keep validating with jsonschema
            self.notes.append(f"grammar check off: internal error compiling the schema "
                              f"({type(e).__name__}: {_one_line(str(e))}); please report it")
            return
        self._canonical = canonical_json
        if self.remotes:
            remotes = self.remotes
            self._canonical = lambda instance, schema: canonical_json(instance, schema, remotes=remotes)
        # one instance at a time, possibly huge: a small table budget keeps validation's
        # memory flat (flushing costs time, never exactness; see structgen.grammar.runtime)
        eng = getattr(self._grammar, "engine", None)
        if eng is not None and hasattr(eng, "table_budget"):
            eng.table_budget = min(eng.table_budget, VALIDATE_TABLE_BYTES)

    def validate(self, doc: Document, source: str) -> InstanceResult:
        """Check one document read by :func:`iter_documents`.

        Raises :class:`~structgen.errors.SchemaError` when validation needs a ``$ref`` that
        cannot be resolved (a schema problem, not an instance problem).
        """
        result = InstanceResult(source, doc.line)
        if doc.error is not None:
            result.errors.append(InstanceError("$", "", doc.error, "json", doc.line))
            return result
        instance = doc.value
        depth, ptr = json_depth(instance, MAX_INSTANCE_DEPTH)
        if depth > MAX_INSTANCE_DEPTH:
            # jsonschema and the serialiser recurse per level: an instance this deep cannot be
            # checked, so it is not valid
            result.errors.append(InstanceError(
                "$", "", f"instance nested too deeply to check: deeper than {MAX_INSTANCE_DEPTH} "
                f"levels at {ptr if len(ptr) <= 80 else ptr[:77] + '...'} "
                "(structgen.frontends.json_schema.limits.MAX_INSTANCE_DEPTH)", "depth", doc.line))
            return result
        result.errors.extend(self._semantic_errors(instance, doc))
        if self._grammar is not None:
            result.grammar = self._grammar_verdict(instance, result)
            if result.grammar is False and result.valid:
                result.errors.append(InstanceError(
                    "$", "", "rejected by the compiled grammar although jsonschema finds no error "
                    "(a format jsonschema cannot check here, or a structgen grammar gap)",
                    "grammar", doc.line))
            elif result.grammar is True and not result.valid:
                result.notes.append("the compiled grammar accepts this instance although jsonschema "
                                    "rejects it (the grammar over-approximates the schema)")
        return result

    def _semantic_errors(self, instance: JsonValue, doc: Document) -> list[InstanceError]:
        from jsonschema.exceptions import best_match
        from referencing.exceptions import Unresolvable

        try:
            raw = list(self._validator.iter_errors(instance))
        except Unresolvable as e:
            raise SchemaError(f"cannot resolve $ref: {_one_line(str(e))}", keyword="$ref") from None
        except RecursionError:
            return [InstanceError("$", "", "instance (or schema recursion) nested too deeply to validate",
                                  "depth", doc.line)]
        lines = _value_lines(doc.text) if raw and doc.text is not None else {}
        out = []
        for err in raw:
            path = list(err.absolute_path)
            message = _message(err, self._renamed)
            if err.validator in ("anyOf", "oneOf") and err.context:
                best = best_match(err.context)
                message += f" (closest: {format_path(best.absolute_path)}: {_message(best, self._renamed)})"
            out.append(InstanceError(format_path(path), format_pointer(path), message,
                                     str(err.validator), lines.get(tuple(path), doc.line)))
        return out

    def _grammar_verdict(self, instance: JsonValue, result: InstanceResult) -> bool | None:
        grammar, canonical = self._grammar, self._canonical
        if grammar is None or canonical is None:  # (only called with a compiled grammar)
            return None
        try:
            text = canonical(instance, self.schema)
            return bool(grammar.accepts(text))
        except Exception as e:  # never let the secondary check crash validation
            result.notes.append(f"grammar check failed on this instance ({type(e).__name__}: "
                                f"{_one_line(str(e))})")
            return None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _message(err: ValidationError, renamed: Mapping[str, str]) -> str:
    """jsonschema's message with its leading Python repr of the instance shortened to JSON and
    translated patterns (``renamed``: translation -> original) shown as the schema spells them."""
    msg = str(err.message)
    rep = repr(err.instance)
    if msg.startswith(rep):
        msg = _short(err.instance) + msg[len(rep):]
    for translated, original in renamed.items():
        msg = msg.replace(repr(translated), repr(original))
    return _one_line(msg)


def validate_stream(validator: SchemaValidator, stream: IO[bytes], source: str) -> Iterator[InstanceResult]:
    """Validate every instance of ``stream`` lazily (see :func:`iter_documents`)."""
    for doc in iter_documents(stream):
        yield validator.validate(doc, source)

