"""No private name crosses a subpackage boundary of structgen.

A subpackage is the first path component under ``structgen/`` (``generation``, ``serving``,
``masks``, ...); a top-level module (``structgen/limits.py``) is its own. A module may import
a name starting with ``_`` (a private function, class or constant) or a private module (``_jit``)
only from its own subpackage: what another subpackage needs gets a public name in its home
module. Dunder names (``__version__``) are not private. The check reads the source with
:mod:`ast`, so every import counts, those inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "structgen"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _home(path: Path, package: Path) -> str:
    """The subpackage a file belongs to (a top-level module is its own)."""
    parts = path.relative_to(package).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _top_home(name: str, package: Path) -> str:
    """The subpackage of ``from structgen import name``: a subpackage or top-level module of
    that name, else the package's ``__init__``."""
    return name if (package / name).is_dir() or (package / f"{name}.py").is_file() else "__init__"


def _absolute(node: ast.ImportFrom, path: Path, root: Path) -> str:
    """The dotted module an ``import from`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = list(path.relative_to(root).with_suffix("").parts[:-1])
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _violations(path: Path, package: Path = PACKAGE) -> list[str]:
    home = _home(path, package)
    rel = path.relative_to(package.parent)
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node, path, package.parent)
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "structgen" and len(parts) > 1 and parts[1] != home \
                        and any(_private(p) for p in parts[1:]):
                    out.append(f"{rel}:{node.lineno}: import {a.name}")
            continue
        else:
            continue
        parts = module.split(".")
        if parts == ["structgen"]:  # the package itself: its submodules, or names of __init__
            out.extend(f"{rel}:{node.lineno}: from structgen import {n}" for n in names
                       if _private(n) and _top_home(n, package) != home)
            continue
        if parts[0] != "structgen" or parts[1] == home:
            continue
        if any(_private(p) for p in parts[1:]):
            out.append(f"{rel}:{node.lineno}: from {module} import ...")
        out.extend(f"{rel}:{node.lineno}: from {module} import {n}" for n in names if _private(n))
    return out


def test_no_private_name_is_imported_across_subpackages() -> None:
    found = [v for path in sorted(PACKAGE.rglob("*.py")) for v in _violations(path)]
    assert not found, "private names imported from another subpackage:\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: each form of a cross-subpackage private import is caught; imports
    within a subpackage, public names and dunders are not."""
    package = tmp_path / "structgen"
    (package / "serving").mkdir(parents=True)
    f = package / "serving" / "engine.py"
    f.write_text("from structgen.generation.loop import _Sequence, run_batch\n"
                 "from structgen.grammar import _jit\n"
                 "from structgen.grammar._jit import njit\n"
                 "import structgen.grammar._jit\n"
                 "from ..masks.matcher import _whole\n"
                 "from structgen.serving.app import _private_ok\n"
                 "from . import _also_ok\n"
                 "from structgen import __version__\n"
                 "from structgen import _lazy\n"
                 "def f():\n    from structgen.generation.api import _prompt_ids\n")
    found = _violations(f, package)
    assert [v.split(": ", 1)[1] for v in found] == [
        "from structgen.generation.loop import _Sequence",
        "from structgen.grammar import _jit",
        "from structgen.grammar._jit import ...",
        "import structgen.grammar._jit",
        "from structgen.masks.matcher import _whole",
        "from structgen import _lazy",
        "from structgen.generation.api import _prompt_ids",
    ], found
