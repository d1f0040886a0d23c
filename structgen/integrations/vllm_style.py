"""structgen's grammars behind the structured-output contract of serving engines in vLLM's style.

For engines that run their own batched decoding loop and ask a grammar object per request for
a token bitmask, as vLLM's ``StructuredOutputGrammar`` does (``accept_tokens`` /
``validate_tokens`` / ``rollback`` / ``fill_bitmask`` / ``is_terminated`` / ``reset``): a
:class:`StructgenBackend` compiles a JSON schema, Lark grammar, regex or list of choices once
(cached) and hands out one cheap :class:`StructgenGrammar` per request. Plain
grammar-constrained decoding: the speculative loop of :func:`structgen.generate` is not involved.

This module does not plug into vLLM itself: inside vLLM, :mod:`structgen.integrations.vllm`
registers structgen as vLLM's structured-output backend (a ``vllm.general_plugins`` entry point)
and adds grammar-forced drafts. The classes here keep the same contract for engines in vLLM's
style that are not vLLM: ``compile_grammar``'s ``request_type`` takes vLLM's names (``JSON``,
``JSON_OBJECT``, ``REGEX``, ``GRAMMAR``, ``CHOICE``; an enum member is accepted as is),
``GRAMMAR`` specs are Lark text (structgen's grammar language), not GBNF/EBNF, and the bitmask
is packed int32 ``[num_rows, ceil(vocab_size / 32)]``, bit ``j`` of word ``w`` allowing token
``32 * w + j``. Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

from structgen.errors import ConfigError, IntegrationError
from structgen.frontends.constraint import (
    CONSTRAINT_KINDS,
    compile_constraint,
    constraint_kind,
    is_model_class,
)
from structgen.integrations._shared import allocate_bitmask, eos_ids, vocabulary, with_strict
from structgen.masks.matcher import Matcher

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from structgen.config import JsonSchemaOptions
    from structgen.grammar.compiled import CompiledGrammar
    from structgen.integrations._shared import Bitmask
    from structgen.masks.vocab import Vocabulary

__all__ = ["REQUEST_TYPES", "StructgenBackend", "StructgenGrammar"]

#: request types understood by :func:`compile_constraint` (vLLM's names, lower case) and aliases
REQUEST_TYPES = CONSTRAINT_KINDS


def _cache_key(kind: str, spec: object) -> Hashable:
    """A backend cache key for a constraint: its content where it is JSON (a model class: its
    JSON schema), else its identity."""
    if is_model_class(spec):
        schema = getattr(spec, "model_json_schema")()  # noqa: B009 - is_model_class checked it
        return (kind, "pydantic", json.dumps(schema, sort_keys=True))
    if isinstance(spec, type):
        return (kind, "type", id(spec))
    try:
        return (kind, json.dumps(spec, sort_keys=True))
    except (TypeError, ValueError):
        return (kind, "id", id(spec))


class StructgenGrammar:
    """Per-request grammar state in the shape of vLLM's structured-output grammar contract.

    Wraps one :class:`~structgen.masks.matcher.Matcher` (cheap: the compiled grammar and its
    mask caches are shared with every other request of the same constraint).

    * :meth:`accept_tokens` is all-or-nothing: either every token is accepted, or none
      is and False is returned (the state is unchanged);
    * :meth:`validate_tokens` returns the longest accepted prefix without changing state;
    * :meth:`rollback` undoes accepted tokens (EOS included);
    * :meth:`fill_bitmask` writes the allowed tokens of the current state into a row of a
      packed int32 bitmask; after EOS only EOS is allowed, EOS is allowed exactly when
      the output so far is complete.
    """

    __slots__ = ("matcher", "request_type", "num_processed_tokens")

    def __init__(self, grammar: CompiledGrammar, vocab: Vocabulary, *,
                 max_rollback: int | None = None, request_type: str | None = None) -> None:
        self.matcher: Matcher = Matcher(grammar, vocab, max_rollback=max_rollback)
        self.request_type = request_type
        self.num_processed_tokens = 0  # accepted tokens, as vLLM counts them

    def accept_tokens(self, request_id: object, tokens: Sequence[int]) -> bool:
        """Accept ``tokens`` in order. True when all were accepted; False (nothing accepted,
        state unchanged) when the grammar rejects any of them. ``request_id`` is only used
        to name the request in errors/logs. Cost: one table walk per token byte."""
        tokens = [int(t) for t in tokens]
        m = self.matcher
        if m.validate_tokens(tokens) != len(tokens):
            return False
        n = m.accept_tokens(tokens)
        if n != len(tokens):  # pragma: no cover - validate and accept walk the same tables
            m.rollback(n)
            raise IntegrationError("accept_tokens disagreed with validate_tokens",
                                   request_id=request_id)
        self.num_processed_tokens += n
        return True

    def validate_tokens(self, tokens: Sequence[int]) -> list[int]:
        """The longest prefix of ``tokens`` the grammar accepts from the current state (a new
        list); the state is unchanged."""
        tokens = [int(t) for t in tokens]
        return tokens[: self.matcher.validate_tokens(tokens)]

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens. Raises
        :class:`~structgen.errors.IntegrationError` when more tokens are asked for than can be
        rolled back (bounded by ``max_rollback``)."""
        n = int(num_tokens)
        avail = self.matcher.num_accepted
        if n < 0 or n > avail:
            raise IntegrationError(f"cannot roll back {n} tokens: {avail} can be rolled back")
        self.matcher.rollback(n)
        self.num_processed_tokens -= n

    def fill_bitmask(self, bitmask: Bitmask, idx: int) -> None:
        """Write the allowed tokens of the current state into ``bitmask[idx]`` (int32
        ``[rows, ceil(vocab_size/32)]``, torch on any device, or numpy)."""
        self.matcher.fill_bitmask(bitmask, idx)

    def is_terminated(self) -> bool:
        """True once EOS has been accepted."""
        return self.matcher.is_terminated()

    def is_accepting(self) -> bool:
        """True when the output so far is complete (EOS is allowed now)."""
        return self.matcher.is_accepting()

    def reset(self) -> None:
        """Back to the start state (as a fresh request)."""
        self.matcher.reset()
        self.num_processed_tokens = 0

    def __repr__(self) -> str:
        return f"StructgenGrammar({self.request_type!r}, {self.matcher!r})"


