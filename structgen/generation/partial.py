"""Typed partial streaming: read a JSON document as it is written, value by value.

:class:`PartialJsonReader` is fed the text of a JSON document in pieces (any split: inside
strings, escapes, numbers or keywords) and reports, in document order, the values it can
now be sure of::

    reader = PartialJsonReader()
    for piece in pieces:
        for event in reader.feed(piece):
            print(event.kind, event.pointer, event.value)
    reader.finish()

Every value in the document, the root included, gets a ``"begin"`` event (its JSON pointer,
RFC 6901, is known: an object key was read, an array item or the root started), then
either a ``"value"`` event (a string, number, ``true``, ``false`` or ``null`` is complete,
with its parsed value) or an ``"end"`` event (an object or array closed, with the whole
container). With ``string_deltas=True`` a string value also gets ``"string_delta"`` events
with its decoded text as it grows (joined, they equal its final value).

:attr:`PartialJsonReader.document` is the value so far: containers appear when they open
and grow in place, a scalar appears once complete (never half a string or number), so
every value it holds is the final document's value at that place. A scalar completes in
the piece that holds its last character, except a number, which can only be known complete
when the next character arrives (``,`` ``}`` ``]`` or whitespace; in constrained output
that character is in the same token as the delimiter) or at :meth:`~PartialJsonReader.finish`
(a number that ends the document).

The reader does not guess and does not re-parse: each character is looked at once
(strings and numbers in runs), so the cost is linear in the text. It expects the text to be
a prefix of a valid JSON document, which constrained generation guarantees; anything else
raises :class:`~structgen.errors.ConfigError`.

:func:`partial_instance` turns a partial document into a Pydantic instance of the fields
complete so far (used by :func:`~structgen.generation.api.stream_model`).
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, Union

from structgen.errors import ConfigError
from structgen.json_types import JsonArray, JsonObject, JsonValue

if TYPE_CHECKING:
    from pydantic import BaseModel, TypeAdapter
    from pydantic.fields import FieldInfo

M = TypeVar("M", bound="BaseModel")
#: an object or array of the document
Container = Union[JsonObject, JsonArray]

__all__ = ["PartialEvent", "PartialJsonReader", "json_pointer",
           "partial_instance"]

# What the next character means (the reader's state between characters).
_ROOT = "root"                  # before the document's value
_ITEM_OR_CLOSE = "item|]"       # just after "[": an item or "]"
_ITEM = "item"                  # after "," in an array
_KEY_OR_CLOSE = "key|}"         # just after "{": a key or "}"
_KEY = "key"                    # after "," in an object
_COLON = ":"                    # after a key
_VALUE = "value"                # after ":" (the pointer is already known)
_AFTER = "after"                # after a value: "," or the container's closing bracket
_STRING = "string"              # inside a string (a key or a value)
_NUMBER = "number"              # inside a number
_LITERAL = "literal"            # inside true / false / null

_WHITESPACE = frozenset(" \t\n\r")
_STRING_STOP = re.compile(r'["\\]')
_NUMBER_RUN = re.compile(r"[0-9+\-.eE]*")
_NUMBER_START = frozenset("-0123456789")
_LITERALS: dict[str, tuple[str, JsonValue]] = {"t": ("true", True), "f": ("false", False),
                                               "n": ("null", None)}
# the tail of a growing string that cannot be decoded yet: an escape cut short, or a high
# surrogate whose low half may still follow
_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{0,4}|.)?", re.S)


def json_pointer(parent: str, key: str | int) -> str:
    """The RFC 6901 pointer of ``key`` (an object key or array index) under ``parent``."""
    if isinstance(key, int):
        return f"{parent}/{key}"
    return parent + "/" + key.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class PartialEvent:
    """One step in reading a JSON document (see :mod:`structgen.generation.partial`).

    kind: ``"begin"`` (a value at ``pointer`` started), ``"value"`` (the scalar at
    ``pointer`` is complete: ``value``), ``"end"`` (the object or array at ``pointer`` closed:
    ``value`` is it) or ``"string_delta"`` (``value``: more decoded text of the string at
    ``pointer``); pointer: an RFC 6901 JSON pointer (``""`` is the whole document)."""

    kind: str
    pointer: str
    value: JsonValue = None


class _Frame:
    """An open object or array: the container, its pointer, and the next array index."""

    __slots__ = ("container", "pointer", "count")

    def __init__(self, container: Container, pointer: str) -> None:
        self.container = container
        self.pointer = pointer
        self.count = 0


class PartialJsonReader:
    """Push-style reader of a JSON document written in pieces (see the module docs).

    :meth:`feed` takes the next piece of text and returns the events it completes;
    :meth:`finish` says the text has ended (it completes a number that ends the document).
    ``document`` is the value read so far, grown in place (copy it to keep a snapshot);
    ``complete`` whether the whole document has been read."""

    def __init__(self, *, string_deltas: bool = False) -> None:
        self.document: JsonValue = None
        self.complete = False
        self._string_deltas = string_deltas
        self._stack: list[_Frame] = []
        self._mode = _ROOT
        self._events: list[PartialEvent] = []
        self._offset = 0  # characters fed before the current piece (for error messages)
        # the value being read: its parent container (None for the root), key and pointer
        self._parent: Container | None = None
        self._key: str | int | None = None
        self._pointer = ""
        # the string or number being read, in raw pieces
        self._raw: list[str] = []
        self._in_key = False
        self._escape_pending = False  # the previous piece ended on a backslash
        self._undecoded = ""          # string_deltas: raw text not yet reported
        self._literal = ""            # the rest of true / false / null still to come
        self._literal_value: JsonValue = None

    def feed(self, text: str) -> list[PartialEvent]:
        """Read the next piece of the document; returns the events it completes, in order."""
        self._events = events = list[PartialEvent]()
        i, n = 0, len(text)
        try:
            while i < n:
                mode = self._mode
                if mode is _STRING:
                    i = self._read_string(text, i, n)
                elif mode is _NUMBER:
                    run = _NUMBER_RUN.match(text, i)
                    assert run is not None  # the pattern also matches the empty run
                    end = run.end()
                    self._raw.append(text[i:end])
                    i = end
                    if i < n:  # a character that cannot continue the number: it is complete
                        self._end_number()
                elif mode is _LITERAL:
                    take = text[i:i + len(self._literal)]
                    if not self._literal.startswith(take):
                        self._fail(text, i)
                    self._literal = self._literal[len(take):]
                    i += len(take)
                    if not self._literal:
                        self._complete_scalar(self._literal_value)
                else:
                    ch = text[i]
                    if ch not in _WHITESPACE and not self._structural(ch):
                        self._fail(text, i)
                    i += 1
        finally:
            self._offset += i
        if self._mode is _STRING and self._string_deltas and not self._in_key:
            self._flush_delta(final=False)
        return events

    def finish(self) -> list[PartialEvent]:
        """The text has ended: complete a number that ends the document. Returns its events
        (none when the document ended otherwise); ``complete`` then says whether the whole
        document was read."""
        self._events = events = list[PartialEvent]()
        if self._mode is _NUMBER:
            self._end_number()
        return events

    # --- structure -------------------------------------------------------------------

    def _structural(self, ch: str) -> bool:
        """Read one character outside strings, numbers and literals; False when it cannot
        come here."""
        mode = self._mode
        if mode is _AFTER:
            if not self._stack:
                return False  # only whitespace may follow the document
            frame = self._stack[-1]
            is_object = isinstance(frame.container, dict)
            if ch == ",":
                self._mode = _KEY if is_object else _ITEM
                return True
            if ch == ("}" if is_object else "]"):
                self._close()
                return True
            return False
        if mode is _VALUE:
            return self._start_value(ch)
        if mode is _ITEM or mode is _ITEM_OR_CLOSE:
            if ch == "]" and mode is _ITEM_OR_CLOSE:
                self._close()
                return True
            frame = self._stack[-1]
            self._begin(frame.container, frame.count, json_pointer(frame.pointer, frame.count))
            frame.count += 1
            return self._start_value(ch)
        if mode is _KEY or mode is _KEY_OR_CLOSE:
            if ch == "}" and mode is _KEY_OR_CLOSE:
                self._close()
                return True
            if ch != '"':
                return False
            self._start_string(in_key=True)
            return True
        if mode is _COLON:
            if ch != ":":
                return False
            self._mode = _VALUE
            return True
        if mode is _ROOT:
            self._begin(None, None, "")
            return self._start_value(ch)
        return False

    def _begin(self, parent: Container | None, key: str | int | None, pointer: str) -> None:
        self._parent, self._key, self._pointer = parent, key, pointer
        self._events.append(PartialEvent("begin", pointer))

    def _start_value(self, ch: str) -> bool:
        if ch == "{" or ch == "[":
            container: Container = {} if ch == "{" else []
            self._place(container)
            self._stack.append(_Frame(container, self._pointer))
            self._mode = _KEY_OR_CLOSE if ch == "{" else _ITEM_OR_CLOSE
        elif ch == '"':
            self._start_string(in_key=False)
        elif ch in _NUMBER_START:
            self._raw = [ch]
            self._mode = _NUMBER
        elif ch in _LITERALS:
            word, value = _LITERALS[ch]
            self._literal, self._literal_value = word[1:], value
            self._mode = _LITERAL
        else:
            return False
        return True

    def _place(self, value: JsonValue) -> None:
        """Put ``value`` where the value being read goes."""
        parent = self._parent
        if parent is None:
            self.document = value
        elif isinstance(parent, list):
            parent.append(value)  # items are placed in order: this one is the next index
        else:
            assert isinstance(self._key, str)
            parent[self._key] = value

    def _complete_scalar(self, value: JsonValue) -> None:
        self._place(value)
        self._events.append(PartialEvent("value", self._pointer, value))
        self._after_value()

    def _after_value(self) -> None:
        self._mode = _AFTER
        if not self._stack:
            self.complete = True

    def _close(self) -> None:
        frame = self._stack.pop()
        self._events.append(PartialEvent("end", frame.pointer, frame.container))
        self._after_value()

    # --- strings and numbers ---------------------------------------------------------

    def _start_string(self, *, in_key: bool) -> None:
        self._raw = []
        self._in_key = in_key
        self._undecoded = ""
        self._mode = _STRING

    def _read_string(self, text: str, i: int, n: int) -> int:
        """Read string text from ``text[i:]``; returns where reading stopped (after the
        closing quote, or ``n``)."""
        start = i
        if self._escape_pending:  # this character is escaped: it cannot close the string
            self._escape_pending = False
            i += 1
        while True:
            m = _STRING_STOP.search(text, i)
            if m is None:
                self._add_raw(text[start:])
                return n
            j = m.start()
            if text[j] == '"':
                self._add_raw(text[start:j])
                self._end_string()
                return j + 1
            if j + 1 >= n:  # a backslash ends the piece: the next piece's first character is escaped
                self._escape_pending = True
                self._add_raw(text[start:])
                return n
            i = j + 2  # skip the backslash and the character it escapes

    def _add_raw(self, piece: str) -> None:
        if piece:
            self._raw.append(piece)
            if self._string_deltas and not self._in_key:
                self._undecoded += piece

    def _end_string(self) -> None:
        literal = "".join(self._raw)
        value = json.loads('"' + literal + '"')  # decodes every escape, surrogate pairs included
        if self._in_key:
            frame = self._stack[-1]
            self._begin(frame.container, value, json_pointer(frame.pointer, value))
            self._mode = _COLON
            return
        if self._string_deltas:
            self._flush_delta(final=True)
        self._complete_scalar(value)

    def _flush_delta(self, *, final: bool) -> None:
        """Report the decodable part of the string text read since the last delta (which
        always starts at an escape boundary, so its escapes can be found from its start)."""
        pending = self._undecoded
        cut = len(pending)
        if not final:
            escapes = list(_ESCAPE.finditer(pending))
            # hold back an escape cut short ...
            if escapes and escapes[-1].end() == cut and _cut_short(escapes[-1].group()):
                cut = escapes.pop().start()
            # ... and a high surrogate right before the cut, whose low half may follow
            if escapes and escapes[-1].end() == cut and _high_surrogate(escapes[-1].group()):
                cut = escapes[-1].start()
        if cut:
            self._events.append(PartialEvent("string_delta", self._pointer,
                                             json.loads('"' + pending[:cut] + '"')))
            self._undecoded = pending[cut:]

    def _end_number(self) -> None:
        text = "".join(self._raw)
        try:
            value = json.loads(text)
        except ValueError:
            raise ConfigError(f"not a JSON number: {text!r}", key="text") from None
        self._complete_scalar(value)

    def _fail(self, text: str, i: int) -> None:
        raise ConfigError(f"not a prefix of a JSON document: {text[i]!r} at character "
                          f"{self._offset + i} cannot come here", key="text")


def _cut_short(escape: str) -> bool:
    """Whether an escape read at the end of the text so far may still be growing."""
    return escape == "\\" or (escape.startswith("\\u") and len(escape) < 6)


def _high_surrogate(escape: str) -> bool:
    return len(escape) == 6 and escape[1] == "u" and 0xD800 <= int(escape[2:], 16) <= 0xDBFF


_ADAPTERS: dict[tuple[type, str], TypeAdapter[object]] = {}


def _field_adapter(cls: type[BaseModel], name: str, info: FieldInfo) -> TypeAdapter[object]:
    """A cached Pydantic TypeAdapter validating one field's values (its constraints included)."""
    adapter = _ADAPTERS.get((cls, name))
    if adapter is None:
        from pydantic import TypeAdapter

        adapter = _ADAPTERS[(cls, name)] = TypeAdapter[object](info.rebuild_annotation())
    return adapter


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The Pydantic model class of a field annotation (``M``, ``M | None``), else None."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg) if arg is not type(None) else None
        if found is not None:
            return found
    return None


