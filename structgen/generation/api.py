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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from structgen.config import SpecConfig
from structgen.errors import ConfigError, ModelValidationError
from structgen.generation.results import is_complete

__all__ = ["BatchResults", "GenerationResult", "StreamEvent", "generate", "stream", "generate_model",
           "stream_model",
           "DEFAULT_MODEL", "conversation_prefix", "prompt_ids", "resolve_grammar", "template_messages"]

DEFAULT_MODEL = "qwen2.5-coder-0.5b"  # chosen by benchmarks/default_model.py's rule


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
    value: Any
    tokens: list[int]
    finish_reason: str
    stats: Any
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    tool_calls: list[Any] = field(default_factory=list)
    reasoning: str | None = None
    logprobs: list[Any] | None = None

    @property
    def complete(self) -> bool:
        """Whether the output is complete (``finish_reason`` "stop" or "budget_close")."""
        return is_complete(self.finish_reason)


def _load_config(config: SpecConfig | str | os.PathLike[str] | dict | None) -> SpecConfig:
    if config is None:
        return SpecConfig()
    if isinstance(config, SpecConfig):
        return config
    if isinstance(config, dict):
        import difflib
        from dataclasses import fields

        known = [f.name for f in fields(SpecConfig)]
        for key in config:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"config: unknown key {key!r}{hint}; known: {', '.join(known)}",
                                  key=str(key))
        return SpecConfig(**config)
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config must be a SpecConfig, a dict or a YAML file path, not "
                          f"{type(config).__name__}", key="config")
    from structgen.settings import load_spec_config  # YAML file

    return load_spec_config(Path(config))


def resolve_grammar(*, schema: Any = None, grammar: Any = None, regex: str | None = None,
                    start: str = "start", strict: bool = True) -> tuple[Any, Any]:
    """(compiled grammar, model class or None) from exactly one constraint, compiled by the
    front door :func:`structgen.frontends.constraint.compile_constraint` for generation.

    ``schema`` is a dict, a bool, a Pydantic class, JSON text or a file path (a ``str`` that is
    not JSON text, or an ``os.PathLike``), told apart by
    :func:`structgen.frontends.constraint.schema_from`; reading that file is the only file
    access. ``$ref`` only reaches inside the schema. ``grammar`` is Lark text, a path of a Lark
    file or an already compiled grammar; ``regex`` a pattern. The model class (returned second)
    is the ``schema`` itself when it is a Pydantic class: generation validates its output with
    it. ``strict`` (:attr:`~structgen.config.JsonSchemaOptions.strict`): objects get only their
    declared keys and prefix arrays no extra items; False generates the schema's open language.
    Raises :class:`~structgen.errors.ConfigError` unless exactly one constraint is given.
    """
    from structgen.config import JsonSchemaOptions
    from structgen.frontends.constraint import compile_constraint, is_model_class

    given = [x is not None for x in (schema, grammar, regex)]
    if sum(given) != 1:
        raise ConfigError("give exactly one of schema=, grammar= or regex=")
    if schema is not None:
        model = schema if is_model_class(schema) else None
        return compile_constraint("json", schema, json_options=JsonSchemaOptions(strict=strict),
                                  strings_may_be_paths=True), model
    if grammar is not None:
        return compile_constraint("grammar", grammar, start=start), None
    return compile_constraint("regex", regex), None


