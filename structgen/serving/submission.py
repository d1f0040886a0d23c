"""What a caller hands the continuous-batching engine and what it gets back.

A request (:class:`EngineRequest`, with its :class:`Constraint`) is submitted to
:class:`~structgen.serving.engine.Engine`, which answers with a :class:`RequestHandle`: its
:class:`Event` stream (text deltas, then a :class:`ChoiceResult` per choice). These types need
no model and no torch: the HTTP layer and the request models build and read them.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from structgen import limits
from structgen.calls.plan import OutputPlan, ToolCall
from structgen.generation.results import GenerationStats, TokenLogprob, is_complete

__all__ = ["ChoiceResult", "Constraint", "EngineRequest", "Event", "RequestHandle", "TEXT"]


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match: a constraint kind of
    :func:`structgen.frontends.constraint.compile_constraint` (``"json"``, ``"json_object"``,
    ``"grammar"``, ``"regex"``) and its spec; ``start`` is a Lark grammar's start rule and
    ``strict`` the JSON Schema option (:attr:`~structgen.config.JsonSchemaOptions.strict`)."""

    kind: str
    spec: object = None
    start: str = "start"
    strict: bool = True

    @property
    def unconstrained(self) -> bool:
        """Whether this is :data:`TEXT` (any text: plain chat, no ``response_format``)."""
        return self == TEXT


#: Every text at all: the constraint of a request without ``response_format``.
TEXT = Constraint("regex", r"[\s\S]*")


@dataclass
class EngineRequest:
    """One request: a prompt (text) or messages (a chat template renders them), its
    constraint and options. ``None`` options take the engine's defaults: ``max_tokens`` the
    engine's ``default_max_tokens`` (or what the context leaves), ``temperature`` / ``top_p``
    the engine's :class:`~structgen.config.SpecConfig`, ``on_budget`` ``"close"`` for a
    constraint (``"cut"`` when ``max_tokens`` is below its shortest output: OpenAI's
    ``finish_reason="length"``) and ``"cut"`` for :data:`TEXT`; an explicit ``"close"`` refuses
    that ``max_tokens`` (:class:`~structgen.errors.TokenBudgetError`). ``n`` sequences are
    generated (choice ``i`` seeded ``seed + i``); generation of a choice stops at the first of
    ``stop``'s strings (which is not part of its text)."""

    constraint: Constraint = TEXT
    prompt: str | None = None
    messages: list[dict[str, object]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    on_budget: str | None = None
    timeout_s: float | None = None
    # tool calling (structgen.calls.plan): OpenAI function specs, the choice
    tools: Sequence[object] | None = None
    tool_choice: str | dict[str, object] = "auto"
    parallel_tool_calls: bool = True
    # reasoning first (<think>...</think>, at most thinking_budget tokens), then the answer
    reasoning: bool = False
    thinking_budget: int | None = None
    # None: no log-probabilities (nothing computed); k: each output token's logprob and its k
    # most likely alternatives (structgen.generation.results.TokenLogprob)
    logprobs: int | None = None


@dataclass
class ChoiceResult:
    """One finished sequence of a request. ``finish_reason`` is OpenAI's (``"stop"``:
    complete or a stop string; ``"length"``: cut at ``max_tokens`` or at the deadline;
    ``"cancelled"``: the client went away); ``reason`` the engine's own (the loop's
    ``stop`` / ``budget_close`` / ``length``, or ``stop_string``, ``timeout``, ``cancelled``,
    ``error``); ``complete``: the output matches its constraint in full. ``logprobs`` (when
    the request asked): a :class:`~structgen.generation.results.TokenLogprob` per token of
    ``text`` (EOS and tokens after a stop string left out)."""

    index: int
    text: str
    tokens: list[int]
    finish_reason: str
    reason: str
    stats: GenerationStats
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
    # "valid" / "invalid" / "incomplete" against the request's constraint; None: plain text,
    # or cancelled (structgen.serving.validity)
    validity: str | None = None
    # a complete output of a request with tools or reasoning, read once by its plan
    # (OutputPlan.split): (reasoning, answer text, tool calls, errors); the routes answer from it
    parts: tuple[str | None, str, list[ToolCall], list[str]] | None = None

    @property
    def complete(self) -> bool:
        """Whether the output ended complete (its constraint matched in full)."""
        return is_complete(self.reason)


@dataclass
class Event:
    """What a :class:`RequestHandle` yields: ``kind`` ``"delta"`` (``text`` newly committed to
    choice ``index``, never taken back) or ``"done"`` (choice ``index`` finished: ``result``).
    A delta of a request that asked for logprobs carries in ``logprobs`` the entries of the
    tokens whose text begins in it (a token that adds no text rides with the next delta)."""

    kind: str
    index: int
    text: str = ""
    result: ChoiceResult | None = None
    logprobs: list[TokenLogprob] | None = None


class RequestHandle:
    """A submitted request: iterate :meth:`events` (or await :meth:`results`); :meth:`cancel`
    frees its batch rows at the next step boundary. ``prompt_tokens`` is the prompt's length
    in tokens, ``created`` the submission time (``time.time()``)."""

    _ids = itertools.count(1)

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self.id = next(self._ids)
        self.n = n
        self.prompt_tokens = 0
        self.created = time.time()
        self.submitted = time.perf_counter()
        self.cancelled = False
        self.stop_cell = limits.new_stop_cell()  # read by the compiled kernels of its preparation
        self.plan: OutputPlan | None = None  # the tool-calling plan (OutputPlan) of a request with tools
        self.output_check: str | None = None  # how its outputs are judged (serving.validity)
        self._loop = loop
        self._queue: asyncio.Queue[Event] | None = asyncio.Queue() if loop is not None else None
        self._sync: deque[Event] = deque()
        self._sync_ready = threading.Condition()
        self._done = 0

    def cancel(self) -> None:
        """Stop preparing or generating this request (its rows leave the batch at the next
        step; its preparation stops at its next check)."""
        self.cancelled = True
        self.stop_cell[0] = 1

    def push(self, event: Event) -> None:
        """Deliver ``event`` to whoever reads this handle (from the scheduler thread)."""
        if self._loop is None:
            with self._sync_ready:
                self._sync.append(event)
                self._sync_ready.notify_all()
            return
        try:
            assert self._queue is not None  # made with the loop
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody listens any more
            self.cancel()

    async def events(self) -> AsyncIterator[Event]:
        """The request's events in order, until every choice is done."""
        assert self._queue is not None, "a handle submitted with submit_sync has no async events"
        done = 0
        while done < self.n:
            ev = await self._queue.get()
            done += ev.kind == "done"
            yield ev

    async def results(self) -> list[ChoiceResult]:
        """Wait for every choice; the results in choice order."""
        out: list[ChoiceResult] = []
        async for ev in self.events():
            if ev.kind == "done" and ev.result is not None:
                out.append(ev.result)
        return sorted(out, key=lambda r: r.index)

    def wait(self, timeout: float | None = None) -> list[ChoiceResult]:
        """Blocking :meth:`results` for a handle from :meth:`Engine.submit_sync`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[ChoiceResult] = []
        with self._sync_ready:
            while len(out) < self.n:
                while not self._sync:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"request {self.id} did not finish in {timeout} s")
                    self._sync_ready.wait(left)
                ev = self._sync.popleft()
                if ev.kind == "done" and ev.result is not None:
                    out.append(ev.result)
        return sorted(out, key=lambda r: r.index)
