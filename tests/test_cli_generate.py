"""`structgen generate`, `models`, `bench` and `python -m structgen`: outputs, exit codes and the
one-line error of every usage error path.

A tiny random 2-layer Llama with the GPT-2 tokenizer, saved with ``save_pretrained`` to a temporary
folder, is the model (``--model FOLDER``). Oracles: jsonschema / pydantic / Lark's own parser for
the outputs, the Python API with ``speculative=False`` (plain constrained decoding) for greedy
equality, and the scraped Prometheus counters for the metrics.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import structgen
from structgen.cli import main

ROOT = Path(__file__).resolve().parent.parent

SCHEMA = {"type": "object", "properties": {"status": {"enum": ["open", "closed", "pending"]},
                                           "ok": {"type": "boolean"}},
          "required": ["status", "ok"], "additionalProperties": False}
OTHER = {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 3}
GRAMMAR = 'start: ANSWER PUNCT\nANSWER: "yes" | "no" | "maybe"\nPUNCT: "!" | "?"\n'


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line(err: str) -> str:
    """The whole of stderr must be exactly one line."""
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    (d / "s.json").write_text(json.dumps(SCHEMA))
    (d / "other.json").write_text(json.dumps(OTHER))
    (d / "g.lark").write_text(GRAMMAR)
    (d / "prompts.jsonl").write_text("\n".join(json.dumps(x) for x in [
        {"prompt": 'Ticket: {"status": "open", "ok": true}. JSON:', "id": "a"},
        {"prompt": "closed and not ok ->"},
        {"prompt": "Two letters:", "schema": "other.json"},
        {"prompt": "inline:", "schema": {"enum": ["red", "green"]}},
    ]) + "\n\n")
    (d / "messages.jsonl").write_text(json.dumps(
        {"messages": [{"role": "user", "content": "A ticket please."}]}) + "\n")
    return d


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_by_alias: Any) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer_by_alias("gpt2")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50304, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    d = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def lines_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


# ---------------------------------------------------------------------------------------------
# successful runs (tiny model)
# ---------------------------------------------------------------------------------------------

@pytest.mark.assets
@pytest.mark.model
def test_generate_prompts_file_mixed_schemas_and_metrics(model_dir: Path, files: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from test_metrics import label_values, parse_prometheus, value

    out, prom, js = tmp_path / "out.jsonl", tmp_path / "m.prom", tmp_path / "m.json"
    cfg = tmp_path / "spec.yaml"
    cfg.write_text("speculative_decoding:\n  batch_size: 2\n  draft_num: 4\n"
                   "generation:\n  max_new_tokens: 40\n  seed: 0\n")
    rc, stdout, err = run(capsys, "generate", "--model", model_dir, "--schema", files / "s.json",
                          "--prompts", files / "prompts.jsonl", "--config", cfg, "--out", out,
                          "--metrics-out", prom)
    assert rc == 0, err
    assert stdout == "" and "\r" not in err  # stderr is not a terminal: no progress bar
    res = lines_of(out.read_text())
    assert [r["index"] for r in res] == [0, 1, 2, 3] and res[0]["id"] == "a"
    schemas = [SCHEMA, SCHEMA, OTHER, {"enum": ["red", "green"]}]
    for r, schema in zip(res, schemas):
        assert r["finish_reason"] == "stop" and r["valid"] and r["errors"] == []
        assert r["value"] == json.loads(r["text"])
        jsonschema.validate(r["value"], schema)
    fams = parse_prometheus(prom.read_text())
    total = sum(r["num_tokens"] for r in res)
    assert value(fams, "structgen_output_tokens_total") == total
    assert sum(r["stats"]["new_tokens"] for r in res) == total
    assert total == (value(fams, "structgen_draft_tokens_accepted_total")
                     + value(fams, "structgen_bonus_tokens_total")
                     + value(fams, "structgen_free_tokens_total"))
    assert sum(label_values(fams, "structgen_drafter_accepted_tokens_total", "drafter").values()) == \
        value(fams, "structgen_draft_tokens_accepted_total")
    assert value(fams, "structgen_output_validity_ratio") == 1.0
    assert value(fams, "structgen_requests_total", status="valid") == 4
    assert value(fams, "structgen_alert", alert="min_validity") == 0

    # same run, JSON metrics to a file and the results on stdout
    rc, stdout, err = run(capsys, "generate", "--model", model_dir, "--schema", files / "s.json",
                          "--prompts", files / "prompts.jsonl", "--config", cfg, "--metrics-out", js)
    assert rc == 0
    assert [r["text"] for r in lines_of(stdout)] == [r["text"] for r in res]
    assert json.loads(js.read_text())["output_tokens"] == total


@pytest.mark.assets
@pytest.mark.model
def test_generate_greedy_equals_plain_decoding(model_dir: Path, files: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    prompt = 'The status is "pending" and ok is false: {"status": "pending", "ok": false}'
    got = {}
    for flag in ([], ["--no-speculative"]):
        rc, out, _ = run(capsys, "generate", "--model", model_dir, "--schema", files / "s.json",
                         "--prompt", prompt, "--max-new-tokens", 40, *flag)
        assert rc == 0
        (r,) = lines_of(out)
        got[bool(flag)] = r
    plain = structgen.generate(str(model_dir), schema=SCHEMA, prompt=prompt, max_new_tokens=40,
                               speculative=False)
    assert got[False]["text"] == got[True]["text"] == plain.text
    assert got[True]["stats"]["drafted"] == 0


@pytest.mark.assets
@pytest.mark.model
def test_generate_grammar_regex_messages_pydantic(model_dir: Path, files: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import lark

    rc, out, _ = run(capsys, "generate", "--model", model_dir, "--grammar", files / "g.lark",
                     "--prompt", "Answer:", "--max-new-tokens", 10, "--metrics-port", 0)
    assert rc == 0
    (r,) = lines_of(out)
    lark.Lark(GRAMMAR, parser="lalr").parse(r["text"])  # Lark's own parser is the oracle
    assert r["value"] is None and r["valid"]

    rc, out, _ = run(capsys, "generate", "--model", model_dir, "--regex", "[a-c]{2}-[0-9]",
                     "--prompt", "Code:", "--max-new-tokens", 10)
    assert rc == 0
    import re

    assert re.fullmatch("[a-c]{2}-[0-9]", lines_of(out)[0]["text"])

    rc, out, _ = run(capsys, "generate", "--model", model_dir, "--schema", files / "s.json",
                     "--prompts", files / "messages.jsonl", "--max-new-tokens", 40)
    assert rc == 0
    jsonschema.validate(lines_of(out)[0]["value"], SCHEMA)

    (tmp_path / "clitest_models.py").write_text(
        "from typing import Literal\nfrom pydantic import BaseModel, ConfigDict, field_validator\n"
        "class Ticket(BaseModel):\n    model_config = ConfigDict(extra='forbid')\n"
        "    status: Literal['open', 'closed']\n    ok: bool\n"
        "class Picky(BaseModel):\n    model_config = ConfigDict(extra='forbid')\n"
        "    status: Literal['open', 'closed']\n"
        "    @field_validator('status')\n    @classmethod\n"
        "    def never(cls, v):\n        raise ValueError('rejected by a validator')\n")
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run(capsys, "generate", "--model", model_dir, "--pydantic", "clitest_models:Ticket",
                     "--prompt", "Ticket:", "--max-new-tokens", 40)
    assert rc == 0
    value = lines_of(out)[0]["value"]
    assert set(value) == {"status", "ok"}
    # a validator the grammar cannot express: the output is invalid -> exit 1
    rc, out, err = run(capsys, "generate", "--model", model_dir, "--pydantic", "clitest_models:Picky",
                       "--prompt", "Ticket:", "--max-new-tokens", 40)
    assert rc == 1
    (r,) = lines_of(out)
    assert not r["valid"] and "rejected by a validator" in r["errors"][0]
    assert "1 invalid" in err and "warning: output validity rate 0.000" in err


@pytest.mark.assets
@pytest.mark.model
def test_incomplete_output_exit_1(model_dir: Path, files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "generate", "--model", model_dir, "--schema", files / "s.json",
                       "--prompt", "x", "--max-new-tokens", 2, "--on-budget", "cut")
    assert rc == 1
    (r,) = lines_of(out)
    assert r["finish_reason"] == "length" and not r["valid"] and r["value"] is None
    assert "1 incomplete" in err


@pytest.mark.assets
@pytest.mark.model
def test_budget_below_the_shortest_output_is_a_usage_error(model_dir: Path, files: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "generate", "--model", model_dir, "--schema", files / "s.json",
                       "--prompts", files / "prompts.jsonl", "--max-new-tokens", 3)
    assert rc == 2 and out == ""
    assert "prompts.jsonl:1" in err and "max_new_tokens=3 is too small" in err
    # closing (the default) within a small budget that fits: complete and valid
    rc, out, err = run(capsys, "generate", "--model", model_dir, "--schema", files / "s.json",
                       "--prompt", "x", "--max-new-tokens", 16)
    (r,) = lines_of(out)
    assert rc == 0 and r["valid"] and r["finish_reason"] in ("stop", "budget_close") and r["num_tokens"] <= 16


@pytest.mark.assets
@pytest.mark.model
def test_progress_bar_only_on_a_terminal(model_dir: Path, files: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    import io

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    fake = Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    rc = main(["generate", "--model", str(model_dir), "--schema", str(files / "s.json"),
               "--prompts", str(files / "prompts.jsonl"), "--max-new-tokens", "40", "--batch-size", "2"])
    assert rc == 0
    text = fake.getvalue()
    assert "\r" in text and "2/4 requests" in text and "4/4 requests" in text


# ---------------------------------------------------------------------------------------------
# usage errors: one line on stderr, exit 2, nothing on stdout
# ---------------------------------------------------------------------------------------------

def _bad_cases(d: Path, model: str) -> list[tuple[list[Any], str]]:
    (d / "notjson.json").write_text('{"type": ')
    (d / "malformed.json").write_text('{"type": "strin"}')
    (d / "unsupported.json").write_text('{"type": "object", "patternProperties": {"(?<=a)b": {}}}')
    (d / "bad.lark").write_text('start: "a" missing_rule\n')
    (d / "bad.yaml").write_text("speculative_decoding:\n  draft_num: 6\n  temprature: 0.7\n")
    (d / "badval.yaml").write_text("generation:\n  max_new_tokens: -3\n")
    (d / "p_badjson.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    (d / "p_noprompt.jsonl").write_text('{"text": "a"}\n')
    (d / "p_noschema.jsonl").write_text('{"prompt": "a"}\n')
    (d / "p_badschema.jsonl").write_text('{"prompt": "a", "schema": {"type": 3}}\n')
    (d / "p_missingschema.jsonl").write_text('{"prompt": "a", "schema": "nope.json"}\n')
    (d / "empty.jsonl").write_text("\n")
    (d / "nomodel").mkdir(exist_ok=True)
    s = d / "s.json"
    gen = ["generate", "--model", model]
    return [
        (gen + ["--schema", d / "missing.json", "--prompt", "x"], "cannot read schema"),
        (gen + ["--schema", d / "notjson.json", "--prompt", "x"], "not valid JSON"),
        (gen + ["--schema", d / "malformed.json", "--prompt", "x"], "/type"),
        (gen + ["--schema", d / "unsupported.json", "--prompt", "x"], "unsupported.json"),
        (gen + ["--grammar", d / "missing.lark", "--prompt", "x"], "cannot read"),
        (gen + ["--grammar", d / "bad.lark", "--prompt", "x"], "bad.lark:"),
        (gen + ["--regex", "a(b", "--prompt", "x"], "--regex"),
        (gen + ["--pydantic", "no_such_module_xyz:Model", "--prompt", "x"], "cannot import"),
        (gen + ["--pydantic", "json:JSONDecoder", "--prompt", "x"], "not a pydantic"),
        (gen + ["--pydantic", "nocolon", "--prompt", "x"], "pkg.module:Class"),
        (gen + ["--schema", s, "--prompt", "x", "--config", d / "bad.yaml"],
         f"{d / 'bad.yaml'}:3: speculative_decoding.temprature"),
        (gen + ["--schema", s, "--prompt", "x", "--config", d / "badval.yaml"],
         f"{d / 'badval.yaml'}:2: generation.max_new_tokens"),
        (gen + ["--schema", s, "--prompt", "x", "--config", d / "missing.yaml"], "cannot read"),
        (gen + ["--schema", s, "--prompts", d / "missing.jsonl"], "cannot read"),
        (gen + ["--schema", s, "--prompts", d / "p_badjson.jsonl"], "p_badjson.jsonl:2:"),
        (gen + ["--schema", s, "--prompts", d / "p_noprompt.jsonl"], "p_noprompt.jsonl:1:"),
        (gen + ["--prompts", d / "p_noschema.jsonl"], "p_noschema.jsonl:1: no constraint"),
        (gen + ["--prompts", d / "p_badschema.jsonl"], "p_badschema.jsonl:1:"),
        (gen + ["--prompts", d / "p_missingschema.jsonl"], "p_missingschema.jsonl:1:"),
        (gen + ["--schema", s, "--prompts", d / "empty.jsonl"], "no prompts"),
        (gen + ["--prompt", "x"], "give one of --schema"),
        (gen + ["--schema", s, "--prompt", ""], "empty"),
        (gen + ["--schema", s, "--prompt", "x", "--metrics-out", d / "m.txt"], ".json or .prom"),
        (gen + ["--schema", s, "--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens"),
        (gen + ["--schema", s, "--prompt", "x", "--temperature", "-1"], "temperature"),
        (gen + ["--schema", s, "--grammar", d / "bad.lark", "--prompt", "x"], "not allowed with"),
        (gen + ["--schema", s], "required"),
        (gen + ["--schema", s, "--prompt", "x", "--max-new-tokens", "many"], "invalid int"),
        (["generate", "--model", "no-such-model-alias", "--schema", s, "--prompt", "x"],
         "unknown model 'no-such-model-alias'"),
        (["generate", "--model", d / "nomodel", "--schema", s, "--prompt", "x"], "no config.json"),
        (["models", "pull", "no-such-alias"], "unknown alias 'no-such-alias'"),
        (["models", "path", "no-such-alias"], "unknown alias 'no-such-alias'"),
        (["models", "pull"], "give an alias"),
        (["models", "fetch", "gpt2"], "invalid choice"),
        (["config", "--check", d / "bad.yaml"], f"{d / 'bad.yaml'}:3:"),
    ]


def test_usage_errors_one_line_exit_2(files: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    for f in files.iterdir():
        shutil.copy(f, tmp_path / f.name)
    # none of these gets as far as loading a model: a folder that does not exist is fine
    for argv, fragment in _bad_cases(tmp_path, str(tmp_path / "never-loaded")):
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and out == "", (argv, rc, out, err)
        line = one_line(err)
        assert line.startswith(f"structgen {argv[0]}") and "error" in line, line
        assert fragment in line, (argv, line)


def test_missing_model_folder_is_unknown_model(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "generate", "--model", files / "nowhere", "--schema", files / "s.json",
                       "--prompt", "x")
    assert rc == 2 and out == "" and "unknown model" in one_line(err)


# ---------------------------------------------------------------------------------------------
# models, bench, python -m structgen
# ---------------------------------------------------------------------------------------------

def test_models_list(capsys: pytest.CaptureFixture[str]) -> None:
    from structgen.assets import pull as assets

    rc, out, _ = run(capsys, "models", "--json")
    assert rc == 0
    rows = lines_of(out)
    assert [r["alias"] for r in rows] == [*assets.TOKENIZERS, *assets.MODELS, *assets.CHAT_TEMPLATES]
    for r in rows:
        assert r["cached"] == (Path(r["path"]) / "manifest.json").is_file()
    rc, out, _ = run(capsys, "models")
    assert rc == 0 and all(a in out for a in assets.MODELS) and "(default)" in out


def test_models_path(capsys: pytest.CaptureFixture[str]) -> None:
    from structgen.assets import pull as assets

    cached = [r for r in assets.list_aliases() if r.cached]
    if not cached:
        pytest.skip("nothing cached")
    rc, out, _ = run(capsys, "models", "path", cached[0].alias)
    assert rc == 0 and Path(out.strip()) == cached[0].path and Path(out.strip()).is_dir()
    missing = [r for r in assets.list_aliases() if not r.cached]
    if missing:
        rc, out, err = run(capsys, "models", "path", missing[0].alias)
        assert rc == 1 and out == "" and "not cached" in one_line(err)


def test_bench_delegates_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    from structgen.cli import bench

    assert bench.suite_path() == Path(__file__).resolve().parents[1] / "benchmarks" / "bench_suite.py"
    seen: list[list[str]] = []
    fake = types.ModuleType(bench.SUITE)
    fake.main = lambda argv: seen.append(list(argv)) or 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, bench.SUITE, fake)  # what the import finds
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command adds the checkout's root to it
    assert main(["bench", "--smoke", "--out", "x"]) == 7
    assert seen == [["--smoke", "--out", "x"]]


def test_bench_outside_a_checkout_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from structgen.cli import bench

    # an installed wheel: no benchmarks/ beside the package
    monkeypatch.setattr(bench, "suite_path", lambda: tmp_path / "benchmarks" / "bench_suite.py")
    rc, out, err = run(capsys, "bench", "--smoke")
    assert rc == 2 and out == ""
    assert "source checkout" in one_line(err) and "python -m benchmarks.bench_suite" in one_line(err)


def test_python_dash_m() -> None:
    p = subprocess.run([sys.executable, "-m", "structgen", "models", "pull", "no-such-alias"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and "unknown alias" in one_line(p.stderr)
    p = subprocess.run([sys.executable, "-m", "structgen", "--version"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and structgen.__version__ in p.stdout


@pytest.mark.assets
@pytest.mark.model
def test_readme_flow_generate_then_validate(model_dir: Path, files: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The README's first steps: `structgen generate` on a schema, then `structgen validate` on
    what it wrote (`--values-out`), both exiting 0; jsonschema is the independent oracle."""
    values = tmp_path / "values.jsonl"
    rc, stdout, err = run(capsys, "generate", "--model", model_dir, "--schema", files / "s.json",
                          "--prompt", "A ticket, please:", "--max-new-tokens", "40",
                          "--values-out", values)
    assert rc == 0, err
    (line,) = lines_of(stdout)
    assert line["finish_reason"] == "stop"
    (text,) = values.read_text().splitlines()
    jsonschema.validate(json.loads(text), SCHEMA)
    rc, _out, err = run(capsys, "validate", "--schema", files / "s.json", values)
    assert rc == 0, err


