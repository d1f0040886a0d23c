"""Verify contract on the CPU with the torch reference backend.

Three levels: exact greedy cases from hand-built logits, seeded determinism, and distribution
tests (the empirical distribution of the emitted tokens against the masked target
distribution computed independently here with numpy in float64). Plus input checking, the
buffer pool, the kernel-module loader and the CPU behaviour of the overlap helpers.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen.errors import StructgenError, VerifyError
from structgen.generation.verify import (
    MAX_DRAFT,
    SideStream,
    VerifyBufferPool,
    VerifyOutput,
    load_kernels,
    pinned_empty,
    resolve_backend,
    upload_async,
    verify,
)

NINF = float("-inf")
REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------
# helpers

def pack(allowed: np.ndarray) -> torch.Tensor:
    """bool [R, V] -> int32 [R, ceil(V/32)] (bit j of word w = token 32w+j), built bit by bit."""
    rows, vocab = allowed.shape
    words = np.zeros((rows, (vocab + 31) // 32), dtype=np.int64)
    for r, t in zip(*np.nonzero(allowed)):
        words[r, t // 32] |= 1 << (t % 32)
    words = np.where(words >= 2**31, words - 2**32, words)
    return torch.tensor(words, dtype=torch.int32)


def run(drafts: list[list[int]], logits: list[list[float]] | np.ndarray, allowed=None, **kw) -> VerifyOutput:
    """Verify sequences given as per-sequence draft lists; rows follow the contract's order."""
    flat = [t for d in drafts for t in d]
    cu = np.cumsum([len(d) for d in drafts])
    lg = torch.tensor(np.asarray(logits, dtype=np.float32))
    bm = None if allowed is None else pack(np.asarray(allowed, dtype=bool))
    kw.setdefault("backend", "torch")
    return verify(torch.tensor(flat, dtype=torch.int64), torch.tensor(cu, dtype=torch.int32), lg, bm, **kw)


def masked_softmax(logits: np.ndarray, allowed: np.ndarray, temperature: float) -> np.ndarray:
    """The independent oracle: float64 softmax of logits / T over allowed tokens (0 elsewhere)."""
    z = np.where(allowed, logits.astype(np.float64) / temperature, -np.inf)
    z = z - z.max()
    e = np.where(allowed, np.exp(z), 0.0)
    return e / e.sum()


def chi2_quantile(df: int, z: float = 4.753) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 4.753: p = 1e-6)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_distribution(samples: np.ndarray, p: np.ndarray, what: str) -> None:
    """Exact zeros where p = 0; chi-square below its 1 - 1e-6 quantile; TV below 3 / sqrt(n)."""
    n = samples.size
    counts = np.bincount(samples, minlength=p.size).astype(np.float64)
    assert counts.size == p.size, f"{what}: token id out of range"
    zero_hits = np.nonzero(counts * (p == 0))
    assert counts[p == 0].sum() == 0, f"{what}: emitted a token of probability 0: {zero_hits}"
    support = p > 0
    expected = n * p[support]
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    if df >= 1:
        assert stat < chi2_quantile(df), f"{what}: chi2={stat:.1f} df={df} counts={counts} p={p}"
    tv = 0.5 * np.abs(counts / n - p).sum()
    assert tv < 3 / math.sqrt(n), f"{what}: TV {tv:.4f}"


# --------------------------------------------------------------------------------------------
# exact greedy cases

def test_greedy_accepts_all_then_bonus() -> None:
    logits = [[0, 5, 1, 0], [3, 0, 0, 0], [0, 0, 0, 9]]
    out = run([[1, 0]], logits)
    assert out.tokens(0) == [1, 0, 3]
    assert out.num_accepted.tolist() == [2] and out.num_emitted.tolist() == [3]
    assert out.output_token_ids.tolist() == [[1, 0, 3]]
    assert out.error_position.tolist() == [-1]


def test_greedy_first_mismatch_emits_recovered_argmax() -> None:
    logits = [[0, 5, 1, 0], [3, 0, 4, 0], [0, 0, 0, 9]]
    out = run([[1, 0]], logits)
    assert out.output_token_ids.tolist() == [[1, 2, -1]]
    assert out.num_accepted.tolist() == [1]


