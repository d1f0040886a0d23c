"""Pacing speculation: how many drafted tokens a step sends to the target model.

A target pass over ``k + 1`` positions costs more than a one-token pass, by how much depends on
the device and the model: a memory-bound GPU pass costs about the same for 1 or 16 positions, a
float32 CPU pass of a small model costs about twice as much for 6 positions as for 1
(``benchmarks/results/pacing-*.json``). Sending a long draft whose tail will likely be rejected
is then slower than plain decoding. So every step cuts its pre-validated draft to the length
``k`` with the best expected tokens per unit of step time::

    rate(k) = (1 + sum_{j<k} P(drafts 0..j all accepted)) / cost(k + 1)

with the acceptance probabilities from each drafter's running estimate
(:meth:`structgen.generation.drafters.Drafter.position_estimate`: per position of its
segment, a copied value being often right whole or wrong at its first token) and ``cost(n)`` the
time of a pass over ``n`` positions, measured online (:class:`StepCost`): each size's recent
mean, a line ``fixed + n`` fitted to them for the sizes not measured lately. Cutting a
pre-validated draft is lossless for greedy decoding and keeps sampling exact (what is verified
is a prefix of what was drafted, its length chosen from the drafters' past record, not from the
drafted tokens).

Where speculation does not pay (``k = 0`` is best), a sequence runs plain one-token steps and
sends a short probe draft now and then (:class:`SequencePacer`), so that it notices when drafts
start to pay (an output that starts repeating itself); the probes back off while they do not pay.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from structgen.generation.drafters import Candidate
    from structgen.generation.model import CausalLM

__all__ = ["SequencePacer", "StepCost", "best_draft_length", "expected_accepts", "linear_cost",
           "pacing_prior", "shared_step_cost"]


class StepCost:
    """Online model of a target pass's time, ``t = a + b * positions``, as ``fixed = a / b``:
    the position-independent part in units of one position.

    Every observation updates a running mean of the time for its number of positions (the
    latest observations weigh most, so load changes fade out); the line is a least-squares fit
    to those means. Until the means span at least :attr:`MIN_SPREAD` positions, or when the fit
    is not increasing, the prior ``prior_fixed_positions`` is used. ``fixed=True`` keeps the
    prior whatever is observed: cuts that do not depend on measured times (seeded sampling
    reproduces its draws exactly).

    A mean's weight in the fit also halves every :attr:`HALF_LIFE` observations of other sizes
    and the mean drops out below :attr:`MIN_WEIGHT`. Without that, a mean of long passes
    measured while the machine was busy would outlive the load: the fit keeps judging long
    passes expensive, the pacer stops sending them, and nothing ever corrects the mean (measured
    on llama.cpp: drafting all but stopped for the rest of a run once the load fell). Once
    the stale means are gone the fit's spread falls below :attr:`MIN_SPREAD`, the prior comes
    back, and the next long drafts measure the machine as it is now."""

    MIN_SPREAD = 3
    MAX_SIZES = 48    # distinct position counts remembered (the least recently seen go first)
    WEIGHT_CAP = 8.0  # a mean's weight in the fit: its observation count, capped
    HALF_LIFE = 64    # observations after which an unrefreshed mean counts half
    MIN_WEIGHT = 0.5  # a mean whose aged weight falls below this is left out of the fit

    def __init__(self, prior_fixed_positions: float = 12.0, *, fixed: bool = False) -> None:
        self.prior = float(prior_fixed_positions)
        self.fixed = fixed
        # positions -> [running mean seconds, weight, observation count when last updated]
        self.means: dict[int, list[float]] = {}
        self.observations = 0
        self._lock = threading.Lock()

    def add(self, positions: int, seconds: float) -> None:
        """Record that a pass over ``positions`` positions took ``seconds``."""
        if self.fixed or positions <= 0 or not seconds > 0:
            return
        with self._lock:
            self.observations += 1
            entry = self.means.pop(positions, None)
            if entry is None:
                entry = [seconds, 0.0, 0.0]
            w = min(self._aged(entry) + 1.0, self.WEIGHT_CAP)
            entry[0] += (seconds - entry[0]) / w
            entry[1] = w
            entry[2] = float(self.observations)
            self.means[positions] = entry   # re-inserted: the dict keeps the most recent last
            while len(self.means) > self.MAX_SIZES:
                del self.means[next(iter(self.means))]

    def _aged(self, entry: list[float]) -> float:
        return entry[1] * 0.5 ** ((self.observations - entry[2]) / self.HALF_LIFE)

    def _fresh(self) -> list[tuple[float, float, float]]:
        """(positions, mean seconds, aged weight) of the means still in the fit."""
        with self._lock:
            return [(float(x), e[0], w) for x, e in self.means.items()
                    if (w := self._aged(e)) >= self.MIN_WEIGHT]

    def _line(self, pts: list[tuple[float, float, float]]) -> tuple[float, float] | None:
        """``(fixed, slope)`` of the weighted least-squares line through ``pts`` (``fixed`` in
        positions, ``slope`` in seconds per position); None while the sizes span less than
        :attr:`MIN_SPREAD` positions or the line does not increase."""
        if len(pts) < 2 or max(x for x, _, _ in pts) - min(x for x, _, _ in pts) < self.MIN_SPREAD:
            return None
        sw = sum(w for _, _, w in pts)
        mx = sum(w * x for x, _, w in pts) / sw
        my = sum(w * y for _, y, w in pts) / sw
        sxx = sum(w * (x - mx) ** 2 for x, _, w in pts)
        slope = sum(w * (x - mx) * (y - my) for x, y, w in pts) / sxx
        if slope <= 0:
            return None
        return min(max((my - slope * mx) / slope, 0.0), 4 * self.prior + 64), slope

    def fixed_positions(self) -> float:
        """The position-independent cost of a pass, in units of one position's cost."""
        line = None if self.fixed else self._line(self._fresh())
        return self.prior if line is None else line[0]

    def pass_cost(self) -> Callable[[int], float]:
        """The time of a pass over ``n`` positions, in a unit of its own (only ratios count):
        the measured mean for a size measured recently, the fitted line for other sizes (the
        prior line, scaled to the most measured size, while there is no fit). A size's own
        mean matters where the cost is not a line: on llama.cpp's CPU build a one-position pass
        is a matrix-vector product, far cheaper than a two-position one."""
        if self.fixed:
            return linear_cost(self.prior)
        pts = self._fresh()
        line = self._line(pts)
        if line is not None:
            fixed, slope = line[0] * line[1], line[1]
        elif pts:
            x0, y0, _ = max(pts, key=lambda p: p[2])
            slope = y0 / (self.prior + x0)
            fixed = self.prior * slope
        else:
            return linear_cost(self.prior)
        measured = {int(x): y for x, y, _ in pts}
        return lambda n: measured.get(n, fixed + slope * n)


