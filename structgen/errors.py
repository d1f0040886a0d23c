"""One typed exception tree for structgen.

Every error a user can provoke with bad input is a subclass of :class:`StructgenError`.
Errors carry a location where one exists: a JSON pointer into a schema, a line and
column (with a caret excerpt) into grammar text, or a character offset into a regex.
"""

from __future__ import annotations

__all__ = [
    "StructgenError",
    "ConfigError",
    "SchemaError",
    "UnsupportedFeatureError",
    "GrammarError",
    "GrammarSyntaxError",
    "RegexError",
    "CompileLimitError",
    "CompileTimeoutError",
    "VocabularyError",
    "AssetError",
    "ContextLengthError",
    "TokenBudgetError",
    "MatcherUsageError",
    "ModelValidationError",
    "RequestCancelledError",
    "VerifyError",
    "IntegrationError",
    "TokenRejectedError",
    "VllmVersionError",
    "ServerBusyError",
    "EngineClosedError",
    "StructgenWarning",
    "attribute_to_request",
]


class StructgenError(Exception):
    """Base class of every error structgen raises on purpose.

    ``request_index`` is the 0-based index of the request of a batch the error belongs to
    (None outside a batch); the message then starts with ``request N: ``.
    """

    request_index: int | None = None


def attribute_to_request(error: StructgenError, index: int) -> StructgenError:
    """Mark ``error`` (in place) as belonging to request ``index`` of a batch: sets
    ``request_index`` and prefixes the message with ``request N: ``. Returns ``error`` so that
    callers can ``raise attribute_to_request(e, i) from None``; its type (and so every
    ``except`` clause that catches it) is unchanged."""
    if error.request_index is None:
        error.request_index = index
        prefix = f"request {index}: "
        if error.args and isinstance(error.args[0], str):
            error.args = (prefix + error.args[0],) + error.args[1:]
        else:
            error.args = (prefix.rstrip(": "),) + error.args
        if isinstance(getattr(error, "message", None), str):
            error.message = prefix + error.message  # type: ignore[attr-defined]
    return error


class ConfigError(StructgenError, ValueError):
    """An option or configuration file is invalid (names the key, and the file line when known)."""

    def __init__(self, message: str, *, key: str | None = None, line: int | None = None,
                 path: str | None = None) -> None:
        self.key = key
        self.line = line
        self.path = path
        where = ""
        if path is not None:
            where += f"{path}"
            if line is not None:
                where += f":{line}"
            where += ": "
        super().__init__(where + message)


class SchemaError(StructgenError, ValueError):
    """The JSON Schema itself is malformed (bad JSON, wrong keyword type, unknown $ref, ...).

    ``pointer`` is the JSON pointer (RFC 6901) of the offending schema location and
    ``keyword`` the keyword concerned, when known. A schema that came from a tool's
    ``parameters`` names the tool in ``tool``, and ``param`` says where the request gave it
    (``tools[2].function.parameters``); both None for the answer's own schema.
    """

    tool: str | None = None
    param: str | None = None

    def __init__(self, message: str, *, pointer: str = "", keyword: str | None = None) -> None:
        self.pointer = pointer
        self.keyword = keyword
        self.message = message
        loc = f" at {pointer or '#'}"
        kw = f" [{keyword}]" if keyword else ""
        super().__init__(f"{message}{kw}{loc}")


class UnsupportedFeatureError(SchemaError):
    """A schema keyword (or keyword combination) that structgen cannot enforce exactly.

    Raised instead of silently ignoring the keyword; the lenient mode turns these into
    warnings recorded on the compiled grammar.
    """


