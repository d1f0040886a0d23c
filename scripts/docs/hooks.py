"""MkDocs hooks for the structgen site (``hooks:`` in mkdocs.yml).

* Placeholders in pages are filled from the code at build time, so the pages cannot drift from
  it: ``<!-- structgen:config-example -->`` becomes the output of ``structgen config --example``
  (:func:`structgen.settings.example`), and ``<!-- structgen:help [COMMAND...] -->`` the ``--help``
  text of ``structgen`` (no command) or of each named subcommand (run as ``python -m structgen``
  in a subprocess, about a second each).
* Every documented public name must have a docstring: the names of ``structgen.__all__`` and the
  public names of the modules the API reference documents whole, with their public methods and
  properties. A missing one is logged as a warning, which ``mkdocs build --strict`` turns into a
  failed build (mkdocstrings itself renders undocumented names silently). Names defined in a
  module that ``tests/test_docstrings.py`` lists as not yet documented are only reported (info),
  so that list is the one place to empty.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.structgen")

ROOT = Path(__file__).resolve().parents[2]
# modules the API reference renders whole (docs/reference/*.md), besides structgen.__all__
DOCUMENTED_MODULES = ("structgen.config", "structgen.json_schema", "structgen.integrations",
                      "structgen.integrations.transformers", "structgen.integrations.vllm_style",
                      "structgen.errors")
CONFIG_MARK = "<!-- structgen:config-example -->"
HELP_MARK = "<!-- structgen:help"


def _help(command: str | None) -> str:
    argv = [sys.executable, "-m", "structgen", *([command] if command else []), "--help"]
    env = dict(os.environ, COLUMNS="100", PYTHONPATH=str(ROOT))
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        log.warning("`%s` exited %d: %s", " ".join(argv[1:]), done.returncode, done.stderr.strip())
    return done.stdout.rstrip()


def _fill_help(markdown: str) -> str:
    out = []
    for line in markdown.splitlines():
        if line.startswith(HELP_MARK) and line.rstrip().endswith("-->"):
            commands = line[len(HELP_MARK):].rstrip()[:-3].split() or [None]
            for command in commands:
                if command is not None:
                    out += [f"### `structgen {command}`", ""]
                out += ["```text", _help(command), "```", ""]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Fill the placeholders of a page (see the module docstring)."""
    if CONFIG_MARK in markdown:
        from structgen.settings import example

        markdown = markdown.replace(CONFIG_MARK, "```yaml\n" + example().rstrip() + "\n```")
    if HELP_MARK in markdown:
        markdown = _fill_help(markdown)
    return markdown


def _documented(obj: Any) -> bool:
    return bool(obj.docstring is not None and obj.docstring.value.strip())


def undocumented() -> list[tuple[str, str]]:
    """(public path, defining module) of each documented public name, or public method or
    property of a documented class, that has no docstring of its own.

    Read statically with griffe (what mkdocstrings renders), so nothing is imported: the lazy
    names of ``structgen`` are found through its ``TYPE_CHECKING`` imports, as mkdocstrings
    finds them. Costs a parse of the package (a few seconds).
    """
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    package = loader.load("structgen")
    loader.resolve_aliases(implicit=False, external=False)

    import structgen  # light: its __all__ is computed, so griffe cannot read it statically

    targets: dict[str, Any] = {}
    for name in structgen.__all__:
        if name != "__version__":
            targets[f"structgen.{name}"] = package[name]
    for module_name in DOCUMENTED_MODULES:
        module = package[module_name.split(".", 1)[1]]
        targets[module_name] = module
        for name in module.exports or [n for n in module.members if not n.startswith("_")]:
            targets[f"{module_name}.{name}"] = module[name]
    missing = []
    for path, obj in targets.items():
        try:
            obj = obj.final_target if obj.is_alias else obj
        except griffe.AliasResolutionError:
            log.warning("documented name %s cannot be resolved statically", path)
            continue
        if obj.is_attribute:
            continue  # constants: their meaning is stated by the module's docstring
        module = obj.module.path
        if not _documented(obj):
            missing.append((path, module))
        if obj.is_class:
            for attr, member in obj.members.items():
                if attr.startswith("_") or member.is_alias:
                    continue
                if (member.is_function or "property" in member.labels) and not _documented(member):
                    missing.append((f"{path}.{attr}", module))
    return missing


def _not_yet_documented() -> frozenset[str]:
    """The modules ``tests/test_docstrings.py`` expects to fail its check (read, not imported)."""
    import ast

    tree = ast.parse((ROOT / "tests" / "test_docstrings.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "NOT_YET_DOCUMENTED":
            return frozenset(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                             and isinstance(c.value, str))
    return frozenset()


def on_pre_build(config: Any, **kwargs: Any) -> None:
    """Warn (an error under --strict) for every documented name without a docstring."""
    pending = _not_yet_documented()
    for path, module in undocumented():
        if module in pending:
            log.info("public name without a docstring (module listed as not yet documented): %s", path)
        else:
            log.warning("public name without a docstring: %s", path)
