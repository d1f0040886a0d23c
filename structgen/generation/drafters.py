"""Drafters: cheap proposals of the next tokens, verified later by the target model.

Drafters propose, they never decide: every proposal is cut to its longest
grammar-valid prefix (pre-validation) and then verified exactly against the target.

* :class:`GrammarForcedDrafter` -- what the grammar alone determines (keys, punctuation,
  closing brackets), turned into the tokens the model itself would produce by
  tokenizing the forced text canonically in the context of the last committed tokens.
* :class:`PromptLookupDrafter` -- continuations found by text match in the prompt and
  the output so far (values copied from the input in extraction tasks).
* :class:`NgramDrafter` -- token n-grams of the prompt and the output so far, the tokens that
  followed their latest occurrence (an output repeating itself).
* :class:`DraftModelDrafter` -- a smaller causal LM with the same tokenizer, masked by the
  grammar at every step; proposes with probabilities, so sampling stays exact.

Each drafter adapts its draft length to its observed acceptance (``observe``) and is
switched off when its acceptance stays below ``SpecConfig.min_acceptance`` (except the
grammar-forced and n-gram drafters, which cost next to nothing: whether their drafts are worth
a longer target pass is decided per step, see :mod:`structgen.generation.pacing`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from structgen.config import SpecConfig
from structgen.generation.prompts import Tokenizer
from structgen.generation.results import DrafterStats
from structgen.generation.sampling import DistributionBuffers
from structgen.kernels.bitmask import allocate_bitmask
from structgen.masks.matcher import Matcher
from structgen.masks.vocab import Vocabulary

if TYPE_CHECKING:
    from structgen.generation.model import CausalLM

__all__ = ["Candidate", "Drafter", "GrammarForcedDrafter", "PromptLookupDrafter", "NgramDrafter",
           "DraftModelDrafter", "canonical_tokens", "cut_value"]


@dataclass
class Candidate:
    """A proposed continuation: ``tokens`` plus, per segment, which drafter proposed it.

    probs: optional draft distributions ``[len(tokens), V]`` (float32 torch tensor) when
    every token came from a draft model; None = deterministic proposals.
    """

    tokens: list[int]
    segments: list[tuple[Drafter, int]] = field(default_factory=list)
    probs: torch.Tensor | None = None

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (and their probabilities and drafter segments)."""
        self.tokens = self.tokens[:n]
        if self.probs is not None:
            self.probs = self.probs[:n]
        segs = []
        left = n
        for d, k in self.segments:
            take = min(k, left)
            if take:
                segs.append((d, take))
            left -= take
        self.segments = segs

    def score(self) -> float:
        """Expected number of accepted tokens under each drafter's running acceptance."""
        total = 0.0
        p = 1.0
        for drafter, n in self.segments:
            for i in range(n):
                p *= drafter.position_estimate(i)
                total += p
        return total


