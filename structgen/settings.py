"""The YAML configuration file: sections that map onto the option dataclasses of
:mod:`structgen.config`.

::

    speculative_decoding:   # -> SpecConfig
      draft_num: 6
      temperature: 0.7
      verify_threshold: 0.9 # opt-in lossy acceptance; null / absent = exact
      batch_size: 32
    generation:             # -> GenerationOptions
      max_new_tokens: 256
      seed: 0
    json_schema:            # -> JsonSchemaOptions
      whitespace: compact
    compile:                # -> CompileOptions
      max_states: 200000
    monitoring:             # -> MonitoringOptions
      min_acceptance: 0.3

Every section and every key is optional (absent = the dataclass default). Each option is
documented once, in its dataclass's docstring; :func:`example` renders those docstrings as a
commented default file (``structgen config --example``).

Errors: an unknown section or key, a value of the wrong type, a bad value, a duplicate key or
malformed YAML raises :class:`~structgen.errors.ConfigError` whose message names the key
(``section.key``) and whose location is ``FILE:LINE`` (the line of the offending key or value;
the loader keeps each YAML node's position). Costs: parsing is pure Python and imports neither
torch nor the grammar compiler, except that a ``json_schema:`` section is checked with the JSON
Schema front-end's own option check.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import re
import textwrap
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from structgen.config import (
    CompileOptions,
    GenerationOptions,
    JsonSchemaOptions,
    MonitoringOptions,
    SpecConfig,
)
from structgen.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from yaml import Node

__all__ = ["Settings", "SECTIONS", "load_settings", "loads_settings", "load_spec_config", "dump",
           "example", "option_docs"]


@dataclass(frozen=True)
class Settings:
    """All sections of one configuration file (each a frozen option dataclass)."""

    speculative_decoding: SpecConfig = field(default_factory=SpecConfig)
    generation: GenerationOptions = field(default_factory=GenerationOptions)
    json_schema: JsonSchemaOptions = field(default_factory=JsonSchemaOptions)
    compile: CompileOptions = field(default_factory=CompileOptions)
    monitoring: MonitoringOptions = field(default_factory=MonitoringOptions)


#: YAML section name -> the dataclass it maps onto (file order of :func:`dump`).
SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(Settings)}  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# value checks
# ---------------------------------------------------------------------------------------------

_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               type(None): "null"}


def _allowed_types(cls: type) -> dict[str, tuple[type, ...]]:
    """field name -> the plain types its annotation allows (``int | None`` -> (int, NoneType))."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[type, ...]] = {}
    for f in fields(cls):
        hint = hints[f.name]
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            out[f.name] = tuple(typing.get_args(hint))
        else:
            out[f.name] = (hint,)
    return out


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


_PLAIN_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _coerce(value: object, allowed: tuple[type, ...], plain: bool) -> tuple[bool, object]:
    """(ok, value converted to the field's type). ``plain``: an unquoted YAML scalar."""
    if value is None:
        return type(None) in allowed, None
    if isinstance(value, bool):
        return bool in allowed, value
    if isinstance(value, int):
        if int in allowed:
            return True, value
        if float in allowed:
            return True, float(value)
        return False, value
    if isinstance(value, float):
        return float in allowed, value
    if isinstance(value, str):
        if str in allowed:
            return True, value
        # YAML 1.1 (PyYAML) reads an unquoted 1e-3 as a string; accept it where a number goes
        if float in allowed and plain and _PLAIN_FLOAT.match(value):
            return True, float(value)
        return False, value
    return False, value


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------

