"""A fast first run: what `structgen validate` loads, jsonschema without rfc3987_syntax's parser
at import, and the disk cache of compiled grammars (round trip, damaged and foreign files).

Oracles: the modules a fresh process holds (``sys.modules``), jsonschema's own format checker in
a process that imported it plainly, grammars compiled afresh (``accepts`` / ``accepts_prefix`` on
every prefix of valid and invalid texts), and numpy's own reader for the stored files. No timing
is asserted here: start-up figures are in ``benchmarks/startup.py`` and ``benchmarks/results/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from structgen import grammar_cache
from structgen.frontends.json_schema.compiler import canonical_json, compile_json_schema
from structgen.grammar.compiled import LazyRule
from structgen.grammar.store import GrammarStore, load_grammar, save_grammar

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"

SMALL = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "active"],
    "additionalProperties": False,
}

# Prints, as JSON, the exit code and the loaded top-level modules of a `structgen` run whose
# arguments follow (main() with no argv: the process is the program, as the console script is).
_PROBE = """
import json, sys
from structgen.cli import main
sys.argv = ["structgen", *sys.argv[1:]]
rc = main()
names = sorted(m for m in sys.modules if m.split(".")[0] in
               ("torch", "transformers", "numba", "pydantic", "rfc3987_syntax", "lark", "structgen"))
