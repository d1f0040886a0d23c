"""The one front door (structgen.frontends.constraint): every entry point reads oddly named
schema files as files, and gives the same grammar (same ``CompiledGrammar.key``) for the same
constraint.

Oracles: each schema file pins one value (``{"k": i}``), so a grammar that accepts exactly that
value and not its neighbour was compiled from that file; keys are compared against the front door
called directly with the schema *value* (no file involved)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from structgen.config import JsonSchemaOptions
from structgen.errors import ConfigError, GrammarError, SchemaError
from structgen.frontends.constraint import compile_constraint, constraint_kind, schema_from

# the benchmark suite (benchmarks/bench_suite.py) is one of the entry points compared here

# names a first-character test would take for JSON text (t/f/n/[/{ and digits)
ODD_NAMES = ["true_schema.json", "fields.json", "false", "null.json", "[a].json", "{x}.json", "1.json"]


def _schema(i: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"k": {"const": i}}, "required": ["k"],
            "additionalProperties": False}


@pytest.fixture()
def odd_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for i, name in enumerate(ODD_NAMES):
        (tmp_path / name).write_text(json.dumps(_schema(i)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _pins(g: Any, i: int) -> bool:
    return g.accepts(json.dumps({"k": i}, separators=(",", ":"))) and \
        not g.accepts(json.dumps({"k": i + 1}, separators=(",", ":")))


def test_every_library_entry_point_reads_odd_file_names(odd_files: Path) -> None:
    from benchmarks.bench_suite import _constraint
    from structgen.generation.api import resolve_grammar
    from structgen.integrations import StructgenBackend
    from structgen.integrations import compile_constraint as integration_compile
    from structgen.masks.vocab import Vocabulary

    backend = StructgenBackend(vocab=Vocabulary([b"a", None], eos_token_ids=[1]))
    for i, name in enumerate(ODD_NAMES):
        expected = compile_constraint("json", _schema(i)).key
        got = {
            "front door, Path": compile_constraint("json", Path(name)),
            "resolve_grammar, Path": resolve_grammar(schema=Path(name))[0],
            "integrations, Path": integration_compile("json", Path(name)),
            "backend, Path": backend.compile("json", Path(name)),
            "bench task, Path": resolve_grammar(**_constraint({"schema": Path(name)}))[0],
        }
        if name != "false":  # the str "false" is the boolean schema (next test)
            got["front door, str as path"] = compile_constraint("json", name, strings_may_be_paths=True)
            got["resolve_grammar, str"] = resolve_grammar(schema=name)[0]
            got["bench task, str"] = resolve_grammar(**_constraint({"schema": name}))[0]
        for where, g in got.items():
            assert _pins(g, i), (name, where)
            assert g.key == expected, (name, where)


def test_strings_are_text_where_a_request_hands_them_over(odd_files: Path) -> None:
    from structgen.generation.api import resolve_grammar
    from structgen.integrations import compile_constraint as integration_compile

    # JSON text always wins for a str: "false" is the schema that accepts nothing, "true" the
    # one that accepts everything; the Path reads the file of that name
    assert schema_from("false") is False and schema_from(Path("false")) == _schema(2)
    with pytest.raises(SchemaError, match="unsatisfiable"):
        resolve_grammar(schema="false")
    assert resolve_grammar(schema="true")[0].accepts("[1]")
    for name in (n for n in ODD_NAMES if n != "false"):  # a request's string is never a file name
        with pytest.raises(SchemaError, match="pass a pathlib.Path"):
            integration_compile("json", name)
        with pytest.raises(SchemaError, match="pass a pathlib.Path"):
            compile_constraint("json", name)


def test_same_constraint_same_key_across_entry_points(tmp_path: Path) -> None:
    from benchmarks.bench_suite import _constraint
    from structgen.generation.api import resolve_grammar
    from structgen.integrations import StructgenBackend
    from structgen.integrations import compile_constraint as integration_compile
    from structgen.masks.vocab import Vocabulary

    backend = StructgenBackend(vocab=Vocabulary([b"a", None], eos_token_ids=[1]))
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                               "n": {"type": "integer", "minimum": 0}},
              "required": ["name"], "additionalProperties": False}
    lark = 'start: "yes" | "no" NUM\nNUM: /[0-9]+/\n'
    (tmp_path / "g.lark").write_text(lark)
    (tmp_path / "s.json").write_text(json.dumps(schema))
    schema_key = compile_constraint("json", schema).key
    for g in (resolve_grammar(schema=schema)[0], resolve_grammar(schema=json.dumps(schema))[0],
              resolve_grammar(schema=tmp_path / "s.json")[0], integration_compile("JSON", schema),
              integration_compile("json", json.dumps(schema)), backend.compile("json", schema),
              resolve_grammar(**_constraint({"schema": schema}))[0],
              compile_constraint("json", schema, json_options=JsonSchemaOptions(string_escapes="canonical"))):
        assert g.key == schema_key
    # validation's grammar (every JSON spelling) is a different language, hence a different key
    assert compile_constraint("json", schema, for_generation=False).key != schema_key
    lark_key = compile_constraint("grammar", lark).key
    for g in (compile_constraint("lark", tmp_path / "g.lark"), resolve_grammar(grammar=lark)[0],
              resolve_grammar(grammar=tmp_path / "g.lark")[0], integration_compile("grammar", lark),
              backend.compile("lark", lark), resolve_grammar(**_constraint({"grammar": lark}))[0]):
        assert g.key == lark_key
    regex_key = compile_constraint("regex", "[a-c]{2,4}x").key
    for g in (resolve_grammar(regex="[a-c]{2,4}x")[0], integration_compile("regex", "[a-c]{2,4}x"),
              backend.compile("regex", "[a-c]{2,4}x")):
        assert g.key == regex_key
    choice = compile_constraint("choice", ["ab", "c"])
    assert choice.accepts("ab") and choice.accepts("c") and not choice.accepts('"c"')
    assert integration_compile("choice", '["ab", "c"]').key == backend.compile("choice", ["ab", "c"]).key \
        == choice.key
    assert compile_constraint("json_object").key == compile_constraint("json", {"type": "object"}).key
    # a compiled grammar is passed through untouched
    assert compile_constraint("grammar", choice) is choice and resolve_grammar(grammar=choice)[0] is choice


def test_model_classes_are_duck_typed() -> None:
    class Model:  # shaped like a Pydantic v2 model: no pydantic needed
        @classmethod
        def model_json_schema(cls) -> dict[str, Any]:
            return {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                    "additionalProperties": False}

    class Broken:
        @classmethod
        def model_json_schema(cls) -> dict[str, Any]:
            raise RuntimeError("cannot describe a callable field")

    from structgen.generation.api import resolve_grammar

    g, model = resolve_grammar(schema=Model)
    assert model is Model and g.key == compile_constraint("json", Model.model_json_schema()).key
    assert g.accepts('{"ok":true}') and not g.accepts("{}")
    with pytest.raises(SchemaError, match="Broken has no JSON schema: RuntimeError"):
        compile_constraint("json", Broken)
    with pytest.raises(SchemaError, match="not type"):
        compile_constraint("json", int)


def test_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown request_type"):
        constraint_kind("yaml")
    with pytest.raises(ConfigError, match="request_type must be a string"):
        constraint_kind(3)
    with pytest.raises(ConfigError, match="'grammar' spec must be Lark grammar text"):
        compile_constraint("grammar", 5)
    with pytest.raises(ConfigError, match="'regex' spec must be a string"):
        compile_constraint("regex", Path("x"))
    with pytest.raises(ConfigError, match="non-empty list"):
        compile_constraint("choice", [])
    with pytest.raises(GrammarError, match="cannot read"):
        compile_constraint("grammar", tmp_path / "missing.lark")
    (tmp_path / "latin1.lark").write_bytes(b'start: "\xe9"\n')
    with pytest.raises(GrammarError, match="invalid UTF-8 at byte 8"):
        compile_constraint("grammar", tmp_path / "latin1.lark")
    with pytest.raises(SchemaError, match="cannot read schema"):
        compile_constraint("json", tmp_path / "missing.json")
    with pytest.raises(SchemaError, match="cannot read schema"):
        compile_constraint("json", Path("nul\0byte.json"))


CLI_NAMES = [(i, n) for i, n in enumerate(ODD_NAMES) if n in ("true_schema.json", "fields.json", "false")]


def test_cli_compile_and_validate_read_odd_file_names(odd_files: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`compile` and `validate` take file arguments as paths; `compile` gives the front door's
    generation grammar, `compile --validation` its validation grammar (every JSON spelling)."""
    from structgen.cli import main

    for i, name in CLI_NAMES:
        assert main(["compile", "--json", name]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["key"] == compile_constraint("json", _schema(i)).key[:16], name
        assert main(["compile", "--json", "--validation", name]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["key"] == compile_constraint("json", _schema(i), for_generation=False).key[:16], name
        (odd_files / "d.jsonl").write_text(json.dumps({"k": i}) + "\n" + json.dumps({"k": i + 1}) + "\n")
        assert main(["validate", "--no-grammar", "--schema", name, "d.jsonl"]) == 1  # line 2 invalid
        assert "d.jsonl:2" in capsys.readouterr().out


def test_cli_generate_reads_odd_file_names_through_the_front_door(
        odd_files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`generate --schema` takes its argument as a path and compiles the front door's generation
    grammar (recorded where the front door calls the JSON Schema compiler)."""
    from structgen.cli import main
    from structgen.frontends.json_schema import compiler

    seen: list[Any] = []
    real = compiler.compile_json_schema

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(compiler, "compile_json_schema", recording)
    for i, name in CLI_NAMES:
        seen.clear()
        # no model is loaded: the constraint is compiled and checked first, then the model is missing
        rc = main(["generate", "--model", str(odd_files / "no-model"), "--schema", name, "--prompt", "x"])
        assert rc == 2 and "unknown model" in capsys.readouterr().err
        assert [g.key for g in seen] == [compile_constraint("json", _schema(i)).key], name