def test_greedy_ties_lowest_id_wins() -> None:
    logits = [[1, 7, 0, 7, 7], [7, 7, 0, 0, 0], [0, 2, 2, 2, 0]]
    assert run([[3, 0]], logits).output_token_ids.tolist() == [[1, -1, -1]]   # 3 ties with 1: 1 wins
    assert run([[1, 0]], logits).output_token_ids.tolist() == [[1, 0, 1]]
    # a tie across the 32-token word boundary and far apart in the row
    lg = np.zeros((1, 200), dtype=np.float32)
    lg[0, [31, 32, 190]] = 4.0
    assert run([[]], lg).tokens(0) == [31]


def test_masks_fully_masked_but_one_and_eos_only() -> None:
    vocab = 70  # not a multiple of 32
    lg = np.random.default_rng(0).normal(size=(3, vocab)).astype(np.float32)
    lg[0, 5] = -30.0                       # the only allowed token has the lowest logit
    allowed = np.zeros((3, vocab), dtype=bool)
    allowed[0, 5] = True
    allowed[1, :] = True
    allowed[2, vocab - 1] = True            # EOS (last id) is the only allowed token
    argmax1 = int(np.argmax(lg[1]))
    out = run([[5, argmax1]], lg, allowed)
    assert out.tokens(0) == [5, argmax1, vocab - 1]
    # the same with sampling: a single allowed token is accepted and drawn with certainty
    for seed in range(8):
        o = run([[5, argmax1]], lg, allowed, temperature=torch.tensor([1.3]), uniforms=seed)
        toks = o.tokens(0)
        assert toks[0] == 5 and o.num_accepted.item() >= 1        # p(5) = 1: always accepted
        if o.num_accepted.item() == 2:
            assert toks[2] == vocab - 1                            # bonus: EOS with certainty
        else:
            assert toks[1] != argmax1                              # recovered: never the rejected draft


def test_bits_beyond_vocab_are_ignored() -> None:
    vocab = 37
    lg = np.zeros((1, vocab), dtype=np.float32)
    lg[0, 36] = -1.0
    words = torch.tensor([[0, -1]], dtype=torch.int32)   # only tokens 32..63 allowed; 37..63 padding
    out = verify(torch.zeros(0, dtype=torch.int64), torch.tensor([0], dtype=torch.int32),
                 torch.tensor(lg), words, backend="torch")
    assert out.tokens(0) == [32]
    # a wider bitmask than ceil(V/32) words is accepted, the extra words ignored
    wide = torch.tensor([[0, 1 << 4, -1]], dtype=torch.int32)
    out = verify(torch.zeros(0, dtype=torch.int64), torch.tensor([0], dtype=torch.int32),
                 torch.tensor(lg), wide, backend="torch")
    assert out.tokens(0) == [36]
    # sampling never draws a padding token
    for seed in range(20):
        o = verify(torch.zeros(0, dtype=torch.int64), torch.tensor([0], dtype=torch.int32),
                   torch.tensor(lg), words, temperature=torch.tensor([5.0]), uniforms=seed, backend="torch")
        assert 32 <= o.tokens(0)[0] < vocab


def test_fully_masked_row_is_an_error_not_a_token() -> None:
    lg = np.zeros((3, 8), dtype=np.float32)
    lg[0, 2] = 1
    allowed = np.ones((3, 8), dtype=bool)
    allowed[1] = False
    out = run([[2, 3]], lg, allowed)
    assert out.num_accepted.tolist() == [-1] and out.num_emitted.tolist() == [0]
    assert out.error_position.tolist() == [1]
    assert out.output_token_ids.tolist() == [[-1, -1, -1]]
    assert out.tokens(0) == []
    with pytest.raises(VerifyError) as ei:
        out.raise_on_error()
    assert isinstance(ei.value, StructgenError) and ei.value.sequence == 0 and ei.value.position == 1
    # a fully masked row the chain never reaches is not an error
    out = run([[5, 3]], lg, allowed)
    assert out.tokens(0) == [2] and out.error_position.tolist() == [-1]
    out.raise_on_error()
    # sampling reports it the same way
    out = run([[2, 3]], lg, allowed, temperature=torch.tensor([1.0]),
              uniforms=torch.zeros(3, 2, dtype=torch.float64))
    assert out.error_position.tolist() == [1] and out.num_accepted.tolist() == [-1]


