"""Reading tool calls out of text as it grows: what each built-in call format's
:meth:`~structgen.calls.formats.ToolFormat.read_calls` does, and what
:class:`~structgen.calls.plan.CallStream` streams.

A reader takes the text of an output so far and gives ``(content so far, calls so far)``
(:class:`PartialCall` each: the name once complete, the arguments text as written so far), or
None when the text leaves the shapes the format's grammar writes. ``final``: the output is
complete, so nothing is held back (a possible start of a marker, a fence).

* :func:`read_tagged`: blocks ``begin`` call ``end`` amid free text (Hermes/Qwen);
* :func:`read_json_calls`: bare or fenced JSON calls (the ``json`` format);
* :func:`read_llama3`: Llama 3 JSON calls, joined by ``"; "``;
* :func:`read_mistral`: free text, ``[TOOL_CALLS]``, a JSON array of calls.

Pure text scanning: no grammar, no JSON Schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["FENCE_CLOSE", "FENCE_OPEN", "JSON_WHITESPACE", "PartialCall", "held_marker_prefix",
           "read_json_calls", "read_llama3", "read_mistral", "read_tagged", "skip_whitespace"]

#: JSON's whitespace characters
JSON_WHITESPACE = " \t\n\r"
#: the fence that opens a JSON call in a Markdown code block, and the one that closes it
FENCE_OPEN = "```json"
FENCE_CLOSE = "```"


def skip_whitespace(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that is not JSON whitespace."""
    while pos < len(text) and text[pos] in JSON_WHITESPACE:
        pos += 1
    return pos


def _json_end(text: str, pos: int) -> int | None:
    """The end of the JSON value that starts at ``text[pos]`` (after no whitespace), or None
    when the text ends before the value does (a number at the very end counts as unfinished:
    more digits may follow)."""
    if pos >= len(text):
        return None
    c = text[pos]
    if c == '"':
        i = pos + 1
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            if text[i] == '"':
                return i + 1
            i += 1
        return None
    if c in "{[":
        depth, i, in_str = 0, pos, False
        while i < len(text):
            ch = text[i]
            if in_str:
                if ch == "\\":
                    i += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    i = pos
    while i < len(text) and text[i] not in ",]} \t\r\n":
        i += 1
    return i if i < len(text) else None


@dataclass
class PartialCall:
    """A call as far as a stream has read it: ``name`` once complete, ``args`` the arguments
    text so far, ``done`` when the arguments are complete."""

    name: str | None
    args: str
    done: bool


def _literal_at(text: str, pos: int, literal: str) -> int:
    """1 when ``literal`` is at ``text[pos:]``, 0 when the text ends inside it, -1 when
    something else is there."""
    avail = text[pos: pos + len(literal)]
    if not literal.startswith(avail):
        return -1
    return 1 if len(avail) == len(literal) else 0


def _scan_call(text: str, pos: int, key: str) -> tuple[PartialCall | None, int]:
    """Read the call envelope ``{"name": <string>, "<key>": <arguments>}`` (what
    :meth:`~structgen.calls.formats.ToolFormat.call_body` writes) at ``pos``: the call so far
    and the position after it (-1: unfinished; (None, -2): the text is not that envelope)."""
    head, sep = '{"name": ', f', "{key}": '
    at = _literal_at(text, pos, head)
    if at <= 0:
        return (None, -2) if at < 0 else (PartialCall(None, "", False), -1)
    p = pos + len(head)
    end = _json_end(text, p) if p < len(text) else None
    if end is None:
        if p < len(text) and text[p] != '"':
            return None, -2
        return PartialCall(None, "", False), -1
    try:
        name = json.loads(text[p:end])
    except ValueError:
        return None, -2
    if not isinstance(name, str):
        return None, -2
    at = _literal_at(text, end, sep)
    if at <= 0:
        return (None, -2) if at < 0 else (PartialCall(name, "", False), -1)
    a = end + len(sep)
    a_end = _json_end(text, a)
    if a_end is None:
        return PartialCall(name, text[a:], False), -1
    if a_end >= len(text):
        return PartialCall(name, text[a:a_end], False), -1  # the closing "}" is still to come
    if text[a_end] != "}":
        return None, -2
    return PartialCall(name, text[a:a_end], True), a_end + 1


def held_marker_prefix(text: str, marker: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def read_llama3(text: str, final: bool, key: str) -> tuple[str, list[PartialCall]] | None:
    """Llama 3 JSON calls: the whole reply, calls joined by ``"; "``."""
    calls: list[PartialCall] = []
    body = text
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].lstrip()
    elif "<|python_tag|>".startswith(body) and body and not final:
        return "", calls
    if not body:
        return "", calls
    if not body.startswith("{"):
        return text, calls
    pos = 0
    while True:
        call, nxt = _scan_call(body, pos, key)
        if call is None:
            return None
        calls.append(call)
        if nxt < 0:
            return "", calls
        rest = body[nxt:]
        if not rest.startswith("; "):
            if "; ".startswith(rest) or rest.strip() == "":
                return "", calls
            return None
        pos = nxt + 2


