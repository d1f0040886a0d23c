"""Start-up cost: what a user waits for before the first answer.

Each measurement is a fresh Python process; its wall time and CPU time (user + system, the
child's own rusage) are recorded, with the machine's load average around it. States of the
machine, per build of the package (``--build NAME=DIR``, default: this checkout):

* ``first`` (with ``--first``): a copy of the ``structgen`` package in a new folder with no
  ``__pycache__`` (no bytecode, no numba kernel cache), an empty ``STRUCTGEN_CACHE``: a first
  run with no set-up step beyond the install (``STRUCTGEN_WARM=0``). Every run its own copy.
* ``cold``: right after ``scripts/setup.sh``: a copy of a folder where the build's set-up step
  ran (``python -m structgen.warm``, or ``structgen.tools.warm`` in older builds, when the build
  has it: numba's kernel cache and bytecode; nothing for builds without it), with an empty
  ``STRUCTGEN_CACHE`` (so an empty grammar cache). Every run its own copy (``cp -p``: numba's
  cache checks the sources' times).
* ``warm``: the same copy after one run of the same command, so every cache is filled.
  (``--smoke`` measures the checkout itself, warm, to stay quick.)

Builds are measured interleaved (every repeat runs each build in turn), so load drifts hit all
builds alike. Commands measured (the schema is a 5-property object; the instance is valid):

* ``import``: ``import structgen``;
* ``compile``: ``structgen.compile_json_schema(schema)`` in a script (import included);
* ``mask``: compile, then one token mask over a 260-token byte vocabulary;
* ``cli-validate``: ``python -m structgen validate --schema S.json I.json``;
* ``cli-compile``: ``python -m structgen compile S.json``.

Reported per build, command and state: the median wall and CPU seconds over ``--repeats`` runs
(``--cold-repeats`` for ``first`` and ``cold``), every run with the 1-minute load average.

    python -m benchmarks.startup                  # writes benchmarks/results/startup.json
    python -m benchmarks.startup --build before=/tmp/old --build after=. --out R.json
    python -m benchmarks.startup --smoke          # warm only, one repeat, two commands (file: --out)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "active"],
    "additionalProperties": False,
}
INSTANCE = {"name": "Ada", "age": 36, "email": "ada@example.org", "tags": ["math"], "active": True}

_SCRIPTS = {
    "import": "import structgen\n",
    "compile": (
        "import json, sys\nimport structgen\n"
        "structgen.compile_json_schema(json.load(open(sys.argv[1])))\n"
    ),
    "mask": (
        "import json, sys\nimport numpy as np\nimport structgen\n"
        "g = structgen.compile_json_schema(json.load(open(sys.argv[1])))\n"
        "tokens = [bytes([b]) for b in range(256)] + [b'{\"', b'\":', b'true', b'</s>']\n"
        "v = structgen.Vocabulary(tokens, eos_token_ids=(len(tokens) - 1,))\n"
        "m = structgen.Matcher(g, v)\n"
        "mask = np.zeros((1, (v.vocab_size + 31) // 32), dtype=np.int32)\n"
        "m.fill_bitmask(mask, 0)\n"
    ),
}
COMMANDS = ("import", "compile", "mask", "cli-validate", "cli-compile")


def _argv(command: str, work: Path) -> list[str]:
    schema, instance = work / "schema.json", work / "instance.json"
    if command in _SCRIPTS:
        return [sys.executable, "-c", _SCRIPTS[command], str(schema)]
    if command == "cli-validate":
        return [sys.executable, "-m", "structgen", "validate", "--schema", str(schema), str(instance)]
    if command == "cli-compile":
        return [sys.executable, "-m", "structgen", "compile", str(schema)]
    raise ValueError(command)


def _inputs(work: Path) -> None:
    (work / "cache").mkdir(exist_ok=True)
    (work / "schema.json").write_text(json.dumps(SCHEMA))
    (work / "instance.json").write_text(json.dumps(INSTANCE))


def fresh_copy(parent: Path, package: Path = ROOT / "structgen") -> Path:
    """A copy of ``package`` with no caches, plus the schema and instance files; returns its folder."""
    work = Path(tempfile.mkdtemp(prefix="startup-", dir=parent))
    shutil.copytree(package, work / "structgen",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    _inputs(work)
    return work


def warm_module(package: Path) -> str | None:
    """The build's warm-up module (``structgen.warm``; ``structgen.tools.warm`` in builds before
    the tools package was split up), or None when it has none."""
    if (package / "warm.py").exists():
        return "structgen.warm"
    return "structgen.tools.warm" if (package / "tools" / "warm.py").exists() else None


def set_up(parent: Path, package: Path) -> tuple[Path, dict[str, float] | None]:
    """A fresh copy of ``package`` where the build's own set-up step ran (``python -m
    structgen.warm`` when the build has that module); returns it and that step's cost."""
    work = fresh_copy(parent, package)
    if warm_module(work / "structgen") is None:
        return work, None
    cost = run_once("warm", work)
    return work, cost


