"""Importing jsonschema without paying for a format checker nobody asked for.

jsonschema's format module imports ``rfc3987_syntax`` (when it is installed) for its ``iri``
and ``iri-reference`` checkers, and that package builds an Earley parser of RFC 3987's grammar
while it is imported: about two seconds of CPU in every process that imports jsonschema,
whether or not any value is ever checked against those two formats.

:func:`import_jsonschema` imports jsonschema while a stand-in ``rfc3987_syntax`` module sits in
:data:`sys.modules`. The stand-in's ``is_valid_syntax`` (the only name jsonschema takes from
it) imports the real package on its first call and hands every call over to it, so the parser
is built the first time an ``iri``/``iri-reference`` value is checked, and never otherwise.
The stand-in leaves :data:`sys.modules` as soon as jsonschema is imported, so any other
``import rfc3987_syntax`` gets the real package. Verdicts do not change: jsonschema registers
the same checkers, and they run the real function. Every structgen module that needs jsonschema
imports it through here first.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Callable

__all__ = ["import_jsonschema"]

_NAME = "rfc3987_syntax"
_LOCK = threading.Lock()
_real_is_valid_syntax: Callable[[str, str], object] | None = None


def _is_valid_syntax(term: str, value: str) -> bool:
    """``rfc3987_syntax.is_valid_syntax``, imported on first use."""
    global _real_is_valid_syntax
    if _real_is_valid_syntax is None:
        with _LOCK:
            if _real_is_valid_syntax is None:
                try:
                    real = importlib.import_module(_NAME)
                except ImportError:
                    # jsonschema registers no iri checker when this import fails, and a format
                    # without a checker accepts every value: the same verdict
                    return True
                _real_is_valid_syntax = real.is_valid_syntax
    return bool(_real_is_valid_syntax(term, value))


def import_jsonschema() -> types.ModuleType:
    """The ``jsonschema`` module, imported (the first time) without building rfc3987_syntax's
    parser; see the module docstring."""
    got = sys.modules.get("jsonschema")
    if got is not None and "jsonschema._format" in sys.modules:
        return got
    with _LOCK:
        stand_in = None
        if (_NAME not in sys.modules and "jsonschema._format" not in sys.modules
                and importlib.util.find_spec(_NAME) is not None):
            stand_in = types.ModuleType(_NAME, "structgen's deferred stand-in (see "
                                        "structgen.frontends.json_schema.jsonschema_import)")
            stand_in.is_valid_syntax = _is_valid_syntax  # type: ignore[attr-defined]
            sys.modules[_NAME] = stand_in
        try:
            import jsonschema
        finally:
            if stand_in is not None and sys.modules.get(_NAME) is stand_in:
                del sys.modules[_NAME]
    return jsonschema
