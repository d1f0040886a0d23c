"""Frozen option dataclasses. Each option is documented once, here; the YAML
configuration file and the CLI map onto these same classes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CompileOptions", "JsonSchemaOptions"]


@dataclass(frozen=True)
class CompileOptions:
    """Limits for compiling a grammar IR into an automaton.

    max_states: total DFA states over all rules (after inlining) before
        :class:`~structgen.errors.CompileLimitError` is raised.
    timeout_s: wall-clock budget for one compilation before
        :class:`~structgen.errors.CompileTimeoutError` is raised.
    max_rules: number of rules in the IR grammar.
    """

    max_states: int = 200_000
    timeout_s: float = 30.0
    max_rules: int = 20_000


@dataclass(frozen=True)
class JsonSchemaOptions:
    """How a JSON Schema is turned into a grammar.

    whitespace: ``"compact"`` (no whitespace outside strings; the default, what
        ``json.dumps(v, separators=(",", ":"))`` produces) or ``"flexible"`` (up to
        ``max_whitespace`` whitespace bytes between tokens; bounded so generation
        cannot run away on whitespace).
    max_whitespace: bound used by the flexible mode.
    property_order: ``"schema"`` (declared properties in schema order, then
        additional ones; the default).
    formats: ``"enforce"`` (the default: ``format`` keywords are compiled into the
        grammar) or ``"annotation"`` (``format`` ignored, as the JSON-Schema-Test-Suite's
        required tests treat it).
    lenient: when True, keywords that cannot be enforced exactly are recorded as
        warnings on the compiled grammar instead of raising
        :class:`~structgen.errors.UnsupportedFeatureError`; the grammar then
        over-approximates the schema for those keywords (documented, opt-in).
    max_string_length: an optional global cap on string lengths (code points) applied
        where the schema gives none (None: unbounded).
    max_depth: nesting depth above which a schema is rejected as too deep.
    max_enum: enum/const values above which compilation raises CompileLimitError.
    """

    whitespace: str = "compact"
    max_whitespace: int = 8
    property_order: str = "schema"
    formats: str = "enforce"
    lenient: bool = False
    max_string_length: int | None = None
    max_depth: int = 128
    max_enum: int = 5_000
