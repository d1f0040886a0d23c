"""The YAML configuration file (structgen.settings): sections map onto the option dataclasses;
every bad key or value is a ConfigError naming the key and the file line.

Oracles: PyYAML's own ``safe_load`` for what a file says, the dataclasses' defaults for what an
absent key means, and the text itself for line numbers (each bad line carries a ``# <-`` marker).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from structgen.cli import main
from structgen.config import SpecConfig
from structgen.errors import ConfigError
from structgen.settings import (
    SECTIONS,
    Settings,
    dump,
    example,
    load_settings,
    load_spec_config,
    loads_settings,
    option_docs,
)

ISSUE_SAMPLE = """\
speculative_decoding:
  draft_num: 6          # candidate drafts per step
  temperature: 0.7
  verify_threshold: 0.9 # opt-in lossy acceptance; absent = exact
  batch_size: 32
"""


def test_issue_sample_maps_onto_spec_config(tmp_path: Path) -> None:
    f = tmp_path / "spec.yaml"
    f.write_text(ISSUE_SAMPLE)
    cfg = load_spec_config(f)
    assert cfg == SpecConfig(draft_num=6, temperature=0.7, verify_threshold=0.9, batch_size=32)
    # the API reads the same file through its config= argument
    from structgen.generation.call_options import load_config as _load_config

    assert _load_config(str(f)) == cfg


def test_empty_file_and_empty_section_are_defaults() -> None:
    assert loads_settings("") == Settings()
    assert loads_settings("# nothing\n") == Settings()
    assert loads_settings("speculative_decoding:\nmonitoring:\n") == Settings()


def test_every_option_is_documented_once_in_its_dataclass() -> None:
    for name, cls in SECTIONS.items():
        summary, docs = option_docs(cls)
        assert summary, name
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__name__}: undocumented {missing}"


def test_example_is_the_defaults_with_every_key() -> None:
    text = example()
    data = yaml.safe_load(text)  # PyYAML's own reading of the file
    assert list(data) == list(SECTIONS)
    for name, cls in SECTIONS.items():
        assert data[name] == dataclasses.asdict(cls()), name
    assert loads_settings(text) == Settings()
    # every option's documentation appears as a comment above it
    for cls in SECTIONS.values():
        for doc in option_docs(cls)[1].values():
            first_words = " ".join(doc.split()[:3])
            assert first_words in " ".join(line.lstrip(" #") for line in text.splitlines()), doc


def test_dump_round_trips_non_default_values() -> None:
    s = Settings(
        speculative_decoding=SpecConfig(draft_num=3, temperature=0.25, verify_threshold=0.5,
                                        draft_model="smollm2-135m", prompt_lookup=False),
        generation=dataclasses.replace(Settings().generation, seed=7, max_new_tokens=64,
                                       model="/some/path: with colon"),
        json_schema=dataclasses.replace(Settings().json_schema, whitespace="flexible",
                                        max_string_length=40),
        monitoring=dataclasses.replace(Settings().monitoring, min_acceptance=0.3, min_validity=None),
    )
    for comments in (True, False):
        text = dump(s, comments=comments)
        assert loads_settings(text) == s
        assert yaml.safe_load(text)["generation"]["model"] == "/some/path: with colon"


def test_number_forms() -> None:
    s = loads_settings("speculative_decoding:\n  verify_threshold: 1e-3\n  temperature: 1\n"
                       "compile:\n  timeout_s: 5\n")
    assert s.speculative_decoding.verify_threshold == pytest.approx(1e-3)
    assert s.speculative_decoding.temperature == 1.0 and isinstance(s.speculative_decoding.temperature, float)
    assert s.compile.timeout_s == 5.0
    s = loads_settings("speculative_decoding:\n  verify_threshold: null\n  draft_model: ~\n")
    assert s.speculative_decoding.verify_threshold is None


BAD = [
    # (text with a "# <-" marker on the offending line, the key the error must name)
    ("speculative_decoding:\n  draft_num: 6\n  draft_nun: 3   # <-\n", "speculative_decoding.draft_nun"),
    ("speculative_decodng:   # <-\n  draft_num: 6\n", "speculative_decodng"),
    ("speculative_decoding:\n  temperature: hot   # <-\n", "speculative_decoding.temperature"),
    ("speculative_decoding:\n  temperature: '0.5'   # <-\n", "speculative_decoding.temperature"),
    ("speculative_decoding:\n  draft_num: 2.5   # <-\n", "speculative_decoding.draft_num"),
    ("speculative_decoding:\n  draft_num: true   # <-\n", "speculative_decoding.draft_num"),
    ("speculative_decoding:\n  adaptive: 1   # <-\n", "speculative_decoding.adaptive"),
    ("speculative_decoding:\n  batch_size: null   # <-\n", "speculative_decoding.batch_size"),
    ("speculative_decoding:\n  draft_num: [1, 2]   # <-\n", "speculative_decoding.draft_num"),
    ("speculative_decoding:\n\n  temperature: -1   # <-\n", "speculative_decoding.temperature"),
    ("speculative_decoding:\n  verify_threshold: 1.5   # <-\n", "speculative_decoding.verify_threshold"),
    ("speculative_decoding:\n  backend: cuda   # <-\n", "speculative_decoding.backend"),
    ("speculative_decoding:\n  top_p: 1\n  min_draft_tokens: 30   # <-\n",
     "speculative_decoding.min_draft_tokens"),
    ("speculative_decoding:\n  batch_size: 4\n  batch_size: 8   # <-\n", "speculative_decoding.batch_size"),
    ("speculative_decoding: 5   # <-\n", "speculative_decoding"),
    ("generation:\n  max_new_tokens: 0   # <-\n", "generation.max_new_tokens"),
    ("generation:\n  seed: abc   # <-\n", "generation.seed"),
    ("json_schema:\n  whitespace: loose   # <-\n", "json_schema.whitespace"),
    ("json_schema:\n  lenient: yes please   # <-\n", "json_schema.lenient"),
    ("compile:\n  max_states: -5   # <-\n", "compile.max_states"),
    ("monitoring:\n  min_validity: 2   # <-\n", "monitoring.min_validity"),
    ("monitoring:\n  min_acceptance: 0.2\n  alert_me: true   # <-\n", "monitoring.alert_me"),
    ("- speculative_decoding   # <-\n", None),
]


def marked_line(text: str) -> int:
    (line,) = [i for i, t in enumerate(text.splitlines(), 1) if "# <-" in t]
    return line


@pytest.mark.parametrize("text, key", BAD, ids=[k or "top-level-list" for _, k in BAD])
def test_bad_files_name_key_and_line(tmp_path: Path, text: str, key: str | None) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(f)
    e = info.value
    line = marked_line(text)
    assert e.line == line and e.path == str(f)
    msg = str(e)
    assert msg.startswith(f"{f}:{line}: ") and "\n" not in msg
    if key is not None:
        assert e.key == key and key in msg


def test_malformed_yaml_has_a_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("speculative_decoding:\n  draft_num: 6\n  temperature: [0.7\n")
    with pytest.raises(ConfigError) as info:
        load_settings(f)
    assert "malformed YAML" in str(info.value) and info.value.line is not None


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "nope.yaml")


def test_did_you_mean() -> None:
    with pytest.raises(ConfigError, match="did you mean 'draft_num'"):
        loads_settings("speculative_decoding:\n  draftnum: 3\n")


# ---------------------------------------------------------------------------------------------
# `structgen config`
# ---------------------------------------------------------------------------------------------

def test_cli_config_example_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--example"]) == 0
    out = capsys.readouterr().out
    assert loads_settings(out) == Settings()
    f = tmp_path / "spec.yaml"
    f.write_text(ISSUE_SAMPLE)
    assert main(["config", "--check", str(f)]) == 0
    out = capsys.readouterr().out
    assert loads_settings(out).speculative_decoding == load_spec_config(f)


def test_cli_config_bad_key_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "spec.yaml"
    f.write_text("speculative_decoding:\n  draft_num: 6\n  temprature: 0.7\n")
    assert main(["config", "--check", str(f)]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    (line,) = cap.err.splitlines()
    assert f"{f}:3:" in line and "speculative_decoding.temprature" in line
