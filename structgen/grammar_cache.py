"""A persistent cache of compiled JSON Schema grammars, for the command line and the server.

``structgen validate`` compiles the same schema in every run, and ``structgen serve`` the same
response formats after every restart; loading a stored grammar takes a fraction of its compile.
:func:`compile_json_schema_cached` files each compiled grammar on disk
(:class:`structgen.grammar.store.GrammarStore`: numpy arrays and a JSON header, checksummed,
never pickle) under a SHA-256 of everything the result depends on:

* the schema (its JSON text, key order kept: declared properties are matched in schema order),
  the ``remotes`` documents, the JSON Schema options and the compile options;
* structgen's version and a stamp of its source code (path, size and modification time of every
  ``.py`` file of the package), so an upgraded or edited structgen never loads a grammar an older
  compiler made;
* the store's format version.

Where: ``$STRUCTGEN_GRAMMAR_CACHE`` when set (``0``/``off``: no disk cache), else ``grammars/``
under structgen's cache root (``$STRUCTGEN_CACHE``, else ``~/.cache/structgen``); at most
``$STRUCTGEN_GRAMMAR_CACHE_MB`` megabytes (default 64; least recently used files go first).
A damaged or foreign file is a miss: it is deleted, the schema compiled and stored again. A
folder that cannot be written is no error: the compile result is used and nothing is stored.
Only successful compiles are stored; a schema that fails to compile fails the same way each run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import structgen
from structgen.config import CompileOptions, JsonSchemaOptions
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.store import FORMAT_VERSION, GrammarStore
from structgen.json_types import JsonObject, JsonValue

__all__ = ["cache_folder", "cached_grammar", "code_stamp", "compile_json_schema_cached", "grammar_store",
           "store_grammar"]

_OFF = ("0", "off", "no", "false")
_STAMP: str | None = None
_LOADED: OrderedDict[str, CompiledGrammar] = OrderedDict()  # cache key -> grammar loaded from disk (last few)
_LOADED_MAX = 16


def cache_folder() -> Path | None:
    """The folder of stored grammars, or None when ``STRUCTGEN_GRAMMAR_CACHE`` turns it off."""
    env = os.environ.get("STRUCTGEN_GRAMMAR_CACHE")
    if env is not None and env.strip().lower() in _OFF:
        return None
    if env:
        return Path(env).expanduser()
    root = os.environ.get("STRUCTGEN_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "structgen") / "grammars"


def grammar_store() -> GrammarStore | None:
    """The :class:`~structgen.grammar.store.GrammarStore` at :func:`cache_folder`, or None."""
    try:
        folder = cache_folder()
    except (RuntimeError, OSError):  # no home folder to put it in
        return None
    if folder is None:
        return None
    try:
        mb = float(os.environ.get("STRUCTGEN_GRAMMAR_CACHE_MB", "64"))
    except ValueError:
        mb = 64.0
    return GrammarStore(folder, max_bytes=int(max(mb, 0.0) * (1 << 20)))


def code_stamp() -> str:
    """SHA-256 (hex) of structgen's version and the path, size and modification time of every
    ``.py`` file of the installed package (computed once per process)."""
    global _STAMP
    if _STAMP is None:
        package = Path(structgen.__file__).resolve().parent
        h = hashlib.sha256(structgen.__version__.encode())
        for path in sorted(package.rglob("*.py")):
            try:
                st = path.stat()
            except OSError:
                continue
            h.update(f"{path.relative_to(package)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        _STAMP = h.hexdigest()
    return _STAMP


def _cache_key(schema: JsonValue, remotes: Mapping[str, JsonValue] | None, options: JsonSchemaOptions,
               compile_options: CompileOptions | None) -> str | None:
    try:
        text = json.dumps(["json-schema", FORMAT_VERSION, code_stamp(), schema,
                           sorted(remotes.items()) if remotes else None, repr(options),
                           repr(compile_options)], ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None  # the compiler reports what is wrong with such a schema
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _resolved(options: JsonSchemaOptions | None, for_generation: bool) -> JsonSchemaOptions:
    """``options`` with the language's defaults filled in, so that the key names the language."""
    options = options or JsonSchemaOptions()
    return options.for_generation() if for_generation else options.for_validation()


