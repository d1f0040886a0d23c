"""JSON extraction tasks: a text that states the facts, a schema, and the reference answer.

The data lives with the benchmark suite's other tasks (``benchmarks/tasks/suite.py``); this
module keeps the names the scripts in ``benchmarks/`` import.
"""

from __future__ import annotations

from benchmarks.tasks.suite import EXTRACTION_TASKS as TASKS
from benchmarks.tasks.suite import extraction_messages as messages

__all__ = ["TASKS", "messages"]
