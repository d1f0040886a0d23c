"""structgen's grammars inside ``transformers``' own ``model.generate``: a ``LogitsProcessor``.

:class:`StructgenLogitsProcessor` is for code that keeps calling
``model.generate(..., logits_processor=[proc])``: plain grammar-constrained decoding (the
speculative loop of :func:`structgen.generate` is not involved). Batched (one
:class:`~structgen.masks.matcher.Matcher` per row), greedy or sampling, ``num_beams=1`` (beam
search is followed too: rows whose history was reordered pick up the matcher of the row they
came from).

Importing this module imports neither torch nor transformers: ``StructgenLogitsProcessor`` is
a real subclass of ``transformers.LogitsProcessor``, built (and transformers imported) when the
name is first accessed.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from structgen.errors import ConfigError, SchemaError, TokenRejectedError
from structgen.frontends.constraint import compile_constraint, schema_from
from structgen.grammar.compiled import CompiledGrammar
from structgen.integrations._shared import eos_ids, vocabulary, with_strict
from structgen.masks.matcher import Matcher, bitmask_words, fill_bitmasks

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from structgen.config import JsonSchemaOptions
    from structgen.masks.vocab import Vocabulary

__all__ = ["StructgenLogitsProcessor"]

class _LogitsProcessorImpl:
    """A ``transformers`` logits processor for grammar-constrained decoding with
    ``model.generate``.

    ::

        proc = StructgenLogitsProcessor(schema, tokenizer)
        out = model.generate(**enc, logits_processor=[proc], max_new_tokens=200)

    ``grammar_or_schema``: a JSON schema (dict, JSON text, Pydantic class), a
    :class:`~structgen.grammar.compiled.CompiledGrammar`, or a list of those with one per batch row
    (mixed schemas); or give ``grammar=`` (Lark text, rule ``start``) or ``regex=`` instead.
    ``tokenizer``: the model's tokenizer (its byte table is built on the first call, with the
    logits width as vocabulary size: padding rows beyond the tokenizer are never allowed), or
    pass a ready ``vocab=``. ``eos_token_ids``: the ids that end a generation (default: the
    tokenizer's EOS); pass ``model.generation_config.eos_token_id`` when it differs, since EOS
    is allowed exactly when the output so far is complete. ``pad_token_id`` (default: the
    tokenizer's) lets a row that some other stopping criterion ended be fed padding.
    ``strict=False`` (or ``json_options.strict``) lets schemas' objects take undeclared keys,
    as :func:`structgen.generate` does with ``strict=False``.

    ``max_new_tokens``: pass the same number as to ``generate`` to close every output within
    it, as :func:`structgen.generate` does by default (``on_budget="close"``): near the end the
    allowed set shrinks to tokens after which the shortest completion, plus EOS, still fits
    (:mod:`structgen.masks.budget`), so every row ends on EOS with a complete document. A
    budget below a row's shortest output raises :class:`~structgen.errors.TokenBudgetError`
    on the first call, naming the row. Without it (the default) an output may be cut short.

    Batch size and prompt length are discovered from ``input_ids`` on the first call; each
    later call accepts the newest token of every row. A call that does not continue the
    previous one starts a new generation, so one processor can serve several ``generate``
    calls (not concurrently). Works with greedy decoding and sampling (the processor runs
    before temperature/top-k/top-p, so they only ever see allowed tokens); with beam search,
    reordered rows take over the matcher of the row they came from. A greedy run is
    token-identical to ``structgen.generate(..., speculative=False)`` up to floating-point
    differences in the model's forward passes (padding, cache layout).

    A token the grammar rejects (the scores were changed after this processor) raises
    :class:`~structgen.errors.TokenRejectedError` with the row and position.

    Where the grammar allows nearly every token (free text between the triggers of a
    tool-calling grammar, say: :meth:`Matcher.forbidden_token_ids
    <structgen.masks.matcher.Matcher.forbidden_token_ids>`), only the few forbidden logits
    are set to -inf instead of applying a whole-vocabulary mask. ``inplace`` says where they
    are written. ``None`` (the default): the first call of a generation writes into a copy;
    later calls write into the scores they are given while the caller keeps none of the
    earlier calls' scores, found from their reference counts on the next call
    (``generate(output_logits=True)`` or ``output_scores=True`` keep every step's, so the
    second call sees that and the generation copies throughout: the logits ``generate``
    returns stay the model's). A loop of your own that starts keeping the scores it passes in
    later gets that one step's scores masked; pass ``False`` there. ``False``: always a copy,
    as transformers' own processors do. ``True``: always in place. Whole-vocabulary masks go
    to a copy unless ``inplace=True``.

    ``look_ahead=True``: after each call, prepare on a background thread the masks of the
    configurations a few bytes ahead of every row (:meth:`Matcher.start_look_ahead
    <structgen.masks.matcher.Matcher.start_look_ahead>`) while the model computes the next
    logits, so that a new schema's first masks are mostly ready when they are needed. The masks
    are the same either way. Off by default: ``generate``'s own loop keeps the interpreter busy
    during the forward pass (on a CPU, and launching a small model's kernels on a GPU), and the
    thread's share of it can cost more than the masks it saves.

    ``StructgenLogitsProcessor`` is this class with transformers' ``LogitsProcessor`` as a second
    base, built when the name is first accessed, so that importing this module (or
    :mod:`structgen.integrations`) does not import transformers.
    """

    supports_continuous_batching = False

    def __init__(self, grammar_or_schema: object = None, tokenizer: object = None, *,
                 grammar: str | None = None, regex: str | None = None, start: str = "start",
                 vocab: Vocabulary | None = None, eos_token_ids: int | Iterable[int] | None = None,
                 pad_token_id: int | None = None,
                 json_options: JsonSchemaOptions | None = None, strict: bool | None = None,
                 max_new_tokens: int | None = None, inplace: bool | None = None,
                 look_ahead: bool = False) -> None:
        given = [x is not None for x in (grammar_or_schema, grammar, regex)]
        if sum(given) != 1:
            raise ConfigError("give exactly one of grammar_or_schema, grammar= or regex=",
                              key="grammar_or_schema")
        if vocab is None and tokenizer is None:
            raise ConfigError("StructgenLogitsProcessor needs tokenizer= or vocab=", key="tokenizer")
        if max_new_tokens is not None and (isinstance(max_new_tokens, bool)
                                           or not isinstance(max_new_tokens, int) or max_new_tokens < 1):
            raise ConfigError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}",
                              key="max_new_tokens")
        self.max_new_tokens = max_new_tokens
        if inplace is not None and not isinstance(inplace, bool):
            raise ConfigError(f"inplace must be True, False or None, not {inplace!r}", key="inplace")
        self.inplace = inplace
        if not isinstance(look_ahead, bool):
            raise ConfigError(f"look_ahead must be True or False, not {look_ahead!r}", key="look_ahead")
        self.look_ahead = look_ahead
        if grammar is not None:
            constraints: list[CompiledGrammar] = [compile_constraint("grammar", grammar, start=start)]
            self._per_row = False
        elif regex is not None:
            constraints = [compile_constraint("regex", regex)]
            self._per_row = False
        else:
            self._per_row = isinstance(grammar_or_schema, (list, tuple))
            items: list[object] | tuple[object, ...] = (
                grammar_or_schema if isinstance(grammar_or_schema, (list, tuple)) else [grammar_or_schema])
            if not items:
                raise ConfigError("an empty list of grammars/schemas", key="grammar_or_schema")
            options = with_strict(json_options, strict)
            constraints = [self._compile(x, options) for x in items]
        self.grammars = constraints
        self.tokenizer = tokenizer
        self._vocab = vocab
        self._eos = eos_ids(tokenizer, eos_token_ids) if vocab is None else tuple(vocab.eos_token_ids)
        if pad_token_id is None and tokenizer is not None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = pad_token_id
        self.matchers: list[Matcher] = []
        self.prompt_length: int | None = None
        self._stopped: list[bool] = []  # rows that ended outside the grammar (fed padding)
        # the last input_ids seen: their bytes (a copy, safe from a caller reusing its buffer)
        # and (batch, length, dtype)
        self._prev: bytes | None = None
        self._prev_key: tuple[int, int, object] | None = None
        self._bitmask: torch.Tensor | None = None
        # forbidden ids -> the same on self._index_device
        self._index: dict[int, tuple[np.ndarray, torch.Tensor]] = {}
        self._index_device: torch.device | None = None
        # the copy returned last step, reused when nothing else holds it
        self._out: torch.Tensor | None = None
        # inplace=None: the scores the previous call was given; whether this generation copies
        self._last_in: torch.Tensor | None = None
        self._copying = True
        self._caller_keeps = False

    @staticmethod
    def _compile(x: object, json_options: JsonSchemaOptions | None) -> CompiledGrammar:
        if isinstance(x, CompiledGrammar):
            return x
        if isinstance(x, str):
            try:
                x = schema_from(x, strings_may_be_paths=False)
            except SchemaError:
                raise ConfigError("a string grammar_or_schema must be JSON Schema text (an object "
                                  "or a boolean); pass Lark text as grammar=..., a regex as "
                                  "regex=... and a schema file as a pathlib.Path",
                                  key="grammar_or_schema") from None
        return compile_constraint("json", x, json_options=json_options)

    # -- state ----------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the current generation; the next call starts from a prompt again. (Not
        needed between ``generate`` calls: a call that does not continue the previous one is
        detected and starts afresh.)"""
        self.matchers = []
        self._stopped = []
        self._prev = None
        self._prev_key = None
        self.prompt_length = None
        self._last_in = None

    @property
    def vocab(self) -> Vocabulary | None:
        """The vocabulary in use (built on the first call from the logits width)."""
        return self._vocab

    def is_finished(self, row: int) -> bool:
        """True when row ``row`` had emitted EOS (or was stopped outside the grammar) as of the
        last call. The last token ``generate`` emits is never shown to a processor, so check
        the returned sequences for EOS to know whether a row completed."""
        return self.matchers[row].is_terminated() or self._stopped[row]

    def _vocab_for(self, width: int) -> Vocabulary:
        v = self._vocab
        if v is None:
            v = vocabulary(self.tokenizer, width, self._eos)
            self._vocab = v
        if v.vocab_size != width:
            raise ConfigError(f"the logits have {width} columns but the vocabulary has "
                              f"{v.vocab_size} tokens", key="vocab")
        return v

    def _start(self, ids: np.ndarray, vocab: Vocabulary) -> None:
        batch = int(ids.shape[0])
        if self._per_row and len(self.grammars) != batch:
            raise ConfigError(f"{len(self.grammars)} grammars/schemas given for a batch of "
                              f"{batch} rows", key="grammar_or_schema")
        gs = self.grammars if self._per_row else self.grammars * batch
        matchers = [Matcher(g, vocab) for g in gs]
        if self.max_new_tokens is not None:
            from structgen.generation.loop import check_budget

            for row, m in enumerate(matchers):
                check_budget(m, self.max_new_tokens, request_index=row)
        self.matchers = matchers
        self._stopped = [False] * batch
        self.prompt_length = int(ids.shape[1])
        self._last_in = None
        self._copying = True  # the first call copies: a generation may end after it
        self._caller_keeps = False

    def _follow(self, ids: np.ndarray) -> bool:
        """Advance every row by its newest token; False when ``ids`` (numpy ``[B, L]``) does
        not continue the previous call (a new generation)."""
        key, prev_bytes = self._prev_key, self._prev
        batch, length = ids.shape
        if key is None or prev_bytes is None or key[0] != batch or key[1] != length - 1 \
                or key[2] != ids.dtype:
            return False
        head = ids[:, :-1]
        if head.tobytes() != prev_bytes:  # (one comparison; cheaper than numpy's per step)
            prev = np.frombuffer(prev_bytes, dtype=ids.dtype).reshape(batch, length - 1)
            same = (head == prev).all(axis=1)  # [B]
            # beam search reorders rows: take over the matcher of the row each one came from
            src: list[int] = []
            for i in range(batch):
                if same[i]:
                    src.append(i)
                    continue
                hit = np.flatnonzero((prev == head[i]).all(axis=1))
                if hit.size == 0:
                    return False
                src.append(int(hit[0]))
            self.matchers = [self.matchers[j].fork() for j in src]
            self._stopped = [self._stopped[j] for j in src]
        last = ids[:, -1].tolist()
        pos = int(ids.shape[1]) - 1
        for i, (m, t) in enumerate(zip(self.matchers, last)):
            if self._stopped[i] or m.is_terminated():
                continue  # a finished row: the loop feeds padding from now on
            if not m.accept_token(t):
                # stopped by something else (e.g. a stopping criterion)
                if t in self._eos or (self.pad_token_id is not None and t == int(self.pad_token_id)):
                    self._stopped[i] = True
                    continue
                raise TokenRejectedError(
                    f"token {t} at position {pos} is not allowed by the grammar (another "
                    "processor changed the scores after this one, or this processor did not "
                    "see the generation from its first step)", row=i, position=pos, token_id=t)
        return True

    # -- the processor ---------------------------------------------------------------------------
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Mask ``scores`` ``[batch, vocab]`` to the grammar-allowed tokens of each row.

        ``input_ids`` ``[batch, seq]``: the prompt on the first call, then prompt plus the
        tokens generated so far (the newest is accepted into each row's matcher). Returns the
        scores with forbidden tokens at -inf, in a copy or in place as ``inplace`` says
        (``scores`` itself when nothing is forbidden). Rows that have finished get EOS only (or
        everything, when they stopped outside the grammar) so that no row is all -inf.
        Cost per step: one cached mask per row plus one unpack on the scores' device; where
        every row allows nearly every token, setting the few forbidden logits instead.
        """
        ishape, sshape = input_ids.shape, scores.shape
        if len(ishape) != 2 or len(sshape) != 2 or ishape[0] != sshape[0]:
            raise ConfigError(f"expected input_ids [batch, seq] and scores [batch, vocab]; got "
                              f"{tuple(ishape)} and {tuple(sshape)}", key="scores")
        width = int(sshape[1])
        vocab = self._vocab
        if vocab is None or vocab.vocab_size != width:
            vocab = self._vocab_for(width)
        ids = (input_ids if input_ids.is_cpu else input_ids.cpu()).numpy()  # a view: [B, L]
        if not self._follow(ids):
            self._start(ids, vocab)
        elif self.inplace is None:
            self._check_kept(scores)
        self._prev = ids.tobytes()
        self._prev_key = (int(ishape[0]), int(ishape[1]), ids.dtype)
        rows = [None if self._stopped[i] else m for i, m in enumerate(self.matchers)]
        out = self._masked(rows, ids, scores, width)
        if self.look_ahead:
            for m in rows:
                if m is not None:
                    m.start_look_ahead()  # returns at once; ends when the matcher moves on
        return out

    def _masked(self, rows: list[Matcher | None], ids: np.ndarray, scores: torch.Tensor,
                width: int) -> torch.Tensor:
        """``scores`` with each live row's forbidden tokens at -inf (see :meth:`__call__`)."""
        few = self._forbidden(rows, ids)
        if few is not None:
            return self._set_forbidden(scores, few)
        if self.inplace is None and not self._caller_keeps:
            self._last_in = scores  # (the whole mask is applied to a copy)
        import torch

        from structgen.generation.sampling import unpack_bitmask
        batch = int(ids.shape[0])
        words = bitmask_words(width)
        bm = self._bitmask
        if bm is None or bm.shape[0] < batch or bm.shape[1] != words:
            bm = torch.empty((batch, words), dtype=torch.int32)
            self._bitmask = bm
        bm = bm[:batch]
        if self.max_new_tokens is None:
            fill_bitmasks(rows, bm)
        else:
            # tokens left, this position included (the prompt length is the same for every row)
            left = self.max_new_tokens - (int(ids.shape[1]) - int(self.prompt_length or 0))
            for i, m in enumerate(rows):
                if m is None:
                    bm[i].fill_(-1)
                else:
                    m.fill_bitmask(bm, i, budget=max(left, 1))
        allowed = unpack_bitmask(bm.to(scores.device, non_blocking=True), width)  # [B, V] bool
        if self.inplace:
            return scores.masked_fill_(~allowed, float("-inf"))
        return scores.masked_fill(~allowed, float("-inf"))

    def _check_kept(self, scores: torch.Tensor) -> None:
        """``inplace=None``, from the second call of a generation on: whether the caller kept
        the scores it passed last time (``generate(output_logits=True)`` keeps every step's;
        ``output_scores=True`` keeps what was returned, the same tensor when it was written in
        place). If it did, the rest of the generation writes into copies; else this call may
        write into ``scores``."""
        last = self._last_in
        self._last_in = None
        if last is None or self._caller_keeps:
            return
        if last.data_ptr() != scores.data_ptr() and _counts(last) != _solo_counts():
            self._caller_keeps = True
            self._copying = True
        else:  # nothing but this processor holds them, or the caller reuses one buffer
            self._copying = False

    def _forbidden(self, rows: list[Matcher | None], ids: np.ndarray) -> list[np.ndarray | None] | None:
        """Per row, the few token ids forbidden now (None for a row stopped outside the
        grammar: it allows every token); None when some row forbids many tokens, or the
        budget rule narrows its mask (then the whole masks are applied)."""
        left = None
        if self.max_new_tokens is not None:
            left = max(self.max_new_tokens - (int(ids.shape[1]) - int(self.prompt_length or 0)), 1)
        out: list[np.ndarray | None] = []
        for m in rows:
            if m is None:
                out.append(None)
                continue
            f = m.forbidden_token_ids()
            if f is None or (left is not None and m.budget_narrows(left)):
                return None
            out.append(f)
        return out

    def _set_forbidden(self, scores: torch.Tensor, few: list[np.ndarray | None]) -> torch.Tensor:
        """``scores`` with each row's ``few`` ids (None: none) at -inf, in place or in a copy
        as ``inplace`` and what the caller keeps say (``scores`` itself when nothing is
        forbidden)."""
        if len(few) == 1:  # (one row: the common case, kept short)
            if few[0] is None or not few[0].size:
                return scores
        elif not any(f is not None and f.size for f in few):
            return scores
        auto = self.inplace is None
        viewable = scores.is_cpu and not scores.requires_grad and scores.dtype in _numpy_floats()
        if self.inplace or (auto and not self._copying and viewable):
            out = scores
        elif viewable:
            out = self._copy(scores)
        else:
            out = scores.clone()
        if auto and not self._caller_keeps:
            self._last_in = scores
        device = scores.device
        if viewable:
            rows = out.numpy()  # a view: numpy's fancy assignment costs less than a torch op here
            for i, f in enumerate(few):
                if f is not None and f.size:
                    rows[i][f] = -np.inf
            return out
        if device != self._index_device:
            self._index.clear()
            self._index_device = device
        for i, f in enumerate(few):
            if f is None or not f.size:
                continue
            got = self._index.get(id(f))
            if got is None or got[0] is not f:  # made once per array (a configuration's)
                import torch

                if len(self._index) >= 256:
                    self._index.clear()
                got = self._index[id(f)] = (f, torch.tensor(f, dtype=torch.long, device=device))
            if len(few) == 1:
                out.index_fill_(1, got[1], float("-inf"))
            else:
                out[i].index_fill_(0, got[1], float("-inf"))
        return out

    def _copy(self, scores: torch.Tensor) -> torch.Tensor:
        """A copy of CPU ``scores``, written into the tensor this processor returned last time
        when nothing else holds that one any more (no reference, view or numpy array of it:
        ``generate(output_scores=True)`` keeps every step's scores, so each step then gets a new
        tensor). Copying into a warm buffer costs about half of allocating a fresh one."""
        out, self._out = self._out, None
        if out is None or out.shape != scores.shape or out.dtype != scores.dtype \
                or _counts(out) != _solo_counts():
            out = scores.clone()
        else:
            try:
                out.copy_(scores)
            except RuntimeError:  # a buffer made in inference mode, used outside it
                out = scores.clone()
        self._out = out
        return out

    def __repr__(self) -> str:
        return (f"StructgenLogitsProcessor(grammars={len(self.grammars)}, "
                f"rows={len(self.matchers)}, prompt_length={self.prompt_length})")



# transformers' LogitsProcessorList reads each processor's signature on every step
# (inspect.signature); a stored one makes that read about three times cheaper
_LogitsProcessorImpl.__call__.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    _LogitsProcessorImpl.__call__)


def _storage_uses(t: torch.Tensor) -> int:
    """How many tensors share ``t``'s storage (views and numpy arrays of it count)."""
    import torch

    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


def _counts(t: torch.Tensor) -> tuple[int, int, int] | None:
    """References to the tensor ``t`` (Python ones, C++ handles, tensors and arrays sharing
    its storage); None where this torch cannot tell. Call with ``t`` held by one local
    variable of the caller: the counts then equal :func:`_solo_counts` exactly when nothing
    else holds it."""
    try:
        # (_use_count: a private torch method its type stubs leave out)
        return sys.getrefcount(t), t._use_count(), _storage_uses(t)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return None


_SOLO: tuple[int, int, int] | None = None


def _solo_counts() -> tuple[int, int, int]:
    """:func:`_counts` of a tensor that only one local variable holds."""
    global _SOLO
    if _SOLO is None:
        import torch

        probe = torch.empty(1)
        # (where the counts are unknown, nothing compares equal: every tensor counts as held)
        _SOLO = _counts(probe) or (-1, -1, -1)
    return _SOLO


_NUMPY_FLOATS: frozenset[torch.dtype] = frozenset()


def _numpy_floats() -> frozenset[torch.dtype]:
    """The torch dtypes whose CPU tensors numpy can view (made on first use: no torch import
    before it)."""
    global _NUMPY_FLOATS
    if not _NUMPY_FLOATS:
        import torch

        _NUMPY_FLOATS = frozenset({torch.float32, torch.float64, torch.float16})
    return _NUMPY_FLOATS


_LP_CLASS: type | None = None


def _logits_processor_class() -> type:
    global _LP_CLASS
    if _LP_CLASS is None:
        from transformers import LogitsProcessor

        cls = type("StructgenLogitsProcessor", (_LogitsProcessorImpl, LogitsProcessor),
                   {"__doc__": _LogitsProcessorImpl.__doc__, "__module__": __name__,
                    "__qualname__": "StructgenLogitsProcessor"})
        _LP_CLASS = cls
    return _LP_CLASS


if TYPE_CHECKING:  # pragma: no cover
    # static tools (type checkers, the API reference) see the class under its public name
    from structgen.integrations.transformers import _LogitsProcessorImpl as StructgenLogitsProcessor
else:
    def __getattr__(name: str) -> type:
        if name == "StructgenLogitsProcessor":
            cls = _logits_processor_class()
            globals()[name] = cls
            return cls
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