def read_mistral(text: str, final: bool, marker: str, key: str) -> tuple[str, list[PartialCall]] | None:
    """Mistral: free text, the marker, a JSON array of calls."""
    calls: list[PartialCall] = []
    i = text.find(marker)
    if i < 0:
        held = 0 if final else held_marker_prefix(text, marker)
        return text[: len(text) - held], calls
    content = text[:i]
    pos = i + len(marker)
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if pos >= len(text):
        return content, calls
    if text[pos] != "[":
        return None
    pos += 1
    while True:
        call, nxt = _scan_call(text, pos, key)
        if call is None:
            return None
        calls.append(call)
        if nxt < 0 or nxt >= len(text) or text[nxt] == "]":
            return content, calls
        if not ", ".startswith(text[nxt: nxt + 2]):
            return None
        pos = nxt + 2
        if pos > len(text):
            return content, calls


def read_tagged(text: str, final: bool, begin: str, end: str,
                key: str) -> tuple[str, list[PartialCall]] | None:
    """Tagged blocks amid free text."""
    calls: list[PartialCall] = []
    parts: list[str] = []
    pos = 0
    while True:
        i = text.find(begin, pos)
        if i < 0:
            rest = text[pos:]
            held = 0 if final else held_marker_prefix(rest, begin)
            parts.append(rest[: len(rest) - held])
            break
        parts.append(text[pos:i])
        p = i + len(begin)
        while p < len(text) and text[p].isspace():
            p += 1
        call, nxt = _scan_call(text, p, key)
        if call is None:
            return None
        calls.append(call)
        if nxt < 0:
            break
        while nxt < len(text) and text[nxt].isspace():
            nxt += 1
        if not text.startswith(end, nxt):
            if end.startswith(text[nxt:]):
                break
            return None
        pos = nxt + len(end)
    return "".join(parts), calls


def read_json_calls(text: str, final: bool, key: str) -> tuple[str, list[PartialCall]] | None:
    """The JSON call format: the reply is calls (bare or fenced objects, whitespace between)
    when it starts with ``{`` or a fence, else text."""
    fence, close = FENCE_OPEN, FENCE_CLOSE
    body_at = skip_whitespace(text, 0)
    body = text[body_at:]
    if not body or (not final and fence.startswith(body)):
        return "", []
    if not body.startswith(("{", fence)):
        return text, []
    calls: list[PartialCall] = []
    pos = body_at
    while True:
        fenced = text.startswith(fence, pos)
        if not fenced and not text.startswith("{", pos):
            if fence.startswith(text[pos:]):  # the next fence, or trailing whitespace, so far
                return "", calls
            return None
        p = skip_whitespace(text, pos + len(fence)) if fenced else pos
        if p >= len(text):
            return "", calls
        call, nxt = _scan_loose_call(text, p, key)
        if call is None:
            return None
        calls.append(call)
        if nxt < 0:
            return "", calls
        if fenced:
            nxt = skip_whitespace(text, nxt)
            at = _literal_at(text, nxt, close)
            if at <= 0:
                return ("", calls) if at == 0 else None
            nxt += len(close)
        pos = skip_whitespace(text, nxt)
        if pos >= len(text):
            return "", calls


def _scan_loose_call(text: str, pos: int, key: str) -> tuple[PartialCall | None, int]:
    """:func:`_scan_call` for the JSON call format's envelope: ``{"name": <string>, "<key>":
    <arguments>}`` with JSON whitespace between its tokens; the arguments text is the value
    as written (from its first to its last character)."""
    name: str | None = None
    args = ""
    p = pos
    for step in ("{", '"name"', ":", None, ",", f'"{key}"', ":", "", "}"):
        if p > pos:
            p = skip_whitespace(text, p)
        if p >= len(text):
            return PartialCall(name, args, False), -1
        if step is None:  # the name
            if text[p] != '"':
                return None, -2
            end = _json_end(text, p)
            if end is None:
                return PartialCall(None, "", False), -1
            try:
                name = json.loads(text[p:end])
            except ValueError:
                return None, -2
            p = end
        elif step == "":  # the arguments
            end = _json_end(text, p)
            if end is None:
                return PartialCall(name, text[p:], False), -1
            args, p = text[p:end], end
        else:
            at = _literal_at(text, p, step)
            if at <= 0:
                return (None, -2) if at < 0 else (PartialCall(name, args, False), -1)
            p += len(step)
    return PartialCall(name, args, True), p
