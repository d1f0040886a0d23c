"""Start-up cost: what a user waits for before the first answer.

Each measurement is a fresh Python process; its wall time and CPU time (user + system, the
child's own rusage) are recorded. Two states of the machine:

* ``cold``: a copy of the ``structgen`` package in a new folder with no ``__pycache__`` (so no
  bytecode and no numba kernel cache: what a fresh install sees on its first run), an empty
  ``STRUCTGEN_CACHE``. Every cold measurement gets its own copy.
* ``warm``: the same copy after one run of the same command, so every cache is filled.
  (``--smoke`` measures the checkout itself, warm, to stay quick.)

Commands measured (the schema is a 5-property object; the instance is valid):

* ``import``: ``import structgen``;
* ``compile``: ``structgen.compile_json_schema(schema)`` in a script (import included);
* ``mask``: compile, then one token mask over a 260-token byte vocabulary;
* ``cli-validate``: ``python -m structgen validate --schema S.json I.json``;
* ``cli-compile``: ``python -m structgen compile S.json``.

Reported per command and state: the median wall and CPU seconds over ``--repeats`` runs (warm),
or over ``--repeats`` fresh copies (cold).

    python benchmarks/startup.py                  # writes benchmarks/results/startup.json
    python benchmarks/startup.py --smoke          # warm only, one repeat, two commands (file: --out)
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

import _envelope

ROOT = Path(__file__).resolve().parent.parent

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


def fresh_copy(parent: Path) -> Path:
    """A copy of the package with no caches, plus the schema and instance files; returns its folder."""
    work = Path(tempfile.mkdtemp(prefix="startup-", dir=parent))
    shutil.copytree(ROOT / "structgen", work / "structgen",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    (work / "cache").mkdir()
    (work / "schema.json").write_text(json.dumps(SCHEMA))
    (work / "instance.json").write_text(json.dumps(INSTANCE))
    return work


def run_once(command: str, work: Path, package_root: Path | None = None) -> dict[str, float]:
    """Wall and CPU seconds of one fresh process running ``command`` against the copy in ``work``
    (or against the package under ``package_root``)."""
    env = dict(os.environ, PYTHONPATH=str(package_root or work), STRUCTGEN_CACHE=str(work / "cache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("NUMBA_CACHE_DIR", None)  # numba's cache then sits beside the copied sources
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(_argv(command, work), cwd=package_root or work, env=env, capture_output=True,
                          text=True,
                          timeout=900)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def _median(runs: list[dict[str, float]]) -> dict[str, Any]:
    return {"wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
            "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
            "runs": [{k: round(v, 3) for k, v in r.items()} for r in runs]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs per command and state (default 3)")
    ap.add_argument("--commands", default=",".join(COMMANDS), help=f"comma-separated subset of {COMMANDS}")
    ap.add_argument("--smoke", action="store_true", help="warm only, one repeat, import and compile; no file")
    ap.add_argument("--out", type=Path, default=None,
                    help="results JSON (default benchmarks/results/startup.json; --smoke: none)")
    args = ap.parse_args(argv)
    envelope = _envelope.capture(argv)
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown or args.repeats < 1:
        ap.error(f"unknown commands {unknown}" if unknown else "--repeats must be at least 1")
    if args.smoke:
        commands, args.repeats = ["import", "compile"], 1
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="structgen-startup-") as tmp:
        parent = Path(tmp)
        warm_copy = fresh_copy(parent)
        package_root = ROOT if args.smoke else None
        for command in commands:
            row: dict[str, Any] = {}
            if not args.smoke:
                # cold: a new copy per run, so every run compiles every kernel it needs
                row["cold"] = _median([run_once(command, fresh_copy(parent)) for _ in range(args.repeats)])
            run_once(command, warm_copy, package_root)  # fill the caches
            row["warm"] = _median([run_once(command, warm_copy, package_root) for _ in range(args.repeats)])
            figures[command] = row
            states = ", ".join(f"{state} {v['wall_s']:.2f} s wall / {v['cpu_s']:.2f} s CPU"
                               for state, v in row.items())
            print(f"{command:13s} {states}", flush=True)
    figures_doc = {"mode": "smoke" if args.smoke else "full", "repeats": args.repeats, "schema": SCHEMA,
                   "figures": figures}
    out = args.out or (None if args.smoke else ROOT / "benchmarks" / "results" / "startup.json")
    if out is not None:
        _envelope.write(out, envelope, figures_doc)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