def test_non_finite_logits() -> None:
    lg = np.zeros((1, 6), dtype=np.float32)
    lg[0, 1] = 2
    lg[0, 4] = np.nan
    allowed = np.ones((1, 6), dtype=bool)
    assert run([[]], lg, allowed).error_position.tolist() == [0]          # NaN on an allowed token
    allowed[0, 4] = False
    assert run([[]], lg, allowed).tokens(0) == [1]                        # NaN on a masked token: fine
    lg2 = np.full((1, 6), NINF, dtype=np.float32)
    lg2[0, 0] = 1
    allowed2 = np.ones((1, 6), dtype=bool)
    allowed2[0, 0] = False
    assert run([[]], lg2, allowed2).error_position.tolist() == [0]        # only -inf logits allowed
    lg3 = np.zeros((1, 6), dtype=np.float32)
    lg3[0, 3] = np.inf
    assert run([[]], lg3).error_position.tolist() == [0]                  # +inf allowed


def test_mixed_greedy_and_sampling_sequences() -> None:
    rng = np.random.default_rng(1)
    vocab = 50
    drafts = [[3, 4], [7], [], [1, 2, 3]]
    rows = sum(len(d) + 1 for d in drafts)
    lg = rng.normal(size=(rows, vocab)).astype(np.float32) * 2
    allowed = rng.random((rows, vocab)) < 0.6
    allowed[:, 0] = True
    # greedy answers computed independently, sequence by sequence
    expect = {}
    r = 0
    for b, d in enumerate(drafts):
        toks = []
        for i in range(len(d) + 1):
            am = int(np.argmax(np.where(allowed[r + i], lg[r + i], -np.inf)))
            if i < len(d) and d[i] == am:
                toks.append(am)
                continue
            toks.append(am)
            break
        expect[b] = toks
        r += len(d) + 1
    temp = torch.tensor([0.0, 0.9, 0.0, 1.2])
    seen = set()
    for seed in range(10):
        out = run(drafts, lg, allowed, temperature=temp, uniforms=seed)
        assert out.tokens(0) == expect[0] and out.tokens(2) == expect[2]
        seen.add(tuple(out.tokens(3)))
        for b in (1, 3):
            toks = out.tokens(b)
            row0 = sum(len(d) + 1 for d in drafts[:b])
            for i, t in enumerate(toks):
                assert allowed[row0 + i, t]
    assert len(seen) > 1  # the sampling sequence does depend on the uniforms
    assert run(drafts, lg, allowed).tokens(0) == expect[0]   # temperature None: all greedy


def test_zero_draft_sequences_and_empty_batch_drafts() -> None:
    lg = np.eye(4, dtype=np.float32)[[2, 1, 3]]
    out = run([[], [], []], lg)
    assert out.output_token_ids.tolist() == [[2], [1], [3]]
    assert out.num_accepted.tolist() == [0, 0, 0]


def test_out_of_range_draft() -> None:
    lg = np.zeros((2, 4), dtype=np.float32)
    lg[0, 1] = 1
    with pytest.raises(ValueError, match="draft_token_ids"):
        run([[9]], lg)
    out = run([[9]], lg, check_inputs=False, max_draft=1)
    assert out.tokens(0) == [1]
    out = run([[9]], lg, check_inputs=False, max_draft=1, temperature=torch.tensor([1.0]), uniforms=0)
    assert out.num_accepted.tolist() == [0]