class StructgenBackend:
    """Compiles constraints once and creates per-request :class:`StructgenGrammar` objects.

    Construct from a Hugging Face tokenizer (``vocab_size``: the model's logits width, which
    may exceed the tokenizer; default: the tokenizer's size) or from a ready
    :class:`~structgen.masks.vocab.Vocabulary` (``vocab=``). ``eos_token_ids`` default to the
    tokenizer's EOS; pass the model's generation-config EOS ids when they differ.

    Compiled grammars are kept in an LRU of ``cache_size`` entries keyed by (request type,
    spec content); a compiled grammar is immutable and shared by all its requests and
    threads. ``max_rollback`` bounds each request's rollback history (None: unbounded).
    ``json_options`` are resolved for generation (canonical strings, strict objects);
    ``strict=False`` (overriding ``json_options.strict``) generates the schemas' open
    language, where undeclared keys are allowed (:attr:`~structgen.config.JsonSchemaOptions.strict`).
    """

    def __init__(self, tokenizer: object = None, vocab_size: int | None = None, *,
                 vocab: Vocabulary | None = None, eos_token_ids: int | Iterable[int] | None = None,
                 max_rollback: int | None = None, json_options: JsonSchemaOptions | None = None,
                 cache_size: int = 128, strict: bool | None = None) -> None:
        if vocab is None:
            if tokenizer is None:
                raise ConfigError("StructgenBackend needs tokenizer= or vocab=", key="tokenizer")
            vocab = vocabulary(tokenizer, vocab_size, eos_ids(tokenizer, eos_token_ids))
        elif vocab_size is not None and vocab_size != vocab.vocab_size:
            raise ConfigError(f"vocab_size {vocab_size} differs from the vocabulary's "
                              f"{vocab.vocab_size}", key="vocab_size")
        if cache_size < 1:
            raise ConfigError("cache_size must be >= 1", key="cache_size")
        self.vocab = vocab
        self.vocab_size = vocab.vocab_size
        self.max_rollback = max_rollback
        self.json_options = with_strict(json_options, strict)
        self._cache: OrderedDict[Hashable, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.cache_hits = 0
        self.cache_misses = 0

    def compile(self, request_type: object, grammar_spec: object) -> CompiledGrammar:
        """The compiled grammar of a constraint (cached; see :func:`compile_constraint`)."""
        kind = constraint_kind(request_type)
        key = _cache_key(kind, grammar_spec)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
                return hit
        compiled = compile_constraint(kind, grammar_spec, json_options=self.json_options)
        with self._lock:
            self.cache_misses += 1
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def compile_grammar(self, request_type: object, grammar_spec: object) -> StructgenGrammar:
        """A fresh per-request :class:`StructgenGrammar` for the constraint (compiled once)."""
        kind = constraint_kind(request_type)
        return StructgenGrammar(self.compile(kind, grammar_spec), self.vocab,
                                max_rollback=self.max_rollback, request_type=kind)

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        """A CPU int32 torch tensor ``[max_num_seqs, ceil(vocab_size/32)]``, every token
        allowed. Imports torch."""
        return allocate_bitmask(max_num_seqs, self.vocab_size)

    def destroy(self) -> None:
        """Drop the compiled-grammar cache."""
        with self._lock:
            self._cache.clear()
