"""Bad inputs the fuzz suite and the bad-input battery found (a deep YAML file, bad request
keywords, unreadable files to validate): each is a typed error, never a traceback."""

from __future__ import annotations

import json

import pytest

import structgen
from structgen.cli import main
from structgen.errors import ConfigError
from structgen.settings import loads_settings


def test_deeply_nested_yaml_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nested too deeply"):
        loads_settings("[" * 5000 + "]" * 5000, "deep.yaml")


@pytest.mark.parametrize("kw, match", [
    ({"prompt": 7}, "prompt must be a string"),
    ({"messages": [{"role": "user"}]}, r"messages\[0\]: a user message needs 'content'"),
    ({"messages": [{"role": "user", "content": 3}]}, r"messages\[0\]\.content: a string or a list"),
    ({"prompt": []}, "empty list"),
    ({"prompt": ["a", 3]}, "request 1: prompt must be a string"),
    ({"messages": [[{"role": "user", "content": "x"}], [None]]}, r"request 1: messages\[0\]"),
])
def test_bad_requests_are_config_errors_before_the_model_loads(kw, match) -> None:
    # the model name does not exist: a request check that ran after loading would fail there
    with pytest.raises(ConfigError, match=match):
        structgen.generate("no/such/model", schema={"type": "string"}, **kw)


def test_validate_of_only_unreadable_files_prints_one_line(tmp_path, capsys) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "integer"}))
    rc = main(["validate", "--no-grammar", "--schema", str(schema), str(tmp_path / "missing.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "cannot read" in err