def test_input_validation_raises_value_error() -> None:
    d = torch.tensor([1], dtype=torch.int64)
    cu = torch.tensor([1], dtype=torch.int32)
    lg = torch.zeros(2, 40)
    bm = torch.full((2, 2), -1, dtype=torch.int32)
    cases = [
        dict(target_logits=torch.zeros(3, 40)),
        dict(target_logits=torch.zeros(2, 40, dtype=torch.float64)),
        dict(bitmask=torch.full((2, 1), -1, dtype=torch.int32)),
        dict(bitmask=bm.to(torch.int64)),
        dict(draft_token_ids=d.float()),
        dict(cu_num_draft_tokens=torch.tensor([2], dtype=torch.int32)),
        dict(draft_probs=torch.zeros(2, 40)),
        dict(temperature=torch.tensor([1.0, 1.0])),
        dict(temperature=torch.tensor([-1.0])),
        dict(temperature=torch.tensor([1.0]), top_p=torch.tensor([0.0])),
        dict(temperature=torch.tensor([1.0]), uniforms=torch.zeros(2, 2)),
        dict(temperature=torch.tensor([1.0]), uniforms=torch.zeros(2, 1, dtype=torch.float64)),
        dict(temperature=torch.tensor([1.0]), uniforms=torch.ones(2, 2, dtype=torch.float64)),
        dict(temperature=torch.tensor([1.0]), uniforms="seed"),
        dict(backend="cuda"),
        dict(max_draft=MAX_DRAFT + 1),
        dict(max_draft=0),
        dict(out=VerifyOutput.allocate(2, 1)),
    ]
    for case in cases:
        args = dict(draft_token_ids=d, cu_num_draft_tokens=cu, target_logits=lg, bitmask=bm)
        args.update(case)
        with pytest.raises(ValueError):
            verify(**args)
    with pytest.raises(ValueError, match="MAX_DRAFT|up to"):
        n = MAX_DRAFT + 1
        verify(torch.zeros(n, dtype=torch.int64), torch.tensor([n], dtype=torch.int32),
               torch.zeros(n + 1, 8), None)


def test_output_into_preallocated_out() -> None:
    out = VerifyOutput.allocate(1, 4)
    res = run([[1, 0]], [[0, 5, 1, 0], [3, 0, 0, 0], [0, 0, 0, 9]], out=out)
    assert res is out
    assert out.output_token_ids.tolist() == [[1, 0, 3, -1, -1]]


# --------------------------------------------------------------------------------------------
# determinism

