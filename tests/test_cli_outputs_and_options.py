"""The command line and the API under bad input: no lost output, a context-length check, every
option validated where it enters, and batch errors that name their request.

Oracles: the files' bytes before and after a run (and ``os.stat`` for what else is in the
folder), the model configuration's own context size, Python's ``math``/``json`` for the values
the options must refuse, and a forward hook on the torch model counting the passes actually run.
The models are tiny random Llama / GPT-2 models (tests/_tiny_lm.py) over the GPT-2 tokenizer.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

import structgen
from structgen.cli import main
from structgen.config import (
    CompileOptions,
    GenerationOptions,
    JsonSchemaOptions,
    MonitoringOptions,
    SpecConfig,
)
from structgen.errors import ConfigError, ContextLengthError, SchemaError, StructgenError
from structgen.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent

SCHEMA = {"type": "object", "properties": {"status": {"enum": ["open", "closed"]}, "ok": {"type": "boolean"}},
          "required": ["status", "ok"], "additionalProperties": False}
BAD_SCHEMA = {"type": "strin"}
ORIGINAL = '{"precious": "data that must survive a failed run"}\n'


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def leftovers(folder: Path, keep: set[str]) -> list[str]:
    """Files in ``folder`` other than ``keep``: temporary or partial files left behind."""
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def _save(folder: Path, model: Any, tok: Any) -> Path:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gpt2_tok(tokenizer_by_alias: Any) -> Any:
    return tokenizer_by_alias("gpt2")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_tok: Any) -> Path:
    """The biased tiny Llama (finishes JSON quickly), context 1024."""
    from _tiny_lm import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"), gpt2_tok, "biased")


@pytest.fixture(scope="module")
def small_ctx_llama(gpt2_tok: Any) -> Any:
    """The tiny Llama with a context of 64 positions (rotary: it would run past it silently)."""
    from _tiny_lm import build_tiny_llama

    model = build_tiny_llama(gpt2_tok, "biased")
    model.config.max_position_embeddings = 64
    return model


@pytest.fixture(scope="module")
def small_ctx_dir(tmp_path_factory: pytest.TempPathFactory, small_ctx_llama: Any, gpt2_tok: Any) -> Path:
    return _save(tmp_path_factory.mktemp("tiny-ctx64"), small_ctx_llama, gpt2_tok)


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n"
                                                    for p in ("Ticket:", "Another ticket:")))
    (tmp_path / "out.jsonl").write_text(ORIGINAL)
    return tmp_path


GEN = ("--schema", "s.json", "--prompts", "prompts.jsonl", "--max-new-tokens", "24")


# ---------------------------------------------------------------------------------------------
# 2. outputs: never truncated before the run succeeded; an output never overwrites an input
# ---------------------------------------------------------------------------------------------

@pytest.mark.assets
def test_model_that_cannot_load_keeps_existing_output(files: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files)
    broken = files / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    for model in (broken, files / "no-such-folder"):
        rc, out, err = run(capsys, "generate", "--model", model, *GEN, "-o", "out.jsonl",
                           "--values-out", "values.jsonl")
        assert rc == 2 and out == "", err
        assert "error" in err.splitlines()[0]
        assert (files / "out.jsonl").read_text() == ORIGINAL
        # nothing was written: no partial file, no temporary file, no empty values file
        assert leftovers(files, {"s.json", "prompts.jsonl", "out.jsonl", "broken-model"}) == []


@pytest.mark.assets
@pytest.mark.model
def test_metrics_port_taken_keeps_existing_output(files: Path, model_dir: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        rc, out, err = run(capsys, "generate", "--model", model_dir, *GEN, "-o", "out.jsonl",
                           "--metrics-port", port)
    assert rc == 2 and out == ""
    assert f"--metrics-port {port}" in err.splitlines()[0]
    assert (files / "out.jsonl").read_text() == ORIGINAL
    assert leftovers(files, {"s.json", "prompts.jsonl", "out.jsonl"}) == []


@pytest.mark.assets
def test_unwritable_output_fails_before_any_work(files: Path, model_dir: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files)
    for flag in ("--metrics-out", "--values-out"):
        rc, out, err = run(capsys, "generate", "--model", model_dir, *GEN, "-o", "out.jsonl",
                           flag, "no-such-folder/m.json")
        assert rc == 2 and out == ""
        assert f"{flag}: cannot write no-such-folder/m.json" in one_line(err)
        assert (files / "out.jsonl").read_text() == ORIGINAL
        assert leftovers(files, {"s.json", "prompts.jsonl", "out.jsonl"}) == []


def _same_path_cases(d: Path) -> list[tuple[list[str], str]]:
    """(argv, fragment of the error): an output that is an input or another output."""
    (d / "spec.yaml").write_text("generation:\n  max_new_tokens: 8\n")
    (d / "g.lark").write_text('start: "yes" | "no"\n')
    (d / "per-line.jsonl").write_text(json.dumps({"prompt": "a", "schema": "s.json"}) + "\n")
    os.symlink(d / "prompts.jsonl", d / "link.jsonl")
    os.link(d / "prompts.jsonl", d / "hard.jsonl")
    os.symlink(d, d / "dirlink")
    gen = ["generate", "--model", str(d / "never-loaded")]
    return [
        (gen + ["--schema", "s.json", "--prompts", "prompts.jsonl", "-o", "prompts.jsonl"], "--prompts"),
        (gen + ["--schema", "s.json", "--prompts", "prompts.jsonl", "-o", "link.jsonl"], "--prompts"),
        (gen + ["--schema", "s.json", "--prompts", "prompts.jsonl", "-o", "hard.jsonl"], "--prompts"),
        (gen + ["--schema", "s.json", "--prompts", "prompts.jsonl", "-o", "dirlink/prompts.jsonl"],
         "--prompts"),
        (gen + ["--schema", "s.json", "--prompt", "x", "-o", "out.jsonl", "--values-out", "out.jsonl"],
         "--values-out"),
        (gen + ["--schema", "s.json", "--prompt", "x", "-o", "new.jsonl", "--values-out",
                "dirlink/new.jsonl"], "--values-out"),
        (gen + ["--schema", "s.json", "--prompt", "x", "-o", "s.json"], "--schema"),
        (gen + ["--grammar", "g.lark", "--prompt", "x", "--values-out", "g.lark"], "--grammar"),
        (gen + ["--schema", "s.json", "--prompt", "x", "--config", "spec.yaml", "-o", "spec.yaml"],
         "--config"),
        (gen + ["--prompts", "per-line.jsonl", "-o", "s.json"], "schema of --prompts"),
        (gen + ["--schema", "s.json", "--prompt", "x", "-o", "m.json", "--metrics-out", "m.json"],
         "--metrics-out"),
    ]


def test_output_equal_to_an_input_or_another_output_is_refused(files: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files)
    cases = _same_path_cases(files)
    before = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
    for argv, fragment in cases:
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and out == "", (argv, err)
        line = one_line(err)
        assert "same file" in line and fragment in line, (argv, line)
        after = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
        assert after == before, argv  # nothing created, nothing changed


@pytest.mark.assets
@pytest.mark.model
def test_success_replaces_existing_outputs_and_leaves_nothing_behind(
        files: Path, model_dir: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files)
    (files / "values.jsonl").write_text("old\n")
    (files / "m.json").write_text("old\n")
    os.chmod(files / "out.jsonl", 0o640)
    rc, out, err = run(capsys, "generate", "--model", model_dir, *GEN, "-o", "out.jsonl",
                       "--values-out", "values.jsonl", "--metrics-out", "m.json")
    assert rc in (0, 1) and out == "", err
    lines = [json.loads(x) for x in (files / "out.jsonl").read_text().splitlines()]
    assert [r["index"] for r in lines] == [0, 1]
    assert (files / "values.jsonl").read_text().splitlines() == [r["text"] for r in lines]
    assert json.loads((files / "m.json").read_text())["requests"]["total"] == 2
    assert (os.stat(files / "out.jsonl").st_mode & 0o777) == 0o640  # the file's permissions kept
    assert leftovers(files, {"s.json", "prompts.jsonl", "out.jsonl", "values.jsonl", "m.json"}) == []
    # a device is written directly (never renamed over)
    rc, out, err = run(capsys, "generate", "--model", model_dir, *GEN, "-o", os.devnull,
                       "--values-out", os.devnull)
    assert rc in (0, 1) and os.path.exists(os.devnull) and not Path(os.devnull).is_file(), err


@pytest.mark.assets
@pytest.mark.model
def test_interrupted_run_keeps_original_and_finished_results(files: Path, model_dir: Path,
                                                             capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while generating (a KeyboardInterrupt raised in the main thread, as SIGINT does,
    here when the third micro-batch starts, so exactly two results are on disk): the original
    file is untouched, the finished results are in out.jsonl.partial (whole lines), and stderr
    says so. The interrupt is raised at a fixed point rather than from a timer thread, so the
    test does not depend on how fast the machine is."""
    monkeypatch.chdir(files)
    n = 20
    (files / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Ticket {i}:"}) + "\n"
                                                 for i in range(n)))
    real_generate = structgen.generate
    calls: list[int] = []

    def generate_then_interrupt(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(structgen, "generate", generate_then_interrupt)
    rc, out, err = run(capsys, "generate", "--model", model_dir, *GEN[:4], "--max-new-tokens", "30",
                       "--batch-size", "1", "--no-speculative", "-o", "out.jsonl")
    assert rc == 130 and len(calls) == 3, err
    assert (files / "out.jsonl").read_text() == ORIGINAL
    partial = files / "out.jsonl.partial"
    done = [json.loads(x) for x in partial.read_text().splitlines()]
    assert [r["index"] for r in done] == [0, 1]
    assert "out.jsonl.partial" in err
    assert leftovers(files, {"s.json", "prompts.jsonl", "out.jsonl", "out.jsonl.partial"}) == []


def test_atomic_output_unit(tmp_path: Path) -> None:
    from structgen.atomic_files import AtomicOutput, write_text_atomic

    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with AtomicOutput(link) as out:
        out.write("new")
        assert target.read_text() == "old"  # not visible before the commit
    assert link.is_symlink() and target.read_text() == "new"  # the link's target replaced
    failed = AtomicOutput(target)
    failed.write("half")
    assert failed.abort() == str(target) + ".partial"
    assert target.read_text() == "new" and (tmp_path / "real.txt.partial").read_text() == "half"
    empty = AtomicOutput(target)
    assert empty.abort() is None
    write_text_atomic(tmp_path / "fresh.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.txt", "link.txt", "real.txt",
                                                          "real.txt.partial"]


# ---------------------------------------------------------------------------------------------
# 5. context length
# ---------------------------------------------------------------------------------------------

LONG = ("one two three four five six seven eight nine ten " * 6).strip()  # 60 GPT-2 tokens


@pytest.mark.assets
@pytest.mark.model
def test_prompt_plus_budget_beyond_context_is_a_typed_error(small_ctx_llama: Any, gpt2_tok: Any) -> None:
    from structgen.generation.model import CausalLM

    assert len(gpt2_tok.encode(LONG)) == 60
    lm = CausalLM(small_ctx_llama, gpt2_tok)
    calls = []
    hook = small_ctx_llama.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ContextLengthError) as info:
            structgen.generate(lm, schema=SCHEMA, prompt=LONG, max_new_tokens=10)
        e = info.value
        assert (e.prompt_tokens, e.max_new_tokens, e.context_length, e.request_index) == (60, 10, 64, None)
        assert all(str(x) in str(e) for x in (60, 10, 64))
        assert isinstance(e, StructgenError) and isinstance(e, ValueError)
        with pytest.raises(ContextLengthError):
            list(structgen.stream(lm, schema=SCHEMA, prompt=LONG, max_new_tokens=10))
        # in a batch: the request is named, and nothing is generated for the others
        with pytest.raises(ContextLengthError) as info:
            structgen.generate(lm, schema=SCHEMA, prompt=["Ticket:", LONG, "Ticket:"], max_new_tokens=10,
                               config={"batch_size": 1})
        assert info.value.request_index == 1 and str(info.value).startswith("request 1: ")
        assert calls == []
        # what fits runs
        r = structgen.generate(lm, schema=SCHEMA, prompt=LONG, max_new_tokens=4, on_budget="cut")
        assert len(r.tokens) <= 4
    finally:
        hook.remove()


