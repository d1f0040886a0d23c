"""Pydantic class in, validated instance out (nested and recursive models included).

    python examples/pydantic_model.py [--model ALIAS_OR_FOLDER]

``structgen.generate_model`` compiles the class's JSON schema (``$defs``/``$ref`` for the
nested ``Person`` and the recursive ``Task.subtasks``), generates, and returns an instance
of the class (validated by Pydantic). Prints the instance as JSON on stdout.

Pydantic models accept unknown keys by default, and their JSON schema then allows any extra
property; ``extra="forbid"`` closes the objects so that the model cannot wander off into
invented keys.
"""

from __future__ import annotations

import argparse
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import structgen
from structgen.generation.api import DEFAULT_MODEL


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")  # no extra keys: the schema says additionalProperties false

    name: str = Field(max_length=40)
    email: str | None = Field(max_length=60)


class Task(BaseModel):
    """A task with an owner and (recursively) sub-tasks."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(max_length=60)
    priority: Literal["low", "medium", "high"]
    done: bool
    owner: Person
    subtasks: list[Task] = Field(max_length=3)


PROMPT = ('Convert to JSON: task "Ship v1.0" (priority high, done false, owner Grace, '
          'grace@example.com) with subtasks: [task "Write changelog" (priority low, done false, '
          'owner Alan, email null, subtasks: [])].')


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model alias or local folder")
    ap.add_argument("--max-new-tokens", type=int, default=300)
    args = ap.parse_args(argv)

    try:
        task = structgen.generate_model(args.model, Task, PROMPT, max_new_tokens=args.max_new_tokens)
    except ValueError as e:  # output cut short by --max-new-tokens
        print(e, file=sys.stderr)
        return 1
    assert isinstance(task, Task)
    print(task.model_dump_json())

    def count(t: Task) -> int:
        return 1 + sum(count(s) for s in t.subtasks)

    print(f"{count(task)} task(s); owner of the root task: {task.owner.name!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
