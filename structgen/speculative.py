"""The generation loop: drafts -> pre-validation -> one target forward -> exact verify.

One sequence at a time (a batch is a list of these, see :mod:`structgen.api`):

1. drafters propose candidates (grammar-forced text in canonical tokenization, prompt
   lookup continuations, a grammar-masked draft model), composed as forced + continuation;
2. pre-validation cuts every candidate to its longest grammar-valid prefix on the CPU and
   picks the one with the best expected acceptance; the matcher builds one mask per draft
   position plus the bonus position (fill -> accept -> ... -> rollback);
3. the target model runs once over ``[pending] + draft`` with its KV cache;
4. :func:`structgen.verify.verify` accepts the longest prefix the target agrees with
   (greedy: masked argmax equality; sampling: rejection sampling) and emits the recovered
   or bonus token; the KV cache is cropped to the accepted prefix (nothing recomputed).

With ``speculative=False`` the same loop runs with empty drafts: plain grammar-constrained
decoding, the baseline. Greedy output is identical in both modes; sampled output has the
same distribution. A position where the grammar allows exactly one token (e.g. EOS after
a complete document) is committed without a forward pass (that is what plain constrained
decoding would emit too).
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .automaton import CompiledGrammar
from .config import SpecConfig
from .drafters import Candidate, DraftModelDrafter, GrammarForcedDrafter, PromptLookupDrafter
from .matcher import Matcher, bitmask_words
from .model import CausalLM

__all__ = ["GenerationStats", "SequenceResult", "run_sequence", "stream_sequence"]


@dataclass
class GenerationStats:
    """Counters for one call (or summed over a batch).

    acceptance per drafter = accepted / proposed draft tokens (pre-validated tokens that
    were sent to the target). ``tokens_per_pass`` = generated tokens / target forward passes.
    """

    forward_passes: int = 0
    new_tokens: int = 0
    free_tokens: int = 0  # tokens committed without a forward pass (grammar allowed only one)
    drafted: int = 0
    accepted: int = 0
    bonus: int = 0  # recovered or bonus tokens emitted by verification
    drafters: dict[str, dict[str, Any]] = field(default_factory=dict)
    time_masks: float = 0.0
    time_drafting: float = 0.0
    time_forward: float = 0.0
    time_verify: float = 0.0
    time_prefill: float = 0.0
    time_total: float = 0.0
    time_to_first_token: float | None = None

    @property
    def tokens_per_pass(self) -> float:
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items()}
        d["tokens_per_pass"] = self.tokens_per_pass
        d["acceptance"] = self.acceptance
        d["tokens_per_second"] = self.tokens_per_second
        return d

    def merge(self, other: GenerationStats) -> None:
        for k in ("forward_passes", "new_tokens", "free_tokens", "drafted", "accepted", "bonus",
                  "time_masks", "time_drafting", "time_forward", "time_verify", "time_prefill",
                  "time_total"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for name, st in other.drafters.items():
            mine = self.drafters.setdefault(name, {"proposed": 0, "accepted": 0})
            mine["proposed"] += st["proposed"]
            mine["accepted"] += st["accepted"]
            mine["acceptance"] = mine["accepted"] / mine["proposed"] if mine["proposed"] else None


@dataclass
class SequenceResult:
    tokens: list[int]
    text: str
    finish_reason: str  # "stop" (EOS / grammar complete) | "length" | "error"
    stats: GenerationStats


class _Sequence:
    """State of one sequence under generation."""

    def __init__(self, lm: CausalLM, vocab: Any, grammar: CompiledGrammar, prompt_ids: list[int],
                 cfg: SpecConfig, *, speculative: bool, max_new_tokens: int,
                 draft_lm: CausalLM | None, seed: int | None) -> None:
        self.lm = lm
        self.vocab = vocab
        self.cfg = cfg
        self.matcher = Matcher(grammar, vocab)
        self.prompt = list(prompt_ids)
        self.output: list[int] = []
        self.speculative = speculative
        self.max_new = max_new_tokens
        self.stats = GenerationStats()
        self.finish: str | None = None
        self.eos = set(vocab.eos_token_ids)
        self.generator = torch.Generator().manual_seed(seed if seed is not None else
                                                       int(torch.randint(0, 2**62, (1,))))
        self.grammar_d = GrammarForcedDrafter(cfg, lm.tokenizer, vocab) if cfg.grammar_drafts else None
        self.lookup_d = PromptLookupDrafter(cfg) if cfg.prompt_lookup else None
        self.model_d = DraftModelDrafter(cfg, draft_lm, vocab) if draft_lm is not None else None
        if self.model_d is not None:
            self.model_d.reset()
        self.words = bitmask_words(lm.vocab_size)
        self.bitmask = torch.zeros((cfg.max_draft_tokens + 1, self.words), dtype=torch.int32)
        self.pending: int | None = None
        self._prompt_text: bytes | None = None
        # forced text -> the token split the model itself produced for it (learned online)
        self._splits: dict[bytes, tuple[int, ...]] = {}
        self._forced_at: list[tuple[int, bytes]] = []  # (output byte offset, forced text)
        self._out_bytes = 0
        self._out_ends: list[int] = [0]  # output byte offset after each output token

    # -- drafting ---------------------------------------------------------------------------
    def _text_tokens(self, parts: list[tuple[Any, bytes]], limit: int) -> Candidate | None:
        """Tokenize the concatenated text parts; attribute each token to the part (drafter)
        holding its first byte; cut at the first grammar-invalid token.

        A leading grammar-forced part whose tokenization the model has shown before (see
        :meth:`_learn_splits`) uses the model's own split; the rest is tokenized canonically
        in the context of the committed output."""
        from .drafters import canonical_tokens

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
        toks = toks[: self.matcher.validate_tokens(toks)]
        if not toks:
            return None
        bounds = []
        acc = 0
        for d, p in parts:
            acc += len(p)
            bounds.append((acc, d))
        segs: list[tuple[Any, int]] = []
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
        from .drafters import cut_value

        cands: list[Candidate] = []
        m = self.matcher
        forced = b""
        if self.grammar_d is not None and self.grammar_d.enabled:
            forced = m.forced_bytes(limit=256)
            if forced:
                self._forced_at.append((self._out_bytes, forced))
        if self.lookup_d is not None and self.lookup_d.enabled:
            out_text = self.vocab.decode_bytes([t for t in self.output if t not in self.eos])
            if self._prompt_text is None:
                self._prompt_text = self.vocab.decode_bytes(self.prompt)
            source = self._prompt_text + out_text
            conts = self.lookup_d.continuations(source, out_text + forced, self.cfg.draft_num)
            if not conts:  # at a value's start: what follows the property's name in the prompt
                conts = self.lookup_d.key_continuations(self._prompt_text, out_text + forced,
                                                        self.cfg.draft_num)
            for cont in conts:
                seg, bounded = cut_value(cont)
                n = m.viable_prefix_length(forced + seg) - len(forced)
                cut_by_grammar = n < len(seg)
                seg = seg[: max(n, 0)]
                tail = b""
                if bounded or cut_by_grammar:
                    # the copied value ends here: close it and add what the grammar forces next
                    for close in (b'"', b",", b"}", b"]"):
                        probe = forced + seg + close
                        if m.viable_prefix_length(probe) == len(probe):
                            tail = close + m.forced_bytes(limit=256, after=probe)
                            break
                if not seg and not cut_by_grammar:
                    continue  # nothing copied: closing the value here is a blind guess
                # the closing and what follows it are right only if the copied value is: they
                # count as the lookup drafter's proposal
                parts = [(self.grammar_d, forced), (self.lookup_d, seg + tail)]
                cand = self._text_tokens([(d, p) for d, p in parts if p], limit)
                if cand is not None:
                    cands.append(cand)
        if forced:
            cand = self._text_tokens([(self.grammar_d, forced)], limit)
            if cand is not None:
                cands.append(cand)
        rest = limit
        if self.model_d is not None and self.model_d.enabled:
            ftoks = cands[-1].tokens if (forced and cands) else []
            rest = limit - len(ftoks)
            if rest > 0:
                fm = m.fork()
                fm.accept_tokens(ftoks)
                context = self.prompt + self.output + ftoks
                toks, probs = self.model_d.propose(
                    fm, context, min(self.model_d.length, rest),
                    temperature=self.cfg.temperature, generator=self.generator)
                if toks:
                    segs = [(self.grammar_d, len(ftoks))] if ftoks else []
                    cand = Candidate(ftoks + toks, segs + [(self.model_d, len(toks))])  # type: ignore[list-item]
                    if self.cfg.temperature > 0 and probs is not None:
                        # forced tokens are deterministic proposals: point masses  [len(ftoks), V]
                        point = torch.zeros((len(ftoks), probs.shape[1]), dtype=probs.dtype)
                        if ftoks:
                            point[torch.arange(len(ftoks)), torch.tensor(ftoks)] = 1.0
                        cand.probs = torch.cat([point, probs])  # [len(ftoks) + len(toks), V]
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
            n = m.validate_tokens(c.tokens)  # pre-validation: longest grammar-valid prefix
            if n < len(c.tokens):
                c.tokens = c.tokens[:n]
                if c.probs is not None:
                    c.probs = c.probs[:n]
                segs = []
                left = n
                for d, k in c.segments:
                    take = min(k, left)
                    if take:
                        segs.append((d, take))
                    left -= take
                c.segments = segs
            if not c.tokens:
                continue
            s = c.score()
            if s > best_score:
                best, best_score = c, s
        return best

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> list[int]:
        """Run one verify step; returns the newly committed tokens (may be empty at the end)."""
        from .verify import verify

        st = self.stats
        m = self.matcher
        budget = self.max_new - len(self.output)
        if budget <= 0:
            self.finish = "length"
            return []
        # a position where the grammar allows exactly one token (EOS after a complete
        # document) needs no model: plain constrained decoding could emit nothing else
        t0 = time.perf_counter()
        allowed = m.allowed_token_ids() if m.is_accepting() else None
        st.time_masks += time.perf_counter() - t0
        if allowed is not None and len(allowed) == 1 and allowed[0] in self.eos:
            tok = allowed[0]
            m.accept_token(tok)
            self.output.append(tok)
            st.new_tokens += 1
            st.free_tokens += 1
            self.finish = "stop"
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

        # masks for every draft position plus the bonus position
        t0 = time.perf_counter()
        bm = self.bitmask[: k + 1]
        for i in range(k + 1):
            m.fill_bitmask(bm, i)
            if i < k:
                ok = m.accept_token(draft[i])
                assert ok, "pre-validated draft rejected"
        if k:
            m.rollback(k)
        st.time_masks += time.perf_counter() - t0

        # one target forward over [pending] + draft
        t0 = time.perf_counter()
        assert self.pending is not None
        logits = self.lm.extend([self.pending] + draft)  # [k+1, V]
        st.forward_passes += 1
        st.time_forward += time.perf_counter() - t0

        # verify
        t0 = time.perf_counter()
        temperature = self.cfg.temperature
        uniforms = torch.rand((k + 1, 2), dtype=torch.float64, generator=self.generator)
        out = verify(
            torch.tensor(draft, dtype=torch.int64),                 # [k]
            torch.tensor([k], dtype=torch.int32),                    # [1] cumulative draft counts
            logits,                                                  # [k+1, V]
            bm,                                                      # [k+1, W]
            draft_probs=self._draft_probs(cand),
            temperature=torch.tensor([temperature], dtype=torch.float32),
            top_p=(torch.tensor([self.cfg.top_p], dtype=torch.float32) if self.cfg.top_p < 1 else None),
            uniforms=uniforms,
            backend=self.cfg.backend,
        )
        n_acc = int(out.num_accepted[0])
        if n_acc < 0:
            raise RuntimeError("verification found a fully masked row (grammar dead end)")
        emitted = [int(t) for t in out.output_token_ids[0, : n_acc + 1].tolist()]
        if self.cfg.verify_threshold is not None and k:
            n_acc, emitted = self._lossy(draft, logits, bm, n_acc, emitted)
        st.time_verify += time.perf_counter() - t0

        # bookkeeping per drafter
        if cand is not None:
            left = n_acc
            for d, n in cand.segments:
                took = min(n, left)
                d.observe(n, took)
                left -= took
            st.drafted += k
            st.accepted += n_acc
        st.bonus += 1

        # commit: crop the KV cache to pending + accepted drafts
        self.lm.crop(self.lm.length - (k - n_acc))
        emitted = emitted[:budget]
        committed: list[int] = []
        for t in emitted:
            if not m.accept_token(t):
                raise RuntimeError(f"verified token {t} rejected by the grammar")
            committed.append(t)
            if t in self.eos:
                self.finish = "stop"
                break
        self.output.extend(committed)
        self._learn_splits(committed)
        st.new_tokens += len(committed)
        if self.finish is None and len(committed) < len(emitted):
            self.finish = "stop"
        self.pending = committed[-1] if committed else self.pending
        if self.finish is None and len(self.output) >= self.max_new:
            self.finish = "length"
        return committed

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

    def _draft_probs(self, cand: Candidate | None) -> torch.Tensor | None:
        """The candidate's draft distributions ``[k, V_target]`` (None: deterministic)."""
        if cand is None or cand.probs is None or self.cfg.temperature <= 0:
            return None
        q = cand.probs.float()
        v = self.lm.vocab_size
        if q.shape[1] < v:
            q = torch.nn.functional.pad(q, (0, v - q.shape[1]))
        return q[:, :v].contiguous()

    def _lossy(self, draft: list[int], logits: torch.Tensor, bm: torch.Tensor, n_acc: int,
               emitted: list[int]) -> tuple[int, list[int]]:
        """Opt-in LOSSY typical acceptance (``verify_threshold``): beyond the exact verdict,
        keep accepting draft tokens whose masked target probability is at least
        ``threshold`` times the top token's. Changes the output distribution."""
        from .sampling import masked_logits

        thr = float(self.cfg.verify_threshold or 1.0)
        k = len(draft)
        probs = torch.softmax(masked_logits(logits, bm[: k + 1]) / max(self.cfg.temperature, 1e-5), -1)
        i = n_acc
        while i < k and float(probs[i, draft[i]]) >= thr * float(probs[i].max()):
            i += 1
        if i == n_acc:
            return n_acc, emitted
        nxt = int(torch.argmax(probs[i])) if i < k else int(torch.argmax(probs[k]))
        return i, draft[:i] + [nxt]

    def prefill(self) -> None:
        t0 = time.perf_counter()
        self.lm.reset()
        if len(self.prompt) > 1:
            self.lm.extend(self.prompt[:-1], all_logits=False)
        self.pending = self.prompt[-1]
        self.stats.time_prefill += time.perf_counter() - t0

    def finalize_stats(self) -> None:
        for d in (self.grammar_d, self.lookup_d, self.model_d):
            if d is not None:
                self.stats.drafters[d.name] = d.stats()


