"""``structgen bench ARGS...``: the benchmark suite of the source checkout this command runs from.

The suite (``benchmarks/bench_suite.py``) is benchmark code, not part of the installed package:
this command finds it beside the ``structgen`` package it runs from (a clone used through an
editable install or ``PYTHONPATH``), imports it and hands it every further argument. Installed
from a wheel there is no suite to find, and it says so (exit 2).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from structgen.cli._common import EXIT_USAGE, _err

#: the suite's module name (``benchmarks/bench_suite.py``)
SUITE = "benchmarks.bench_suite"


def suite_path() -> Path:
    """Where a source checkout keeps the suite: ``benchmarks/bench_suite.py`` beside the
    ``structgen`` package folder this module belongs to (it may not exist)."""
    return Path(__file__).resolve().parents[2].joinpath(*SUITE.split(".")).with_suffix(".py")


def run(argv: Sequence[str]) -> int:
    """Run the source checkout's benchmark suite with ``argv``."""
    path = suite_path()
    if not path.is_file():
        _err("structgen bench", "the benchmark suite is not part of the installed package; it runs "
             f"from a source checkout of structgen (no {path}): in a clone, run "
             "`python -m benchmarks.bench_suite ARGS...` (or `structgen bench` from that checkout)")
        return EXIT_USAGE
    root = str(path.parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)  # the checkout's root: its benchmarks package
    suite = importlib.import_module(SUITE)
    return int(suite.main(list(argv)))