@pytest.mark.assets
@pytest.mark.model
def test_prompt_longer_than_learned_positions_is_a_typed_error(gpt2_tok: Any) -> None:
    """GPT-2 (learned absolute positions): past n_positions the model itself fails with an
    IndexError deep inside; the check comes first."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from structgen.generation.model import CausalLM

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50257, n_embd=32, n_layer=1, n_head=2, n_positions=48,
                     eos_token_id=gpt2_tok.eos_token_id, bos_token_id=gpt2_tok.eos_token_id)
    lm = CausalLM(GPT2LMHeadModel(cfg).eval(), gpt2_tok)
    with pytest.raises(ContextLengthError) as info:
        structgen.generate(lm, schema=SCHEMA, prompt=LONG, max_new_tokens=8)
    assert info.value.context_length == 48 and info.value.prompt_tokens == 60


@pytest.mark.assets
@pytest.mark.model
def test_cli_context_error_names_the_prompts_line(files: Path, small_ctx_dir: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files)
    (files / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n"
                                                 for p in ("Ticket:", LONG, "Ticket:")))
    rc, out, err = run(capsys, "generate", "--model", small_ctx_dir, "--schema", "s.json",
                       "--prompts", "prompts.jsonl", "--max-new-tokens", "10", "-o", "out.jsonl")
    assert rc == 2 and out == ""
    line = one_line(err)
    assert "prompts.jsonl:2:" in line and "64" in line and "60" in line, line
    assert (files / "out.jsonl").read_text() == ORIGINAL
    rc, out, err = run(capsys, "generate", "--model", small_ctx_dir, "--schema", "s.json",
                       "--prompt", LONG, "--max-new-tokens", "10")
    assert rc == 2 and "--prompt:" in one_line(err)


# ---------------------------------------------------------------------------------------------
# 6. every option checked where it enters
# ---------------------------------------------------------------------------------------------

def _bad_values(cls: type, name: str) -> list[Any]:
    """Values every option of this annotation must refuse (type, NaN/inf, range, huge ints)."""
    import typing

    hint = typing.get_type_hints(cls)[name]
    args = set(typing.get_args(hint)) or {hint}
    optional = type(None) in args
    bad: list[Any] = [[1], {"a": 1}]
    if not optional:
        bad.append(None)
    if int in args:
        bad += [True, 2.5, "3", -1, 2**70, float("nan")]
    elif float in args:
        bad += [True, "0.5", float("nan"), float("inf"), -float("inf"), -1.0, 10**400]
    elif bool in args:
        bad += [1, 0, "yes", 2.0]
    elif str in args:
        bad += [3, True, ""]
    return bad


OPTION_CLASSES = [CompileOptions, JsonSchemaOptions, SpecConfig, GenerationOptions, MonitoringOptions]
OPTIONS = [(cls, f.name) for cls in OPTION_CLASSES for f in fields(cls)]


@pytest.mark.parametrize("cls, name", OPTIONS, ids=[f"{c.__name__}.{n}" for c, n in OPTIONS])
def test_every_option_refuses_bad_values(cls: type, name: str) -> None:
    for value in _bad_values(cls, name):
        with pytest.raises(ConfigError) as info:
            cls(**{name: value})
        assert info.value.key == name, (name, value)
        assert name in str(info.value)


def test_options_keep_good_values() -> None:
    import numpy as np

    assert SpecConfig(temperature=1).temperature == 1.0
    assert SpecConfig(batch_size=np.int64(4)).batch_size == 4
    assert type(SpecConfig(batch_size=np.int64(4)).batch_size) is int
    assert GenerationOptions(seed=2**63 - 1).seed == 2**63 - 1
    assert MonitoringOptions(min_acceptance=None, max_latency_p95_s=2).max_latency_p95_s == 2.0
    assert JsonSchemaOptions(max_string_length=0).max_string_length == 0


YAML_BAD = [
    ("compile:\n  timeout_s: .nan\n", "compile.timeout_s"),
    ("compile:\n  timeout_s: .inf\n", "compile.timeout_s"),
    ("compile:\n  max_states: 1180591620717411303424\n", "compile.max_states"),
    ("speculative_decoding:\n  temperature: .nan\n", "speculative_decoding.temperature"),
    ("speculative_decoding:\n  temperature: .inf\n", "speculative_decoding.temperature"),
    ("speculative_decoding:\n  min_acceptance: .nan\n", "speculative_decoding.min_acceptance"),
    ("speculative_decoding:\n  min_acceptance: 7\n", "speculative_decoding.min_acceptance"),
    ("speculative_decoding:\n  warmup_proposals: -4\n", "speculative_decoding.warmup_proposals"),
    ("speculative_decoding:\n  max_draft_tokens: 1000000000\n", "speculative_decoding.max_draft_tokens"),
    ("speculative_decoding:\n  draft_model: ''\n", "speculative_decoding.draft_model"),
    ("generation:\n  seed: 1180591620717411303424\n", "generation.seed"),
    ("generation:\n  seed: -1\n", "generation.seed"),
    ("generation:\n  max_new_tokens: 2.5\n", "generation.max_new_tokens"),
    ("generation:\n  max_new_tokens: 99999999999999\n", "generation.max_new_tokens"),
    ("generation:\n  model: ''\n", "generation.model"),
    ("json_schema:\n  max_depth: 0\n", "json_schema.max_depth"),
    ("json_schema:\n  max_whitespace: 1180591620717411303424\n", "json_schema.max_whitespace"),
    ("monitoring:\n  max_latency_p95_s: .inf\n", "monitoring.max_latency_p95_s"),
    ("monitoring:\n  min_tokens_per_pass: .nan\n", "monitoring.min_tokens_per_pass"),
    ("monitoring:\n  min_acceptance: .nan\n", "monitoring.min_acceptance"),
    ("speculative_decoding:\n  temprature: 0.5\n", "speculative_decoding.temprature"),
]


@pytest.mark.parametrize("text, key", YAML_BAD, ids=[k for _, k in YAML_BAD])
def test_yaml_bad_values_file_line_key(tmp_path: Path, text: str, key: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "spec.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(f)
    assert str(info.value).startswith(f"{f}:2: {key}: ") and info.value.key == key
    assert info.value.line == 2 and info.value.path == str(f)
    rc, out, err = run(capsys, "config", "--check", f)
    assert rc == 2 and out == "" and f"{f}:2: {key}" in one_line(err)


@pytest.mark.parametrize("flags, fragment", [
    (["--metrics-port", "70000"], "--metrics-port"),
    (["--metrics-port", "-1"], "--metrics-port"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "inf"], "--temperature"),
    (["--seed", str(2**70)], "--seed"),
    (["--seed", "-5"], "--seed"),
    (["--batch-size", "0"], "--batch-size"),
    (["--max-new-tokens", str(2**40)], "--max-new-tokens"),
])
def test_cli_flags_checked_before_any_work(files: Path, flags: list[str], fragment: str,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files)
    rc, out, err = run(capsys, "generate", "--model", files / "never-loaded", "--schema", "s.json",
                       "--prompt", "x", "-o", "out.jsonl", *flags)
    assert rc == 2 and out == ""
    assert fragment in one_line(err)
    assert (files / "out.jsonl").read_text() == ORIGINAL


@pytest.mark.parametrize("flags", [["--repeats", "0"], ["--threads", "-2"], ["--max-new-tokens", "-1"],
                                   ["--tasks-per-type", "0"]])
def test_bench_flags_checked(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "bench", "--smoke", *flags)
    assert rc == 2 and out == "" and flags[0] in one_line(err)


@pytest.mark.parametrize("kw, key", [
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"seed": 2**70}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"top_p": float("nan")}, "top_p"),
    ({"speculative": "no"}, "speculative"),
    ({"start": ""}, "start"),
    ({"config": {"min_acceptance": float("nan")}}, "min_acceptance"),
    ({"config": {"batch_sise": 2}}, "batch_sise"),
    ({"config": 3}, "config"),
])
def test_api_keywords_checked_before_the_model_loads(tmp_path: Path, kw: dict[str, Any], key: str) -> None:
    # the model folder does not exist: a keyword check that came after loading would be an AssetError
    for fn in (structgen.generate, structgen.stream):
        with pytest.raises(ConfigError) as info:
            result = fn(str(tmp_path / "no-model"), schema=SCHEMA, prompt="x", **kw)
            list(result)
        assert info.value.key == key, (fn, kw, info.value)
    with pytest.raises(ConfigError) as info:
        structgen.generate_model(str(tmp_path / "no-model"), _pydantic_ticket(), "x", **kw)
    assert info.value.key == key


def test_unknown_config_dict_key_suggests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'batch_size'"):
        structgen.generate(str(tmp_path / "no-model"), schema=SCHEMA, prompt="x",
                           config={"batch_sise": 2})


def _pydantic_ticket() -> type:
    from typing import Literal

    from pydantic import BaseModel

    class Ticket(BaseModel):
        status: Literal["open", "closed"]

    return Ticket


# ---------------------------------------------------------------------------------------------
# 8. batch errors name their request; nothing is generated before every request is checked
# ---------------------------------------------------------------------------------------------

@pytest.mark.assets
@pytest.mark.model
def test_bad_schema_in_a_batch_names_the_request_before_any_generation(small_ctx_llama: Any,
                                                                      gpt2_tok: Any) -> None:
    from structgen.generation.model import CausalLM

    lm = CausalLM(small_ctx_llama, gpt2_tok)
    calls: list[int] = []
    hook = small_ctx_llama.register_forward_hook(lambda *a: calls.append(1))
    try:
        for bad_at in (1, 2):
            schemas = [SCHEMA, SCHEMA, SCHEMA]
            schemas[bad_at] = BAD_SCHEMA
            with pytest.raises(SchemaError) as info:
                structgen.generate(lm, schema=schemas, prompt=["a:", "b:", "c:"], max_new_tokens=8,
                                   config=SpecConfig(batch_size=2))
            e = info.value
            assert e.request_index == bad_at and str(e).startswith(f"request {bad_at}: ")
            with pytest.raises(SchemaError) as alone:  # the location is the one it has alone
                structgen.compile_json_schema(BAD_SCHEMA)
            assert (e.pointer, e.keyword) == (alone.value.pointer, alone.value.keyword)
            assert str(e) == f"request {bad_at}: {alone.value}"
        with pytest.raises(StructgenError) as info:
            structgen.generate(lm, grammar=['start: "a"', 'start: "b" missing'], prompt=["a", "b"],
                               max_new_tokens=4)
        assert info.value.request_index == 1
        with pytest.raises(ConfigError) as info:
            structgen.generate(lm, schema=SCHEMA, prompt=["a", ""], max_new_tokens=4)
        assert info.value.request_index == 1 and "no tokens" in str(info.value)
        assert calls == []  # not one forward pass
    finally:
        hook.remove()


def test_list_lengths_must_match(tmp_path: Path) -> None:
    model = str(tmp_path / "no-model")  # the counts are checked before the model loads
    with pytest.raises(ConfigError) as info:
        structgen.generate(model, schema=[SCHEMA] * 3, prompt=["a", "b"])
    assert "3" in str(info.value) and "2" in str(info.value) and info.value.key == "schema"
    with pytest.raises(ConfigError) as info:
        structgen.generate(model, regex=["a", "b"], prompt="a")
    assert info.value.key == "regex"
    with pytest.raises(ConfigError) as info:
        structgen.generate(model, grammar=('start: "a"',), messages=[[{"role": "user", "content": "x"}]] * 2)
    assert "1" in str(info.value) and "2" in str(info.value)


def test_cli_bad_schema_line_is_named(files: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files)
    (files / "prompts.jsonl").write_text(
        json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": "b", "schema": BAD_SCHEMA}) + "\n")
    rc, out, err = run(capsys, "generate", "--model", files / "never-loaded", "--schema", "s.json",
                       "--prompts", "prompts.jsonl", "-o", "out.jsonl")
    assert rc == 2 and "prompts.jsonl:2:" in one_line(err)
    assert (files / "out.jsonl").read_text() == ORIGINAL