def _spellable(text: str, key: str) -> str:
    """``text``, or a ConfigError naming ``key`` when it holds a lone surrogate (a code point
    no UTF-8 text, and so no tokenizer, can hold)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"{key}: the text has a lone surrogate (U+{ord(text[e.start]):04X}) at character "
                          f"{e.start}; give valid Unicode", key=key) from None
    return text


def template_messages(template: str | None, messages: list[dict]) -> list[dict]:
    """``messages`` as a chat template can render them: OpenAI's ``developer`` role becomes
    ``system`` unless the template itself knows ``developer`` (templates skip roles they do not
    know, and the instructions would vanish)."""
    if template and "developer" in template:
        return messages
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]


def prompt_ids(lm: Any, prompt: str | None, messages: list[dict] | None,
               tools: list[dict] | None = None) -> list[int]:
    """The token ids of a request: ``messages`` rendered by the tokenizer's chat template (with
    the generation prompt, and ``tools`` when given; see :func:`template_messages`), or
    ``role: content`` lines when it has none; else the ``prompt`` text. Raises
    :class:`~structgen.errors.ConfigError` when neither is given or the text cannot be spelled
    (a lone surrogate)."""
    tok = lm.tokenizer
    if messages is not None:
        return _render(tok, messages, tools, generation_prompt=True)
    if prompt is None:
        raise ConfigError("give prompt= or messages=")
    return list(tok.encode(_spellable(prompt, "prompt")))


def _render(tok: Any, messages: list[dict], tools: list[dict] | None, *,
            generation_prompt: bool) -> list[int]:
    """The token ids of ``messages`` in the chat template (``role: content`` lines without one),
    with the assistant's turn opened when ``generation_prompt``."""
    if getattr(tok, "chat_template", None):
        extra = {"tools": tools} if tools else {}
        text = tok.apply_chat_template(template_messages(tok.chat_template, messages),
                                       add_generation_prompt=generation_prompt, tokenize=False, **extra)
        return list(tok.encode(_spellable(text, "messages"), add_special_tokens=False))
    text = "\n".join(f"{m['role']}: {m['content']}" for m in template_messages(None, messages)) + "\n"
    return list(tok.encode(_spellable(text + ("assistant: " if generation_prompt else ""), "messages")))


def conversation_prefix(lm: Any, messages: list[dict] | None, tools: list[dict] | None,
                        ids: list[int]) -> int:
    """How many leading tokens of ``ids`` (the prompt :func:`prompt_ids` made of ``messages``
    and ``tools``) the conversation before the last message renders to: the chat template over
    ``messages[:-1]`` without the generation prompt, with the same tools. That is the part later
    calls of the same conversation, or with the same system prompt, are likely to share (a hint
    for the model's prefix cache). 0 when ``messages`` is None, has fewer than 2 messages, or
    the rendering fails."""
    if messages is None or len(messages) < 2:
        return 0
    try:
        earlier = _render(lm.tokenizer, messages[:-1], tools, generation_prompt=False)
    except Exception:  # noqa: BLE001 - a hint only: a template that needs the last message is no error
        return 0
    n = 0
    for a, b in zip(earlier, ids):
        if a != b:
            break
        n += 1
    return n


def _finish(res: Any, pyd: Any, is_json: bool) -> GenerationResult:
    value = None
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


def _logprob_count(logprobs: Any, top_logprobs: Any) -> int | None:
    """The per-sequence ``logprobs`` setting of the step machine from :func:`generate`'s
    ``logprobs`` / ``top_logprobs``: None (off), or how many alternatives to list per token.
    ``top_logprobs`` without ``logprobs``, or outside 0..20, is a ConfigError."""
    from structgen.generation.results import MAX_TOP_LOGPROBS

    if not isinstance(logprobs, bool):
        raise ConfigError(f"logprobs must be True or False, not {logprobs!r}", key="logprobs")
    if top_logprobs is not None:
        if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or \
                not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ConfigError(f"top_logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}, not "
                              f"{top_logprobs!r}", key="top_logprobs")
        if not logprobs:
            raise ConfigError("top_logprobs needs logprobs=True", key="top_logprobs")
    return (top_logprobs or 0) if logprobs else None


