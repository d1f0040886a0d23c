"""The continuous-batching engine behind ``structgen serve``.

One scheduler thread owns the model. Between two steps it lets waiting sequences join the
running batch (their prompts are prefilled on their own and appended as new rows of the
batched KV cache, :meth:`~structgen.generation.model.BatchKV.join`) and drops the rows of
sequences that finished, were cancelled (the client went away) or ran past their deadline; a
step is then the step machine's batched step (:class:`~structgen.generation.step.BatchStep`:
drafts, ONE target forward for every live row, ONE verify call), each sequence with its own
matcher, drafters and sampling options, so a batch mixes schemas, grammars and greedy and
sampled requests. Nobody waits for the slowest sequence of a micro-batch: a row freed at step
``t`` is refilled at step ``t + 1``. This module schedules; the step's mathematics is the
step machine's.

Everything that can be slow and does not need the model runs off the scheduler thread:
compiling the constraint (the front-ends' content-keyed caches make a repeated schema free),
rendering the chat template, tokenising, checking the context and the token budget, building
the matchers. A request whose constraint was prepared before (or that has none) takes a lane
of its own, so it never waits behind a cold compile. Cold preparations share a small pool in
which one client (``client``: the peer address the server passes) holds at most half of the
workers, and each runs inside a :func:`structgen.limits.scope`: a deadline counted from
submission (``prepare_timeout_s``; a request that waited past it is refused as busy) and the
request's cancellation, which every compile and budget-check loop reads. A client that goes
away while its request is prepared stops that work at the next check.

Admission control: at most ``max_running`` sequences in the batch, at most ``max_queued``
sequences compiling or waiting for a row (beyond that :class:`~structgen.errors.ServerBusyError`, HTTP 429),
and a per-request deadline (``request_timeout_s``) after which a sequence ends with
``finish_reason="length"``. :meth:`Engine.close` drains: no new requests, running and
waiting ones finish.

Greedy output of a request is the output :func:`structgen.generate` gives it alone: the
batched step computes each row as that sequence alone (see :func:`~structgen.generation.loop.run_batch`).
"""

from __future__ import annotations

import asyncio
import codecs
import json
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

from structgen import limits
from structgen.calls.formats import ToolFormat, normalize_tools
from structgen.calls.formats import tool_format as get_tool_format
from structgen.calls.plan import plan_output
from structgen.config import CompileOptions, JsonSchemaOptions, SpecConfig
from structgen.errors import (
    ConfigError,
    EngineClosedError,
    RequestCancelledError,
    ServerBusyError,
    TokenBudgetError,
)
from structgen.frontends.constraint import compile_constraint
from structgen.generation.api import conversation_prefix, prompt_ids
from structgen.generation.loop import BATCH_DRAFT_CUT
from structgen.generation.model import CausalLM, check_context, context_length, vocabulary_for
from structgen.generation.results import TokenLogprob, is_complete
from structgen.generation.step import BatchStep, Sequence, StepPlan
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar_cache import cached_grammar, store_grammar
from structgen.serving.compile_workers import CompileWorkers
from structgen.serving.submission import TEXT, ChoiceResult, Constraint, EngineRequest, Event, RequestHandle
from structgen.serving.validity import judge_output, output_check

__all__ = ["ChoiceResult", "Constraint", "Engine", "EngineRequest", "Event", "RequestHandle",
           "SWITCH_INTERVAL_S", "TEXT"]

_T = TypeVar("_T")


@dataclass
class _Lane:
    """One client's share of the cold preparation workers: a semaphore, and the requests
    using it now (the lane is dropped when none does)."""

    semaphore: asyncio.Semaphore
    users: int = 0


