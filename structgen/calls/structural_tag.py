"""Structural tags: the JSON format vLLM's tool parsers describe tool-call output in.

A structural tag (``{"type": "structural_tag", "format": FORMAT}``, the format XGrammar
defined and vLLM sends as ``structured_outputs.structural_tag``) nests these formats:

* ``const_string`` (``value``): exactly that text;
* ``json_schema`` (``json_schema``: a schema, ``true`` for any JSON value; ``style`` ``"json"``):
  a JSON value of the schema, in structgen's canonical spelling (strict objects);
* ``regex`` (``pattern``): a string the pattern matches in full;
* ``any_text``: any text; inside a ``tag``, any text not containing the tag's end (the text
  stops at the first end marker), and never containing a string of ``excludes``;
* ``sequence`` / ``or`` (``elements``): all in order / one of them;
* ``optional`` / ``star`` / ``plus`` (``content``): at most once / any number / at least once;
* ``tag`` (``begin``, ``content``, ``end``: a string or a list of alternatives): begin, content, end;
* ``tags_with_separator`` (``tags``, ``separator``, ``at_least_one``, ``stop_after_first``): tags
  joined by the separator (none, or at least one; only one with ``stop_after_first``), and
  nothing else;
* ``triggered_tags`` (``triggers``, ``tags``, ``at_least_one``, ``stop_after_first``,
  ``excludes``): free text in which a tag opens where one of its triggers (a prefix of the tag's
  begin) first occurs (:mod:`structgen.calls.triggered`).

Anything else (``grammar`` in EBNF, ``token_triggered_tags``, a ``style`` other than ``json``,
``any_order``) is refused with :class:`~structgen.errors.UnsupportedFeatureError` naming the
JSON pointer of the format, never widened.
"""

from __future__ import annotations

import json
from typing import Any

from structgen.calls.triggered import Region, TriggeredGrammar, body_grammar, triggered_to_grammar
from structgen.config import CompileOptions, JsonSchemaOptions
from structgen.errors import ConfigError, UnsupportedFeatureError
from structgen.grammar import ir
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.compiler import compile_grammar
from structgen.grammar.passes import prefixed_grammar

__all__ = ["structural_tag_to_grammar", "compile_structural_tag"]

_ANY = ir.star(ir.ANY_BYTE)