def generate(model: Any = DEFAULT_MODEL, *, schema: Any = None, grammar: str | None = None,
             regex: str | None = None, prompt: str | Sequence[str] | None = None,
             messages: list[dict] | Sequence[list[dict]] | None = None, tokenizer: Any = None,
             max_new_tokens: int = 256, temperature: float | Sequence[float] | None = None,
             top_p: float | Sequence[float] | None = None,
             seed: int | None = None, speculative: bool = True,
             config: SpecConfig | str | os.PathLike[str] | dict | None = None,
             draft_model: Any = None, start: str = "start", strict: bool = True,
             on_budget: str = "close", tools: Any = None, tool_choice: Any = "auto",
             parallel_tool_calls: bool = True, tool_format: Any = None,
             reasoning: bool = False, thinking_budget: int | None = None,
             logprobs: bool = False, top_logprobs: int | None = None) -> Any:
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
    from structgen.generation.loop import run_sequence
    from structgen.generation.model import check_context, load_model, vocabulary_for

    batch = isinstance(prompt, (list, tuple)) or (
        messages is not None and len(messages) > 0 and isinstance(messages[0], (list, tuple)))
    if batch:
        if prompt is not None and messages is not None:
            raise ConfigError("give prompt= or messages=, not both")
        items = list(prompt) if prompt is not None else list(messages)  # type: ignore[arg-type]
    else:
        items = [prompt if prompt is not None else messages]
    n = len(items)
    opts = _merge_options(config, n=n, batch=batch, temperature=temperature, top_p=top_p,
                          draft_model=draft_model, max_new_tokens=max_new_tokens, seed=seed,
                          speculative=speculative, start=start, on_budget=on_budget)
    gen = opts.generation
    lp_count = _logprob_count(logprobs, top_logprobs)
    items = _check_requests(items, batch, "prompt" if prompt is not None else "messages")
    if tools is not None or reasoning or thinking_budget is not None:
        if batch:
            raise ConfigError("tools= and reasoning= take one prompt or conversation", key="tools")
        return _generate_structured(model, tokenizer, items[0], opts, draft_model, tools=tools,
                                    tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                                    tool_format=tool_format, reasoning=reasoning, schema=schema,
                                    grammar=grammar, regex=regex, strict=strict,
                                    thinking_budget=thinking_budget, logprobs=lp_count)
    schemas = _per_request("schema", schema, n, batch)
    grammars = _per_request("grammar", grammar, n, batch)
    regexes = _per_request("regex", regex, n, batch)
    # every constraint of the call is compiled before the model loads and anything is generated
    compiled = _compile_all(schemas, grammars, regexes, gen.start, batch, strict)

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


def _generate_structured(model: Any, tokenizer: Any, item: Any, opts: Any, draft_model: Any, *,
                         schema: Any, logprobs: int | None = None, **plan_kw: Any) -> GenerationResult:
    """:func:`generate` with tools and/or reasoning: one triggered grammar
    (:func:`~structgen.calls.plan.plan_output`), the output split into its parts."""
    from structgen.generation.loop import run_sequence

    gen = opts.generation
    lm, vocab, draft_lm, ids, shared, plan = _plan_structured(model, tokenizer, item, opts, draft_model,
                                                              schema=schema, **plan_kw)
    res = run_sequence(lm, vocab, plan.grammar, ids, opts.requests[0], speculative=gen.speculative,
                       max_new_tokens=gen.max_new_tokens, draft_lm=draft_lm, seed=gen.seed,
                       on_budget=gen.on_budget, new_matcher=plan.new_matcher, shared_prefix=shared,
                       logprobs=logprobs)
    return _structured_result(plan, res, schema)


def _plan_structured(model: Any, tokenizer: Any, item: Any, opts: Any, draft_model: Any, *,
                     tools: Any, tool_choice: Any, parallel_tool_calls: bool, tool_format: Any,
                     reasoning: bool, schema: Any, grammar: Any, regex: Any,
                     strict: bool, thinking_budget: int | None) -> tuple[Any, Any, Any, list[int], int, Any]:
    """(model, vocabulary, draft model, prompt ids, their :func:`conversation_prefix`,
    :class:`OutputPlan`) of a request with tools and/or reasoning: the model loaded, the prompt
    rendered with the tools, the grammar planned."""
    from structgen.calls.formats import normalize_tools
    from structgen.calls.plan import plan_output
    from structgen.generation.model import check_context, load_model, vocabulary_for

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


def _structured_result(plan: Any, res: Any, schema: Any,
                       call_ids: list[str] | None = None) -> GenerationResult:
    """The :class:`GenerationResult` of a finished output ``res`` of ``plan``: split into
    reasoning, text and validated calls (``call_ids``: the ids a stream already gave them)."""
    from structgen.frontends.constraint import is_model_class

    out = GenerationResult(res.text, None, res.tokens, res.finish_reason, res.stats,
                           logprobs=getattr(res, "logprobs", None))
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
                out.value = schema.model_validate_json(text)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            out.error = f"{type(e).__name__}: {e}"
    return out


@dataclass(frozen=True)
class _CallOptions:
    """The options of one :func:`generate` / :func:`stream` call, merged and checked once.

    config: the call's :class:`SpecConfig` (``config=`` with the scalar keyword overrides);
    requests: one SpecConfig per request, equal to ``config`` except where a per-request
    ``temperature`` / ``top_p`` list gives that request its own sampling values;
    generation: the per-call :class:`~structgen.config.GenerationOptions`."""

    config: SpecConfig
    requests: list[SpecConfig]
    generation: Any


