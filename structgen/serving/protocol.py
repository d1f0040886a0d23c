"""The OpenAI-compatible request and response models of ``structgen serve`` (Pydantic).

Requests follow OpenAI's Chat Completions and (legacy) Completions APIs. ``response_format``
takes OpenAI's ``{"type": "text"}``, ``{"type": "json_object"}`` and ``{"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}``, plus two structgen extensions:
``{"type": "grammar", "grammar": LARK_TEXT, "start": "start"}`` and ``{"type": "regex",
"regex": PATTERN}``. Fields OpenAI defines that structgen does not implement are refused with a
400 naming the field when they ask for something (``logit_bias``, ``echo``, ...),
and ignored when they are at their neutral value; unknown fields are ignored, as OpenAI's
own server does with fields newer than it. ``tools`` / ``tool_choice`` /
``parallel_tool_calls`` are tool calling; the legacy ``functions`` fields are refused.

The models are strict: a JSON string is never read as a boolean or a number (``"stream":
"yes"``, ``"n": "2"`` and ``"max_tokens": true`` are 400s naming the field, where lax
Pydantic would have guessed), and an integer field takes no float (``"seed": 1.5``). A float
field still takes a JSON integer (``"temperature": 1``): JSON has one number type. Counts are
bounded (``max_tokens`` and its kin at :data:`~structgen.config.MAX_COUNT`), so an absurd value
is a 400 here rather than an allocation further down.

Responses carry ``usage`` with a ``structgen`` extension: speculative statistics per request
(target forward passes, tokens per pass, drafted and accepted tokens, acceptance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from structgen.config import MAX_COUNT
from structgen.errors import ConfigError
from structgen.generation.messages import message_text, template_message
from structgen.serving.submission import TEXT, ChoiceResult, Constraint

__all__ = ["ChatCompletionRequest", "ChatMessage", "CompletionRequest", "JsonSchemaFormat",
           "ResponseFormat", "StreamOptions", "UNSUPPORTED_FIELDS", "constraint_of", "speculative_usage"]

#: Request fields structgen refuses when they ask for something (value -> neutral test).
UNSUPPORTED_FIELDS: dict[str, Callable[[object], bool]] = {
    "logit_bias": lambda v: not v,
    "presence_penalty": lambda v: v in (None, 0, 0.0),
    "frequency_penalty": lambda v: v in (None, 0, 0.0),
    "best_of": lambda v: v in (None, 1),
    "echo": lambda v: v in (None, False),
    "suffix": lambda v: v in (None, ""),
    "audio": lambda v: v is None,
    "modalities": lambda v: v in (None, ["text"]),
    "prediction": lambda v: v is None,
}


class _Model(BaseModel):
    # strict: request bodies are JSON, whose types are exact; lax coercion ("yes" -> True,
    # "2" -> 2) would accept what a typo or an attacker sent and answer something else
    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True)


class JsonSchemaFormat(_Model):
    """``response_format.json_schema``: ``schema`` is the JSON Schema; ``strict`` (default
    true) gives objects only their declared keys (``strict: false``: every value the schema
    allows; structgen's output always matches the schema either way)."""

    name: str = "output"
    description: str | None = None
    schema_: dict[str, object] | bool = Field(default=True, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Model):
    """``response_format``: ``type`` is ``text``, ``json_object``, ``json_schema`` (with
    ``json_schema``), or the extensions ``grammar`` (Lark text in ``grammar``, start rule
    ``start``) and ``regex`` (a pattern in ``regex``)."""

    type: Literal["text", "json_object", "json_schema", "grammar", "regex"]
    json_schema: JsonSchemaFormat | None = None
    grammar: str | None = None
    start: str = "start"
    regex: str | None = None


class ChatMessage(_Model):
    """One message: ``role`` one of OpenAI's roles (``system``, ``developer``, ``user``,
    ``assistant``, ``tool``, the legacy ``function``); ``content`` a string or a list of
    ``{"type": "text", "text": ...}`` parts; an assistant message's ``tool_calls`` (OpenAI's
    ``{"id", "type": "function", "function": {"name", "arguments"}}``) and a tool message's
    ``tool_call_id``, which reach the chat template (a tool round trip)."""

    # OpenAI's roles only: any other string would reach the chat template, which may fail on
    # it or, worse, render it as a role the model was trained to obey
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, object]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, object]] | None = None
    tool_call_id: str | None = None

    def template_dict(self, index: int) -> dict[str, object]:
        """The message as the chat templates of Hugging Face models read it
        (:func:`structgen.generation.messages.template_message`: each call's arguments as a
        mapping). ``index``: the message's place, for errors."""
        return template_message(self.model_dump(exclude_none=True), index)

    def text(self) -> str:
        """The message's text (text parts joined); other part types are refused."""
        return message_text(self.content, "messages")


class StreamOptions(_Model):
    """``stream_options``: ``include_usage`` ends a stream with a usage chunk;
    ``structgen_partial`` (a structgen extension) adds typed partial events to each chunk
    (:mod:`structgen.serving.partial_events`)."""

    include_usage: bool | None = None
    structgen_partial: bool | None = None


