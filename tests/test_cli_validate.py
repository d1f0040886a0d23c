"""`structgen validate`: input forms, error locations, output modes and exit codes.

The oracle is jsonschema itself (Draft202012Validator with its format checker): the CLI must
report exactly the errors jsonschema finds, at the right path and line. Most tests pass
``--no-grammar`` so they do not depend on the JSON Schema compiler; the grammar's part is tested
with stand-in compiled grammars and, when the real compiler exists, against jsonschema.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen.cli import main
from structgen.errors import UnsupportedFeatureError

ROOT = Path(__file__).resolve().parent.parent

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "price": {"type": "number", "minimum": 0},
                    "odd key": {"type": "string", "format": "date"},
                    "it's": {"type": "boolean"},
                },
                "required": ["price"],
            },
        },
        "name": {"type": "string", "maxLength": 5},
    },
    "required": ["items"],
}


def oracle_errors(instance: Any, schema: Any = SCHEMA) -> list[jsonschema.ValidationError]:
    cls = jsonschema.Draft202012Validator
    return list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(instance))


def pointer(path: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    p = tmp_path / "schema.json"
    p.write_text(json.dumps(SCHEMA))
    return p


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str | Path,
        stdin: bytes | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


VALID = {"items": [{"price": 1.5, "odd key": "2024-02-29"}], "name": "ab"}
INVALID_PRETTY = """{
  "items": [
    {"price": 1},
    {
      "price": "x",
      "odd key": "2023-02-29"
    }
  ],
  "name": "toolong"
}
"""


# ---------------------------------------------------------------------------------------------
# valid / invalid documents
# ---------------------------------------------------------------------------------------------

def test_valid_document_exit_0_and_no_output(tmp_path, schema_file, capsys, monkeypatch):
    f = write(tmp_path, "ok.json", json.dumps(VALID, indent=2))
    rc, out, err = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, f)
    assert rc == 0
    assert out == ""
    assert "1 valid, 0 invalid" in err


def test_pretty_document_errors_name_path_and_line_of_value(tmp_path, schema_file, capsys, monkeypatch):
    f = write(tmp_path, "bad.json", INVALID_PRETTY)
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, f)
    assert rc == 1
    lines = out.splitlines()
    expected = oracle_errors(json.loads(INVALID_PRETTY))
    assert len(lines) == len(expected) == 3
    assert f"{f}:5: $.items[1].price: \"x\" is not of type 'number'" in lines
    assert f"{f}:6: $.items[1]['odd key']: \"2023-02-29\" is not a 'date'" in lines
    assert f"{f}:9: $.name: \"toolong\" is too long" in lines


def test_odd_keys_are_quoted_and_escaped(tmp_path, schema_file, capsys, monkeypatch):
    f = write(tmp_path, "q.jsonl", json.dumps({"items": [{"price": 0, "it's": "no"}]}) + "\n")
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, f)
    assert rc == 1
    assert out == f"{f}:1: $.items[0]['it\\'s']: \"no\" is not of type 'boolean'\n"


# ---------------------------------------------------------------------------------------------
# JSON Lines, stdin, several files
# ---------------------------------------------------------------------------------------------

JSONL_LINES = [
    json.dumps(VALID),
    "",
    json.dumps({"items": [{"price": -1}]}),
    "   ",
    '{"items": [}',
    json.dumps({"items": []}),
    json.dumps({"name": 3}),
]


def expected_jsonl_report(name: str) -> list[str]:
    """The report built from jsonschema's errors, with the 1-based line of each instance."""
    out = []
    for lineno, text in enumerate(JSONL_LINES, start=1):
        if not text.strip():
            continue
        try:
            instance = json.loads(text)
        except ValueError:
            out.append((lineno, None))
            continue
        for e in oracle_errors(instance):
            out.append((lineno, e.json_path))
    return [f"{name}:{ln}:" + (f" {p}:" if p else " invalid JSON") for ln, p in out]


def test_json_lines_line_numbers_match_jsonschema(tmp_path, schema_file, capsys, monkeypatch):
    f = write(tmp_path, "data.jsonl", "\n".join(JSONL_LINES) + "\n")
    rc, out, err = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, f)
    assert rc == 1
    got = out.splitlines()
    want = expected_jsonl_report(str(f))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.startswith(w), (g, w)
    assert "5 instance(s): 2 valid, 3 invalid" in err