def _random_case(seed: int, batch: int = 6, k: int = 4, vocab: int = 300):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, k + 1, (batch,), generator=g)
    cu = torch.cumsum(counts, 0).to(torch.int32)
    n = int(cu[-1])
    lg = torch.randn(n + batch, vocab, generator=g) * 2
    bm = torch.randint(-2**31, 2**31 - 1, (n + batch, (vocab + 31) // 32), generator=g,
                       dtype=torch.int64).to(torch.int32)
    drafts = torch.randint(0, vocab, (n,), generator=g)
    probs = torch.softmax(torch.randn(n, vocab, generator=g), -1)
    return drafts, cu, lg, bm, probs


def test_seeded_determinism() -> None:
    d, cu, lg, bm, probs = _random_case(0)
    temp = torch.tensor([0.0, 0.5, 1.0, 1.0, 2.0, 0.7])
    for dp in (None, probs):
        a = verify(d, cu, lg, bm, dp, temperature=temp, uniforms=123, backend="torch")
        b = verify(d, cu, lg, bm, dp, temperature=temp, uniforms=123, backend="torch")
        c = verify(d, cu, lg, bm, dp, temperature=temp, uniforms=torch.Generator().manual_seed(123),
                   backend="torch")
        u = torch.rand((lg.shape[0], 2), dtype=torch.float64, generator=torch.Generator().manual_seed(123))
        e = verify(d, cu, lg, bm, dp, temperature=temp, uniforms=u, backend="torch")
        for o in (b, c, e):
            assert torch.equal(a.output_token_ids, o.output_token_ids)
            assert torch.equal(a.num_accepted, o.num_accepted)
    outs = {tuple(verify(d, cu, lg, bm, temperature=temp, uniforms=s, backend="torch")
                  .output_token_ids.flatten().tolist()) for s in range(8)}
    assert len(outs) > 1


def test_race_noise_matches_its_definition() -> None:
    """The noise hash equals a plain-Python transcription of the documented formula."""
    ref = load_kernels("torch_ref")
    M = 0xFFFFFFFF

    def mix(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & M
        x ^= x >> 15
        x = (x * 0x846CA68B) & M
        return x ^ (x >> 16)

    u1 = [0.0, 0.25, 0.999999, 0.123456789]
    seeds = ref.race_seeds(torch.tensor(u1, dtype=torch.float64))
    noise = ref.gumbel_noise(seeds, 70)
    for i, u in enumerate(u1):
        s = mix(int(u * 2**32) & M)
        assert int(seeds[i]) == s
        for j in (0, 1, 31, 32, 69):
            h = mix(((j * 0x9E3779B1) & M) ^ s)
            uu = np.float32(((h >> 9) + 0.5) * 2.0**-23)
            g = -np.log(-np.log(np.float64(uu)))
            assert abs(float(noise[i, j]) - g) < 1e-5 * max(1.0, abs(g))
    assert float(noise.max()) < ref.GUMBEL_BOUND


# --------------------------------------------------------------------------------------------
# property test against a plain-Python transcription of the documented semantics

_M32 = 0xFFFFFFFF


def _mix(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _noise(u1: float, vocab: int) -> np.ndarray:
    seed = _mix(int(u1 * 2**32) & _M32)
    g = np.empty(vocab, dtype=np.float32)
    for j in range(vocab):
        h = _mix(((j * 0x9E3779B1) & _M32) ^ seed)
        u = np.float32((h >> 9) + 0.5) * np.float32(2.0**-23)
        g[j] = -np.log(-np.log(u))
    return g


def _argmax_lowest(x: np.ndarray) -> int:
    best = x.max()
    return -1 if best == -np.inf else int(np.nonzero(x == best)[0][0])


def oracle(drafts: list[list[int]], logits: np.ndarray, allowed: np.ndarray, temps: list[float],
           probs: np.ndarray | None, unif: np.ndarray, max_draft: int) -> list[list[int]]:
    """Sequence by sequence, row by row, in numpy scalars: what torch_ref's docstring says."""
    out = []
    r = d = 0
    for b, ds in enumerate(drafts):
        t = np.float32(temps[b])
        sampling = t >= 1e-5
        inv = np.float32(1) / t if sampling else np.float32(1)
        toks: list[int] = []
        for i in range(len(ds) + 1):
            v = logits[r + i].astype(np.float32) * inv
            vm = np.where(allowed[r + i], v, np.float32(-np.inf)).astype(np.float32)
            if vm.max() == -np.inf:
                toks = []
                break
            arg = _argmax_lowest(vm)
            if not sampling:
                if i < len(ds) and ds[i] == arg:
                    toks.append(ds[i])
                    continue
                toks.append(arg)
                break
            m = vm.max()
            w = np.exp((vm - m).astype(np.float32)).astype(np.float32)
            z = float(w.astype(np.float64).sum())
            g = _noise(float(unif[r + i, 1]), vm.size)
            if i == len(ds):
                toks.append(_argmax_lowest((vm + g).astype(np.float32)))
                break
            x = ds[i]
            q = 1.0 if probs is None else float(np.float32(probs[d + i, x]))
            if float(unif[r + i, 0]) * q < float(w[x]) / z:
                toks.append(x)
                continue
            if probs is None:
                key = (vm + g).astype(np.float32)
                key[x] = -np.inf
                toks.append(_argmax_lowest(key))
            else:
                p = (w / np.float32(z)).astype(np.float32)
                res = (p - probs[d + i].astype(np.float32)).astype(np.float32)
                ok = (vm > -np.inf) & (res > 0)
                key = np.where(ok, np.log(np.where(ok, res, 1)).astype(np.float32) + g, -np.inf)
                win = _argmax_lowest(key.astype(np.float32))
                toks.append(win if win >= 0 else _argmax_lowest((vm + g).astype(np.float32)))
            break
        out.append(toks + [-1] * (max_draft + 1 - len(toks)))
        r += len(ds) + 1
        d += len(ds)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reference_matches_python_transcription(data: st.DataObject) -> None:
    vocab = data.draw(st.integers(1, 70), label="vocab")
    batch = data.draw(st.integers(1, 4), label="batch")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    rng = np.random.default_rng(seed)
    drafts = [list(rng.integers(0, vocab, size=rng.integers(0, 4))) for _ in range(batch)]
    rows = sum(len(d) + 1 for d in drafts)
    logits = rng.integers(-3, 4, size=(rows, vocab)).astype(np.float32)   # small ints: many ties
    allowed = rng.random((rows, vocab)) < rng.uniform(0.05, 1.0)
    allowed[np.arange(rows), rng.integers(0, vocab, size=rows)] = True
    r = 0
    for ds in drafts:                          # drafts mostly follow the masked argmax
        for i in range(len(ds)):
            if rng.random() < 0.7:
                ds[i] = int(np.argmax(np.where(allowed[r + i], logits[r + i], -np.inf)))
        r += len(ds) + 1
    temps = [float(rng.choice([0.0, 0.5, 1.0, 2.0])) for _ in range(batch)]
    use_probs = bool(rng.random() < 0.5)
    n = sum(len(d) for d in drafts)
    probs = rng.dirichlet(np.ones(vocab), size=n).astype(np.float32) if use_probs else None
    unif = rng.random((rows, 2))
    max_draft = max(len(d) for d in drafts)
    out = run(drafts, logits, allowed, draft_probs=None if probs is None else torch.tensor(probs),
              temperature=torch.tensor(temps), uniforms=torch.tensor(unif))
    assert out.output_token_ids.tolist() == oracle(drafts, logits, allowed, temps, probs, unif, max_draft)


# --------------------------------------------------------------------------------------------
# distribution tests (reference backend)

VOCAB = 12
_LOGITS = np.array([1.5, 0.2, -0.4, 2.2, 0.0, -1.0, 1.1, 0.7, 3.0, -2.0, 0.4, 1.9], dtype=np.float32)
_ALLOWED = np.array([1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1], dtype=bool)   # the top logit (8) is masked
_BONUS_LOGITS = np.array([0.3, 1.0, 2.0, -1.0, 0.5, 0.5, 0.0, 1.5, -0.5, 0.9, 0.1, -3.0], dtype=np.float32)
_BONUS_ALLOWED = np.array([1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1], dtype=bool)


def _one_draft_batch(n: int, draft: np.ndarray, temperature: float, probs: np.ndarray | None = None,
                     top_p: float | None = None, seed: int = 0) -> VerifyOutput:
    """n sequences, each one draft token over identical logit rows (draft row, bonus row)."""
    lg = np.stack([_LOGITS, _BONUS_LOGITS] * n)
    allowed = np.stack([_ALLOWED, _BONUS_ALLOWED] * n)
    return verify(torch.tensor(draft, dtype=torch.int64), torch.arange(1, n + 1, dtype=torch.int32),
                  torch.tensor(lg), pack(allowed),
                  None if probs is None else torch.tensor(probs, dtype=torch.float32),
                  temperature=torch.full((n,), temperature),
                  top_p=None if top_p is None else torch.full((n,), top_p),
                  uniforms=seed, backend="torch")


N_SAMPLES = 20000


@pytest.mark.parametrize("draft_token", [3, 8, 11])   # likely, masked, mid
def test_distribution_deterministic_drafts(draft_token: int) -> None:
    """A deterministic proposal (q = point mass): the first emitted token is distributed as p
    exactly; after an accepted draft the bonus token is distributed as the bonus row's p."""
    t = 0.8
    out = _one_draft_batch(N_SAMPLES, np.full(N_SAMPLES, draft_token), t, seed=draft_token)
    toks = out.output_token_ids.numpy()
    p = masked_softmax(_LOGITS, _ALLOWED, t)
    assert_distribution(toks[:, 0], p, f"first token (draft {draft_token})")
    acc = out.num_accepted.numpy()
    px = p[draft_token]
    assert abs(acc.mean() - px) < 4 * math.sqrt(px * (1 - px) / N_SAMPLES) + 1e-12   # P(accept) = p(x)
    if px > 0.1:
        bonus = masked_softmax(_BONUS_LOGITS, _BONUS_ALLOWED, t)
        assert_distribution(toks[acc == 1, 1], bonus, "bonus token")


def test_distribution_draft_probabilities() -> None:
    """Drafts sampled from q (with mass on masked tokens too): the first token is distributed
    as p and the acceptance rate is sum(min(p, q))."""
    t = 1.3
    rng = np.random.default_rng(7)
    q = rng.dirichlet(np.ones(VOCAB) * 0.7)
    draft = rng.choice(VOCAB, size=N_SAMPLES, p=q)
    probs = np.tile(q, (N_SAMPLES, 1))
    out = _one_draft_batch(N_SAMPLES, draft, t, probs=probs, seed=11)
    toks = out.output_token_ids.numpy()
    p = masked_softmax(_LOGITS, _ALLOWED, t)
    assert_distribution(toks[:, 0], p, "first token with draft probs")
    rate = np.minimum(p, q).sum()
    acc = out.num_accepted.numpy()
    assert abs(acc.mean() - rate) < 4 * math.sqrt(rate * (1 - rate) / N_SAMPLES)


def test_distribution_top_p() -> None:
    t, top_p = 1.0, 0.7
    p = masked_softmax(_LOGITS, _ALLOWED, t)
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(VOCAB, dtype=bool)
    mass = 0.0
    for j in order:
        keep[j] = True
        mass += p[j]
        if mass >= top_p:
            break
    nucleus = np.where(keep, p, 0.0)
    nucleus /= nucleus.sum()
    out = _one_draft_batch(N_SAMPLES, np.full(N_SAMPLES, 6), t, top_p=top_p, seed=5)
    assert_distribution(out.output_token_ids.numpy()[:, 0], nucleus, "first token under top-p")


def test_distribution_bonus_only_high_temperature() -> None:
    n = N_SAMPLES
    lg = np.tile(_BONUS_LOGITS, (n, 1))
    allowed = np.tile(_BONUS_ALLOWED, (n, 1))
    out = verify(torch.zeros(0, dtype=torch.int64), torch.zeros(n, dtype=torch.int32), torch.tensor(lg),
                 pack(allowed), temperature=torch.full((n,), 3.0), uniforms=99, backend="torch")
    p = masked_softmax(_BONUS_LOGITS, _BONUS_ALLOWED, 3.0)
    assert_distribution(out.output_token_ids.numpy()[:, 0], p, "bonus at T=3")


# --------------------------------------------------------------------------------------------
# buffer pool, loader, overlap helpers

def test_buffer_pool_reuses_vocabulary_sized_buffers() -> None:
    pool = VerifyBufferPool()
    batch, max_draft, vocab = 3, 4, 100
    buf = pool.get(batch, max_draft, vocab, torch.float32, "cpu")
    start = pool.vocab_allocations
    assert start > 0
    rng = np.random.default_rng(0)
    for step in range(6):
        assert pool.get(batch, max_draft, vocab, torch.float32, "cpu") is buf
        counts = rng.integers(0, max_draft + 1, size=batch)
        n = int(counts.sum())
        rows = n + batch
        lg, bm = buf.rows(rows)
        lg.copy_(torch.tensor(rng.normal(size=(rows, vocab)), dtype=torch.float32))
        buf.bitmask_host[:rows].fill_(-1)
        assert buf.upload_bitmask(rows) is None   # CPU: the host buffer is the device buffer
        buf.cu_num_draft_tokens.copy_(torch.tensor(np.cumsum(counts), dtype=torch.int32))
        d = buf.draft_token_ids[:n]
        d.copy_(torch.tensor(rng.integers(0, vocab, size=n), dtype=torch.int32))
        out = verify(d, buf.cu_num_draft_tokens, lg, bm, temperature=torch.full((batch,), 0.5 * step),
                     uniforms=step, buffers=buf, check_inputs=False, backend="torch")
        assert out is buf.out
        assert out.output_token_ids.shape == (batch, max_draft + 1)
        assert (out.num_emitted.numpy() >= 1).all()
        assert pool.vocab_allocations == start
    pool.get(batch, max_draft, vocab + 1, torch.float32, "cpu")
    assert pool.vocab_allocations > start and len(pool) == 2


def test_max_draft_constant_matches_reference() -> None:
    assert load_kernels("torch_ref").MAX_DRAFT == MAX_DRAFT


def test_light_import_and_auto_backend_on_cpu() -> None:
    code = (
        "import sys; import structgen.generation.verify as v\n"
        "assert 'torch' not in sys.modules, 'structgen.generation.verify imported torch'\n"
        "import torch\n"
        "assert v.resolve_backend('auto', torch.device('cpu')) == 'torch'\n"
        "o = v.verify(torch.tensor([1]), torch.tensor([1], dtype=torch.int32), torch.eye(3)[[1, 2]], None)\n"
        "assert o.tokens(0) == [1, 2], o\n"
        "assert 'triton' not in sys.modules, 'auto on CPU imported triton'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_resolve_backend() -> None:
    assert resolve_backend("torch", torch.device("cpu")) == "torch"
    assert resolve_backend("triton", torch.device("cpu")) == "triton"
    with pytest.raises(ValueError):
        resolve_backend("cuda", torch.device("cpu"))


def test_overlap_helpers_on_cpu() -> None:
    host = pinned_empty((4, 3), torch.int32)
    host.copy_(torch.arange(12, dtype=torch.int32).reshape(4, 3))
    dev = torch.zeros(4, 3, dtype=torch.int32)
    assert upload_async(host, dev) is None
    assert torch.equal(dev, host)
    side = SideStream("cpu")
    with side.launch() as s:
        assert s is None
    side.join()
    side.synchronize()


def test_triton_backend_on_cpu_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    names = [k for k in sys.modules if k.endswith("kernels.triton_verify")]
    for k in names:
        monkeypatch.delitem(sys.modules, k)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    try:
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            run([[1]], [[0, 2, 1], [1, 0, 0]], backend="triton")
    finally:
        for k in [k for k in sys.modules if k.endswith("kernels.triton_verify")]:
            del sys.modules[k]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_greedy_cpu_fast_path_matches_the_reference(data: st.DataObject) -> None:
    """All-greedy verification on the CPU takes a numpy path: the same outputs as the torch
    reference on the same inputs, ties, masked rows, NaN / +-inf logits and bits past the
    vocabulary included."""
    from structgen.generation.verify import VerifyOutput
    from structgen.kernels.greedy_cpu import verify_greedy
    from structgen.kernels.torch_ref import verify_reference

    vocab = data.draw(st.integers(1, 100), label="vocab")
    batch = data.draw(st.integers(1, 4), label="batch")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    counts = [int(rng.integers(0, 4)) for _ in range(batch)]
    rows = sum(counts) + batch
    logits = rng.integers(-3, 4, size=(rows, vocab)).astype(np.float32)
    specials = rng.random((rows, vocab))
    logits[specials < 0.02] = np.nan
    logits[(specials >= 0.02) & (specials < 0.04)] = np.inf
    logits[(specials >= 0.04) & (specials < 0.08)] = -np.inf
    allowed = rng.random((rows, vocab)) < rng.uniform(0.0, 1.0)
    words = (vocab + 31) // 32 + int(rng.integers(0, 2))
    bits = np.zeros((rows, words * 32), dtype=bool)
    bits[:, :vocab] = allowed
    bits[:, vocab:] = rng.random((rows, words * 32 - vocab)) < 0.5     # ignored past the vocabulary
    bitmask = torch.from_numpy(np.packbits(bits, axis=1, bitorder="little").view(np.int32).copy())
    drafts = torch.tensor(rng.integers(0, vocab, size=sum(counts)), dtype=torch.int64)
    cu = torch.tensor(np.cumsum(counts), dtype=torch.int32)
    max_draft = max(counts) + int(rng.integers(0, 2))
    got, want = VerifyOutput.allocate(batch, max_draft, torch.device("cpu")), \
        VerifyOutput.allocate(batch, max_draft, torch.device("cpu"))
    for mask in (bitmask, None):
        verify_greedy(drafts, cu, torch.from_numpy(logits), mask, got.output_token_ids, got.num_accepted,
                      got.num_emitted, got.error_position)
        verify_reference(drafts, cu, torch.from_numpy(logits), mask, None, None, None, None,
                         want.output_token_ids, want.num_accepted, want.num_emitted, want.error_position)
        for a, b in zip((got.output_token_ids, got.num_accepted, got.num_emitted, got.error_position),
                        (want.output_token_ids, want.num_accepted, want.num_emitted, want.error_position)):
            assert torch.equal(a, b)
