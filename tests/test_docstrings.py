"""Every public function and class of the structgen package has a docstring.

Public means: the name does not start with ``_``, it is defined (not imported) in a structgen
module, and no part of the module's dotted path starts with ``_`` (``structgen.grammar._jit`` is
private). Methods count too: every public method of a public class, properties included. The
check reads the source with :mod:`ast` rather than importing it, so optional dependencies
(triton, numba) do not decide what is checked, and a function defined under ``if`` or ``try`` at
module level is seen like any other.

Not checked: ``@typing.overload`` stubs and property setters/deleters (their documented
counterpart carries the text), dunder methods, classes and functions nested inside functions.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "structgen"

# Modules whose public names are still being documented by the restructuring of issue 27 (their
# failures are reported as expected failures, xfail). Empty this as the modules get docstrings;
# a module listed here that is complete, or no longer exists, simply passes.
NOT_YET_DOCUMENTED: frozenset[str] = frozenset()


def _public_modules() -> list[tuple[str, Path]]:
    """(dotted module name, file) for every non-private module of the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts[1:]):
            continue
        out.append((".".join(parts), path))
    return out


def _decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        names.add(ast.unparse(target))
    return names


def _exempt(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """overload stubs and property setters/deleters need no docstring of their own."""
    for name in _decorator_names(node):
        if name in ("overload", "typing.overload") or name.endswith((".setter", ".deleter")):
            return True
    return False


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a module or class body, looking inside ``if``/``try`` blocks."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *[h.body for h in stmt.handlers]):
                yield from _top_level(block)
        else:
            yield stmt


def _undocumented(tree: ast.Module) -> list[str]:
    """Qualified names of public functions, classes and methods without a docstring."""
    missing: list[str] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for stmt in _top_level(body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if stmt.name.startswith("_") or _exempt(stmt):
                    continue
                if not (ast.get_docstring(stmt) or "").strip():
                    missing.append(prefix + stmt.name)
            elif isinstance(stmt, ast.ClassDef) and not stmt.name.startswith("_"):
                if not (ast.get_docstring(stmt) or "").strip():
                    missing.append(prefix + stmt.name)
                visit(stmt.body, f"{prefix}{stmt.name}.")

    visit(tree.body, "")
    return missing


MODULES = _public_modules()


def test_modules_found() -> None:
    names = {name for name, _ in MODULES}
    assert {"structgen", "structgen.config", "structgen.errors", "structgen.json_schema"} <= names
    assert not any(part.startswith("_") for name in names for part in name.split(".")[1:])


@pytest.mark.parametrize("module,path", MODULES, ids=[name for name, _ in MODULES])
def test_public_names_have_docstrings(module: str, path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    missing = _undocumented(tree)
    if missing and module in NOT_YET_DOCUMENTED:
        pytest.xfail(f"{module}: not yet documented: {', '.join(missing)}")
    assert not missing, f"{module}: public names without a docstring: {', '.join(missing)}"


def test_checker_sees_what_it_should() -> None:
    """The checker itself, on a small module: an independent statement of the rule."""
    source = '''
import typing
def documented():
    """yes"""
def bare(): pass
def _private(): pass
if True:
    def under_if(): pass
class Thing:
    """doc"""
    def method(self): pass
    def __repr__(self): return ""
    @property
    def value(self):
        """doc"""
    @value.setter
    def value(self, v): pass
    @typing.overload
    def f(self, x: int) -> int: ...
    def f(self, x):
        """doc"""
class Bare:
    pass
class _Hidden:
    def method(self): pass
def outer():
    """doc"""
    def inner(): pass
'''
    assert _undocumented(ast.parse(source)) == ["bare", "under_if", "Thing.method", "Bare"]