def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _mapping(node: Node, what: str, where: str) -> list[tuple[str, Node, Node]]:
    """[(key, key node, value node)] of a YAML mapping node; duplicate and non-string keys fail."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{what} must be a mapping of keys to values", key=what or None,
                          line=_line(node), path=where)
    seen: dict[str, int] = {}
    out = []
    for knode, vnode in node.value:
        if not isinstance(knode, yaml.ScalarNode) or knode.tag != "tag:yaml.org,2002:str":
            raise ConfigError(f"{what + ': ' if what else ''}keys must be plain names, not "
                              f"{knode.tag.rsplit(':', 1)[-1]} {getattr(knode, 'value', '')!r}",
                              key=what or None, line=_line(knode), path=where)
        key = str(knode.value)
        dotted = f"{what}.{key}" if what else key
        if key in seen:
            raise ConfigError(f"{dotted}: duplicate key (first given on line {seen[key]})",
                              key=dotted, line=_line(knode), path=where)
        seen[key] = _line(knode)
        out.append((key, knode, vnode))
    return out


def _unknown(dotted: str, key: str, known: list[str], kind: str) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{dotted}: unknown {kind}{hint}; known: {', '.join(known)}"


def _section(name: str, cls: type, node: Node, where: str, section_line: int) -> object:
    import yaml
    from yaml.constructor import SafeConstructor

    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
        return cls()  # "speculative_decoding:" with nothing under it
    allowed = _allowed_types(cls)
    known = [f.name for f in fields(cls)]
    values: dict[str, object] = {}
    lines: dict[str, int] = {}
    constructor = SafeConstructor()
    for key, knode, vnode in _mapping(node, name, where):
        dotted = f"{name}.{key}"
        if key not in allowed:
            raise ConfigError(_unknown(dotted, key, known, "key"), key=dotted, line=_line(knode),
                              path=where)
        if not isinstance(vnode, yaml.ScalarNode):
            raise ConfigError(f"{dotted}: expected {_expected(allowed[key])}, got a "
                              f"{'list' if isinstance(vnode, yaml.SequenceNode) else 'mapping'}",
                              key=dotted, line=_line(vnode), path=where)
        try:
            raw = constructor.construct_object(vnode, deep=True)
        except yaml.YAMLError as e:
            raise ConfigError(f"{dotted}: {' '.join(str(e).split())}", key=dotted, line=_line(vnode),
                              path=where) from None
        plain = vnode.style is None
        ok, value = _coerce(raw, allowed[key], plain)
        if not ok:
            raise ConfigError(f"{dotted}: expected {_expected(allowed[key])}, got {_describe(raw)}",
                              key=dotted, line=_line(vnode), path=where)
        values[key] = value
        lines[key] = _line(vnode)
    try:
        obj = cls(**values)  # each options class checks its own values in __post_init__
    except ConfigError as e:
        bad = e.key if e.key in lines else next((k for k in lines if k in str(e)), None)
        dotted = f"{name}.{bad or e.key}" if (bad or e.key) else name
        raise ConfigError(f"{dotted}: {e}", key=dotted, line=lines[bad] if bad else section_line,
                          path=where) from None
    return obj


def _expected(allowed: tuple[type, ...]) -> str:
    words = [_TYPE_WORDS.get(t, t.__name__) for t in allowed]
    return " or ".join(words)


def loads_settings(text: str, path: str = "<string>") -> Settings:
    """Parse configuration text; ``path`` is only used in error messages."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = int(mark.line) + 1 if mark is not None else None
        problem = " ".join(str(e.problem or e.context or e).split())
        raise ConfigError(f"malformed YAML: {problem}", line=line, path=path) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML: {' '.join(str(e).split())}", path=path) from None
    except RecursionError:  # PyYAML composes recursively; a configuration is a few levels deep
        raise ConfigError("malformed YAML: nested too deeply", path=path) from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == "tag:yaml.org,2002:null"):
        return Settings()
    known = list(SECTIONS)
    parts: dict[str, Any] = {}
    for key, knode, vnode in _mapping(root, "", path):
        cls = SECTIONS.get(key)
        if cls is None:
            raise ConfigError(_unknown(key, key, known, "section"), key=key, line=_line(knode), path=path)
        parts[key] = _section(key, cls, vnode, path, _line(knode))
    return Settings(**parts)


def load_settings(path: str | os.PathLike[str]) -> Settings:
    """Read and check a YAML configuration file. Raises :class:`ConfigError` (``FILE:LINE:
    section.key: problem``), also when the file cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"cannot read configuration file: {reason}", path=str(p)) from None
    return loads_settings(text, str(p))


def load_spec_config(path: str | os.PathLike[str]) -> SpecConfig:
    """The ``speculative_decoding:`` section of a YAML file as a :class:`SpecConfig` (the other
    sections are checked too: a bad key anywhere is an error)."""
    return load_settings(path).speculative_decoding


# ---------------------------------------------------------------------------------------------
# documented default file
# ---------------------------------------------------------------------------------------------

_ENTRY = re.compile(r"^(\w+(?:\s*/\s*\w+)*):\s+(.*)$")


def option_docs(cls: type) -> tuple[str, dict[str, str]]:
    """(summary, field name -> description) parsed from an option dataclass's docstring, whose
    entries read ``name: text`` (or ``a / b: text``) with indented continuation lines."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    lines = doc.splitlines()
    para = []
    for raw in lines:
        if not raw.strip():
            break
        para.append(raw.strip())
    summary = " ".join(para)
    docs: dict[str, str] = {}
    current: list[str] | None = None
    names: list[str] = []
    for raw in lines[len(para):]:
        m = _ENTRY.match(raw)
        if m and not raw.startswith(" "):
            if current is not None:
                for n in names:
                    docs[n] = " ".join(current)
            names = [n.strip() for n in m.group(1).split("/")]
            current = [m.group(2).strip()]
        elif current is not None and raw.startswith(" ") and raw.strip():
            current.append(raw.strip())
        else:
            if current is not None:
                for n in names:
                    docs[n] = " ".join(current)
            current, names = None, []
    if current is not None:
        for n in names:
            docs[n] = " ".join(current)
    return summary, docs


def _yaml_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid YAML scalar


def dump(settings: Settings | None = None, *, comments: bool = True, width: int = 96) -> str:
    """``settings`` (default: all defaults) as YAML text that :func:`loads_settings` reads back
    to an equal :class:`Settings`; with ``comments`` every option carries its documentation."""
    settings = settings or Settings()
    out: list[str] = []
    if comments:
        out += ["# structgen configuration (YAML). Every section and key is optional; absent keys",
                "# take the defaults shown here. Load with structgen.settings.load_settings(path),",
                "# `structgen generate --config FILE`, or structgen.generate(config=FILE).", ""]
    for name, cls in SECTIONS.items():
        obj = getattr(settings, name)
        summary, docs = option_docs(cls)
        if comments:
            out += textwrap.wrap(f"{cls.__name__}: {summary}", width=width + 2, initial_indent="# ",
                                 subsequent_indent="# ")
        out.append(f"{name}:")
        for f in fields(cls):
            if comments and docs.get(f.name):
                out += textwrap.wrap(docs[f.name], width=width, initial_indent="  # ",
                                     subsequent_indent="  # ")
            out.append(f"  {f.name}: {_yaml_value(getattr(obj, f.name))}")
        out.append("")
    return "\n".join(out)


def example() -> str:
    """The documented default configuration file."""
    return dump(Settings())


def with_overrides(settings: Settings, section: str, **values: object) -> Settings:
    """A copy of ``settings`` with some fields of one section replaced (values already typed)."""
    return replace(settings, **{section: replace(getattr(settings, section), **values)})
