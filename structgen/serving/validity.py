"""Whether a served output is valid: the verdict ``/metrics`` counts.

Only outputs that had something to match are judged: a request with ``response_format``
json_schema / json_object / grammar / regex, tools, or reasoning. Plain chat (no
``response_format``) has no constraint, so it is never counted for or against validity.

A judged output is

* ``"incomplete"`` when it did not end complete: cut at ``max_tokens`` (``finish_reason:
  "length"``), at the request deadline, or at a stop string. An incomplete output is not an
  instance of its schema, so it counts against the validity ratio, as in ``structgen generate``;
  a client that counts "finish_reason is stop and the output validates" counts the same;
* ``"valid"`` when it ended complete (the constraint's matcher accepted it in full), its tool
  calls parsed and validated against their tools' schemas (the tool-calling plan's own
  reader), and, for a JSON constraint, its text parses as JSON (``json.loads``: an oracle
  independent of the grammar, cheap enough for the scheduler thread);
* ``"invalid"`` otherwise: a complete output that one of those checks refused, which is a
  structgen bug.

Full ``jsonschema`` validation of every served output is left to offline checks (the test
suite and ``benchmarks/serve.py`` validate served outputs with ``jsonschema``): it would cost
the scheduler thread a validator per schema, and a schema's ``$ref`` could make it fetch.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from structgen.generation.results import is_complete

if TYPE_CHECKING:  # pragma: no cover
    from structgen.calls.plan import ToolCall

__all__ = ["VALIDITIES", "judge_output", "output_check"]

#: The verdicts :func:`judge_output` gives (None: not judged).
VALIDITIES = ("valid", "invalid", "incomplete")


def output_check(constraint_kind: str, *, unconstrained: bool, tools: bool, reasoning: bool) -> str | None:
    """How a request's outputs are judged: ``"json"`` (complete and JSON text), ``"complete"``
    (complete, calls valid) or None (plain text: not judged)."""
    if unconstrained and not tools and not reasoning:
        return None
    if not unconstrained and constraint_kind in ("json", "json_object"):
        return "json"
    return "complete"


def judge_output(check: str | None, reason: str, text: str,
                 parts: tuple[str | None, str, list[ToolCall], list[str]] | None = None) -> str | None:
    """The verdict on one finished output (see the module docstring): ``check`` from
    :func:`output_check`, ``reason`` the engine's finish reason, ``parts`` the output as the
    request's tool-calling plan read it (``OutputPlan.split``; None without tools or
    reasoning). None: not judged."""
    if check is None or reason in ("cancelled", "error"):
        return None
    if not is_complete(reason):
        return "incomplete"
    if parts is not None:
        _thought, text, calls, errors = parts
        if errors:
            return "invalid"
        if calls and not text.strip():  # the answer is the calls, checked above
            return "valid"
    if check == "json":
        try:
            json.loads(text)
        except ValueError:
            return "invalid"
    return "valid"
