"""Packaging: a light `import structgen`, the editable layout, and a wheel that really installs.

`structgen.kernels` and `structgen.grammars` are subpackages inside `structgen/`. They used to be
top-level folders mapped into the package, until transformers started importing the PyPI package
`kernels`, which the top-level `kernels/` shadowed whenever Python ran from the repository root.
These tests check that nothing at the top of the checkout shadows an installed distribution,
that the editable install resolves to the checkout, and that a wheel installed into a fresh
virtual environment holds every module and grammar.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import structgen

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "pydantic")
PACKAGE = ROOT / "structgen"
GRAMMARS = PACKAGE / "grammars"


def run_python(code: str, *, python: str = sys.executable, cwd: Path, extra_path: bool = True,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if extra_path:
        env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def test_import_structgen_is_light(tmp_path):
    code = ("import sys, json, structgen, structgen.errors, structgen.config, structgen.grammar.ir, "
            "structgen.validation, structgen.metrics, structgen.grammar_cache, structgen.warm, "
            "structgen.atomic_files, structgen.assets, structgen.cli, structgen.kernels, "
            "structgen.grammars\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    proc = run_python(code, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def editable_installed() -> bool:
    """Whether this checkout is installed in editable mode for the running interpreter."""
    proc = run_python("import structgen; print(structgen.__file__)", cwd=Path("/"), extra_path=False)
    return proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == ROOT / "structgen/__init__.py"


@pytest.mark.skipif(not editable_installed(), reason="structgen is not installed in editable mode "
                    "(run scripts/setup.sh)")
@pytest.mark.parametrize("cwd", ["root", "elsewhere"])
def test_editable_install_resolves_to_the_checkout(tmp_path, cwd):
    code = ("import structgen, structgen.kernels, structgen.grammars\n"
            "print(structgen.__file__); print(structgen.kernels.__file__); "
            "print(structgen.grammars.__file__)")
    proc = run_python(code, cwd=ROOT if cwd == "root" else tmp_path, extra_path=False)
    assert proc.returncode == 0, proc.stderr
    files = [Path(p).resolve() for p in proc.stdout.split()]
    assert files == [PACKAGE / "__init__.py", PACKAGE / "kernels/__init__.py", GRAMMARS / "__init__.py"]


def test_checkout_shadows_no_installed_distribution():
    """From the repository root (cwd first on sys.path, as `python -m ...` and pytest run), every
    top-level import name of an installed distribution other than structgen must resolve outside
    the checkout. A top-level `kernels/` once hid the `kernels` package transformers imports."""
    code = (
        "import importlib.metadata as md, importlib.util as u, json\n"
        "from pathlib import Path\n"
        "root = Path.cwd().resolve(); hits = {}\n"
        "for name, dists in md.packages_distributions().items():\n"
        "    if not name.isidentifier() or set(dists) == {'structgen'}:\n"
        "        continue\n"
        "    try:\n"
        "        spec = u.find_spec(name)\n"
        "    except Exception:\n"
        "        continue\n"
        "    if spec is None:\n"
        "        continue\n"
        "    places = [spec.origin] if spec.origin else []\n"
        "    places += list(spec.submodule_search_locations or [])\n"
        "    under = [p for p in places if Path(p).resolve().parent == root\n"
        "             or Path(p).resolve().parent.parent == root and Path(p).name == '__init__.py']\n"
        "    if under:\n"
        "        hits[name] = [dists, under]\n"
        "print(json.dumps(hits))\n")
    proc = run_python(code, cwd=ROOT, extra_path=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {}, "top-level names of the checkout shadow installed packages"


def test_grammars_read_grammar_from_source():
    import structgen.grammars as g

    names = sorted(p.stem for p in GRAMMARS.glob("*.lark"))
    assert g.available() == names
    for n in names:
        assert g.read_grammar(n) == (GRAMMARS / f"{n}.lark").read_text(encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="no shipped grammar"):
        g.read_grammar("no-such-grammar")


# ---------------------------------------------------------------------------------------------
# the wheel
# ---------------------------------------------------------------------------------------------

def source_files() -> set[str]:
    """Paths the wheel must contain: every file of the package folder but notes (*.md) and byte
    code, so a new subpackage or data file that pyproject.toml misses fails here."""
    out = set()
    for p in PACKAGE.rglob("*"):
        if (p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".md", ".pyc")
                and not p.name.startswith(".")):
            out.add(p.relative_to(ROOT).as_posix())
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} is too old to build without isolation "
                    "(>= 77 needed; scripts/setup.sh installs it)")
    work = tmp_path_factory.mktemp("build")
    src = work / "src"
    # Build from a copy so that nothing (build/, *.egg-info) is written into the checkout.
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / "structgen", ignore=shutil.ignore_patterns("__pycache__"))
    out = work / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("structgen-*.whl")
    return whl


def test_wheel_contents(wheel):
    assert wheel.name.startswith(f"structgen-{structgen.__version__}-py3-none-any")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = z.read(meta).decode()
        entry_points = z.read(meta.replace("METADATA", "entry_points.txt")).decode()
    missing = source_files() - names
    assert not missing, f"not in the wheel (add the package to pyproject.toml): {sorted(missing)}"
    assert "structgen/py.typed" in names
    assert not [n for n in names if not n.startswith(("structgen/", "structgen-"))]
    suite = [n for n in names if n.endswith(("/bench_suite.py", "/bench_tasks.py")) or "/tasks/" in n]
    assert not suite, f"benchmark code in the wheel: {suite}"
    assert "Requires-Python: >=3.10" in metadata
    assert "structgen = structgen.cli:main" in entry_points


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (system site packages visible) with only the wheel installed; its python."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                           "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv


def test_wheel_installs_kernels_and_cli(installed, tmp_path):
    python = str(installed / "bin" / "python")
    code = ("import structgen, structgen.kernels, structgen.cli\n"
            "print(structgen.__file__); print(structgen.kernels.__file__)")
    proc = run_python(code, python=python, cwd=tmp_path, extra_path=False)
    assert proc.returncode == 0, proc.stderr
    for f in proc.stdout.split():
        assert Path(f).resolve().is_relative_to(installed.resolve()), f  # not the checkout
    script = subprocess.run([str(installed / "bin" / "structgen"), "--version"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120)
    assert script.returncode == 0 and script.stdout.strip() == f"structgen {structgen.__version__}"
    # the benchmark suite is not in the wheel: `structgen bench` says it needs a source checkout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the wheel's structgen, not ours
    bench = subprocess.run([str(installed / "bin" / "structgen"), "bench", "--smoke"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=120, env=env)
    assert bench.returncode == 2 and bench.stdout == "" and "source checkout" in bench.stderr


def test_wheel_ships_grammars(installed, tmp_path):
    python = str(installed / "bin" / "python")
    code = ("import structgen.grammars as g\n"
            "print(g.__file__); print(' '.join(g.available())); print(len(g.read_grammar('json')))")
    proc = run_python(code, python=python, cwd=tmp_path, extra_path=False)
    assert proc.returncode == 0, proc.stderr
    where, names, size = proc.stdout.splitlines()
    assert Path(where).resolve().is_relative_to(installed.resolve())
    assert "json" in names.split()
    assert int(size) == len((GRAMMARS / "json.lark").read_text(encoding="utf-8"))