def test_stdin_dash(schema_file, capsys, monkeypatch):
    data = ("\n".join(JSONL_LINES) + "\n").encode()
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, "-", stdin=data)
    assert rc == 1
    want = expected_jsonl_report("<stdin>")
    assert [g[: len(w)] for g, w in zip(out.splitlines(), want)] == want


def test_stdin_single_pretty_document(schema_file, capsys, monkeypatch):
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, "-",
                     stdin=json.dumps(VALID, indent=4).encode())
    assert (rc, out) == (0, "")


def test_several_files_exit_1_if_any_invalid(tmp_path, schema_file, capsys, monkeypatch):
    ok = write(tmp_path, "ok.json", json.dumps(VALID))
    bad = write(tmp_path, "bad.json", INVALID_PRETTY)
    assert run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, ok, ok)[0] == 0
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, ok, bad)
    assert rc == 1 and all(line.startswith(f"{bad}:") for line in out.splitlines())


def test_single_line_document_is_one_instance(tmp_path, schema_file, capsys, monkeypatch):
    f = write(tmp_path, "one.json", json.dumps({"items": [{"price": -2}, {"price": "a"}]}))
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "--json", "-s", schema_file, f)
    assert rc == 1
    (obj,) = [json.loads(line) for line in out.splitlines()]
    assert [e["pointer"] for e in obj["errors"]] == ["/items/0/price", "/items/1/price"]


# ---------------------------------------------------------------------------------------------
# malformed input
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, line, fragment", [
    ("", 1, "empty input"),
    ("\n\n  \n", 1, "empty input"),
    ('{\n  "items": [\n    1\n    2\n  ]\n}\n', 4, "invalid JSON"),  # broken multi-line document
    ('{"items": NaN}\n', 1, "NaN is not valid JSON"),
    ('{"items": [Infinity]}', 1, "Infinity is not valid JSON"),
    ("[1, 2] [3]", 1, "Extra data"),
])
def test_malformed_json_is_invalid_with_line(tmp_path, schema_file, capsys, monkeypatch, text, line,
                                             fragment):
    f = write(tmp_path, "m.json", text)
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, f)
    assert rc == 1
    (msg,) = out.splitlines()
    assert msg.startswith(f"{f}:{line}: ") and fragment in msg


def test_broken_first_line_of_json_lines_keeps_the_rest(tmp_path, schema_file, capsys, monkeypatch):
    f = write(tmp_path, "m.jsonl", '{"items": [\n' + json.dumps({"items": [{"price": -1}]}) + "\n")
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, f)
    assert rc == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"{f}:1: invalid JSON")
    assert lines[1].startswith(f"{f}:2: $.items[0].price:")


def test_invalid_utf8_and_bom(tmp_path, schema_file, capsys, monkeypatch):
    bad = write(tmp_path, "u.jsonl", b'{"items": []}\n{"items": [], "name": "\xff"}\n')
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, bad)
    assert rc == 1 and out.startswith(f"{bad}:2: invalid UTF-8")
    bom = write(tmp_path, "bom.json", "\ufeff" + json.dumps(VALID))
    assert run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file, bom)[0] == 0


# ---------------------------------------------------------------------------------------------
# output modes
# ---------------------------------------------------------------------------------------------

def test_json_output_one_object_per_instance_matching_jsonschema(tmp_path, schema_file, capsys, monkeypatch):
    f = write(tmp_path, "data.jsonl", "\n".join(JSONL_LINES) + "\n")
    rc, out, err = run(capsys, monkeypatch, "validate", "--no-grammar", "--json", "-s", schema_file, f)
    assert rc == 1
    objs = [json.loads(line) for line in out.splitlines()]
    nonblank = [(i, t) for i, t in enumerate(JSONL_LINES, start=1) if t.strip()]
    assert [o["line"] for o in objs] == [i for i, _ in nonblank]
    for obj, (_, text) in zip(objs, nonblank):
        assert obj["file"] == str(f)
        assert obj["grammar"] is None
        try:
            instance = json.loads(text)
        except ValueError:
            assert not obj["valid"] and obj["errors"][0]["keyword"] == "json"
            continue
        want = oracle_errors(instance)
        assert obj["valid"] == (not want)
        assert [(e["pointer"], e["path"], e["keyword"]) for e in obj["errors"]] == [
            (pointer(w.absolute_path), w.json_path, w.validator) for w in want]
    assert "instance(s)" not in err  # no human summary in --json mode


