"""The step machine: one sequence's state and one batched step over many sequences.

A step of a sequence: drafters propose candidates (grammar-forced text, prompt lookup, output
n-grams, a grammar-masked draft model; see :mod:`structgen.generation.drafters`); pre-validation
cuts each to its longest grammar-valid prefix and the best one is kept; the target runs once over
``[pending] + draft`` while the matcher builds one mask per draft position plus the bonus position;
:func:`structgen.generation.verify.verify` accepts the longest prefix the target agrees with and
the KV cache keeps only what was accepted.

* :class:`Sequence` holds a sequence's prompt, grammar matcher, drafters, output and finish
  reason. Its step is split in :meth:`Sequence.prepare` (everything before the forward:
  drafting, pre-validation, the sequence's uniforms; a :class:`StepPlan`),
  :meth:`Sequence.fill_masks` (while the forward runs) and :meth:`Sequence.commit` (after
  verification). :meth:`Sequence.step` runs a whole step on the model's own single-sequence
  cache.
* :class:`StepVerifier` fills the masks of a step's plans into pooled buffers, runs the forward
  and verifies every plan in ONE call.
* :class:`BatchStep` runs one step of many sequences over a batched KV cache
  (:class:`~structgen.generation.model.BatchKV` or a backend's own): draft cut
  (:func:`cut_drafts`), masks, ONE forward over every live row, ONE verify call, commit of the
  cache, statistics. :func:`structgen.generation.loop.run_batch` and the serving engine are
  schedulers around it: which sequences are rows, and when rows join and leave.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch

from structgen.config import SpecConfig
from structgen.errors import ConfigError, TokenBudgetError
from structgen.generation.drafters import (
    Candidate,
    Drafter,
    DraftModelDrafter,
    GrammarForcedDrafter,
    NgramDrafter,
    PromptLookupDrafter,
    canonical_tokens,
)
from structgen.generation.model import BatchKV, CausalLM
from structgen.generation.pacing import SequencePacer, StepCost
from structgen.generation.results import (
    BUDGET_CLOSE,
    MAX_TOP_LOGPROBS,
    ON_BUDGET_CHOICES,
    GenerationStats,
    TokenLogprob,
    TopLogprob,
)
from structgen.generation.sampling import masked_logits
from structgen.generation.verifier import StepPlan, StepVerifier, cut_drafts, overlap_masks_enabled
from structgen.grammar.compiled import CompiledGrammar
from structgen.masks.budget import UNREACHABLE
from structgen.masks.matcher import Matcher, bitmask_words
from structgen.masks.vocab import Vocabulary

#: ``(grammar, vocabulary) -> Matcher``: how a sequence makes its matcher
MatcherFactory = Callable[[CompiledGrammar, Vocabulary], Matcher]

__all__ = ["BatchStep", "Sequence", "StepPlan", "StepVerifier", "check_budget", "cut_drafts",
           "overlap_masks_enabled"]


class Sequence:
    """State of one sequence under generation: its prompt, grammar matcher, drafters, output
    and ``finish`` reason (None while it runs), plus its statistics.

    ``on_budget`` as in :func:`~structgen.generation.loop.stream_sequence`; ``new_matcher``:
    ``(grammar, vocab) -> Matcher`` (default :class:`~structgen.masks.matcher.Matcher`).
    ``shared_prefix``: how many leading prompt tokens later requests are likely to share (the
    conversation before the last message, :func:`~structgen.generation.api.conversation_prefix`),
    passed to the model's prefill as a hint for its prefix cache.
    ``logprobs``: None (the default) records nothing; an int ``k`` (0..20) records a
    :class:`~structgen.generation.results.TokenLogprob` per committed token, with its ``k``
    most likely alternatives, in :attr:`token_logprobs` (aligned with :attr:`output`)."""

    def __init__(self, lm: CausalLM, vocab: Vocabulary, grammar: CompiledGrammar, prompt_ids: list[int],
                 cfg: SpecConfig, *, speculative: bool, max_new_tokens: int,
                 draft_lm: CausalLM | None, seed: int | None, on_budget: str = "close",
                 new_matcher: MatcherFactory | None = None, shared_prefix: int = 0,
                 logprobs: int | None = None) -> None:
        if on_budget not in ON_BUDGET_CHOICES:
            raise ValueError(f"on_budget must be one of {ON_BUDGET_CHOICES}, not {on_budget!r}")
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
            raise ConfigError(f"top_logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}, not {logprobs!r}",
                              key="top_logprobs")
        # None: no logprobs (nothing computed, the default); k: alternatives per token
        self.top_logprobs = logprobs
        self.token_logprobs: list[TokenLogprob] | None = [] if logprobs is not None else None
        self.lm = lm
        self.vocab = vocab
        self.cfg = cfg
        self.matcher = (new_matcher or Matcher)(grammar, vocab)
        self.prompt = list(prompt_ids)
        self.shared_prefix = max(0, min(int(shared_prefix), len(self.prompt) - 1))
        self.output: list[int] = []
        self.speculative = speculative
        self.max_new = max_new_tokens
        # on_budget="close": every mask obeys the budget rule (structgen.masks.budget), so the
        # output ends complete within max_new_tokens; ``closed``: the rule removed a token
        # the grammar allowed at a committed position
        self.close = on_budget == "close"
        self.closed = False
        self.stats = GenerationStats()
        self.finish: str | None = None
        self.eos = set(vocab.eos_token_ids)
        self.generator = torch.Generator().manual_seed(seed if seed is not None else
                                                       int(torch.randint(0, 2**62, (1,))))
        self.grammar_d = GrammarForcedDrafter(cfg, lm.tokenizer, vocab) if cfg.grammar_drafts else None
        self.lookup_d = PromptLookupDrafter(cfg) if cfg.prompt_lookup else None
        self.ngram_d = NgramDrafter(cfg) if cfg.prompt_lookup else None
        self.model_d = DraftModelDrafter(cfg, draft_lm, vocab) if draft_lm is not None else None
        if self.model_d is not None:
            self.model_d.reset()
        self.words = bitmask_words(lm.vocab_size)
        self.verifier: StepVerifier | None = None   # set by stream_sequence (a BatchStep has its own)
        self.pacer: SequencePacer | None = None      # set by stream_sequence (a BatchStep cuts its own)
        self.pending: int | None = None
        self._prompt_text: bytes | None = None
        # forced text -> the token split the model itself produced for it (learned online)
        self._splits: dict[bytes, tuple[int, ...]] = {}
        self._forced_at: list[tuple[int, bytes]] = []  # (output byte offset, forced text)
        self._out_bytes = 0
        self._out_ends: list[int] = [0]  # output byte offset after each output token

    def check_budget(self, request_index: int | None = None) -> None:
        """See :func:`check_budget` (with this sequence's matcher, budget and ``on_budget``)."""
        if self.close:
            check_budget(self.matcher, self.max_new, request_index=request_index)

    def _rule_budget(self) -> int | None:
        """Tokens left for the budget rule at the next position (None: the rule is off)."""
        return self.max_new - len(self.output) if self.close else None

    # -- drafting ---------------------------------------------------------------------------
    def _text_tokens(self, parts: list[tuple[Drafter, bytes]], limit: int) -> Candidate | None:
        """Tokenize the concatenated text parts; attribute each token to the part (drafter)
        holding its first byte; cut at the first grammar-invalid token.

        A leading grammar-forced part whose tokenization the model has shown before (see
        :meth:`_learn_splits`) uses the model's own split; the rest is tokenized canonically
        in the context of the committed output."""
        data = b"".join(p for _d, p in parts)
        if not data:
            return None
        toks: list[int] = []
        pending = b""  # text not yet tokenized (tokenized canonically together)
        for d, p in parts:
            if d is not self.grammar_d or not self._splits:
                pending += p
                continue
            while p:
                best = max((k for k in self._splits if p.startswith(k)), key=len, default=b"")
                if not best:
                    pending += p
                    break
                if pending:
                    toks += canonical_tokens(self.lm.tokenizer, self.vocab, self.output + toks, pending)
                    pending = b""
                toks += self._splits[best]
                p = p[len(best):]
        if pending:
            toks += canonical_tokens(self.lm.tokenizer, self.vocab, self.output + toks, pending)
        toks = toks[:limit]
        toks = toks[: self.matcher.validate_tokens(toks, budget=self._rule_budget())]
        if not toks:
            return None
        bounds = []
        acc = 0
        for d, p in parts:
            acc += len(p)
            bounds.append((acc, d))
        segs: list[tuple[Drafter, int]] = []
        pos = 0
        tb = self.vocab.token_bytes
        for t in toks:
            owner = next((d for end, d in bounds if pos < end), bounds[-1][1])
            if segs and segs[-1][0] is owner:
                segs[-1] = (owner, segs[-1][1] + 1)
            else:
                segs.append((owner, 1))
            pos += len(tb[t] or b"")
        return Candidate(toks, segs)

    def _candidates(self, limit: int) -> list[Candidate]:
        cands: list[Candidate] = []
        m = self.matcher
        if self.ngram_d is not None:  # first: _choose looks at the first few candidates only
            toks = self.ngram_d.propose(self.prompt + self.output, limit)
            if toks:
                cands.append(Candidate(toks, [(self.ngram_d, len(toks))]))
        forced = b""
        if self.grammar_d is not None and self.grammar_d.enabled:
            forced = m.forced_bytes(limit=256)
            if forced:
                self._forced_at.append((self._out_bytes, forced))
        if self.lookup_d is not None and self.lookup_d.enabled:
            out_text = self.vocab.decode_bytes([t for t in self.output if t not in self.eos])
            if self._prompt_text is None:
                self._prompt_text = self.vocab.decode_bytes(self.prompt)
            for copied in self.lookup_d.propose(m, self._prompt_text, out_text, forced, self.cfg.draft_num):
                # what the lookup drafter adds after the forced text counts as its proposal
                parts: list[tuple[Drafter | None, bytes]] = [(self.grammar_d, forced),
                                                             (self.lookup_d, copied)]
                cand = self._text_tokens([(d, p) for d, p in parts if p and d is not None], limit)
                if cand is not None:
                    cands.append(cand)
        if forced and self.grammar_d is not None:
            cand = self._text_tokens([(self.grammar_d, forced)], limit)
            if cand is not None:
                cands.append(cand)
        if self.model_d is not None and self.model_d.enabled:
            # The draft model drafts through grammar-forced text too (masked by the grammar):
            # it then picks the tokenization of that text the model family prefers, where the
            # canonical tokenization of the forced bytes may differ from the target's choice and
            # sink every model token after it.
            toks, probs = self.model_d.propose(
                m.fork(), self.prompt + self.output, min(self.model_d.length, limit),
                temperature=self.cfg.temperature, generator=self.generator, budget=self._rule_budget())
            if toks:
                cand = Candidate(list(toks), [(self.model_d, len(toks))])
                if self.cfg.temperature > 0 and probs is not None:
                    cand.probs = probs  # [len(toks), V]
                cands.append(cand)
        return cands

    def _choose(self, cands: list[Candidate]) -> Candidate | None:
        if self.cfg.temperature > 0:
            # Sampling: a draft-model proposal is verified whenever it exists, so that which
            # candidate is verified never depends on what the draft model sampled (selection
            # on sampled content would bias the proposal distribution given to the verifier).
            for c in cands:
                if c.probs is not None:
                    return c
        best: Candidate | None = None
        best_score = 0.0
        m = self.matcher
        for c in cands[: max(1, self.cfg.draft_num) + 2]:
            # pre-validation: longest grammar-valid prefix (under the budget rule, if on)
            n = m.validate_tokens(c.tokens, budget=self._rule_budget())
            if n < len(c.tokens):
                c.truncate(n)
            if not c.tokens:
                continue
            s = c.score()
            if s > best_score:
                best, best_score = c, s
        return best

    # -- one step ------------------------------------------------------------------------------
    def prepare(self) -> StepPlan | list[int]:
        """First half of a step, everything the target forward needs: the length check, the
        model-free EOS, drafting and pre-validation (the masks come later, :meth:`fill_masks`,
        while the forward runs). Returns the step's :class:`StepPlan`, or the tokens committed
        without a forward pass (``finish`` is then set)."""
        st = self.stats
        m = self.matcher
        budget = self.max_new - len(self.output)
        if budget <= 0:
            self.finish = "length"
            return []
        # a position where the grammar allows exactly one token (EOS after a complete
        # document) needs no model: plain constrained decoding could emit nothing else
        t0 = time.perf_counter()
        rule = budget if self.close else None
        allowed = m.allowed_token_ids(budget=rule) if m.is_accepting() else None
        st.time_masks += time.perf_counter() - t0
        if allowed is not None and len(allowed) == 1 and allowed[0] in self.eos:
            tok = allowed[0]
            if rule is not None and m.budget_narrows(rule):
                self.closed = True
                st.budget_narrowed += 1
            m.accept_token(tok)
            self.output.append(tok)
            if self.token_logprobs is not None:  # the only token allowed: probability 1
                self.token_logprobs.append(self._logprob_entry(tok, 0.0, [(tok, 0.0)]))
            st.new_tokens += 1
            st.free_tokens += 1
            self._stop()
            return [tok]

        # drafting + pre-validation
        t0 = time.perf_counter()
        cand: Candidate | None = None
        if self.speculative:
            limit = min(self.cfg.max_draft_tokens, budget - 1)
            if limit > 0:
                cand = self._choose(self._candidates(limit))
        draft = cand.tokens if cand is not None else []
        k = len(draft)
        st.time_drafting += time.perf_counter() - t0

        assert self.pending is not None
        uniforms = torch.rand((k + 1, 2), dtype=torch.float64, generator=self.generator)
        return StepPlan(draft, cand, uniforms, budget)

    def fill_masks(self, plan: StepPlan, bm: torch.Tensor) -> None:
        """Write the masks of every draft position plus the bonus position into ``bm``
        (int32 ``[k+1, W]``): fill -> accept -> ... -> rollback on the matcher."""
        t0 = time.perf_counter()
        m = self.matcher
        draft = plan.draft
        k = len(draft)
        plan.narrowed = []
        for i in range(k + 1):
            if self.close:  # each position under the rule at its own remaining budget
                left = plan.budget - i
                m.fill_bitmask(bm, i, budget=left)
                plan.narrowed.append(m.budget_narrows(left))
            else:
                m.fill_bitmask(bm, i)
            if i < k:
                ok = m.accept_token(draft[i])
                assert ok, "pre-validated draft rejected"
        if k:
            m.rollback(k)
        plan.bitmask = bm
        self.stats.time_masks += time.perf_counter() - t0

    def step(self) -> list[int]:
        """Run one verify step; returns the newly committed tokens (may be empty at the end)."""
        plan = self.prepare()
        if not isinstance(plan, StepPlan):
            return plan
        st = self.stats
        pacer = self.pacer
        if pacer is not None and plan.draft:
            keep = pacer.length(plan.cand, len(plan.draft))
            if keep < len(plan.draft):
                st.draft_cut += len(plan.draft) - keep
                plan.truncate(keep)
        k = len(plan.draft)
        ver = self.verifier
        assert ver is not None and self.pending is not None
        feed = [self.pending] + plan.draft
        t_step = time.perf_counter()
        # one target forward over [pending] + draft, the masks built meanwhile
        logits, dt = ver.forward_with_masks(lambda: self.lm.extend(feed, float32=False),  # [k+1, V]
                                            [self], [plan])
        st.forward_passes += 1
        st.time_forward += dt

        t0 = time.perf_counter()
        n_acc, emitted = ver.run([self], [plan], logits)[0]
        st.time_verify += time.perf_counter() - t0
        # crop the KV cache to pending + accepted drafts
        self.lm.crop(self.lm.length - (k - n_acc))
        if pacer is not None:
            pacer.observe(k + 1, time.perf_counter() - t_step, n_acc)
        return self.commit(plan, n_acc, emitted)

    def commit(self, plan: StepPlan, n_acc: int, emitted: list[int]) -> list[int]:
        """Second half of a step, after verification (``n_acc`` drafts accepted, then the
        ``emitted`` tokens): drafter bookkeeping and committing to the matcher and output.
        The caller crops the KV cache to ``1 + n_acc`` of the positions it fed."""
        st = self.stats
        m = self.matcher
        cand = plan.cand
        k = len(plan.draft)
        # bookkeeping per drafter
        if cand is not None:
            left = n_acc
            judged = True  # segments after a rejected one were never judged by the target
            for d, n in cand.segments:
                took = min(n, left)
                d.observe(n, took, judged=judged)
                judged = judged and took == n
                left -= took
            st.drafted += k
            st.accepted += n_acc

        emitted = emitted[: plan.budget]
        committed: list[int] = []
        for j, t in enumerate(emitted):
            if not m.accept_token(t):
                raise RuntimeError(f"verified token {t} rejected by the grammar")
            committed.append(t)
            if self.token_logprobs is not None:
                assert plan.logprobs is not None, "logprobs asked but not computed"
                lp, top = plan.logprobs[j]
                self.token_logprobs.append(self._logprob_entry(t, lp, top))
            if j < len(plan.narrowed) and plan.narrowed[j]:
                self.closed = True
                st.budget_narrowed += 1
            if t in self.eos:
                self._stop()
                break
        st.bonus += int(len(committed) > n_acc)  # the verifier's own token (not cut by a drafted EOS)
        self.output.extend(committed)
        self._learn_splits(committed)
        st.new_tokens += len(committed)
        if self.finish is None and len(committed) < len(emitted):
            self._stop()
        self.pending = committed[-1] if committed else self.pending
        if self.finish is None and len(self.output) >= self.max_new:
            self.finish = "length"
        return committed

    def _token_text(self, tok: int) -> tuple[str, bytes]:
        """A token's text and bytes for a logprob entry (a special token: its tokenizer name)."""
        data = self.vocab.token_bytes[tok] if tok < len(self.vocab.token_bytes) else None
        if data is None:
            text = self.lm.tokenizer.decode([tok], skip_special_tokens=False)
            return text, text.encode("utf-8")
        return data.decode("utf-8", errors="replace"), data

    def _logprob_entry(self, tok: int, logprob: float, top: list[tuple[int, float]]) -> TokenLogprob:
        """The :class:`TokenLogprob` of committed token ``tok`` (``top`` cut to what was asked)."""
        alts = []
        for t, lp in top[: self.top_logprobs or 0]:
            text, data = self._token_text(t)
            alts.append(TopLogprob(t, text, data, lp))
        text, data = self._token_text(tok)
        return TokenLogprob(tok, text, data, logprob, tuple(alts))

    def _stop(self) -> None:
        """The sequence ended with EOS: ``"budget_close"`` where the budget rule steered it."""
        self.finish = BUDGET_CLOSE if self.closed else "stop"
        self.stats.budget_closes += int(self.closed)

    def _learn_splits(self, committed: list[int]) -> None:
        """Record how the model tokenized grammar-forced text: when the output now covers a
        forced text that began and ended on token boundaries, remember that token split."""
        tb = self.vocab.token_bytes
        for t in committed:
            self._out_bytes += len(tb[t] or b"")
            self._out_ends.append(self._out_bytes)
        keep: list[tuple[int, bytes]] = []
        ends = self._out_ends
        for start, text in self._forced_at:
            stop = start + len(text)
            if stop > self._out_bytes:
                keep.append((start, text))
                continue
            try:
                i = ends.index(start)
                j = ends.index(stop)
            except ValueError:
                continue  # the model's tokens straddle the forced text's edges
            self._splits[text] = tuple(self.output[i:j])
        self._forced_at = keep

    def draft_probs(self, cand: Candidate | None) -> torch.Tensor | None:
        """The candidate's draft distributions ``[k, V_draft]`` as the draft model gave them
        (None: deterministic proposals); :meth:`StepVerifier.run` copies them into its
        pooled ``[N, V_target]`` rows."""
        if cand is None or cand.probs is None or self.cfg.temperature <= 0:
            return None
        return cand.probs

    def lossy_accept(self, draft: list[int], logits: torch.Tensor, bm: torch.Tensor, n_acc: int,
               emitted: list[int]) -> tuple[int, list[int]]:
        """Opt-in LOSSY typical acceptance (``verify_threshold``): beyond the exact verdict,
        keep accepting draft tokens whose masked target probability is at least
        ``threshold`` times the top token's. Changes the output distribution."""
        thr = float(self.cfg.verify_threshold or 1.0)
        k = len(draft)
        scaled = masked_logits(logits.float(), bm[: k + 1]) / max(self.cfg.temperature, 1e-5)
        probs = torch.softmax(scaled, -1)
        i = n_acc
        while i < k and float(probs[i, draft[i]]) >= thr * float(probs[i].max()):
            i += 1
        if i == n_acc:
            return n_acc, emitted
        nxt = int(torch.argmax(probs[i])) if i < k else int(torch.argmax(probs[k]))
        return i, draft[:i] + [nxt]

    def prefill(self) -> None:
        """Feed the prompt but its last token to the model's own cache (the last one is the
        first step's ``pending`` token); the prefix-cache hint is :attr:`shared_prefix`."""
        t0 = time.perf_counter()
        self.lm.prefill(self.prompt[:-1], shared_prefix=self.shared_prefix)
        self.pending = self.prompt[-1]
        self.stats.time_prefill += time.perf_counter() - t0

    def finalize_stats(self) -> None:
        """Copy each drafter's own counters into the statistics (at the end of the sequence)."""
        for d in (self.grammar_d, self.lookup_d, self.ngram_d, self.model_d):
            if d is not None:
                self.stats.drafters[d.name] = d.stats()



def check_budget(matcher: Matcher, max_new_tokens: int, *, request_index: int | None = None) -> None:
    """Raise :class:`~structgen.errors.TokenBudgetError` when ``max_new_tokens`` is below what
    the budget rule (``on_budget="close"``) needs from ``matcher``'s state: the greedy
    tokenization of the shortest completion, plus EOS. Counts no further than
    ``max_new_tokens``, so the check costs about the budget's worth of tokens however long the
    shortest output is; the error's ``needed`` is then a lower bound. Raises
    :class:`~structgen.errors.CompileLimitError` for a constraint whose automaton is too large
    to measure."""
    need = matcher.tokens_to_finish(limit=max_new_tokens)
    if need > max_new_tokens:
        # above the budget the count may have stopped early: "at least" is all that is known
        what = (f"needs more than {max_new_tokens} tokens (at least {need}: its shortest output, "
                "tokenized greedily, plus EOS)"
                if need <= UNREACHABLE else "has no shortest output this vocabulary spells token by token")
        raise TokenBudgetError(f"max_new_tokens={max_new_tokens} is too small: the constraint {what}; "
                               "raise max_new_tokens, or pass on_budget='cut' to allow cut-short outputs",
                               needed=need, max_new_tokens=max_new_tokens, request_index=request_index)


class BatchStep:
    """One step of many sequences over one batched KV cache (:class:`~structgen.generation.model.BatchKV`,
    or the backend's own ``lm.new_batch_cache()``): the step machine the batched drivers share.

    Row ``r`` of :attr:`kv` holds the ``r``-th sequence a caller passes; the caller decides
    which sequences are rows (:meth:`prefill`, :meth:`join`, :meth:`select`) and calls
    :meth:`run` for each step with the plans of :meth:`prepare`. A step cuts the drafts to the
    common length worth a longer pass (``cut``; :func:`cut_drafts` with the cost model
    ``cost``, fitted to the step times), builds every row's masks while ONE target forward runs
    over every row's ``[pending] + draft``, verifies every row in ONE call
    (:class:`StepVerifier`, sized for ``capacity`` rows), keeps each row's accepted positions in
    the cache and commits each sequence. ``speculative=False``: every draft is empty (plain
    constrained decoding). The batch's own counters: :attr:`passes` (target forwards) and the
    wall-clock seconds of the forwards and the verify calls."""

    def __init__(self, lm: CausalLM, cfg: SpecConfig, capacity: int, *, speculative: bool = True,
                 cut: bool = True, cost: StepCost | None = None) -> None:
        self.lm = lm
        self.capacity = capacity
        self.speculative = speculative
        self.cut = cut
        self.verifier = StepVerifier(cfg, lm.vocab_size, lm.device, capacity)
        self.cost = cost if cost is not None else StepCost()
        self.kv: BatchKV | None = None
        self.passes = 0
        self.time_forward = 0.0
        self.time_verify = 0.0

    def prefill(self, seqs: list[Sequence]) -> float:
        """Start a fresh cache whose rows are ``seqs`` (each prompt but its last token, with its
        :attr:`Sequence.shared_prefix` hint); returns the seconds it took."""
        self.kv = BatchKV(self.lm, rows=self.capacity)
        t0 = time.perf_counter()
        self.kv.prefill([s.prompt[:-1] for s in seqs], shared=[s.shared_prefix for s in seqs])
        for s in seqs:
            s.pending = s.prompt[-1]
        return time.perf_counter() - t0

    def join(self, seqs: list[Sequence]) -> bool:
        """Add ``seqs`` as new rows after those held, between two steps (a fresh cache when none
        is held). Returns False, with nothing done, when the cache cannot take rows while others
        run (the caller waits for the batch to empty)."""
        if self.kv is None:
            self.prefill(seqs)
            return True
        join = getattr(self.kv, "join", None)
        if join is None or not join([s.prompt[:-1] for s in seqs], shared=[s.shared_prefix for s in seqs]):
            return False
        for s in seqs:
            s.pending = s.prompt[-1]
        return True

    @property
    def cache(self) -> BatchKV:
        """The batched cache (after :meth:`prefill` or :meth:`join`)."""
        assert self.kv is not None, "no batched cache: prefill() or join() first"
        return self.kv

    def select(self, rows: list[int]) -> None:
        """Keep only the given rows of the cache, in that order (the others' sequences left)."""
        self.cache.select(rows)

    def drop(self) -> None:
        """Forget the cache (every row left): the next :meth:`join` starts a fresh one."""
        self.kv = None

    def compact(self) -> None:
        """Squeeze the holes rejected drafts left in the cache, where they are many."""
        self.cache.compact(0.5)

    @staticmethod
    def prepare(seqs: list[Sequence]) -> list[StepPlan | list[int]]:
        """Each sequence's :meth:`Sequence.prepare`: its plan, or the tokens it committed without a
        forward pass (it then finished, and its row must leave before :meth:`run`)."""
        return [s.prepare() for s in seqs]

    def run(self, seqs: list[Sequence], plans: list[StepPlan]) -> list[list[int]]:
        """One step of every row (``seqs[r]`` is row ``r``, ``plans[r]`` its plan): draft cut,
        masks, ONE forward, ONE verify, the cache committed to each row's accepted positions and
        each sequence committed. Returns each sequence's newly committed tokens."""
        if self.speculative and self.cut:
            before = [len(p.draft) for p in plans]
            cut_drafts(plans, self.cost)
            for s, k, p in zip(seqs, before, plans):
                s.stats.draft_cut += k - len(p.draft)
        feed: list[list[int]] = []
        for s, p in zip(seqs, plans):
            assert s.pending is not None
            feed.append([s.pending] + p.draft)
        ver = self.verifier
        kv = self.cache
        logits, dt_f = ver.forward_with_masks(functools.partial(kv.extend, feed, float32=False),
                                              seqs, plans)                               # [sum(k+1), V]
        self.cost.add(len(seqs) * max(len(p.draft) + 1 for p in plans), dt_f)
        t0 = time.perf_counter()
        results = ver.run(seqs, plans, logits)
        kv.commit([1 + n_acc for n_acc, _ in results])
        dt_v = time.perf_counter() - t0
        self.passes += 1
        self.time_forward += dt_f
        self.time_verify += dt_v
        out = []
        for s, p, (n_acc, emitted) in zip(seqs, plans, results):
            st = s.stats
            st.forward_passes += 1
            st.time_forward += dt_f
            st.time_verify += dt_v
            out.append(s.commit(p, n_acc, emitted))
        return out
