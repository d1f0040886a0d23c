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

from structgen.config import CompileOptions, JsonSchemaOptions
from structgen.errors import ConfigError, GrammarError
from structgen.frontends.json_schema.source import (
    is_model_class,
    read_schema_file,
    read_utf8_file,
    schema_from,
)
from structgen.frontends.lark import compile_lark
from structgen.frontends.regex import compile_regex
from structgen.grammar import ir
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.compiler import compile_grammar
from structgen.json_types import JsonValue

__all__ = ["CONSTRAINT_KINDS", "compile_constraint", "constraint_kind", "is_model_class",
           "read_grammar_file", "read_schema_file", "schema_from"]

#: constraint kinds :func:`compile_constraint` understands (vLLM's request types, lower case),
#: with ``"lark"`` an alias of ``"grammar"``
CONSTRAINT_KINDS = ("json", "json_object", "regex", "grammar", "lark", "choice")


def constraint_kind(kind: object) -> str:
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


def read_grammar_file(path: str | os.PathLike[str]) -> str:
    """The text of the Lark grammar file at ``path``. Side effect: reads that one file.
    Raises :class:`~structgen.errors.GrammarError` (one line, naming the file) when it cannot
    be read or is not UTF-8."""
    return read_utf8_file(path, GrammarError)


def _choices(spec: object) -> list[str]:
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


def compile_constraint(kind: object, spec: object = None, *, start: str = "start",
                       json_options: JsonSchemaOptions | None = None,
                       compile_options: CompileOptions | None = None,
                       remotes: Mapping[str, JsonValue] | None = None, for_generation: bool = True,
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
    kind = constraint_kind(kind)
    if kind in ("json", "grammar") and isinstance(spec, CompiledGrammar):
        return spec
    if kind in ("json", "json_object"):
        schema = {"type": "object"} if kind == "json_object" else \
            schema_from(spec, strings_may_be_paths=strings_may_be_paths)
        # imported at each call: the compiler module in sys.modules at that moment is the one
        # used (a stand-in installed there, a wrapper set on it), as for the validator's check
        from structgen.frontends.json_schema.compiler import compile_json_schema

        return compile_json_schema(schema, options=json_options or JsonSchemaOptions(),
                                   compile_options=compile_options, remotes=remotes,
                                   for_generation=for_generation)
    if kind == "grammar":
        if isinstance(spec, os.PathLike):
            grammar_path, spec = spec, read_grammar_file(spec)
        if not isinstance(spec, str):
            raise ConfigError("a 'grammar' spec must be Lark grammar text", key="grammar")
        return compile_lark(spec, start=start, compile_options=compile_options,
                            import_paths=import_paths, grammar_path=grammar_path)
    if kind == "regex":
        if not isinstance(spec, str):
            raise ConfigError("a 'regex' spec must be a string", key="regex")
        return compile_grammar(ir.Grammar({"start": compile_regex(spec)}, "start"), compile_options)
    alternatives = [ir.lit(c.encode("utf-8")) for c in dict.fromkeys(_choices(spec))]
    return compile_grammar(ir.Grammar({"start": ir.alt(*alternatives)}, "start"), compile_options)