def test_quiet_prints_nothing(tmp_path, schema_file, capsys, monkeypatch):
    f = write(tmp_path, "bad.json", INVALID_PRETTY)
    rc, out, err = run(capsys, monkeypatch, "validate", "--quiet", "-s", schema_file, f)
    assert (rc, out, err) == (1, "", "")


# ---------------------------------------------------------------------------------------------
# exit code 2: usage, unreadable files, malformed schemas
# ---------------------------------------------------------------------------------------------

def one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("schema_text, fragment", [
    ('{"type": ', "not valid JSON"),
    ('{"type": "strin"}', "/type"),
    ('{"minimum": "3"}', "/minimum"),
    ("[1]", "object or a boolean"),
    ('{"$schema": 5}', "$schema"),
    ('{"$ref": "https://example.invalid/s.json"}', "$ref"),
])
def test_malformed_schema_exit_2(tmp_path, capsys, monkeypatch, schema_text, fragment):
    s = write(tmp_path, "s.json", schema_text)
    f = write(tmp_path, "i.json", "{}")
    rc, out, err = run(capsys, monkeypatch, "validate", "-s", s, f)
    assert rc == 2 and out == ""
    assert fragment in one_line_error(err)


def test_missing_schema_file_exit_2(tmp_path, capsys, monkeypatch):
    f = write(tmp_path, "i.json", "{}")
    rc, _, err = run(capsys, monkeypatch, "validate", "-s", tmp_path / "nope.json", f)
    assert rc == 2 and "cannot read schema" in one_line_error(err)


def test_unreadable_file_exit_2_others_still_checked(tmp_path, schema_file, capsys, monkeypatch):
    bad = write(tmp_path, "bad.json", INVALID_PRETTY)
    rc, out, err = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", schema_file,
                       tmp_path / "missing.json", tmp_path, bad)
    assert rc == 2
    assert err.count("cannot read") == 2
    assert len(out.splitlines()) == 3  # bad.json was still validated


@pytest.mark.parametrize("argv", [
    ["validate"],
    ["validate", "-s", "x.json"],
    ["validate", "-s", "x.json", "-", "-"],
    ["nosuchcommand"],
    [],
    ["generate"],
    ["models", "pull"],
])
def test_usage_errors_exit_2(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.json").write_text("{}")
    rc, out, err = run(capsys, monkeypatch, *argv)
    assert rc == 2 and out == "" and err


def test_help_and_version_exit_0(capsys, monkeypatch):
    assert run(capsys, monkeypatch, "--version")[0] == 0
    rc, out, _ = run(capsys, monkeypatch, "validate", "--help")
    assert rc == 0 and "JSON Lines" in out


def test_unknown_schema_dialect_is_a_note_and_validates_as_2020_12(tmp_path, capsys, monkeypatch):
    s = write(tmp_path, "s.json", json.dumps({"$schema": "https://example.com/mine", "type": "integer"}))
    f = write(tmp_path, "i.jsonl", "1\n1.5\n")
    rc, out, err = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", s, f)
    assert rc == 1 and out.startswith(f"{f}:2: $: 1.5 is not of type 'integer'")
    assert "unknown $schema" in err


def test_draft7_schema_uses_draft7_semantics(tmp_path, capsys, monkeypatch):
    # Draft 7 tuple `items` (an array); under 2020-12 this schema would be malformed.
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]}
    s = write(tmp_path, "s.json", json.dumps(schema))
    f = write(tmp_path, "i.jsonl", '["a", 1]\n[1]\n')
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "-s", s, f)
    assert rc == 1 and out.splitlines() == [f"{f}:2: $[0]: 1 is not of type 'string'"]


