"""``benchmarks/masks.py --smoke`` as CI runs it (a subprocess): the JSON report has its fields,
every replayed instance is valid for its schema (``jsonschema``) or accepted by Lark's own
parser, each was replayed token by token to the end (one step per token of the tokenizer's
own encoding), and structgen falsely rejects nothing and never crashes.

The first test runs structgen alone (fast, no peer needed); the second runs whichever peers
are installed (the ``bench`` extra) and is skipped without them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

pytestmark = pytest.mark.assets

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "masks.py"
PEER_MODULES = {"xgrammar": "xgrammar", "llguidance": "llguidance", "outlines-core": "outlines_core"}
STEP_FIELDS = ("steps", "step_median_us", "step_mean_us", "step_p99_us")
ENGINE_FIELDS = ("cases", "ok", "compile_median_ms", "ttfm_median_ms", "ttfm_p90_ms",
                 "allowed_per_step_mean", "rejections", *STEP_FIELDS)


def _run_smoke(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "masks.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "JSON-schema cases" in proc.stdout and "Lark cases" in proc.stdout
    return json.loads(out.read_text())


def _schema_of(report: dict[str, Any], name: str) -> Any:
    subset, ident = name.split("/", 1)
    if subset == "repo":
        return json.loads((ROOT / "schemas" / f"{ident}.schema.json").read_text())
    data = Path(report["prep"]["schema_source"])
    for line in (data / f"{subset}.jsonl").open(encoding="utf-8"):
        row = json.loads(line)
        if row.get("id") == ident:
            return row["schema"]
    raise AssertionError(f"schema {name} not found in {data}")


def _check_report(report: dict[str, Any], tok: Any, engines: list[str]) -> None:
    assert report["tokenizer"] == "llama3" and report["vocab_size"] == len(tok)
    kinds = [c["kind"] for c in report["cases"]]
    assert kinds.count("schema") == 3 and kinds.count("lark") == 1
    for kind in ("schema", "lark"):
        for e in engines:
            s = report["summary"][kind][e]
            for f in ENGINE_FIELDS:
                assert f in s, (kind, e, f)
        for e in engines[1:]:
            assert set(report["ratios"][kind][e]) >= {"step_median", "step_mean", "step_p99", "ttfm_median"}
    sg = report["structgen"]
    assert sg["false_rejections"] == 0, sg["false_rejection_cases"]
    assert sg["crashes"] == []
    assert sg["ttfm_median_ms"] > 0 and sg["ttfm_p90_ms"] >= sg["ttfm_median_ms"]
    assert sg["mask_cache_median_mb"] is not None
    replayed = 0
    for c in report["cases"]:
        r = c["engines"]["structgen"]
        if r["status"] != "ok" or not c["tokens"]:
            continue
        text = c["text"]
        # the oracles: the replayed text is valid (jsonschema / Lark's parser) and is exactly
        # what the tokenizer's own encoding spells; every token was one step
        if c["kind"] == "schema":
            jsonschema.validate(json.loads(text), _schema_of(report, c["name"]))
        else:
            import lark

            from structgen.frontends.lark import builtin_grammar

            grammar = c["name"].split("/", 1)[1].split("#")[0]
            lark.Lark(builtin_grammar(grammar), parser="earley", lexer="dynamic_complete").parse(text)
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
        assert r["steps"] == c["tokens"] and r["reject"] is None and r["eos_ok"] is True
        assert r["allowed_mean"] >= 1 and r["ttfm_ms"] >= r["compile_ms"] > 0
        replayed += 1
    assert replayed >= 2


def test_smoke_structgen(tmp_path: Path, tokenizer_by_alias) -> None:
    tok = tokenizer_by_alias("llama3")
    report = _run_smoke(tmp_path, "--engines", "structgen")
    assert list(report["engines"]) == ["structgen"]
    _check_report(report, tok, ["structgen"])


@pytest.mark.slow
def test_smoke_with_installed_peers(tmp_path: Path, tokenizer_by_alias) -> None:
    installed = [e for e, mod in PEER_MODULES.items() if importlib.util.find_spec(mod) is not None]
    if not installed:
        pytest.skip("no peer engine installed (pip install structgen[bench])")
    tok = tokenizer_by_alias("llama3")
    report = _run_smoke(tmp_path)
    available = [e for e, info in report["engines"].items() if info["available"]]
    assert "structgen" in available and set(installed) <= set(report["engines"])
    _check_report(report, tok, ["structgen", *[e for e in available if e != "structgen"]])
    # outlines-core is regex-only: the Lark case is reported as n/a, not as a failure
    if "outlines-core" in available:
        assert report["summary"]["lark"]["outlines-core"]["n/a"] == 1
