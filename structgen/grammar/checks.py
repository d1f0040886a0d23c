"""Value checks: a predicate on a decoded JSON string, run when the string completes.

Some string languages are not regular, or not regular at a sensible size: an IDNA A-label
(``xn--`` followed by Punycode) is valid only if the Punycode decodes to a valid U-label,
which takes arithmetic over the whole label. A front end then compiles two grammars:

* for generation, an automaton for a *safe subset* (every string it allows is valid, e.g.
  hostnames without ``--`` in a label's 3rd and 4th positions), with no value check, so
  token masks stay exact;
* for validation, an automaton for a *superset* whose string content is followed by a
  *check marker*: one byte from :data:`MARKER_BYTES` (0xF8-0xFF, never part of UTF-8
  text), which names a predicate registered here with :func:`register_value_check`.

:func:`run_checked` walks text through such a grammar: at the closing quote of each JSON
string literal it lets the parse step over a marker only if the marker's predicate holds
for the decoded string, then over the quote. The grammar accepts the text iff some parse
reaches the end, each checked string satisfying its predicates. Several markers in a row
ask for several predicates (a string with two checked formats).

Token masks know nothing about markers (no token spells them but SentencePiece byte
fall-backs), so a grammar with markers is for checking text only:
:class:`structgen.masks.matcher.Matcher` refuses it.

Predicates are registered by the front ends that emit the markers (the JSON Schema
``format`` checks in :mod:`structgen.frontends.json_schema.idn`), keyed by marker byte, once
per process when that module is imported.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from structgen.errors import GrammarError
from structgen.grammar import ir

if TYPE_CHECKING:  # pragma: no cover
    from structgen.grammar.runtime import Runtime

__all__ = ["MARKER_BYTES", "checked", "register_value_check", "run_checked", "value_check"]

#: Bytes that mark a value check: never in UTF-8 text (0xF8-0xFF are no lead bytes).
MARKER_BYTES = range(0xF8, 0x100)

_CHECKS: dict[int, tuple[str, Callable[[str], bool]]] = {}
_LOCK = threading.Lock()
# a JSON string literal: quotes, then anything but a quote or backslash, or an escape
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def register_value_check(marker: int, name: str, predicate: Callable[[str], bool]) -> None:
    """Register ``predicate`` (decoded string -> valid?) under ``marker`` (one of
    :data:`MARKER_BYTES`); ``name`` says what it checks (errors name it). Registering the
    same name again replaces it; another name on a taken marker is a ValueError."""
    if marker not in MARKER_BYTES:
        raise ValueError(f"marker {marker:#x} is not one of the value-check bytes 0xF8-0xFF")
    with _LOCK:
        old = _CHECKS.get(marker)
        if old is not None and old[0] != name:
            raise ValueError(f"marker {marker:#x} is taken by value check {old[0]!r}")
        _CHECKS[marker] = (name, predicate)


def value_check(marker: int) -> tuple[str, Callable[[str], bool]]:
    """(name, predicate) registered under ``marker``; GrammarError when none is."""
    got = _CHECKS.get(marker)
    if got is None:
        raise GrammarError(f"the grammar asks for value check {marker:#x}, which no front end has "
                           "registered in this process (import the front end that compiled it, "
                           "e.g. structgen.json_schema)")
    return got


def checked(content: ir.Expr, markers: tuple[int, ...]) -> ir.Expr:
    """String content ``content`` followed by the check markers ``markers`` (in order)."""
    for m in markers:
        if m not in MARKER_BYTES:
            raise ValueError(f"marker {m:#x} is not one of the value-check bytes 0xF8-0xFF")
    return ir.seq(content, *(ir.byteset([m]) for m in markers)) if markers else content


def _decoded(literal: bytes) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _holds(marker: int, value: str | None) -> bool:
    if value is None:
        return False
    try:
        return bool(value_check(marker)[1](value))
    except (ValueError, UnicodeError):  # a predicate that cannot decide rejects
        return False


def run_checked(runtime: Runtime, data: bytes) -> tuple[bool, bool]:
    """(``data`` is a viable prefix, ``data`` is accepted) for a grammar with value checks.

    Between string literals the bytes are walked as usual; at each literal's closing quote
    the configuration is widened by every run of markers whose predicates hold for the
    decoded string, then the quote is stepped. Configurations are merged by content
    (:meth:`~structgen.grammar.runtime.Runtime.describe`), under the runtime's lock so that
    no other thread flushes the tables meanwhile. ``data`` must be JSON text where it is
    accepted (the literals are found lexically).
    """
    with runtime.lock:
        cid = runtime.start
        pos = 0
        for m in _STRING.finditer(data):
            close = m.end() - 1
            cid = runtime.walk(cid, data[pos:close])
            if cid < 0:
                return False, False
            value: str | None = None
            decoded = False
            ends = []
            frontier = [cid]
            seen = {cid}
            while frontier:  # runs of markers, each allowed only if its predicate holds
                c = frontier.pop()
                after = runtime.step(c, 0x22)
                if after >= 0:
                    ends.append(after)
                for b in MARKER_BYTES:
                    nxt = runtime.step(c, b)
                    if nxt < 0 or nxt in seen:
                        continue
                    if not decoded:
                        value, decoded = _decoded(data[m.start():m.end()]), True
                    if _holds(b, value):
                        seen.add(nxt)
                        frontier.append(nxt)
            if not ends:
                return False, False
            cid = ends[0] if len(set(ends)) == 1 else _union(runtime, ends)
            pos = close + 1
        cid = runtime.walk(cid, data[pos:])
        return cid >= 0, cid >= 0 and runtime.is_accepting(cid)


def _union(runtime: Runtime, cids: list[int]) -> int:
    """The configuration holding every stack of ``cids`` (accepting if any is)."""
    acc = False
    stacks: set[tuple[tuple[int, tuple[int, ...]], ...]] = set()
    for c in cids:
        a, st = runtime.describe(c)
        acc = acc or a
        stacks.update(st)
    return runtime.intern_described((acc, tuple(sorted(stacks))))