class GrammarError(StructgenError, ValueError):
    """A grammar (Lark text or internal IR) is invalid: undefined rule, left recursion, ..."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None,
                 context: str | None = None) -> None:
        self.line = line
        self.column = column
        self.context = context
        self.message = message
        text = message
        if line is not None:
            text += f" (line {line}" + (f", column {column}" if column is not None else "") + ")"
        if context:
            text += "\n" + context
        super().__init__(text)


class GrammarSyntaxError(GrammarError):
    """Grammar text could not be parsed; carries line, column and a caret excerpt."""


class RegexError(StructgenError, ValueError):
    """A regular expression is invalid or uses an unsupported construct.

    ``position`` is the 0-based character offset into ``pattern``.
    """

    def __init__(self, message: str, *, pattern: str = "", position: int | None = None) -> None:
        self.pattern = pattern
        self.position = position
        self.message = message
        text = message
        if pattern:
            text += f" in regex {pattern!r}"
            if position is not None:
                text += f" at offset {position}\n  {pattern}\n  {' ' * position}^"
        super().__init__(text)


class CompileLimitError(StructgenError):
    """Compilation exceeded a configured size limit (automaton states, rule count, ...).

    ``pointer`` is the schema location being compiled when the limit was hit and
    ``keyword`` the schema keyword responsible for the size there (JSON schemas, when
    known). ``rule`` is the grammar rule being compiled (automaton errors); ``ir_exprs``
    the intersections/differences being built, innermost last, and ``ir_calls`` the rules
    compiled as calls rather than inlined (diagnostics: how a front-end locates the error).
    """

    def __init__(self, message: str = "", *, pointer: str | None = None, keyword: str | None = None,
                 rule: str | None = None) -> None:
        self.pointer = pointer
        self.keyword = keyword
        self.rule = rule
        self.ir_exprs: tuple = ()
        self.ir_calls: frozenset[str] = frozenset()
        super().__init__(message)


class CompileTimeoutError(CompileLimitError):
    """Compilation exceeded the configured time limit."""


class RequestCancelledError(StructgenError):
    """The work was stopped because nobody wants its result any more (a server's client went
    away while its request was being prepared; see :mod:`structgen.limits`)."""


class VocabularyError(StructgenError, ValueError):
    """A tokenizer could not be turned into a byte-level vocabulary."""


class AssetError(StructgenError):
    """A tokenizer or model asset could not be obtained or converted."""


class ContextLengthError(StructgenError, ValueError):
    """A prompt plus ``max_new_tokens`` does not fit in the model's context window.

    Raised before any generation. ``request_index`` is the request of the batch (None for a
    single prompt), ``prompt_tokens`` the prompt's length in tokens, ``max_new_tokens`` the
    generation budget and ``context_length`` the most positions the model takes.
    """

    def __init__(self, message: str, *, prompt_tokens: int, max_new_tokens: int, context_length: int,
                 request_index: int | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.context_length = context_length
        super().__init__(message)
        if request_index is not None:
            attribute_to_request(self, request_index)


class TokenBudgetError(StructgenError, ValueError):
    """``max_new_tokens`` is below the shortest output the constraint allows, with
    ``on_budget="close"`` (every output must then be complete within the budget).

    Raised before any generation. ``needed`` is the fewest tokens the budget rule needs (the
    greedy tokenization of the shortest completion, plus EOS), ``max_new_tokens`` the budget
    given, ``request_index`` the request of the batch (None for a single prompt).
    """

    key = "max_new_tokens"

    def __init__(self, message: str, *, needed: int, max_new_tokens: int,
                 request_index: int | None = None) -> None:
        self.needed = needed
        self.max_new_tokens = max_new_tokens
        super().__init__(message)
        if request_index is not None:
            attribute_to_request(self, request_index)


class MatcherUsageError(StructgenError, ValueError, TypeError):
    """A :class:`~structgen.masks.matcher.Matcher` (or bitmask helper) was called wrongly: a bitmask
    of the wrong type, dtype, shape or row, a token id that is not an integer of the
    vocabulary, a rollback of more tokens than the history holds, a negative
    ``max_rollback``. A caller bug, never a grammar verdict (a token the grammar forbids
    makes ``accept_token`` return False). Both a ``ValueError`` and a ``TypeError``, so
    code catching either keeps working."""


class ModelValidationError(StructgenError, ValueError):
    """A generated output is not a valid instance of the Pydantic model asked for
    (:func:`structgen.generate_model`, :func:`structgen.stream_model`), or it did not finish
    (``finish_reason`` ``"length"``). ``text``: the output; ``finish_reason``; the Pydantic
    ``ValidationError``, when there is one, is the ``__cause__``."""

    def __init__(self, message: str, *, text: str = "", finish_reason: str | None = None) -> None:
        super().__init__(message)
        self.text = text
        self.finish_reason = finish_reason


class VerifyError(StructgenError, ValueError):
    """A sequence could not be verified: a row it reached had no viable token (every token
    masked, or only -inf logits), had NaN/+inf logits on allowed tokens, or its drafts did not
    fit the output. ``sequence`` is its batch index and ``position`` the row position
    (:mod:`structgen.generation.verify`)."""

    def __init__(self, message: str, *, sequence: int, position: int) -> None:
        self.sequence = sequence
        self.position = position
        super().__init__(message)


class IntegrationError(StructgenError, ValueError):
    """An integration (:mod:`structgen.integrations`) was driven outside its contract (e.g.
    rolling back more tokens than were accepted). ``request_id`` / ``row`` say which request or
    batch row, when known."""

    def __init__(self, message: str, *, request_id: object = None, row: int | None = None) -> None:
        self.request_id = request_id
        self.row = row
        where = ""
        if request_id is not None:
            where = f"request {request_id!r}: "
        elif row is not None:
            where = f"batch row {row}: "
        super().__init__(where + message)


class TokenRejectedError(IntegrationError):
    """A token fed back by the decoding loop is not allowed by the row's grammar (the mask
    was overridden after the logits processor ran, or the processor was attached to a generation
    it did not see from the start). ``position`` is the index of the token in ``input_ids``."""

    def __init__(self, message: str, *, row: int, position: int, token_id: int) -> None:
        self.position = position
        self.token_id = token_id
        super().__init__(message, row=row)


class VllmVersionError(StructgenError, RuntimeError):
    """vLLM is missing, or is a version :mod:`structgen.integrations.vllm` was not tested with."""


class ServerBusyError(StructgenError):
    """The serving engine's queue is full (``max_queued``): try again later (HTTP 429)."""


class EngineClosedError(StructgenError):
    """The serving engine is shutting down and takes no new requests (HTTP 503)."""


class StructgenWarning(UserWarning):
    """Warnings structgen emits on purpose (e.g. lenient-mode over-approximations)."""
