"""`structgen serve` files the JSON schemas it compiles in the disk cache (structgen.grammar_cache),
so a restarted server loads them instead of compiling them again, and serves the same masks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.assets

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer", "minimum": 0}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny_lm(tokenizer_by_alias: Any) -> Any:
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    return CausalLM(build_tiny_llama(tok, "random"), tok)


def _fresh_process_caches() -> None:
    """What a restart clears: the in-memory caches of compiled grammars."""
    import structgen.frontends.json_schema.compiler as jc
    import structgen.grammar_cache as gc

    jc._CACHE.clear()
    gc._LOADED.clear()


def _masks(grammar: Any, lm: Any, text: str) -> list[bytes]:
    """The mask after every token of ``text`` (tokenized by the model's tokenizer)."""
    from structgen.generation.model import vocabulary_for
    from structgen.masks.matcher import Matcher

    m = Matcher(grammar, vocabulary_for(lm))
    out = [m.get_bitmask_words().tobytes()]
    for t in lm.tokenizer.encode(text, add_special_tokens=False):
        assert m.accept_token(t)
        out.append(np.asarray(m.get_bitmask_words()).tobytes())
    return out


@pytest.mark.parametrize("processes", [0, 1], ids=["in-process", "worker"])
def test_a_restarted_server_loads_its_schemas_from_disk(
        tiny_lm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: int) -> None:
    import structgen.frontends.json_schema.compiler as jc
    from structgen.serving.engine import Constraint, Engine

    folder = tmp_path / "grammars"
    monkeypatch.setenv("STRUCTGEN_GRAMMAR_CACHE", str(folder))
    _fresh_process_caches()
    first = Engine(tiny_lm, compile_processes=processes).start()
    try:
        compiled = first.compile(Constraint("json", SCHEMA))
        assert first.compile(Constraint("json", SCHEMA)) is compiled  # the engine's own cache
    finally:
        first.close()
    assert len(list(folder.glob("*.npz"))) == 1

    _fresh_process_caches()

    def no_compile(*a: Any, **k: Any) -> Any:
        raise AssertionError("compiled again: the stored grammar was not used")

    monkeypatch.setattr(jc, "compile_json_schema", no_compile)
    second = Engine(tiny_lm, compile_processes=processes).start()
    try:
        if second._workers is not None:
            monkeypatch.setattr(second._workers, "compile", no_compile)
        loaded = second.compile(Constraint("json", SCHEMA))
    finally:
        second.close()
    assert loaded is not compiled
    doc = '{"name":"abc","n":42}'
    assert loaded.accepts(doc) and not loaded.accepts('{"name":"abc"}')
    assert _masks(loaded, tiny_lm, doc) == _masks(compiled, tiny_lm, doc)


def test_no_disk_cache_when_turned_off(tiny_lm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from structgen.serving.engine import Constraint, Engine

    monkeypatch.setenv("STRUCTGEN_GRAMMAR_CACHE", "0")
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path))
    _fresh_process_caches()
    engine = Engine(tiny_lm).start()
    try:
        assert engine.compile(Constraint("json", SCHEMA)).accepts('{"name":"a","n":1}')
    finally:
        engine.close()
    assert not list(tmp_path.rglob("*.npz"))
