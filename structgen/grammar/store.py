"""Compiled grammars on disk: a safe file format and a size-bounded, content-keyed folder.

A :class:`~structgen.grammar.compiled.CompiledGrammar` is stored as one ``.npz`` file (numpy's
zip of ``.npy`` arrays, read with ``allow_pickle=False``: loading never runs code from the file)
of two byte arrays: the rules' tables (integer and flag arrays) packed into one blob, and a JSON
header: the format version, the cache key the caller filed it under, the grammar's content key,
its root, each rule's kind and name, the caller's metadata (JSON), the table of the packed arrays
(name, dtype, shape, offset; integer and flag dtypes only) and a SHA-256 over that table and the
blob. :func:`load_grammar` checks all of it and answers None for anything it does not
recognise (another version, another key, a changed byte, a truncated or foreign file); it never
raises for a bad file. The lazily built parts of a grammar (DFA states built while matching) are
not stored: a loaded grammar starts as a freshly compiled one does.

:class:`GrammarStore` is a folder of such files named by their cache key (a hex digest the
caller computes from everything the compile depends on). Writes go through a temporary file
renamed into place; a hit refreshes the file's modification time, and after each write the
least recently used files go once the folder holds more than ``max_bytes``. A corrupt entry is
deleted when found; the caller compiles again and stores the new result.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from structgen.grammar.compiled import (
    CompiledGrammar,
    CountedRule,
    DfaRule,
    LazyRule,
    ProductRule,
    Rule,
    _Csr,
)
from structgen.grammar.fsa import Dfa
from structgen.json_types import JsonObject, JsonValue

__all__ = ["FORMAT_VERSION", "GrammarStore", "load_grammar", "save_grammar"]

#: Bumped whenever the file layout or the meaning of a stored table changes.
FORMAT_VERSION = 2
_SUFFIX = ".npz"

_Arrays = Mapping[str, NDArray[np.integer | np.bool_]]  # the stored tables: integers and flags


def _digest(table: JsonValue, blob: NDArray[np.uint8]) -> str:
    h = hashlib.sha256(json.dumps(table).encode())
    h.update(blob.tobytes())
    return h.hexdigest()


#: The dtypes a stored table may have: integers and flags (never objects, so never a pickle).
_DTYPES = frozenset(np.dtype(t).str for t in (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                               np.uint32, np.int64, np.uint64))


def _pack(arrays: _Arrays) -> tuple[list[JsonValue], NDArray[np.uint8]]:
    """Every array's bytes in one blob (each at an 8-byte boundary) and the table that finds
    them again: ``[name, dtype, shape, offset]`` per array. One blob loads in one read where
    one ``.npy`` member per array cost a header parse each."""
    table: list[JsonValue] = []
    parts: list[bytes] = []
    at = 0
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        table.append([name, a.dtype.str, list(a.shape), at])
        data = a.tobytes()
        pad = -len(data) % 8
        parts.append(data + b"\0" * pad)
        at += len(data) + pad
    return table, np.frombuffer(b"".join(parts), dtype=np.uint8)


def _unpack(table: JsonValue, blob: NDArray[np.uint8]) -> dict[str, NDArray[np.integer | np.bool_]]:
    """The arrays :func:`_pack` stored (views of ``blob``); ValueError for a table
    that does not describe ``blob`` (a dtype outside :data:`_DTYPES`, a range outside it)."""
    if not isinstance(table, list):
        raise ValueError("no array table")
    out: dict[str, NDArray[np.integer | np.bool_]] = {}
    for entry in table:
        if not (isinstance(entry, list) and len(entry) == 4):
            raise ValueError("bad array entry")
        name, dt, shape, at = entry
        if not (isinstance(name, str) and isinstance(dt, str) and dt in _DTYPES and isinstance(shape, list)
                and all(isinstance(d, int) and d >= 0 for d in shape) and isinstance(at, int) and at >= 0):
            raise ValueError("bad array entry")
        dims = [d for d in shape if isinstance(d, int)]
        dtype = np.dtype(dt)
        count = 1
        for d in dims:
            count *= d
        _check(at + count * dtype.itemsize <= blob.shape[0])
        out[name] = np.frombuffer(blob, dtype=dtype, count=count, offset=at).reshape(dims)
    return out


def _encode(cg: CompiledGrammar) -> tuple[list[JsonValue], dict[str, NDArray[np.integer | np.bool_]]]:
    rules: list[JsonValue] = []
    arrays: dict[str, NDArray[np.integer | np.bool_]] = {}
    for i, rule in enumerate(cg.rules):
        p = f"r{i}_"
        if isinstance(rule, LazyRule):
            nfa = rule.csr()
            arrays[p + "eps_off"], arrays[p + "eps"] = nfa.eps_off, nfa.eps
            arrays[p + "edge_off"], arrays[p + "edges"] = nfa.edge_off, nfa.edges
            arrays[p + "call_off"], arrays[p + "calls"] = nfa.call_off, nfa.calls
            arrays[p + "class_of"] = np.asarray(rule._class_of)
            rules.append({"kind": "lazy", "name": rule.name, "end": int(rule._end),
                          "nclass": int(rule._nclass)})
        elif isinstance(rule, CountedRule):
            cst = rule.__getstate__()
            arrays[p + "trans"], arrays[p + "accept"] = np.asarray(cst["trans"]), np.asarray(cst["accept"])
            rules.append({"kind": "counted", "name": cst["name"], "lo": cst["lo"], "hi": cst["hi"]})
        elif isinstance(rule, DfaRule):
            tst = rule.__getstate__()
            arrays[p + "trans"], arrays[p + "accept"] = np.asarray(tst["trans"]), np.asarray(tst["accept"])
            rules.append({"kind": "dfa", "name": tst["name"]})
        elif isinstance(rule, ProductRule):
            pst = rule.__getstate__()
            for side, d in (("a", pst["a"]), ("b", pst["b"])):
                arrays[p + side + "_trans"] = np.asarray(d.trans)
                arrays[p + side + "_accept"] = np.asarray(d.accept)
            rules.append({"kind": "product", "name": pst["name"]})
        else:  # pragma: no cover - a new rule kind must be taught to this module
            raise TypeError(f"cannot store a {type(rule).__name__}")
    return rules, arrays


def _check(ok: bool) -> None:
    if not ok:
        raise ValueError("inconsistent grammar tables")


def _table(arrays: _Arrays, prefix: str) -> tuple[NDArray[np.int32], NDArray[np.bool_]]:
    """A DFA table and its accept flags, checked: every target a state of the table or -1.
    (The native kernels index with these numbers unchecked.)"""
    trans, accept = arrays[prefix + "trans"], arrays[prefix + "accept"]
    n = trans.shape[0] if trans.ndim == 2 else -1
    _check(trans.dtype == np.int32 and trans.shape == (n, 256) and accept.dtype == np.bool_
           and accept.shape == (n,) and bool(((trans >= -1) & (trans < n)).all()))
    return np.asarray(trans, dtype=np.int32), np.asarray(accept, dtype=np.bool_)  # checked: no copies


def _int(v: JsonValue) -> int:
    """A header's integer (ValueError for anything else: the file is not ours)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"not an integer: {v!r}")
    return v