def _text(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, not {type(value).__name__}", key=where)
    return value.encode("utf-8")


def _containing(texts: list[bytes]) -> ir.Expr:
    return ir.seq(_ANY, ir.alt(*(ir.lit(t) for t in texts)), _ANY)


class _Lowering:
    """One structural tag lowered to IR rules; each embedded grammar gets its own prefix."""

    def __init__(self, json_options: JsonSchemaOptions | None) -> None:
        self.json_options = json_options
        self.rules: dict[str, ir.Expr] = {}
        self._count = 0

    def embed(self, grammar: ir.Grammar) -> ir.Expr:
        prefix = f"st{self._count}."
        self._count += 1
        self.rules.update(prefixed_grammar(grammar, prefix))
        return ir.ref(prefix + grammar.start)

    def ends(self, value: Any, where: str) -> list[bytes]:
        if isinstance(value, list):
            if not value:
                raise ConfigError(f"{where}: an empty list of end markers", key=where)
            return [_text(v, f"{where}/{i}") for i, v in enumerate(value)]
        return [_text(value, where)]

    def lower(self, fmt: Any, where: str, stop: list[bytes] | None = None) -> ir.Expr:
        """The IR of format ``fmt`` at JSON pointer ``where``; ``stop``: the end markers of the
        enclosing tag (where free text must stop)."""
        if not isinstance(fmt, dict):
            raise ConfigError(f"{where}: a format must be an object", key=where)
        kind = fmt.get("type")
        if kind == "const_string":
            return ir.lit(_text(fmt.get("value"), f"{where}/value"))
        if kind == "json_schema":
            style = fmt.get("style", "json")
            if style not in (None, "json"):
                raise UnsupportedFeatureError(f"{where}: json_schema style {style!r} (only 'json')",
                                              keyword="style", pointer=where)
            if fmt.get("any_order"):
                raise UnsupportedFeatureError(f"{where}: json_schema any_order", keyword="any_order",
                                              pointer=where)
            schema = fmt.get("json_schema", True)
            if isinstance(schema, str):
                schema = json.loads(schema)
            return self.embed(body_grammar("json", schema, json_options=self.json_options))
        if kind == "regex":
            pattern = fmt.get("pattern")
            if not isinstance(pattern, str):
                raise ConfigError(f"{where}/pattern: expected a string", key=f"{where}/pattern")
            return self.embed(body_grammar("regex", pattern))
        if kind == "any_text":
            text = _ANY
            excludes = [_text(e, f"{where}/excludes/{i}") for i, e in enumerate(fmt.get("excludes") or [])]
            banned = excludes + (stop or [])
            if banned:
                text = ir.diff(_ANY, _containing(banned))
            return text
        if kind in ("sequence", "or"):
            elements = fmt.get("elements")
            if not isinstance(elements, list) or not elements:
                raise ConfigError(f"{where}/elements: a non-empty list", key=f"{where}/elements")
            last = len(elements) - 1
            parts = [self.lower(e, f"{where}/elements/{i}", stop if (kind == "or" or i == last) else None)
                     for i, e in enumerate(elements)]
            return ir.seq(*parts) if kind == "sequence" else ir.alt(*parts)
        if kind in ("optional", "star", "plus"):
            inner = self.lower(fmt.get("content"), f"{where}/content", stop)
            return {"optional": ir.opt, "star": ir.star, "plus": ir.plus}[kind](inner)
        if kind == "tag":
            return self.tag(fmt, where)
        if kind == "tags_with_separator":
            tags = self.tag_list(fmt, where)
            one = ir.alt(*(self.tag(t, f"{where}/tags/{i}") for i, t in enumerate(tags)))
            sep = ir.lit(_text(fmt.get("separator", ""), f"{where}/separator"))
            some = one if fmt.get("stop_after_first") else ir.seq(one, ir.star(ir.seq(sep, one)))
            return some if fmt.get("at_least_one") else ir.opt(some)
        if kind == "triggered_tags":
            return self.triggered(fmt, where)
        raise UnsupportedFeatureError(f"{where}: structural tag format {kind!r} is not supported",
                                      keyword=str(kind), pointer=where)

    def tag_list(self, fmt: dict[str, Any], where: str) -> list[Any]:
        tags = fmt.get("tags")
        if not isinstance(tags, list) or not tags:
            raise ConfigError(f"{where}/tags: a non-empty list of tags", key=f"{where}/tags")
        return tags

    def tag(self, fmt: Any, where: str) -> ir.Expr:
        if not isinstance(fmt, dict) or fmt.get("type", "tag") != "tag":
            raise ConfigError(f"{where}: expected a tag", key=where)
        ends = self.ends(fmt.get("end", ""), f"{where}/end")
        content = self.lower(fmt.get("content"), f"{where}/content", [e for e in ends if e])
        return ir.seq(ir.lit(_text(fmt.get("begin"), f"{where}/begin")), content,
                      ir.alt(*(ir.lit(e) for e in ends)))

    def triggered(self, fmt: dict[str, Any], where: str) -> ir.Expr:
        triggers = [_text(t, f"{where}/triggers/{i}") for i, t in enumerate(fmt.get("triggers") or [])]
        if not triggers or any(not t for t in triggers):
            raise ConfigError(f"{where}/triggers: a non-empty list of non-empty strings",
                              key=f"{where}/triggers")
        regions = []
        for i, t in enumerate(self.tag_list(fmt, where)):
            at = f"{where}/tags/{i}"
            begin = _text(t.get("begin") if isinstance(t, dict) else None, f"{at}/begin")
            trigger = next((tr for tr in triggers if begin.startswith(tr)), None)
            if trigger is None:
                raise ConfigError(f"{at}/begin: the tag's begin starts with none of the triggers",
                                  key=f"{at}/begin")
            rest = dict(t, begin=begin[len(trigger):].decode("utf-8", "surrogateescape"))
            inner = _Lowering(self.json_options)
            expr = inner.tag(rest, at)
            body = ir.Grammar({**inner.rules, "tag": expr}, "tag")
            regions.append(Region(trigger, body))
        excludes = [_text(e, f"{where}/excludes/{i}") for i, e in enumerate(fmt.get("excludes") or [])]
        spec = TriggeredGrammar(
            tuple(regions), min_regions=1 if fmt.get("at_least_one") else 0,
            max_regions=1 if fmt.get("stop_after_first") else None,
            stop_after=bool(fmt.get("stop_after_first")),
            free_text=ir.diff(_ANY, _containing(excludes)) if excludes else None)
        return self.embed(triggered_to_grammar(spec))


def structural_tag_to_grammar(spec: Any, *, json_options: JsonSchemaOptions | None = None) -> ir.Grammar:
    """The IR grammar of a structural tag (a dict or its JSON text; see the module docstring).
    Raises :class:`~structgen.errors.ConfigError` for a malformed tag and
    :class:`~structgen.errors.UnsupportedFeatureError` for a format structgen does not take."""
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise ConfigError(f"the structural tag is not JSON: {exc}", key="structural_tag") from exc
    if not isinstance(spec, dict):
        raise ConfigError("a structural tag must be a JSON object", key="structural_tag")
    if spec.get("type", "structural_tag") != "structural_tag" or "format" not in spec:
        raise UnsupportedFeatureError(
            "only structural tags of the form {\"type\": \"structural_tag\", \"format\": ...} are "
            "supported (not the legacy 'structures'/'triggers' form)", keyword="type", pointer="")
    lowering = _Lowering(json_options)
    top = lowering.lower(spec["format"], "/format")
    return ir.Grammar({**lowering.rules, "structural_tag": top}, "structural_tag")


def compile_structural_tag(spec: Any, *, json_options: JsonSchemaOptions | None = None,
                           compile_options: CompileOptions | None = None) -> CompiledGrammar:
    """Compile a structural tag (cached by content, like every grammar)."""
    return compile_grammar(structural_tag_to_grammar(spec, json_options=json_options), compile_options)
