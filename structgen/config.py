"""Frozen option dataclasses. Each option is documented once, here; the YAML
configuration file and the CLI map onto these same classes."""

from __future__ import annotations

import argparse
import dataclasses
import math
import operator
from dataclasses import dataclass

from structgen.errors import ConfigError

__all__ = ["CompileOptions", "GenerationOptions", "JsonSchemaOptions", "MonitoringOptions", "SpecConfig"]

# Counts (tokens, states, rules, ...) above this are refused: far beyond anything that can run,
# and below the sizes where tensors and C integers overflow.
MAX_COUNT = 2**31 - 1
# torch.Generator.manual_seed takes at most 2**64 - 1; request i uses seed + i.
MAX_SEED = 2**63 - 1
# Drafts per step and tokens per draft: buffers of this many rows times the vocabulary are
# allocated, so a typo such as 10**9 must not get as far as an allocation.
MAX_DRAFT = 1024


# ---------------------------------------------------------------------------------------------
# option checks, run by every dataclass's __post_init__ (so the Python API, the YAML file and
# the CLI flags all get the same ConfigError naming the key)
# ---------------------------------------------------------------------------------------------

def _fail(name: str, problem: str, value: object) -> None:
    raise ConfigError(f"{name} must be {problem}, got {value!r}", key=name)


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)  # the dataclasses are frozen


def _check_int(obj: object, name: str, lo: int, hi: int = MAX_COUNT, *, optional: bool = False) -> None:
    """An integer (not a bool; numpy integers accepted and converted) in [lo, hi]."""
    value = getattr(obj, name)
    if value is None and optional:
        return
    word = f"an integer in [{lo}, {hi}]" + (" or null" if optional else "")
    if isinstance(value, bool):
        _fail(name, word, value)
    try:
        number = operator.index(value)
    except TypeError:
        _fail(name, word, value)
    if not lo <= number <= hi:
        _fail(name, word, value)
    _set(obj, name, number)


def _check_float(obj: object, name: str, lo: float, hi: float = math.inf, *, lo_open: bool = False,
                 hi_open: bool = False, optional: bool = False) -> None:
    """A finite real number (not a bool, not NaN or infinite) in the given interval."""
    value = getattr(obj, name)
    if value is None and optional:
        return
    left = "(" if lo_open else "["
    right = ")" if hi_open or hi == math.inf else "]"
    word = f"a finite number in {left}{lo:g}, {hi:g}{right}" + (" or null" if optional else "")
    if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
        _fail(name, word, value)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        _fail(name, word, value)
    if not math.isfinite(number) or number < lo or number > hi or (lo_open and number == lo) \
            or (hi_open and number == hi):
        _fail(name, word, value)
    _set(obj, name, number)


def _check_bool(obj: object, name: str, *, optional: bool = False) -> None:
    value = getattr(obj, name)
    if value is None and optional:
        return
    if not isinstance(value, bool):
        _fail(name, "true or false" + (" or null" if optional else ""), value)