def _merge_options(config: Any, *, n: int, batch: bool, temperature: Any, top_p: Any,
                   draft_model: Any, max_new_tokens: Any, seed: Any, speculative: Any,
                   start: Any, on_budget: Any = "close") -> _CallOptions:
    """Merge ``config`` (a SpecConfig, dict or YAML path) with the call's keywords, the one
    place :func:`generate` and :func:`stream` do it. Every value is checked by the dataclass
    that owns it (``temperature=float("nan")``, ``max_new_tokens=2.5``, ``seed=2**70`` are
    ConfigErrors); a bad value in a per-request list names its request. Reads the YAML file
    when ``config`` is a path; loads no model."""
    from structgen.config import GenerationOptions
    from structgen.errors import attribute_to_request

    cfg = _load_config(config)
    over: dict[str, Any] = {}
    temperatures = _per_request("temperature", temperature, n, batch)
    top_ps = _per_request("top_p", top_p, n, batch)
    scalar_t = not isinstance(temperature, (list, tuple))
    scalar_p = not isinstance(top_p, (list, tuple))
    if temperature is not None and scalar_t:
        over["temperature"] = temperature
    if top_p is not None and scalar_p:
        over["top_p"] = top_p
    if draft_model is not None and isinstance(draft_model, (str, os.PathLike)):
        over["draft_model"] = str(draft_model)
    cfg = replace(cfg, **over) if over else cfg
    requests = [cfg] * n
    if not (scalar_t and scalar_p):
        made: dict[tuple[Any, Any], SpecConfig] = {}
        for i, (t, p) in enumerate(zip(temperatures, top_ps)):
            key = (None if scalar_t else t, None if scalar_p else p)
            if key not in made:
                own = {k: v for k, v in zip(("temperature", "top_p"), key) if v is not None}
                try:
                    made[key] = replace(cfg, **own) if own else cfg
                except ConfigError as e:
                    raise attribute_to_request(e, i) from None
            requests[i] = made[key]
    generation = GenerationOptions(max_new_tokens=max_new_tokens, seed=seed, speculative=speculative,
                                   start=start, on_budget=on_budget)
    return _CallOptions(cfg, requests, generation)


def _check_requests(items: list[Any], batch: bool, name: str) -> list[Any]:
    """Each request is a prompt string or a conversation (a list of OpenAI-style messages,
    :mod:`structgen.generation.messages`); anything else is a ConfigError naming the request,
    before any work. Returns the requests with each conversation converted for the chat
    template."""
    from structgen.generation.messages import template_messages_of

    if batch and not items:
        raise ConfigError(f"{name}= is an empty list: give at least one request", key=name)
    out: list[Any] = []
    for i, item in enumerate(items):
        where = f"request {i}: " if batch else ""
        if item is None:
            raise ConfigError("give prompt= or messages=")
        if isinstance(item, str):
            out.append(item)
            continue
        if not isinstance(item, (list, tuple)) or not item:
            raise ConfigError(f"{where}{name} must be a string or a non-empty list of messages, not "
                              f"{type(item).__name__}", key=name)
        out.append(template_messages_of(item, where=where))
    return out


def _per_request(name: str, value: Any, n: int, batch: bool) -> list[Any]:
    """One ``schema`` / ``grammar`` / ``regex`` per request. A list (or tuple) always means one
    per prompt (a JSON Schema is never a list): it needs a batch of the same length."""
    if value is None:
        return [None] * n
    if isinstance(value, (list, tuple)):
        if not batch:
            raise ConfigError(f"{name}= is a list of {len(value)} but prompt= / messages= is a single "
                              "request: give a list of prompts (one per " + name + ")", key=name)
        if len(value) != n:
            raise ConfigError(f"{len(value)} {name} values for {n} prompts: give one {name} per "
                              f"prompt, or a single {name} for all", key=name)
        return list(value)
    return [value] * n


def _compile_all(schemas: list[Any], grammars: list[Any], regexes: list[Any], start: str,
                 batch: bool, strict: bool = True) -> list[tuple[Any, Any]]:
    """Compile every request's constraint (a constraint shared by several requests once); in a
    batch an error names its request (``request 1: ...``, ``error.request_index``)."""
    from structgen.errors import StructgenError, attribute_to_request

    done: dict[tuple[int, int, int], tuple[Any, Any]] = {}
    out = []
    for i, (s, g, r) in enumerate(zip(schemas, grammars, regexes)):
        key = (id(s), id(g), id(r))
        if key not in done:
            try:
                done[key] = resolve_grammar(schema=s, grammar=g, regex=r, start=start, strict=strict)
            except StructgenError as e:
                if batch:
                    raise attribute_to_request(e, i) from None
                raise
        out.append(done[key])
    return out


