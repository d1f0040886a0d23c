"""The generation loop: drafts -> pre-validation -> one target forward -> exact verify.

Each step of a sequence (:func:`run_sequence`; :func:`run_batch` runs the steps of many
sequences together, see below):

1. drafters propose candidates (grammar-forced text in canonical tokenization, prompt
   lookup continuations, output n-grams, a grammar-masked draft model), composed as forced +
   continuation;
2. pre-validation cuts every candidate to its longest grammar-valid prefix on the CPU and
   picks the one with the best expected acceptance; pacing (:mod:`structgen.generation.pacing`)
   cuts it to the length worth a longer pass; the matcher builds one mask per draft
   position plus the bonus position (fill -> accept -> ... -> rollback);
3. the target model runs once over ``[pending] + draft`` with its KV cache;
4. :func:`structgen.generation.verify.verify` accepts the longest prefix the target agrees with
   (greedy: masked argmax equality; sampling: rejection sampling) and emits the recovered
   or bonus token; the KV cache is cropped to the accepted prefix (nothing recomputed).

With ``speculative=False`` the same loop runs with empty drafts: plain grammar-constrained
decoding, the baseline. Greedy output is identical in both modes; sampled output has the
same distribution. A position where the grammar allows exactly one token (e.g. EOS after
a complete document) is committed without a forward pass (that is what plain constrained
decoding would emit too).

The step machine is :mod:`structgen.generation.step` (:class:`~structgen.generation.step.Sequence`,
:class:`~structgen.generation.step.BatchStep`); this module drives it. :func:`stream_sequence`
and :func:`run_sequence` step one sequence on the model's own cache. :func:`run_batch` runs a
micro-batch: every step of its live sequences is ONE
:class:`~structgen.generation.step.BatchStep` (one batched target forward over a
:class:`structgen.generation.model.BatchKV`, one verify call over the flattened drafts); each
sequence keeps its own matcher, drafters and statistics.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator
from dataclasses import dataclass

from structgen.config import SpecConfig
from structgen.generation.model import CausalLM, check_context
from structgen.generation.pacing import SequencePacer, StepCost, pacing_prior, shared_step_cost
from structgen.generation.results import GenerationStats, SequenceResult
from structgen.generation.step import (
    BatchStep,
    MatcherFactory,
    Sequence,
    StepPlan,
    StepVerifier,
    check_budget,
)
from structgen.grammar.compiled import CompiledGrammar
from structgen.masks.vocab import Vocabulary

__all__ = ["BatchStats", "GenerationStats", "SequenceResult", "check_budget", "run_batch", "run_sequence",
           "sequence_result", "stream_sequence"]


def stream_sequence(lm: CausalLM, vocab: Vocabulary, grammar: CompiledGrammar, prompt_ids: list[int],
                    cfg: SpecConfig, *, speculative: bool = True, max_new_tokens: int = 256,
                    draft_lm: CausalLM | None = None, seed: int | None = None, on_budget: str = "close",
                    new_matcher: MatcherFactory | None = None, shared_prefix: int = 0,
                    logprobs: int | None = None) -> Iterator[tuple[list[int], Sequence]]:
    """Yield ``(committed_tokens, state)`` after every verify step. ``on_budget``: ``"close"``
    keeps every output complete within ``max_new_tokens`` (raises
    :class:`~structgen.errors.TokenBudgetError` up front when it cannot be); ``"cut"`` stops
    at the budget wherever the output is (``finish_reason="length"``). ``new_matcher``:
    ``(grammar, vocab) -> Matcher`` (default :class:`~structgen.masks.matcher.Matcher`), e.g.
    a :class:`~structgen.masks.capped.CappedMatcher` for a thinking budget. ``shared_prefix``:
    the prompt's leading tokens later calls are likely to share
    (:func:`~structgen.generation.api.conversation_prefix`), a hint for the model's prefix
    cache. ``logprobs``: None records nothing (the default, no cost); ``k`` in 0..20 records
    each committed token's log-probability and its ``k`` most likely alternatives in
    ``state.token_logprobs`` (see :class:`~structgen.generation.results.TokenLogprob`)."""
    if not prompt_ids:
        raise ValueError("the prompt must contain at least one token")
    check_context(lm, len(prompt_ids), max_new_tokens, draft_lm=draft_lm)
    seq = Sequence(lm, vocab, grammar, prompt_ids, cfg, speculative=speculative,
                   max_new_tokens=max_new_tokens, draft_lm=draft_lm, seed=seed, on_budget=on_budget,
                   new_matcher=new_matcher, shared_prefix=shared_prefix, logprobs=logprobs)
    seq.check_budget()
    seq.verifier = StepVerifier(cfg, lm.vocab_size, lm.device, 1)
    if speculative and SEQUENCE_PACING and (cfg.temperature <= 0 or seed is None):
        # (seeded sampling keeps whole drafts: its draws then never depend on measured times)
        seq.pacer = SequencePacer(shared_step_cost(lm, pacing_prior(lm.device)))
    t_start = time.perf_counter()
    seq.prefill()
    while seq.finish is None:
        new = seq.step()
        if new and seq.stats.time_to_first_token is None:
            seq.stats.time_to_first_token = time.perf_counter() - t_start
        seq.stats.time_total = time.perf_counter() - t_start
        yield new, seq
    seq.stats.time_total = time.perf_counter() - t_start
    seq.finalize_stats()


def run_sequence(lm: CausalLM, vocab: Vocabulary, grammar: CompiledGrammar, prompt_ids: list[int],
                 cfg: SpecConfig, *, speculative: bool = True, max_new_tokens: int = 256,
                 draft_lm: CausalLM | None = None, seed: int | None = None, on_budget: str = "close",
                 new_matcher: MatcherFactory | None = None, shared_prefix: int = 0,
                 logprobs: int | None = None) -> SequenceResult:
    """Generate one sequence to the end (see :func:`stream_sequence` for the keywords) and
    return its :class:`SequenceResult`."""
    seq = None
    for _new, state in stream_sequence(lm, vocab, grammar, prompt_ids, cfg, speculative=speculative,
                                       max_new_tokens=max_new_tokens, draft_lm=draft_lm, seed=seed,
                                       on_budget=on_budget, new_matcher=new_matcher,
                                       shared_prefix=shared_prefix, logprobs=logprobs):
        seq = state
    assert seq is not None
    return sequence_result(seq)


# run_batch and the serving engine cut the drafts of a step to the common length with the best
# expected tokens per unit of forward time (see structgen.generation.pacing); False feeds every
# pre-validated draft whole
BATCH_DRAFT_CUT = True
# one-at-a-time generation cuts each step's draft likewise (SequencePacer: greedy, or sampling
# without a seed); False sends every pre-validated draft whole
SEQUENCE_PACING = True


def sequence_result(seq: Sequence) -> SequenceResult:
    """The :class:`SequenceResult` of a finished (or stopped) sequence: its output decoded."""
    text_tokens = [t for t in seq.output if t not in seq.eos]
    data = seq.vocab.decode_bytes(text_tokens)
    text = codecs.decode(data, "utf-8", errors="replace")
    return SequenceResult(seq.output, text, seq.finish or "stop", seq.stats,
                          None if seq.token_logprobs is None else list(seq.token_logprobs))


@dataclass
class BatchStats(GenerationStats):
    """Counters of a batched call: token and draft counts summed over its sequences.

    Unlike a plain sum of the sequences' stats, ``forward_passes`` counts the batched target
    forwards actually run (one per step of a micro-batch, whatever its size), and the times are
    the call's wall-clock time per phase: ``time_total`` is the whole call, so
    ``tokens_per_second`` is the batch's throughput. ``row_forward_passes`` is the sum over
    sequences of the forwards each took part in (what the per-sequence stats count);
    ``real_positions`` / ``padded_positions`` count the positions fed to the target that
    belonged to a sequence / only squared the batch (prefill included).
    """

    sequences: int = 0
    micro_batches: int = 0
    row_forward_passes: int = 0
    real_positions: int = 0
    padded_positions: int = 0

    def add(self, other: BatchStats) -> None:
        """Add another micro-batch's counters (times add up: micro-batches run one after another)."""
        self.merge(other)
        for k in ("sequences", "micro_batches", "row_forward_passes", "real_positions",
                  "padded_positions"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        if other.time_to_first_token is not None and self.time_to_first_token is None:
            self.time_to_first_token = other.time_to_first_token


def run_batch(lm: CausalLM, vocab: Vocabulary, grammars: list[CompiledGrammar], prompts: list[list[int]],
              cfg: SpecConfig, *, speculative: bool = True, max_new_tokens: int | list[int] = 256,
              draft_lm: CausalLM | None = None, seeds: list[int | None] | None = None,
              configs: list[SpecConfig] | None = None, on_budget: str = "close",
              shared_prefixes: list[int] | None = None,
              logprobs: int | list[int | None] | None = None) -> tuple[list[SequenceResult], BatchStats]:
    """Generate for several prompts together (one micro-batch; mixed grammars allowed).

    Every step is ONE :class:`~structgen.generation.step.BatchStep`: ONE batched target forward
    for all live sequences (:class:`~structgen.generation.model.BatchKV`: left padding, per-row
    holes for rejected drafts, explicit position ids) and ONE verify call over the flattened
    drafts; each sequence keeps its own matcher, drafters, random
    generator and statistics, so its output is what :func:`run_sequence` produces for it
    alone (greedy: token-identical barring argmax near-ties that the float rounding of
    differently shaped batched matmuls could flip). Finished sequences leave the batch. A
    draft model, if any, runs per sequence (its own cache).

    Every row is padded to the step's longest draft, so on a compute-bound device a padded or
    unlikely draft position costs as much as a sure one: the drafts of a step are cut to the
    common length with the best expected tokens per second (:data:`BATCH_DRAFT_CUT`; a cost
    model fitted online to the step times). Cutting a pre-validated draft is lossless for
    greedy decoding and keeps sampling exact; sampled tokens then differ from the run alone
    with the same seed (same distribution; with the cut off they are the same draws). When
    sampling with every seed given, the cost model keeps its prior instead of fitting measured
    times, so the cuts (and so the draws) do not depend on timing: the same seeds give the same
    tokens on every run.

    ``configs`` (one per prompt; default: ``cfg`` for all) give each sequence its own sampling
    options, ``temperature`` and ``top_p``: its drafting and acceptance use them, and they reach
    :func:`~structgen.generation.verify.verify` as that sequence's row of the per-sequence
    ``temperature`` / ``top_p`` tensors (0: that row is greedy), so each sequence gets the
    distribution it would get alone. Every other option is the batch's ``cfg``.

    ``max_new_tokens`` may be a list (one budget per prompt); ``on_budget`` as in
    :func:`stream_sequence`, each sequence under the rule at its own remaining budget (every
    budget is checked before anything is generated). ``shared_prefixes``: per prompt, the
    prefix-cache hint of :func:`stream_sequence`'s ``shared_prefix``. ``logprobs``: as in
    :func:`stream_sequence`, for every prompt or one value per prompt (a list).

    Returns the per-sequence results (in prompt order) and the batch's :class:`BatchStats`.
    """
    n = len(prompts)
    if len(grammars) != n:
        raise ValueError(f"{len(grammars)} grammars for {n} prompts")
    if any(not p for p in prompts):
        raise ValueError("every prompt must contain at least one token")
    budgets = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * n
    if len(budgets) != n:
        raise ValueError(f"{len(budgets)} max_new_tokens values for {n} prompts")
    for i, p in enumerate(prompts):  # all of them before any generation
        check_context(lm, len(p), budgets[i], draft_lm=draft_lm, request_index=i)
    seeds = list(seeds) if seeds is not None else [None] * n
    cfgs = list(configs) if configs is not None else [cfg] * n
    if len(cfgs) != n:
        raise ValueError(f"{len(cfgs)} configs for {n} prompts")
    shared = list(shared_prefixes) if shared_prefixes is not None else [0] * n
    if len(shared) != n:
        raise ValueError(f"{len(shared)} shared_prefixes for {n} prompts")
    lps = list(logprobs) if isinstance(logprobs, (list, tuple)) else [logprobs] * n
    if len(lps) != n:
        raise ValueError(f"{len(lps)} logprobs values for {n} prompts")
    t_start = time.perf_counter()
    seqs = [
        Sequence(lm, vocab, g, p, c, speculative=speculative, max_new_tokens=b,
                 draft_lm=(CausalLM(draft_lm.model, draft_lm.tokenizer) if draft_lm is not None
                           else None),
                 seed=sd, on_budget=on_budget, shared_prefix=sh, logprobs=lp)
        for g, p, sd, c, b, sh, lp in zip(grammars, prompts, seeds, cfgs, budgets, shared, lps)
    ]
    for i, s in enumerate(seqs):
        s.check_budget(request_index=i if n > 1 else None)
    bst = BatchStats(sequences=n, micro_batches=1 if n else 0)
    if not n:
        return [], bst
    seeded = any(c.temperature > 0 for c in cfgs) and all(sd is not None for sd in seeds)
    step = BatchStep(lm, cfg, n, speculative=speculative, cut=BATCH_DRAFT_CUT, cost=StepCost(fixed=seeded))
    t_prefill = step.prefill(seqs)
    for s in seqs:
        s.stats.time_prefill += t_prefill

    def committed(s: Sequence, new: list[int]) -> None:
        now = time.perf_counter() - t_start
        if new and s.stats.time_to_first_token is None:
            s.stats.time_to_first_token = now
        s.stats.time_total = now

    live = list(range(n))  # live[r] is the sequence held in row r of the batched cache
    while live:
        plans: dict[int, StepPlan] = {}
        for i, prep in zip(live, step.prepare([seqs[i] for i in live])):
            if isinstance(prep, StepPlan):
                plans[i] = prep
            else:  # finished without a forward pass
                committed(seqs[i], prep)
        if len(plans) < len(live):
            step.select([r for r, i in enumerate(live) if i in plans])
            live = [i for i in live if i in plans]
            if not live:
                break
        news = step.run([seqs[i] for i in live], [plans[i] for i in live])
        for i, new in zip(live, news):
            committed(seqs[i], new)
        still = [r for r, i in enumerate(live) if seqs[i].finish is None]
        if len(still) < len(live):
            step.select(still)
            live = [live[r] for r in still]
        else:
            step.compact()

    out: list[SequenceResult] = []
    for s in seqs:
        s.finalize_stats()
        bst.merge(s.stats)
        bst.row_forward_passes += s.stats.forward_passes
        out.append(sequence_result(s))
    # merge() summed the sequences' forward counts and times; the batch's own are wall-clock
    # (masks and drafting stay summed: that CPU work runs one sequence after another)
    bst.forward_passes = step.passes
    bst.time_prefill, bst.time_forward, bst.time_verify = t_prefill, step.time_forward, step.time_verify
    bst.time_total = time.perf_counter() - t_start
    firsts = [s.stats.time_to_first_token for s in seqs if s.stats.time_to_first_token is not None]
    bst.time_to_first_token = min(firsts) if firsts else None
    bst.real_positions, bst.padded_positions = step.cache.real_positions, step.cache.padded_positions
    return out, bst