# ---------------------------------------------------------------------------------------------
# the compiled grammar's verdict (stand-ins for the JSON Schema compiler module)
# ---------------------------------------------------------------------------------------------

COMPILER = "structgen.frontends.json_schema.compiler"


def fake_json_schema(monkeypatch: pytest.MonkeyPatch, *, accepts: bool | None = None,
                     raises: Exception | None = None) -> list[str]:
    """Install a stand-in for the compiler module the validator and `compile` import
    (:data:`COMPILER`); returns the list of texts the grammar saw."""
    seen: list[str] = []

    class Grammar:
        def accepts(self, text: str) -> bool:
            seen.append(text)
            return bool(accepts)

    def compile_json_schema(schema: Any, **options: Any) -> Grammar:
        if raises is not None:
            raise raises
        return Grammar()

    def canonical_json(instance: Any, schema: Any, **options: Any) -> str:
        return json.dumps(instance, separators=(",", ":"), ensure_ascii=False)

    mod = types.ModuleType(COMPILER)
    mod.compile_json_schema = compile_json_schema  # type: ignore[attr-defined]
    mod.canonical_json = canonical_json  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, COMPILER, mod)
    monkeypatch.setenv("STRUCTGEN_GRAMMAR_CACHE", "0")  # a stored grammar would bypass the stand-in
    return seen


def test_unsupported_feature_is_a_note_exit_code_unaffected(tmp_path, schema_file, capsys, monkeypatch):
    fake_json_schema(monkeypatch, raises=UnsupportedFeatureError("cannot do this", pointer="/x",
                                                                  keyword="dependentSchemas"))
    f = write(tmp_path, "ok.json", json.dumps(VALID))
    rc, out, err = run(capsys, monkeypatch, "validate", "-s", schema_file, f)
    assert (rc, out) == (0, "")
    assert "note: grammar check off" in err and "dependentSchemas" in err and "jsonschema only" in err


def test_grammar_rejection_of_a_jsonschema_valid_instance_is_an_error(tmp_path, schema_file, capsys,
                                                                       monkeypatch):
    seen = fake_json_schema(monkeypatch, accepts=False)
    f = write(tmp_path, "ok.json", json.dumps(VALID, indent=2))
    rc, out, _ = run(capsys, monkeypatch, "validate", "--json", "-s", schema_file, f)
    assert rc == 1
    (obj,) = [json.loads(line) for line in out.splitlines()]
    assert obj["grammar"] is False and [e["keyword"] for e in obj["errors"]] == ["grammar"]
    assert seen == [json.dumps(VALID, separators=(",", ":"))]  # the canonical text, not the file's


def test_grammar_accepting_an_invalid_instance_is_noted(tmp_path, schema_file, capsys, monkeypatch):
    fake_json_schema(monkeypatch, accepts=True)
    f = write(tmp_path, "bad.json", INVALID_PRETTY)
    rc, out, err = run(capsys, monkeypatch, "validate", "-s", schema_file, f)
    assert rc == 1 and len(out.splitlines()) == 3
    assert "over-approximates" in err


def test_no_grammar_check_without_compiler(tmp_path, schema_file, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, COMPILER, None)  # import fails
    f = write(tmp_path, "ok.json", json.dumps(VALID))
    rc, out, err = run(capsys, monkeypatch, "validate", "-s", schema_file, f)
    assert (rc, out) == (0, "") and "grammar check unavailable" in err


def real_compiler_or_skip() -> None:
    try:
        from structgen.json_schema import canonical_json, compile_json_schema  # noqa: F401
    except ImportError as e:
        pytest.skip(f"structgen.json_schema is not available yet: {e}")


