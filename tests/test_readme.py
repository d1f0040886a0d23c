"""README.md stays a user's README (issue 27): short, readable lines, the two commands verbatim,
and every relative link pointing at a file of the checkout."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _prose_lines() -> list[tuple[int, str]]:
    """(line number, text) of lines outside fenced code blocks and tables."""
    out, fenced = [], False
    for number, line in enumerate(README.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("|"):
            out.append((number, line))
    return out


def test_length_and_width() -> None:
    assert len(README.splitlines()) <= 220
    long = [f"README.md:{n}: {len(line)} characters" for n, line in _prose_lines() if len(line) > 120]
    assert not long, long


def test_the_two_commands_verbatim() -> None:
    # CI (.ci/run) runs the second one; the demo is the main job
    assert "bash scripts/setup.sh && .venv/bin/structgen demo" in README
    assert "bash scripts/setup.sh && bash scripts/test.sh" in README
    assert "bash scripts/setup.sh && bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_relative_links_resolve() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, missing
