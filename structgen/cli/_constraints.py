"""How the command line turns its inputs into compiled grammars: a schema or grammar file for
``compile``, and the constraint of every ``generate`` request (JSON Schema, Pydantic class, Lark
grammar or regex) with the validator that checks its outputs."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from structgen.cli._common import _text, _Usage
from structgen.config import JsonSchemaOptions
from structgen.errors import GrammarError, RegexError, StructgenError
from structgen.frontends.constraint import compile_constraint, read_grammar_file, schema_from
from structgen.grammar.compiled import CompiledGrammar
from structgen.json_types import JsonValue
from structgen.settings import Settings
from structgen.validation import SchemaValidator

if TYPE_CHECKING:
    from pydantic import BaseModel


@dataclass
class _Constraint:
    """One output constraint of `generate`: the compiled grammar and how outputs are checked."""

    kind: str  # "schema" | "pydantic" | "grammar" | "regex"
    compiled: CompiledGrammar | None  # None: free text (around tool calls)
    validator: SchemaValidator | None = None  # jsonschema + formats, for JSON kinds
    pydantic: type[BaseModel] | None = None
    schema: JsonValue = None  # the schema value of JSON kinds (reasoning lowers it again)

    @property
    def is_json(self) -> bool:
        return self.kind in ("schema", "pydantic")


def _compile_file(path: str, lenient: bool, remotes: Mapping[str, JsonValue] | None = None, *,
                  for_generation: bool = True) -> CompiledGrammar:
    """Compile ``path`` (``.lark``: Lark grammar, whose relative ``%import`` reads beside it;
    anything else: JSON Schema, whose ``$ref`` may reach ``remotes`` and nothing else outside
    it) into the grammar generation uses, or with ``for_generation=False`` the one validation
    uses (every JSON spelling accepted)."""
    if path.endswith(".lark"):
        try:
            text = read_grammar_file(path)
        except StructgenError as e:
            raise _Usage(_text(e)) from None
        return compile_constraint("grammar", text, grammar_path=path)
    try:
        schema = schema_from(Path(path))  # a command-line argument is always a file name
    except StructgenError as e:
        raise _Usage(_text(e)) from None
    return compile_constraint("json", schema, json_options=JsonSchemaOptions(lenient=lenient),
                              remotes=remotes, for_generation=for_generation)


def _grammar_error(path: str, e: StructgenError) -> str:
    if isinstance(e, GrammarError):
        where = f"{path}:{e.line}:{e.column}" if e.line is not None and e.column is not None else \
            f"{path}:{e.line}" if e.line is not None else path
        return f"{where}: {e.message}"
    if isinstance(e, RegexError):
        at = f" at offset {e.position}" if e.position is not None else ""
        return f"{path}: {e.message}{at}"
    return f"{path}: {_text(e)}"


def _schema_constraint(schema: JsonValue, source: str, settings: Settings,
                       pydantic: type[BaseModel] | None = None) -> _Constraint:
    """The constraint of a schema value: its generation grammar (from the front door, with the
    settings' options) and a validator for the outputs."""
    try:
        validator = SchemaValidator(schema, use_grammar=False)
        compiled = compile_constraint("json", schema, json_options=settings.json_schema,
                                      compile_options=settings.compile)
    except StructgenError as e:
        raise _Usage(f"{source}: {_text(e)}") from None
    return _Constraint("pydantic" if pydantic is not None else "schema", compiled, validator, pydantic,
                       schema)


def _import_pydantic(spec: str) -> type[BaseModel]:
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise _Usage(f"--pydantic wants pkg.module:Class, not {spec!r}")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:  # `structgen` (the console script) does not put the working folder on the path
        sys.path.insert(0, cwd)
    try:
        obj: object = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module
        raise _Usage(f"--pydantic {spec}: cannot import {mod_name}: {type(e).__name__}: {e}") from None
    finally:
        if added:
            sys.path.remove(cwd)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _Usage(f"--pydantic {spec}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    from pydantic import BaseModel

    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise _Usage(f"--pydantic {spec}: {attr} is not a pydantic BaseModel subclass")
    return obj


def _main_constraint(args: argparse.Namespace, settings: Settings) -> _Constraint | None:
    """The constraint the command line gives (--schema, --pydantic, --grammar or --regex; None
    when the prompts file names one per line), compiled by the front door. File arguments go in
    as paths, never as text."""
    if args.schema:
        try:
            schema = schema_from(Path(args.schema))
        except StructgenError as e:
            raise _Usage(_text(e)) from None
        return _schema_constraint(schema, args.schema, settings)
    if args.pydantic:
        cls = _import_pydantic(args.pydantic)
        try:
            schema = schema_from(cls)
        except StructgenError as e:  # pydantic cannot describe the class
            raise _Usage(f"--pydantic {args.pydantic}: {_text(e)}") from None
        return _schema_constraint(schema, args.pydantic, settings, pydantic=cls)
    if args.grammar:
        try:
            text = read_grammar_file(args.grammar)
        except StructgenError as e:
            raise _Usage(_text(e)) from None
        start = args.start or settings.generation.start
        try:
            return _Constraint("grammar", compile_constraint("grammar", text, start=start,
                                                             compile_options=settings.compile,
                                                             grammar_path=args.grammar))
        except StructgenError as e:
            raise _Usage(_grammar_error(args.grammar, e)) from None
    if args.regex is not None:
        try:
            return _Constraint("regex", compile_constraint("regex", args.regex))
        except StructgenError as e:
            raise _Usage(_grammar_error("--regex", e)) from None
    return None