class _Common(_Model):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    # structgen extension: what happens when max_tokens is below the shortest valid output
    on_max_tokens: Literal["auto", "refuse", "cut"] = "auto"

    def stops(self) -> tuple[str, ...]:
        """``stop`` as a tuple of strings (at most 4, as OpenAI allows)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise ConfigError("stop: at most 4 stop strings", key="stop")
        return tuple(s for s in stops if s)

    def on_budget(self) -> str | None:
        """The engine's ``on_budget`` for ``on_max_tokens`` (a structgen extension):
        ``"auto"`` (default) ends a constrained output complete within ``max_tokens`` where it
        can and cuts it at ``max_tokens`` (``finish_reason: "length"``) where ``max_tokens`` is
        below the shortest valid output; ``"refuse"`` answers 400 there instead; ``"cut"``
        never steers the output towards an end (OpenAI's behaviour: cut at ``max_tokens``)."""
        return {"auto": None, "refuse": "close", "cut": "cut"}[self.on_max_tokens]

    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk (``stream_options``)."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def refuse_unsupported(self) -> None:
        """A 400 (ConfigError naming the field) for a field structgen does not implement."""
        extra = self.model_extra or {}
        for name, neutral in UNSUPPORTED_FIELDS.items():
            if name in extra and not neutral(extra[name]):
                raise ConfigError(f"{name}: not supported by structgen serve", key=name)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` is the newer name of
    ``max_tokens`` (either may be given). ``tools`` (OpenAI function specs) / ``tool_choice`` /
    ``parallel_tool_calls``: tool calling (:mod:`structgen.calls.plan`); the answer
    carries ``message.tool_calls`` whose arguments validate against their tool's schema.
    ``reasoning`` (a structgen extension, ``extra_body`` in the OpenAI client): the model thinks
    freely inside ``<think>...</think>`` first (``thinking_budget`` tokens at most), then
    answers under ``response_format`` or ``tools``; the thinking is ``message.reasoning_content``
    (``delta.reasoning_content`` when streamed)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    tools: list[dict[str, object]] | None = None
    tool_choice: str | dict[str, object] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, object]] | None = None
    reasoning: bool = False
    thinking_budget: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    function_call: str | dict[str, object] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def logprob_count(self) -> int | None:
        """The engine's ``logprobs`` (:class:`~structgen.serving.engine.EngineRequest`): None
        unless ``logprobs`` is true, else ``top_logprobs`` (0 when not given)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def budget(self) -> int | None:
        """The output token limit (``max_completion_tokens``, else ``max_tokens``)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def refuse_unsupported(self) -> None:
        """Also refuses the legacy ``functions`` / ``function_call`` (give ``tools``), and a
        ``tool_choice`` without ``tools``."""
        super().refuse_unsupported()
        for name in ("functions", "function_call"):
            if getattr(self, name):
                raise ConfigError(f"{name}: the legacy function-calling fields are not supported; "
                                  "give tools (and tool_choice)", key=name)
        if not self.tools and self.tool_choice not in (None, "none", "auto"):
            raise ConfigError("tool_choice: needs tools", key="tool_choice")
        if self.thinking_budget is not None and not self.reasoning:
            raise ConfigError("thinking_budget: needs reasoning", key="thinking_budget")
        if self.top_logprobs is not None and not self.logprobs:
            raise ConfigError("top_logprobs: needs logprobs set to true", key="top_logprobs")

    def message_dicts(self) -> list[dict[str, object]]:
        """The messages as dicts for the chat template (:meth:`ChatMessage.template_dict`)."""
        return [m.template_dict(i) for i, m in enumerate(self.messages)]


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is a string (or a list of one string)."""

    prompt: str | list[str]
    # legacy Completions: how many alternatives to list per token (0..5, OpenAI's bound)
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def logprob_count(self) -> int | None:
        """The engine's ``logprobs``: the request's ``logprobs`` (None: none asked)."""
        return self.logprobs

    def prompt_text(self) -> str:
        """The one prompt of the request."""
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise ConfigError("prompt: give one prompt string (a list of several is not supported)",
                              key="prompt")
        return self.prompt[0]


def constraint_of(fmt: ResponseFormat | None) -> Constraint:
    """The engine constraint of a ``response_format`` (None or ``text``: any text)."""
    if fmt is None or fmt.type == "text":
        return TEXT
    if fmt.type == "json_object":
        return Constraint("json_object")
    if fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise ConfigError("response_format: type json_schema needs a json_schema object with a "
                              "schema", key="response_format.json_schema")
        js = fmt.json_schema
        return Constraint("json", js.schema_, strict=True if js.strict is None else js.strict)
    if fmt.type == "grammar":
        if not fmt.grammar:
            raise ConfigError("response_format: type grammar needs the Lark grammar text in 'grammar'",
                              key="response_format.grammar")
        return Constraint("grammar", fmt.grammar, start=fmt.start)
    if not fmt.regex:
        raise ConfigError("response_format: type regex needs the pattern in 'regex'",
                          key="response_format.regex")
    return Constraint("regex", fmt.regex)


def speculative_usage(results: list[ChoiceResult]) -> dict[str, object]:
    """The ``usage.structgen`` extension: the request's speculative statistics."""
    passes = sum(r.stats.forward_passes for r in results)
    tokens = sum(len(r.tokens) for r in results)
    drafted = sum(r.stats.drafted for r in results)
    accepted = sum(r.stats.accepted for r in results)
    ttft = [r.stats.time_to_first_token for r in results if r.stats.time_to_first_token is not None]
    return {
        "forward_passes": passes,
        "tokens_per_pass": round(tokens / passes, 4) if passes else None,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance": round(accepted / drafted, 4) if drafted else None,
        "free_tokens": sum(r.stats.free_tokens for r in results),
        "time_to_first_token_s": round(min(ttft), 6) if ttft else None,
        "finish": [r.reason for r in results],
    }