def cached_grammar(schema: JsonValue, *, remotes: Mapping[str, JsonValue] | None = None,
                   options: JsonSchemaOptions | None = None, compile_options: CompileOptions | None = None,
                   for_generation: bool = True) -> CompiledGrammar | None:
    """The grammar :func:`compile_json_schema_cached` would load from disk for these arguments,
    or None (no disk cache, nothing stored, a damaged file). Loads once per process: a second
    call, or the compile that follows, gets the same object."""
    options = _resolved(options, for_generation)
    store = grammar_store()
    key = None if store is None else _cache_key(schema, remotes, options, compile_options)
    if store is None or key is None:
        return None
    got = _LOADED.get(key)
    if got is not None:
        return got
    loaded = store.get(key)
    if loaded is None:
        return None
    cg, meta = loaded
    if cg.has_value_checks:  # its predicates are registered by the module that defines them
        # (imported only then: it loads idna, which no other grammar needs)
        import structgen.frontends.json_schema.idn  # noqa: F401
    stored = meta.get("warnings")
    warnings: list[JsonValue] = [str(w) for w in stored] if isinstance(stored, list) else []
    cg.metadata.update({"warnings": warnings, "schema": schema})
    for attr, value in (("warnings", warnings), ("schema", schema)):  # as compile_json_schema does
        setattr(cg, attr, value)
    _LOADED[key] = cg
    while len(_LOADED) > _LOADED_MAX:
        _LOADED.popitem(last=False)
    return cg


def compile_json_schema_cached(schema: JsonObject | bool, *, remotes: Mapping[str, JsonValue] | None = None,
                               options: JsonSchemaOptions | None = None,
                               compile_options: CompileOptions | None = None,
                               for_generation: bool = True) -> CompiledGrammar:
    """:func:`structgen.frontends.json_schema.compiler.compile_json_schema` of ``schema`` (a JSON
    value), loaded from the disk cache when an earlier run stored it, else compiled and stored.
    Same result, same errors; the loaded grammar's ``metadata`` holds ``"warnings"`` and
    ``"schema"`` as a compiled one's does (it has no IR ``source``). ``for_generation``: which
    language, as for ``compile_json_schema``; the two are filed apart."""
    # imported here, on a miss: a test may stand in for the compiler module
    from structgen.frontends.json_schema.compiler import compile_json_schema

    options = _resolved(options, for_generation)
    got = cached_grammar(schema, remotes=remotes, options=options, compile_options=compile_options)
    if got is not None:
        return got
    cg = compile_json_schema(schema, options=options, compile_options=compile_options,
                             for_generation=for_generation, remotes=remotes or None)
    store_grammar(schema, cg, remotes=remotes, options=options, compile_options=compile_options)
    return cg


def store_grammar(schema: JsonValue, cg: CompiledGrammar, *, remotes: Mapping[str, JsonValue] | None = None,
                  options: JsonSchemaOptions | None = None, compile_options: CompileOptions | None = None,
                  for_generation: bool = True) -> None:
    """File ``cg``, the grammar :func:`compile_json_schema_cached` would compile for these
    arguments (compiled elsewhere: in a worker process, say), in the disk cache; nothing
    happens without a disk cache or for a schema that has no key. A folder that cannot be
    written is no error."""
    options = _resolved(options, for_generation)
    store = grammar_store()
    key = None if store is None else _cache_key(schema, remotes, options, compile_options)
    if store is not None and key is not None:
        made = cg.metadata.get("warnings")
        store.put(key, cg, {"warnings": [str(w) for w in made] if isinstance(made, list) else []})