def copy_of(parent: Path, setup: Path) -> Path:
    """A copy of a set-up folder (file times kept) with an empty cache folder."""
    work = Path(tempfile.mkdtemp(prefix="startup-", dir=parent))
    shutil.copytree(setup / "structgen", work / "structgen", copy_function=shutil.copy2)
    _inputs(work)
    return work


def run_once(command: str, work: Path, package_root: Path | None = None) -> dict[str, float]:
    """Wall and CPU seconds of one fresh process running ``command`` against the copy in ``work``
    (or against the package under ``package_root``), and the 1-minute load average before it."""
    env = dict(os.environ, PYTHONPATH=str(package_root or work), STRUCTGEN_CACHE=str(work / "cache"))
    for name in ("PYTHONDONTWRITEBYTECODE", "NUMBA_CACHE_DIR", "STRUCTGEN_NATIVE", "STRUCTGEN_GRAMMAR_CACHE"):
        env.pop(name, None)  # bytecode and numba's cache sit beside the copied sources
    if command == "warm":
        argv = [sys.executable, "-m", str(warm_module((package_root or work) / "structgen"))]
    else:
        argv = _argv(command, work)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=package_root or work, env=env, capture_output=True, text=True,
                          timeout=1800)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "load_1m": load}


def _median(runs: list[dict[str, float]]) -> dict[str, Any]:
    return {"wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
            "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
            "runs": [{k: round(v, 3) for k, v in r.items()} for r in runs]}


def _build(spec: str) -> tuple[str, Path]:
    name, sep, folder = spec.partition("=")
    path = Path(folder).resolve() if sep else Path(spec).resolve()
    package = path if (path / "__init__.py").exists() and path.name == "structgen" else path / "structgen"
    if not (package / "__init__.py").exists():
        raise argparse.ArgumentTypeError(f"{spec}: no structgen package in {path}")
    return (name if sep else path.name), package


