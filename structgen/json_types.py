"""Static types of decoded JSON: what ``json.loads`` returns, named once for every layer.

``JsonValue`` is recursive, so code that reads a schema or a request body narrows with
``isinstance`` before it indexes, and mypy checks that it does."""

from __future__ import annotations

from typing import TypeAlias, Union

JsonValue: TypeAlias = Union[None, bool, int, float, str, "list[JsonValue]", "dict[str, JsonValue]"]
JsonObject: TypeAlias = "dict[str, JsonValue]"
JsonArray: TypeAlias = "list[JsonValue]"

__all__ = ["JsonArray", "JsonObject", "JsonValue"]
