"""Request preparation in ``structgen serve``'s engine under hostile load (issue 44): a client
that goes away stops its preparation, one client cannot hold every preparation worker, a
request whose constraint was prepared before never waits behind a cold compile, a request
that waited past its preparation deadline is refused as busy, and ``n`` above the queue limit
is a bad request rather than "retry later".

The engine is real (tiny Llama over GPT-2's tokenizer); where a test needs a compile that
takes long, :meth:`Engine.compile` is replaced by one that blocks until released while
reading :func:`structgen.limits.check` as every compile loop does, so that the timing is in
the test's hands and not the machine's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from structgen import limits
from structgen.errors import ConfigError, RequestCancelledError

pytestmark = pytest.mark.assets

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def tiny_lm(tokenizer_by_alias: Any) -> Any:
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    return CausalLM(build_tiny_llama(tok, "random"), tok)


class BlockingCompile:
    """Stands in for :meth:`Engine.compile` for constraints whose spec is marked ``slow``:
    blocks until :attr:`release` is set, reading the request's limits meanwhile."""

    def __init__(self, engine: Any) -> None:
        self.real = engine.compile
        self.release = threading.Event()
        self.started = 0
        self.stopped_by_cancel = 0
        self.lock = threading.Lock()

    def __call__(self, constraint: Any) -> Any:
        spec = constraint.spec
        if isinstance(spec, dict) and spec.get("slow"):
            with self.lock:
                self.started += 1
            try:
                while not self.release.wait(0.01):
                    limits.check()
            except RequestCancelledError:
                with self.lock:
                    self.stopped_by_cancel += 1
                raise
            spec = {k: v for k, v in spec.items() if k != "slow"}
            constraint = type(constraint)(constraint.kind, spec, constraint.start, constraint.strict)
        return self.real(constraint)


def _engine(lm: Any, **kw: Any) -> tuple[Any, BlockingCompile]:
    from structgen.serving.engine import Engine

    engine = Engine(lm, max_running=2, max_queued=8, default_max_tokens=8, compile_workers=2, **kw)
    blocker = BlockingCompile(engine)
    engine.compile = blocker  # type: ignore[method-assign]
    return engine.start(), blocker


def _request(slow: bool, tag: int = 0, **kw: Any) -> Any:
    from structgen.serving.engine import Constraint, EngineRequest

    spec = {**SCHEMA, "title": f"t{tag}", **({"slow": True} if slow else {})}
    return EngineRequest(Constraint("json", spec), prompt="JSON:", max_tokens=8, **kw)


def _until(cond: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def test_n_above_the_queue_limit_is_a_bad_request(tiny_lm: Any) -> None:
    engine, _ = _engine(tiny_lm)
    try:
        with pytest.raises(ConfigError) as e:
            engine.submit_sync(_request(False, n=9))
        assert e.value.key == "n"
        assert engine.queued == 0
    finally:
        engine.close(drain=False)


def test_a_client_that_goes_away_stops_its_preparation(tiny_lm: Any) -> None:
    engine, blocker = _engine(tiny_lm)

    async def main() -> None:
        gone = asyncio.Event()

        async def disconnected() -> bool:
            return gone.is_set()

        task = asyncio.ensure_future(engine.submit(_request(True), client="a", disconnected=disconnected))
        await asyncio.get_running_loop().run_in_executor(None, _until, lambda: blocker.started == 1)
        gone.set()
        with pytest.raises(RequestCancelledError):
            await asyncio.wait_for(task, 10)
        assert blocker.stopped_by_cancel == 1  # the compile itself stopped, not just the wait
        assert engine.queued == 0
        # the worker is free again: the next request of the same client is prepared and served
        blocker.release.set()
        handle = await asyncio.wait_for(engine.submit(_request(True, 1), client="a"), 10)
        results = await asyncio.wait_for(handle.results(), 60)
        assert results[0].reason != "error"

    try:
        asyncio.run(main())
    finally:
        engine.close(drain=False)


def test_one_client_holds_at_most_its_share_and_warm_requests_skip_the_queue(tiny_lm: Any) -> None:
    engine, blocker = _engine(tiny_lm)

    async def main() -> None:
        # prepared once: the same constraint is warm from now on
        handle = await engine.submit(_request(False, 7), client="b")
        await handle.results()
        hostile = [asyncio.ensure_future(engine.submit(_request(True, i), client="a")) for i in range(3)]
        await asyncio.sleep(0.3)
        assert blocker.started == 1  # client a holds one of the two workers, its others wait
        # another client's cold request takes the other worker at once
        other = await asyncio.wait_for(engine.submit(_request(False, 8), client="b"), 10)
        # and a warm request of client a itself does not wait behind its own cold compiles
        warm = await asyncio.wait_for(engine.submit(_request(False, 7), client="a"), 10)
        for h in (other, warm):
            assert (await asyncio.wait_for(h.results(), 60))[0].reason != "error"
        blocker.release.set()
        for t in hostile:
            await asyncio.wait_for(t, 30)
        assert blocker.started == 3

    try:
        asyncio.run(main())
    finally:
        blocker.release.set()
        engine.close(drain=False)


def test_a_request_that_waited_past_its_preparation_deadline_is_busy(tiny_lm: Any) -> None:
    from structgen.errors import ServerBusyError

    clock = limits.StepClock(step=0.0)
    with limits.use_clock(clock):
        engine, blocker = _engine(tiny_lm, prepare_timeout_s=100.0)

        async def main() -> None:
            first = asyncio.ensure_future(engine.submit(_request(True, 1), client="a"))
            await asyncio.get_running_loop().run_in_executor(None, _until, lambda: blocker.started == 1)
            engine.prepare_timeout_s = 5.0  # for the second request only
            second = asyncio.ensure_future(engine.submit(_request(True, 2), client="a"))
            await asyncio.sleep(0.2)  # it waits for client a's lane
            clock.t += 6.0  # the second request has waited past its deadline behind the first
            blocker.release.set()
            await asyncio.wait_for(first, 30)
            with pytest.raises(ServerBusyError, match="waited over 5 s"):
                await asyncio.wait_for(second, 30)
            assert blocker.started == 1  # refused before it compiled anything

        try:
            asyncio.run(main())
        finally:
            blocker.release.set()
            engine.close(drain=False)
