"""The options of one :func:`~structgen.generation.api.generate` / ``stream`` call, merged and
checked before any model loads: the configuration (a :class:`SpecConfig`, a dict or a YAML
file) with the call's keywords, per-request values of a batch, the requests themselves and
their constraints compiled."""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from structgen.config import GenerationOptions, JsonSchemaOptions, SpecConfig
from structgen.errors import ConfigError, StructgenError, attribute_to_request
from structgen.frontends.constraint import compile_constraint, is_model_class
from structgen.generation.messages import Message, template_messages_of
from structgen.generation.results import MAX_TOP_LOGPROBS
from structgen.grammar.compiled import CompiledGrammar
from structgen.settings import load_spec_config

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["CallOptions", "ConfigSource", "Constraint", "Request", "check_requests", "compile_all",
           "load_config", "logprob_count", "merge_options", "per_request", "resolve_grammar"]

#: ``config=`` of a call: a SpecConfig, its fields as a dict, or the path of a YAML file
ConfigSource = SpecConfig | str | os.PathLike[str] | dict[str, object] | None
#: one request: a prompt string or a conversation (a list of messages)
Request = str | list[Message]
#: a compiled constraint and the Pydantic class that validates its output (None: no class)
Constraint = tuple[CompiledGrammar, "type[BaseModel] | None"]


def load_config(config: ConfigSource) -> SpecConfig:
    """The :class:`SpecConfig` of ``config=``: itself, its fields as a dict (an unknown key is
    a ConfigError with the closest known one), or a YAML file read."""
    if config is None:
        return SpecConfig()
    if isinstance(config, SpecConfig):
        return config
    if isinstance(config, dict):
        known = [f.name for f in fields(SpecConfig)]
        for key in config:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"config: unknown key {key!r}{hint}; known: {', '.join(known)}",
                                  key=str(key))
        # the values are the user's: SpecConfig checks each one
        return SpecConfig(**cast("dict[str, Any]", config))
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config must be a SpecConfig, a dict or a YAML file path, not "
                          f"{type(config).__name__}", key="config")
    return load_spec_config(Path(config))  # YAML file



def resolve_grammar(*, schema: object = None, grammar: object = None, regex: str | None = None,
                    start: str = "start", strict: bool = True) -> Constraint:
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
    given = [x is not None for x in (schema, grammar, regex)]
    if sum(given) != 1:
        raise ConfigError("give exactly one of schema=, grammar= or regex=")
    if schema is not None:
        model = cast("type[BaseModel]", schema) if is_model_class(schema) else None
        return compile_constraint("json", schema, json_options=JsonSchemaOptions(strict=strict),
                                  strings_may_be_paths=True), model
    if grammar is not None:
        return compile_constraint("grammar", grammar, start=start), None
    return compile_constraint("regex", regex), None


def logprob_count(logprobs: object, top_logprobs: object) -> int | None:
    """The per-sequence ``logprobs`` setting of the step machine from :func:`generate`'s
    ``logprobs`` / ``top_logprobs``: None (off), or how many alternatives to list per token.
    ``top_logprobs`` without ``logprobs``, or outside 0..20, is a ConfigError."""
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


class _Overrides(TypedDict, total=False):
    """The SpecConfig fields a call's keywords override."""

    temperature: float
    top_p: float
    draft_model: str


@dataclass(frozen=True)
class CallOptions:
    """The options of one :func:`generate` / :func:`stream` call, merged and checked once.

    config: the call's :class:`SpecConfig` (``config=`` with the scalar keyword overrides);
    requests: one SpecConfig per request, equal to ``config`` except where a per-request
    ``temperature`` / ``top_p`` list gives that request its own sampling values;
    generation: the per-call :class:`~structgen.config.GenerationOptions`."""

    config: SpecConfig
    requests: list[SpecConfig]
    generation: GenerationOptions


def merge_options(config: ConfigSource, *, n: int, batch: bool,
                  temperature: float | Sequence[float] | None, top_p: float | Sequence[float] | None,
                  draft_model: object, max_new_tokens: int, seed: int | None, speculative: bool,
                  start: str, on_budget: str = "close") -> CallOptions:
    """Merge ``config`` (a SpecConfig, dict or YAML path) with the call's keywords, the one
    place :func:`generate` and :func:`stream` do it. Every value is checked by the dataclass
    that owns it (``temperature=float("nan")``, ``max_new_tokens=2.5``, ``seed=2**70`` are
    ConfigErrors); a bad value in a per-request list names its request. Reads the YAML file
    when ``config`` is a path; loads no model."""
    cfg = load_config(config)
    over: _Overrides = {}
    temperatures = per_request("temperature", temperature, n, batch)
    top_ps = per_request("top_p", top_p, n, batch)
    scalar_t = not isinstance(temperature, (list, tuple))
    scalar_p = not isinstance(top_p, (list, tuple))
    if temperature is not None and scalar_t:
        over["temperature"] = cast(float, temperature)
    if top_p is not None and scalar_p:
        over["top_p"] = cast(float, top_p)
    if draft_model is not None and isinstance(draft_model, (str, os.PathLike)):
        over["draft_model"] = str(draft_model)
    cfg = replace(cfg, **over) if over else cfg
    requests = [cfg] * n
    if not (scalar_t and scalar_p):
        made: dict[tuple[object, object], SpecConfig] = {}
        for i, (t, p) in enumerate(zip(temperatures, top_ps)):
            key = (None if scalar_t else t, None if scalar_p else p)
            if key not in made:
                own: _Overrides = {}
                if key[0] is not None:
                    own["temperature"] = cast(float, key[0])
                if key[1] is not None:
                    own["top_p"] = cast(float, key[1])
                try:
                    made[key] = replace(cfg, **own) if own else cfg
                except ConfigError as e:
                    raise attribute_to_request(e, i) from None
            requests[i] = made[key]
    generation = GenerationOptions(max_new_tokens=max_new_tokens, seed=seed, speculative=speculative,
                                   start=start, on_budget=on_budget)
    return CallOptions(cfg, requests, generation)


def check_requests(items: Sequence[object], batch: bool, name: str) -> list[Request]:
    """Each request is a prompt string or a conversation (a list of OpenAI-style messages,
    :mod:`structgen.generation.messages`); anything else is a ConfigError naming the request,
    before any work. Returns the requests with each conversation converted for the chat
    template."""
    if batch and not items:
        raise ConfigError(f"{name}= is an empty list: give at least one request", key=name)
    out: list[Request] = []
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


def per_request(name: str, value: object, n: int, batch: bool) -> list[object]:
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


def compile_all(schemas: list[object], grammars: list[object], regexes: list[object], start: str,
                batch: bool, strict: bool = True) -> list[Constraint]:
    """Compile every request's constraint (a constraint shared by several requests once); in a
    batch an error names its request (``request 1: ...``, ``error.request_index``)."""
    done: dict[tuple[int, int, int], Constraint] = {}
    out: list[Constraint] = []
    for i, (s, g, r) in enumerate(zip(schemas, grammars, regexes)):
        key = (id(s), id(g), id(r))
        if key not in done:
            try:
                done[key] = resolve_grammar(schema=s, grammar=g, regex=cast("str | None", r), start=start,
                                            strict=strict)
            except StructgenError as e:
                if batch:
                    raise attribute_to_request(e, i) from None
                raise
        out.append(done[key])
    return out