def markdown(doc: dict[str, Any], envelope: dict[str, Any]) -> str:
    """A short table of the medians (CPU / wall seconds) per build, command and state, with the
    machine's load and each build's set-up step."""
    builds = list(doc["builds"])
    machine = envelope.get("machine", {})
    loads = [r["load_1m"] for b in builds for row in doc["figures_by_build"][b].values()
             for v in row.values() for r in v["runs"] if "load_1m" in r]
    lines = [f"# Start-up ({envelope.get('date', '?')}, commit {envelope.get('commit', '?')})", "",
             f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; load "
             f"average at the start {machine.get('load_average')}, at the end {doc['load_average_end']}; "
             f"1-minute load during the runs {min(loads, default=0):.1f} to {max(loads, default=0):.1f}.",
             "Medians of fresh processes (CPU = user + system of the child); see benchmarks/startup.py "
             "for the states.", ""]
    for b in builds:
        step = doc["setup_step"].get(b)
        lines.append(f"* {b}: {doc['builds'][b]}; set-up step: " + (
            "none" if step is None else f"the warm-up module, {step['wall_s']:.1f} s wall / "
            f"{step['cpu_s']:.1f} s CPU"))
    lines += ["", "| command | state | " + " | ".join(f"{b} CPU s | {b} wall s" for b in builds) + " |",
              "|---|---|" + "---|---|" * len(builds)]
    first = doc["figures_by_build"][builds[0]]
    for command, row in first.items():
        for state in row:
            cells = []
            for b in builds:
                v = doc["figures_by_build"][b].get(command, {}).get(state)
                cells.append(f"{v['cpu_s']:.2f} | {v['wall_s']:.2f}" if v else "- | -")
            lines.append(f"| {command} | {state} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="warm runs per command and build (default 3)")
    ap.add_argument("--cold-repeats", type=int, default=None,
                    help="first/cold runs (fresh copies) per command and build (default: --repeats)")
    ap.add_argument("--commands", default=",".join(COMMANDS), help=f"comma-separated subset of {COMMANDS}")
    ap.add_argument("--build", action="append", type=_build, default=[], metavar="NAME=DIR",
                    help="a build to measure: DIR holds the structgen package (repeatable; "
                    "default: this checkout)")
    ap.add_argument("--first", action="store_true",
                    help="also the 'first' state (no set-up step: numba compiles every kernel)")
    ap.add_argument("--smoke", action="store_true", help="warm only, one repeat, import and compile; no file")
    ap.add_argument("--out", type=Path, default=None,
                    help="results JSON (default benchmarks/results/startup.json; --smoke: none); "
                    "a full run also writes a .md table beside it")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv)
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown or args.repeats < 1:
        ap.error(f"unknown commands {unknown}" if unknown else "--repeats must be at least 1")
    if args.smoke:
        commands, args.repeats, args.first, args.build = ["import", "compile"], 1, False, []
    cold_repeats = args.cold_repeats or args.repeats
    builds = dict(args.build) or {"this": ROOT / "structgen"}
    states = (["first"] if args.first else []) + ([] if args.smoke else ["cold"]) + ["warm"]
    by_build: dict[str, dict[str, dict[str, Any]]] = {b: {} for b in builds}
    setup_cost: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="structgen-startup-") as tmp:
        parent = Path(tmp)
        setups, warm_copies = {}, {}
        for b, package in builds.items():
            if not args.smoke:
                setups[b], setup_cost[b] = set_up(parent, package)
                print(f"{b}: set-up step {setup_cost[b]}", flush=True)
            warm_copies[b] = fresh_copy(parent, package)
        package_root = ROOT if args.smoke else None
        for command in commands:
            runs: dict[str, dict[str, list[dict[str, float]]]] = {b: {s: [] for s in states} for b in builds}
            for state in states:
                n = args.repeats if state == "warm" else cold_repeats
                if state == "warm":
                    for b in builds:  # fill the caches
                        run_once(command, warm_copies[b], package_root)
                for _ in range(n):
                    for b, package in builds.items():  # interleaved
                        if state == "first":
                            work = fresh_copy(parent, package)
                        elif state == "cold":
                            work = copy_of(parent, setups[b])
                        else:
                            work = warm_copies[b]
                        root = package_root if state == "warm" else None
                        runs[b][state].append(run_once(command, work, root))
                        if state != "warm":
                            shutil.rmtree(work, ignore_errors=True)
            for b in builds:
                row = by_build[b][command] = {s: _median(runs[b][s]) for s in states}
                shown = ", ".join(f"{s} {v['wall_s']:.2f} s wall / {v['cpu_s']:.2f} s CPU"
                                  for s, v in row.items())
                print(f"{b:8s} {command:13s} {shown}", flush=True)
    first_build = next(iter(builds))
    figures_doc = {"mode": "smoke" if args.smoke else "full", "repeats": args.repeats,
                   "cold_repeats": cold_repeats, "schema": SCHEMA,
                   "builds": {b: str(p) for b, p in builds.items()}, "setup_step": setup_cost,
                   "load_average_end": [round(x, 2) for x in os.getloadavg()],
                   "figures": by_build[first_build], "figures_by_build": by_build}
    out = args.out or (None if args.smoke else ROOT / "benchmarks" / "results" / "startup.json")
    if out is not None:
        envelope_lib.write(out, envelope, figures_doc)
        if not args.smoke:
            out.with_suffix(".md").write_text(markdown(figures_doc, envelope))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