def test_real_grammar_agrees_with_jsonschema_on_samples(tmp_path, capsys, monkeypatch):
    real_compiler_or_skip()
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0},
                                               "b": {"type": "string", "maxLength": 3}},
              "required": ["a"], "additionalProperties": False}
    instances = [{"a": 1}, {"a": 0, "b": "xyz"}, {"b": "x", "a": 7}, {"a": -1}, {"a": 1, "c": 2},
                 {"a": "1"}, {"a": 1, "b": "long"}, [], {"a": 1.0}]
    s = write(tmp_path, "s.json", json.dumps(schema))
    f = write(tmp_path, "i.jsonl", "\n".join(json.dumps(i) for i in instances) + "\n")
    rc, out, err = run(capsys, monkeypatch, "validate", "--json", "-s", s, f)
    objs = [json.loads(line) for line in out.splitlines()]
    if all(o["grammar"] is None for o in objs):
        pytest.skip(f"the compiler did not compile this schema here: {err.strip()}")
    for inst, obj in zip(instances, objs):
        assert obj["valid"] == (not oracle_errors(inst, schema)), (inst, obj)
        assert obj["grammar"] == obj["valid"], (inst, obj)
    assert rc == 1


# ---------------------------------------------------------------------------------------------
# properties against the jsonschema oracle
# ---------------------------------------------------------------------------------------------

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-5, 5, allow_nan=False),
                      st.text(max_size=8))
json_values = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(["items", "price", "name", "odd key", "x"]),
                                            inner, max_size=4)),
    max_leaves=12)
item_like = st.fixed_dictionaries({"items": st.lists(st.fixed_dictionaries(
    {"price": st.one_of(st.integers(-3, 3), st.text(max_size=2))},
    optional={"odd key": st.sampled_from(["2024-01-31", "2024-02-30", "x"]), "it's": st.booleans()}),
    max_size=3)}, optional={"name": st.text(max_size=7)})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.one_of(json_values, item_like), min_size=1, max_size=6))
def test_jsonl_verdicts_equal_jsonschema(tmp_path, schema_file, capsys, monkeypatch, values):
    f = write(tmp_path, "h.jsonl", "\n".join(json.dumps(v) for v in values) + "\n")
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "--json", "-s", schema_file, f)
    objs = [json.loads(line) for line in out.splitlines()]
    assert len(objs) == len(values)
    for i, (v, obj) in enumerate(zip(values, objs), start=1):
        want = oracle_errors(v)
        assert obj["line"] == i
        assert [e["pointer"] for e in obj["errors"]] == [pointer(w.absolute_path) for w in want]
    assert rc == (1 if any(not o["valid"] for o in objs) else 0)


# every integer leaf is an error; integers are made unique so their line can be found by search
EVERY_INTEGER_FAILS = {"if": {"type": "integer"}, "then": False,
                       "else": {"items": {"$ref": "#"}, "additionalProperties": {"$ref": "#"}}}
tree_values = st.recursive(
    st.one_of(st.just(0), st.text(alphabet="abc ", max_size=3), st.booleans()),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(alphabet="abcdef", min_size=1, max_size=3), inner,
                                            max_size=4)),
    max_leaves=15)


def number_integers(v: Any, counter: list[int]) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        counter[0] += 1
        return 1000 + counter[0]
    if isinstance(v, list):
        return [number_integers(x, counter) for x in v]
    if isinstance(v, dict):
        return {k: number_integers(x, counter) for k, x in v.items()}
    return v


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=tree_values, indent=st.sampled_from([0, 1, 2, 4, "\t"]))
def test_error_lines_in_pretty_documents(tmp_path, capsys, monkeypatch, value, indent):
    value = number_integers(value, [0])
    text = json.dumps(value, indent=indent)
    s = write(tmp_path, "s.json", json.dumps(EVERY_INTEGER_FAILS))
    f = write(tmp_path, "doc.json", text + "\n")
    rc, out, _ = run(capsys, monkeypatch, "validate", "--no-grammar", "--json", "-s", s, f)
    (obj,) = [json.loads(line) for line in out.splitlines()]
    want = oracle_errors(value, EVERY_INTEGER_FAILS)
    assert [e["pointer"] for e in obj["errors"]] == [pointer(w.absolute_path) for w in want]
    multi_line = "\n" in text
    for e, w in zip(obj["errors"], want):
        if multi_line:
            (line,) = [i for i, t in enumerate(text.splitlines(), start=1) if str(w.instance) in t]
        else:
            line = 1
        assert e["line"] == line
    assert rc == (1 if want else 0)


# ---------------------------------------------------------------------------------------------
# validate does not need torch
# ---------------------------------------------------------------------------------------------

