"""Compiling in worker processes (``structgen serve --compile-processes``): the grammar that
comes back is the one compiled in process, typed errors come back with their locations, and a
cancelled or late compile kills its worker, which is replaced.

Oracles: :func:`structgen.frontends.constraint.compile_constraint` in this process (the same
strings accepted and refused), the typed errors it raises here. Deadlines run on a
:class:`~structgen.limits.StepClock`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from structgen import limits
from structgen.config import JsonSchemaOptions
from structgen.errors import (
    CompileLimitError,
    CompileTimeoutError,
    GrammarError,
    RequestCancelledError,
    SchemaError,
)
from structgen.frontends.constraint import compile_constraint
from structgen.serving.compile_workers import CompileWorkers

# a oneOf of exploding patterns: seconds of compile in the product kernel
SLOW = {"oneOf": [{"type": "string", "pattern": f"^(a|b)*a(a|b){{{k}}}$"} for k in range(8, 15)]}
OPTIONS = JsonSchemaOptions()


@pytest.fixture(scope="module")
def workers() -> Iterator[CompileWorkers]:
    w = CompileWorkers(1)
    w.start()
    yield w
    w.close()


def _compile(w: CompileWorkers, kind: str, spec: object, start: str = "start") -> object:
    return w.compile(kind, spec, start=start, json_options=OPTIONS, compile_options=None)


@pytest.mark.parametrize(("kind", "spec", "yes", "no"), [
    ("json", {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}, "required": ["n"]},
     '{"n":4}', '{"n":2}'),
    ("grammar", 'start: "SELECT " COL ("," COL)*\nCOL: /[a-z]{1,4}/\n', "SELECT ab,c", "SELECT ab,"),
    ("regex", r"[A-Z][a-z]{2,5}\d?", "Abc1", "abc"),
])
def test_the_grammar_that_comes_back_is_the_one_compiled_here(workers: CompileWorkers, kind: str,
                                                             spec: object, yes: str, no: str) -> None:
    remote = _compile(workers, kind, spec)
    local = compile_constraint(kind, spec, json_options=OPTIONS)
    for text in (yes, no, yes[:-1]):
        assert remote.accepts(text) == local.accepts(text), text  # type: ignore[attr-defined]
        assert remote.accepts_prefix(text) == local.accepts_prefix(text), text  # type: ignore[attr-defined]
    assert remote.accepts(yes) and not remote.accepts(no)  # type: ignore[attr-defined]


def test_typed_errors_come_back_with_their_locations(workers: CompileWorkers) -> None:
    with pytest.raises(SchemaError) as e:
        _compile(workers, "json", {"type": "object", "properties": {"a": {"type": "strin"}}})
    assert (e.value.pointer, e.value.keyword) == ("#/properties/a", "type")
    with pytest.raises(CompileLimitError) as e2:
        _compile(workers, "json", {"type": "array", "items": {"type": "integer"}, "minItems": 10**9})
    assert e2.value.pointer == "#"
    with pytest.raises(GrammarError) as e3:
        _compile(workers, "grammar", 'start: "a" undefined_rule\n')
    assert "undefined_rule" in str(e3.value)


def test_a_cancelled_compile_kills_its_worker_which_is_replaced(workers: CompileWorkers) -> None:
    cell = limits.new_stop_cell()
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            with limits.scope(cell=cell):
                _compile(workers, "json", {**SLOW, "title": "cancelled"})
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the outcome is the assertion
            outcome.append(e)

    killed = workers.killed
    t = threading.Thread(target=work)
    t.start()
    cell[0] = 1  # at once: the job is refused before or stopped while it runs
    t.join(60)
    assert isinstance(outcome[0], RequestCancelledError)
    assert workers.killed in (killed, killed + 1)  # killed only if the job had reached it
    assert _compile(workers, "regex", "ab+").accepts("abb")  # type: ignore[attr-defined]


def test_a_compile_past_its_deadline_kills_its_worker(workers: CompileWorkers) -> None:
    killed = workers.killed
    with limits.use_clock(limits.StepClock(step=1.0)), limits.scope(timeout_s=3.0):
        with pytest.raises(CompileTimeoutError):
            _compile(workers, "json", {**SLOW, "title": "late"})
    assert workers.killed == killed + 1
    assert _compile(workers, "regex", "x|y").accepts("y")  # type: ignore[attr-defined]
