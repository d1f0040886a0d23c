"""Tool calling: tools as JSON Schemas, per-model-family call formats, their grammars and parsers.

A *tool* (:class:`Tool`) is a name, a description and a JSON Schema for its arguments. Tools
come as OpenAI function specs (``{"type": "function", "function": {"name", "description",
"parameters"}}`` or the inner dict), Pydantic model classes (the class name and schema) or
Python functions (the signature's annotations and defaults, the docstring's first paragraph
and its ``Args:`` lines): :func:`tool_from`.

A *format* (:class:`ToolFormat`) says how a model family writes calls. It builds the grammar of
an output for a ``tool_choice`` -- a :class:`~structgen.calls.triggered.TriggeredGrammar`
where calls are triggered regions in free text -- and parses an output back into text and
calls. The call envelope (``{"name": "...", "arguments": ...}``) is written with the spacing
the family's chat template shows; the name is one of the given tools' names and the
arguments are the canonical JSON of the chosen tool's schema (strict objects: only declared
keys), so every call the grammar admits validates.

Built in (:data:`TOOL_FORMATS`):

* ``"hermes"`` (strict Hermes tags): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call, free text around them (the region opens at ``<tool_call>``);
* ``"json"`` (``"json_calls"``): the whole reply is one call -- or, with parallel calls,
  several -- written as a bare JSON object ``{"name": ..., "arguments": {...}}`` or fenced as
  ````` ```json\\n...\\n``` `````, with JSON whitespace (at most
  :data:`JSON_CALL_MAX_WHITESPACE` bytes per run, so generation cannot run away on it) in the
  envelope and the arguments; or free text that does not start with ``{`` or ````` ```json `````
  (after optional whitespace). What Qwen2.5-Coder actually writes, although its template
  shows ``<tool_call>``;
* ``"hermes_json"`` (``"qwen"``, ``"qwen2.5"``, ``"qwen2.5-coder"``, ``"qwen3"``): the union
  of the two -- a reply that starts with ``{`` or ````` ```json ````` is JSON calls, any other
  reply is Hermes free text with ``<tool_call>`` blocks (whose free text then never starts
  with ``{`` or ````` ```json `````). The default for chat templates and tokenizers that show
  ``<tool_call>`` (the Qwen family and Hermes fine-tunes) and for models that show nothing:
  whichever way such a model writes its calls, they are in the language and are read back;
* ``"llama3"`` (Llama 3.1+ JSON tool calls): the whole reply is ``{"name": ...,
  "parameters": {...}}`` (calls joined by ``"; "``), or text that does not start with ``{``;
* ``"mistral"``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``.

Detection (:func:`detect_tool_format`, what :func:`structgen.generate`, :func:`structgen.stream`
and ``structgen serve`` use unless ``tool_format`` / ``--tool-format`` /
``generation.tool_format`` names one): the chat template's text first (``[TOOL_CALLS]``:
mistral; ``<tool_call>``: hermes_json; ``<|python_tag|>`` or a Llama 3 header with
``"parameters"``: llama3), then the tokenizer's added tokens (the same markers as tokens),
else hermes_json.

Add a format with :func:`register_tool_format` (a :class:`ToolFormat` subclass, or an
instance of :class:`TaggedFormat` for the common "marker + JSON + end marker" shape).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from structgen.calls.scan import (
    FENCE_CLOSE,
    FENCE_OPEN,
    JSON_WHITESPACE,
    PartialCall,
    read_json_calls,
    read_llama3,
    read_mistral,
    read_tagged,
    skip_whitespace,
)
from structgen.calls.triggered import Region, TriggeredGrammar, body_grammar, triggered_to_grammar
from structgen.config import JsonSchemaOptions
from structgen.errors import ConfigError, SchemaError
from structgen.frontends.json_schema.source import is_model_class, model_schema
from structgen.grammar import ir
from structgen.grammar.passes import prefixed_grammar
from structgen.json_types import JsonObject, JsonValue

__all__ = ["DEFAULT_TOOL_FORMAT", "JSON_CALL_MAX_WHITESPACE", "TOOL_CHOICES", "TOOL_FORMATS",
           "HermesJsonFormat", "JsonCallFormat", "ParsedCalls", "TaggedFormat", "Tool", "ToolFormat",
           "arguments_grammar", "detect_tool_format", "either_grammar", "format_for_template",
           "normalize_tools", "register_tool_format", "starts_json_call", "tool_choice_name", "tool_format",
           "tool_from"]

class Tokenizer(Protocol):
    """What format detection reads of a tokenizer (a Hugging Face one, or any other backend's:
    each attribute is looked up with a fallback)."""

    added_tokens_decoder: Mapping[int, object]

    def get_added_vocab(self) -> Mapping[str, int]:
        """The added (special) tokens' texts and ids."""
        ...


