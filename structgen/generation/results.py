"""What the generation loop returns: per-sequence results, their statistics, finish reasons.

``finish_reason`` of a sequence:

* ``"stop"``: it ended with EOS (or the grammar left nothing but EOS) on its own;
* ``"budget_close"``: it ended with EOS on a complete output, but the budget rule
  (``on_budget="close"``, :mod:`structgen.masks.budget`) had to remove a token the grammar
  allowed at some position of it: the output was steered to fit ``max_new_tokens``;
* ``"length"``: ``max_new_tokens`` ran out first (``on_budget="cut"``): the output is
  incomplete.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

__all__ = ["BUDGET_CLOSE", "COMPLETE", "DrafterStats", "GenerationStats", "MAX_TOP_LOGPROBS",
           "ON_BUDGET_CHOICES", "SequenceResult", "TokenLogprob", "TopLogprob", "is_complete"]

#: finish_reason of an output closed by the budget rule
BUDGET_CLOSE = "budget_close"
#: the finish reasons of complete outputs
COMPLETE = frozenset({"stop", BUDGET_CLOSE})
#: values of the ``on_budget`` option: close every output within ``max_new_tokens``, or cut it
ON_BUDGET_CHOICES = ("close", "cut")
#: the most alternatives ``top_logprobs`` may ask for (OpenAI's bound)
MAX_TOP_LOGPROBS = 20


class DrafterStats(TypedDict, total=False):
    """One drafter's counters (:meth:`structgen.generation.drafters.Drafter.stats`): draft
    tokens proposed and accepted, their ratio (None before any proposal), whether it is still
    enabled (absent once summed over sequences)."""

    proposed: int
    accepted: int
    acceptance: float | None
    enabled: bool


def is_complete(finish_reason: str) -> bool:
    """Whether an output that stopped for ``finish_reason`` is complete (``"stop"`` or
    ``"budget_close"``)."""
    return finish_reason in COMPLETE


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
    draft_cut: int = 0  # pre-validated draft tokens not sent: a longer pass would not pay (pacing)
    drafters: dict[str, DrafterStats] = field(default_factory=dict)
    time_masks: float = 0.0
    time_drafting: float = 0.0
    time_forward: float = 0.0
    time_verify: float = 0.0
    time_prefill: float = 0.0
    time_total: float = 0.0
    time_to_first_token: float | None = None
    budget_closes: int = 0  # sequences that ended with finish_reason "budget_close"
    budget_narrowed: int = 0  # output positions where the budget rule removed a token

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per target forward pass (0.0 before any pass)."""
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted tokens; None when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of ``time_total`` (0.0 before any time passed)."""
        return self.new_tokens / self.time_total if self.time_total else 0.0

    def as_dict(self) -> dict[str, object]:
        """Every field plus the derived rates, as a JSON-ready dict."""
        d: dict[str, object] = {k: v for k, v in self.__dict__.items()}
        d["tokens_per_pass"] = self.tokens_per_pass
        d["acceptance"] = self.acceptance
        d["tokens_per_second"] = self.tokens_per_second
        return d

    def merge(self, other: GenerationStats) -> None:
        """Add ``other``'s counts, times and per-drafter counts into this object (in place)."""
        for k in ("forward_passes", "new_tokens", "free_tokens", "drafted", "accepted", "bonus", "draft_cut",
                  "budget_closes", "budget_narrowed",
                  "time_masks", "time_drafting", "time_forward", "time_verify", "time_prefill",
                  "time_total"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for name, st in other.drafters.items():
            mine = self.drafters.setdefault(name, {"proposed": 0, "accepted": 0})
            mine["proposed"] += st["proposed"]
            mine["accepted"] += st["accepted"]
            mine["acceptance"] = mine["accepted"] / mine["proposed"] if mine["proposed"] else None


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at an output position: its id, text, bytes and
    log-probability (in the distribution :class:`TokenLogprob` describes)."""

    token_id: int
    token: str
    token_bytes: bytes
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one committed output token, asked for with ``logprobs``.

    ``logprob`` is the token's log-probability in the distribution it was drawn from: the
    target model's logits at that position, grammar-forbidden tokens removed, divided by the
    temperature (greedy decoding: temperature 1), restricted to the top-p nucleus when the
    sequence samples with ``top_p < 1``, then renormalised (log-softmax). Speculation is
    lossless, so an accepted draft token reports that same target distribution. A token the
    grammar forced without a forward pass (the only token it allowed) has logprob 0.0 and is
    its own only alternative. ``top_logprobs``: the ``k`` most likely tokens of that
    distribution, most likely first (never a token the grammar or top-p ruled out, so fewer
    than ``k`` where fewer are possible). ``token`` is the token's text (UTF-8, undecodable
    bytes replaced; a special token's own name), ``token_bytes`` its raw bytes."""

    token_id: int
    token: str
    token_bytes: bytes
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()


@dataclass
class SequenceResult:
    """One finished sequence of the loop: generated token ids (EOS included if emitted), the
    decoded text, why it stopped, and its statistics; ``logprobs``: one
    :class:`TokenLogprob` per token of ``tokens`` when the sequence recorded them (None
    otherwise)."""

    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "budget_close" (both complete) | "length" (cut short)
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None