class _Slot:
    """One sequence of a request inside the engine: its loop state and its text so far."""

    def __init__(self, handle: RequestHandle, index: int, seq: Sequence, stop: tuple[str, ...],
                 deadline: float | None) -> None:
        self.handle = handle
        self.index = index
        self.seq = seq
        self.stop = stop
        self.deadline = deadline
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.sent = 0          # characters of ``text`` already sent as deltas
        self.ended: str | None = None  # an end the loop does not know: stop_string, timeout, ...
        # logprobs asked: (text offset where the token's text begins, its entry), not yet sent
        self.lp_pending: list[tuple[int, TokenLogprob]] = []
        self.lp_sent: list[TokenLogprob] | None = [] if seq.token_logprobs is not None else None

    def take_logprobs(self, upto: int, final: bool = False) -> list[TokenLogprob] | None:
        """The pending logprob entries of tokens whose text begins before ``upto`` (``final``:
        every pending one, but those after a stop string's cut); None when none are asked."""
        if self.lp_sent is None:
            return None
        cut = len(self.text) if self.ended == "stop_string" else None
        take = [e for start, e in self.lp_pending
                if (start < upto if not final else cut is None or start < cut)]
        self.lp_pending = [] if final else [(st, e) for st, e in self.lp_pending if st >= upto]
        self.lp_sent.extend(take)
        return take


_POLL_S = 0.1  # how often a request being prepared checks that its client is still there

#: The interpreter's thread switch interval while an engine runs (seconds; None: leave it).
#: A cold compile is pure Python and holds the GIL; the scheduler thread gives the GIL up at
#: every torch call and must wait for the compile to yield it back, up to the interval each
#: time. At CPython's default, 5 ms, that is a convoy (one decode step makes hundreds of such
#: calls), and a normal request waits for a hostile compile to finish.
SWITCH_INTERVAL_S: float | None = 2e-4


