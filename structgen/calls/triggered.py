"""Triggered grammars: free text with constrained regions that a trigger opens.

A :class:`TriggeredGrammar` describes output that is free text until one of several
triggers appears, then the constrained *body* that trigger chose (a JSON Schema, a Lark
grammar, a regex or a literal, as IR), then the region's end marker, then free text again::

    free  trigger_i  body_i  end_i  free  trigger_j  body_j  end_j  free

The byte-level definition (what :func:`triggered_to_grammar` lowers, exactly):

* free text is any bytes (or, with ``free_text``, a string of that regular language) in
  which no trigger occurs; a region opens at the *first* place a trigger's bytes complete
  (so free text never contains a trigger, and a trigger may follow text that ends with a
  prefix of it: ``"<tool<tool_call>"`` is free text ``"<tool"`` then the trigger);
* the region's body is exactly a string of the body grammar, followed by ``end`` (the
  body's language and the end marker are the caller's: a body that could run on into its
  end marker makes the split ambiguous, not wrong -- every split is a string of the
  language);
* the count options: ``min_regions`` / ``max_regions`` (at least / at most; equal for
  exactly); ``regions_only`` (no free text at all: regions separated by ``separator``, what
  ``tool_choice="required"`` in a template that allows no text needs); ``stop_after`` (the
  output ends right after the end marker of its one region);
* ``prefix``: forced bytes before everything (e.g. a ``<think>`` the template does not
  write).

Because the whole description lowers to one IR grammar, the compiled grammar is an ordinary
:class:`~structgen.grammar.compiled.CompiledGrammar`: the token-level matcher
(:class:`~structgen.masks.matcher.Matcher`) is exact on it whatever the tokens (a token may
hold the end of free text and the start of a trigger, or a whole trigger and the start of
the body), its verbs (accept, validate, rollback, fork, forced tokens) and so speculation
work unchanged, and masks in free text are a handful of cached configurations (the partial
trigger matches), so a free-text step costs a cache lookup, never a vocabulary walk. Those
configurations forbid few tokens (the matcher's free-text shortcut,
:meth:`~structgen.masks.matcher.Matcher.forbidden_token_ids`): a logits processor sets just
those logits, and a step from them is a dictionary lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structgen.config import CompileOptions, JsonSchemaOptions
from structgen.errors import ConfigError
from structgen.frontends.constraint import schema_from
from structgen.frontends.json_schema.compiler import schema_to_grammar
from structgen.frontends.lark import lark_to_grammar
from structgen.frontends.regex import compile_regex
from structgen.grammar import ir
from structgen.grammar.compiled import CompiledGrammar
from structgen.grammar.compiler import compile_grammar
from structgen.grammar.passes import prefixed_grammar

__all__ = ["Region", "TriggeredGrammar", "body_grammar", "compile_triggered", "triggered_to_grammar"]


def _as_bytes(name: str, value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise ConfigError(f"{name} must be str or bytes, not {type(value).__name__}", key=name)


@dataclass(frozen=True)
class Region:
    """One kind of constrained region: ``trigger`` (str or bytes, non-empty) opens it, the
    body grammar ``body`` (an IR :class:`~structgen.grammar.ir.Grammar`; build one with
    :func:`body_grammar`) follows, then ``end`` (may be empty). The trigger and the end marker
    are part of the output."""

    trigger: bytes
    body: ir.Grammar
    end: bytes = b""

    def __post_init__(self) -> None:
        object.__setattr__(self, "trigger", _as_bytes("trigger", self.trigger))
        object.__setattr__(self, "end", _as_bytes("end", self.end))
        if not self.trigger:
            raise ConfigError("a region's trigger must not be empty", key="trigger")
        if not isinstance(self.body, ir.Grammar):
            raise ConfigError(f"a region's body must be an IR Grammar (see body_grammar), not "
                              f"{type(self.body).__name__}", key="body")


@dataclass(frozen=True)
class TriggeredGrammar:
    """Free text with triggered regions (see the module docstring for the exact language).

    ``regions``: the region kinds, told apart by their triggers; ``min_regions`` /
    ``max_regions`` (None: unbounded): how many regions the output holds; ``regions_only``:
    no free text, regions joined by ``separator``; ``stop_after``: the output ends after its
    region (at most one region then); ``prefix``: forced leading bytes; ``free_text``: an
    optional regular IR expression the free text must also match (default: any bytes).
    Immutable; compile once with :func:`compile_triggered` and share."""

    regions: tuple[Region, ...]
    min_regions: int = 0
    max_regions: int | None = None
    regions_only: bool = False
    separator: bytes = b""
    stop_after: bool = False
    prefix: bytes = b""
    free_text: ir.Expr | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "regions", tuple(self.regions))
        object.__setattr__(self, "separator", _as_bytes("separator", self.separator))
        object.__setattr__(self, "prefix", _as_bytes("prefix", self.prefix))
        if not self.regions:
            raise ConfigError("a triggered grammar needs at least one region", key="regions")
        for i, r in enumerate(self.regions):
            if not isinstance(r, Region):
                raise ConfigError(f"regions[{i}] is {type(r).__name__}, not a Region", key=f"regions/{i}")
        lo = self.min_regions
        if isinstance(lo, bool) or not isinstance(lo, int) or lo < 0:
            raise ConfigError("min_regions must be an integer >= 0", key="min_regions")
        mx = self.max_regions
        if mx is not None and (isinstance(mx, bool) or not isinstance(mx, int) or mx < self.min_regions):
            raise ConfigError("max_regions must be None or an integer >= min_regions", key="max_regions")
        if self.stop_after and (mx == 0 or self.min_regions > 1):
            raise ConfigError("stop_after allows exactly one region or none: min_regions <= 1 and "
                              "max_regions >= 1", key="stop_after")
        if self.regions_only and self.min_regions == 0 and mx == 0:
            raise ConfigError("regions_only with max_regions=0 allows only empty output", key="regions_only")


def body_grammar(kind: str, spec: Any, *, json_options: JsonSchemaOptions | None = None,
                 start: str = "start") -> ir.Grammar:
    """The IR of a region body: ``kind`` ``"json"`` (a JSON Schema value, lowered for
    generation: canonical strings, strict objects unless ``json_options`` says otherwise),
    ``"grammar"`` (Lark text, rule ``start``), ``"regex"`` (a pattern, matched in full) or
    ``"literal"`` (str or bytes). Raises what the front-ends raise for a bad spec and
    :class:`~structgen.errors.ConfigError` for an unknown kind."""
    if kind == "json":
        options = (json_options or JsonSchemaOptions()).for_generation()
        return schema_to_grammar(schema_from(spec, strings_may_be_paths=False), options)
    if kind in ("grammar", "lark"):
        return lark_to_grammar(spec, start=start)
    if kind == "regex":
        return ir.Grammar({"start": compile_regex(spec)}, "start")
    if kind == "literal":
        return ir.Grammar({"start": ir.lit(_as_bytes("literal", spec))}, "start")
    raise ConfigError(f"unknown region body kind {kind!r}; expected json, grammar, regex or literal",
                      key="kind")


_ANY = ir.star(ir.ANY_BYTE)


def triggered_to_grammar(spec: TriggeredGrammar) -> ir.Grammar:
    """Lower ``spec`` to one IR grammar (start rule ``triggered``) whose language is the
    byte-level definition in the module docstring."""
    if not isinstance(spec, TriggeredGrammar):
        raise ConfigError(f"expected a TriggeredGrammar, not {type(spec).__name__}", key="spec")
    triggers = ir.alt(*(ir.lit(t) for t in dict.fromkeys(r.trigger for r in spec.regions)))
    contains = ir.seq(_ANY, triggers, _ANY)  # text holding some trigger
    free_end = ir.diff(_ANY, contains)  # trailing free text: no trigger at all
    if spec.free_text is not None:
        free_end = ir.and_(free_end, spec.free_text)
    rules: dict[str, ir.Expr] = {}
    items = []
    for i, r in enumerate(spec.regions):
        body = prefixed_grammar(r.body, f"r{i}.")
        rules.update(body)
        inner = ir.seq(ir.ref(f"r{i}.{r.body.start}"), ir.lit(r.end))
        if spec.regions_only:
            items.append(ir.seq(ir.lit(r.trigger), inner))
            continue
        # free text, then this trigger where the first trigger occurrence completes
        lead = ir.diff(ir.seq(_ANY, ir.lit(r.trigger)), ir.seq(contains, ir.plus(ir.ANY_BYTE)))
        if spec.free_text is not None:
            lead = ir.and_(lead, ir.seq(spec.free_text, ir.lit(r.trigger)))
        items.append(ir.seq(lead, inner))
    rules["region"] = ir.alt(*items)
    one = ir.ref("region")
    lo, hi = spec.min_regions, spec.max_regions
    if spec.regions_only:
        tail = ir.seq(ir.lit(spec.separator), one)
        some = ir.seq(one, ir.rep(tail, max(lo - 1, 0), None if hi is None else hi - 1))
        body_expr = ir.alt(ir.EMPTY, some) if lo == 0 else some
        if spec.stop_after:
            body_expr = ir.alt(ir.EMPTY, one) if lo == 0 else one
    elif spec.stop_after:
        body_expr = ir.alt(free_end, one) if lo == 0 else one
    else:
        body_expr = ir.seq(ir.rep(one, lo, hi), free_end)
    rules["triggered"] = ir.seq(ir.lit(spec.prefix), body_expr)
    return ir.Grammar(rules, "triggered")


def compile_triggered(spec: TriggeredGrammar, compile_options: CompileOptions | None = None
                      ) -> CompiledGrammar:
    """Compile ``spec`` (cached by content, like every grammar); the result is immutable and
    shared by all the requests that use it."""
    return compile_grammar(triggered_to_grammar(spec), compile_options)
