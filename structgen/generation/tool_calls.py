"""Tool calling and reasoning for :func:`structgen.generate`: the grammar of a call and the
parts of its result.

* :func:`plan_output` turns the call's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` /
  ``reasoning`` and constraint (a schema, Lark grammar or regex, or none) into one compiled
  triggered grammar (:mod:`structgen.frontends.triggered`) plus what is needed to read the
  output back (an :class:`OutputPlan`);
* :meth:`OutputPlan.split` splits an output into ``reasoning``, free ``text`` and validated
  ``tool_calls`` (:class:`ToolCall`).

Reasoning: the output is ``<think>`` (unless the prompt already ends with it), free text in
which ``</think>`` does not occur, ``</think>``, up to four spaces or newlines, then the
answer: the constraint's language, the tool-call grammar, or any text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from structgen.errors import ConfigError

__all__ = ["OutputPlan", "ToolCall", "plan_output"]

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass
class ToolCall:
    """One tool call of an output: ``id`` (``call_`` + 24 hex digits), the tool ``name`` and
    its ``arguments`` (the parsed JSON object, validated against the tool's schema)."""

    id: str
    name: str
    arguments: Any

    def openai(self) -> dict[str, Any]:
        """The OpenAI message form ``{"id", "type": "function", "function": {"name",
        "arguments": <JSON text>}}`` (to put back into ``messages``)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass
class OutputPlan:
    """What :func:`plan_output` decided: the compiled ``grammar``, the tool ``format`` and
    ``tools`` (None without tools), whether the output starts inside reasoning
    (``reasoning``, and ``think_prefix`` written by the grammar), and the tools as the chat
    template's ``tools=`` list (``template_tools``); ``new_matcher``: the matcher factory the
    generation loop uses (a :class:`~structgen.masks.capped.CappedMatcher` under a thinking
    budget, else None)."""

    grammar: Any
    tools: list[Any] = field(default_factory=list)
    format: Any = None
    reasoning: bool = False
    think_prefix: str = ""
    template_tools: list[dict[str, Any]] | None = None
    new_matcher: Any = None

    def markers(self) -> list[str]:
        """The marker texts of the output (the format's, the thinking markers)."""
        out = list(self.format.markers) if self.format is not None else []
        return out + ([THINK_START, THINK_END] if self.reasoning else [])

    def vocabulary(self, vocab: Any, tokenizer: Any) -> Any:
        """``vocab``, with every special token whose text lies inside one of :meth:`markers`
        given that text (:meth:`~structgen.masks.vocab.Vocabulary.with_token_text`), so the
        model's own control token (Mistral's ``[TOOL_CALLS]``, a special ``<think>``) can write
        the marker; ``vocab`` itself when there is none."""
        markers = [m for m in self.markers() if m]
        specials = getattr(vocab, "special_ids", frozenset())
        if not markers or not specials or not hasattr(vocab, "with_token_text"):
            return vocab
        eos = set(vocab.eos_token_ids)
        texts = {}
        for i in sorted(specials - eos):
            try:
                content = tokenizer.convert_ids_to_tokens(int(i))
            except Exception:  # noqa: BLE001 - a tokenizer without that id
                continue
            if isinstance(content, str) and content and any(content in m for m in markers):
                texts[int(i)] = content
        return vocab.with_token_text(texts) if texts else vocab

    def split(self, text: str) -> tuple[str | None, str, list[ToolCall], list[str]]:
        """(reasoning or None, answer text, tool calls, errors) of a complete output."""
        reasoning = None
        if self.reasoning:
            body = self.think_prefix + text
            start = body.find(THINK_START)
            end = body.find(THINK_END)
            if end >= 0:
                reasoning = body[start + len(THINK_START) if start >= 0 else 0:end].strip()
                text = body[end + len(THINK_END):].lstrip()
        if self.format is None:
            return reasoning, text, [], []
        parsed = self.format.parse(text)
        errors = list(parsed.errors)
        calls: list[ToolCall] = []
        by_name = {t.name: t for t in self.tools}
        for name, args in parsed.calls:
            tool = by_name.get(name)
            if tool is None:
                errors.append(f"call of unknown tool {name!r}")
                continue
            problem = _validation_error(args, tool.parameters)
            if problem:
                errors.append(f"{name}: {problem}")
                continue
            calls.append(ToolCall("call_" + uuid.uuid4().hex[:24], name, args))
        return reasoning, parsed.text, calls, errors


def _validation_error(value: Any, schema: Any) -> str | None:
    import jsonschema

    try:
        jsonschema.validate(value, dict(schema))
    except jsonschema.ValidationError as e:
        where = "/" + "/".join(str(p) for p in e.absolute_path)
        return f"{e.message} (at {where})"
    return None


def plan_output(*, tools: Any = None, tool_choice: Any = "auto", parallel_tool_calls: bool = True,
                tool_format: Any = None, chat_template: str | None = None, reasoning: bool = False,
                prompt_text: str = "", schema: Any = None, grammar: Any = None, regex: Any = None,
                start: str = "start", strict: bool = True,
                thinking_budget: int | None = None) -> OutputPlan:
    """The grammar and reading of one output (see the module docstring). ``tool_format``:
    a registered name or :class:`~structgen.frontends.tools.ToolFormat` (default: implied by
    ``chat_template``, else Hermes). ``prompt_text``: the prompt, to tell whether the template
    already opened the thinking block. ``thinking_budget`` (with ``reasoning``): once that many
    tokens of reasoning (after the opening marker) have been generated without ``</think>``,
    the output must write ``</think>`` next. Raises :class:`~structgen.errors.ConfigError` for
    ``tools`` together with a schema/grammar/regex, a bad ``tool_choice`` or tool spec."""
    from structgen.config import JsonSchemaOptions
    from structgen.frontends.tools import format_for_template, normalize_tools, tool_choice_name
    from structgen.frontends.tools import tool_format as get_format
    from structgen.frontends.triggered import Region, TriggeredGrammar, body_grammar, compile_triggered
    from structgen.grammar import ir
    from structgen.grammar.compiler import compile_grammar

    tool_list = normalize_tools(tools)
    constraints = sum(x is not None for x in (schema, grammar, regex))
    if tool_list and constraints:
        raise ConfigError("give tools= or one of schema=/grammar=/regex=, not both", key="tools")
    if constraints > 1:
        raise ConfigError("give at most one of schema=, grammar= or regex=")
    tb = thinking_budget
    if tb is not None and (isinstance(tb, bool) or not isinstance(tb, int) or tb < 0):
        raise ConfigError("thinking_budget must be an integer >= 0", key="thinking_budget")
    if thinking_budget is not None and not reasoning:
        raise ConfigError("thinking_budget needs reasoning=True", key="thinking_budget")
    if not isinstance(parallel_tool_calls, bool):
        raise ConfigError("parallel_tool_calls must be true or false", key="parallel_tool_calls")
    options = JsonSchemaOptions(strict=strict)
    fmt = None
    answer: Any = None  # the answer's IR grammar (None: any text)
    if tool_list:
        name = tool_choice_name(tool_choice, tool_list)
        choice = "required" if name is not None else tool_choice
        used = [t for t in tool_list if name is None or t.name == name]
        fmt = get_format(tool_format if tool_format is not None else format_for_template(chat_template))
        answer = fmt.grammar(used, choice, parallel_tool_calls, options)
    elif schema is not None:
        answer = body_grammar("json", schema, json_options=options)
    elif grammar is not None:
        answer = body_grammar("grammar", grammar, start=start)
    elif regex is not None:
        answer = body_grammar("regex", regex)
    if answer is None:
        answer = ir.Grammar({"text": ir.star(ir.ANY_BYTE)}, "text")
    template_tools = [t.openai() for t in tool_list] or None
    if not reasoning:
        return OutputPlan(compile_grammar(answer), tool_list, fmt, False, "", template_tools)
    opened = prompt_text.rstrip().endswith(THINK_START)
    prefix = "" if opened else THINK_START + "\n"
    from structgen.grammar.passes import prefixed_grammar

    rules = prefixed_grammar(answer, "a.")
    rules["after_think"] = ir.seq(ir.rep(ir.byteset(b" \n"), 0, 4), ir.ref("a." + answer.start))
    region = Region(THINK_END, ir.Grammar(rules, "after_think"), "")
    spec = TriggeredGrammar((region,), 1, 1, stop_after=True, prefix=prefix)
    new_matcher = None
    if thinking_budget is not None:
        from functools import partial

        from structgen.masks.capped import CappedMatcher

        new_matcher = partial(CappedMatcher, marker=THINK_END, cap=thinking_budget,
                              count_after=None if opened else prefix)
    return OutputPlan(compile_triggered(spec), tool_list, fmt, True, THINK_START if opened else "",
                      template_tools, new_matcher)