print(json.dumps({"rc": rc, "modules": names}))
"""


def _probe(*args: Any, env: dict[str, str] | None = None) -> dict[str, Any]:
    full_env = {k: v for k, v in os.environ.items() if k != "STRUCTGEN_NATIVE"}
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-c", _PROBE, *map(str, args)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=full_env)
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout.splitlines()[-1]))


def test_validate_loads_no_torch_numba_or_iri_parser(tmp_path: Path) -> None:
    """First run: compiles (numba allowed), stores the grammar; second run: loads it and checks
    the instance without numba. Never torch, transformers, pydantic or the iri parser."""
    schema, inst = tmp_path / "s.json", tmp_path / "i.json"
    schema.write_text(json.dumps(SMALL))
    inst.write_text(json.dumps({"name": "Ada", "age": 36, "active": True}))
    env = {"STRUCTGEN_GRAMMAR_CACHE": str(tmp_path / "gc")}
    for run in ("compiles", "loads"):
        got = _probe("validate", "--schema", schema, inst, env=env)
        assert got["rc"] == 0
        never = ("torch", "transformers", "pydantic", "rfc3987_syntax", "lark")
        assert [m for m in got["modules"] if m.split(".")[0] in never] == []
        assert "structgen.generation" not in got["modules"] and "structgen.masks" not in got["modules"]
        assert ("numba" in got["modules"]) == (run == "compiles" and _has_numba())
    assert len(list((tmp_path / "gc").glob("*.npz"))) == 1


def _has_numba() -> bool:
    import importlib.util

    return importlib.util.find_spec("numba") is not None


def test_validate_large_input_uses_native_kernels(tmp_path: Path) -> None:
    pytest.importorskip("numba")
    from structgen.cli.validate import PLAIN_KERNELS_MAX_BYTES

    schema, inst = tmp_path / "s.json", tmp_path / "i.jsonl"
    schema.write_text(json.dumps(SMALL))
    line = json.dumps({"name": "Ada", "age": 36, "active": True}) + "\n"
    inst.write_text(line * (PLAIN_KERNELS_MAX_BYTES // len(line) + 1))
    env = {"STRUCTGEN_GRAMMAR_CACHE": str(tmp_path / "gc")}
    for _ in range(2):  # compiled and stored, then loaded: a large input keeps numba either way
        got = _probe("validate", "-q", "--schema", schema, inst, env=env)
        assert got["rc"] == 0 and "numba" in got["modules"]
    got = _probe("validate", "-q", "--schema", schema, inst, env={**env, "STRUCTGEN_NATIVE": "0"})
    assert got["rc"] == 0 and "numba" not in got["modules"]


@pytest.mark.parametrize("name", ["config", "event", "invoice", "shape", "tree"])
def test_validate_verdicts_same_as_in_process(name: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The program (plain-Python kernels, grammar cache) and main() in this process give the same
    --json lines for every example instance."""
    from structgen.cli import main

    files = [SCHEMAS / f"{name}.valid.json", SCHEMAS / f"{name}.invalid.json"]
    rc = main(["validate", "--json", "--schema", str(SCHEMAS / f"{name}.schema.json"), *map(str, files)])
    expected = capsys.readouterr().out
    p = subprocess.run([sys.executable, "-m", "structgen", "validate", "--json", "--schema",
                        str(SCHEMAS / f"{name}.schema.json"), *map(str, files)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert (p.returncode, p.stdout) == (rc, expected) == (1, expected)


_IRI_CASES = [("iri", "http://ex.org/ä"), ("iri", "http://ex.org/a b"), ("iri", "no-scheme"),
              ("iri-reference", "#frag"), ("iri-reference", "ä:x y"), ("iri-reference", "//h/p?q#f")]


def test_jsonschema_iri_checks_unchanged_and_parser_deferred() -> None:
    plain = subprocess.run([sys.executable, "-c", (
        "import json, sys, jsonschema\n"
        "fc = jsonschema.Draft202012Validator.FORMAT_CHECKER\n"
        f"print(json.dumps([fc.conforms(v, f) for f, v in {_IRI_CASES!r}]))")],
        capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    ours = subprocess.run([sys.executable, "-c", (
        "import json, sys\n"
        "from structgen.frontends.json_schema.jsonschema_import import import_jsonschema\n"
        "fc = import_jsonschema().Draft202012Validator.FORMAT_CHECKER\n"
        "before = 'rfc3987_syntax' in sys.modules\n"
        f"got = [fc.conforms(v, f) for f, v in {_IRI_CASES!r}]\n"
        "print(json.dumps([before, type(sys.modules['rfc3987_syntax']).__name__, got]))")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ours.returncode == 0, ours.stderr
    before, kind, got = json.loads(ours.stdout)
    assert before is False and kind == "module"
    assert got == json.loads(plain.stdout)


# ---------------------------------------------------------------------------------------------
# stored grammars
# ---------------------------------------------------------------------------------------------

_KINDS = [  # one schema per rule kind the store writes
    ({"type": "string", "pattern": "^[a-z]{1,30}$", "not": {"pattern": "^ab"}}, ["abc", "xyz", "", "q1"]),
    ({"type": "string", "not": {"enum": ["aa", "bb"]}}, ["aa", "ab", "bb", "", "b"]),
    ({"type": "string", "maxLength": 300}, ["", "x" * 300, "x" * 301]),
    (SMALL, [{"name": "Ada", "age": 36, "active": True}, {"name": "Ada", "age": 151, "active": True},
             {"name": "A", "age": 1, "active": False, "email": "a@b.co", "tags": ["x"]}]),
]


def _texts(schema: Any, values: list[Any]) -> list[str]:
    out = []
    for v in values:
        try:
            out.append(canonical_json(v, schema))
        except Exception:  # noqa: BLE001 - values the schema rejects: plain JSON
            out.append(json.dumps(v, separators=(",", ":")))
    return out


def _same_language(a: Any, b: Any, texts: list[str]) -> None:
    for t in texts:
        data = t.encode()
        for i in range(len(data) + 1):
            assert a.accepts_prefix(data[:i]) == b.accepts_prefix(data[:i]), (t, i)
        assert a.accepts(data) == b.accepts(data), t


@pytest.mark.parametrize("case", range(len(_KINDS) + 5))
def test_store_round_trip(case: int, tmp_path: Path) -> None:
    if case < len(_KINDS):
        schema, values = _KINDS[case]
        texts = _texts(schema, values)
    else:
        name = ["config", "event", "invoice", "shape", "tree"][case - len(_KINDS)]
        schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
        texts = _texts(schema, [json.loads((SCHEMAS / f"{name}.{k}.json").read_text())
                                for k in ("valid", "invalid")])
    cg = compile_json_schema(schema)
    path = tmp_path / "g.npz"
    save_grammar(path, cg, "abc", {"warnings": ["w"]})
    got = load_grammar(path, "abc")
    assert got is not None
    loaded, meta = got
    assert meta == {"warnings": ["w"]}
    assert loaded.key == cg.key and loaded.root == cg.root
    assert [type(r) for r in loaded.rules] == [type(r) for r in cg.rules]
    assert [r.name for r in loaded.rules] == [r.name for r in cg.rules]
    _same_language(loaded, compile_json_schema(schema), texts)
    for a, b in zip(loaded.rules, cg.rules):  # a loaded NFA: the same arrays, lists and DFA states
        if isinstance(b, LazyRule):
            assert isinstance(a, LazyRule) and a.leaf == b.leaf and a.num_nfa_states == b.num_nfa_states
            for x, y in zip(a.csr(), b.csr()):
                assert x.dtype == y.dtype and np.array_equal(x, y)
            sa, sb = a.__getstate__(), b.__getstate__()
            assert all(sa[k] == sb[k] for k in ("name", "eps", "edges", "calls", "end", "nclass"))
            assert np.array_equal(sa["class_of"], sb["class_of"])
            ra, rb = a.info(0), b.info(0)
            assert np.array_equal(ra[0], rb[0]) and ra[1:] == rb[1:]
    with zipfile.ZipFile(path) as z:  # numpy arrays only: nothing that could hold a pickle
        assert all(n.endswith(".npy") for n in z.namelist())
    with np.load(path, allow_pickle=False) as z:
        assert all(z[n].dtype != object for n in z.files)


def _stored(tmp_path: Path) -> Path:
    path = tmp_path / "g.npz"
    save_grammar(path, compile_json_schema(_KINDS[1][0]), "abc")
    return path


def test_store_rejects_damaged_and_foreign_files(tmp_path: Path) -> None:
    path = _stored(tmp_path)
    good = path.read_bytes()
    assert load_grammar(path, "abd") is None  # filed under another key
    bad: list[bytes] = [b"", b"not a zip", good[: len(good) // 2]]
    with np.load(path, allow_pickle=False) as z:
        arrays = {n: z[n] for n in z.files}
    for name, array in arrays.items():  # one changed value in each array, checksum kept
        if name != "header" and array.size:
            changed = dict(arrays)
            flat = array.copy().reshape(-1)
            flat[0] = flat[0] ^ 1 if flat.dtype != np.bool_ else not flat[0]
            changed[name] = flat.reshape(array.shape)
            with open(tmp_path / "x.npz", "wb") as fh:
                np.savez(fh, **changed)  # type: ignore[arg-type]
            bad.append((tmp_path / "x.npz").read_bytes())
    header = json.loads(arrays["header"].tobytes())
    table = header["arrays"]
    for edit in ({"format": 999}, {"root": 99}, {"rules": [{"kind": "pickle", "name": "x"}]},
                 {"arrays": [[n, "|O", s, at] for n, _dt, s, at in table]},  # objects: never loaded
                 {"arrays": [[n, dt, s, at + (1 << 30)] for n, dt, s, at in table]},  # past the blob
                 {"arrays": [[n, dt, [d * 2 for d in s], at] for n, dt, s, at in table]}):
        forged = dict(arrays, header=np.frombuffer(json.dumps({**header, **edit}).encode(), dtype=np.uint8))
        with open(tmp_path / "x.npz", "wb") as fh:
            np.savez(fh, **forged)  # type: ignore[arg-type]
        bad.append((tmp_path / "x.npz").read_bytes())
    with open(tmp_path / "x.npz", "wb") as fh:  # an object array: loading it would unpickle
        np.savez(fh, header=np.array([{"format": 1}], dtype=object))  # type: ignore[arg-type]
    bad.append((tmp_path / "x.npz").read_bytes())
    for data in bad:
        path.write_bytes(data)
        assert load_grammar(path, "abc") is None


def test_store_folder_deletes_damaged_recompiles_and_bounds_size(tmp_path: Path) -> None:
    store = GrammarStore(tmp_path / "g", max_bytes=1 << 30)
    key = "ab" * 32
    cg = compile_json_schema(_KINDS[0][0])
    assert store.get(key) is None and store.put(key, cg, {"warnings": []})
    assert store.get(key) is not None
    store.path(key).write_bytes(b"garbage")
    assert store.get(key) is None and not store.path(key).exists()
    with pytest.raises(ValueError):
        store.path("../x")
    for i in range(6):
        k = f"{i:064x}"
        assert store.put(k, cg)
        os.utime(store.path(k), (1000 + i, 1000 + i))  # 0 is the least recently used
    store.max_bytes = sum(store.path(f"{i:064x}").stat().st_size for i in (3, 4, 5))
    store.trim()
    assert sorted(store.folder.glob("*.npz")) == [store.path(f"{i:064x}") for i in (3, 4, 5)]
    assert not store.path(f"{0:064x}").exists() and store.path(f"{5:064x}").exists()


def test_store_unwritable_folder_is_no_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = GrammarStore(blocker / "sub")  # cannot be made: a file is in the way
    assert store.put("ab" * 32, compile_json_schema(_KINDS[0][0])) is False
    assert store.get("ab" * 32) is None


def test_cached_compile_round_trip_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRUCTGEN_GRAMMAR_CACHE", str(tmp_path / "gc"))
    schema = {"type": "object", "properties": {"q": {"enum": ["x", "y"]}, "extra": {"minContains": 1}},
              "required": ["q"]}
    first = grammar_cache.compile_json_schema_cached(schema)
    files = list((tmp_path / "gc").glob("*.npz"))
    assert len(files) == 1
    again = grammar_cache.compile_json_schema_cached(schema)
    assert again is not first and again.key == first.key  # loaded from disk
    assert again.metadata["schema"] == schema and again.metadata["warnings"] == first.metadata["warnings"]
    _same_language(again, first, ['{"q":"x"}', '{"q":"z"}', '{"q":"y","extra":1}', "{}"])
    reordered = {"properties": schema["properties"], "required": ["q"], "type": "object"}
    grammar_cache.compile_json_schema_cached(reordered)  # key order is part of the key
    monkeypatch.setattr(grammar_cache, "_STAMP", "another structgen")
    grammar_cache.compile_json_schema_cached(schema)  # another compiler: another key
    assert len(list((tmp_path / "gc").glob("*.npz"))) == 3
    monkeypatch.setenv("STRUCTGEN_GRAMMAR_CACHE", "0")
    assert grammar_cache.cache_folder() is None
    monkeypatch.delenv("STRUCTGEN_GRAMMAR_CACHE")
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path / "root"))
    assert grammar_cache.cache_folder() == tmp_path / "root" / "grammars"


def test_warm_without_numba_says_so() -> None:
    p = subprocess.run([sys.executable, "-m", "structgen.warm"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, STRUCTGEN_NATIVE="0"))
    assert p.returncode == 0 and "nothing to compile" in p.stderr
