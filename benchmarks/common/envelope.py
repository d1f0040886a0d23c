"""The envelope every benchmark results file carries: which code ran, where, with what, how.

A results file is ``{"envelope": {...}, **figures}``. The envelope holds:

* ``commit``: ``git describe --always --dirty --abbrev=40`` of the repository (``-dirty`` when
  the work tree had uncommitted changes), or ``"unknown"`` outside a git checkout;
* ``date``: UTC, ISO 8601, seconds, taken when :func:`capture` ran (the start of the run);
* ``machine``: CPU model, logical cores, memory (GiB), the 1/5/15-minute load average at the
  start (a busy machine explains slow figures), OS platform;
* ``versions``: python, torch, transformers, numpy, numba, structgen, plus any peer engines the
  run used (:func:`add_peers`); ``None`` for a package that is not installed;
* ``command``: the argument vector, so that the run can be repeated from the repository root:
  ``python -m benchmarks.NAME ...`` for a benchmark module, a script's path relative to the root
  otherwise.

Versions are read from the installed distributions' metadata: capturing the envelope imports
nothing heavy (no torch), so a script can call :func:`capture` first, before its own imports
load the machine.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.common.checkout import ROOT

PACKAGES = ("torch", "transformers", "numpy", "numba", "structgen")
# distribution names of the peer engines the benchmarks compare with
PEER_DISTRIBUTIONS = {"xgrammar": "xgrammar", "llguidance": "llguidance", "outlines": "outlines",
                      "outlines-core": "outlines-core", "triton": "triton"}


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def git_commit(root: Path = ROOT) -> str:
    """``git describe --always --dirty --abbrev=40`` in ``root`` (a subprocess), or ``"unknown"``."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], cwd=root,
                              capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (AttributeError, ValueError, OSError):
        return None


def machine() -> dict[str, Any]:
    """CPU model, logical cores, memory in GiB, load average now (1, 5, 15 min), OS platform."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gib": _memory_gib(),
            "load_average": load, "platform": platform.platform()}


def command(argv: Sequence[str] | None = None, script: str | None = None) -> list[str]:
    """The command that repeats the run from the repository root: ``["python", "-m", module,
    *argv]`` for the module this process runs with ``python -m`` and for a module of the
    ``benchmarks`` package, else ``["python", path, *argv]`` with the script's path relative to
    the root when inside it. ``argv`` None: ``sys.argv[1:]``;
    ``script`` (a file path) None: ``sys.argv[0]``."""
    path = Path(script if script is not None else sys.argv[0]).resolve()
    args = list(sys.argv[1:] if argv is None else argv)
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.origin and Path(main_spec.origin).resolve() == path:
        return ["python", "-m", main_spec.name, *args]  # this process runs it as ``python -m``
    try:
        rel = path.relative_to(ROOT)
    except ValueError:
        return ["python", str(path), *args]
    if rel.parts[0] == "benchmarks" and rel.suffix == ".py":
        return ["python", "-m", ".".join(rel.with_suffix("").parts), *args]
    return ["python", rel.as_posix(), *args]


def capture(argv: Sequence[str] | None = None, script: str | None = None) -> dict[str, Any]:
    """The envelope of a run starting now (runs ``git`` once; imports nothing heavy).

    ``argv``: the script's arguments as its ``main`` received them (None: ``sys.argv[1:]``);
    ``script``: the script's path (pass ``__file__``; None: ``sys.argv[0]``)."""
    return {
        "commit": git_commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": {"python": platform.python_version(),
                     **{name: package_version(name) for name in PACKAGES}},
        "command": command(argv, script),
    }


def add_peers(envelope: dict[str, Any], peers: Sequence[str]) -> dict[str, Any]:
    """Record the versions of the peer engines a run used (names as in ``PEER_DISTRIBUTIONS``
    or distribution names) in ``envelope["versions"]``; returns the same dict (changed)."""
    for name in peers:
        if name != "structgen":
            envelope["versions"][name] = package_version(PEER_DISTRIBUTIONS.get(name, name))
    return envelope


def results(envelope: Mapping[str, Any], figures: Mapping[str, Any]) -> dict[str, Any]:
    """``{"envelope": envelope, **figures}`` (``figures`` must not have an ``envelope`` key)."""
    if "envelope" in figures:
        raise ValueError("figures must not carry their own 'envelope' key")
    return {"envelope": dict(envelope), **figures}


def write(path: Path | str, envelope: Mapping[str, Any], figures: Mapping[str, Any], *,
          indent: int = 1, ensure_ascii: bool = True) -> Path:
    """Write :func:`results` as JSON to ``path`` (parent folders created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results(envelope, figures), indent=indent, ensure_ascii=ensure_ascii) + "\n",
                   encoding="utf-8")
    return out
