"""Where a JSON Schema comes from: a file, JSON text, or a model class.

The lowest module of the JSON Schema front-end that touches input: it reads and parses schema
files (:func:`read_schema_file`), parses JSON text strictly (:func:`parse_json`: ``NaN`` and
``Infinity`` are not JSON), recognises model classes (:func:`is_model_class`,
:func:`model_schema`) by duck typing, so that no front-end imports pydantic, and tells which
of these a user's schema argument is (:func:`schema_from`).

Used by the constraint front door (:mod:`structgen.frontends.constraint`), the compiler and
the validation tool (:mod:`structgen.validation`), which reads instance files with the
same two JSON helpers.
"""

from __future__ import annotations

import json
import os
from typing import NoReturn

from structgen.errors import SchemaError, StructgenError
from structgen.json_types import JsonObject, JsonValue

__all__ = ["decode_utf8", "is_model_class", "model_schema", "parse_json", "read_schema_file",
           "read_utf8_file", "schema_from"]


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str) -> tuple[JsonValue, str | None, int, int]:
    """Parse strict JSON text: ``(value, error, error_line, error_column)``.

    ``error`` is None on success; otherwise a one-line reason, with the 1-based line and
    column the parser stopped at (1, 1 when it gives none). ``NaN``/``Infinity`` and nesting
    deeper than the interpreter's recursion limit are errors, never exceptions.
    """
    try:
        return json.loads(text, parse_constant=_reject_constant), None, 0, 0
    except json.JSONDecodeError as e:
        return None, e.msg, e.lineno, e.colno
    except RecursionError:
        return None, "nested too deeply to parse (arrays/objects)", 1, 1
    except ValueError as e:
        return None, str(e) or type(e).__name__, 1, 1


def decode_utf8(raw: bytes, strip_bom: bool) -> tuple[str | None, str | None]:
    """``(text, None)`` for UTF-8 ``raw`` (a leading byte order mark dropped when
    ``strip_bom``: the start of a file), or ``(None, reason)`` naming the first bad byte."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start}"
    if strip_bom and text.startswith("\ufeff"):
        text = text[1:]
    return text, None


def read_utf8_file(path: str | os.PathLike[str], error: type[StructgenError], what: str = "", *,
                   strip_bom: bool = False) -> str:
    """The text of the UTF-8 file at ``path``. Side effect: reads that one file, whole.

    Raises ``error`` with a one-line message naming the file (``what`` comes before its name,
    e.g. ``"schema "``) when it cannot be read or is not UTF-8; no :class:`OSError` escapes.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read()
    except OSError as e:
        raise error(f"cannot read {what}{name}: {e.strerror or e}") from None
    except ValueError as e:  # an embedded NUL in the name
        raise error(f"cannot read {what}{name!r}: {e}") from None
    text, err = decode_utf8(data, strip_bom=strip_bom)
    if text is None:
        raise error(f"{what}{name} is not UTF-8: {err}")
    return text


def read_schema_file(path: str | os.PathLike[str]) -> JsonValue:
    """Parse the JSON file at ``path`` (any JSON value; the caller checks it is a schema).

    Side effect: reads that one file, whole. Raises :class:`~structgen.errors.SchemaError`
    with a one-line message naming the file when it cannot be read, is not UTF-8 or is not
    JSON; no :class:`OSError` escapes.
    """
    path = os.fspath(path)
    text = read_utf8_file(path, SchemaError, "schema ", strip_bom=True)
    value, perr, line, col = parse_json(text)
    if perr is not None:
        raise SchemaError(f"schema {path} is not valid JSON: {perr} (line {line}, column {col})")
    return value


def is_model_class(obj: object) -> bool:
    """True for a class with a callable ``model_json_schema`` (a Pydantic v2 model, or any
    class that describes itself the same way)."""
    return isinstance(obj, type) and callable(getattr(obj, "model_json_schema", None))


def model_schema(cls: type) -> JsonObject:
    """The JSON Schema of model class ``cls``, from its ``model_json_schema()``.

    Cost: whatever that method costs (Pydantic builds and caches the schema). An exception
    it raises becomes a :class:`~structgen.errors.SchemaError` naming the class.
    """
    try:
        schema: JsonObject = cls.model_json_schema()  # type: ignore[attr-defined]  # duck-typed
        return schema
    except StructgenError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's class cannot describe itself
        raise SchemaError(f"model class {cls.__qualname__} has no JSON schema: "
                          f"{type(e).__name__}: {e}") from None


def _is_file(text: str) -> bool:
    try:
        return os.path.isfile(text)
    except (OSError, ValueError):  # a name too long for the OS, an embedded NUL
        return False


def schema_from(spec: object, *, strings_may_be_paths: bool = True) -> JsonValue:
    """The schema value ``spec`` stands for (the rules: :mod:`structgen.frontends.constraint`).

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
    if isinstance(spec, type) and is_model_class(spec):
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
