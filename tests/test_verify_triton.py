"""The Triton verify kernels against the torch reference, on the CPU via TRITON_INTERPRET=1
(and on a GPU when one is present).

Greedy must be exact (tokens, counts, error positions) over the vocabulary sizes of real
models, 1 to 224 logit rows and fp32/fp16/bf16 logits; sampling must give the same tokens for
the same uniforms.

The cases run in one spawned worker with the interpreter on (``tests/_interp.py``). Each
``check_*`` function is a case; a mismatch raises AssertionError in the worker, which the
test re-raises here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import torch
from _interp import interpreter_worker

from structgen.generation.verify import VerifyOutput, load_kernels, verify

if importlib.util.find_spec("triton") is None:  # pragma: no cover
    pytest.skip("triton is not installed", allow_module_level=True)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
_CASE_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def worker() -> Iterator[ProcessPoolExecutor]:
    yield from interpreter_worker(_CASE_TIMEOUT_S)


def in_worker(worker: ProcessPoolExecutor, fn: Any, *args: Any) -> None:
    worker.submit(fn, *args).result(timeout=_CASE_TIMEOUT_S)


# --------------------------------------------------------------------------------------------
# case construction

def make_case(vocab: int, batch: int, k: int, dtype: torch.dtype, seed: int, *, full: bool = False,
              with_mask: bool = True, probs: bool = False):
    """Random sequences whose drafts mostly follow the masked argmax (so chains run deep), with
    rows of every mask kind: dense, sparse, a single allowed token (often EOS = V-1), all
    allowed; fp32 rows get injected exact ties in distant blocks."""
    ref = load_kernels("torch_ref")
    g = torch.Generator().manual_seed(seed)
    counts = torch.full((batch,), k) if full else torch.randint(0, k + 1, (batch,), generator=g)
    cu = torch.cumsum(counts, 0).to(torch.int32)
    n = int(cu[-1])
    rows = n + batch
    logits = (torch.randn(rows, vocab, generator=g) * 2.5).to(dtype)
    words = (vocab + 31) // 32
    allowed = torch.ones(rows, vocab, dtype=torch.bool)
    for r in range(rows):
        kind = int(torch.randint(0, 5, (1,), generator=g))
        if kind == 0:
            allowed[r] = torch.rand(vocab, generator=g) < 0.5
        elif kind == 1:
            allowed[r] = torch.rand(vocab, generator=g) < 8.0 / vocab
        elif kind == 2:
            allowed[r] = False
            tok = int(torch.randint(0, vocab, (1,), generator=g))
            if torch.rand(1, generator=g) < 0.5:
                tok = vocab - 1                                       # EOS as the only allowed token
            allowed[r, tok] = True
        allowed[r, int(torch.randint(0, vocab, (1,), generator=g))] = True   # never fully masked
    if dtype == torch.float32:
        for r in range(rows):
            ml = torch.where(allowed[r], logits[r], float("-inf"))
            am = int(ml.argmax())
            cand = torch.nonzero(allowed[r]).flatten()
            other = int(cand[int(torch.randint(0, cand.numel(), (1,), generator=g))])
            logits[r, other] = logits[r, am]   # an exact tie, possibly far away from the argmax
    bits = torch.zeros(rows, words * 32, dtype=torch.int64)
    bits[:, :vocab] = allowed.to(torch.int64)
    w = (bits.view(rows, words, 32) << torch.arange(32)).sum(-1)
    bitmask = torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)
    ml = torch.where(allowed, logits.float(), float("-inf"))
    _, _, row_draft = ref.row_layout(cu, n)
    drafts = torch.randint(0, vocab, (n,), generator=g)
    for r in range(rows):
        d = int(row_draft[r])
        if d >= 0 and torch.rand(1, generator=g) < 0.85:
            drafts[d] = int(ml[r].argmax())
    dp = torch.softmax(torch.randn(n, vocab, generator=g) * 2, -1) if probs else None
    return drafts, cu, logits, (bitmask if with_mask else None), dp


def assert_same(a: VerifyOutput, b: VerifyOutput, what: str) -> None:
    for name in ("output_token_ids", "num_accepted", "num_emitted", "error_position"):
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x, y), f"{what}: {name} differs\nreference {x.tolist()}\ntriton    {y.tolist()}"


def both(*args, **kw) -> tuple[VerifyOutput, VerifyOutput]:
    return verify(*args, backend="torch", **kw), verify(*args, backend="triton", **kw)


# --------------------------------------------------------------------------------------------
# cases (run in the worker; CPU tensors, interpreted kernels)

GREEDY_SHAPES = [   # (vocab, batch, k, full): rows = batch * (k + 1) when full
    (1000, 32, 6, True),      # 224 rows
    (1000, 1, 0, True),       # 1 row
    (32000, 4, 6, False),
    (50257, 2, 4, False),
    (128256, 1, 3, True),     # 4 rows
    (151936, 1, 6, True),     # 7 rows
]


def check_greedy(vocab: int, batch: int, k: int, full: bool, dtype: torch.dtype) -> None:
    case = make_case(vocab, batch, k, dtype, seed=vocab + batch, full=full)
    a, b = both(*case)
    assert_same(a, b, f"greedy V={vocab} rows={case[2].shape[0]} {dtype}")
    assert (a.num_accepted >= 0).all()
    # temperature-0 sequences mixed with sampling ones: the greedy ones are unchanged
    temp = torch.tensor([0.0 if i % 2 == 0 else 0.9 for i in range(batch)])
    a2, b2 = both(*case[:4], temperature=temp, uniforms=3)
    assert_same(a2, b2, f"mixed V={vocab} {dtype}")
    greedy = temp == 0
    assert torch.equal(a2.output_token_ids[greedy], a.output_token_ids[greedy])


def check_no_mask_and_errors() -> None:
    case = make_case(1000, 8, 3, torch.float32, seed=1, with_mask=False)
    assert_same(*both(*case), "no mask")
    drafts, cu, logits, bitmask, _ = make_case(1000, 8, 3, torch.bfloat16, seed=2)
    bitmask[3] = 0                    # a fully masked row
    logits[5, 17] = float("nan")      # NaN: an error only where token 17 is allowed
    bitmask[5, 0] |= 1 << 17
    logits[0] = float("-inf")         # only -inf logits
    a, b = both(drafts, cu, logits, bitmask)
    assert_same(a, b, "errors")
    assert (a.error_position >= 0).any()
    a, b = both(drafts, cu, logits, bitmask, temperature=torch.full((8,), 0.7), uniforms=1)
    assert_same(a, b, "errors, sampling")
    # drafts longer than the output (only possible with check_inputs=False)
    a, b = both(drafts, cu, logits, bitmask, max_draft=1, check_inputs=False)
    assert_same(a, b, "too long")


def check_fuzz_small(seed: int) -> None:
    """Random small cases with everything mixed: greedy and sampling sequences, draft
    probabilities, top-p, zero-draft sequences, fully masked and NaN rows, odd vocabularies."""
    g = torch.Generator().manual_seed(seed)
    for it in range(6):
        vocab = int(torch.randint(1, 300, (1,), generator=g))
        batch = int(torch.randint(1, 6, (1,), generator=g))
        probs = bool(it % 2)
        dtype = DTYPES[it % 3]
        drafts, cu, logits, bitmask, dp = make_case(vocab, batch, 3, dtype, seed=seed * 100 + it, probs=probs)
        rows = logits.shape[0]
        if it == 4:
            bitmask[int(torch.randint(0, rows, (1,), generator=g))] = 0
            logits[int(torch.randint(0, rows, (1,), generator=g)), 0] = float("nan")
        pick = torch.randint(0, 4, (batch,), generator=g)
        temps = torch.tensor([0.0, 0.5, 1.0, 3.0])[pick]
        top_p = torch.rand(batch, generator=g) * 0.9 + 0.1 if it >= 3 else None
        for s_ in range(2):
            a, b = both(drafts, cu, logits, bitmask, dp, temperature=temps, top_p=top_p, uniforms=s_)
            assert_same(a, b, f"fuzz seed={seed} it={it} V={vocab} B={batch} {dtype} probs={probs} "
                              f"top_p={top_p}")
    # a batch without any draft, with (empty) draft probabilities
    logits = torch.randn(3, 50)
    a, b = both(torch.zeros(0, dtype=torch.int64), torch.zeros(3, dtype=torch.int32), logits, None,
                torch.zeros(0, 50), temperature=torch.ones(3), uniforms=1)
    assert_same(a, b, "no drafts")


def check_multi_chunk(vocab: int, block_words: int, num_splits: int) -> None:
    ref = load_kernels("torch_ref")
    tv = load_kernels("triton_verify")
    batch = 3 if num_splits < 100 else 1   # the 63-chunk case: few rows (interpreter time)
    for dtype in (torch.float32, torch.bfloat16) if batch > 1 else (torch.bfloat16,):
        for temp, probs in ((None, False), (torch.tensor([0.0, 0.8, 1.5][:batch]), False),
                            (torch.tensor([1.0, 0.8, 0.0][:batch]), True)):
            drafts, cu, logits, bitmask, dp = make_case(vocab, batch, 4, dtype, seed=vocab, probs=probs,
                                                        full=batch == 1)
            rows = logits.shape[0]
            unif = torch.rand((rows, 2), dtype=torch.float64, generator=torch.Generator().manual_seed(4))
            unif_arg = unif if temp is not None else None
            outs = []
            for fn, extra in ((ref.verify_reference, {}),
                              (tv.verify_triton, dict(block_words=block_words, num_splits=num_splits))):
                o = VerifyOutput.allocate(batch, 4)
                fn(drafts, cu, logits, bitmask, dp, temp, None, unif_arg, o.output_token_ids,
                   o.num_accepted, o.num_emitted, o.error_position, **extra)
                outs.append(o)
            assert_same(*outs, f"V={vocab} bw={block_words} S={num_splits} {dtype} T={temp} probs={probs}")


def check_layouts_and_chain_modes() -> None:
    """Row strides that are and are not multiples of 16 elements (padded buffers viewed as
    ``[:, :V]``: shifted and unshifted blocks), the accept chain fused into the row pass (its
    last program per sequence) and as its own kernel, multi-chunk rows with partials combined
    over several chain tiles; the fused chain's counters are back at zero after every launch."""
    ref = load_kernels("torch_ref")
    tv = load_kernels("triton_verify")
    ws: dict = {}
    for vocab, width, dtype in ((1000, 1000, torch.float32), (1000, 1040, torch.bfloat16),
                                (1024, 1031, torch.float16), (33, 47, torch.bfloat16)):
        for batch in (3,):
            for temp, probs in ((None, False), (torch.tensor([0.0, 1.2, 0.7, 1.0][:batch]), False),
                                (torch.tensor([1.0, 0.0, 0.8, 2.0][:batch]), True)):
                drafts, cu, logits, bitmask, dp = make_case(vocab, batch, 5, dtype, seed=vocab + width,
                                                            probs=probs)
                rows = logits.shape[0]
                wide = torch.full((rows, width), float("nan"), dtype=dtype)   # padding is never read
                wide[:, :vocab] = logits
                view = wide[:, :vocab]
                unif = torch.rand((rows, 2), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
                unif_arg = unif if temp is not None else None
                want = VerifyOutput.allocate(batch, 5)
                ref.verify_reference(drafts, cu, logits, bitmask, dp, temp, None, unif_arg,
                                     want.output_token_ids, want.num_accepted, want.num_emitted,
                                     want.error_position)
                modes: list = [(True, {}), (False, {})]
                if vocab == 1024:   # rows cut into 33 chunks: partials combined over two chain tiles
                    modes += [(True, dict(block_words=1, num_splits=33)),
                              (False, dict(block_words=1, num_splits=33))]
                for fused, extra in modes:
                    got = VerifyOutput.allocate(batch, 5)
                    tv.verify_triton(drafts, cu, view, bitmask, dp, temp, None, unif_arg,
                                     got.output_token_ids, got.num_accepted, got.num_emitted,
                                     got.error_position, workspace=ws, fused=fused, **extra)
                    assert_same(want, got, f"V={vocab} stride={width} {dtype} T={temp} probs={probs} "
                                           f"fused={fused} {extra}")
                    assert int(ws["count"].abs().sum()) == 0


def check_sampling(vocab: int, batch: int, dtype: torch.dtype, probs: bool) -> None:
    case = make_case(vocab, batch, 5, dtype, seed=vocab * 7 + batch, probs=probs)
    temps = torch.tensor([[0.6, 1.0, 1.7, 0.0][i % 4] for i in range(batch)])
    if batch == 1:
        temps = torch.tensor([1.0])
    seeds = range(4) if vocab <= 1000 else range(2)
    accepted = 0
    for seed in seeds:
        a, b = both(*case, temperature=temps, uniforms=seed)
        assert_same(a, b, f"sampling V={vocab} {dtype} probs={probs} seed={seed}")
        accepted += int(a.num_accepted.clamp_min(0).sum())
    assert accepted > 0


def check_top_p() -> None:
    case = make_case(1000, 8, 4, torch.float32, seed=5)
    temps = torch.tensor([0.7, 1.0, 0.0, 1.3, 1.0, 0.9, 1.1, 2.0])
    top_p = torch.tensor([0.9, 0.5, 0.9, 1.0, 0.95, 0.3, 0.8, 0.99])
    for seed in range(4):
        assert_same(*both(*case, temperature=temps, top_p=top_p, uniforms=seed), f"top-p seed={seed}")
    drafts, cu, logits, bitmask, dp = make_case(1000, 8, 4, torch.bfloat16, seed=6, probs=True)
    for seed in range(3):
        assert_same(*both(drafts, cu, logits, bitmask, dp, temperature=temps, top_p=top_p, uniforms=seed),
                    f"top-p draft probs seed={seed}")


def check_flat_logits() -> None:
    n, vocab = 64, 3000
    logits = torch.zeros(n, vocab)
    a, b = both(torch.zeros(0, dtype=torch.int64), torch.zeros(n, dtype=torch.int32), logits, None,
                temperature=torch.ones(n), uniforms=17)
    assert_same(a, b, "flat logits")
    assert len(set(a.output_token_ids[:, 0].tolist())) > n // 2


def check_greedy_ties() -> None:
    """Logits of only three distinct values: the row maximum sits in many lanes, blocks and
    chunks at once, and the lowest allowed id reaching it must win (brute-force oracle too)."""
    tv = load_kernels("triton_verify")
    g = torch.Generator().manual_seed(5)
    for vocab, dtype, block_words, num_splits in ((4133, torch.bfloat16, 4, 3), (50257, torch.float16, 16, 2),
                                                  (3000, torch.float32, 1, 7)):
        rows = 6
        logits = torch.randint(0, 3, (rows, vocab), generator=g).to(dtype)
        words = (vocab + 31) // 32
        allowed = torch.rand(rows, vocab, generator=g) < 0.6
        allowed[1, :2000] = False                      # the maximum only past the first blocks
        allowed[2] = False
        allowed[2, vocab - 1] = True                   # one allowed token: the last
        bits = torch.zeros(rows, words * 32, dtype=torch.int64)
        bits[:, :vocab] = allowed.to(torch.int64)
        w = (bits.view(rows, words, 32) << torch.arange(32)).sum(-1)
        bitmask = torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)
        cu = torch.zeros(rows, dtype=torch.int32)      # every row is a bonus row: its argmax is output
        drafts = torch.zeros(0, dtype=torch.int64)
        ml = torch.where(allowed, logits.float(), float("-inf"))
        best = ml.max(1, keepdim=True).values
        oracle = [int(torch.nonzero(ml[r] == best[r]).min()) for r in range(rows)]
        outs = []
        for extra in (None, dict(block_words=block_words, num_splits=num_splits)):
            o = VerifyOutput.allocate(rows, 0)
            fn = load_kernels("torch_ref").verify_reference if extra is None else tv.verify_triton
            fn(drafts, cu, logits, bitmask, None, None, None, None, o.output_token_ids,
               o.num_accepted, o.num_emitted, o.error_position, **(extra or {}))
            outs.append(o)
        assert_same(*outs, f"ties V={vocab} {dtype}")
        assert outs[1].output_token_ids[:, 0].tolist() == oracle, (vocab, dtype)