def _decode(rules: JsonValue, arrays: _Arrays) -> tuple[Rule, ...]:
    if not isinstance(rules, list):
        raise ValueError("no rule list")
    out: list[Rule] = []
    for i, r in enumerate(rules):
        if not isinstance(r, dict):
            raise ValueError("a rule header is not an object")
        p = f"r{i}_"
        kind, name = r["kind"], str(r["name"])
        if kind == "lazy":
            class_of, nclass, end = arrays[p + "class_of"], _int(r["nclass"]), _int(r["end"])
            eps_off, eps = arrays[p + "eps_off"], arrays[p + "eps"]
            edge_off, edges = arrays[p + "edge_off"], arrays[p + "edges"]
            call_off, calls = arrays[p + "call_off"], arrays[p + "calls"]
            n = eps_off.shape[0] - 1
            _check(class_of.dtype == np.int32 and class_of.shape == (256,)
                   and bool(((class_of >= 0) & (class_of < nclass)).all()) and 0 <= end < n)
            for off, data, width in ((eps_off, eps, 1), (edge_off, edges, 3), (call_off, calls, 2)):
                _check(off.shape == (n + 1,) and off[0] == 0 and bool((np.diff(off) >= 0).all())
                       and data.shape[0] == off[-1]
                       and (data.ndim == 1 if width == 1 else data.shape[1:] == (width,)))
            _check(bool(((eps >= 0) & (eps < n)).all()))
            _check(bool(((edges[:, 0] >= 0) & (edges[:, 0] <= edges[:, 1]) & (edges[:, 1] < nclass)
                         & (edges[:, 2] >= 0) & (edges[:, 2] < n)).all()))
            _check(bool(((calls[:, 0] >= 0) & (calls[:, 0] < len(rules)) & (calls[:, 1] >= 0)
                         & (calls[:, 1] < n)).all()))
            def i32(a: NDArray[np.generic]) -> NDArray[np.int32]:
                return np.ascontiguousarray(a, dtype=np.int32)

            # an NFA state is important with byte or call edges, or as the rule's end
            important = ((np.diff(edge_off) > 0) | (np.diff(call_off) > 0)).astype(np.uint8)
            important[end] = 1
            csr = _Csr(i32(eps_off), i32(eps), i32(edge_off), i32(edges), i32(call_off), i32(calls),
                       important)
            out.append(LazyRule.from_csr(name, csr, end, i32(class_of), nclass))
        elif kind == "counted":
            trans, accept = _table(arrays, p)
            lo, hi = _int(r["lo"]), _int(r["hi"])
            _check(0 <= lo <= hi)
            out.append(CountedRule(name, trans, accept, lo, hi))
        elif kind == "dfa":
            out.append(DfaRule(name, *_table(arrays, p)))
        elif kind == "product":
            a, b = (Dfa(*_table(arrays, p + s + "_"), [()] * arrays[p + s + "_trans"].shape[0])
                    for s in ("a", "b"))
            out.append(ProductRule(name, a, b))
        else:
            raise ValueError(f"unknown rule kind {kind!r}")
    return tuple(out)