def partial_instance(cls: type[M], data: JsonObject, unfinished: set[str], pointer: str = "") -> M:
    """An instance of the Pydantic model ``cls`` with the fields of the partial object
    ``data`` (at JSON ``pointer`` of a document read by :class:`PartialJsonReader`) that are
    complete. ``unfinished``: the pointers of the values begun and not yet complete (from
    the ``"begin"`` / ``"value"`` / ``"end"`` events). Each complete field is validated on its
    own (its type and constraints; model validators run on the final instance only); an
    object still being read that is a model field becomes a partial instance itself; a list
    appears once closed. ``model_fields_set`` names the fields set; the others are None (or
    their default)."""
    values: dict[str, object] = {}
    fields = cls.model_fields
    for name, info in fields.items():
        key = info.alias or name
        if key not in data:
            continue
        value = data[key]
        at = json_pointer(pointer, key)
        if at in unfinished:
            nested = _model_in(info.annotation)
            if nested is not None and isinstance(value, dict):
                values[name] = partial_instance(nested, value, unfinished, at)
            continue
        values[name] = _field_adapter(cls, name, info).validate_python(value)
    missing = {name: None for name, info in fields.items() if name not in values and info.is_required()}
    return cls.model_construct(_fields_set=set(values), **values, **missing)
