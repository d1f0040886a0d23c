"""A griffe extension for the documentation build: reST roles in docstrings become Markdown.

structgen's docstrings cross-reference with Sphinx roles (``:func:`~structgen.x.f```); the
mkdocstrings renderer reads Markdown, where those would show up verbatim. Each role becomes a code
span of the name (the last component with ``~``, as Sphinx shows it), and a paragraph ending in
``::`` (a reST literal block) ends in ``:``. The option dataclasses of :mod:`structgen.config`
document each field as a ``name: text`` entry (the format :func:`structgen.settings.option_docs`
parses for the YAML example); those entries become a Markdown list. Only the rendered text
changes; the source does not.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::$", re.MULTILINE)
_BARE_LITERAL = re.compile(r"^(\s*)::$", re.MULTILINE)
_OPTION_ENTRY = re.compile(r"^(\w+(?:\s*/\s*\w+)*):\s+(.*)$")  # as structgen.settings reads them


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def markdown_of(text: str) -> str:
    """``text`` with reST roles as code spans and ``::`` literal-block markers as ``:``."""
    text = _ROLE.sub(_role, text)
    text = _BARE_LITERAL.sub("", text)
    return _LITERAL.sub(r"\1:", text)


def option_list(text: str) -> str:
    """``name: text`` entries at the start of a line (continued by indented lines) as list items."""
    out = []
    for line in text.splitlines():
        m = _OPTION_ENTRY.match(line)
        if m:
            names = ", ".join(f"`{n.strip()}`" for n in m.group(1).split("/"))
            out.append(f"- {names}: {m.group(2)}")
        else:
            out.append(line)
    return "\n".join(out)


class RstRoles(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`markdown_of`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Called by griffe for each object it loads (modules, classes, functions, attributes)."""
        if obj.docstring is None:
            return
        text = markdown_of(obj.docstring.value)
        if obj.is_class and obj.path.startswith("structgen.config."):
            text = option_list(text)
        obj.docstring.value = text
