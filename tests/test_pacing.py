"""Drafts over repeating outputs and the pacing of speculation.

* :class:`~structgen.generation.drafters.NgramDrafter` continues a repeating token sequence (the
  oracle: the text the repetition spells, decoded by the tokenizer);
* a bigram Llama stuck in a loop (``tests/_tiny_lm.build_cycle_llama``) gets multi-token drafts
  accepted: tokens per target pass from the call's own statistics, output token-identical to
  plain constrained decoding;
* :func:`~structgen.generation.pacing.best_draft_length` against brute force over all lengths;
  :class:`~structgen.generation.pacing.StepCost` recovers a known line from its samples;
  :class:`~structgen.generation.pacing.SequencePacer` turns speculation off where it cannot pay
  and probes with a backing-off interval; greedy output stays identical to plain decoding
  whatever the cuts.

No timing assertions: where the cost model matters, a fixed one (``StepCost(fixed=True)``) is
patched in, so the cuts depend on the drafters' record only.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from _tiny_lm import build_cycle_llama

import structgen
from structgen.config import SpecConfig
from structgen.generation import loop as loop_mod
from structgen.generation.drafters import NgramDrafter
from structgen.generation.pacing import SequencePacer, StepCost, best_draft_length, linear_cost

pytestmark = pytest.mark.assets


@pytest.fixture(scope="module")
def gpt2(tokenizer_by_alias):
    return tokenizer_by_alias("gpt2")


@pytest.mark.parametrize("text, period", [
    ('{"x": "121212121212121212', "12"),
    ('{"m": [[10,10],[10,10],[10,10],[10,', "10],[10,"),
    ('{"s": "A-Z-A-Z-A-Z-A-Z-A', "-Z-A"),
])
def test_ngram_drafter_continues_a_repetition(gpt2, text: str, period: str) -> None:
    ids = gpt2.encode(text)
    d = NgramDrafter(SpecConfig())
    for n in range(2, len(ids) + 1):   # called once per committed token, as the loop does
        draft = d.propose(ids[:n], 12)
    assert len(draft) == 12
    cont = gpt2.decode(draft)
    # the draft is the repetition continued (the oracle: the repeated text itself)
    expect = (period * 40)[: len(cont)]
    assert cont == expect, (cont, expect)


def test_ngram_drafter_needs_an_earlier_occurrence(gpt2) -> None:
    d = NgramDrafter(SpecConfig())
    ids = gpt2.encode("a b c d e f g")
    assert d.propose(ids, 8) == []             # no tail n-gram occurred before
    # the most recent earlier occurrence of the longest tail n-gram (here " x", one token)
    assert gpt2.decode(NgramDrafter(SpecConfig()).propose(gpt2.encode(" x y z x"), 2)) == " y z"


def _fixed_cost(monkeypatch, fixed_positions: float) -> None:
    monkeypatch.setattr(loop_mod, "shared_step_cost",
                        lambda lm, prior: StepCost(fixed_positions, fixed=True))


LOOPS = [  # (the bigram model's cycle, constraint, prompt, a period of the looping output)
    (["1", "2"], {"regex": "[0-9]{120}"}, "Digits: 12", "21"),
    (["[", "10", ",", "5", "],"],
     {"schema": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}},
     "Pairs: [", "[],"),
    (["A", "-", "Z", "+"], {"schema": {"type": "object", "properties": {"s": {"type": "string"}}}},
     "Z", "A-Z+"),
]


@pytest.mark.parametrize("paced", [False, True])
@pytest.mark.parametrize("case", range(len(LOOPS)))
def test_looping_output_gets_long_drafts_accepted(gpt2, monkeypatch, case: int, paced: bool) -> None:
    """A model stuck in a loop (``2121...``, ``[[],[],...``, ``"A-Z+A-Z+...``): before the
    n-gram drafter, prompt lookup proposed about 1 token in 60 there and every step was a
    one-token pass. Now the output's own n-grams are drafted and accepted whole."""
    from structgen.generation.model import CausalLM

    cycle, constraint, prompt, period = LOOPS[case]
    lm = CausalLM(build_cycle_llama(gpt2, cycle), gpt2)
    monkeypatch.setattr(loop_mod, "SEQUENCE_PACING", paced)
    _fixed_cost(monkeypatch, 8.0)   # a CPU-like pass: its fixed part worth 8 positions
    kw = dict(prompt=prompt, max_new_tokens=100, **constraint)
    plain = structgen.generate(lm, speculative=False, **kw)
    spec = structgen.generate(lm, speculative=True, **kw)
    assert period * 12 in plain.text                      # the model loops
    assert spec.tokens == plain.tokens
    st = spec.stats
    ngram = st.drafters["ngram"]
    assert ngram["accepted"] >= 60 and ngram["accepted"] >= 0.9 * ngram["proposed"]
    assert st.new_tokens / st.forward_passes > 4.0        # one-token steps before: 1.0


def test_best_draft_length_is_the_brute_force_optimum() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        b = int(torch.randint(1, 4, (1,), generator=gen))
        curves = []
        for _row in range(b):
            k = int(torch.randint(0, 9, (1,), generator=gen))
            r = float(torch.rand(1, generator=gen))
            curves.append([r ** (j + 1) for j in range(k)])
        fixed = float(torch.rand(1, generator=gen)) * 20
        top = max(len(c) for c in curves)

        rates = [(b + sum(sum(c[:k]) for c in curves)) / (fixed + b * (k + 1)) for k in range(top + 1)]
        best = max(rates)
        got = best_draft_length(curves, linear_cost(fixed))
        assert rates[got] >= best * (1 - 1e-9)
        assert all(r < best * (1 - 1e-12) for r in rates[:got])  # the shortest best length


def test_step_cost_fits_a_line_and_keeps_its_prior_until_it_can() -> None:
    c = StepCost(12.0)
    c.add(1, 0.0105)
    c.add(2, 0.013)
    assert c.fixed_positions() == 12.0       # spread below MIN_SPREAD: the prior
    for positions in (1, 3, 5, 9, 13) * 3:
        c.add(positions, 0.008 + 0.0025 * positions)   # fixed part = 3.2 positions
    assert c.fixed_positions() == pytest.approx(3.2, rel=1e-6)
    flat = StepCost(12.0)
    for positions in (1, 5, 9):
        flat.add(positions, 0.01)             # a pass costs the same whatever its size
    assert flat.fixed_positions() == 12.0     # no increasing fit: the prior
    frozen = StepCost(7.0, fixed=True)
    for positions in (1, 5, 9):
        frozen.add(positions, positions * 1.0)
    assert frozen.fixed_positions() == 7.0


class _Drafter:
    def __init__(self, r: float) -> None:
        self.r = r

    def position_estimate(self, i: int) -> float:
        return self.r


class _Cand:
    def __init__(self, r: float, k: int) -> None:
        self.segments = [(_Drafter(r), k)]


def test_pacer_switches_off_and_probes_with_back_off() -> None:
    pacer = SequencePacer(StepCost(0.0, fixed=True))   # every position costs the same
    # 60% acceptance cannot pay when a position costs as much as the whole pass: k = 0
    sent = []
    for _ in range(8 + 16 + 32 + 64):
        k = pacer.length(_Cand(0.6, 6), 6)
        sent.append(k)
        pacer.observe(k + 1, 1.0, 0)      # every probe fails
    probes = [i for i, k in enumerate(sent) if k]
    assert all(sent[i] == SequencePacer.PROBE for i in probes)
    assert [b - a for a, b in itertools.pairwise([-1] + probes)] == [8, 16, 32, 64]
    # where drafts pay, nothing is cut and the interval resets
    cheap = SequencePacer(StepCost(20.0, fixed=True))
    assert cheap.length(_Cand(0.9, 10), 10) == 10


def test_switched_off_speculation_is_plain_decoding(tiny_random_lm, monkeypatch) -> None:
    """With a pass costing as much per position as in fixed overhead (fixed = 0) a random
    model's drafts never pay: the steps are one-token passes but for the probes, and the
    greedy tokens are plain decoding's."""
    _fixed_cost(monkeypatch, 0.0)
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
    kw = dict(schema=schema, prompt="Fill a and b:", max_new_tokens=60)
    plain = structgen.generate(tiny_random_lm, speculative=False, **kw)
    spec = structgen.generate(tiny_random_lm, speculative=True, **kw)
    assert spec.tokens == plain.tokens
    # tokens drafted per pass stay small: mostly one-token passes
    assert spec.stats.drafted <= 0.5 * spec.stats.forward_passes + 12


@pytest.fixture(scope="module")
def tiny_random_lm(gpt2):
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    return CausalLM(build_tiny_llama(gpt2, "random"), gpt2)


@pytest.mark.parametrize("fixed", [0.0, 2.0, 50.0])
def test_greedy_output_identical_to_plain_under_any_cut(tiny_random_lm, monkeypatch, fixed) -> None:
    _fixed_cost(monkeypatch, fixed)
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "tags"]}
    for prompt in ('name: "ab ab ab ab", tags: ["ab", "ab", "ab"] ->', "JSON please:"):
        kw = dict(schema=schema, prompt=prompt, max_new_tokens=50)
        plain = structgen.generate(tiny_random_lm, speculative=False, **kw)
        spec = structgen.generate(tiny_random_lm, speculative=True,
                                  config=SpecConfig(max_draft_tokens=8), **kw)
        assert spec.tokens == plain.tokens


