"""A request's prompt as token ids: ``messages`` rendered by the chat template (or the
``prompt`` text), and how much of it earlier turns of the conversation share."""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from structgen.calls.formats import format_for_template
from structgen.errors import ConfigError

if TYPE_CHECKING:
    from structgen.generation.model import CausalLM

__all__ = ["ChatTokenizer", "MessageLike", "Tokenizer", "conversation_prefix", "prompt_ids",
           "render_chat_template", "template_messages"]

# a chat message as the template reads it: read only, so any mapping of role, content, ... will do
MessageLike = Mapping[str, object]

class Tokenizer(Protocol):
    """What generation uses of a tokenizer to spell text (a transformers tokenizer, llama.cpp's)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """The token ids of ``text`` (``add_special_tokens``: with the tokenizer's BOS and the like)."""
        ...


class ChatTokenizer(Tokenizer, Protocol):
    """A :class:`Tokenizer` with a chat template (None: the tokenizer has none)."""

    chat_template: str | None

    def apply_chat_template(self, conversation: Sequence[MessageLike], *, add_generation_prompt: bool,
                            tokenize: bool, **kwargs: object) -> str:
        """``conversation`` rendered by the chat template (text, with ``tokenize=False``)."""
        ...


def _spellable(text: str, key: str) -> str:
    """``text``, or a ConfigError naming ``key`` when it holds a lone surrogate (a code point
    no UTF-8 text, and so no tokenizer, can hold)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"{key}: the text has a lone surrogate (U+{ord(text[e.start]):04X}) at character "
                          f"{e.start}; give valid Unicode", key=key) from None
    return text


def _template_json(value: object, ensure_ascii: bool = False, indent: int | None = None,
                   separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Chat templates are written against transformers' ``tojson``: keys in their given order and
    # no HTML escaping. Jinja's own filter sorts keys and writes ``<`` as ``\u003c``, which would
    # give the model a tool list or a past call spelled unlike its training data.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _refuse(message: str) -> None:
    raise ConfigError(f"the model's chat template refused the messages: {message}", key="messages")


@lru_cache(maxsize=16)
def _compiled_template(template: str) -> Any:
    # the environment chat templates are written for: trimmed blocks, ``{% break %}``, and the
    # helpers transformers gives them (``raise_exception``, ``strftime_now``, its ``tojson``)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _template_json
    env.globals["raise_exception"] = _refuse
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat_template(template: str, messages: Sequence[MessageLike], *, add_generation_prompt: bool,
                         bos_token: str = "", eos_token: str = "", **kwargs: object) -> str:
    """``messages`` rendered by the Jinja chat ``template`` in a sandbox, with the environment
    and helpers transformers' ``apply_chat_template`` gives templates, so that a template from a
    GGUF file renders the same text as it does in transformers. A template's own refusal
    (``raise_exception``) is a :class:`~structgen.errors.ConfigError`."""
    try:
        return str(_compiled_template(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token,
            eos_token=eos_token, **kwargs))
    except TemplateError as exc:
        raise ConfigError(f"the model's chat template failed: {exc}", key="messages") from None


def template_messages(template: str | None, messages: Sequence[MessageLike]) -> list[MessageLike]:
    """``messages`` as a chat template can render them: OpenAI's ``developer`` role becomes
    ``system`` unless the template itself knows ``developer`` (templates skip roles they do not
    know, and the instructions would vanish)."""
    out = list(messages)
    if not (template and "developer" in template):
        out = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in out]
    if template and format_for_template(template) == "mistral":
        out = [_mistral_ids(m) for m in out]
    return out


_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_BASE62 = string.digits + string.ascii_letters


def _mistral_id(call_id: object) -> object:
    """A tool call id as Mistral's templates require it (9 letters or digits): kept when it is
    one, else 9 base-62 digits of its SHA-256, so that a call and its result, which carry the
    same id, still match, and different ids stay apart."""
    if not isinstance(call_id, str) or _MISTRAL_ID.fullmatch(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).digest()[:8], "big")
    digits = []
    for _ in range(9):
        n, r = divmod(n, 62)
        digits.append(_BASE62[r])
    return "".join(digits)


def _mistral_ids(message: MessageLike) -> MessageLike:
    # OpenAI's ids (``call_`` and 24 hex digits) make Mistral's templates refuse the conversation
    out = dict(message)
    if "tool_call_id" in out:
        out["tool_call_id"] = _mistral_id(out["tool_call_id"])
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [{**c, "id": _mistral_id(c["id"])} if isinstance(c, Mapping) and "id" in c else c
                             for c in calls]
    return out


def prompt_ids(lm: CausalLM, prompt: str | None, messages: Sequence[MessageLike] | None,
               tools: Sequence[MessageLike] | None = None) -> list[int]:
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


def _render(tok: ChatTokenizer, messages: Sequence[MessageLike], tools: Sequence[MessageLike] | None, *,
            generation_prompt: bool) -> list[int]:
    """The token ids of ``messages`` in the chat template (``role: content`` lines without one),
    with the assistant's turn opened when ``generation_prompt``."""
    if getattr(tok, "chat_template", None):
        extra = {"tools": tools} if tools else {}
        try:
            text = tok.apply_chat_template(template_messages(tok.chat_template, messages),
                                           add_generation_prompt=generation_prompt, tokenize=False, **extra)
        except TemplateError as exc:  # transformers' renderer: the template's own refusal
            raise ConfigError(f"the model's chat template failed: {exc}", key="messages") from None
        return list(tok.encode(_spellable(text, "messages"), add_special_tokens=False))
    text = "\n".join(f"{m['role']}: {m['content']}" for m in template_messages(None, messages)) + "\n"
    return list(tok.encode(_spellable(text + ("assistant: " if generation_prompt else ""), "messages")))


def conversation_prefix(lm: CausalLM, messages: Sequence[MessageLike] | None,
                        tools: Sequence[MessageLike] | None, ids: list[int]) -> int:
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
