"""Sampling with speculation has the same output distribution as sampling without it.

Oracle: the exact distribution over outputs, computed by enumerating every grammar-allowed
token sequence with plain full-recompute forward passes of the model (masked softmax at each
step). Empirical distributions of plain sampling, speculative sampling with deterministic
drafts (grammar-forced + prompt lookup) and speculative sampling with a grammar-masked draft
model (a different tiny model, so q != p) are each compared with the exact one by a
chi-square goodness-of-fit test at significance 1e-4 (a false alarm about once in 10,000 runs).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy import stats

from structgen.config import SpecConfig
from structgen.frontends.regex import compile_regex
from structgen.generation.loop import run_sequence
from structgen.generation.model import CausalLM, vocabulary_for
from structgen.generation.sampling import masked_logits
from structgen.grammar import ir
from structgen.grammar.compiler import compile_grammar
from structgen.kernels.bitmask import allocate_bitmask
from structgen.masks.matcher import Matcher

pytestmark = [pytest.mark.assets, pytest.mark.slow]

N = 1000
TEMPERATURE = 1.0


def _tiny(tok, seed: int) -> CausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=50304, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(30.0)  # sharpen: a non-trivial distribution over the few allowed tokens
    return CausalLM(m, tok)


def exact_distribution(lm: CausalLM, vocab, grammar, prompt: list[int]) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    eos = set(vocab.eos_token_ids)
    bm = allocate_bitmask(1, lm.vocab_size)

    def rec(m: Matcher, seq: list[int], p: float) -> None:
        m.fill_bitmask(bm, 0)
        with torch.no_grad():
            logits = lm.model(input_ids=torch.tensor([prompt + seq])).logits[0, -1].float()
        probs = torch.softmax(masked_logits(logits, bm[0]) / TEMPERATURE, -1)
        for t in torch.nonzero(probs > 0).flatten().tolist():
            q = p * float(probs[t])
            if t in eos:
                out[tuple(seq)] = out.get(tuple(seq), 0.0) + q
                continue
            f = m.fork()
            assert f.accept_token(t)
            rec(f, seq + [t], q)

    rec(Matcher(grammar, vocab), [], 1.0)
    return out


def chi_square_p(samples: Counter, exact: dict) -> float:
    keys = sorted(exact, key=lambda k: -exact[k])
    expected, observed = [], []
    rest_e, rest_o = 0.0, 0
    for k in keys:
        e = exact[k] * N
        if e >= 5:
            expected.append(e)
            observed.append(samples.get(k, 0))
        else:
            rest_e += e
            rest_o += samples.get(k, 0)
    expected.append(rest_e)
    observed.append(rest_o + sum(v for k, v in samples.items() if k not in exact))
    if len(expected) < 2:
        return 1.0
    f_exp = [e * sum(observed) / sum(expected) for e in expected]
    return float(stats.chisquare(observed, f_exp=f_exp).pvalue)


@pytest.fixture(scope="module")
def setup(tokenizer_by_alias):
    tok = tokenizer_by_alias("gpt2")
    lm = _tiny(tok, 1)
    vocab = vocabulary_for(lm)
    grammar = compile_grammar(ir.Grammar({"s": compile_regex("[ab]{2,3}")}, "s"))
    prompt = tok.encode("ab ba aba bab abb: ab")
    exact = exact_distribution(lm, vocab, grammar, prompt)
    assert abs(sum(exact.values()) - 1.0) < 1e-4
    return tok, lm, vocab, grammar, prompt, exact


def _sample(lm, vocab, grammar, prompt, *, speculative: bool, draft_lm=None) -> tuple[Counter, int]:
    cfg = SpecConfig(temperature=TEMPERATURE, max_draft_tokens=4, min_draft_tokens=2,
                     warmup_proposals=10**9)
    counts: Counter = Counter()
    drafted = 0
    for i in range(N):
        r = run_sequence(lm, vocab, grammar, prompt, cfg, speculative=speculative,
                         max_new_tokens=8, draft_lm=draft_lm, seed=10_000 + i, on_budget="cut")
        assert r.finish_reason == "stop"
        counts[tuple(t for t in r.tokens if t not in vocab.eos_token_ids)] += 1
        drafted += r.stats.drafted
    return counts, drafted


def test_plain_sampling_matches_exact(setup) -> None:
    _tok, lm, vocab, grammar, prompt, exact = setup
    counts, _ = _sample(lm, vocab, grammar, prompt, speculative=False)
    assert chi_square_p(counts, exact) > 1e-4


def test_speculative_sampling_deterministic_drafts(setup) -> None:
    _tok, lm, vocab, grammar, prompt, exact = setup
    counts, drafted = _sample(lm, vocab, grammar, prompt, speculative=True)
    assert drafted > 0  # drafts were actually proposed and verified
    assert chi_square_p(counts, exact) > 1e-4


def test_speculative_sampling_draft_model(setup) -> None:
    tok, lm, vocab, grammar, prompt, exact = setup
    draft = _tiny(tok, 2)
    counts, drafted = _sample(lm, vocab, grammar, prompt, speculative=True, draft_lm=draft)
    assert drafted > 0
    assert chi_square_p(counts, exact) > 1e-4
