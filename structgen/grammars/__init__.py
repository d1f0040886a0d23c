"""structgen.grammars: the Lark grammars shipped with structgen (``structgen/grammars/``).

The ``*.lark`` files are package data; read them through :func:`read_grammar` so that they are
found the same way from a source checkout, an editable install and a wheel.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["available", "read_grammar"]


def available() -> list[str]:
    """Names (without ``.lark``) of the grammars shipped with the package, sorted."""
    return sorted(p.name[: -len(".lark")] for p in resources.files(__name__).iterdir()
                  if p.name.endswith(".lark"))


def read_grammar(name: str) -> str:
    """Text of the shipped grammar ``name`` (``"json"`` or ``"json.lark"``).

    Raises :class:`FileNotFoundError` naming the available grammars if there is none by that name.
    """
    file = name if name.endswith(".lark") else f"{name}.lark"
    res = resources.files(__name__).joinpath(file)
    if not res.is_file():
        raise FileNotFoundError(f"no shipped grammar {file!r}; available: {', '.join(available()) or 'none'}")
    return res.read_text(encoding="utf-8")
