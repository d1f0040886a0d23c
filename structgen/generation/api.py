"""User-facing generation API: :func:`generate`, :func:`stream`, :func:`generate_model`,
:func:`stream_model`.

::

    import structgen
    r = structgen.generate("smollm2-135m", schema={"type": "object", ...},
                           messages=[{"role": "user", "content": "..."}])
    r.text, r.value, r.tokens, r.finish_reason, r.stats

``model`` is a transformers causal LM (tokenizer taken from it or given), a local
directory, or the alias of a model pulled into the cache with ``structgen models pull``
(default ``qwen2.5-coder-0.5b``). Exactly one
of ``schema`` (dict, JSON text or Pydantic class), ``grammar`` (Lark text) or ``regex``
constrains the output. Greedy speculative output is token-identical to
``speculative=False``; sampled output has the same distribution.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, cast, overload

from structgen.assets.store import DEFAULT_MODEL
from structgen.calls.formats import Tool, ToolFormat, normalize_tools
from structgen.calls.plan import OutputPlan, OutputStream, ToolCall, plan_output
from structgen.config import SpecConfig
from structgen.errors import ConfigError, ModelValidationError, StructgenError, attribute_to_request
from structgen.frontends.constraint import is_model_class
from structgen.generation.call_options import (
    CallOptions,
    ConfigSource,
    Constraint,
    Request,
    check_requests,
    compile_all,
    logprob_count,
    merge_options,
    per_request,
    resolve_grammar,
)
from structgen.generation.loop import (
    BatchStats,
    check_budget,
    run_batch,
    run_sequence,
    sequence_result,
    stream_sequence,
)
from structgen.generation.messages import Message
from structgen.generation.model import CausalLM, ModelSource, check_context, load_model, vocabulary_for
from structgen.generation.partial import PartialEvent, PartialJsonReader, partial_instance
from structgen.generation.prompts import conversation_prefix, prompt_ids, template_messages
from structgen.generation.results import GenerationStats, SequenceResult, TokenLogprob, is_complete
from structgen.generation.step import Sequence as SequenceState
from structgen.json_types import JsonValue
from structgen.masks.matcher import Matcher
from structgen.masks.vocab import Vocabulary

if TYPE_CHECKING:
    from pydantic import BaseModel
    from transformers import PreTrainedTokenizerBase

__all__ = ["BatchResults", "GenerationResult", "StreamEvent", "generate", "stream", "generate_model",
           "stream_model",
           "DEFAULT_MODEL", "conversation_prefix", "prompt_ids", "resolve_grammar", "template_messages"]

M = TypeVar("M", bound="BaseModel")
#: ``tools=``: OpenAI function specs, Pydantic model classes or Python functions, one or a list
#: (see :func:`~structgen.calls.formats.normalize_tools`)
Tools = Union[Sequence[object], Mapping[str, object], Callable[..., object], Tool]
#: one conversation (OpenAI-style messages)
Conversation = Sequence[Mapping[str, object]]


@dataclass
class GenerationResult:
    """One generated output.

    text: the generated text (EOS excluded); value: the parsed JSON value (or the Pydantic
    instance when a Pydantic class was the schema), None when the output is incomplete;
    tokens: generated token ids (EOS included if emitted); finish_reason: "stop" (complete),
    "budget_close" (complete, steered to fit ``max_new_tokens``) or "length" (cut short, with
    ``on_budget="cut"``); stats: :class:`~structgen.generation.loop.GenerationStats`.
    With ``tools=`` or ``reasoning=True``: ``text`` is the answer's free text (calls and
    reasoning removed; the whole output is ``extra["raw_text"]``), ``tool_calls`` the
    validated :class:`~structgen.calls.plan.ToolCall` list, ``reasoning`` the text
    inside the thinking markers.
    logprobs (with ``logprobs=True``): one
    :class:`~structgen.generation.results.TokenLogprob` per token of ``tokens`` (EOS
    included), else None.
    """

    text: str
    value: object
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats
    error: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None
    logprobs: list[TokenLogprob] | None = None

    @property
    def complete(self) -> bool:
        """Whether the output is complete (``finish_reason`` "stop" or "budget_close")."""
        return is_complete(self.finish_reason)


def _finish(res: SequenceResult, pyd: type[BaseModel] | None, is_json: bool) -> GenerationResult:
    """The :class:`GenerationResult` of a finished sequence: its JSON value parsed (validated
    by ``pyd`` when given) where ``is_json`` and the output is complete."""
    value: object = None
    error = None
    if is_complete(res.finish_reason) and is_json:
        try:
            value = json.loads(res.text)
            if pyd is not None:
                value = pyd.model_validate_json(res.text)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            error = f"{type(e).__name__}: {e}"
    return GenerationResult(res.text, value, res.tokens, res.finish_reason, res.stats, error,
                            logprobs=res.logprobs)


@overload
def generate(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
             regex: str | Sequence[str] | None = None, prompt: str | None = None,
             messages: Conversation | None = None,
             tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
             temperature: float | Sequence[float] | None = None, top_p: float | Sequence[float] | None = None,
             seed: int | None = None, speculative: bool = True, config: ConfigSource = None,
             draft_model: ModelSource | None = None, start: str = "start", strict: bool = True,
             on_budget: str = "close", tools: Tools | None = None,
             tool_choice: str | dict[str, object] = "auto",
             parallel_tool_calls: bool = True, tool_format: str | ToolFormat | None = None,
             reasoning: bool = False, thinking_budget: int | None = None,
             logprobs: bool = False, top_logprobs: int | None = None) -> GenerationResult: ...


@overload
def generate(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
             regex: str | Sequence[str] | None = None, prompt: list[str] | tuple[str, ...],
             messages: None = None,
             tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
             temperature: float | Sequence[float] | None = None, top_p: float | Sequence[float] | None = None,
             seed: int | None = None, speculative: bool = True, config: ConfigSource = None,
             draft_model: ModelSource | None = None, start: str = "start", strict: bool = True,
             on_budget: str = "close", tools: Tools | None = None,
             tool_choice: str | dict[str, object] = "auto",
             parallel_tool_calls: bool = True, tool_format: str | ToolFormat | None = None,
             reasoning: bool = False, thinking_budget: int | None = None,
             logprobs: bool = False, top_logprobs: int | None = None) -> BatchResults: ...


@overload
def generate(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
             regex: str | Sequence[str] | None = None, prompt: None = None,
             messages: Sequence[Conversation],
             tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
             temperature: float | Sequence[float] | None = None, top_p: float | Sequence[float] | None = None,
             seed: int | None = None, speculative: bool = True, config: ConfigSource = None,
             draft_model: ModelSource | None = None, start: str = "start", strict: bool = True,
             on_budget: str = "close", tools: Tools | None = None,
             tool_choice: str | dict[str, object] = "auto",
             parallel_tool_calls: bool = True, tool_format: str | ToolFormat | None = None,
             reasoning: bool = False, thinking_budget: int | None = None,
             logprobs: bool = False, top_logprobs: int | None = None) -> BatchResults: ...


def generate(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
             regex: str | Sequence[str] | None = None, prompt: str | Sequence[str] | None = None,
             messages: Conversation | Sequence[Conversation] | None = None,
             tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
             temperature: float | Sequence[float] | None = None, top_p: float | Sequence[float] | None = None,
             seed: int | None = None, speculative: bool = True, config: ConfigSource = None,
             draft_model: ModelSource | None = None, start: str = "start", strict: bool = True,
             on_budget: str = "close", tools: Tools | None = None,
             tool_choice: str | dict[str, object] = "auto",
             parallel_tool_calls: bool = True, tool_format: str | ToolFormat | None = None,
             reasoning: bool = False, thinking_budget: int | None = None,
             logprobs: bool = False, top_logprobs: int | None = None) -> GenerationResult | BatchResults:
    """Generate constrained output. Returns a :class:`GenerationResult`, or a list of them
    when ``prompt`` is a list of strings or ``messages`` a list of conversations.

    For a batch, ``schema``/``grammar`` may also be a list (one per prompt: mixed schemas).
    Sequences run in micro-batches of ``config.batch_size``: every step is one batched target
    forward for all live sequences of the micro-batch and one verify call; each sequence has
    its own matcher, drafters and acceptance statistics, and its output is the one it gets
    alone (greedy). The list returned for a batch is a :class:`BatchResults` whose ``stats``
    sums the batch. With ``seed``, sequence ``i`` uses ``seed + i``.

    ``temperature`` and ``top_p`` may also be lists in a batch (one per prompt): each sequence
    is verified with its own values (the verify contract's per-sequence ``temperature`` /
    ``top_p`` rows), so a greedy request and a sampled one can share a micro-batch.

    ``strict`` (default True; see :attr:`~structgen.config.JsonSchemaOptions.strict`): an object
    schema that declares properties but not ``additionalProperties`` gets only its declared
    keys, and ``prefixItems`` without ``items`` no further items (a narrowing: outputs stay
    valid). ``strict=False`` generates every value the schema allows.
    ``on_budget`` (see :class:`~structgen.config.GenerationOptions`): ``"close"`` (the default)
    steers every output to end complete within ``max_new_tokens`` (``finish_reason``
    ``"stop"``, or ``"budget_close"`` where the budget had to steer it; a budget below the
    shortest output raises :class:`~structgen.errors.TokenBudgetError` before generating);
    ``"cut"`` stops at the budget (``finish_reason="length"``, incomplete).

    Tool calling (one request): ``tools`` (OpenAI function specs, Pydantic model classes or
    Python functions) are passed to the chat template and the output may call them in the
    model family's format (``tool_format``, default
    :func:`~structgen.calls.formats.detect_tool_format` of the chat template and tokenizer;
    see :mod:`structgen.calls.formats`): ``tool_choice`` ``"auto"`` (text and/or calls),
    ``"required"`` (only calls, at least one), ``"none"`` (no call) or ``{"name": ...}`` (a
    call of that tool); ``parallel_tool_calls=False`` allows at most one call. Every call's
    arguments are valid against its tool's schema. ``tools`` with ``schema``/``grammar``/
    ``regex``: the output is either calls (``tool_calls``) or the final answer in the
    constraint's language (``text``, and ``value`` for a schema). ``reasoning=True``: free
    text inside ``<think>...</think>`` first, then the answer (the constraint, the tool calls,
    or any text); ``thinking_budget``: tokens of reasoning after which ``</think>`` is forced.
    See :class:`GenerationResult` for where the parts go.

    ``logprobs=True``: each result's ``logprobs`` lists every generated token's
    log-probability in the distribution it was drawn from (the grammar-masked target
    distribution at the sampling temperature, temperature 1 when greedy; see
    :class:`~structgen.generation.results.TokenLogprob`) with its ``top_logprobs`` (0..20)
    most likely alternatives. Off by default: generation then computes none of it.
    """
    batch = isinstance(prompt, (list, tuple)) or (
        messages is not None and len(messages) > 0 and isinstance(messages[0], (list, tuple)))
    given: list[object]
    if batch:
        if prompt is not None and messages is not None:
            raise ConfigError("give prompt= or messages=, not both")
        given = list(prompt) if prompt is not None else list(messages or ())
    else:
        given = [prompt if prompt is not None else messages]
    n = len(given)
    opts = merge_options(config, n=n, batch=batch, temperature=temperature, top_p=top_p,
                         draft_model=draft_model, max_new_tokens=max_new_tokens, seed=seed,
                         speculative=speculative, start=start, on_budget=on_budget)
    gen = opts.generation
    lp_count = logprob_count(logprobs, top_logprobs)
    items = check_requests(given, batch, "prompt" if prompt is not None else "messages")
    if tools is not None or reasoning or thinking_budget is not None:
        if batch:
            raise ConfigError("tools= and reasoning= take one prompt or conversation", key="tools")
        return _generate_structured(model, tokenizer, items[0], opts, draft_model, tools=tools,
                                    tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                                    tool_format=tool_format, reasoning=reasoning, schema=schema,
                                    grammar=grammar, regex=regex, strict=strict,
                                    thinking_budget=thinking_budget, logprobs=lp_count)
    schemas = per_request("schema", schema, n, batch)
    grammars = per_request("grammar", grammar, n, batch)
    regexes = per_request("regex", regex, n, batch)
    # every constraint of the call is compiled before the model loads and anything is generated
    compiled = compile_all(schemas, grammars, regexes, gen.start, batch, strict)

    lm = load_model(model, tokenizer)
    vocab = vocabulary_for(lm)
    draft_lm = _load_draft(draft_model, opts.config)

    if not batch:
        g, pyd = compiled[0]
        item = items[0]
        messages_ = None if isinstance(item, str) else item
        ids = prompt_ids(lm, item if isinstance(item, str) else None, messages_)
        check_context(lm, len(ids), gen.max_new_tokens, draft_lm=draft_lm)
        res = run_sequence(lm, vocab, g, ids, opts.requests[0], speculative=gen.speculative,
                           max_new_tokens=gen.max_new_tokens, draft_lm=draft_lm, seed=gen.seed,
                           on_budget=gen.on_budget,
                           shared_prefix=conversation_prefix(lm, messages_, None, ids), logprobs=lp_count)
        return _finish(res, pyd, schemas[0] is not None)
    return _generate_batch(lm, vocab, opts.requests, items, schemas, compiled,
                           speculative=gen.speculative, max_new_tokens=gen.max_new_tokens,
                           draft_lm=draft_lm, seed=gen.seed, on_budget=gen.on_budget, logprobs=lp_count)


def _generate_structured(model: ModelSource, tokenizer: PreTrainedTokenizerBase | None, item: Request,
                         opts: CallOptions, draft_model: ModelSource | None, *, tools: Tools | None,
                         tool_choice: str | dict[str, object], parallel_tool_calls: bool,
                         tool_format: str | ToolFormat | None, reasoning: bool, schema: object,
                         grammar: object,
                         regex: str | Sequence[str] | None, strict: bool, thinking_budget: int | None,
                         logprobs: int | None = None) -> GenerationResult:
    """:func:`generate` with tools and/or reasoning: one triggered grammar
    (:func:`~structgen.calls.plan.plan_output`), the output split into its parts."""
    gen = opts.generation
    lm, vocab, draft_lm, ids, shared, plan = _plan_structured(
        model, tokenizer, item, opts, draft_model, tools=tools, tool_choice=tool_choice,
        parallel_tool_calls=parallel_tool_calls, tool_format=tool_format, reasoning=reasoning,
        schema=schema, grammar=grammar, regex=regex, strict=strict, thinking_budget=thinking_budget)
    res = run_sequence(lm, vocab, plan.grammar, ids, opts.requests[0], speculative=gen.speculative,
                       max_new_tokens=gen.max_new_tokens, draft_lm=draft_lm, seed=gen.seed,
                       on_budget=gen.on_budget, new_matcher=plan.new_matcher, shared_prefix=shared,
                       logprobs=logprobs)
    return _structured_result(plan, res, schema)


def _plan_structured(model: ModelSource, tokenizer: PreTrainedTokenizerBase | None, item: Request | None,
                     opts: CallOptions, draft_model: ModelSource | None, *, tools: Tools | None,
                     tool_choice: str | dict[str, object], parallel_tool_calls: bool,
                     tool_format: str | ToolFormat | None,
                     reasoning: bool, schema: object, grammar: object, regex: str | Sequence[str] | None,
                     strict: bool, thinking_budget: int | None
                     ) -> tuple[CausalLM, Vocabulary, CausalLM | None, list[int], int, OutputPlan]:
    """(model, vocabulary, draft model, prompt ids, their :func:`conversation_prefix`,
    :class:`OutputPlan`) of a request with tools and/or reasoning: the model loaded, the prompt
    rendered with the tools, the grammar planned."""
    gen = opts.generation
    template_tools = [t.openai() for t in normalize_tools(tools)] or None  # bad specs fail early
    lm = load_model(model, tokenizer)
    vocab = vocabulary_for(lm)
    draft_lm = _load_draft(draft_model, opts.config)
    messages = None if isinstance(item, str) else item
    ids = prompt_ids(lm, item if isinstance(item, str) else None, messages, template_tools)
    shared = conversation_prefix(lm, messages, template_tools, ids)
    tail = vocab.decode_bytes(ids[-8:]).decode("utf-8", "replace")  # did the template open <think>?
    plan = plan_output(tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                       tool_format=tool_format, chat_template=getattr(lm.tokenizer, "chat_template", None),
                       tokenizer=lm.tokenizer,  # its added tokens tell the call format too
                       reasoning=reasoning, prompt_text=tail,
                       schema=schema, grammar=grammar, regex=regex, start=gen.start, strict=strict,
                       thinking_budget=thinking_budget)
    check_context(lm, len(ids), gen.max_new_tokens, draft_lm=draft_lm)
    vocab = plan.vocabulary(vocab, lm.tokenizer)  # special tokens that write a marker
    return lm, vocab, draft_lm, ids, shared, plan


def _structured_result(plan: OutputPlan, res: SequenceResult, schema: object,
                       call_ids: list[str] | None = None) -> GenerationResult:
    """The :class:`GenerationResult` of a finished output ``res`` of ``plan``: split into
    reasoning, text and validated calls (``call_ids``: the ids a stream already gave them)."""
    out = GenerationResult(res.text, None, res.tokens, res.finish_reason, res.stats,
                           logprobs=res.logprobs)
    out.extra["raw_text"] = res.text
    if not is_complete(res.finish_reason):
        return out
    thought, text, calls, errors = plan.split(res.text)
    if call_ids and len(call_ids) == len(calls):
        calls = [replace(c, id=cid) for c, cid in zip(calls, call_ids)]
    out.text, out.tool_calls, out.reasoning = text, calls, thought
    if errors:
        out.error = "; ".join(errors)
    if schema is not None and not calls:  # with tools, a turn of calls has no answer
        try:
            out.value = json.loads(text)
            if is_model_class(schema):
                out.value = cast("type[BaseModel]", schema).model_validate_json(text)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            out.error = f"{type(e).__name__}: {e}"
    return out


def _load_draft(draft_model: ModelSource | None, cfg: SpecConfig) -> CausalLM | None:
    """The draft model of a call (``draft_model=`` as a model object, or the configuration's
    ``draft_model`` name), with its own cache; None without one."""
    draft_lm = None
    if draft_model is not None and not isinstance(draft_model, (str, os.PathLike)):
        draft_lm = load_model(draft_model)
    elif cfg.draft_model:
        draft_lm = load_model(cfg.draft_model)
    if draft_lm is not None:
        draft_lm = CausalLM(draft_lm.model, draft_lm.tokenizer)  # own cache
    return draft_lm


class BatchResults(list[GenerationResult]):
    """The results of a batched :func:`generate` call, in prompt order (a plain list of
    :class:`GenerationResult`), plus ``stats``: the call's
    :class:`~structgen.generation.loop.BatchStats` (counts summed over the sequences, target
    forward passes as actually batched, wall-clock times; ``stats.tokens_per_second`` is the
    call's throughput)."""

    stats: BatchStats | None = None


def _generate_batch(lm: CausalLM, vocab: Vocabulary, cfgs: list[SpecConfig], items: list[Request],
                    schemas: list[object], compiled: list[Constraint], *, speculative: bool,
                    max_new_tokens: int, draft_lm: CausalLM | None, seed: int | None,
                    on_budget: str = "close", logprobs: int | None = None) -> BatchResults:
    """Micro-batches of ``batch_size`` sequences, each run by
    :func:`~structgen.generation.loop.run_batch` (one batched target forward per step);
    ``cfgs`` holds one SpecConfig per request (they differ at most in temperature and top-p,
    which reach the verifier per sequence). Every prompt is encoded and checked against the
    context first: a bad request fails the call before any micro-batch is generated."""
    n = len(items)
    ids: list[list[int]] = []
    shared: list[int] = []
    for i, item in enumerate(items):
        messages = None if isinstance(item, str) else item
        try:
            p = prompt_ids(lm, item if isinstance(item, str) else None, messages)
            if not p:
                raise ConfigError("the prompt encodes to no tokens")
            check_context(lm, len(p), max_new_tokens, draft_lm=draft_lm)
        except StructgenError as e:
            raise attribute_to_request(e, i) from None
        ids.append(p)
        shared.append(conversation_prefix(lm, messages, None, p))
    if on_budget == "close":  # after every context check: a bad prompt is named first
        for i in range(n):
            try:
                check_budget(Matcher(compiled[i][0], vocab), max_new_tokens)
            except StructgenError as e:
                raise attribute_to_request(e, i) from None
    results = BatchResults()
    total = BatchStats()
    cfg = cfgs[0]
    for lo in range(0, n, cfg.batch_size):
        idx = range(lo, min(n, lo + cfg.batch_size))
        outs, bst = run_batch(lm, vocab, [compiled[i][0] for i in idx], [ids[i] for i in idx], cfg,
                              speculative=speculative, max_new_tokens=max_new_tokens,
                              draft_lm=draft_lm,
                              seeds=[None if seed is None else seed + i for i in idx],
                              configs=[cfgs[i] for i in idx], on_budget=on_budget,
                              shared_prefixes=[shared[i] for i in idx], logprobs=logprobs)
        total.add(bst)
        for i, res in zip(idx, outs):
            results.append(_finish(res, compiled[i][1], schemas[i] is not None))
    results.stats = total
    return results


@overload
def stream(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
           regex: str | None = None, prompt: str | None = None, messages: Conversation | None = None,
           tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
           temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
           speculative: bool = True, config: ConfigSource = None, draft_model: ModelSource | None = None,
           start: str = "start", strict: bool = True, on_budget: str = "close",
           tool_choice: str | dict[str, object] = "auto", parallel_tool_calls: bool = True,
           tool_format: str | ToolFormat | None = None,
           tools: None = None, reasoning: Literal[False] = False, thinking_budget: None = None,
           partial: Literal[False] = False, string_deltas: bool = False) -> Iterator[str]: ...


@overload
def stream(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
           regex: str | None = None, prompt: str | None = None, messages: Conversation | None = None,
           tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
           temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
           speculative: bool = True, config: ConfigSource = None, draft_model: ModelSource | None = None,
           start: str = "start", strict: bool = True, on_budget: str = "close",
           tool_choice: str | dict[str, object] = "auto", parallel_tool_calls: bool = True,
           tool_format: str | ToolFormat | None = None,
           tools: None = None, reasoning: Literal[False] = False, thinking_budget: None = None,
           partial: Literal[True], string_deltas: bool = False) -> Iterator[StreamEvent]: ...


@overload
def stream(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
           regex: str | None = None, prompt: str | None = None, messages: Conversation | None = None,
           tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
           temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
           speculative: bool = True, config: ConfigSource = None, draft_model: ModelSource | None = None,
           start: str = "start", strict: bool = True, on_budget: str = "close",
           tool_choice: str | dict[str, object] = "auto", parallel_tool_calls: bool = True,
           tool_format: str | ToolFormat | None = None,
           tools: Tools, reasoning: bool = False, thinking_budget: int | None = None,
           partial: Literal[False] = False, string_deltas: bool = False) -> Iterator[StreamEvent]: ...


@overload
def stream(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
           regex: str | None = None, prompt: str | None = None, messages: Conversation | None = None,
           tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
           temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
           speculative: bool = True, config: ConfigSource = None, draft_model: ModelSource | None = None,
           start: str = "start", strict: bool = True, on_budget: str = "close",
           tool_choice: str | dict[str, object] = "auto", parallel_tool_calls: bool = True,
           tool_format: str | ToolFormat | None = None,
           tools: Tools | None = None, reasoning: Literal[True], thinking_budget: int | None = None,
           partial: Literal[False] = False, string_deltas: bool = False) -> Iterator[StreamEvent]: ...


@overload
def stream(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
           regex: str | None = None, prompt: str | None = None, messages: Conversation | None = None,
           tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
           temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
           speculative: bool = True, config: ConfigSource = None, draft_model: ModelSource | None = None,
           start: str = "start", strict: bool = True, on_budget: str = "close",
           tool_choice: str | dict[str, object] = "auto", parallel_tool_calls: bool = True,
           tool_format: str | ToolFormat | None = None,
           tools: Tools | None = None, reasoning: bool = False, thinking_budget: int | None = None,
           partial: bool = False, string_deltas: bool = False) -> Iterator[str | StreamEvent]: ...


def stream(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
           regex: str | None = None, prompt: str | None = None, messages: Conversation | None = None,
           tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
           temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
           speculative: bool = True, config: ConfigSource = None, draft_model: ModelSource | None = None,
           start: str = "start", strict: bool = True, on_budget: str = "close",
           tool_choice: str | dict[str, object] = "auto", parallel_tool_calls: bool = True,
           tool_format: str | ToolFormat | None = None,
           tools: Tools | None = None, reasoning: bool = False, thinking_budget: int | None = None,
           partial: bool = False, string_deltas: bool = False) -> Iterator[str | StreamEvent]:
    """Yield text increments as each verify step commits them (never text a later
    rollback could take back). Same arguments as :func:`generate` (``strict`` included), one
    prompt.

    ``partial=True`` (with a ``schema``; see ``docs/guides/partial-streaming.md``) yields
    :class:`StreamEvent` objects that follow the JSON value as it grows: after each
    ``"content"`` event (the step's text) come the events of that text, in document order:
    ``"begin"`` (a value at the RFC 6901 JSON ``pointer`` started), ``"value"`` (the scalar
    at ``pointer`` is complete: its parsed ``value``), ``"end"`` (the object or array at
    ``pointer`` closed: ``value`` is it); ``string_deltas=True`` adds ``"string_delta"``
    events (a string's decoded text as it grows). Each event's ``partial`` is the document so
    far (complete scalars only; the same object, grown in place). A number completes with
    the character after it, or at the end of the output. Last comes one ``"done"`` event
    whose ``result`` is the :class:`GenerationResult` :func:`generate` would return.

    With ``tools=`` or ``reasoning=True`` it yields :class:`StreamEvent` objects instead:
    ``"reasoning"`` and ``"content"`` text, ``"tool_call"`` (a call's ``index``, ``id`` and
    ``name``, once the name is complete) and ``"arguments"`` (its arguments' JSON text, in
    pieces), then one ``"done"`` event whose ``result`` is the :class:`GenerationResult`
    :func:`generate` would return (calls parsed and validated, with the ids the stream gave).
    Joined, the text events of a complete output equal that result's ``reasoning`` and
    ``text`` and each call's arguments its ``arguments_text``. A call format that cannot be
    read as it grows (not a built-in one) gives its content and calls at the end.
    """
    # _stream is a generator: the arguments are checked when the first piece is asked for
    return cast("Iterator[str | StreamEvent]", _stream(
        model, schema=schema, grammar=grammar, regex=regex, prompt=prompt, messages=messages,
        tokenizer=tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        seed=seed, speculative=speculative, config=config, draft_model=draft_model, start=start,
        strict=strict, on_budget=on_budget, tools=tools, tool_choice=tool_choice,
        parallel_tool_calls=parallel_tool_calls, tool_format=tool_format, reasoning=reasoning,
        thinking_budget=thinking_budget, partial=partial, string_deltas=string_deltas))


class _StepBatches:
    """``partial=_STEP_BATCHES`` of :func:`_stream`: :func:`stream_model`'s private way to get
    the partial events one step at a time (it shows a partial instance as soon as a step's
    events are in)."""


_STEP_BATCHES = _StepBatches()
#: one step of a partial stream: its text, the partial events it completes, the document so
#: far, and (last) the result
StepBatch = tuple[str, list[PartialEvent], JsonValue, "GenerationResult | None"]


def _stream(model: ModelSource = DEFAULT_MODEL, *, schema: object = None, grammar: object = None,
            regex: str | None = None, prompt: str | None = None, messages: Conversation | None = None,
            tokenizer: PreTrainedTokenizerBase | None = None, max_new_tokens: int = 256,
            temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
            speculative: bool = True, config: ConfigSource = None, draft_model: ModelSource | None = None,
            start: str = "start", strict: bool = True, on_budget: str = "close",
            tool_choice: str | dict[str, object] = "auto", parallel_tool_calls: bool = True,
            tool_format: str | ToolFormat | None = None, tools: Tools | None = None, reasoning: bool = False,
            thinking_budget: int | None = None, partial: bool | _StepBatches = False,
            string_deltas: bool = False) -> Iterator[str | StreamEvent | StepBatch]:
    """:func:`stream` (``partial=_STEP_BATCHES``: :func:`stream_model`'s steps instead of events)."""
    if not (prompt is None or isinstance(prompt, str)):
        raise ConfigError("stream() takes one prompt (a string); use generate() for a batch",
                          key="prompt")
    opts = merge_options(config, n=1, batch=False, temperature=temperature, top_p=top_p,
                         draft_model=draft_model, max_new_tokens=max_new_tokens, seed=seed,
                         speculative=speculative, start=start, on_budget=on_budget)
    cfg, gen = opts.config, opts.generation
    if prompt is not None and messages is not None:
        raise ConfigError("give prompt= or messages=, not both")
    conversation: list[Message] | None = None
    if messages is not None:
        checked = check_requests([messages], False, "messages")[0]
        if isinstance(checked, str):
            raise ConfigError("messages= takes a list of messages; give a text as prompt=", key="messages")
        conversation = checked
    if string_deltas and not partial:
        raise ConfigError("string_deltas=True needs partial=True", key="string_deltas")
    if partial and (schema is None or tools is not None or reasoning or thinking_budget is not None):
        raise ConfigError("partial=True streams the value of a schema= (without tools or reasoning)",
                          key="partial")
    if tools is not None or reasoning or thinking_budget is not None:
        yield from _stream_structured(model, tokenizer, prompt if prompt is not None else conversation, opts,
                                      draft_model, tools=tools, tool_choice=tool_choice,
                                      parallel_tool_calls=parallel_tool_calls, tool_format=tool_format,
                                      reasoning=reasoning, schema=schema, grammar=grammar, regex=regex,
                                      strict=strict, thinking_budget=thinking_budget)
        return
    g, _pyd = resolve_grammar(schema=schema, grammar=grammar, regex=regex, start=gen.start,
                              strict=strict)
    lm = load_model(model, tokenizer)
    vocab = vocabulary_for(lm)
    draft_lm = _load_draft(draft_model, cfg)
    ids = prompt_ids(lm, prompt, conversation)
    check_context(lm, len(ids), gen.max_new_tokens, draft_lm=draft_lm)
    shared = conversation_prefix(lm, conversation, None, ids)
    max_new_tokens, seed, speculative = gen.max_new_tokens, gen.seed, gen.speculative
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    eos = set(vocab.eos_token_ids)
    steps = stream_sequence(lm, vocab, g, ids, cfg, speculative=speculative,
                            max_new_tokens=max_new_tokens, draft_lm=draft_lm, seed=seed,
                            on_budget=gen.on_budget, shared_prefix=shared)
    if partial:
        batches = _partial_steps(steps, vocab, _pyd, string_deltas)
        yield from (batches if partial is _STEP_BATCHES else _stream_partial(batches))
        return
    for new, _seq in steps:
        data = vocab.decode_bytes([t for t in new if t not in eos])
        text = dec.decode(data)
        if text:
            yield text
    tail = dec.decode(b"", final=True)
    if tail:
        yield tail


@dataclass(frozen=True)
class StreamEvent:
    """One piece of an output streamed with tools, reasoning or ``partial=True`` (:func:`stream`).

    kind: ``"reasoning"`` / ``"content"`` (``text``), ``"tool_call"`` (``index``, ``id`` and
    ``name`` of a call), ``"arguments"`` (``index`` and a piece of the call's arguments
    ``text``) or ``"done"`` (``result``: the whole :class:`GenerationResult`); with
    ``partial=True`` also ``"begin"``, ``"value"``, ``"end"`` and ``"string_delta"``
    (``pointer``: a JSON pointer, ``value``, and ``partial``: the document so far; see
    :mod:`structgen.generation.partial`)."""

    kind: str
    text: str = ""
    index: int | None = None
    id: str | None = None
    name: str | None = None
    result: GenerationResult | None = None
    pointer: str | None = None
    value: JsonValue = None
    partial: JsonValue = None


def _partial_steps(steps: Iterator[tuple[list[int], SequenceState]], vocab: Vocabulary,
                   pyd: type[BaseModel] | None, string_deltas: bool) -> Iterator[StepBatch]:
    """``(text, events, document, None)`` for each step of a ``partial=True`` stream (its
    text, the :class:`~structgen.generation.partial.PartialEvent` list it completes and the
    document so far), then ``(tail, events, document, result)`` once the output has ended."""
    reader = PartialJsonReader(string_deltas=string_deltas)
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    eos = set(vocab.eos_token_ids)
    seq = None
    for new, state in steps:
        seq = state
        text = dec.decode(vocab.decode_bytes([t for t in new if t not in eos]))
        if text:
            yield text, reader.feed(text), reader.document, None
    tail = dec.decode(b"", final=True)
    events = reader.feed(tail) + reader.finish()
    assert seq is not None
    yield tail, events, reader.document, _finish(sequence_result(seq), pyd, True)


def _stream_partial(batches: Iterator[StepBatch]) -> Iterator[StreamEvent]:
    """:func:`stream` with ``partial=True``: each step's text, then the events it completes."""
    for text, events, document, result in batches:
        if text:
            yield StreamEvent("content", text)
        for e in events:
            yield StreamEvent(e.kind, pointer=e.pointer, value=e.value, partial=document)
        if result is not None:
            yield StreamEvent("done", result=result)


def _stream_structured(model: ModelSource, tokenizer: PreTrainedTokenizerBase | None, item: Request | None,
                       opts: CallOptions, draft_model: ModelSource | None, *, tools: Tools | None,
                       tool_choice: str | dict[str, object], parallel_tool_calls: bool,
                       tool_format: str | ToolFormat | None, reasoning: bool, schema: object, grammar: object,
                       regex: str | None, strict: bool, thinking_budget: int | None) -> Iterator[StreamEvent]:
    """:func:`stream` with tools and/or reasoning: the events of
    :class:`~structgen.calls.plan.OutputStream`, then the result."""
    gen = opts.generation
    lm, vocab, draft_lm, ids, shared, plan = _plan_structured(
        model, tokenizer, item, opts, draft_model, tools=tools, tool_choice=tool_choice,
        parallel_tool_calls=parallel_tool_calls, tool_format=tool_format, reasoning=reasoning,
        schema=schema, grammar=grammar, regex=regex, strict=strict, thinking_budget=thinking_budget)
    reader = OutputStream(plan)
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    eos = set(vocab.eos_token_ids)
    seq = None

    def events(raw: list[tuple[Any, ...]]) -> Iterator[StreamEvent]:  # OutputStream.feed's events
        for e in raw:
            if e[0] == "call":
                yield StreamEvent("tool_call", index=e[1], id=e[2], name=e[3])
            elif e[0] == "arguments":
                yield StreamEvent("arguments", e[2], index=e[1])
            else:
                yield StreamEvent(e[0], e[1])

    for new, state in stream_sequence(lm, vocab, plan.grammar, ids, opts.requests[0],
                                      speculative=gen.speculative, max_new_tokens=gen.max_new_tokens,
                                      draft_lm=draft_lm, seed=gen.seed, on_budget=gen.on_budget,
                                      new_matcher=plan.new_matcher, shared_prefix=shared):
        seq = state
        text = dec.decode(vocab.decode_bytes([t for t in new if t not in eos]))
        if text:
            yield from events(reader.feed(text))
    yield from events(reader.feed(dec.decode(b"", final=True), final=True))
    assert seq is not None
    yield StreamEvent("done", result=_structured_result(plan, sequence_result(seq), schema,
                                                        reader.call_ids()))


def stream_model(model: ModelSource, cls: type[M], prompt: str | None = None,
                 **kw: Any) -> Iterator[M]:  # kw: stream()'s keyword arguments
    """Stream an instance of the Pydantic class ``cls``: yields partial instances as fields
    complete, then the validated final instance (equal to :func:`generate_model`'s).

    A partial instance (``cls.model_construct``) holds the fields complete so far, each
    validated on its own (``model_fields_set`` names them; the others are None or their
    default); a nested model still being written is a partial instance itself; a list
    appears once closed. One is yielded after each step that completed a value. Other
    arguments are :func:`stream`'s (``prompt`` is sent as a user message, as in
    :func:`generate_model`). An output that does not validate, or is cut short
    (``on_budget="cut"``), raises :class:`~structgen.errors.ModelValidationError`.
    """
    if "messages" not in kw and prompt is not None:
        kw["messages"] = [{"role": "user", "content": prompt}]
        prompt = None
    unfinished: set[str] = set()  # pointers of the values begun and not yet complete
    for batch in _stream(model, schema=cls, prompt=prompt, partial=_STEP_BATCHES, **kw):
        assert isinstance(batch, tuple)
        _text, events, document, result = batch
        completed = False
        for event in events:
            if event.kind == "begin":
                unfinished.add(event.pointer)
            elif event.kind in ("value", "end"):
                unfinished.discard(event.pointer)
                # a value inside a list still being written does not show yet
                completed = completed or not _in_open_list(document, event.pointer, unfinished)
        if result is None:
            if completed and isinstance(document, dict):
                yield partial_instance(cls, document, unfinished)
            continue
        if not is_complete(result.finish_reason):
            raise ModelValidationError(
                f"generation did not complete a {cls.__name__} (finish_reason={result.finish_reason})",
                text=result.text, finish_reason=result.finish_reason)
        try:
            final = cls.model_validate_json(result.text)
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise ModelValidationError(f"the output is not a valid {cls.__name__}: {e}",
                                       text=result.text, finish_reason=result.finish_reason) from e
        yield final


def _in_open_list(document: JsonValue, pointer: str, unfinished: set[str]) -> bool:
    """Whether the value at ``pointer`` lies inside an array that is still being written."""
    node, at = document, ""
    for part in pointer.split("/")[1:]:
        if isinstance(node, list):
            if at in unfinished:
                return True
            node = node[int(part)]
        else:
            assert isinstance(node, dict)
            node = node[part.replace("~1", "/").replace("~0", "~")]
        at += "/" + part
    return False


def generate_model(model: ModelSource, cls: type[M], prompt: str | None = None,
                   **kw: Any) -> M:  # kw: generate()'s keyword arguments
    """Generate an instance of the Pydantic class ``cls``; raises
    :class:`~structgen.errors.ModelValidationError` (a ValueError) when the output is
    incomplete (``max_new_tokens`` reached)."""
    if "messages" not in kw and prompt is not None:
        kw["messages"] = [{"role": "user", "content": prompt}]
        prompt = None
    r = generate(model, schema=cls, prompt=prompt, **kw)
    if not isinstance(r, GenerationResult):
        raise ConfigError("generate_model takes one prompt (or one conversation in messages=); "
                          "call it once per prompt")
    if r.value is None:
        raise ModelValidationError(f"generation did not complete a {cls.__name__} "
                                   f"(finish_reason={r.finish_reason}, error={r.error})",
                                   text=r.text, finish_reason=r.finish_reason)
    return cast(M, r.value)