def test_step_cost_forgets_pass_sizes_it_no_longer_sees() -> None:
    # long passes measured under load, then only short ones: the stale means must fade so
    # that the prior (and with it long drafts that re-measure the machine) comes back
    c = StepCost(8.0)
    for positions in (2, 3, 9, 13) * 4:
        c.add(positions, 0.4 + 0.3 * positions)           # busy machine: steep per position
    steep = c.fixed_positions()
    assert steep == pytest.approx(0.4 / 0.3, rel=1e-6)
    for _ in range(StepCost.HALF_LIFE * 5):
        c.add(2, 0.1)
        c.add(3, 0.11)
    assert c.fixed_positions() == 8.0                      # only sizes 2 and 3 left: the prior
    for positions in (2, 3, 9, 13) * 8:
        c.add(positions, 0.1 + 0.01 * positions)           # quiet machine: cheap positions
    assert c.fixed_positions() > 4 * steep


def test_pass_cost_follows_each_size_where_the_cost_is_not_a_line() -> None:
    """On llama.cpp's CPU build a one-position pass (a matrix-vector product) costs a third of
    a two-position one: the per-size means carry that, the line only fills unmeasured sizes,
    and drafts that pay under a line are not sent."""
    c = StepCost(8.0)
    times = {1: 0.0195, 2: 0.0708, 3: 0.0903, 4: 0.100, 7: 0.159}
    for _ in range(4):
        for n, t in times.items():
            c.add(n, t)
    cost = c.pass_cost()
    assert all(cost(n) == pytest.approx(t) for n, t in times.items())
    assert cost(3) < cost(5) < cost(7)                           # a line between measured sizes
    # six forced tokens, always accepted: 7 tokens in 159 ms lose to 7 one-token passes (137 ms)
    assert best_draft_length([[1.0] * 6], cost) == 0
    assert best_draft_length([[1.0] * 6], linear_cost(c.fixed_positions())) == 6   # a line says send
    # a probe whose drafts were all accepted still did not pay: the probes back off
    pacer = SequencePacer(c)
    sent = []
    for _ in range(8 + 16 + 32):
        k = pacer.length(_Cand(1.0, 2), 2)
        sent.append(k)
        pacer.observe(k + 1, times[k + 1], k)
    probes = [i for i, k in enumerate(sent) if k]
    assert [b - a for a, b in itertools.pairwise([-1] + probes)] == [8, 16, 32]