def _constraint_key(req: EngineRequest) -> str | None:
    """What makes a request's preparation cheap once done: its constraint, tools and
    reasoning (None: not keyable, always prepared as cold)."""
    try:
        return json.dumps([req.constraint.kind, req.constraint.spec, req.constraint.start,
                           req.constraint.strict, req.tools, req.tool_choice, req.parallel_tool_calls,
                           req.reasoning], sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None


def _stop_at(text: str, start: int, stops: tuple[str, ...]) -> int | None:
    """Earliest index >= ``start`` where one of ``stops`` begins in ``text``."""
    found = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    return min(found) if found else None


def _held_back(text: str, start: int, stops: tuple[str, ...]) -> int:
    """Characters at the end of ``text`` (after ``start``) that could begin a stop string: they
    are not sent until the next tokens show whether the stop string follows."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text) - start), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def _fit_budget(seq: Sequence, *, strict: bool) -> str:
    """The ``on_budget`` a request's sequences run with, decided on its first sequence.

    With ``"close"`` every output must end complete within ``max_tokens``; when ``max_tokens`` is
    below the shortest valid output that cannot be, and then a ``strict`` request (its
    ``on_budget`` was ``"close"`` explicitly) is refused with
    :class:`~structgen.errors.TokenBudgetError`, while a request that left the choice to the
    engine is generated as OpenAI does: cut at ``max_tokens`` (``finish_reason="length"``).
    """
    if not seq.close:
        return "cut"
    try:
        seq.check_budget()
    except TokenBudgetError:
        if strict:
            raise
        seq.close = False  # this sequence too: the budget rule would find no way to finish
        return "cut"
    return "close"


def _openai_finish(reason: str) -> str:
    if reason in ("stop", "budget_close", "stop_string"):
        return "stop"
    if reason in ("length", "timeout"):
        return "length"
    return reason


@dataclass
class EngineCounters:
    """The engine's own counters and gauges (exported on ``/metrics``)."""

    running: int = 0
    queued: int = 0
    requests: dict[str, int] = field(default_factory=dict)  # finished sequences by reason
    rejected: int = 0          # requests refused with ServerBusyError
    steps: int = 0             # batched target forwards
    step_rows: int = 0         # sum over steps of the rows in the batch
    output_tokens: int = 0
    joins: int = 0             # join operations (new rows added between steps)
    # finished sequences of constrained requests by verdict (structgen.serving.validity)
    outputs: dict[str, int] = field(default_factory=dict)


class Engine:
    """Continuous batching over one model (see the module docstring).

    ``lm``: a loaded :class:`~structgen.generation.model.CausalLM`; ``cfg``: the speculative
    decoding options; ``speculative=False`` serves plain constrained decoding (the baseline).
    ``json_options`` / ``compile_options``: how constraints compile (``strict`` comes with each
    request). ``prepare_timeout_s``: the most seconds from submission to the end of a request's
    preparation (compile, budget check, matchers), waiting included. ``compile_processes``:
    compile constraints that are in no cache in that many worker processes
    (:mod:`structgen.serving.compile_workers`; 0: on the preparation threads). ``on_result`` is called on
    the scheduler thread with every finished :class:`ChoiceResult` (metrics). ``tool_format``:
    the call format of requests with tools (a registered name or
    :class:`~structgen.calls.formats.ToolFormat`; None: what
    :func:`~structgen.calls.formats.detect_tool_format` finds for the model). Call
    :meth:`start` before submitting, :meth:`close` at the end.
    """

    def __init__(self, lm: CausalLM, *, cfg: SpecConfig | None = None, speculative: bool = True,
                 max_running: int = 16, max_queued: int = 64, default_max_tokens: int = 256,
                 request_timeout_s: float | None = 600.0, compile_workers: int = 2,
                 prepare_timeout_s: float | None = 30.0, compile_processes: int = 0,
                 json_options: JsonSchemaOptions | None = None,
                 compile_options: CompileOptions | None = None, draft_lm: CausalLM | None = None,
                 on_result: Callable[[ChoiceResult], None] | None = None,
                 tool_format: str | ToolFormat | None = None) -> None:
        if max_running < 1 or max_queued < 1 or default_max_tokens < 1:
            raise ConfigError("max_running, max_queued and default_max_tokens must be at least 1")
        self.lm = lm
        self.vocab = vocabulary_for(lm)
        self.cfg = cfg or SpecConfig()
        self.speculative = speculative
        self.max_running = max_running
        self.max_queued = max_queued
        self.default_max_tokens = default_max_tokens
        self.request_timeout_s = request_timeout_s
        self.json_options = json_options or JsonSchemaOptions()
        self.compile_options = compile_options
        self.draft_lm = draft_lm
        self.on_result = on_result
        if tool_format is not None:  # an unknown name fails here, not on the first request
            get_tool_format(tool_format)
        self.tool_format = tool_format
        self.counters = EngineCounters()
        self._eos = set(self.vocab.eos_token_ids)
        if prepare_timeout_s is not None and not prepare_timeout_s > 0:
            raise ConfigError("prepare_timeout_s must be above 0", key="prepare_timeout_s")
        self.prepare_timeout_s = prepare_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max(1, compile_workers),
                                        thread_name_prefix="structgen-compile")
        # requests whose constraint was prepared before: never queued behind a cold compile
        self._warm_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="structgen-prepare")
        self._warm: OrderedDict[str, None] = OrderedDict()  # keys of constraints prepared before
        self._client_share = max(1, compile_workers // 2)  # cold preparations one client may run
        self._lanes: dict[str, _Lane] = {}  # client -> its lane
        self._workers: CompileWorkers | None = None
        if compile_processes > 0:
            self._workers = CompileWorkers(compile_processes)
        # grammars compiled or loaded from disk, by constraint
        self._compiled: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._compiled_lock = threading.Lock()
        self._cond = threading.Condition()
        self._waiting: deque[_Slot] = deque()
        self._pending = 0       # sequences admitted and not yet in the batch (compiling or waiting)
        self._live: list[_Slot] = []   # row r of the batched cache holds _live[r]
        self._batch: BatchStep | None = None  # the batched cache and the step over its rows
        self._closing = False
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> Engine:
        """Start the scheduler thread (once). Also shortens the interpreter's thread switch
        interval to :data:`SWITCH_INTERVAL_S` when it is longer (process-wide; see there)."""
        if self._thread is None:
            if SWITCH_INTERVAL_S is not None and sys.getswitchinterval() > SWITCH_INTERVAL_S:
                sys.setswitchinterval(SWITCH_INTERVAL_S)
            if self._workers is not None:
                self._workers.start()
            self._batch = BatchStep(self.lm, self.cfg, self.max_running, speculative=self.speculative,
                                    cut=BATCH_DRAFT_CUT)
            self._thread = threading.Thread(target=self._run, name="structgen-scheduler", daemon=True)
            self._thread.start()
        return self

    def close(self, *, drain: bool = True, timeout: float | None = 30.0) -> None:
        """Take no new requests; with ``drain`` let running and waiting sequences finish (at
        most ``timeout`` seconds, then cancel them), without it cancel them at once."""
        with self._cond:
            self._closing = True
            if not drain:
                for s in list(self._waiting) + self._live:
                    s.handle.cancel()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                with self._cond:
                    for s in list(self._waiting) + self._live:
                        s.handle.cancel()
                    self._cond.notify_all()
                self._thread.join(5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._warm_pool.shutdown(wait=False, cancel_futures=True)
        if self._workers is not None:
            self._workers.close()

    @property
    def running(self) -> int:
        """Sequences in the batch now."""
        return len(self._live)

    @property
    def queued(self) -> int:
        """Sequences compiling or waiting for a batch row."""
        return self._pending

    # -- submission -----------------------------------------------------------------------------
    def _admit(self, n: int) -> None:
        if n > self.max_queued:  # could never be admitted: a bad request, not a busy server
            raise ConfigError(f"n={n} is above the number of sequences this server queues "
                              f"({self.max_queued})", key="n")
        with self._cond:
            if self._closing or self._thread is None:
                raise EngineClosedError("the server is shutting down" if self._closing
                                        else "the engine is not started")
            if self.failure is not None:
                raise EngineClosedError(f"the engine stopped after an internal error: {self.failure}")
            if self._pending + n > self.max_queued:
                self.counters.rejected += 1
                raise ServerBusyError(f"the server is busy: {self._pending} sequences are already "
                                      f"queued (max {self.max_queued}); retry later")
            self._pending += n
            self.counters.queued = self._pending

    def _unadmit(self, n: int) -> None:
        with self._cond:
            self._pending -= n
            self.counters.queued = self._pending

    async def submit(self, request: EngineRequest, *, client: str | None = None,
                     disconnected: Callable[[], Awaitable[bool]] | None = None) -> RequestHandle:
        """Admit ``request``, prepare it off the scheduler thread (compile, tokenise, checks)
        and queue its sequences for the batch. ``client`` names who sent it (its share of the
        preparation workers); ``disconnected`` is polled while it is prepared, and once it
        answers true the preparation stops (:class:`~structgen.errors.RequestCancelledError`).
        Raises :class:`~structgen.errors.ServerBusyError`,
        :class:`~structgen.errors.EngineClosedError`, or the typed error of a bad request (a bad
        schema, a prompt too long for the context, a budget too small for the constraint, ``n``
        above ``max_queued``)."""
        loop = asyncio.get_running_loop()
        handle = RequestHandle(request.n, loop)
        self._admit(request.n)
        deadline = None if self.prepare_timeout_s is None else limits.now() + self.prepare_timeout_s
        try:
            key = _constraint_key(request)
            if key is not None and key in self._warm:
                slots = await self._watch(loop.run_in_executor(
                    self._warm_pool, self._prepare_within, request, handle, deadline), handle, disconnected)
            else:
                lane = self._lane(client or "")
                try:
                    await self._watch(lane.semaphore.acquire(), handle, disconnected, running=False)
                    try:
                        prepared = loop.run_in_executor(self._pool, self._prepare_within, request,
                                                        handle, deadline)
                        slots = await self._watch(prepared, handle, disconnected)
                    finally:
                        lane.semaphore.release()
                finally:
                    lane.users -= 1
                    if lane.users == 0:
                        del self._lanes[client or ""]
                if key is not None:
                    self._warm[key] = None
                    while len(self._warm) > 1024:
                        self._warm.popitem(last=False)
        except BaseException:
            self._unadmit(request.n)
            raise
        self._enqueue(slots)
        return handle

    def _lane(self, client: str) -> _Lane:
        lane = self._lanes.get(client)
        if lane is None:
            lane = self._lanes[client] = _Lane(asyncio.Semaphore(self._client_share))
        lane.users += 1
        return lane

    @staticmethod
    async def _watch(work: Awaitable[_T], handle: RequestHandle,
                     disconnected: Callable[[], Awaitable[bool]] | None, *, running: bool = True) -> _T:
        """Await ``work``, polling ``disconnected``. Once the client is gone the handle is
        cancelled and :class:`~structgen.errors.RequestCancelledError` raised: at once when the
        work is a wait (``running=False``: a lane), else when the preparation running on a
        pool thread has stopped at its next check of the cancellation."""
        task = asyncio.ensure_future(work)
        if disconnected is None:
            return await task
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_POLL_S)
                if done:
                    return task.result()
                if not handle.cancelled and await disconnected():
                    handle.cancel()
                if handle.cancelled and not running:
                    raise RequestCancelledError("the request was cancelled (its client went away)")
        finally:
            if not task.done():
                handle.cancel()
                task.cancel()

    def _prepare_within(self, req: EngineRequest, handle: RequestHandle,
                        deadline: float | None) -> list[_Slot]:
        """:meth:`_prepare` under the request's limits (deadline, cancellation)."""
        if handle.cancelled:
            raise RequestCancelledError("the request was cancelled (its client went away)")
        if deadline is not None and limits.now() > deadline:
            raise ServerBusyError(f"the server is busy: the request waited over {self.prepare_timeout_s:g} s "
                                  "to be prepared; retry later")
        with limits.scope(deadline=deadline, cancelled=lambda: handle.cancelled, cell=handle.stop_cell):
            return self._prepare(req, handle)

    def submit_sync(self, request: EngineRequest) -> RequestHandle:
        """:meth:`submit` for callers without an event loop (prepares on the calling thread);
        wait with :meth:`RequestHandle.wait`."""
        handle = RequestHandle(request.n, None)
        self._admit(request.n)
        deadline = None if self.prepare_timeout_s is None else limits.now() + self.prepare_timeout_s
        try:
            slots = self._prepare_within(request, handle, deadline)
        except BaseException:
            self._unadmit(request.n)
            raise
        self._enqueue(slots)
        return handle

    def _enqueue(self, slots: list[_Slot]) -> None:
        with self._cond:
            self._waiting.extend(slots)
            self._cond.notify_all()

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The compiled grammar of ``constraint``, cached by content: in memory (by the
        front-ends, or here for grammars compiled in worker processes) and, for JSON schemas,
        on disk (:mod:`structgen.grammar_cache`), so that a restarted server loads the
        response formats it compiled before instead of compiling them again."""
        options = replace(self.json_options, strict=constraint.strict)
        if constraint.unconstrained:
            return compile_constraint(constraint.kind, constraint.spec, start=constraint.start,
                                      json_options=options, compile_options=self.compile_options)
        try:
            key = json.dumps([constraint.kind, constraint.spec, constraint.start, repr(options),
                              repr(self.compile_options)], separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):
            key = None
        if key is not None:
            with self._compiled_lock:
                hit = self._compiled.get(key)
                if hit is not None:
                    self._compiled.move_to_end(key)
                    return hit
        # a schema given as JSON (not a path, not a model class): the disk cache's key
        schema = constraint.spec if constraint.kind == "json" and isinstance(constraint.spec, (dict, bool)) \
            else None
        grammar = None if schema is None else cached_grammar(schema, options=options,
                                                             compile_options=self.compile_options)
        if grammar is None:
            if self._workers is None:
                grammar = compile_constraint(constraint.kind, constraint.spec, start=constraint.start,
                                             json_options=options, compile_options=self.compile_options)
            else:
                grammar = self._workers.compile(constraint.kind, constraint.spec, start=constraint.start,
                                                json_options=options, compile_options=self.compile_options)
            if schema is not None:
                store_grammar(schema, grammar, options=options, compile_options=self.compile_options)
        if key is not None:
            with self._compiled_lock:
                self._compiled[key] = grammar
                while len(self._compiled) > 256:
                    self._compiled.popitem(last=False)
        return grammar

    def _prepare(self, req: EngineRequest, handle: RequestHandle) -> list[_Slot]:
        """Everything before the batch, on a pool thread: compile, tokenise, check."""
        if req.n < 1:
            raise ConfigError("n must be at least 1", key="n")
        vocab = self.vocab
        new_matcher = None
        if req.tools or req.reasoning:
            c = req.constraint  # with tools: the output is calls or this answer
            template_tools = [t.openai() for t in normalize_tools(req.tools)] if req.tools else None
            ids = prompt_ids(self.lm, req.prompt, req.messages, template_tools)
            # the answer (after the reasoning; instead of calls), unless it is any text
            kind = None if c.unconstrained else c.kind
            if kind not in (None, "json", "json_object", "grammar", "regex"):
                raise KeyError(kind)
            plan = plan_output(tools=req.tools or None, tool_choice=req.tool_choice,
                               parallel_tool_calls=req.parallel_tool_calls, tool_format=self.tool_format,
                               chat_template=getattr(self.lm.tokenizer, "chat_template", None),
                               tokenizer=self.lm.tokenizer,
                               reasoning=req.reasoning, thinking_budget=req.thinking_budget,
                               # did the chat template open the thinking block itself?
                               prompt_text=self.vocab.decode_bytes(ids[-8:]).decode("utf-8", "replace"),
                               schema={"type": "object"} if kind == "json_object" else
                               c.spec if kind == "json" else None,
                               strict=c.strict if kind == "json" else kind != "json_object",
                               grammar=c.spec if kind == "grammar" else None,
                               start=c.start if kind == "grammar" else "start",
                               regex=c.spec if kind == "regex" else None)
            handle.plan = plan
            grammar = plan.grammar
            new_matcher = plan.new_matcher
            # the model's own control token may write a marker (Qwen's <tool_call>, <think>)
            vocab = plan.vocabulary(self.vocab, self.lm.tokenizer)
        else:
            template_tools = None
            grammar = self.compile(req.constraint)
            ids = prompt_ids(self.lm, req.prompt, req.messages)
        if not ids:
            raise ConfigError("the prompt encodes to no tokens", key="prompt")
        shared = conversation_prefix(self.lm, req.messages, template_tools, ids)
        max_tokens = req.max_tokens
        if max_tokens is None:
            ctx = context_length(self.lm)
            max_tokens = self.default_max_tokens if ctx is None else \
                max(1, min(self.default_max_tokens, ctx - len(ids)))
        check_context(self.lm, len(ids), max_tokens, draft_lm=self.draft_lm)
        # plain text has nothing to close; a constraint is closed within max_tokens unless
        # the request says otherwise (_fit_budget may still switch it to "cut")
        plain = req.constraint.unconstrained and not req.tools and not req.reasoning
        on_budget = req.on_budget or ("cut" if plain else "close")
        handle.output_check = output_check(req.constraint.kind, unconstrained=req.constraint.unconstrained,
                                           tools=bool(req.tools), reasoning=req.reasoning)
        cfg = self.cfg
        if req.temperature is not None:
            cfg = replace(cfg, temperature=req.temperature)
        if req.top_p is not None:
            cfg = replace(cfg, top_p=req.top_p)
        handle.prompt_tokens = len(ids)
        timeout = req.timeout_s if req.timeout_s is not None else self.request_timeout_s
        deadline = None if timeout is None else time.perf_counter() + timeout
        slots = []
        for i in range(req.n):
            draft = (CausalLM(self.draft_lm.model, self.draft_lm.tokenizer)
                     if self.draft_lm is not None else None)
            seq = Sequence(self.lm, vocab, grammar, ids, cfg, speculative=self.speculative,
                           max_new_tokens=max_tokens, draft_lm=draft,
                           seed=None if req.seed is None else req.seed + i, on_budget=on_budget,
                           new_matcher=new_matcher, shared_prefix=shared, logprobs=req.logprobs)
            if i == 0:
                on_budget = _fit_budget(seq, strict=req.on_budget == "close")
            slots.append(_Slot(handle, i, seq, tuple(s for s in req.stop if s), deadline))
        return slots

    # -- the scheduler thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._waiting and not self._live and not self._closing:
                        self._cond.wait()
                    if self._closing and not self._waiting and not self._live:
                        return
                    joining: list[_Slot] = []
                    room = self.max_running - len(self._live)
                    while self._waiting and len(joining) < room:
                        joining.append(self._waiting.popleft())
                    self._pending -= len(joining)
                    self.counters.queued = self._pending
                gone = [s for s in joining if s.handle.cancelled]
                for s in gone:
                    self._finish(s, "cancelled")
                self._join([s for s in joining if not s.handle.cancelled])
                self._reap()
                if self._live:
                    self._step()
                elif not self._waiting:
                    time.sleep(0)  # nothing to do this round: let the submitters run
        except BaseException as e:  # noqa: BLE001 - every request gets told, then the engine stops
            self.failure = e
            with self._cond:
                victims = list(self._waiting) + self._live
                self._waiting.clear()
                self._live = []
                self._pending = 0
            for s in victims:
                self._finish(s, "error", error=f"{type(e).__name__}: {e}")
            raise

    def _join(self, slots: list[_Slot]) -> None:
        if not slots:
            return
        seqs = [s.seq for s in slots]
        batch = self._batch
        assert batch is not None  # made by start()
        if not self._live:
            batch.prefill(seqs)
        elif not batch.join(seqs):
            with self._cond:  # this cache cannot take rows mid-flight: wait for the batch to empty
                self._waiting.extendleft(reversed(slots))
                self._pending += len(slots)
            return
        t = time.perf_counter()
        for s in slots:
            s.seq.stats.time_prefill = t - s.handle.submitted
        self._live.extend(slots)
        self.counters.joins += 1
        self.counters.running = len(self._live)

    def _drop_rows(self, keep: list[int]) -> None:
        if len(keep) == len(self._live):
            return
        self._live = [self._live[r] for r in keep]
        assert self._batch is not None  # made by start()
        if self._live:
            self._batch.select(keep)
        else:
            self._batch.drop()  # the next request starts a fresh cache
        self.counters.running = len(self._live)

    def _reap(self) -> None:
        """Drop rows whose client went away or whose deadline passed."""
        now = time.perf_counter()
        keep = []
        for r, s in enumerate(self._live):
            if s.handle.cancelled:
                self._finish(s, "cancelled")
            elif s.deadline is not None and now > s.deadline:
                self._finish(s, "timeout")
            else:
                keep.append(r)
        self._drop_rows(keep)

    def _step(self) -> None:
        """One batched step of every live row (:meth:`~structgen.generation.step.BatchStep.run`);
        rows that finish before the forward or after it leave the batch."""
        batch = self._batch
        assert batch is not None  # made by start()
        plans: dict[int, StepPlan] = {}  # id(slot) -> its plan
        for s, p in zip(self._live, batch.prepare([s.seq for s in self._live])):
            if isinstance(p, StepPlan):
                plans[id(s)] = p
            else:  # committed without a forward pass (and finished)
                self._committed(s, p)
        self._settle()  # rows that finished in prepare leave before the forward
        live = self._live
        if not live:
            return
        news = batch.run([s.seq for s in live], [plans[id(s)] for s in live])
        self.counters.steps += 1
        self.counters.step_rows += len(live)
        for s, new in zip(live, news):
            self._committed(s, new)
        if not self._settle():
            batch.compact()

    def _settle(self) -> bool:
        """Finish and drop the rows that ended; whether any did."""
        keep = []
        for r, s in enumerate(self._live):
            reason = s.ended or s.seq.finish
            if reason is not None:
                self._finish(s, reason)
            else:
                keep.append(r)
        changed = len(keep) < len(self._live)
        self._drop_rows(keep)
        return changed

    def _committed(self, s: _Slot, new: list[int]) -> None:
        """Decode newly committed tokens, cut at a stop string, send what is final."""
        if not new:
            return
        st = s.seq.stats
        now = time.perf_counter() - s.handle.submitted
        if st.time_to_first_token is None:
            st.time_to_first_token = now
        st.time_total = now
        self.counters.output_tokens += len(new)
        lps = getattr(s.seq, "token_logprobs", None)
        if lps is None:
            data = s.seq.vocab.decode_bytes([t for t in new if t not in self._eos])
            s.text += s.decoder.decode(data)
        else:  # token by token, to know where each token's text begins
            for t, entry in zip(new, lps[len(lps) - len(new):]):
                if t not in self._eos:
                    s.lp_pending.append((len(s.text), entry))
                    s.text += s.decoder.decode(s.seq.vocab.decode_bytes([t]))
        finished = s.seq.finish is not None
        if finished:
            s.text += s.decoder.decode(b"", final=True)
        cut = _stop_at(s.text, s.sent, s.stop) if s.stop else None
        if cut is not None:
            s.text = s.text[:cut]
            s.ended = "stop_string"
            upto = cut
        else:
            upto = len(s.text) - (0 if finished or not s.stop else _held_back(s.text, s.sent, s.stop))
        if upto > s.sent:
            s.handle.push(Event("delta", s.index, s.text[s.sent:upto], logprobs=s.take_logprobs(upto)))
            s.sent = upto

    def _finish(self, s: _Slot, reason: str, error: str | None = None) -> None:
        seq = s.seq
        seq.finalize_stats()
        seq.stats.time_total = time.perf_counter() - s.handle.submitted
        rest = s.take_logprobs(len(s.text), final=True) if reason != "cancelled" else None
        if (s.sent < len(s.text) or rest) and reason != "cancelled":
            s.handle.push(Event("delta", s.index, s.text[s.sent:], logprobs=rest))
            s.sent = len(s.text)
        res = ChoiceResult(s.index, s.text, list(seq.output), _openai_finish(reason), reason, seq.stats,
                           error, logprobs=s.lp_sent)
        self.counters.requests[reason] = self.counters.requests.get(reason, 0) + 1
        try:
            if s.handle.plan is not None and is_complete(reason):
                res.parts = s.handle.plan.split(s.text)  # constrained calls parse and validate
            res.validity = judge_output(s.handle.output_check, reason, s.text, res.parts)
        except Exception:  # noqa: BLE001 - a verdict that cannot be reached is not a valid output
            res.validity = "invalid"
        if res.validity is not None:
            self.counters.outputs[res.validity] = self.counters.outputs.get(res.validity, 0) + 1
        s.handle.push(Event("done", s.index, result=res))
        if self.on_result is not None:
            try:
                self.on_result(res)
            except Exception:  # noqa: BLE001 - metrics never stop the engine
                pass
