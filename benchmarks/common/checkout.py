"""The repository checkout the benchmarks run from, and how they start its modules in children.

Every benchmark runs as ``python -m benchmarks.<name>`` from the repository root, so that
``benchmarks`` and the checkout's ``structgen`` are importable. A child process a benchmark
starts on one of its modules runs it the same way: :func:`module_command` spells the command and
:func:`child_env` puts the root first on the child's ``PYTHONPATH`` (whatever its working folder).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

#: the repository root (the folder holding ``benchmarks/`` and ``structgen/``)
ROOT = Path(__file__).resolve().parents[2]


def module_command(module: str, *args: str) -> list[str]:
    """``[python, "-m", module, *args]`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the repository root first on
    ``PYTHONPATH``, so that ``python -m benchmarks...`` works from any working folder."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([out["PYTHONPATH"]] if out.get("PYTHONPATH") else [])])
    return out