def stream_sequence(lm: CausalLM, vocab: Any, grammar: CompiledGrammar, prompt_ids: list[int],
                    cfg: SpecConfig, *, speculative: bool = True, max_new_tokens: int = 256,
                    draft_lm: CausalLM | None = None, seed: int | None = None
                    ) -> Iterator[tuple[list[int], _Sequence]]:
    """Yield ``(committed_tokens, state)`` after every verify step."""
    if not prompt_ids:
        raise ValueError("the prompt must contain at least one token")
    seq = _Sequence(lm, vocab, grammar, prompt_ids, cfg, speculative=speculative,
                    max_new_tokens=max_new_tokens, draft_lm=draft_lm, seed=seed)
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


def run_sequence(lm: CausalLM, vocab: Any, grammar: CompiledGrammar, prompt_ids: list[int],
                 cfg: SpecConfig, **kw: Any) -> SequenceResult:
    seq = None
    for _new, state in stream_sequence(lm, vocab, grammar, prompt_ids, cfg, **kw):
        seq = state
    assert seq is not None
    text_tokens = [t for t in seq.output if t not in seq.eos]
    data = vocab.decode_bytes(text_tokens)
    text = codecs.decode(data, "utf-8", errors="replace")
    return SequenceResult(seq.output, text, seq.finish or "stop", seq.stats)