def save_grammar(path: str | os.PathLike[str], cg: CompiledGrammar, cache_key: str,
                 metadata: Mapping[str, JsonValue] | None = None) -> None:
    """Write ``cg`` to ``path`` (through a temporary file renamed into place), filed under
    ``cache_key``, with ``metadata`` (JSON-serialisable) to hand back on load."""
    rules, arrays = _encode(cg)
    table, blob = _pack(arrays)
    header: JsonObject = {"format": FORMAT_VERSION, "cache_key": cache_key, "key": cg.key, "root": cg.root,
                          "rules": rules, "metadata": dict(metadata or {}), "arrays": table,
                          "digest": _digest(table, blob)}
    stored = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), "blob": blob}
    folder = os.path.dirname(os.fspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=".grammar.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, **stored)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_grammar(path: str | os.PathLike[str],
                 cache_key: str) -> tuple[CompiledGrammar, JsonObject] | None:
    """The grammar stored at ``path`` under ``cache_key`` and its metadata, or None when the file
    is missing, damaged, of another format version, filed under another key, or fails its
    checksum. Never unpickles anything, never raises for a bad file."""
    try:
        with open(path, "rb") as fh:
            z = np.load(fh, allow_pickle=False)
            if not isinstance(z, np.lib.npyio.NpzFile):
                return None
            with z:
                if sorted(z.files) != ["blob", "header"]:
                    return None
                head, blob = z["header"], z["blob"]
        header = json.loads(head.tobytes().decode())
        if (not isinstance(header, dict) or header.get("format") != FORMAT_VERSION
                or header.get("cache_key") != cache_key or blob.dtype != np.uint8 or blob.ndim != 1
                or header.get("digest") != _digest(header.get("arrays"), blob)):
            return None
        rules = _decode(header["rules"], _unpack(header["arrays"], blob))
        root = _int(header["root"])
        if not 0 <= root < len(rules) or not isinstance(header["key"], str):
            return None
        metadata = header.get("metadata")
        return CompiledGrammar(rules, root, header["key"]), (dict(metadata) if isinstance(metadata, dict)
                                                              else {})
    except Exception:  # noqa: BLE001 - any unreadable file is a cache miss
        return None


class GrammarStore:
    """A folder of stored grammars, one file per cache key, at most ``max_bytes`` in all (least
    recently used files go first). Every method answers quietly when the folder cannot be used
    (read-only, missing permissions): the cache is an optimisation, never a failure."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int = 64 << 20) -> None:
        self.folder = Path(folder)
        self.max_bytes = int(max_bytes)

    def path(self, cache_key: str) -> Path:
        """Where the grammar filed under ``cache_key`` (a hex digest) lives."""
        if not cache_key or not all(c in "0123456789abcdef" for c in cache_key):
            raise ValueError("a cache key is a lowercase hex digest")
        return self.folder / (cache_key + _SUFFIX)

    def get(self, cache_key: str) -> tuple[CompiledGrammar, JsonObject] | None:
        """The stored grammar and metadata, or None (missing; a damaged file is deleted)."""
        path = self.path(cache_key)
        if not path.is_file():
            return None
        got = load_grammar(path, cache_key)
        try:
            if got is None:
                path.unlink()
            else:
                os.utime(path)  # recently used: kept longest
        except OSError:
            pass
        return got

    def put(self, cache_key: str, cg: CompiledGrammar,
            metadata: Mapping[str, JsonValue] | None = None) -> bool:
        """Store ``cg``; True when written. Trims the folder to ``max_bytes`` afterwards."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            save_grammar(self.path(cache_key), cg, cache_key, metadata)
        except Exception:  # noqa: BLE001 - unwritable folder, full disk, an unstorable object
            return False
        self.trim()
        return True

    def trim(self) -> None:
        """Delete the least recently used files until the folder holds at most ``max_bytes``."""
        try:
            entries = []
            for p in self.folder.glob("*" + _SUFFIX):
                st = p.stat()
                entries.append((st.st_mtime, st.st_size, p))
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                p.unlink()
                total -= size
            except OSError:
                pass
