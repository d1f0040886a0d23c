"""OpenAI-style chat messages as Hugging Face chat templates read them.

One conversion for every door (:func:`structgen.generate`, :func:`structgen.stream`,
``structgen serve``'s chat and Responses routes): a message is ``{"role", "content"}`` with

* ``role`` one of OpenAI's roles (``system``, ``developer``, ``user``, ``assistant``, ``tool``,
  the legacy ``function``): any other string would reach the template, which may fail on it or
  render it as a role the model was trained to obey;
* ``content`` a string, a list of
  ``{"type": "text", "text": ...}`` parts (joined; other part types are refused), or None in
  an assistant message that calls tools (OpenAI's rule: every other message needs content);
* an assistant message's ``tool_calls`` (``{"id", "type": "function", "function": {"name",
  "arguments"}}``): OpenAI sends the arguments as JSON text, the templates serialise them
  themselves (``tojson``), so they become a mapping here -- left as text, the model would see
  them encoded twice and learn from its own history to write arguments as a string;
* a tool message's ``tool_call_id`` and ``name``.

Errors are :class:`~structgen.errors.ConfigError` naming ``messages[i]`` (and the request, in
a batch).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from structgen.errors import ConfigError

__all__ = ["ROLES", "Message", "message_text", "template_call", "template_message", "template_messages_of"]

#: the roles a message may have
ROLES = ("system", "developer", "user", "assistant", "tool", "function")

#: one message as a chat template takes it (``role``, ``content``, ...); the values are passed
#: to the template as they are
Message = dict[str, object]


def template_messages_of(messages: object, *, where: str = "") -> list[Message]:
    """``messages`` (a non-empty list of OpenAI-style messages) converted for the chat template
    (see the module docstring); ``where`` prefixes errors (``"request 2: "``)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ConfigError(f"{where}messages must be a non-empty list of messages, not "
                          f"{type(messages).__name__}", key="messages")
    return [template_message(m, i, where=where) for i, m in enumerate(messages)]


def template_message(message: object, index: int, *, where: str = "") -> Message:
    """One message converted for the chat template; ``index`` its place, for errors."""
    at = f"{where}messages[{index}]"
    if not isinstance(message, Mapping):
        raise ConfigError(f"{at}: a message is a dict with 'role' and 'content', not "
                          f"{type(message).__name__}", key="messages")
    role = message.get("role")
    if role not in ROLES:
        raise ConfigError(f"{at}: role {role!r} is not one of {', '.join(ROLES)}", key="messages")
    content = message.get("content")
    if content is None and not (role == "assistant" and message.get("tool_calls")):
        # only an assistant turn that calls tools may leave its text out (OpenAI's rule)
        raise ConfigError(f"{at}: a {role} message needs 'content' (a string or text parts)",
                          key="messages")
    out: Message = {"role": role, "content": message_text(content, at)}
    for key in ("name", "tool_call_id"):
        value = message.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ConfigError(f"{at}.{key}: must be a string", key="messages")
            out[key] = value
    calls = message.get("tool_calls")
    if calls:
        if role != "assistant":
            raise ConfigError(f"{at}: tool_calls belong to an assistant message, not {role!r}",
                              key="messages")
        if not isinstance(calls, (list, tuple)):
            raise ConfigError(f"{at}.tool_calls: must be a list", key="messages")
        out["tool_calls"] = [template_call(c, f"{at}.tool_calls[{j}]") for j, c in enumerate(calls)]
    return out


def message_text(content: object, at: str) -> str:
    """A message's ``content`` as text: a string, None (empty) or text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ConfigError(f"{at}.content: a string or a list of text parts, not {type(content).__name__}",
                          key="messages")
    out = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("text", "input_text", "output_text") or not isinstance(part.get("text"), str):
            raise ConfigError(f"{at}.content[{i}] has type {kind!r}: only text parts are supported",
                              key="messages")
        out.append(part["text"])
    return "".join(out)


def template_call(call: object, at: str) -> Message:
    """One of an assistant message's ``tool_calls`` for the chat template, its arguments as a
    mapping; ``at`` names it in errors."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(call, Mapping) or call.get("type", "function") != "function" \
            or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ConfigError(f"{at}: give {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                          "\"arguments\": ...}}", key="messages")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise ConfigError(f"{at}.function.arguments: not JSON ({e})", key="messages") from None
    out: Message = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out