_SHARED: weakref.WeakKeyDictionary[object, StepCost] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shared_step_cost(lm: CausalLM, prior_fixed_positions: float) -> StepCost:
    """The one-sequence step-cost model of ``lm``'s weights, shared by every call on them in
    this process (a request's first steps then know what earlier requests measured); a fresh
    model when the weights cannot be weakly referenced."""
    key = getattr(lm, "model", None)
    with _SHARED_LOCK:
        try:
            cost = _SHARED.get(key)
            if cost is None:
                cost = _SHARED[key] = StepCost(prior_fixed_positions)
        except TypeError:
            cost = StepCost(prior_fixed_positions)
    return cost


def expected_accepts(cand: Candidate | None, k: int) -> list[float]:
    """Probability, under each drafter's running acceptance, that positions 0..j of the first
    ``k`` tokens of the candidate ``cand`` are all accepted (the terms of
    :meth:`~structgen.generation.drafters.Candidate.score`); [] for no candidate."""
    out: list[float] = []
    p = 1.0
    if cand is not None:
        for drafter, n in cand.segments:
            for i in range(n):
                p *= drafter.position_estimate(i)
                out.append(p)
    return out[:k]


def linear_cost(fixed: float) -> Callable[[int], float]:
    """A pass cost of ``fixed + n`` for ``n`` positions (``fixed`` in units of one position)."""
    return lambda n: fixed + n