def test_validate_does_not_import_torch(tmp_path, schema_file):
    f = write(tmp_path, "bad.json", INVALID_PRETTY)
    code = (
        "import sys\n"
        "from structgen.cli import main\n"
        f"rc = main(['validate', '--quiet', '-s', {str(schema_file)!r}, {str(f)!r}])\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules)\n"
        "print(rc, heavy)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "1 []"


def test_python_dash_m_structgen(tmp_path, schema_file):
    f = write(tmp_path, "ok.jsonl", json.dumps(VALID) + "\n")
    proc = subprocess.run([sys.executable, "-m", "structgen", "validate", "--no-grammar", "-s",
                           str(schema_file), str(f)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------
# compile and demo (wiring; the compilers have their own tests)
# ---------------------------------------------------------------------------------------------

def test_compile_lark_reports_sizes_and_explains(tmp_path, capsys, monkeypatch):
    pytest.importorskip("structgen.frontends.lark")
    g = write(tmp_path, "g.lark", 'start: "a" b+\nb: "x" | "y"\n')
    rc, out, _ = run(capsys, monkeypatch, "compile", "--json", g)
    assert rc == 0
    info = json.loads(out)
    assert info["ok"] and info["states"] > 0 and info["compile_ms"] >= 0
    rc, out, _ = run(capsys, monkeypatch, "compile", "--explain", g)
    assert rc == 0 and "Grammar(start='start')" in out


def test_compile_bad_grammar_exit_2_with_caret(tmp_path, capsys, monkeypatch):
    pytest.importorskip("structgen.frontends.lark")
    g = write(tmp_path, "bad.lark", 'start: "a" (\n')
    rc, out, err = run(capsys, monkeypatch, "compile", g)
    assert rc == 2 and out == ""
    assert "line 1" in err and "^" in err


def test_compile_unsupported_lists_pointer_exit_1(tmp_path, capsys, monkeypatch):
    fake_json_schema(monkeypatch, raises=UnsupportedFeatureError("not enforceable", pointer="/properties/a",
                                                                  keyword="dependentSchemas"))
    s = write(tmp_path, "s.json", json.dumps({"properties": {"a": {}}}))
    rc, out, _ = run(capsys, monkeypatch, "compile", s)
    assert rc == 1
    assert out.strip() == f"{s}: unsupported: /properties/a: not enforceable [dependentSchemas]"


def make_demo(tmp_path: Path, *, break_valid: bool = False) -> Path:
    d = tmp_path / "schemas"
    d.mkdir()
    (d / "shop.schema.json").write_text(json.dumps(SCHEMA))
    valid = [VALID, {"items": []}] + ([{"items": "no"}] if break_valid else [])
    (d / "shop.valid.jsonl").write_text("\n".join(json.dumps(v) for v in valid) + "\n")
    (d / "shop.invalid.json").write_text(INVALID_PRETTY)
    (d / "point").mkdir()
    (d / "point" / "schema.json").write_text(json.dumps({"type": "array", "maxItems": 2}))
    (d / "point" / "valid.json").write_text("[1, 2]")
    (d / "point" / "invalid-long.jsonl").write_text("[1, 2, 3]\n{}\n")
    return d


def test_demo_checks_samples(tmp_path, capsys, monkeypatch):
    d = make_demo(tmp_path)
    rc, out, _ = run(capsys, monkeypatch, "demo", "--no-generate", "--schemas", d)
    assert rc == 0, out
    assert "shop:" in out and "valid samples 2/2 as expected" in out
    assert "point:" in out and "invalid samples 2/2 as expected" in out


def test_demo_fails_on_unexpected_verdict(tmp_path, capsys, monkeypatch):
    d = make_demo(tmp_path, break_valid=True)
    rc, out, err = run(capsys, monkeypatch, "demo", "--no-generate", "--schemas", d)
    assert rc == 1 and "valid samples 2/3 as expected" in out and "1 check(s) failed" in err


def test_demo_without_schemas_exit_2(tmp_path, capsys, monkeypatch):
    rc, _, err = run(capsys, monkeypatch, "demo", "--no-generate", "--schemas", tmp_path)
    assert rc == 2 and "no example schemas" in err
