"""The one front door: any constraint -> :class:`~structgen.grammar.compiled.CompiledGrammar`.

Every caller that turns a user's constraint into a grammar -- :func:`structgen.generation.api.resolve_grammar`
(and so :func:`structgen.generate`), :mod:`structgen.integrations`, the CLI and the benchmark
suite -- calls :func:`compile_constraint` here, so the same constraint gives the same grammar
(the same :attr:`CompiledGrammar.key`) whichever way it came in.

Kinds (:data:`CONSTRAINT_KINDS`, vLLM's request-type names in lower case):

* ``"json"``: a JSON Schema -- a ``dict`` or ``bool``, JSON text, a file, or a model class (a
  Pydantic model; see :func:`schema_from`);
* ``"json_object"``: any JSON object (the spec is ignored);
* ``"regex"``: a Python-syntax regular expression, matched in full;
* ``"grammar"`` (alias ``"lark"``): Lark grammar text, or a Lark file given as a path;
* ``"choice"``: a list of strings (or its JSON text); the output is exactly one of them (raw
  text, not JSON-quoted).

Paths and text are told apart by type, never by the first character:

* an ``os.PathLike`` (``pathlib.Path``) is always a file, read as UTF-8;
* a ``str`` is text. For schemas, the Python API also lets a ``str`` that is *not* JSON text
  name a file (``strings_may_be_paths=True``: what :func:`structgen.generate` does, so
  ``generate(schema="person.schema.json")`` keeps working); a ``str`` that parses as a JSON
  object or boolean is always the schema itself. So a file named ``true_schema.json``,
  ``fields.json``, ``false.json`` or ``{x}.json`` is a path, and the string ``"true"`` is the
  boolean schema (pass ``pathlib.Path("true")`` for a file of that name).
* strings that come from the network (a serving integration's request) must never become
  file reads: :func:`compile_constraint` defaults to ``strings_may_be_paths=False``, where a
  ``str`` schema is JSON text or a :class:`~structgen.errors.SchemaError`.

Model classes are recognised by duck typing (a class with ``model_json_schema()``): the
front-ends never import pydantic.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from structgen.errors import ConfigError, GrammarError, SchemaError
from structgen.frontends.json_schema.source import (
    is_model_class,
    model_schema,
    parse_json,
    read_schema_file,
    read_utf8_file,
)

if TYPE_CHECKING:  # pragma: no cover
    from structgen.config import CompileOptions, JsonSchemaOptions
    from structgen.grammar.compiled import CompiledGrammar

__all__ = ["CONSTRAINT_KINDS", "compile_constraint", "constraint_kind", "is_model_class",
           "read_grammar_file", "read_schema_file", "schema_from"]

#: constraint kinds :func:`compile_constraint` understands (vLLM's request types, lower case),
#: with ``"lark"`` an alias of ``"grammar"``
CONSTRAINT_KINDS = ("json", "json_object", "regex", "grammar", "lark", "choice")


def constraint_kind(kind: Any) -> str:
    """The canonical name of constraint kind ``kind``: case-insensitive, surrounding spaces
    ignored, an enum member by its ``name``, ``"lark"`` as ``"grammar"``. Raises
    :class:`~structgen.errors.ConfigError` (key ``request_type``) for anything else."""
    name = getattr(kind, "name", kind)  # enum members by name
    if not isinstance(name, str):
        raise ConfigError(f"request_type must be a string or an enum member, got "
                          f"{type(kind).__name__}", key="request_type")
    canonical = name.strip().lower()
    if canonical not in CONSTRAINT_KINDS:
        raise ConfigError(f"unknown request_type {name!r}; expected one of "
                          f"{', '.join(CONSTRAINT_KINDS)}", key="request_type")
    return "grammar" if canonical == "lark" else canonical


def _is_file(text: str) -> bool:
    try:
        return os.path.isfile(text)
    except (OSError, ValueError):  # a name too long for the OS, an embedded NUL
        return False


def schema_from(spec: Any, *, strings_may_be_paths: bool = True) -> Any:
    """The schema value ``spec`` stands for (see the module docstring for the rules).

    ``dict``/``bool``: returned as is; a model class: its ``model_json_schema()``; an
    ``os.PathLike``: the file's JSON; ``bytes``: UTF-8 JSON text; a ``str``: JSON text when,
    stripped of whitespace, it parses as a JSON object or boolean, otherwise (only when
    ``strings_may_be_paths``) the path of an existing file.

    Side effect: reads the file when ``spec`` is a path; nothing else is opened. Raises
    :class:`~structgen.errors.SchemaError` for JSON text that is not an object or a boolean, a
    string that is neither JSON text nor an existing file, an unreadable file, and a model
    class that cannot describe itself.
    """
    if isinstance(spec, (dict, bool)):
        return spec
    if is_model_class(spec):
        return model_schema(spec)
    if isinstance(spec, os.PathLike):
        return read_schema_file(spec)
    if isinstance(spec, bytes):
        try:
            spec = spec.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SchemaError(f"schema bytes are not UTF-8 (byte {e.start})") from None
    if not isinstance(spec, str):
        raise SchemaError(f"a JSON schema must be a dict, a bool, JSON text, a file path or a "
                          f"pydantic model class, not {type(spec).__name__}")
    value, error, line, column = parse_json(spec.strip())
    if error is None and isinstance(value, (dict, bool)):
        return value
    if error is None:
        why = f"it is JSON but a {type(value).__name__ if value is not None else 'null'}, " \
              "not an object or a boolean"
    elif line and column:
        why = f"{error} (line {line}, column {column})"
    else:
        why = error
    short = spec if len(spec) <= 80 else spec[:77] + "..."
    if not strings_may_be_paths:
        raise SchemaError(f"schema text {short!r} is not a JSON Schema: {why} (a string schema here "
                          "is JSON text; pass a pathlib.Path to read a file)")
    if _is_file(spec):
        return read_schema_file(spec)
    raise SchemaError(f"schema {short!r} is neither JSON Schema text ({why}) nor an existing file")


def read_grammar_file(path: str | os.PathLike[str]) -> str:
    """The text of the Lark grammar file at ``path``. Side effect: reads that one file.
    Raises :class:`~structgen.errors.GrammarError` (one line, naming the file) when it cannot
    be read or is not UTF-8."""
    return read_utf8_file(path, GrammarError)


def _choices(spec: Any) -> list[str]:
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            raise ConfigError("a 'choice' spec must be a list of strings (or its JSON text)",
                              key="choice") from None
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ConfigError("a 'choice' spec must be a non-empty list of strings", key="choice")
    for i, c in enumerate(spec):
        if not isinstance(c, str):
            raise ConfigError(f"choice {i} is {type(c).__name__}, not a string", key=f"choice[{i}]")
    return list(spec)


def compile_constraint(kind: Any, spec: Any = None, *, start: str = "start",
                       json_options: JsonSchemaOptions | None = None,
                       compile_options: CompileOptions | None = None,
                       remotes: Mapping[str, Any] | None = None, for_generation: bool = True,
                       strings_may_be_paths: bool = False,
                       import_paths: Sequence[str | os.PathLike[str]] = (),
                       grammar_path: str | os.PathLike[str] | None = None) -> CompiledGrammar:
    """Compile one constraint of kind ``kind`` (see :data:`CONSTRAINT_KINDS` and
    :func:`constraint_kind`) to a :class:`~structgen.grammar.compiled.CompiledGrammar`.

    ``spec``: for ``"json"`` whatever :func:`schema_from` accepts (a ``str`` is JSON text
    only, unless ``strings_may_be_paths``); for ``"grammar"`` Lark text with rule ``start``, or
    an ``os.PathLike`` naming a Lark file (read here; its relative ``%import`` lines resolve
    beside it); for ``"regex"`` a pattern string; for ``"choice"`` a non-empty list of
    strings or its JSON text; ignored for ``"json_object"``. A ``CompiledGrammar`` given as a
    ``"json"`` or ``"grammar"`` spec is returned as is (compiled by the caller, with its own
    options).

    ``json_options``: JSON Schema options; with ``for_generation`` (the default) strings are
    generated in their canonical spelling unless ``json_options.string_escapes`` says
    otherwise (:meth:`~structgen.config.JsonSchemaOptions.for_generation`); without it the
    grammar accepts every JSON spelling (validation's language). ``remotes``: the only
    documents a schema's ``$ref`` may reach outside it. ``compile_options``: automaton limits
    (all kinds). ``import_paths``: folders Lark ``%import`` may also read from;
    ``grammar_path``: the file Lark text was read from (its relative ``%import`` lines resolve
    beside it; set from the spec when that is a path).

    Side effects: reads a file only when ``spec`` is a path (see :func:`schema_from`). The
    front-ends keep their own content-keyed caches. Raises
    :class:`~structgen.errors.ConfigError` for an unknown kind or a bad spec type, and what
    the front-ends raise for a bad schema, grammar or regex (SchemaError, GrammarError,
    RegexError, UnsupportedFeatureError, CompileLimitError).
    """
    from structgen.grammar.compiled import CompiledGrammar

    kind = constraint_kind(kind)
    if kind in ("json", "grammar") and isinstance(spec, CompiledGrammar):
        return spec
    if kind in ("json", "json_object"):
        from structgen.config import JsonSchemaOptions
        from structgen.frontends.json_schema.compiler import compile_json_schema

        schema = {"type": "object"} if kind == "json_object" else \
            schema_from(spec, strings_may_be_paths=strings_may_be_paths)
        return compile_json_schema(schema, options=json_options or JsonSchemaOptions(),
                                   compile_options=compile_options, remotes=remotes,
                                   for_generation=for_generation)
    if kind == "grammar":
        from structgen.frontends.lark import compile_lark

        if isinstance(spec, os.PathLike):
            grammar_path, spec = spec, read_grammar_file(spec)
        if not isinstance(spec, str):
            raise ConfigError("a 'grammar' spec must be Lark grammar text", key="grammar")
        return compile_lark(spec, start=start, compile_options=compile_options,
                            import_paths=import_paths, grammar_path=grammar_path)
    from structgen.grammar import ir
    from structgen.grammar.compiler import compile_grammar

    if kind == "regex":
        from structgen.frontends.regex import compile_regex

        if not isinstance(spec, str):
            raise ConfigError("a 'regex' spec must be a string", key="regex")
        return compile_grammar(ir.Grammar({"start": compile_regex(spec)}, "start"), compile_options)
    alternatives = [ir.lit(c.encode("utf-8")) for c in dict.fromkeys(_choices(spec))]
    return compile_grammar(ir.Grammar({"start": ir.alt(*alternatives)}, "start"), compile_options)
