"""A griffe extension for the documentation build: reST roles in docstrings become Markdown.

structgen's docstrings cross-reference with Sphinx roles (``:func:`~structgen.x.f```); the
mkdocstrings renderer reads Markdown, where those would show up verbatim. Each role becomes a code
span of the name (the last component with ``~``, as Sphinx shows it), and a paragraph ending in
``::`` (a reST literal block) ends in ``:``. Only the rendered text changes; the source does not.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::$", re.MULTILINE)
_BARE_LITERAL = re.compile(r"^(\s*)::$", re.MULTILINE)


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def markdown_of(text: str) -> str:
    """``text`` with reST roles as code spans and ``::`` literal-block markers as ``:``."""
    text = _ROLE.sub(_role, text)
    text = _BARE_LITERAL.sub("", text)
    return _LITERAL.sub(r"\1:", text)


class RstRoles(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`markdown_of`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Called by griffe for each object it loads (modules, classes, functions, attributes)."""
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