def best_draft_length(curves: list[list[float]], cost: Callable[[int], float]) -> int:
    """The common draft length (every row padded to it) with the best expected tokens per unit
    of pass time for rows whose drafts have the acceptance ``curves`` (one list per row, see
    :func:`expected_accepts`; a row's draft is as long as its curve), ``cost(n)`` the time of a
    pass over ``n`` positions (:meth:`StepCost.pass_cost`). Ties go to the shorter draft."""
    b = len(curves)
    top = max((len(c) for c in curves), default=0)
    best_k, best = 0, -1.0
    gain = float(b)  # every row emits its recovered / bonus token
    for k in range(top + 1):
        if k:
            gain += sum(c[k - 1] for c in curves if len(c) >= k)
        rate = gain / cost(b * (k + 1))
        if rate > best * (1 + 1e-9):
            best_k, best = k, rate
    return best_k


class SequencePacer:
    """Per-sequence draft cuts for one-at-a-time generation (see the module docstring).

    :meth:`length` gives the number of draft tokens to send this step: the best length under
    the model's :class:`StepCost`, or, where that is 0, a probe of :attr:`PROBE` tokens every
    ``interval`` such steps; the interval doubles after every probe with nothing accepted (up
    to :attr:`MAX_INTERVAL`) and resets when drafts pay again. :meth:`observe` feeds the step
    time to the cost model and the probe's outcome to the back-off.
    """

    PROBE = 2
    MIN_INTERVAL = 8
    MAX_INTERVAL = 128

    def __init__(self, cost: StepCost) -> None:
        self.cost = cost
        self.interval = self.MIN_INTERVAL
        self.skipped = 0
        self.probing = False
        self.off_steps = 0   # steps whose draft was cut to nothing (for statistics)
        self.probes = 0

    def length(self, cand: Candidate | None, k: int) -> int:
        """Draft tokens to send of the candidate ``cand``'s pre-validated ``k``."""
        self.probing = False
        if k <= 0:
            return 0
        best = best_draft_length([expected_accepts(cand, k)], self.cost.pass_cost())
        if best > 0:
            self.interval = self.MIN_INTERVAL
            self.skipped = 0
            return best
        self.skipped += 1
        if self.skipped < self.interval:
            self.off_steps += 1
            return 0
        self.skipped = 0
        self.probing = True
        self.probes += 1
        return min(self.PROBE, k)

    def observe(self, positions: int, seconds: float, accepted: int) -> None:
        """Record a step's pass over ``positions`` positions taking ``seconds`` (the parts that
        grow with the draft: masks, forward, verification) and its ``accepted`` drafts."""
        self.cost.add(positions, seconds)
        if self.probing:
            # a probe counts as paying when its tokens came faster than one-token passes give
            # them, not merely when a draft was accepted: where one-position passes are much
            # cheaper than longer ones, accepted probes that do not pay would keep probing
            cost = self.cost.pass_cost()
            paid = (accepted + 1) * cost(1) > cost(positions)
            self.interval = self.MIN_INTERVAL if paid else min(2 * self.interval, self.MAX_INTERVAL)


def pacing_prior(device: torch.device | str) -> float:
    """The cost model's prior ``fixed`` (in positions) before any pass was timed: large on
    CUDA, where a pass is memory-bound and extra positions are nearly free; moderate on the
    CPU, where a float32 pass grows with its positions from a few upwards (bfloat16 passes of
    larger models much less: the fit takes over after a few steps)."""
    import torch

    return 32.0 if torch.device(device).type == "cuda" else 8.0
