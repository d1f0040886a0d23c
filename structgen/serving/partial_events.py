"""``structgen serve``'s typed partial streaming extension.

A streamed request with ``"stream_options": {"structgen_partial": true}`` and a JSON
``response_format`` (``json_schema`` or ``json_object``) gets, on each chunk of a choice,
a ``structgen_partial`` list: the events that chunk's text completes (see
:class:`~structgen.generation.partial.PartialJsonReader`), each
``{"kind": "begin" | "value" | "end", "pointer": <RFC 6901 JSON pointer>}`` plus
``"value"`` for a ``"value"`` event (a completed string, number, boolean or null). OpenAI
clients ignore the extra field (the official Python client keeps it in
``chunk.model_extra``); without the option nothing changes. A number that ends the output
completes on the choice's finish chunk.
"""

from __future__ import annotations

from typing import Protocol

from structgen.errors import ConfigError
from structgen.generation.partial import PartialEvent, PartialJsonReader

__all__ = ["PARTIAL_KEY", "PartialChunks", "partial_chunks"]

PARTIAL_KEY = "structgen_partial"  # the chunk field the events ride in


class _PartialRequest(Protocol):
    """What :func:`partial_chunks` reads of a request model (chat or completion)."""

    stream: bool


def _wire(event: PartialEvent) -> dict[str, object]:
    out: dict[str, object] = {"kind": event.kind, "pointer": event.pointer}
    if event.kind == "value":  # an "end" leaves out its container: the values already came
        out["value"] = event.value
    return out


class PartialChunks:
    """One event reader per choice of a streamed request."""

    def __init__(self, n: int) -> None:
        self._readers = [PartialJsonReader() for _ in range(n)]

    def events(self, index: int, text: str, *, final: bool = False) -> list[dict[str, object]]:
        """The wire events that choice ``index``'s next ``text`` completes (``final``: the
        choice's output has ended)."""
        reader = self._readers[index]
        events = reader.feed(text)
        if final:
            events += reader.finish()
        return [_wire(e) for e in events]


def partial_chunks(req: _PartialRequest, n: int) -> PartialChunks | None:
    """The readers for a request that asked for partial events, else None. Asking without
    ``stream``, without a JSON ``response_format``, or with tools or reasoning is a
    ConfigError naming ``stream_options.structgen_partial``."""
    options = getattr(req, "stream_options", None)
    if options is None or not getattr(options, "structgen_partial", None):
        return None
    key = "stream_options.structgen_partial"
    if not req.stream:
        raise ConfigError("structgen_partial needs stream: true", key=key)
    fmt = getattr(req, "response_format", None)
    if fmt is None or fmt.type not in ("json_schema", "json_object"):
        raise ConfigError("structgen_partial needs a json_schema or json_object response_format", key=key)
    if getattr(req, "tools", None) or getattr(req, "reasoning", None):
        raise ConfigError("structgen_partial does not combine with tools or reasoning", key=key)
    return PartialChunks(n)
