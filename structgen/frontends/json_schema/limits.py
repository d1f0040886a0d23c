"""Depth limits on user-controlled nesting, checked without recursion.

Python's own recursive code (``json.dumps``/``json.loads``, jsonschema's validator, the
schema lowering) overflows the interpreter stack on deeply nested input and raises a bare
``RecursionError``. structgen measures nesting first, iteratively, and refuses input deeper
than these documented limits with a typed error:

* :data:`MAX_JSON_DEPTH` -- nesting of arrays/objects in a JSON Schema document (a
  :class:`~structgen.errors.CompileLimitError` naming the pointer where it is exceeded;
  ``JsonSchemaOptions.max_depth`` separately bounds the nesting of *subschemas*);
* :data:`MAX_INSTANCE_DEPTH` -- nesting of a JSON instance checked by ``structgen validate``
  (deeper instances are reported as invalid: they cannot be checked).
"""

from __future__ import annotations

from collections.abc import Iterable

from structgen.errors import CompileLimitError

__all__ = ["MAX_JSON_DEPTH", "MAX_INSTANCE_DEPTH", "json_depth", "check_schema_depth"]

#: Deepest array/object nesting accepted in a schema document.
MAX_JSON_DEPTH = 600
#: Deepest array/object nesting of an instance that ``structgen validate`` checks.
MAX_INSTANCE_DEPTH = 256


def json_depth(value: object, limit: int) -> tuple[int, str]:
    """(depth, pointer): the nesting depth of arrays/objects in ``value`` (a scalar is 0),
    measured iteratively; stops at the first container deeper than ``limit`` and returns
    its depth and JSON pointer (RFC 6901)."""
    best = 0
    stack: list[tuple[object, int, tuple[object, ...]]] = [(value, 0, ())]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict):
            items: Iterable[tuple[object, object]] = node.items()
        elif isinstance(node, (list, tuple)):
            items = enumerate(node)
        else:
            continue
        depth += 1
        if depth > best:
            best = depth
            if depth > limit:
                ptr = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)
                return depth, ptr
        for k, v in items:
            if isinstance(v, (dict, list, tuple)):
                stack.append((v, depth, path + (k,)))
    return best, ""


def check_schema_depth(schema: object, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`CompileLimitError` if ``schema`` nests arrays/objects deeper than
    ``limit``."""
    depth, ptr = json_depth(schema, limit)
    if depth > limit:
        where = ptr if len(ptr) <= 80 else ptr[:77] + "..."
        raise CompileLimitError(f"schema document nested deeper than {limit} levels at {where or '#'} "
                                "(structgen.frontends.json_schema.limits.MAX_JSON_DEPTH)", pointer=ptr or "#")