class Drafter:
    """Base class: adaptive length and acceptance bookkeeping.

    Two sets of counts: ``proposed`` / ``accepted`` (every draft token sent to the target and
    how many were accepted: the reported acceptance) and the estimator's ``hits`` / ``trials``
    (a token counts as a trial only when the target actually judged it: the tokens after the
    first rejection of a draft, or after an earlier drafter's rejected segment, were never
    judged). ``hits / trials`` estimates the chance that one more drafted token is accepted
    given that the ones before it were; ``accepted / proposed`` underestimates it for long
    drafts (a draft accepted up to its middle counts its whole tail as failures), which made
    the expected acceptance of long drafts collapse. The estimator's counts decay
    (:data:`ESTIMATE_DECAY` per observation) so that it follows a change of regime, such as an
    output that starts repeating itself.
    """

    name = "drafter"
    prior = 0.5

    def __init__(self, cfg: SpecConfig) -> None:
        self.cfg = cfg
        self.length = max(cfg.min_draft_tokens, cfg.max_draft_tokens // 2)
        self.proposed = 0
        self.accepted = 0
        self.calls = 0
        self.hits = 0.0
        self.trials = 0.0
        # the same per position of a drafter's segment: a copied value is often right whole or
        # wrong at its first token, so the chance of the next token is not the same everywhere
        self.pos_hits = [0.0] * cfg.max_draft_tokens
        self.pos_trials = [0.0] * cfg.max_draft_tokens
        self.enabled = True

    def acceptance_estimate(self) -> float:
        """Expected probability that one more drafted token is accepted given that the drafted
        tokens before it were: the observed rate over judged tokens, Laplace-smoothed towards
        the class's ``prior`` (worth 4 tokens of evidence)."""
        return (self.hits + 4 * self.prior) / (self.trials + 4)

    def position_estimate(self, i: int) -> float:
        """Probability that token ``i`` of this drafter's segment is accepted given that the
        tokens before it were: the judged tokens at that position, with
        :meth:`acceptance_estimate` worth 4 tokens of evidence."""
        base = self.acceptance_estimate()
        if i >= len(self.pos_trials):
            return base
        return (self.pos_hits[i] + 4 * base) / (self.pos_trials[i] + 4)

    def observe(self, proposed: int, accepted: int, *, judged: bool = True) -> None:
        """Record that ``accepted`` of ``proposed`` tokens of this drafter were accepted;
        ``judged=False``: the target never reached them (an earlier segment of the same draft
        was rejected), so they count in the reported totals but not in the estimate."""
        if proposed <= 0:
            return
        self.proposed += proposed
        self.accepted += accepted
        self.calls += 1
        if judged:
            self.hits = self.hits * ESTIMATE_DECAY + accepted
            self.trials = self.trials * ESTIMATE_DECAY + accepted + (accepted < proposed)
            ph, pt = self.pos_hits, self.pos_trials
            for i in range(len(pt)):
                ph[i] *= ESTIMATE_DECAY
                pt[i] *= ESTIMATE_DECAY
            for i in range(min(accepted + 1, proposed, len(pt))):
                pt[i] += 1.0
                ph[i] += float(i < accepted)
        cfg = self.cfg
        if cfg.adaptive:
            if accepted >= proposed:
                self.length = min(cfg.max_draft_tokens, self.length + 2)
            else:
                self.length = max(cfg.min_draft_tokens, min(self.length, accepted + 2))
        if (self.calls >= cfg.warmup_proposals
                and self.accepted / self.proposed < cfg.min_acceptance
                and self.name not in ("grammar", "ngram")):
            self.enabled = False

    def stats(self) -> DrafterStats:
        """Proposed and accepted token counts, their ratio (None before any proposal) and whether
        the drafter is still enabled, as a JSON-ready dict."""
        rate = self.accepted / self.proposed if self.proposed else None
        return {"proposed": self.proposed, "accepted": self.accepted, "acceptance": rate,
                "enabled": self.enabled}


# weight kept by the acceptance estimator's counts at every observation (about the last 20
# drafts matter)
ESTIMATE_DECAY = 0.95


def canonical_tokens(tokenizer: Tokenizer, vocab: Vocabulary, committed: list[int], data: bytes,
                     context_tokens: int = 3) -> list[int]:
    """Tokens the model's tokenizer produces for ``data`` following ``committed`` output.

    The last few committed tokens are re-tokenized together with ``data`` so that the
    tokenizer sees the real boundary; when that re-tokenization does not reproduce the
    committed tokens (a merge across the boundary), ``data`` is tokenized alone.
    Incomplete trailing UTF-8 is dropped.
    """
    if not data:
        return []
    # drop an incomplete UTF-8 tail
    for cut in range(len(data), max(len(data) - 4, 0) - 1, -1):
        try:
            text = data[:cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    else:
        return []
    if not text:
        return []
    tail_ids = committed[-context_tokens:] if committed else []
    if tail_ids:
        tail = vocab.decode_bytes(tail_ids)
        try:
            tail_text = tail.decode("utf-8")
        except UnicodeDecodeError:
            tail_text = None
        if tail_text is not None:
            ids = tokenizer.encode(tail_text + text, add_special_tokens=False)
            if ids[: len(tail_ids)] == tail_ids:
                return list(ids[len(tail_ids):])
    return list(tokenizer.encode(text, add_special_tokens=False))


class GrammarForcedDrafter(Drafter):
    """Proposes the grammar-forced continuation in canonical tokenization."""

    name = "grammar"
    prior = 0.8

    def __init__(self, cfg: SpecConfig, tokenizer: Tokenizer, vocab: Vocabulary) -> None:
        super().__init__(cfg)
        self.tokenizer = tokenizer
        self.vocab = vocab

    def propose(self, matcher: Matcher, output: list[int], limit: int) -> list[int]:
        """At most ``limit`` tokens spelling the bytes the grammar forces after ``matcher``'s
        state (up to 256 bytes), tokenized as the tokenizer would after ``output``; [] when
        the grammar forces nothing. Does not advance ``matcher``."""
        data = matcher.forced_bytes(limit=256)
        if not data:
            return []
        toks = canonical_tokens(self.tokenizer, self.vocab, output, data)
        return toks[: max(0, limit)]


_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# where a value copied from natural text usually ends
_BOUNDARIES = (b",", b";", b"\n", b". ", b'"', b")", b"(", b"!", b"?")


class PromptLookupDrafter(Drafter):
    """Text-level lookup: the end of the output text is searched for in the prompt (and the
    output so far) and what followed it there is proposed. Matching on text rather than
    token ids survives tokenization differences (a value copied from a prompt where it
    followed a space tokenizes differently inside a JSON string)."""

    name = "lookup"
    prior = 0.5
    #: What may end a copied value, tried in this order: the first the grammar allows closes
    #: the value (a JSON string, then a member or item, then an object or array).
    CLOSERS: tuple[bytes, ...] = (b'"', b",", b"}", b"]")

    def propose(self, matcher: Matcher, prompt_text: bytes, out_text: bytes, forced: bytes,
                num: int) -> list[bytes]:
        """Up to ``num`` texts to draft after the grammar-forced text ``forced``, copied from
        the prompt (or the output so far) where the output text ``out_text`` plus ``forced``
        ends: a continuation of the text (:meth:`continuations`), else, at a value's start, what
        follows the property's name in the prompt (:meth:`key_continuations`). Each copied value
        is cut where a value usually ends (:func:`cut_value`) or where the grammar stops it, and
        then closed (:data:`CLOSERS`) and followed by what the grammar forces next: those bytes
        are right only if the copied value is, so they belong to this drafter's proposal. A text
        may be empty (the grammar allowed nothing of the copy: the forced text alone)."""
        source = prompt_text + out_text
        conts = self.continuations(source, out_text + forced, num)
        if not conts:  # at a value's start: what follows the property's name in the prompt
            conts = self.key_continuations(prompt_text, out_text + forced, num)
        out: list[bytes] = []
        for cont in conts:
            seg, bounded = cut_value(cont)
            n = matcher.viable_prefix_length(forced + seg) - len(forced)
            cut_by_grammar = n < len(seg)
            seg = seg[: max(n, 0)]
            if not seg and not cut_by_grammar:
                continue  # nothing copied: closing the value here is a blind guess
            tail = self.closing(matcher, forced + seg) if bounded or cut_by_grammar else b""
            out.append(seg + tail)
        return out

    def closing(self, matcher: Matcher, text: bytes) -> bytes:
        """The first of :data:`CLOSERS` the grammar allows after ``text``, followed by what the
        grammar then forces (empty when none is allowed)."""
        for close in self.CLOSERS:
            probe = text + close
            if matcher.viable_prefix_length(probe) == len(probe):
                return close + matcher.forced_bytes(limit=256, after=probe)
        return b""

    def continuations(self, source: bytes, text: bytes, num: int, max_bytes: int = 64) -> list[bytes]:
        """Up to ``num`` distinct continuations of the end of ``text`` found in ``source``
        (most recent occurrence first). The suffix tried first is the text since the last
        quote (a value being copied), then the trailing word; suffixes without a letter or
        digit are not looked up."""
        suffixes: list[bytes] = []
        q = text.rfind(b'"')
        if q >= 0 and 0 < len(text) - q - 1 <= 48:
            suffixes.append(text[q + 1:])
        i = len(text)
        while i > 0 and text[i - 1] in _WORD:
            i -= 1
        if i < len(text):
            suffixes.append(text[i:])
        out: list[bytes] = []
        seen: set[bytes] = set()
        for suf in suffixes:
            if not any(c in _WORD for c in suf):
                continue
            end = len(source)
            while len(out) < num:
                j = source.rfind(suf, 0, end)
                if j < 0:
                    break
                cont = source[j + len(suf): j + len(suf) + max_bytes]
                if cont and cont not in seen:
                    seen.add(cont)
                    out.append(cont)
                end = j + len(suf) - 1
            if out:
                break
        return out


    _KEY = re.compile(rb'"([A-Za-z_][A-Za-z0-9_ -]{1,40})":\s*"?$')
    _FILLER = re.compile(rb"^(?:\s|:|=|-|\bis\b|\bare\b|\bwas\b|\bof\b|\bthe\b)+", re.I)

    def key_continuations(self, source: bytes, text: bytes, num: int,
                          max_bytes: int = 64) -> list[bytes]:
        """At the start of a JSON value: find the property name in ``source`` (case-insensitive,
        underscores as spaces) and propose what follows it, minus filler words ("is", ":")."""
        m = self._KEY.search(text[-64:])
        if m is None:
            return []
        key = m.group(1).replace(b"_", b" ").lower()
        low = source.lower()
        out: list[bytes] = []
        end = len(low)
        while len(out) < num:
            j = low.rfind(key, 0, end)
            if j < 0:
                break
            cont = source[j + len(key): j + len(key) + max_bytes]
            filler = self._FILLER.match(cont)
            cont = cont[filler.end():] if filler else cont
            if cont and cont not in out:
                out.append(cont)
            end = j
        return out


class NgramDrafter(Drafter):
    """Token-level n-gram lookup over the prompt and the output so far: the last ``n`` token
    ids (``SpecConfig.ngram_max`` down to ``ngram_min``) are looked up among the earlier
    positions, and the tokens that followed their most recent occurrence are proposed.

    The copy may overlap itself (it reads the tokens it has just proposed), so a repeating
    output (``121212...``, ``[[10,10],[10,10],...``, ``"A-Z-A-Z-..."``) gets a draft of any
    length from a match one period back; the text-level :class:`PromptLookupDrafter` looks up
    only the text since the last quote and the trailing word, which inside a repetition is the
    whole repeated run and occurs nowhere else. Token ids make the proposal the model's own
    tokenization of the repeated text.

    How far the match reaches back (the tokens before the n-gram that also agree, up to
    :attr:`REACH`) says how reliable it is: a match extending over a whole period of a loop is
    nearly always right, a one-token match often not. The acceptance estimate is kept per reach
    class (1, 2-3, 4-7, 8-15, 16+ tokens), each smoothed towards the drafter's overall estimate.
    """

    name = "ngram"
    prior = 0.5
    REACH = 32
    _CLASSES = (1, 2, 4, 8, 16)

    def __init__(self, cfg: SpecConfig) -> None:
        super().__init__(cfg)
        self.sizes = list(range(cfg.ngram_max, cfg.ngram_min - 1, -1))
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest occurrence
        self._indexed = 0                               # n-grams ending before this are indexed
        self._class_hits = [0.0] * len(self._CLASSES)
        self._class_trials = [0.0] * len(self._CLASSES)
        self._class = 0                                 # reach class of the latest proposal

    def _reach_class(self, reach: int) -> int:
        c = 0
        for i, lo in enumerate(self._CLASSES):
            if reach >= lo:
                c = i
        return c

    def acceptance_estimate(self) -> float:
        """The drafter's estimate (see :meth:`Drafter.acceptance_estimate`) refined by the reach
        class of the latest proposal: that class's judged tokens, with the overall estimate
        worth 4 tokens of evidence."""
        overall = super().acceptance_estimate()
        c = self._class
        return (self._class_hits[c] + 4 * overall) / (self._class_trials[c] + 4)

    def observe(self, proposed: int, accepted: int, *, judged: bool = True) -> None:
        """As :meth:`Drafter.observe`, also counted for the latest proposal's reach class."""
        super().observe(proposed, accepted, judged=judged)
        if judged and proposed > 0:
            c = self._class
            self._class_hits[c] = self._class_hits[c] * ESTIMATE_DECAY + accepted
            self._class_trials[c] = (self._class_trials[c] * ESTIMATE_DECAY + accepted
                                     + (accepted < proposed))

    def propose(self, history: list[int], limit: int) -> list[int]:
        """At most ``limit`` tokens continuing ``history`` (prompt + output token ids, which
        only ever grow between calls of one sequence) after the latest earlier occurrence of
        its longest matching tail n-gram; [] when no tail n-gram occurred before."""
        n_hist = len(history)
        if limit <= 0 or n_hist < 2:
            return []
        index = self._index
        # index every n-gram ending before the current end (the tail itself must not match)
        for end in range(max(self._indexed, 1), n_hist):
            for n in self.sizes:
                if n <= end:
                    index[tuple(history[end - n:end])] = end
        self._indexed = max(self._indexed, n_hist)
        for n in self.sizes:
            if n > n_hist - 1:
                continue
            found = index.get(tuple(history[n_hist - n:]))
            if found is None:
                continue
            end = found
            reach = n
            while (reach < self.REACH and end - reach - 1 >= 0
                   and history[end - reach - 1] == history[n_hist - reach - 1]):
                reach += 1
            self._class = self._reach_class(reach)
            out: list[int] = []
            for i in range(limit):  # overlapping copy: may read the tokens just proposed
                j = end + i
                out.append(history[j] if j < n_hist else out[j - n_hist])
            return out
        return []


def cut_value(cont: bytes) -> tuple[bytes, bool]:
    """Cut a copied continuation where a value usually ends; (text, whether a boundary was found)."""
    best = len(cont)
    for b in _BOUNDARIES:
        k = cont.find(b)
        if 0 <= k < best:
            best = k
    return cont[:best], best < len(cont)


class DraftModelDrafter(Drafter):
    """A small causal LM (same tokenizer) proposing tokens greedily, or by sampling when
    the temperature is positive, under the grammar mask; keeps its own KV cache."""

    name = "draft_model"
    prior = 0.6

    def __init__(self, cfg: SpecConfig, lm: CausalLM, vocab: Vocabulary) -> None:
        super().__init__(cfg)
        self.lm = lm
        self.vocab = vocab
        self.cached: list[int] = []
        # int32 [1, W] and the distribution rows: allocated on first use
        self._bm: torch.Tensor | None = None
        self._dist: DistributionBuffers | None = None

    def reset(self) -> None:
        """Drop the draft model's KV cache (start of a new request)."""
        self.lm.reset()
        self.cached = []

    def propose(self, matcher: Matcher, context: list[int], limit: int, *,
                temperature: float = 0.0, generator: torch.Generator | None = None,
                budget: int | None = None) -> tuple[list[int], torch.Tensor | None]:
        """Up to ``limit`` tokens drafted after ``context`` under the grammar mask, greedily at
        ``temperature`` 0, else sampled with ``generator``; and the float32 ``[n, V]`` rows of the
        distributions they were drawn from (None with no tokens). The rows live in this
        drafter's own buffers and stay valid until its next proposal. Runs one draft-model
        forward per token the grammar leaves a choice for (forced tokens need none); reuses the
        KV cache for the prefix ``context`` shares with the previous call. ``matcher`` is
        forked, not advanced. ``budget``: tokens left at the first drafted position; each
        position is then masked by the budget rule as the target's will be (None: off)."""
        if limit <= 0:
            return [], None
        # sync the cache with the context: keep the common prefix, feed the rest
        common = 0
        for a, b in zip(self.cached, context):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)
        if self.lm.cache is None:
            self.lm.reset()
        self.lm.crop(min(common, self.lm.length))
        self.cached = context[: self.lm.length]
        feed = context[self.lm.length:]
        logits = self.lm.extend(feed, all_logits=False)[-1]
        self.cached = list(context)
        m = matcher.fork()
        bm, dist = self._bm, self._dist
        if bm is None or dist is None or dist.probs.shape[0] < limit:
            bm = self._bm = allocate_bitmask(1, self.lm.vocab_size)
            dist = self._dist = DistributionBuffers(self.lm.vocab_size, max(limit, self.cfg.max_draft_tokens))
        toks: list[int] = []
        pending: list[int] = []  # drafted tokens not fed to the draft model yet
        for step in range(limit):
            m.fill_bitmask(bm, 0, budget=None if budget is None else budget - step)
            only = _single_allowed(bm[0])
            if only is not None:
                # the grammar leaves one token: the masked distribution is a point mass on it
                # whatever the logits, so no forward pass is needed to draft it
                if only >= self.lm.vocab_size:
                    break
                t = only
                dist.point_mass(len(toks), t)  # [V]
            else:
                if pending:  # one forward for every token drafted since the last choice
                    logits = self.lm.extend(pending, all_logits=False)[-1]
                    self.cached.extend(pending)
                    pending = []
                p = dist.compute(len(toks), logits, bm[0], temperature)  # [V] float32
                if p is None:
                    break
                if temperature > 0:
                    t = dist.sample(len(toks), generator)
                else:
                    t = int(torch.argmax(p))
            if not m.accept_token(t):  # cannot happen: t was drawn under the mask
                break
            # EOS is proposed like any token (dropping it would bias the proposal distribution)
            toks.append(t)
            if m.is_terminated():
                break
            if step + 1 < limit:
                pending.append(t)
        if not toks:
            return [], None
        # rows of the drafter's own buffer: valid until its next proposal (the step verifies first)
        return toks, dist.probs[: len(toks)]


def _single_allowed(words: torch.Tensor) -> int | None:
    """The token id when the packed int32 mask row ``words`` allows exactly one token."""
    if int(torch.count_nonzero(words)) != 1:   # (no [W]-sized index tensor for dense masks)
        return None
    nz = torch.nonzero(words).flatten()
    w = int(nz[0])
    v = int(words[w]) & 0xFFFFFFFF
    if v & (v - 1):
        return None
    return 32 * w + v.bit_length() - 1