def _sigint_at_default() -> None:
    """In the child before exec: SIGINT back at its default. A shell starts background jobs
    with SIGINT ignored and children inherit that; Python turns SIGINT into KeyboardInterrupt
    only where it starts at the default, so without this a CI runner started with ``&`` would
    make the child deaf to Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.assets
@pytest.mark.model
def test_ctrl_c_keeps_finished_results_and_exits_130(model_dir: Path, files: Path, tmp_path: Path) -> None:
    """SIGINT to a real `structgen generate` process in the middle of a many-request run: exit 130,
    a stderr line saying how many requests finished and where their lines are, the destinations
    untouched, and every finished request's lines whole in OUT.partial and VALUES.partial."""
    import os
    import time

    n = 400
    prompts = tmp_path / "many.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Ticket {i}:"}) + "\n" for i in range(n)))
    out, values = tmp_path / "out.jsonl", tmp_path / "values.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "structgen", "generate", "--model", str(model_dir), "--schema",
         str(files / "s.json"), "--prompts", str(prompts), "--out", str(out), "--values-out", str(values),
         "--batch-size", "1", "--max-new-tokens", "24"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "STRUCTGEN_NATIVE"},
        preexec_fn=_sigint_at_default)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:  # wait for finished requests
            temps = list(tmp_path.glob(".out.jsonl.*.tmp"))
            if temps and temps[0].read_text().count("\n") >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _stdout, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert not out.exists() and not values.exists()
    partial = Path(f"{out}.partial")
    res = lines_of(partial.read_text())
    done = len(res)
    assert 2 <= done < n
    assert [r["index"] for r in res] == list(range(done))
    assert len(Path(f"{values}.partial").read_text().splitlines()) == done
    assert f"interrupted: {done} of {n} request(s) finished; their result lines are in {partial}" in err
    assert f"the output written so far is in {values}.partial" in err
    assert "Traceback" not in err


