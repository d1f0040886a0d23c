"""Every script in examples/ runs end to end on a tiny model and prints valid output.

Each example runs as a subprocess (``sys.executable``, repository root as working directory,
``OMP_NUM_THREADS=1``) with ``--model`` pointing at a tiny random Llama with the GPT-2
tokenizer saved with ``save_pretrained`` (tests/_tiny_lm.py; biased towards closing
punctuation so outputs complete quickly). Two run at a time. Oracles: ``jsonschema`` for
JSON outputs, Pydantic for the Pydantic example, Lark's own Earley parser for the SQL grammar.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest

pytestmark = [pytest.mark.assets, pytest.mark.model]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NAMES = ["quickstart_json_schema", "pydantic_model", "lark_sql", "batch_mixed_schemas",
         "draft_model_speculation", "streaming_stats", "logits_processor", "vllm_style_backend"]


def test_every_example_is_covered() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == sorted(NAMES)


def _module(name: str) -> Any:
    """Import an example as a module (for its SCHEMA/classes; heavy imports are in main())."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # pydantic resolves forward references through it
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer_by_alias) -> dict[str, subprocess.CompletedProcess]:
    from _tiny_lm import save_tiny_model

    tok = tokenizer_by_alias("gpt2")
    folder = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", tok, "biased")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])

    def run(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), "--model", str(folder)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(NAMES, pool.map(run, NAMES)))


def _ok(runs: dict[str, subprocess.CompletedProcess], name: str) -> list[str]:
    r = runs[name]
    assert r.returncode == 0, f"{name} exited {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout.splitlines()


def test_quickstart_json_schema(runs) -> None:
    lines = _ok(runs, "quickstart_json_schema")
    assert len(lines) == 1
    jsonschema.validate(json.loads(lines[0]), _module("quickstart_json_schema").SCHEMA)
    assert "tokens/pass=" in runs["quickstart_json_schema"].stderr


def test_pydantic_model(runs) -> None:
    lines = _ok(runs, "pydantic_model")
    mod = _module("pydantic_model")
    assert len(lines) == 1
    task = mod.Task.model_validate_json(lines[0])
    jsonschema.validate(json.loads(lines[0]), mod.Task.model_json_schema())
    assert isinstance(task.owner, mod.Person)


def test_lark_sql(runs) -> None:
    import lark

    from structgen.frontends.lark import builtin_grammar

    out = runs["lark_sql"].stdout
    _ok(runs, "lark_sql")
    assert out.endswith("\n")
    mod = _module("lark_sql")
    # Lark's own parser is the oracle (raises when the text is not a sentence)
    lark.Lark(mod.sql_grammar(), start=mod.START, parser="earley",
              lexer="dynamic_complete").parse(out[:-1])
    lark.Lark(builtin_grammar("sql"), parser="earley", lexer="dynamic_complete").parse(out[:-1])


def test_batch_mixed_schemas(runs) -> None:
    lines = _ok(runs, "batch_mixed_schemas")
    schemas = _module("batch_mixed_schemas").SCHEMAS
    assert len(lines) == len(schemas)
    for line, schema in zip(lines, schemas):
        jsonschema.validate(json.loads(line), schema)


def test_draft_model_speculation(runs) -> None:
    lines = _ok(runs, "draft_model_speculation")
    assert len(lines) == 1
    jsonschema.validate(json.loads(lines[0]), _module("draft_model_speculation").SCHEMA)
    err = runs["draft_model_speculation"].stderr
    assert "drafter draft_model" in err
    assert "identical to plain constrained decoding: True" in err


def test_streaming_stats(runs) -> None:
    lines = _ok(runs, "streaming_stats")
    assert len(lines) == 1
    jsonschema.validate(json.loads(lines[0]), _module("streaming_stats").SCHEMA)
    err = runs["streaming_stats"].stderr
    assert "forward passes" in err and "time split" in err


def test_logits_processor(runs) -> None:
    lines = _ok(runs, "logits_processor")
    mod = _module("logits_processor")
    assert len(lines) == len(mod.PROMPTS)
    for line in lines:
        jsonschema.validate(json.loads(line), mod.SCHEMA)


def test_vllm_style_backend(runs) -> None:
    import re

    lines = _ok(runs, "vllm_style_backend")
    mod = _module("vllm_style_backend")
    assert len(lines) == len(mod.REQUESTS)
    for line, (rid, kind, spec, _prompt) in zip(lines, mod.REQUESTS):
        out = json.loads(line)
        assert out["request_id"] == rid and out["complete"]
        if kind == "json":
            jsonschema.validate(json.loads(out["text"]), spec)
        elif kind == "regex":
            assert re.fullmatch(spec, out["text"])
        else:
            assert out["text"] in spec