def check_gumbel_upper_bound() -> None:
    """The race's block skip is exact only if its cheap bound is >= the noise it skips: checked
    for every one of the 2**23 uniforms the noise can take, with the kernels' own functions."""
    import triton
    import triton.language as tl

    tv = load_kernels("triton_verify")
    upper = tv._gumbel_upper

    def probe(out_ptr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        u = ((i.to(tl.uint32)).to(tl.float32) + 0.5) * 1.1920928955078125e-07
        g = -tl.log(-tl.log(u))
        tl.store(out_ptr + i, upper(u) - g)

    # the jit resolves names in the function's globals: give the probes the kernels' helpers
    probe.__globals__.update(upper=upper, tl=tl)
    probe = triton.jit(probe)
    block = 1 << 17
    slack = torch.empty(1 << 23, dtype=torch.float32)
    probe[(slack.numel() // block,)](slack, BLOCK=block)
    assert float(slack.min()) > 0, float(slack.min())


def check_softmax_sum_at_boundaries() -> None:
    """The draft rows' softmax sum (per-lane online sums in the kernel's full blocks) is right
    to well under 1e-4: with a deterministic draft x the acceptance test is u < p(x), so a
    uniform 1e-4 below p(x) must accept and one 1e-4 above must reject, p(x) computed here in
    float64 from the masked, tempered logits. Rows cover what the lane update must handle:
    ascending logits (every element raises its lane's max), descending, wide ranges, allowed
    -inf and -FLT_MAX values, fully masked blocks, a sparse mask, several chunks."""
    tv = load_kernels("triton_verify")
    ref = load_kernels("torch_ref")
    vocab, words = 1500, (1500 + 31) // 32
    g = torch.Generator().manual_seed(11)
    rows_logits, rows_allowed, temps = [], [], []
    for kind in range(10):
        x = torch.randn(vocab, generator=g) * 3
        allowed = torch.rand(vocab, generator=g) < 0.6
        if kind == 1:
            x = torch.linspace(-30, 30, vocab)
        elif kind == 2:
            x = torch.linspace(30, -30, vocab)
        elif kind == 3:
            x = torch.randn(vocab, generator=g) * 40            # exp(v - max) underflows for most
        elif kind == 4:
            x[::7] = float("-inf")                               # allowed -inf: probability 0
            x[3::11] = -3.4028234663852886e38                    # allowed -FLT_MAX
        elif kind == 5:
            allowed[:700] = False                                # whole masked blocks first
        elif kind == 6:
            allowed[:] = False
            allowed[torch.tensor([5, 600, 1490])] = True         # three tokens in distant blocks
        elif kind == 7:
            x = torch.full((vocab,), 2.0)                        # all equal
        elif kind == 8:
            x = torch.arange(vocab, dtype=torch.float32) % 97 - 40.0
        rows_logits.append(x)
        rows_allowed.append(allowed)
        temps.append([1.0, 0.6, 1.7][kind % 3])
    batch = len(rows_logits)
    cu = torch.arange(1, batch + 1, dtype=torch.int32)          # one draft per sequence
    logits = torch.zeros(2 * batch, vocab)
    allowed = torch.ones(2 * batch, vocab, dtype=torch.bool)
    drafts = torch.zeros(batch, dtype=torch.int64)
    p = torch.zeros(batch, dtype=torch.float64)
    for b in range(batch):
        logits[2 * b], allowed[2 * b] = rows_logits[b], rows_allowed[b]
        v = (rows_logits[b] * (1.0 / temps[b])).double()
        ml = torch.where(rows_allowed[b] & (v > float("-inf")), v, float("-inf"))
        probs = torch.softmax(ml, 0)
        cand = torch.nonzero(probs > 1e-3).flatten()            # a draft with a testable p
        drafts[b] = int(cand[int(torch.randint(0, cand.numel(), (1,), generator=g))])
        p[b] = probs[drafts[b]]
    bits = torch.zeros(2 * batch, words * 32, dtype=torch.int64)
    bits[:, :vocab] = allowed.to(torch.int64)
    w = (bits.view(2 * batch, words, 32) << torch.arange(32)).sum(-1)
    bitmask = torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)
    temperature = torch.tensor(temps)
    chunked = dict(block_words=4, num_splits=3)      # 128-token blocks: full blocks in every chunk
    for dtype in (torch.float32, torch.bfloat16):
        lg = logits.to(dtype)
        if dtype != torch.float32:   # p(x) of the rounded logits
            for b in range(batch):
                v = (lg[2 * b].float() * (1.0 / temps[b])).double()
                ml = torch.where(allowed[2 * b] & (v > float("-inf")), v, float("-inf"))
                p[b] = torch.softmax(ml, 0)[drafts[b]]
        for side, expect in ((1 - 1e-4, 1), (1 + 1e-4, 0)):
            unif = torch.full((2 * batch, 2), 0.5, dtype=torch.float64)
            unif[0::2, 0] = p * side
            for fn, extra in ((ref.verify_reference, {}), (tv.verify_triton, chunked)):
                o = VerifyOutput.allocate(batch, 1)
                fn(drafts, cu, lg, bitmask, None, temperature, None, unif, o.output_token_ids,
                   o.num_accepted, o.num_emitted, o.error_position, **extra)
                assert o.num_accepted.tolist() == [expect] * batch, (fn.__name__, dtype, side, p.tolist(),
                                                                     o.num_accepted.tolist())
    # an allowed NaN inside a full block makes its row an error in both backends
    lg = logits.clone()
    allowed_nan = torch.nonzero(allowed[4]).flatten()
    lg[4, int(allowed_nan[len(allowed_nan) // 2])] = float("nan")
    unif = torch.full((2 * batch, 2), 0.5, dtype=torch.float64)
    outs = []
    for fn, extra in ((ref.verify_reference, {}), (tv.verify_triton, chunked)):
        o = VerifyOutput.allocate(batch, 1)
        fn(drafts, cu, lg, bitmask, None, temperature, None, unif, o.output_token_ids,
           o.num_accepted, o.num_emitted, o.error_position, **extra)
        outs.append(o)
    assert_same(*outs, "allowed NaN in a full block")
    assert outs[1].error_position[2] == 0


def check_buffers_workspace() -> None:
    from structgen.generation.verify import VerifyBufferPool

    tv = load_kernels("triton_verify")
    pool = VerifyBufferPool()
    buf = pool.get(3, 4, 1000, torch.float32, "cpu")
    drafts, cu, logits, bitmask, _ = make_case(1000, 3, 4, torch.float32, seed=9)
    rows = logits.shape[0]
    lg, bm = buf.rows(rows)
    lg.copy_(logits)
    bm.copy_(bitmask)
    expect = verify(drafts, cu, logits, bitmask, temperature=torch.ones(3), uniforms=2, backend="torch")
    for _ in range(2):
        out = verify(drafts, cu, lg, bm, temperature=torch.ones(3), uniforms=2, backend="triton", buffers=buf)
        assert out is buf.out
        assert_same(expect, out, "pooled")
    ptrs = {k: v.data_ptr() for k, v in buf.workspace.items()}
    assert ptrs and len(ptrs) == len(tv.workspace_sizes(rows, 3))
    verify(drafts, cu, lg, bm, backend="triton", buffers=buf)
    assert {k: v.data_ptr() for k, v in buf.workspace.items()} == ptrs
    vocab_allocs = pool.vocab_allocations
    pool.get(3, 4, 1000, torch.float32, "cpu")
    assert pool.vocab_allocations == vocab_allocs


# --------------------------------------------------------------------------------------------
# tests

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("vocab,batch,k,full", GREEDY_SHAPES)
def test_greedy_equals_reference(worker: ProcessPoolExecutor, vocab: int, batch: int, k: int, full: bool,
                                 dtype: torch.dtype) -> None:
    in_worker(worker, check_greedy, vocab, batch, k, full, dtype)


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzz_small_cases(worker: ProcessPoolExecutor, seed: int) -> None:
    in_worker(worker, check_fuzz_small, seed)


def test_no_mask_and_error_rows(worker: ProcessPoolExecutor) -> None:
    in_worker(worker, check_no_mask_and_errors)


@pytest.mark.parametrize("vocab,block_words,num_splits", [(1000, 4, 3), (50257, 128, 5), (2000, 1, 200)])
def test_multi_chunk_rows(worker: ProcessPoolExecutor, vocab: int, block_words: int, num_splits: int) -> None:
    """Rows cut into several vocabulary chunks (the GPU launch plan) combine exactly."""
    in_worker(worker, check_multi_chunk, vocab, block_words, num_splits)


def test_layouts_and_chain_modes(worker: ProcessPoolExecutor) -> None:
    in_worker(worker, check_layouts_and_chain_modes)


@pytest.mark.parametrize("probs", [False, True], ids=["deterministic-drafts", "draft-probs"])
@pytest.mark.parametrize("vocab,batch,dtype", [(1000, 16, torch.float32), (32000, 3, torch.float16),
                                               (151936, 1, torch.bfloat16)])
def test_sampling_equals_reference(worker: ProcessPoolExecutor, vocab: int, batch: int, dtype: torch.dtype,
                                   probs: bool) -> None:
    in_worker(worker, check_sampling, vocab, batch, dtype, probs)


def test_sampling_top_p_equals_reference(worker: ProcessPoolExecutor) -> None:
    in_worker(worker, check_top_p)


def test_race_noise_identical_on_flat_logits(worker: ProcessPoolExecutor) -> None:
    """With equal logits the draw is the argmax of the hash-derived noise alone: any difference
    in the hash or in the noise transform between the backends shows up here."""
    in_worker(worker, check_flat_logits)


def test_greedy_ties_lowest_id(worker: ProcessPoolExecutor) -> None:
    in_worker(worker, check_greedy_ties)


def test_race_skip_bound_holds_for_every_uniform(worker: ProcessPoolExecutor) -> None:
    in_worker(worker, check_gumbel_upper_bound)


def test_softmax_sum_at_acceptance_boundaries(worker: ProcessPoolExecutor) -> None:
    in_worker(worker, check_softmax_sum_at_boundaries)


def test_buffers_workspace_reused(worker: ProcessPoolExecutor) -> None:
    in_worker(worker, check_buffers_workspace)


def test_launch_plan() -> None:
    # pure host arithmetic; importing the module here builds (not runs) compiled kernels
    spec = importlib.util.find_spec("triton")
    assert spec is not None
    tv = load_kernels("triton_verify")
    for rows, vocab in ((7, 151936), (224, 151936), (448, 1000), (1, 5)):
        bw, s, per = tv.plan_splits(rows, vocab, torch.device("cpu"), block_words=64, num_splits=76)
        nblocks = -(-vocab // (32 * bw))
        assert 1 <= s <= tv.MAX_SPLITS and s * per >= nblocks and (s - 1) * per < nblocks


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_equals_reference() -> None:  # pragma: no cover - GPU only
    """On a GPU: compiled kernels via backend='auto' against the reference on the CPU."""
    for vocab, batch in ((151936, 32), (32000, 8), (1000, 32)):
        for dtype in DTYPES:
            case = make_case(vocab, batch, 6, dtype, seed=3)
            cuda = [t.cuda() if t is not None else None for t in case]
            a = verify(*case, backend="torch")
            b = verify(*cuda, backend="auto")
            assert_same(a, VerifyOutput(*(t.cpu() for t in (b.output_token_ids, b.num_accepted,
                                                             b.num_emitted, b.error_position))),
                        f"cuda greedy V={vocab} {dtype}")
            # sampling: tl.exp / tl.log are fast approximations on a GPU, so a draw can differ
            # from the CPU reference when a uniform lands within ~1e-6 of a decision boundary
            temp = torch.tensor([0.0 if i % 3 == 0 else 1.0 for i in range(batch)])
            a = verify(*case, temperature=temp, uniforms=5, backend="torch")
            b = verify(*cuda, temperature=temp.cuda(), uniforms=5, backend="auto")
            same = (a.output_token_ids == b.output_token_ids.cpu()).all(1).float().mean().item()
            assert same >= 0.95, f"cuda sampling V={vocab} {dtype}: {same:.3f} of sequences equal"
            greedy = temp == 0
            assert torch.equal(a.output_token_ids[greedy], b.output_token_ids.cpu()[greedy])
