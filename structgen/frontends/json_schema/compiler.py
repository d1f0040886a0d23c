"""JSON Schema (Draft 2020-12, draft-07 spellings accepted) and Pydantic models -> grammar.

The grammar accepts exactly the JSON texts that serialise a valid value the way
:func:`canonical_json` does (compact separators, or bounded whitespace between tokens in
the ``flexible`` mode), where string values and undeclared keys may use any JSON escape
form (declared property names: their canonical spelling only). "Valid" means what
``jsonschema.Draft202012Validator`` says (with its format checker when
``formats="enforce"``). Whatever cannot be enforced exactly raises
:class:`~structgen.errors.UnsupportedFeatureError` naming the keyword and its JSON pointer
(or, with ``lenient=True``, is dropped and recorded as a warning), so the grammar never
accepts an invalid value.

How it works (bottom to top):

* :mod:`structgen.frontends.json_schema.source` reads schema files and model classes;
* :mod:`structgen.frontends.json_schema.document` loads and indexes the schema, resolves ``$ref`` and
  defines the canonical key order;
* :mod:`structgen.frontends.json_schema.algebra` normalises every schema location into a
  per-JSON-type language with exact intersection, union and complement, which is what
  makes ``allOf``/``anyOf``/``oneOf``/``not``/``if``-``then``-``else``,
  ``dependentSchemas`` and ``unevaluated*`` exact; its string and number formulas live in
  :mod:`~structgen.frontends.json_schema.formulas`, its nodes and records in
  :mod:`~structgen.frontends.json_schema.records`;
* :mod:`structgen.frontends.json_schema.lower` lowers that to IR rules (one per schema node and
  key-order context; recursive schemas give recursive rules), with ``pattern`` languages from
  :mod:`~structgen.frontends.json_schema.patterns`, formats from
  :mod:`~structgen.frontends.json_schema.formats` and numbers from
  :mod:`~structgen.frontends.json_schema.numbers`;
* when compiling fails, :mod:`structgen.frontends.json_schema.diagnostics` names the subschema and
  keyword (with :mod:`~structgen.frontends.json_schema.keywords`);
* with ``strict`` (generation's default), :mod:`structgen.frontends.json_schema.strict` closes the
  language the lowering gets at each instance position to the declared keys and prefix items.

Known limits (each raises ``UnsupportedFeatureError`` rather than over-accepting):
``uniqueItems`` is exact only when items come from a small finite set of scalars (or at
most one item is allowed); ``$recursiveRef``; patterns that are not ECMA-262 (the dialect
JSON Schema names; ``regex_dialect="python"`` reads them with Python's ``re``) or that use
constructs the regex compiler cannot express (lookaround, backreferences); formats without a
grammar; very large combinations of applicators. Additional (undeclared) object keys are not
checked for duplicates.
Numbers: bounds are exact; ``multipleOf`` uses exact decimal arithmetic; under ``not``
only integer literals and plain decimals with at most 15 digits are generated.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from structgen import limits
from structgen.config import CompileOptions, JsonSchemaOptions
from structgen.errors import (
    CompileLimitError,
    CompileTimeoutError,
    ConfigError,
    GrammarError,
    SchemaError,
    UnsupportedFeatureError,
)
from structgen.frontends.json_schema import formats
from structgen.frontends.json_schema.algebra import Normalizer
from structgen.frontends.json_schema.diagnostics import explain_unsat, locate_automaton_error, rule_sources
from structgen.frontends.json_schema.document import Loc, SchemaDoc, _draft_of, parse_schema_text
from structgen.frontends.json_schema.jsonschema_import import import_jsonschema
from structgen.frontends.json_schema.keywords import structural_keyword
from structgen.frontends.json_schema.limits import check_schema_depth
from structgen.frontends.json_schema.lower import Lowering
from structgen.frontends.json_schema.patterns import Pattern, pattern_error
from structgen.frontends.json_schema.source import is_model_class, model_schema
from structgen.frontends.json_schema.type_keywords import DRAFT_FORMATS
from structgen.grammar import ir
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.compiler import compile_grammar
from structgen.grammar.gcpause import gc_paused
from structgen.json_types import JsonValue

if TYPE_CHECKING:  # pragma: no cover
    from jsonschema import FormatChecker

__all__ = ["schema_to_grammar", "compile_json_schema", "canonical_json", "format_checker_for",
           "schema_warnings", "SPEC_FORMATS"]

SPEC_FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
    "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
    "json-pointer", "relative-json-pointer", "regex",
})
"""Formats defined by the specification: enforced via :mod:`structgen.frontends.json_schema.formats` when
``formats="enforce"``, or rejected as unsupported when it has no grammar for one.
Other format names are annotations (the validator ignores them too)."""


def _coerce(schema: object) -> JsonValue:
    """``schema`` as a JSON value, nested no deeper than
    :data:`structgen.frontends.json_schema.limits.MAX_JSON_DEPTH`
    (checked iteratively before any recursive code sees it)."""
    out = _coerce_value(schema)
    check_schema_depth(out)
    return out


def _coerce_value(schema: object) -> JsonValue:
    """``schema`` as a JSON value: dicts and booleans as they are, ``str`` parsed as JSON text,
    a model class (duck-typed: a class with ``model_json_schema()``, as Pydantic v2 models have;
    the front-ends never import pydantic) converted by that method."""
    if isinstance(schema, (dict, bool)):
        return schema
    if isinstance(schema, str):
        return parse_schema_text(schema)
    if isinstance(schema, type) and is_model_class(schema):
        return model_schema(schema)
    raise SchemaError(f"a JSON schema must be a dict, a bool, JSON text or a pydantic model class, "
                      f"not {type(schema).__name__}")


def _format_support(name: str) -> bool | None:
    """True: enforceable; False: a spec format without a grammar; None: annotation only."""
    if formats.format_expr(name) is not None:
        return True
    return False if name in SPEC_FORMATS else None


_UNSAT = "schema is unsatisfiable: no JSON value is valid"


def _build(schema: object, options: JsonSchemaOptions, remotes: Mapping[str, JsonValue] | None,
           deadline: float | None = None) -> tuple[ir.Grammar, list[str], Lowering]:
    schema = _coerce(schema)
    try:
        doc = SchemaDoc(schema, remotes=remotes, max_depth=options.max_depth)
    except CompileLimitError as e:
        _locate_limit_error(e, None)
        raise
    norm = Normalizer(doc, formats=options.formats, lenient=options.lenient, max_enum=options.max_enum,
                      format_supported=_format_support, pattern_check=pattern_error,
                      annotations=bool(options.strict))
    low = Lowering(norm, doc, options, deadline=deadline)
    root = Loc(0, "")
    try:
        grammar = low.build(norm.ref_node(root), (root,))
    except SchemaError as e:
        if e.message == _UNSAT and e.pointer == "#" and e.keyword is None:
            raise _unsat_error(low) from None
        raise
    except CompileLimitError as e:
        _locate_limit_error(e, low)
        raise
    return grammar, list(dict.fromkeys(norm.warnings)), low


def _build_guarded(schema: object, options: JsonSchemaOptions, remotes: Mapping[str, JsonValue] | None,
                   deadline: float | None = None) -> tuple[ir.Grammar, list[str], Lowering]:
    """:func:`_build`, with a stack overflow in the lowering (nesting that the documented
    limits -- ``max_depth``, :data:`~structgen.frontends.json_schema.limits.MAX_JSON_DEPTH`,
    :data:`~structgen.frontends.json_schema.algebra.MAX_INPLACE_DEPTH` -- allow one by one but not
    together) reported as a :class:`CompileLimitError`, never a ``RecursionError``."""
    try:
        return _build(schema, options, remotes, deadline)
    except RecursionError:
        raise CompileLimitError("schema nested too deeply to compile (nested subschemas and "
                                "in-place applicators together)", pointer="#") from None


def _unsat_error(low: Lowering) -> SchemaError:
    """The unsatisfiable-schema error, naming the subschema and keyword responsible
    (found within a small time budget of its own; the root otherwise)."""
    got = explain_unsat(low.doc, low.norm)
    if got is None:
        return SchemaError(_UNSAT, pointer="#", keyword=structural_keyword(low.doc, "#"))
    ptr, kw = got
    why = f" because of keyword {kw!r}" if kw else ""
    if ptr == "#":
        msg = f"{_UNSAT} (the schema accepts nothing{why})"
    else:
        msg = f"{_UNSAT} (the subschema at {ptr}, which every value must satisfy, accepts nothing{why})"
    return SchemaError(msg, pointer=ptr, keyword=kw)


def schema_to_grammar(schema: object, options: JsonSchemaOptions | None = None, *,
                      remotes: Mapping[str, JsonValue] | None = None) -> ir.Grammar:
    """Lower a JSON schema (dict, bool, JSON text, or pydantic model class) to IR.

    ``remotes`` maps absolute URIs to schema documents that ``$ref`` may use; other
    remote references raise :class:`~structgen.errors.SchemaError`. Raises SchemaError
    (malformed schema, unknown ``$ref``, invalid JSON text with line/column, a root that
    accepts nothing), UnsupportedFeatureError, or CompileLimitError (deeper than
    ``max_depth``, enum larger than ``max_enum``, too many automaton states).
    """
    return _build_guarded(schema, options or JsonSchemaOptions(), remotes)[0]


_CACHE: OrderedDict[str, tuple[CompiledGrammar, list[str]]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 128
_WARNINGS: dict[int, list[str]] = {}


def compile_json_schema(schema: object, *, options: JsonSchemaOptions | None = None,
                        compile_options: CompileOptions | None = None,
                        remotes: Mapping[str, JsonValue] | None = None, for_generation: bool = True,
                        **option_overrides: Any) -> CompiledGrammar:
    """Compile a JSON schema to a :class:`~structgen.grammar.compiled.CompiledGrammar`.

    The language is generation's by default (``for_generation``): strings in their canonical
    spelling, objects closed to their declared properties, numbers bounded to what JSON
    parsers read exactly (:meth:`~structgen.config.JsonSchemaOptions.for_generation`), so that
    a decoding loop driving a :class:`~structgen.Matcher` gets what ``generate`` gets. With
    ``for_generation=False`` the grammar accepts every valid document in every JSON spelling
    (validation's language: :meth:`~structgen.config.JsonSchemaOptions.for_validation`, what
    ``structgen validate`` uses). Options set explicitly win over either default.

    ``option_overrides`` replace fields of ``options`` (e.g. ``whitespace="flexible"``).
    Results are cached by content (canonical JSON of the schema, the options and the
    compile options) in a bounded, thread-safe LRU. The returned grammar's ``metadata``
    holds ``"warnings"`` (lenient mode) and ``"schema"``; both are also set as attributes
    when the object allows it. Grammars are shared by content, so two schemas with the
    same grammar share one object (and its metadata).
    """
    options = options or JsonSchemaOptions()
    if option_overrides:
        try:
            options = dataclasses.replace(options, **option_overrides)
        except TypeError as e:
            raise ConfigError(f"unknown JSON schema option: {e}") from None
    options = options.for_generation() if for_generation else options.for_validation()
    schema = _coerce(schema)
    copts = compile_options or CompileOptions()
    try:
        # not sort_keys: key order is part of the schema's meaning here (declared
        # properties are matched in schema order), so reordered schemas must not share
        key = json.dumps([schema, repr(options), repr(copts),
                          sorted((remotes or {}).items()) if remotes else None],
                         ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise SchemaError(f"schema is not JSON-serialisable: {e}") from None
    except RecursionError:  # MAX_JSON_DEPTH was checked; a deep caller stack can still overflow
        raise CompileLimitError("schema nested too deeply to serialise", pointer="#") from None
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit[0]
    # lowering and automaton share the budget (and the request's, inside a limits.scope)
    deadline = limits.deadline_within(limits.now() + copts.timeout_s)
    try:
        cg, warnings = _compile(schema, options, copts, remotes, deadline)
    except (SchemaError, UnsupportedFeatureError, CompileLimitError) as e:
        unsat = isinstance(e, SchemaError) and e.message.startswith(_UNSAT)
        too_hard = isinstance(e, (UnsupportedFeatureError, CompileLimitError)) and \
            not isinstance(e, CompileTimeoutError)  # no time left to try again
        if not (options.strict and (unsat or too_hard)):
            raise
        # strict mode never turns a satisfiable schema into an unsatisfiable one (its per-object
        # checks are conservative, and this catches what they miss), nor a schema that compiles
        # into one that does not; when the open schema fails too, its error stands
        cg, warnings = _compile(schema, dataclasses.replace(options, strict=False), copts, remotes,
                                deadline)
        why = "would leave no valid value" if unsat else f"does not compile ({type(e).__name__}: {e})"
        warnings.append(f"strict: the schema is compiled open: closing its objects and arrays {why}")
    meta = getattr(cg, "metadata", None)
    if isinstance(meta, dict):
        meta["warnings"] = warnings
        meta["schema"] = schema
    for attr, value in (("warnings", warnings), ("schema", schema)):
        try:
            setattr(cg, attr, value)
        except AttributeError:
            pass
    with _CACHE_LOCK:
        _WARNINGS[id(cg)] = warnings
        _CACHE[key] = (cg, warnings)
        while len(_CACHE) > _CACHE_SIZE:
            old, _w = _CACHE.popitem(last=False)[1]
            _WARNINGS.pop(id(old), None)
    return cg


def _compile(schema: JsonValue, options: JsonSchemaOptions, copts: CompileOptions,
             remotes: Mapping[str, JsonValue] | None, deadline: float | None
             ) -> tuple[CompiledGrammar, list[str]]:
    """The compiled grammar of a coerced schema, and the warnings of its lowering."""
    with gc_paused():
        grammar, warnings, low = _build_guarded(schema, options, remotes, deadline)
    try:
        cg = compile_grammar(grammar, copts, deadline=deadline)
    except GrammarError as e:
        if "accepts no string" in str(e):
            raise _unsat_error(low) from None
        raise
    except CompileLimitError as e:
        _locate_limit_error(e, low, grammar)
        raise
    # where each compiled rule comes from, for the errors of the token-budget check: worked
    # out when first asked for (a walk of the grammar that compiling itself does not need)
    where, rule_kw, expr_kw, doc = low.rule_where, low.rule_kw, low.expr_kw, low.doc
    dialect = options.regex_dialect
    cg.set_rule_sources(lambda g: rule_sources(g, grammar, where, rule_kw, expr_kw, doc,
                                               regex_dialect=dialect))
    return cg, warnings


_RULE_IN_MESSAGE = re.compile(r"rule '([^']+)'")


def _locate_limit_error(e: CompileLimitError, low: Lowering | None,
                        grammar: ir.Grammar | None = None) -> None:
    """Give a size or time limit error its schema location and keyword.

    The automaton only knows IR rules (``'s25'``) and the intersections it was building;
    the lowering knows which schema location each rule came from and which keyword each
    expression was made for. Sets ``e.pointer`` and ``e.keyword`` and appends them to the
    message (in place, so the exception type and traceback stay).
    """
    doc = low.doc if low is not None else None
    ptr, kw = e.pointer, e.keyword
    if low is not None and grammar is not None and not ptr:
        rule = e.rule
        if rule is None:
            m = _RULE_IN_MESSAGE.search(str(e))
            rule = e.rule = m.group(1) if m else None
        ptr, kw = locate_automaton_error(e, doc, grammar.rules, low.rule_where, low.rule_kw, low.expr_kw)
    if not ptr and low is not None:
        ptr = "#"
    if ptr and not kw:
        kw = structural_keyword(doc, ptr)
    if not (e.args and isinstance(e.args[0], str)):
        e.pointer, e.keyword = ptr, kw
        return
    text = e.args[0]
    add = []
    if ptr and not re.search(re.escape(ptr) + r"(?![\w/~%.-])", text):
        add.append(f"schema location {ptr}")
    if kw and repr(kw) not in text:
        add.append(f"keyword {kw!r}")
    if add:
        e.args = (f"{text} ({', '.join(add)})",) + e.args[1:]
    e.pointer, e.keyword = ptr, kw


def format_checker_for(schema: object) -> FormatChecker:
    """A ``jsonschema`` format checker that checks formats the way compiled grammars enforce
    them: the 2020-12 definitions, restricted to the format names the schema's own draft
    defines (a name its draft does not define is an annotation there). For oracles."""
    fc = copy.copy(import_jsonschema().Draft202012Validator.FORMAT_CHECKER)
    known = DRAFT_FORMATS.get(_draft_of(schema, "2020-12"))
    if known is not None:
        fc.checkers = {k: v for k, v in fc.checkers.items() if k in known}
    return fc


def schema_warnings(cg: object) -> list[str]:
    """Warnings recorded for a grammar made by :func:`compile_json_schema` (lenient mode)."""
    meta = getattr(cg, "metadata", None)
    if isinstance(meta, dict) and "warnings" in meta:
        return list(meta["warnings"])
    return list(_WARNINGS.get(id(cg), []))


_DOC_CACHE: OrderedDict[str, SchemaDoc] = OrderedDict()


def _doc_for(schema: JsonValue, remotes: Mapping[str, JsonValue] | None = None) -> SchemaDoc:
    # key order matters (it is the canonical property order): no sort_keys
    key = json.dumps([schema, sorted(remotes.items()) if remotes else None])
    with _CACHE_LOCK:
        doc = _DOC_CACHE.get(key)
        if doc is not None:
            _DOC_CACHE.move_to_end(key)
            return doc
    doc = SchemaDoc(schema, remotes=remotes, max_depth=10_000)
    with _CACHE_LOCK:
        _DOC_CACHE[key] = doc
        while len(_DOC_CACHE) > 64:
            _DOC_CACHE.popitem(last=False)
    return doc


def canonical_json(instance: object, schema: object, *,
                   remotes: Mapping[str, JsonValue] | None = None) -> str:
    """Serialise ``instance`` the way structgen's grammar for ``schema`` expects it.

    Compact separators, ``ensure_ascii=False``; object keys declared at that position
    (``properties`` of the schemas that apply there, through ``$ref``/``allOf``/``anyOf``/
    ``oneOf``/``not``/``if``/``then``/``else``/``dependentSchemas``, in document order, then
    their ``required`` names) come first in that order, then the remaining keys in
    instance order. ``remotes`` as for :func:`schema_to_grammar`. Raises ValueError for
    values JSON cannot represent (NaN, infinity).
    """
    doc = _doc_for(_coerce(schema), remotes)
    out: list[str] = []

    def emit(v: object, ctx: tuple[Loc, ...]) -> None:
        if isinstance(v, dict):
            declared = doc.declared_names(ctx) if ctx else []
            dset = set(declared)
            keys = [k for k in declared if k in v] + [k for k in v if k not in dset]
            out.append("{")
            for i, k in enumerate(keys):
                if not isinstance(k, str):
                    raise ValueError(f"object keys must be strings, not {type(k).__name__}")
                if i:
                    out.append(",")
                out.append(_dump_str(k))
                out.append(":")
                emit(v[k], _child(doc, ctx, k))
            out.append("}")
        elif isinstance(v, (list, tuple)):
            out.append("[")
            for i, x in enumerate(v):
                if i:
                    out.append(",")
                emit(x, doc.item_ctx(ctx, i) if ctx else ())
            out.append("]")
        elif isinstance(v, str):
            out.append(_dump_str(v))
        else:
            out.append(json.dumps(v, ensure_ascii=False, allow_nan=False))

    emit(instance, (Loc(0, ""),))
    return "".join(out)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _dump_str(s: str) -> str:
    # lone surrogates cannot be UTF-8 encoded: those strings are written with \u escapes
    return json.dumps(s, ensure_ascii=bool(_SURROGATE.search(s)))


def _child(doc: SchemaDoc, ctx: tuple[Loc, ...], key: str) -> tuple[Loc, ...]:
    if not ctx:
        return ()
    if key in doc.declared_names(ctx):
        return doc.child_ctx(ctx, key, None)
    matches = {p: Pattern(p).search(key) for p in doc.ctx_patterns(ctx)}
    return doc.child_ctx(ctx, None, matches)
