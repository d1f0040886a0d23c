"""JSON extraction tasks: a text that states the facts, a schema, and the reference answer.

The data lives in the package (:mod:`structgen.tools.bench_tasks`, used by ``structgen bench``);
this module keeps the names the scripts in ``benchmarks/`` import.
"""

from __future__ import annotations

from structgen.tools.bench_tasks import EXTRACTION_TASKS as TASKS
from structgen.tools.bench_tasks import extraction_messages as messages

__all__ = ["TASKS", "messages"]