def _check_choice(obj: object, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if not isinstance(value, str) or value not in choices:
        _fail(name, "one of " + ", ".join(repr(c) for c in choices), value)


def _check_text(obj: object, name: str, *, optional: bool = False) -> None:
    value = getattr(obj, name)
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        _fail(name, "a non-empty string" + (" or null" if optional else ""), value)


@dataclass(frozen=True)
class CompileOptions:
    """Limits for compiling a grammar IR into an automaton.

    max_states: NFA states over all rules (after inlining), and states of any automaton
        built eagerly (intersections/differences for length bounds, ``not``), before
        :class:`~structgen.errors.CompileLimitError` is raised. Rules themselves are
        determinised lazily at run time, so a rule's DFA size is not limited here; but the
        token-budget check before generation (``on_budget="close"``) builds the DFA states
        it measures eagerly, at most 8 per NFA state (at least 20,000) and never more than
        this (:mod:`structgen.grammar.completion`).
    timeout_s: wall-clock budget for one compilation before
        :class:`~structgen.errors.CompileTimeoutError` is raised; the token-budget check has
        the same budget.
    max_rules: number of rules in the IR grammar.
    max_literal_length: characters of one string literal or regular expression in Lark
        grammar text, checked before the text is parsed (a long literal costs memory and time
        in proportion at every stage); a longer one raises
        :class:`~structgen.errors.GrammarError` at its line and column.
    """

    max_states: int = 200_000
    timeout_s: float = 30.0
    max_rules: int = 20_000
    max_literal_length: int = 65_536

    def __post_init__(self) -> None:
        _check_int(self, "max_states", 1)
        _check_float(self, "timeout_s", 0, lo_open=True)
        _check_int(self, "max_rules", 1)
        _check_int(self, "max_literal_length", 1)


@dataclass(frozen=True)
class JsonSchemaOptions:
    """How a JSON Schema is turned into a grammar.

    whitespace: ``"compact"`` (no whitespace outside strings; the default, what
        ``json.dumps(v, separators=(",", ":"))`` produces), ``"spaced"`` (one space after
        each ``,`` and ``:``, what ``json.dumps(v)`` and chat templates' ``tojson`` write:
        the spelling of tool calls in the Hermes, Llama 3 and Mistral formats) or
        ``"flexible"`` (up to ``max_whitespace`` whitespace bytes between tokens; bounded so
        generation cannot run away on whitespace).
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
    string_escapes: how characters inside JSON strings may be spelled. ``"all"``: every form JSON allows
        (``\\uXXXX`` in either hex case, surrogate pairs, ``\\/``, the short escapes) -- what validation
        needs, and what ``compile_json_schema(..., for_generation=False)`` uses when this is None.
        ``"canonical"``: only the form ``json.dumps(value, ensure_ascii=False)`` writes (raw UTF-8;
        ``\\"``, ``\\\\`` and control characters escaped) -- what generation uses when this is None, so
        that enum values, consts and property names are forced text and a model cannot wander into
        escapes. A narrowing: every canonical output is valid under "all".
    number_spelling: how numbers may be written. ``"all"``: every JSON number literal the schema's value
        constraints allow (``3.0``, ``-0``, ``3e0`` and ``1e2`` are integers, any number of digits) --
        what validation needs, and what ``compile_json_schema(..., for_generation=False)`` uses when this
        is None. ``"canonical"``: what generation uses when this is None, so that strict parsers (a
        Pydantic ``int`` field) read what a model writes: an ``integer`` is an integer literal
        ``-?(0|[1-9][0-9]*)`` (no fraction, no exponent, no ``-0``) of at most 19 digits, or as many as
        the largest bound or ``multipleOf`` of the schema needs; a ``number`` has at most 17 mantissa
        digits (not counting a lone ``0`` before the point), at most 3 exponent digits and no negative
        zero; an ``enum``/``const`` number is written one way (an integral value as an integer literal,
        another as ``json.dumps`` writes it). A narrowing: every canonical output is valid under "all";
        where the schema's numeric constraints leave no canonical literal (e.g. ``"minimum": 1e1000`` for
        a ``number``) or its automaton would be too large, that number constraint keeps the full language.
    value_checks: check string values an automaton cannot (``hostname`` A-labels under
        draft-07 and later, ``idn-hostname``, ``idn-email``; see docs/formats.md). True: the
        grammar accepts the format's superset and checks each such string when it completes
        (:mod:`structgen.grammar.checks`) -- exact for validation, but such a grammar drives
        no token masks. False: the format's safe subset, every string of which is valid (a
        narrowing), and no checks. None: true for validation (:meth:`for_validation`), false
        for generation (:meth:`for_generation`).
    strict: close objects and arrays that leave their extent open. When true, an object
        whose schema declares property names (``properties``, ``patternProperties``,
        ``required``, through ``allOf``/``anyOf``/``oneOf``/``$ref``/``if``/``dependentSchemas``
        as ``unevaluatedProperties`` counts them) but gives neither ``additionalProperties`` nor
        ``unevaluatedProperties`` gets only those names, and an array with ``prefixItems``
        (or array-form ``items``) but no ``items``/``additionalItems``/``unevaluatedItems``
        gets no items past the prefix -- unless closing it would leave no valid value, where
        it stays open (a warning on the compiled grammar says so). None: true for generation
        (:meth:`for_generation`), false for validation (:meth:`for_validation`). A
        narrowing: every strict output is valid under the schema.
    regex_dialect: how ``pattern`` and ``patternProperties`` (also inside ``propertyNames``)
        are read. ``"ecma262"`` (the default; what JSON Schema specifies): ECMA-262, matched
        by code point as with the ``u`` flag -- ``\\d`` and ``\\w`` are ASCII, ``\\s`` is
        ECMA's WhiteSpace and LineTerminator set (U+FEFF included), ``.`` matches anything
        but ``\\n``, ``\\r``, U+2028 and U+2029, ``$`` only the very end; ``\\p{..}``
        (general categories), ``\\cX``, ``\\uXXXX`` and ``\\u{..}`` are accepted, and so
        are the lenient escapes of non-``u`` patterns (``\\-``, ``\\_``) and a leading
        ``(?i)``; Python-only syntax (``\\Z``, ``\\A``, ``(?P<name>..)``, possessive
        quantifiers) raises :class:`~structgen.errors.UnsupportedFeatureError` naming the
        keyword and schema location. ``"python"``: Python's :mod:`re`, as the ``jsonschema``
        package reads patterns (Unicode ``\\d``/``\\w``/``\\s``, ``$`` also before a final
        newline). In both dialects a construct the grammar cannot express exactly
        (lookaround, backreferences, word boundaries) raises UnsupportedFeatureError.
    """

    whitespace: str = "compact"
    max_whitespace: int = 8
    property_order: str = "schema"
    formats: str = "enforce"
    lenient: bool = False
    max_string_length: int | None = None
    max_depth: int = 128
    max_enum: int = 5_000
    string_escapes: str | None = None
    number_spelling: str | None = None
    strict: bool | None = None
    value_checks: bool | None = None
    regex_dialect: str = "ecma262"

    def __post_init__(self) -> None:
        _check_choice(self, "whitespace", ("compact", "spaced", "flexible"))
        _check_int(self, "max_whitespace", 0)
        _check_choice(self, "property_order", ("schema",))
        _check_choice(self, "formats", ("enforce", "annotation"))
        _check_bool(self, "lenient")
        _check_int(self, "max_string_length", 0, optional=True)
        _check_int(self, "max_depth", 1)
        _check_int(self, "max_enum", 1)
        if self.string_escapes is not None:
            _check_choice(self, "string_escapes", ("all", "canonical"))
        if self.number_spelling is not None:
            _check_choice(self, "number_spelling", ("all", "canonical"))
        _check_bool(self, "strict", optional=True)
        _check_bool(self, "value_checks", optional=True)
        _check_choice(self, "regex_dialect", ("ecma262", "python"))

    def for_generation(self) -> JsonSchemaOptions:
        """These options resolved for generation: ``string_escapes`` and ``number_spelling``
        "canonical", ``strict`` true and ``value_checks`` false, unless set."""
        return self._resolved("canonical", strict=True, value_checks=False)

    def for_validation(self) -> JsonSchemaOptions:
        """These options resolved for validation: ``string_escapes`` and ``number_spelling``
        "all", ``strict`` false and ``value_checks`` true, unless set."""
        return self._resolved("all", strict=False, value_checks=True)

    def _resolved(self, spelling: str, *, strict: bool, value_checks: bool) -> JsonSchemaOptions:
        """These options with the unset ones of :meth:`for_generation` / :meth:`for_validation`
        filled in (``self`` when all are set)."""
        if None not in (self.string_escapes, self.number_spelling, self.strict, self.value_checks):
            return self
        return dataclasses.replace(
            self,
            string_escapes=spelling if self.string_escapes is None else self.string_escapes,
            number_spelling=spelling if self.number_spelling is None else self.number_spelling,
            strict=strict if self.strict is None else self.strict,
            value_checks=value_checks if self.value_checks is None else self.value_checks)


@dataclass(frozen=True)
class SpecConfig:
    """Speculative generation options (the ``speculative_decoding:`` section of the YAML file).

    draft_num: candidate drafts gathered per step from all drafters; the pre-validated
        candidate with the best expected acceptance is verified.
    max_draft_tokens: upper bound on one draft's length (drafters adapt below it).
    min_draft_tokens: lower bound a drafter's adaptive length can shrink to.
    temperature: 0 = greedy; > 0 samples from the masked, temperature-scaled target.
    top_p: nucleus sampling threshold (1.0 = off), applied after the grammar mask.
    verify_threshold: None = exact verification (the default). A number in (0, 1] turns on
        LOSSY typical-acceptance: a draft token is accepted when the target gives it at least
        this probability relative to the target's top token. Changes the output distribution.
    batch_size: prompts processed per micro-batch when a list of prompts is given.
    grammar_drafts: propose the grammar-forced continuation (canonically tokenized).
    prompt_lookup: propose continuations found by text match in prompt and output, and by token
        n-gram match over prompt and output (which continues an output repeating itself).
    ngram_max / ngram_min: token n-gram sizes tried by the n-gram lookup, longest first.
    draft_model: alias or path of a smaller causal LM with the same tokenizer (None = off).
    adaptive: adapt each drafter's draft length to its observed acceptance.
    min_acceptance: a drafter whose acceptance (accepted / proposed tokens) stays below this
        after ``warmup_proposals`` proposals is switched off for the rest of the request (text
        lookup and draft model; the grammar-forced and n-gram drafters cost next to nothing and
        stay on: the pacing decides whether their drafts are worth a longer pass).
    warmup_proposals: proposals (drafts, not tokens) before a drafter can be switched off.
    backend: verify backend, ``"auto"`` | ``"torch"`` | ``"triton"``.
    overlap_masks: build a step's grammar masks while the target forward runs (CUDA: after the
        forward's kernels are queued, uploaded from pinned memory without blocking; CPU: on a
        worker thread). None = on for CUDA only (on the CPU the masks are a small part of a
        step). The output is the same either way.
    """

    draft_num: int = 6
    max_draft_tokens: int = 12
    min_draft_tokens: int = 2
    temperature: float = 0.0
    top_p: float = 1.0
    verify_threshold: float | None = None
    batch_size: int = 32
    grammar_drafts: bool = True
    prompt_lookup: bool = True
    ngram_max: int = 4
    ngram_min: int = 1
    draft_model: str | None = None
    adaptive: bool = True
    min_acceptance: float = 0.1
    warmup_proposals: int = 16
    backend: str = "auto"
    overlap_masks: bool | None = None

    def __post_init__(self) -> None:
        _check_int(self, "draft_num", 1, MAX_DRAFT)
        _check_int(self, "max_draft_tokens", 1, MAX_DRAFT)
        _check_int(self, "min_draft_tokens", 1, MAX_DRAFT)
        if self.min_draft_tokens > self.max_draft_tokens:
            raise ConfigError("need 1 <= min_draft_tokens <= max_draft_tokens", key="max_draft_tokens")
        _check_float(self, "temperature", 0)
        _check_float(self, "top_p", 0, 1, lo_open=True)
        _check_float(self, "verify_threshold", 0, 1, lo_open=True, optional=True)
        _check_int(self, "batch_size", 1)
        _check_bool(self, "grammar_drafts")
        _check_bool(self, "prompt_lookup")
        _check_int(self, "ngram_max", 1)
        _check_int(self, "ngram_min", 1)
        if self.ngram_min > self.ngram_max:
            raise ConfigError("need 1 <= ngram_min <= ngram_max", key="ngram_min")
        _check_text(self, "draft_model", optional=True)
        _check_bool(self, "adaptive")
        _check_float(self, "min_acceptance", 0, 1)
        _check_int(self, "warmup_proposals", 0)
        _check_choice(self, "backend", ("auto", "torch", "triton"))
        _check_bool(self, "overlap_masks", optional=True)


@dataclass(frozen=True)
class GenerationOptions:
    """Per-request generation options (the ``generation:`` section of the YAML file; the
    ``structgen generate`` flags of the same names override them).

    model: model alias (see ``structgen models``) or local Hugging Face folder; None = the
        default model (``qwen2.5-coder-0.5b``).
    max_new_tokens: generated tokens per request (EOS included).
    on_budget: what ``max_new_tokens`` does to an output. ``"close"`` (the default): as the
        budget runs low, only tokens after which the shortest completion (tokenized greedily)
        plus EOS still fits are allowed, so every output is complete and valid;
        ``finish_reason`` is ``"budget_close"`` where that rule removed a token the grammar
        allowed, and a budget below the shortest output is a ``TokenBudgetError`` before any
        generation. ``"cut"``: generation stops at the budget wherever the output is
        (``finish_reason="length"``, an incomplete output).
    seed: base random seed (request ``i`` uses ``seed + i``); None = random.
    speculative: False runs plain grammar-constrained decoding (no drafts), the baseline.
    start: start rule of a Lark grammar.
    tools: a JSON file of tools (a list of OpenAI function specs, or ``{"tools": [...]}``) the
        model may call; None = no tools (see ``docs/tools.md``).
    tool_choice: ``"auto"`` (text and/or calls), ``"required"`` (only calls, at least one),
        ``"none"`` (no call), or the name of the one tool to call.
    parallel_tool_calls: False allows at most one call per output.
    tool_format: the call format (``hermes_json``, ``hermes``, ``json``, ``llama3``,
        ``mistral``, or a registered one), for ``structgen generate`` and ``structgen serve``;
        None = detected from the model's chat template and tokenizer
        (:func:`structgen.calls.formats.detect_tool_format`; ``hermes_json`` when they show
        nothing).
    reasoning: free text inside ``<think>...</think>`` first, then the constrained answer.
    thinking_budget: tokens of reasoning after which ``</think>`` is forced; None = no cap.
    threads: CPU threads of the model: llama.cpp's threads for a GGUF model, torch's
        (``torch.set_num_threads``) for a transformers model; None = the backend's default
        (llama.cpp: the CPU count, at most 8; torch: its own).
    """

    model: str | None = None
    max_new_tokens: int = 256
    on_budget: str = "close"
    seed: int | None = None
    speculative: bool = True
    start: str = "start"
    tools: str | None = None
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    tool_format: str | None = None
    reasoning: bool = False
    thinking_budget: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        _check_text(self, "model", optional=True)
        _check_int(self, "threads", 1, 1024, optional=True)
        _check_int(self, "max_new_tokens", 1)
        _check_choice(self, "on_budget", ("close", "cut"))
        _check_int(self, "seed", 0, MAX_SEED, optional=True)
        _check_bool(self, "speculative")
        _check_text(self, "start")
        _check_text(self, "tools", optional=True)
        _check_text(self, "tool_choice")
        _check_bool(self, "parallel_tool_calls")
        _check_text(self, "tool_format", optional=True)
        _check_bool(self, "reasoning")
        _check_int(self, "thinking_budget", 0, optional=True)


@dataclass(frozen=True)
class MonitoringOptions:
    """Alert thresholds for the run metrics (the ``monitoring:`` section of the YAML file).

    An alert is reported (in the metrics JSON, as ``structgen_alert`` in the Prometheus
    text, and as a warning line on stderr) when its condition holds at the end of a run; it
    never changes the exit code. None switches an alert off.

    min_acceptance: alert when draft acceptance (accepted / proposed draft tokens, all
        drafters) is below this.
    min_drafter_acceptance: alert when one drafter's acceptance is below this.
    min_validity: alert when the output validity rate (valid / requests) is below this;
        1.0 (the default) alerts on any invalid or incomplete output.
    min_tokens_per_pass: alert when generated tokens per target forward pass is below this.
    max_latency_p95_s: alert when the 95th percentile of end-to-end request latency
        (seconds) is above this.
    min_requests: alerts are evaluated only once this many requests were observed.
    """

    min_acceptance: float | None = None
    min_drafter_acceptance: float | None = None
    min_validity: float | None = 1.0
    min_tokens_per_pass: float | None = None
    max_latency_p95_s: float | None = None
    min_requests: int = 1

    def __post_init__(self) -> None:
        for name in ("min_acceptance", "min_drafter_acceptance", "min_validity"):
            _check_float(self, name, 0, 1, optional=True)
        _check_float(self, "min_tokens_per_pass", 0, optional=True)
        _check_float(self, "max_latency_p95_s", 0, lo_open=True, optional=True)
        _check_int(self, "min_requests", 1)


def positive_int_arg(text: str) -> int:
    """An argparse ``type``: an integer from 1 to :data:`MAX_COUNT` (the CLI's counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{value} is not an integer from 1 to {MAX_COUNT}")
    return value