def _load_draft(draft_model: Any, cfg: SpecConfig) -> Any:
    from structgen.generation.model import CausalLM, load_model

    draft_lm = None
    if draft_model is not None and not isinstance(draft_model, (str, os.PathLike)):
        draft_lm = load_model(draft_model)
    elif cfg.draft_model:
        draft_lm = load_model(cfg.draft_model)
    if draft_lm is not None:
        draft_lm = CausalLM(draft_lm.model, draft_lm.tokenizer)  # own cache
    return draft_lm


class BatchResults(list):  # type: ignore[type-arg]
    """The results of a batched :func:`generate` call, in prompt order (a plain list of
    :class:`GenerationResult`), plus ``stats``: the call's
    :class:`~structgen.generation.loop.BatchStats` (counts summed over the sequences, target
    forward passes as actually batched, wall-clock times; ``stats.tokens_per_second`` is the
    call's throughput)."""

    stats: Any = None


def _generate_batch(lm: Any, vocab: Any, cfgs: list[SpecConfig], items: list[Any], schemas: list[Any],
                    compiled: list[tuple[Any, Any]], *, speculative: bool, max_new_tokens: int,
                    draft_lm: Any, seed: int | None, on_budget: str = "close",
                    logprobs: int | None = None) -> BatchResults:
    """Micro-batches of ``batch_size`` sequences, each run by
    :func:`~structgen.generation.loop.run_batch` (one batched target forward per step);
    ``cfgs`` holds one SpecConfig per request (they differ at most in temperature and top-p,
    which reach the verifier per sequence). Every prompt is encoded and checked against the
    context first: a bad request fails the call before any micro-batch is generated."""
    from structgen.errors import StructgenError, attribute_to_request
    from structgen.generation.loop import BatchStats, check_budget, run_batch
    from structgen.generation.model import check_context
    from structgen.masks.matcher import Matcher

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