def _demo_folder(root: Path) -> Path:
    d = root / "demo-schemas"
    d.mkdir(exist_ok=True)
    (d / "ticket.schema.json").write_text(json.dumps(SCHEMA))
    (d / "ticket.valid.json").write_text(json.dumps({"status": "open", "ok": True}))
    (d / "ticket.invalid.json").write_text(json.dumps({"status": "lost", "ok": True}))
    return d


@pytest.mark.assets
@pytest.mark.model
def test_demo_reports_rates_and_every_output_is_complete_and_valid(
        tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo prints each generation's speed and tokens per target pass; with the default
    budget rule even a tight --max-new-tokens gives a complete, valid value (exit 0)."""
    rc, out, err = run(capsys, "demo", "--schemas", _demo_folder(tmp_path), "--model", model_dir,
                       "--max-new-tokens", 24)
    assert rc == 0, out + err
    line = next(x for x in out.splitlines() if "generated in" in x)
    assert "(valid" in line and "tokens/s" in line and "tokens per target pass" in line, line
    value = json.loads(line.split("): ", 1)[1])
    assert jsonschema.Draft202012Validator(SCHEMA).is_valid(value)


def test_demo_fails_on_an_incomplete_output(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An output cut at the budget (on_budget="cut" behaviour) is a failed check: exit 1."""
    from structgen.generation.results import GenerationStats

    cut = types.SimpleNamespace(text='{"status":"op', finish_reason="length", stats=GenerationStats())
    monkeypatch.setattr(structgen, "generate", lambda **kw: cut)
    rc, out, err = run(capsys, "demo", "--schemas", _demo_folder(tmp_path), "--max-new-tokens", 24)
    assert rc == 1, out + err
    assert "FAILED: incomplete" in out and "1 check(s) failed" in err


@pytest.mark.assets
@pytest.mark.model
def test_generate_tools_and_reasoning(model_dir: Path, files: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}}]
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    rc, out, _ = run(capsys, "generate", "--model", model_dir, "--tools", tmp_path / "tools.json",
                     "--tool-choice", "required", "--tool-format", "hermes", "--prompt", "2+3?",
                     "--max-new-tokens", 60)
    (r,) = lines_of(out)
    assert rc == 0 and r["valid"] and r["tool_calls"], r
    for call in r["tool_calls"]:
        assert call["name"] == "add"
        jsonschema.validate(call["arguments"], tools[0]["function"]["parameters"])
    rc, out, _ = run(capsys, "generate", "--model", model_dir, "--schema", files / "s.json", "--reasoning",
                     "--thinking-budget", 5, "--prompt", "Think:", "--max-new-tokens", 60)
    (r,) = lines_of(out)
    assert rc == 0 and r["valid"] and r["reasoning"] is not None
    jsonschema.validate(json.loads(r["text"]), SCHEMA)
    rc, _, err = run(capsys, "generate", "--model", model_dir, "--tool-choice", "required",
                     "--prompt", "x", "--schema", files / "s.json")
    assert rc == 2 and "--tool-choice needs --tools" in one_line(err)
