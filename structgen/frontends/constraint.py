"""Tell a JSON Schema given as a value, as JSON text or as a file path apart.

Every front door that turns a user's ``schema`` into a grammar (:func:`structgen.resolve_grammar`,
:func:`structgen.integrations.compile_constraint`, the CLI, the benchmark helpers) decides here,
by type and content -- never by the first character:

* ``dict`` / ``bool``: the schema itself;
* a class (a Pydantic model): returned unchanged, the caller converts it;
* ``os.PathLike``: a file, read as UTF-8 JSON;
* ``str``: JSON text when, stripped of whitespace, it parses as a JSON object or boolean; otherwise
  (only where the caller allows it) the path of an existing file; otherwise a
  :class:`~structgen.errors.SchemaError` saying why neither reading works.

So a file named ``tree.schema.json``, ``false.json``, ``{x}.json`` or ``[a].json`` is a path; the
string ``"true"`` is the boolean schema (pass ``pathlib.Path("true")`` for a file of that name).

Strings from the network (a serving integration's request) must never become file reads, so
:func:`structgen.integrations.compile_constraint` calls :func:`schema_from` with
``strings_may_be_paths=False``: there a string is JSON text or an error.
"""

from __future__ import annotations

import json
import os
from typing import Any

from structgen.errors import SchemaError

__all__ = ["schema_from", "read_schema_file"]


def read_schema_file(path: str | os.PathLike[str]) -> Any:
    """Parse the JSON file at ``path``. Reads that one file; raises
    :class:`~structgen.errors.SchemaError` (one line, naming the file) when it cannot be read, is
    not UTF-8 or is not JSON."""
    from structgen.tools.validation import load_schema

    return load_schema(os.fspath(path))


def _json_value(text: str) -> tuple[bool, Any, str]:
    """(parsed, value, why not) for JSON text; NaN/Infinity are not JSON."""
    def reject(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        return True, json.loads(text, parse_constant=reject), ""
    except json.JSONDecodeError as e:
        return False, None, f"{e.msg} (line {e.lineno}, column {e.colno})"
    except (ValueError, RecursionError) as e:
        return False, None, str(e) or type(e).__name__


def _is_file(text: str) -> bool:
    try:
        return os.path.isfile(text)
    except (OSError, ValueError):  # a name too long for the OS, an embedded NUL
        return False


def schema_from(spec: Any, *, strings_may_be_paths: bool = True) -> Any:
    """The schema value ``spec`` stands for (see the module docstring for the rules).

    Side effect: reads the file when ``spec`` is a path (an ``os.PathLike``, or a ``str`` that is
    not JSON text when ``strings_may_be_paths``); nothing else is opened. Raises
    :class:`~structgen.errors.SchemaError` for JSON text that is not an object or a boolean, a
    string that is neither JSON text nor an existing file, and an unreadable file.
    """
    if isinstance(spec, (dict, bool, type)):
        return spec
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
    text = spec.strip()
    parsed, value, why = _json_value(text)
    if parsed and isinstance(value, (dict, bool)):
        return value
    if parsed:
        why = f"it is JSON but a {type(value).__name__ if value is not None else 'null'}, " \
              "not an object or a boolean"
    short = spec if len(spec) <= 80 else spec[:77] + "..."
    if not strings_may_be_paths:
        raise SchemaError(f"schema text {short!r} is not a JSON Schema: {why} (a string schema here "
                          "is JSON text; pass a pathlib.Path to read a file)")
    if _is_file(spec):
        return read_schema_file(spec)
    raise SchemaError(f"schema {short!r} is neither JSON Schema text ({why}) nor an existing file")