def stream(model: Any = DEFAULT_MODEL, *, schema: Any = None, grammar: str | None = None,
           regex: str | None = None, prompt: str | None = None, messages: list[dict] | None = None,
           tokenizer: Any = None, max_new_tokens: int = 256, temperature: float | None = None,
           top_p: float | None = None, seed: int | None = None, speculative: bool = True,
           config: SpecConfig | str | os.PathLike[str] | dict | None = None,
           draft_model: Any = None, start: str = "start", strict: bool = True,
           on_budget: str = "close", tools: Any = None, tool_choice: Any = "auto",
           parallel_tool_calls: bool = True, tool_format: Any = None, reasoning: bool = False,
           thinking_budget: int | None = None, partial: bool = False,
           string_deltas: bool = False) -> Iterator[Any]:
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
    from structgen.generation.loop import stream_sequence
    from structgen.generation.model import check_context, load_model, vocabulary_for

    if not (prompt is None or isinstance(prompt, str)):
        raise ConfigError("stream() takes one prompt (a string); use generate() for a batch",
                          key="prompt")
    opts = _merge_options(config, n=1, batch=False, temperature=temperature, top_p=top_p,
                          draft_model=draft_model, max_new_tokens=max_new_tokens, seed=seed,
                          speculative=speculative, start=start, on_budget=on_budget)
    cfg, gen = opts.config, opts.generation
    if prompt is not None and messages is not None:
        raise ConfigError("give prompt= or messages=, not both")
    if messages is not None:
        messages = _check_requests([messages], False, "messages")[0]
    if string_deltas and not partial:
        raise ConfigError("string_deltas=True needs partial=True", key="string_deltas")
    if partial and (schema is None or tools is not None or reasoning or thinking_budget is not None):
        raise ConfigError("partial=True streams the value of a schema= (without tools or reasoning)",
                          key="partial")
    if tools is not None or reasoning or thinking_budget is not None:
        yield from _stream_structured(model, tokenizer, prompt if prompt is not None else messages, opts,
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
    ids = prompt_ids(lm, prompt, messages)
    check_context(lm, len(ids), gen.max_new_tokens, draft_lm=draft_lm)
    shared = conversation_prefix(lm, messages, None, ids)
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
    value: Any = None
    partial: Any = None


# ``stream(partial=_STEP_BATCHES)``: :func:`stream_model`'s private way to get the partial
# events one step at a time (it shows a partial instance as soon as a step's events are in).
_STEP_BATCHES = object()


def _partial_steps(steps: Iterator[tuple[list[int], Any]], vocab: Any, pyd: Any,
                   string_deltas: bool) -> Iterator[tuple[str, list[Any], Any, GenerationResult | None]]:
    """``(text, events, document, None)`` for each step of a ``partial=True`` stream (its
    text, the :class:`~structgen.generation.partial.PartialEvent` list it completes and the
    document so far), then ``(tail, events, document, result)`` once the output has ended."""
    from structgen.generation.loop import _sequence_result
    from structgen.generation.partial import PartialJsonReader

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
    yield tail, events, reader.document, _finish(_sequence_result(seq), pyd, True)


def _stream_partial(batches: Iterator[tuple[str, list[Any], Any, Any]]) -> Iterator[StreamEvent]:
    """:func:`stream` with ``partial=True``: each step's text, then the events it completes."""
    for text, events, document, result in batches:
        if text:
            yield StreamEvent("content", text)
        for e in events:
            yield StreamEvent(e.kind, pointer=e.pointer, value=e.value, partial=document)
        if result is not None:
            yield StreamEvent("done", result=result)


def _stream_structured(model: Any, tokenizer: Any, item: Any, opts: Any, draft_model: Any, *,
                       schema: Any, **plan_kw: Any) -> Iterator[StreamEvent]:
    """:func:`stream` with tools and/or reasoning: the events of
    :class:`~structgen.calls.plan.OutputStream`, then the result."""
    from structgen.calls.plan import OutputStream
    from structgen.generation.loop import _sequence_result, stream_sequence

    gen = opts.generation
    lm, vocab, draft_lm, ids, shared, plan = _plan_structured(model, tokenizer, item, opts, draft_model,
                                                              schema=schema, **plan_kw)
    reader = OutputStream(plan)
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    eos = set(vocab.eos_token_ids)
    seq = None

    def events(raw: list[tuple[Any, ...]]) -> Iterator[StreamEvent]:
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
    yield StreamEvent("done", result=_structured_result(plan, _sequence_result(seq), schema,
                                                        reader.call_ids()))


def stream_model(model: Any, cls: type, prompt: str | None = None, **kw: Any) -> Iterator[Any]:
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
    from structgen.generation.partial import partial_instance

    if "messages" not in kw and prompt is not None:
        kw["messages"] = [{"role": "user", "content": prompt}]
        prompt = None
    unfinished: set[str] = set()  # pointers of the values begun and not yet complete
    for _text, events, document, result in stream(model, schema=cls, prompt=prompt,
                                                  partial=_STEP_BATCHES, **kw):  # type: ignore[arg-type]
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
            final = cls.model_validate_json(result.text)  # type: ignore[attr-defined]
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise ModelValidationError(f"the output is not a valid {cls.__name__}: {e}",
                                       text=result.text, finish_reason=result.finish_reason) from e
        yield final


def _in_open_list(document: Any, pointer: str, unfinished: set[str]) -> bool:
    """Whether the value at ``pointer`` lies inside an array that is still being written."""
    node, at = document, ""
    for part in pointer.split("/")[1:]:
        if isinstance(node, list):
            if at in unfinished:
                return True
            node = node[int(part)]
        else:
            node = node[part.replace("~1", "/").replace("~0", "~")]
        at += "/" + part
    return False


def generate_model(model: Any, cls: type, prompt: str | None = None, **kw: Any) -> Any:
    """Generate an instance of the Pydantic class ``cls``; raises
    :class:`~structgen.errors.ModelValidationError` (a ValueError) when the output is
    incomplete (``max_new_tokens`` reached)."""
    if "messages" not in kw and prompt is not None:
        kw["messages"] = [{"role": "user", "content": prompt}]
        prompt = None
    r = generate(model, schema=cls, prompt=prompt, **kw)
    if r.value is None:
        raise ModelValidationError(f"generation did not complete a {cls.__name__} "
                                   f"(finish_reason={r.finish_reason}, error={r.error})",
                                   text=r.text, finish_reason=r.finish_reason)
    return r.value
