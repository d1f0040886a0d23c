"""Tool calling and reasoning for :func:`structgen.generate`: the grammar of a call and the
parts of its result.

* :func:`plan_output` turns the call's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` /
  ``reasoning`` and constraint (a schema, Lark grammar or regex, or none) into one compiled
  triggered grammar (:mod:`structgen.calls.triggered`) plus what is needed to read the
  output back (an :class:`OutputPlan`);
* :meth:`OutputPlan.split` splits an output into ``reasoning``, free ``text`` and validated
  ``tool_calls`` (:class:`ToolCall`).

Reasoning: the output is ``<think>`` (unless the prompt already ends with it), free text in
which ``</think>`` does not occur, ``</think>``, up to four spaces or newlines, then the
answer: the constraint's language, the tool-call grammar, or any text.

Tools together with a constraint (a schema, grammar or regex): on one turn the model either
calls tools -- only calls, in the format -- or gives its final answer in the constraint's
language. ``tool_choice="required"`` or a named tool: calls only; ``"none"``: the answer
only. Where an output is both (a JSON answer that is also a JSON call of one of the tools),
it is read as the calls: the output is the calls when the calls' grammar accepts it, else
the answer (:meth:`OutputPlan.answer_or_calls`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from structgen.calls.formats import (
    Tokenizer,
    Tool,
    ToolFormat,
    detect_tool_format,
    either_grammar,
    normalize_tools,
    tool_choice_name,
)
from structgen.calls.formats import tool_format as get_format
from structgen.calls.scan import PartialCall, held_marker_prefix
from structgen.calls.triggered import Region, TriggeredGrammar, body_grammar, compile_triggered
from structgen.config import JsonSchemaOptions
from structgen.errors import ConfigError, SchemaError
from structgen.grammar import ir
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.compiler import compile_grammar
from structgen.grammar.passes import prefixed_grammar
from structgen.json_types import JsonObject, JsonValue

if TYPE_CHECKING:  # pragma: no cover
    from structgen.masks.capped import CappedMatcher
    from structgen.masks.vocab import Vocabulary

__all__ = ["CallStream", "OutputPlan", "OutputStream", "ToolCall", "plan_output"]

THINK_START = "<think>"
THINK_END = "</think>"


class _TokenNames(Protocol):
    """The one tokenizer method :meth:`OutputPlan.vocabulary` uses."""

    def convert_ids_to_tokens(self, ids: int) -> object: ...


@dataclass
class ToolCall:
    """One tool call of an output: ``id`` (``call_`` + 24 hex digits), the tool ``name`` and
    its ``arguments`` (the parsed JSON object, validated against the tool's schema)."""

    id: str
    name: str
    arguments: JsonValue
    #: the arguments' JSON text as the model wrote it (None: unknown, :meth:`openai` writes it)
    arguments_text: str | None = None

    def openai(self) -> JsonObject:
        """The OpenAI message form ``{"id", "type": "function", "function": {"name",
        "arguments": <JSON text>}}`` (to put back into ``messages``): the text the model
        wrote where it is known (what a stream of the same output sends), else the arguments
        written by ``json.dumps``."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments_json()}}

    def arguments_json(self) -> str:
        """The arguments as JSON text: as the model wrote them where known, else
        ``json.dumps`` of :attr:`arguments` (the ``arguments`` of :meth:`openai`)."""
        text = self.arguments_text
        if text is None:
            text = json.dumps(self.arguments, ensure_ascii=False)
        return text


@dataclass
class OutputPlan:
    """What :func:`plan_output` decided: the compiled ``grammar``, the tool ``format`` and
    ``tools`` (None without tools), whether the output starts inside reasoning
    (``reasoning``, and ``think_prefix`` written by the grammar), and the tools as the chat
    template's ``tools=`` list (``template_tools``); ``new_matcher``: the matcher factory the
    generation loop uses (a :class:`~structgen.masks.capped.CappedMatcher` under a thinking
    budget, else None)."""

    grammar: CompiledGrammar
    tools: list[Tool] = field(default_factory=list)
    format: ToolFormat | None = None
    reasoning: bool = False
    think_prefix: str = ""
    template_tools: list[JsonObject] | None = None
    new_matcher: Callable[..., CappedMatcher] | None = None
    #: the ``tool_choice`` as the grammar has it: "auto", "required" (a named tool too) or "none"
    choice: str = "auto"
    #: with tools and a constraint together: the IR grammars of the answer and of the calls
    #: (None without; ``calls`` is None under "none")
    answer: ir.Grammar | None = None
    calls: ir.Grammar | None = None
    _compiled: dict[str, CompiledGrammar] = field(default_factory=dict, repr=False, compare=False)

    def markers(self) -> list[str]:
        """The marker texts of the output (the format's, the thinking markers)."""
        out = list(self.format.markers) if self.format is not None else []
        return out + ([THINK_START, THINK_END] if self.reasoning else [])

    def vocabulary(self, vocab: Vocabulary, tokenizer: _TokenNames) -> Vocabulary:
        """``vocab``, with every special token whose text lies inside one of :meth:`markers`
        given that text (:meth:`~structgen.masks.vocab.Vocabulary.with_token_text`), so the
        model's own control token (Mistral's ``[TOOL_CALLS]``, a special ``<think>``) can write
        the marker; ``vocab`` itself when there is none."""
        markers = [m for m in self.markers() if m]
        specials: frozenset[int] = getattr(vocab, "special_ids", frozenset())
        if not markers or not specials or not hasattr(vocab, "with_token_text"):
            return vocab
        eos = set(vocab.eos_token_ids)
        texts: dict[int, bytes | str] = {}
        for i in sorted(specials - eos):
            try:
                content = tokenizer.convert_ids_to_tokens(int(i))
            except Exception:  # noqa: BLE001 - a tokenizer without that id
                continue
            if isinstance(content, str) and content and any(content in m for m in markers):
                texts[int(i)] = content
        return vocab.with_token_text(texts) if texts else vocab

    def _grammar_of(self, which: str) -> CompiledGrammar:
        """The compiled ``answer`` or ``calls`` grammar (compiled once, cached by content)."""
        if which not in self._compiled:
            self._compiled[which] = compile_grammar(getattr(self, which))
        return self._compiled[which]

    def answer_or_calls(self, answer: str, *, final: bool = True) -> str | None:
        """Whether ``answer`` (the output after any reasoning) is ``"calls"`` or the
        constraint's ``"answer"``, where tools and a constraint combine (always ``"calls"``
        without a constraint). Complete (``final``): the calls when the calls' grammar
        accepts it (an output in both languages is the calls), else the answer. Growing: the
        answer once no call can start that way, the calls once no answer can; None while
        both can."""
        if self.answer is None:
            return "calls"
        if self.choice == "none":
            return "answer"
        if self.choice == "required":
            return "calls"
        calls = self._grammar_of("calls")
        if final:
            return "calls" if calls.accepts(answer) else "answer"
        if not calls.accepts_prefix(answer):
            return "answer"
        if not self._grammar_of("answer").accepts_prefix(answer):
            return "calls"
        return None

    def split(self, text: str) -> tuple[str | None, str, list[ToolCall], list[str]]:
        """(reasoning or None, answer text, tool calls, errors) of a complete output. Under
        ``tool_choice="none"`` no calls are read (the text stripped; with a constraint, the
        answer as written); with tools and a constraint, an answer is returned as the text
        with no calls (:meth:`answer_or_calls`)."""
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
        if self.answer_or_calls(text) == "answer":
            return reasoning, text, [], []
        if self.choice == "none":  # the grammar let no call open: whatever it reads like, text
            return reasoning, text.strip(), [], []
        parsed = self.format.parse(text)
        errors = list(parsed.errors)
        calls: list[ToolCall] = []
        by_name = {t.name: t for t in self.tools}
        raw: list[str | None] = [None] * len(parsed.calls)
        stream = CallStream.for_plan(replace(self, reasoning=False))  # (``text`` is the answer now)
        if stream is not None:  # the arguments as written, where the output reads as the grammar writes
            read = stream.read(text, final=True)
            got = None if read is None else read[1]
            if got is not None and [c.name for c in got] == [n for n, _ in parsed.calls]:
                raw = [c.args if c.done and json.loads(c.args) == a else None
                       for c, (_, a) in zip(got, parsed.calls)]
        for (name, args), args_text in zip(parsed.calls, raw):
            tool = by_name.get(name)
            if tool is None:
                errors.append(f"call of unknown tool {name!r}")
                continue
            problem = _validation_error(args, tool.parameters)
            if problem:
                errors.append(f"{name}: {problem}")
                continue
            calls.append(ToolCall("call_" + uuid.uuid4().hex[:24], name, args, args_text))
        return reasoning, parsed.text, calls, errors


def _validation_error(value: JsonValue, schema: Mapping[str, JsonValue]) -> str | None:
    import jsonschema  # (only to check calls: importing calls stays cheap)

    try:
        jsonschema.validate(value, dict(schema))
    except jsonschema.ValidationError as e:
        where = "/" + "/".join(str(p) for p in e.absolute_path)
        return f"{e.message} (at {where})"
    return None


def plan_output(*, tools: object = None, tool_choice: object = "auto", parallel_tool_calls: bool = True,
                tool_format: str | ToolFormat | None = None, chat_template: str | None = None,
                reasoning: bool = False, prompt_text: str = "", schema: object = None,
                grammar: object = None, regex: object = None, start: str = "start",
                strict: bool = True, thinking_budget: int | None = None,
                tokenizer: Tokenizer | None = None) -> OutputPlan:
    """The grammar and reading of one output (see the module docstring). ``tool_format``:
    a registered name or :class:`~structgen.calls.formats.ToolFormat` (default: what
    :func:`~structgen.calls.formats.detect_tool_format` finds in ``chat_template`` and
    ``tokenizer``). ``tools`` with one of ``schema``/``grammar``/``regex``: the output is
    either calls or the answer in the constraint's language (module docstring).
    ``prompt_text``: the prompt, to tell whether the template already opened the thinking
    block. ``thinking_budget`` (with ``reasoning``): once that many tokens of reasoning (after
    the opening marker) have been generated without ``</think>``, the output must write
    ``</think>`` next. Raises :class:`~structgen.errors.ConfigError` for more than one
    constraint, a bad ``tool_choice`` or tool spec."""
    tool_list = normalize_tools(tools)
    constraints = sum(x is not None for x in (schema, grammar, regex))
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
    constraint: ir.Grammar | None = None  # the constraint's IR grammar (None: none given)
    if schema is not None:
        constraint = body_grammar("json", schema, json_options=options)
    elif grammar is not None:
        constraint = body_grammar("grammar", grammar, start=start)
    elif regex is not None:
        constraint = body_grammar("regex", regex)
    fmt = None
    choice = "auto"
    calls: ir.Grammar | None = None  # the calls-only grammar, where tools and a constraint combine
    answer: ir.Grammar | None = constraint  # the IR grammar of what follows any reasoning (None: any text)
    if tool_list:
        name = tool_choice_name(tool_choice, tool_list)
        choice = "required" if name is not None else str(tool_choice)  # (checked: a choice string)
        used = [t for t in tool_list if name is None or t.name == name]
        if tool_format is None:
            tool_format = detect_tool_format(tokenizer, chat_template)
        fmt = get_format(tool_format)
        try:
            if constraint is None:
                answer = fmt.grammar(used, choice, parallel_tool_calls, options)
            elif choice != "none":  # calls only, or (auto) calls or the answer
                calls = fmt.grammar(used, "required", parallel_tool_calls, options)
                answer = calls if choice == "required" else either_grammar(calls, constraint)
        except SchemaError as e:  # a tool's parameters: say which, where the request gave it
            where = [i for i, t in enumerate(tool_list) if t.name == e.tool]
            if where:
                e.param = f"tools[{where[0]}].function.parameters"
            raise
    if answer is None:
        answer = ir.Grammar({"text": ir.star(ir.ANY_BYTE)}, "text")
    both_answer = constraint if fmt is not None else None
    template_tools = [t.openai() for t in tool_list] or None
    if not reasoning:
        return OutputPlan(compile_grammar(answer), tool_list, fmt, False, "", template_tools,
                          choice=choice, answer=both_answer, calls=calls)
    opened = prompt_text.rstrip().endswith(THINK_START)
    prefix = "" if opened else THINK_START + "\n"
    rules = prefixed_grammar(answer, "a.")
    rules["after_think"] = ir.seq(ir.rep(ir.byteset(b" \n"), 0, 4), ir.ref("a." + answer.start))
    region = Region(THINK_END.encode(), ir.Grammar(rules, "after_think"), b"")
    spec = TriggeredGrammar((region,), 1, 1, stop_after=True, prefix=prefix.encode())
    new_matcher = None
    if thinking_budget is not None:
        # (masks.capped loads numba: only a thinking budget needs it, and calls stays light)
        from structgen.masks.capped import CappedMatcher

        new_matcher = partial(CappedMatcher, marker=THINK_END, cap=thinking_budget,
                              count_after=None if opened else prefix)
    return OutputPlan(compile_triggered(spec), tool_list, fmt, True, THINK_START if opened else "",
                      template_tools, new_matcher, choice=choice, answer=both_answer, calls=calls)


class CallStream:
    """Incremental reading of one constrained output with tool calls, for streaming clients.

    :meth:`feed` takes the output's text as it is committed and returns events: ``("content",
    text)``, ``("call", index, id, name)`` once a call's name is complete, ``("arguments",
    index, text)`` as its arguments text grows. Joined, the content events equal the text
    :meth:`OutputPlan.split` gives for the whole output (stripped as it strips: leading and
    trailing whitespace and any text that may still turn out to start a marker are held back),
    and each call's argument events equal its arguments as the model wrote them (the
    ``arguments`` text of :meth:`ToolCall.openai` for a complete output). The format reads its
    own text (:meth:`~structgen.calls.formats.ToolFormat.read_calls`; the built-in formats:
    tagged, JSON calls, Hermes-or-JSON, Llama 3 JSON, Mistral): :meth:`for_plan` gives None
    for a format that does not (``streams`` false), and for reasoning, whose parts are only
    known once the output is complete."""

    def __init__(self, fmt: ToolFormat, *, calls_allowed: bool = True) -> None:
        self.fmt = fmt
        self.calls_allowed = calls_allowed  # False under tool_choice="none": all text
        self.text = ""
        self.content_sent = ""
        self.calls: list[tuple[str, int]] = []  # (id, arguments characters sent)

    @classmethod
    def for_plan(cls, plan: OutputPlan) -> CallStream | None:
        """A stream reader for outputs of ``plan``, or None where the output can only be read
        once complete (no tools, reasoning, a format other than the built-in ones)."""
        if plan.format is None or plan.reasoning or not plan.format.streams:
            return None
        return cls(plan.format, calls_allowed=plan.choice != "none")

    def read(self, text: str, *, final: bool) -> tuple[str, list[PartialCall]] | None:
        """(content known so far, calls so far) of ``text`` in this stream's format (``final``:
        the output is complete); None when the text leaves the shapes the grammar writes (the
        caller then waits for the complete output)."""
        if not self.calls_allowed:
            return text, []
        return self.fmt.read_calls(text, final)

    def feed(self, delta: str, *, final: bool = False) -> list[tuple[Any, ...]]:
        """Events for ``delta``, the text committed since the last call (``final``: the output
        is complete: nothing is held back any more)."""
        self.text += delta
        got = self.read(self.text, final=final)
        if got is None:
            return []
        content, calls = got
        content = content.strip()  # trailing whitespace waits: split() strips it at the end
        events: list[tuple[Any, ...]] = []
        if len(content) > len(self.content_sent) and content.startswith(self.content_sent):
            events.append(("content", content[len(self.content_sent):]))
            self.content_sent = content
        for k, call in enumerate(calls):
            if call.name is None:
                break
            if k == len(self.calls):
                cid = "call_" + uuid.uuid4().hex[:24]
                self.calls.append((cid, 0))
                events.append(("call", k, cid, call.name))
            cid, sent = self.calls[k]
            if len(call.args) > sent:
                events.append(("arguments", k, call.args[sent:]))
                self.calls[k] = (cid, len(call.args))
        return events


class OutputStream:
    """Incremental reading of one output of an :class:`OutputPlan` (tools and/or reasoning),
    for :func:`structgen.stream`.

    :meth:`feed` takes the output's text as it is committed and returns events:
    ``("reasoning", text)`` inside the thinking markers, ``("content", text)`` for the
    answer's free text, ``("call", index, id, name)`` and ``("arguments", index, text)`` as
    :class:`CallStream` gives them. Joined, the events of a complete output equal what
    :meth:`OutputPlan.split` gives: the reasoning and the content stripped as it strips them
    (whitespace that may still turn out to be trailing, and text that may still turn out to
    start a marker, are held back until it is known), each call's arguments as written. A
    format :class:`CallStream` cannot read as it grows gives its content and calls once the
    output is complete. With tools and a constraint, nothing of the answer is sent while the
    output could still be either the calls or the answer
    (:meth:`OutputPlan.answer_or_calls`)."""

    def __init__(self, plan: OutputPlan) -> None:
        self.plan = plan
        self.text = ""  # the output so far
        self.sent = {"reasoning": "", "content": ""}  # the text of each kind sent so far
        self.answer_fed = 0  # characters of the answer given to the call reader
        # the call reader; None with a format read only once the output is complete
        self.calls = None if plan.format is None else CallStream.for_plan(replace(plan, reasoning=False))
        self._whole_ids: list[str] = []
        # tools with a constraint: "calls" or "answer" once known (OutputPlan.answer_or_calls)
        self.mode: str | None = None

    def call_ids(self) -> list[str]:
        """The ids the ``("call", ...)`` events gave, in call order."""
        if self.calls is None:
            return list(self._whole_ids)
        return [cid for cid, _sent in self.calls.calls]

    def feed(self, delta: str, *, final: bool = False) -> list[tuple[Any, ...]]:
        """Events for ``delta``, the text committed since the last call (``final``: the output
        is complete, or ended: nothing is held back any more)."""
        self.text += delta
        events: list[tuple[Any, ...]] = []
        answer = self.text
        if self.plan.reasoning:
            body = self.plan.think_prefix + self.text
            start = body.find(THINK_START)
            if start < 0 and not final and THINK_START.startswith(body):
                return events  # the opening marker is still being written
            end = body.find(THINK_END)
            inside = body[start + len(THINK_START) if start >= 0 else 0: end if end >= 0 else len(body)]
            if end < 0 and not final:
                inside = inside[: len(inside) - held_marker_prefix(inside, THINK_END)]
            events += self._grow("reasoning", inside.strip())
            if end < 0:
                return events
            answer = body[end + len(THINK_END):].lstrip()
        if self.plan.format is None:
            return events + self._grow("content", answer)
        if self.mode is None:
            self.mode = self.plan.answer_or_calls(answer, final=final)
            if self.mode is None:
                return events  # could still be calls or the answer: held back until known
        if self.mode == "answer":  # the constraint's answer, exactly as written
            return events + self._grow("content", answer)
        if self.calls is None:
            if final:  # the validated calls of the whole output
                _r, text, calls, _e = self.plan.split(self.text)
                events += self._grow("content", text)
                for k, call in enumerate(calls):
                    self._whole_ids.append(call.id)
                    events += [("call", k, call.id, call.name),
                               ("arguments", k, call.arguments_json())]
            return events
        new, self.answer_fed = answer[self.answer_fed:], len(answer)
        return events + self.calls.feed(new, final=final)

    def _grow(self, kind: str, text: str) -> list[tuple[Any, ...]]:
        """The event extending what was sent of ``kind`` to ``text`` (none when it does not)."""
        sent = self.sent[kind]
        if len(text) <= len(sent) or not text.startswith(sent):
            return []
        self.sent[kind] = text
        return [(kind, text[len(sent):])]
