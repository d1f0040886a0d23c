"""A request's prompt as token ids: ``messages`` rendered by the chat template (or the
``prompt`` text), and how much of it earlier turns of the conversation share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from structgen.errors import ConfigError

if TYPE_CHECKING:
    from structgen.generation.model import CausalLM

__all__ = ["ChatTokenizer", "MessageLike", "Tokenizer", "conversation_prefix", "prompt_ids",
           "template_messages"]

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


def template_messages(template: str | None, messages: Sequence[MessageLike]) -> list[MessageLike]:
    """``messages`` as a chat template can render them: OpenAI's ``developer`` role becomes
    ``system`` unless the template itself knows ``developer`` (templates skip roles they do not
    know, and the instructions would vanish)."""
    if template and "developer" in template:
        return list(messages)
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]


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
        text = tok.apply_chat_template(template_messages(tok.chat_template, messages),
                                       add_generation_prompt=generation_prompt, tokenize=False, **extra)
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
