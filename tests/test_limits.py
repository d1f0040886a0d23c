"""``structgen.limits``: the request scope (deadline, cancellation, stop cell) that compiling
reads, and the injectable clock (issue 44).

Oracles: the typed errors structgen documents; a compile left alone (no scope) for what a
stopped compile must not have cached; the kernels' own status codes. No test reads the wall
clock: deadlines run on a :class:`~structgen.limits.StepClock`.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import structgen
from structgen import limits
from structgen.errors import CompileTimeoutError, RequestCancelledError

# its automaton is built by the product kernel (oneOf: each branch minus the others)
ONE_OF = {"oneOf": [{"type": "string", "pattern": f"^(a|b)*a(a|b){{{k}}}$"} for k in range(4, 9)]}


def test_step_clock_advances_per_read() -> None:
    clock = limits.StepClock(step=0.5, start=10.0)
    with limits.use_clock(clock):
        assert limits.now() == 10.5
        assert limits.now() == 11.0
    assert clock.reads == 2
    assert limits.now() != 11.5  # the real clock is back


def test_scopes_nest_earliest_deadline_and_both_tests() -> None:
    clock = limits.StepClock(step=0.0, start=100.0)
    with limits.use_clock(clock):
        flag = [False]
        with limits.scope(timeout_s=5.0):
            with limits.scope(timeout_s=50.0, cancelled=lambda: flag[0]) as inner:
                assert inner.deadline == 105.0
                assert limits.deadline_within(200.0) == 105.0
                limits.check()
                flag[0] = True
                with pytest.raises(RequestCancelledError):
                    limits.check()
        assert limits.current() is None
        limits.check()  # outside any scope: nothing to cancel


def test_a_set_stop_cell_stops_the_compile_and_caches_nothing() -> None:
    cell = limits.new_stop_cell()
    cell[0] = 1
    with limits.scope(cell=cell), pytest.raises(RequestCancelledError):
        structgen.compile_json_schema({**ONE_OF, "title": "stopped"})
    assert limits.stop_cell() is not cell  # the scope is gone
    cg = structgen.compile_json_schema({**ONE_OF, "title": "stopped"})  # compiles in full now
    assert cg.accepts('"abbbb"') and not cg.accepts('"aabbbb"')  # one branch: k=4; two: k=4, 5


def test_the_native_kernels_poll_the_stop_cell() -> None:
    from structgen.grammar import _fsa_kernels as dk

    if not dk.COMPILED:
        pytest.skip("numba is not in use")
    n = 64  # a long chain: plenty of inner steps before the kernel would finish
    trans = np.full((n, 256), -1, dtype=np.int32)
    trans[np.arange(n - 1), 97] = np.arange(1, n, dtype=np.int32)
    acc = np.zeros(n, dtype=np.bool_)
    acc[-1] = True
    go, stop = limits.new_stop_cell(), limits.new_stop_cell()
    stop[0] = 1
    assert dk.product(trans, acc, trans, acc, True, 10_000, 1 << 40, go)[0] == dk.OK
    assert dk.product(trans, acc, trans, acc, True, 10_000, 1 << 40, stop)[0] == dk.OUT_OF_TIME
    assert dk.minimise(trans, acc, 1 << 40, stop)[0] == dk.OUT_OF_TIME


def test_cancelling_from_another_thread_stops_a_compile() -> None:
    cell = limits.new_stop_cell()
    started = threading.Event()
    outcome: list[BaseException | None] = []

    def cancel_on_first_check() -> bool:
        started.set()
        cell[0] = 1  # as a server's event loop would, while the compile runs
        return False

    def work() -> None:
        try:
            with limits.scope(cell=cell, cancelled=cancel_on_first_check):
                structgen.compile_json_schema({**ONE_OF, "title": "threaded"})
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the outcome is the assertion
            outcome.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join(120)
    assert started.is_set()
    assert isinstance(outcome[0], RequestCancelledError)


def test_a_scope_deadline_bounds_a_compile_with_a_longer_timeout() -> None:
    schema = {**ONE_OF, "title": "deadline"}
    # the compile reads the clock about 70 times: 1 ms a read passes a 10 ms deadline
    with limits.use_clock(limits.StepClock(step=1e-3)), limits.scope(timeout_s=0.01):
        with pytest.raises(CompileTimeoutError):
            structgen.compile_json_schema(schema, compile_options=structgen.CompileOptions(timeout_s=1e6))
