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
from typing import Any

__all__ = ["BUDGET_CLOSE", "COMPLETE", "GenerationStats", "ON_BUDGET_CHOICES", "SequenceResult",
           "is_complete"]

#: finish_reason of an output closed by the budget rule
BUDGET_CLOSE = "budget_close"
#: the finish reasons of complete outputs
COMPLETE = frozenset({"stop", BUDGET_CLOSE})
#: values of the ``on_budget`` option: close every output within ``max_new_tokens``, or cut it
ON_BUDGET_CHOICES = ("close", "cut")


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
    drafters: dict[str, dict[str, Any]] = field(default_factory=dict)
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

    def as_dict(self) -> dict[str, Any]:
        """Every field plus the derived rates, as a JSON-ready dict."""
        d = {k: v for k, v in self.__dict__.items()}
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


@dataclass
class SequenceResult:
    """One finished sequence of the loop: generated token ids (EOS included if emitted), the
    decoded text, why it stopped, and its statistics."""

    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "budget_close" (both complete) | "length" (cut short)
    stats: GenerationStats