#: the ``tool_choice`` strings (a ``{"name": ...}`` dict names one tool)
TOOL_CHOICES = ("auto", "required", "none")


@dataclass(frozen=True)
class Tool:
    """One tool: ``name``, ``description`` and ``parameters`` (the JSON Schema of its
    arguments, an object schema). :meth:`openai` gives the OpenAI function spec."""

    name: str
    description: str
    parameters: Mapping[str, JsonValue]

    def openai(self) -> JsonObject:
        """The OpenAI-style spec ``{"type": "function", "function": {...}}`` (what chat
        templates take as ``tools=``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.parameters)}}


_PY_TYPES: dict[object, JsonObject] = {
    str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
    bool: {"type": "boolean"}, type(None): {"type": "null"}, dict: {"type": "object"},
    list: {"type": "array"},
}


def _annotation_schema(ann: object, where: str) -> JsonObject:
    if ann is inspect.Parameter.empty or ann is Any:
        return {}
    if ann in _PY_TYPES:
        return dict(_PY_TYPES[ann])
    if isinstance(ann, type) and is_model_class(ann):
        return model_schema(ann)
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, set, frozenset, Sequence):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {"type": "array", "prefixItems": [_annotation_schema(a, where) for a in args],
                    "minItems": len(args), "maxItems": len(args)}
        return {"type": "array", "items": _annotation_schema(args[0], where)} if args else {"type": "array"}
    if origin in (dict, Mapping):
        out: JsonObject = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = _annotation_schema(args[1], where)
        return out
    if origin is typing.Union or type(ann).__name__ == "UnionType":
        return {"anyOf": [_annotation_schema(a, where) for a in args]}
    raise ConfigError(f"tool parameter {where}: cannot describe the annotation {ann!r} as a JSON "
                      "Schema; give the tool as an OpenAI spec instead", key=where)


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description}) from a Google-style docstring."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    m = re.search(r"^(?:Args|Arguments|Parameters):\s*$(.*?)(?:^\S|\Z)", doc, re.M | re.S)
    if m:
        for line in m.group(1).splitlines():
            pm = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
            if pm:
                params[pm.group(1)] = pm.group(2).strip()
    return summary, params


def _function_tool(fn: Callable[..., object]) -> Tool:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError("a tool function needs a name", key="tools")
    summary, docs = _docstring_parts(inspect.getdoc(fn))
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable forward references: raw annotations
        hints = {}
    props: JsonObject = {}
    required: list[JsonValue] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = _annotation_schema(hints.get(p.name, p.annotation), f"{name}/{p.name}")
        if p.name in docs:
            schema["description"] = docs[p.name]
        props[p.name] = schema
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    params: JsonObject = {"type": "object", "properties": props, "required": required,
                          "additionalProperties": False}
    return Tool(name, summary, params)


def tool_from(spec: object) -> Tool:
    """A :class:`Tool` from an OpenAI function spec (with or without the ``{"type":
    "function", "function": ...}`` wrapper), a Pydantic model class, a Python function or a
    :class:`Tool`. Raises :class:`~structgen.errors.ConfigError` (key ``tools``) otherwise."""
    if isinstance(spec, Tool):
        return spec
    if isinstance(spec, Mapping):
        fn = spec.get("function", spec) if spec.get("type", "function") == "function" else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ConfigError("a tool spec needs a function name: {\"type\": \"function\", \"function\": "
                              "{\"name\": ..., \"parameters\": {...}}}", key="tools")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, Mapping):
            raise ConfigError(f"tool {fn['name']!r}: parameters must be a JSON Schema object",
                              key=f"tools/{fn['name']}/parameters")
        return Tool(fn["name"], str(fn.get("description") or ""), dict(params))
    if isinstance(spec, type) and is_model_class(spec):
        summary, _ = _docstring_parts(spec.__doc__)
        schema = dict(model_schema(spec))
        schema.pop("title", None)
        return Tool(spec.__name__, summary, schema)
    if callable(spec):
        return _function_tool(spec)
    raise ConfigError(f"a tool must be an OpenAI function spec, a Pydantic model class or a function, "
                      f"not {type(spec).__name__}", key="tools")


def normalize_tools(tools: object) -> list[Tool]:
    """The tools of ``tools`` (a list of anything :func:`tool_from` takes), names unique."""
    if tools is None:
        return []
    if isinstance(tools, (Mapping, Tool)) or callable(tools):
        tools = [tools]
    out = [tool_from(t) for t in cast("Iterable[object]", tools)]  # (else: Python's TypeError)
    seen: set[str] = set()
    for t in out:
        if t.name in seen:
            raise ConfigError(f"two tools are named {t.name!r}", key="tools")
        seen.add(t.name)
    return out


def tool_choice_name(choice: object, tools: Sequence[Tool]) -> str | None:
    """The tool a ``tool_choice`` names (``{"name": ...}`` or ``{"type": "function",
    "function": {"name": ...}}``), or None for ``"auto"``/``"required"``/``"none"``.
    Raises :class:`~structgen.errors.ConfigError` (key ``tool_choice``) for anything else."""
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise ConfigError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or "
                              f"{{\"name\": ...}}, not {choice!r}", key="tool_choice")
        return None
    if isinstance(choice, Mapping):
        name = choice.get("name", (choice.get("function") or {}).get("name"))
        if isinstance(name, str) and any(t.name == name for t in tools):
            return name
        raise ConfigError(f"tool_choice names {name!r}, which is not one of the tools", key="tool_choice")
    raise ConfigError(f"tool_choice must be a string or a dict, not {type(choice).__name__}",
                      key="tool_choice")


@dataclass
class ParsedCalls:
    """What a format's parser found in an output: the free ``text`` (calls removed), the
    ``calls`` as ``(name, arguments)`` pairs, and ``errors`` for call blocks that did not
    parse (unconstrained output may have them; constrained output never does)."""

    text: str
    calls: list[tuple[str, JsonValue]]
    errors: list[str]


def arguments_grammar(tool: Tool, json_options: JsonSchemaOptions | None = None) -> ir.Grammar:
    """The grammar of ``tool``'s arguments (its ``parameters`` schema); a
    :class:`~structgen.errors.SchemaError` names the tool (``SchemaError.tool``)."""
    try:
        return body_grammar("json", dict(tool.parameters), json_options=json_options)
    except SchemaError as e:
        e.tool = tool.name
        raise


class ToolFormat:
    """How one model family writes tool calls. Subclasses set :attr:`name` and implement
    :meth:`grammar` and :meth:`parse`; :meth:`call_body` builds the envelope of one call."""

    #: the registry key
    name: str = ""
    #: the envelope's key for the arguments
    arguments_key: str = "arguments"
    #: the marker texts the format writes (a special token whose text is inside one of them is
    #: given that text, so the model's own control token can open a call)
    markers: tuple[str, ...] = ()

    def call_body(self, tools: Sequence[Tool], json_options: JsonSchemaOptions | None = None) -> ir.Grammar:
        """The grammar of one call: ``{"name": "<tool>", "<arguments_key>": <arguments>}``
        with the arguments of that tool (one alternative per tool)."""
        # the arguments spelled as the call around them, and as chat templates show past calls
        options = json_options or JsonSchemaOptions()
        if options.whitespace == "compact":
            options = dataclasses.replace(options, whitespace="spaced")
        rules: dict[str, ir.Expr] = {}
        alts = []
        for i, t in enumerate(tools):
            args = arguments_grammar(t, options)
            rules.update(prefixed_grammar(args, f"t{i}."))
            head = json.dumps({"name": t.name}, ensure_ascii=False)[:-1] + f', "{self.arguments_key}": '
            alts.append(ir.seq(ir.lit(head), ir.ref(f"t{i}.{args.start}"), ir.lit("}")))
        rules["call"] = ir.alt(*alts)
        return ir.Grammar(rules, "call")

    def grammar(self, tools: Sequence[Tool], choice: str, parallel: bool,
                json_options: JsonSchemaOptions | None = None) -> ir.Grammar:  # pragma: no cover
        """The grammar of a whole output for ``choice`` ("auto", "required" or "none"; a named
        tool arrives as "required" with only that tool)."""
        raise NotImplementedError

    def parse(self, text: str) -> ParsedCalls:  # pragma: no cover
        """Split an output into free text and calls (tolerant: unconstrained output too)."""
        raise NotImplementedError

    #: whether :meth:`read_calls` reads this format's outputs as they grow (the built-in
    #: formats); a format without it has its calls read once the output is complete
    streams: bool = False

    def read_calls(self, text: str, final: bool) -> tuple[str, list[PartialCall]] | None:
        """(content so far, calls so far) of ``text``, an output of this format's grammar as far
        as it is written (``final``: complete); None when the text leaves the shapes the grammar
        writes. Only where :attr:`streams` (:mod:`structgen.calls.scan`)."""
        raise NotImplementedError


_DECODER = json.JSONDecoder()


def _decode_call(raw: str, arguments_key: str) -> tuple[str, JsonValue]:
    value = json.loads(raw)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError("a call must be an object with a string \"name\"")
    args = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    if isinstance(args, str):  # some templates put the arguments as JSON text
        args = json.loads(args)
    return value["name"], args


class TaggedFormat(ToolFormat):
    """Calls in blocks ``begin`` + ``padding`` + call JSON + ``padding`` + ``end`` amid free
    text (Hermes/Qwen shape): each block is a triggered region opened by ``begin`` itself (so
    ``"none"`` bans the tag whatever follows it); parallel calls are consecutive blocks
    (``separator`` between them when the output holds only calls)."""

    def __init__(self, name: str, begin: str, end: str, *, padding: str = "", separator: str = "\n",
                 arguments_key: str = "arguments") -> None:
        self.name = name
        self.begin = begin
        self.end = end
        self.padding = padding
        self.separator = separator
        self.arguments_key = arguments_key
        self.markers = (begin, end)

    def grammar(self, tools: Sequence[Tool], choice: str, parallel: bool,
                json_options: JsonSchemaOptions | None = None) -> ir.Grammar:
        """See :meth:`ToolFormat.grammar`: "auto" free text with calls, "required" calls only,
        "none" free text in which the begin marker never occurs."""
        return triggered_to_grammar(self.triggered(tools, choice, parallel, json_options))

    def triggered(self, tools: Sequence[Tool], choice: str, parallel: bool,
                  json_options: JsonSchemaOptions | None = None, *,
                  free_text: ir.Expr | None = None) -> TriggeredGrammar:
        """The :class:`~structgen.calls.triggered.TriggeredGrammar` :meth:`grammar` lowers;
        ``free_text``: a regular expression every stretch of free text must also match (the
        union format uses it to keep free text from starting like a JSON call)."""
        body = self.call_body(tools, json_options)
        if self.padding:
            rules = dict(body.rules)
            rules["padded"] = ir.seq(ir.lit(self.padding), ir.ref(body.start), ir.lit(self.padding))
            body = ir.Grammar(rules, "padded")
        region = Region(self.begin.encode(), body, self.end.encode())
        at_most = None if parallel else 1
        if choice == "required":
            return TriggeredGrammar((region,), 1, at_most, regions_only=True,
                                   separator=self.separator.encode())
        if choice == "none":
            return TriggeredGrammar((region,), 0, 0, free_text=free_text)
        return TriggeredGrammar((region,), 0, at_most, free_text=free_text)

    streams = True

    def read_calls(self, text: str, final: bool) -> tuple[str, list[PartialCall]] | None:
        """See :meth:`ToolFormat.read_calls`: tagged blocks amid free text."""
        return read_tagged(text, final, self.begin, self.end, self.arguments_key)

    def parse(self, text: str) -> ParsedCalls:
        """Each block: ``begin``, the call's JSON value read as JSON (so an argument string may
        hold the end marker), then ``end`` after optional whitespace; a block whose JSON does
        not parse (unconstrained output) is an error and ends at the next ``end``. The rest
        is text."""
        calls: list[tuple[str, JsonValue]] = []
        errors: list[str] = []
        parts: list[str] = []
        pos = 0
        while True:
            i = text.find(self.begin, pos)
            if i < 0:
                parts.append(text[pos:])
                break
            parts.append(text[pos:i])
            start = i + len(self.begin)
            while start < len(text) and text[start].isspace():
                start += 1
            try:
                value, j = _DECODER.raw_decode(text, start)
                while j < len(text) and text[j].isspace():
                    j += 1
                if self.end and not text.startswith(self.end, j):
                    raise ValueError(f"the call is not followed by {self.end!r}")
                calls.append(_decode_call(json.dumps(value), self.arguments_key))
                pos = j + len(self.end)
                continue
            except (ValueError, TypeError) as e:
                errors.append(f"{type(e).__name__}: {e}")
            j = text.find(self.end, start) if self.end else -1
            if j < 0:
                break
            pos = j + len(self.end)
        return ParsedCalls("".join(parts).strip(), calls, errors)


class Llama3JsonFormat(ToolFormat):
    """Llama 3.1+ JSON tool calls: the whole reply is ``{"name": ..., "parameters": {...}}``
    (parallel calls joined by ``"; "``), or text that does not start with ``{``."""

    name = "llama3"
    arguments_key = "parameters"

    def grammar(self, tools: Sequence[Tool], choice: str, parallel: bool,
                json_options: JsonSchemaOptions | None = None) -> ir.Grammar:
        """See :meth:`ToolFormat.grammar`."""
        body = self.call_body(tools, json_options)
        rules = prefixed_grammar(body, "c.")
        one = ir.ref("c." + body.start)
        calls = ir.seq(one, ir.rep(ir.seq(ir.lit("; "), one), 0, None if parallel else 0))
        text = ir.alt(ir.EMPTY, ir.seq(ir.diff(ir.ANY_BYTE, ir.lit("{")), ir.star(ir.ANY_BYTE)))
        rules["reply"] = {"required": calls, "none": text}.get(choice, ir.alt(calls, text))
        return ir.Grammar(rules, "reply")

    streams = True

    def read_calls(self, text: str, final: bool) -> tuple[str, list[PartialCall]] | None:
        """See :meth:`ToolFormat.read_calls`: the whole reply, calls joined by ``"; "``."""
        return read_llama3(text, final, self.arguments_key)

    def parse(self, text: str) -> ParsedCalls:
        """Calls when the reply starts with ``{`` (after an optional ``<|python_tag|>``), as
        the grammar has it: a reply starting with anything else (a space included) is text."""
        body = text.rstrip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>"):].lstrip()
        if not body.startswith("{"):
            return ParsedCalls(text.strip(), [], [])
        calls: list[tuple[str, JsonValue]] = []
        errors: list[str] = []
        pos = 0
        while pos < len(body):
            try:
                value, end = _DECODER.raw_decode(body, pos)
                calls.append(_decode_call(json.dumps(value), self.arguments_key))
            except (ValueError, TypeError) as e:
                errors.append(f"{type(e).__name__}: {e}")
                break
            pos = end
            rest = body[pos:].lstrip()
            if not rest.startswith(";"):
                break
            pos = len(body) - len(rest) + 1
            while pos < len(body) and body[pos].isspace():
                pos += 1
        return ParsedCalls("", calls, errors)


class MistralFormat(ToolFormat):
    """Mistral: ``[TOOL_CALLS]`` then a JSON array of calls, after optional free text."""

    name = "mistral"
    marker = "[TOOL_CALLS]"
    markers = (marker,)

    def grammar(self, tools: Sequence[Tool], choice: str, parallel: bool,
                json_options: JsonSchemaOptions | None = None) -> ir.Grammar:
        """See :meth:`ToolFormat.grammar`: one triggered region holding the array."""
        body = self.call_body(tools, json_options)
        rules = prefixed_grammar(body, "c.")
        one = ir.ref("c." + body.start)
        more = ir.rep(ir.seq(ir.lit(", "), one), 0, None if parallel else 0)
        rules["array"] = ir.seq(ir.lit("["), one, more, ir.lit("]"))
        region = Region(self.marker.encode(), ir.Grammar(rules, "array"), b"")
        if choice == "required":
            spec = TriggeredGrammar((region,), 1, 1, regions_only=True)
        else:
            spec = TriggeredGrammar((region,), 0, 0 if choice == "none" else 1, stop_after=choice != "none")
        return triggered_to_grammar(spec)

    streams = True

    def read_calls(self, text: str, final: bool) -> tuple[str, list[PartialCall]] | None:
        """See :meth:`ToolFormat.read_calls`: free text, the marker, a JSON array of calls."""
        return read_mistral(text, final, self.marker, self.arguments_key)

    def parse(self, text: str) -> ParsedCalls:
        """The array after the first marker; the text before it."""
        i = text.find(self.marker)
        if i < 0:
            return ParsedCalls(text.strip(), [], [])
        calls: list[tuple[str, JsonValue]] = []
        errors: list[str] = []
        try:
            value, _ = _DECODER.raw_decode(text[i + len(self.marker):].lstrip())
            for v in value if isinstance(value, list) else [value]:
                calls.append(_decode_call(json.dumps(v), self.arguments_key))
        except (ValueError, TypeError) as e:
            errors.append(f"{type(e).__name__}: {e}")
        return ParsedCalls(text[:i].strip(), calls, errors)


#: the most whitespace bytes one run of whitespace may hold in the JSON call format (between
#: two JSON tokens of a call, around a fence, between calls): room for calls pretty-printed a
#: few levels deep, bounded so that a model cannot run away writing whitespace
JSON_CALL_MAX_WHITESPACE = 16



def _whitespace(limit: int = JSON_CALL_MAX_WHITESPACE) -> ir.Expr:
    return ir.rep(ir.byteset(JSON_WHITESPACE.encode()), 0, limit)


def starts_json_call(text: str) -> bool:
    """Does ``text``, after JSON whitespace, start the way a JSON-format call does (``{`` or
    ````` ```json `````)? Such a reply is calls in the ``json`` and ``hermes_json`` formats."""
    body = text.lstrip(JSON_WHITESPACE)
    return body.startswith("{") or body.startswith(FENCE_OPEN)


def _not_call_start(*, any_fence: bool = False) -> ir.Expr:
    """Free text that does not start (after whitespace) with ``{`` or ````` ```json `````;
    with ``any_fence``: with ``{`` or a fence of any language whose content starts with ``{``
    (``tool_choice="none"``: a call fenced as ````` ```xml ````` is still a call, a JSON array
    in a fence is not)."""
    any_text = ir.star(ir.ANY_BYTE)
    ws = ir.star(ir.byteset(JSON_WHITESPACE.encode()))
    starts = [ir.lit("{"), ir.lit(FENCE_OPEN)]
    if any_fence:
        lang = ir.star(ir.byteset([(ord("a"), ord("z")), (ord("A"), ord("Z")), (ord("0"), ord("9")),
                                   (ord("_"), ord("_")), (ord("-"), ord("-")), (ord("+"), ord("+"))]))
        starts[1] = ir.seq(ir.lit("```"), lang, ws, ir.lit("{"))
    return ir.diff(any_text, ir.seq(ws, ir.alt(*starts), any_text))


def either_grammar(*grammars: ir.Grammar) -> ir.Grammar:
    """One IR grammar whose language is the union of ``grammars``' (their rules renamed
    apart)."""
    rules: dict[str, ir.Expr] = {}
    starts = []
    for i, g in enumerate(grammars):
        rules.update(prefixed_grammar(g, f"u{i}."))
        starts.append(ir.ref(f"u{i}.{g.start}"))
    rules["either"] = ir.alt(*starts)
    return ir.Grammar(rules, "either")


class JsonCallFormat(ToolFormat):
    """Calls as the whole reply in JSON: each call a bare ``{"name": ..., "arguments": {...}}``
    object or one fenced as ````` ```json ... ``` `````, calls separated by whitespace, JSON
    whitespace (bounded: ``max_whitespace`` bytes per run) between the tokens of a call; or,
    under ``"auto"``, free text that does not start (after whitespace) with ``{`` or
    ````` ```json `````. Under ``"none"`` only such free text."""

    name = "json"

    def __init__(self, max_whitespace: int = JSON_CALL_MAX_WHITESPACE) -> None:
        self.max_whitespace = max_whitespace

    def call_body(self, tools: Sequence[Tool], json_options: JsonSchemaOptions | None = None) -> ir.Grammar:
        """One call, ``{"name": "<tool>", "arguments": <arguments>}`` with JSON whitespace
        between its tokens (the arguments' schema compiled with flexible whitespace)."""
        options = dataclasses.replace(json_options or JsonSchemaOptions(), whitespace="flexible",
                                      max_whitespace=self.max_whitespace)
        ws = _whitespace(self.max_whitespace)
        rules: dict[str, ir.Expr] = {}
        alts = []
        for i, t in enumerate(tools):
            args = arguments_grammar(t, options)
            rules.update(prefixed_grammar(args, f"t{i}."))
            # the arguments' own root allows whitespace around the value
            alts.append(ir.seq(ir.lit("{"), ws, ir.lit('"name"'), ws, ir.lit(":"), ws,
                               ir.lit(json.dumps(t.name, ensure_ascii=False)), ws, ir.lit(","), ws,
                               ir.lit(f'"{self.arguments_key}"'), ws, ir.lit(":"),
                               ir.ref(f"t{i}.{args.start}"), ir.lit("}")))
        rules["call"] = ir.alt(*alts)
        return ir.Grammar(rules, "call")

    def grammar(self, tools: Sequence[Tool], choice: str, parallel: bool,
                json_options: JsonSchemaOptions | None = None) -> ir.Grammar:
        """See :meth:`ToolFormat.grammar`. ``"none"`` bans the call syntax as the tagged
        formats ban their tag: free text that does not start like a call (a model told not to
        call that writes ``{"name": ...`` anyway would be calling in all but name)."""
        if choice == "none":
            return ir.Grammar({"text": _not_call_start(any_fence=True)}, "text")
        body = self.call_body(tools, json_options)
        rules = prefixed_grammar(body, "c.")
        one = ir.ref("c." + body.start)
        ws = _whitespace(self.max_whitespace)
        item = ir.alt(one, ir.seq(ir.lit(FENCE_OPEN), ws, one, ws, ir.lit(FENCE_CLOSE)))
        calls = ir.seq(item, ir.rep(ir.seq(ws, item), 0, None if parallel else 0), ws)
        rules["reply"] = calls if choice == "required" else ir.alt(calls, _not_call_start())
        return ir.Grammar(rules, "reply")

    streams = True

    def read_calls(self, text: str, final: bool) -> tuple[str, list[PartialCall]] | None:
        """See :meth:`ToolFormat.read_calls`: calls when the reply starts with ``{`` or a
        fence, else text."""
        return read_json_calls(text, final, self.arguments_key)

    def parse(self, text: str) -> ParsedCalls:
        """Calls when the reply starts (after whitespace) with ``{`` or ````` ```json `````, as
        the grammar has it; each call read as JSON (any spacing), the fence closed after
        optional whitespace. Unconstrained output may go on with text after its calls: that
        is the text; a call that does not parse is an error and the rest is text."""
        if not starts_json_call(text):
            return ParsedCalls(text.strip(), [], [])
        calls: list[tuple[str, JsonValue]] = []
        errors: list[str] = []
        pos = skip_whitespace(text, 0)
        while pos < len(text) and (text.startswith("{", pos) or text.startswith(FENCE_OPEN, pos)):
            fenced = text.startswith(FENCE_OPEN, pos)
            start = skip_whitespace(text, pos + len(FENCE_OPEN)) if fenced else pos
            try:
                value, end = _DECODER.raw_decode(text, start)
                call = _decode_call(json.dumps(value), self.arguments_key)
            except (ValueError, TypeError) as e:
                errors.append(f"{type(e).__name__}: {e}")
                break
            end = skip_whitespace(text, end)
            if fenced:
                if text.startswith(FENCE_CLOSE, end):
                    end += len(FENCE_CLOSE)
                elif end < len(text):
                    errors.append(f"the fenced call is not closed by {FENCE_CLOSE!r}")
                    break
            calls.append(call)
            pos = skip_whitespace(text, end)
        return ParsedCalls(text[pos:].strip(), calls, errors)


class HermesJsonFormat(ToolFormat):
    """The union of a :class:`TaggedFormat` (``tagged``) and a :class:`JsonCallFormat`
    (``json_format``): a reply that starts (after whitespace) with ``{`` or ````` ```json `````
    is JSON calls, any other reply is the tagged format's free text and blocks (its free text
    kept from starting like a JSON call under ``"auto"``). For model families whose template
    shows Hermes tags but whose models may write bare or fenced JSON calls (Qwen2.5-Coder)."""

    def __init__(self, name: str, tagged: TaggedFormat, json_format: JsonCallFormat) -> None:
        self.name = name
        self.tagged = tagged
        self.json_format = json_format
        self.arguments_key = tagged.arguments_key
        self.markers = tagged.markers

    def grammar(self, tools: Sequence[Tool], choice: str, parallel: bool,
                json_options: JsonSchemaOptions | None = None) -> ir.Grammar:
        """See :meth:`ToolFormat.grammar`: the tagged format's grammar or the JSON calls."""
        if choice == "none":  # neither call syntax: no tag, no reply that starts like a JSON call
            return triggered_to_grammar(self.tagged.triggered(tools, choice, parallel, json_options,
                                                              free_text=_not_call_start(any_fence=True)))
        json_calls = self.json_format.grammar(tools, "required", parallel, json_options)
        free_text = _not_call_start() if choice != "required" else None
        tagged = triggered_to_grammar(self.tagged.triggered(tools, choice, parallel, json_options,
                                                            free_text=free_text))
        return either_grammar(tagged, json_calls)

    streams = True

    def read_calls(self, text: str, final: bool) -> tuple[str, list[PartialCall]] | None:
        """See :meth:`ToolFormat.read_calls`: the JSON format's reading where the reply starts
        like a JSON call, else the tagged format's (nothing while it may still become a fence)."""
        body = text.lstrip(JSON_WHITESPACE)
        if not body or (not final and FENCE_OPEN.startswith(body)):
            return "", []  # whitespace, or what may still become a fence: not known yet
        inner = self.json_format if starts_json_call(body) else self.tagged
        return inner.read_calls(text, final)

    def parse(self, text: str) -> ParsedCalls:
        """The JSON format's parse for a reply that starts like a JSON call, else the tagged
        format's."""
        return (self.json_format if starts_json_call(text) else self.tagged).parse(text)


#: the registered formats by name (:func:`register_tool_format` adds one)
TOOL_FORMATS: dict[str, ToolFormat] = {}


def register_tool_format(fmt: ToolFormat, *, aliases: Sequence[str] = ()) -> ToolFormat:
    """Register ``fmt`` under its :attr:`~ToolFormat.name` (and ``aliases``); returns it.
    A later registration under the same name replaces the earlier one."""
    if not isinstance(fmt, ToolFormat) or not fmt.name:
        raise ConfigError("register_tool_format takes a named ToolFormat instance", key="tool_format")
    for key in (fmt.name, *aliases):
        TOOL_FORMATS[key] = fmt
    return fmt


_HERMES = TaggedFormat("hermes", "<tool_call>", "</tool_call>", padding="\n")
_JSON = JsonCallFormat()
register_tool_format(_HERMES)
register_tool_format(_JSON, aliases=("json_calls",))
register_tool_format(HermesJsonFormat("hermes_json", _HERMES, _JSON),
                     aliases=("qwen", "qwen2.5", "qwen2.5-coder", "qwen3"))
register_tool_format(Llama3JsonFormat(), aliases=("llama3.1", "llama3_json"))
register_tool_format(MistralFormat())

#: the format of models that show no format of their own (see :func:`detect_tool_format`)
DEFAULT_TOOL_FORMAT = "hermes_json"


def tool_format(name: str | ToolFormat) -> ToolFormat:
    """The registered format ``name`` (a :class:`ToolFormat` is returned as is). Raises
    :class:`~structgen.errors.ConfigError` (key ``tool_format``) for an unknown name."""
    if isinstance(name, ToolFormat):
        return name
    fmt = TOOL_FORMATS.get(str(name).lower())
    if fmt is None:
        raise ConfigError(f"unknown tool format {name!r}; known: {', '.join(sorted(TOOL_FORMATS))}",
                          key="tool_format")
    return fmt


def _template_format(template: object) -> str | None:
    """The format a chat template's text shows, or None when it shows none."""
    if isinstance(template, Mapping):  # several named templates: any of them
        template = "\n".join(str(t) for t in template.values())
    t = template if isinstance(template, str) else ""
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<tool_call>" in t:
        return "hermes_json"
    if "<|python_tag|>" in t or ("<|start_header_id|>" in t and "parameters" in t):
        return "llama3"
    return None


def format_for_template(template: str | None) -> str:
    """The format a chat template's text implies: ``"mistral"`` when it writes
    ``[TOOL_CALLS]``, ``"hermes_json"`` for ``<tool_call>``, ``"llama3"`` for Llama 3's
    ``<|python_tag|>``/``"parameters"`` style; :data:`DEFAULT_TOOL_FORMAT` when it says
    nothing."""
    return _template_format(template) or DEFAULT_TOOL_FORMAT


def _added_token_texts(tokenizer: Tokenizer) -> set[str]:
    """The texts of a tokenizer's added (special) tokens; empty when it cannot say."""
    texts: set[str] = set()
    try:
        texts.update(str(t) for t in (tokenizer.get_added_vocab() or {}))
    except Exception:  # noqa: BLE001 - a tokenizer without added tokens, or another backend's
        pass
    try:
        texts.update(str(getattr(t, "content", t)) for t in (tokenizer.added_tokens_decoder or {}).values())
    except Exception:  # noqa: BLE001 - as above
        pass
    return texts


def detect_tool_format(tokenizer: Tokenizer | None = None, chat_template: object = None) -> str:
    """The name of the call format a model writes, from its chat template (``chat_template``,
    else the tokenizer's) and then its tokenizer's added tokens: ``[TOOL_CALLS]`` ->
    ``"mistral"``, ``<|python_tag|>`` -> ``"llama3"``, ``<tool_call>`` -> ``"hermes_json"``
    (Hermes tags or bare/fenced JSON calls); :data:`DEFAULT_TOOL_FORMAT` when neither shows
    one. :func:`structgen.generate`, :func:`structgen.stream` and ``structgen serve`` use it
    when no ``tool_format`` is given."""
    if chat_template is None:
        chat_template = getattr(tokenizer, "chat_template", None)
    found = _template_format(chat_template)
    if found is not None:
        return found
    tokens = _added_token_texts(tokenizer) if tokenizer is not None else set()
    for marker, name in (("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3"),
                         ("<tool_call>", "hermes_json")):
        if marker in tokens:
            return name
    return DEFAULT_TOOL_FORMAT
