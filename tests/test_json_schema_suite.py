"""The JSON-Schema-Test-Suite ratchet (draft 2020-12).

Recomputes every instance's status with ``benchmarks/json_schema_suite.py`` and fails on
any false positive (an invalid instance accepted) in the required and ECMA-262 regex tests,
any new false positive in the format tests, any instance whose status got worse than the checked-in
ratchet (``tests/data/json_schema_suite_ratchet.json``), and pass totals below it.
Improvements pass; record them with ``python -m benchmarks.json_schema_suite --update``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _runner() -> ModuleType:
    return importlib.import_module("benchmarks.json_schema_suite")


@pytest.mark.parametrize("section", ["required", "format", "ecmascript-regex"])
def test_suite_ratchet(section: str) -> None:
    suite = _runner()
    ratchet = suite.load_ratchet()
    assert section in ratchet, "ratchet file missing; run python -m benchmarks.json_schema_suite --update"
    results = suite.run(section)
    regs = suite.regressions(section, results, ratchet)
    assert not regs, f"{len(regs)} regressions:\n" + "\n".join(regs[:40])
    now = suite.counts(results)
    old = ratchet[section]["counts"]
    assert now["pass"] >= old["pass"], (now, old)
    assert now["total"] == old["total"], "the vendored suite changed; rerun with --update"
    if section == "required":
        assert now["false_positive"] == 0
        assert now["pass"] >= 850
    if section == "ecmascript-regex":  # pattern semantics are ECMA-262's, exactly
        assert now["false_positive"] == 0
        assert now["pass"] == now["total"], now
