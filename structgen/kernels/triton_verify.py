"""Fused Triton kernels for the verify step (semantics: ``torch_ref``'s module docstring).

Pass A, ``_row_pass_kernel``, grid ``(R, S)``: each program reads one vocabulary chunk of one
logit row once, block by block (``BLOCK_W`` packed mask words = ``32 * BLOCK_W`` logits; full
blocks load unmasked so the loads vectorise, the row's first and last blocks are masked; the
full-block loop is software-pipelined with ``NUM_STAGES``): it applies the mask bits, the
temperature and the top-p threshold, and keeps online statistics of the chunk: the max and its
lowest-id argmax (rows of greedy sequences), or the max and the sum of ``exp(v - max)`` (rows
of sampling sequences: the acceptance test). Both loops over a row's full blocks keep their
statistics per lane (a ``[BLOCK_W, 32]`` max / argmax, or max / sum with one exponential per
logit, ``exp(-|v - m|)``) and reduce once per chunk, so they have no shuffles or barriers. A
NaN on an allowed token is turned into +inf (a NaN lane sum, in the sum loop), so a chunk max
of +inf flags an invalid row without a separate reduction. Nothing vocabulary-sized is
written: the partials are ``[R, S]``.

Row alignment: vectorised (16-byte) loads need every block to start on a 16-element boundary.
When the row stride is a multiple of 16 elements (``V`` = 32,000, 128,256, 151,936, or a padded
buffer) blocks start at token ``32 * BLOCK_W * j`` as the mask words do. Otherwise
(``SHIFTED``: ``V`` = 50,257, or 1,000) a row's blocks start ``off = -(row start mod 16)``
tokens early (the first block's tokens below 0 are masked off), so the loads are aligned, and
each block's mask bits are read across two neighbouring words (a 64-bit funnel shift).

The accept / reject chain of a sequence (``_finish_sequence``) combines the S partials of
each of its rows and runs the chain on a vector of rows at once (a few dependent memory round
trips per sequence, not a few per row). With ``FUSED`` (the default) it runs inside pass A:
every program counts itself done on its sequence's counter (an acq_rel atomic after its
partial stores) and the program that completes the count finishes the sequence (reading the
other programs' partials past L1), then resets the counter. So a greedy step is one launch,
and only the last sequence's chain is on the critical path. ``fused=False`` runs the same chain
as a second kernel, ``_chain_kernel`` (grid ``(B,)``).

Sampling steps add the draw: the chain records each sampling sequence's stopping row (the
rejected row, or the bonus row when every draft was accepted), and ``_residual_kernel`` (grid
``(B, S')``, its own launch plan for B rows) runs the exponential race on that one row: over
``max(p - q, 0)`` with draft probabilities (over ``p`` when that is empty) or over ``p``
without the draft token for a deterministic draft, and over ``p`` for a bonus row;
``_residual_finish_kernel`` (grid ``(B,)``) combines it and writes the token. So the per-token
hash and logarithms run on one row per sequence, not in pass A. A block whose best possible
key (its max plus ``GUMBEL_BOUND``) cannot beat the running best skips the hash and the
logarithms, and a block where no token's cheap bound (``_gumbel_upper``) reaches it skips the
logarithms; the result is the same. The draw's kernels and the helpers pass A shares with them
live in :mod:`structgen.kernels.triton_draw`.

Top-p: the threshold per row comes from ``torch_ref.top_p_thresholds`` (a separate, slow pass
that sorts the rows that use top-p); the kernels then only compare ``v`` with it.

Specialisation is explicit: ``HAS_MASK``, ``ALL_GREEDY`` (no temperature given),
``NO_DRAFT_PROBS`` (deterministic proposals), ``HAS_TOP_P``, ``SHIFTED``, ``FUSED``. Draft
lengths, batch size and row counts are runtime values marked ``do_not_specialize``; the
chain's tile sizes are fixed, so changing shapes between steps does not compile new kernels
(beyond the dtype of the logits and those flags; ``benchmarks/verify_codegen.py`` checks it).

Launch plan (:func:`plan_splits`): on a GPU the vocabulary of each row is cut into S chunks so
that about ``programs_per_sm`` (default 4) programs per SM are in flight whatever the batch,
rounded down so that one wave holds them all; the interpreter uses one chunk per row and
large blocks.

Exactness: greedy results equal the reference bit for bit (integer-like max/argmax with an
explicit lowest-id tie rule, whatever the chunking). Sampling uses the same uniforms, hash and
formulas, but on a GPU ``tl.exp``/``tl.log`` are fast approximations (and the online float32
sum is ordered differently from torch's), so a draw can differ from the reference when a
uniform lands within ~1e-6 (relative) of a decision boundary. Under ``TRITON_INTERPRET=1``
(numpy float32 maths) the tests see no difference at all.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - a triton without the dispatching libdevice module
    libdevice = tl

from structgen.kernels.torch_ref import MAX_DRAFT
from structgen.kernels.triton_draw import (
    _INT_MAX,
    _inv_temperature,
    _residual_finish_kernel,
    _residual_kernel,
)
from structgen.kernels.triton_draw import _gumbel_upper as _gumbel_upper  # tests probe the race's bound

__all__ = ["verify_triton", "interpreter_active", "plan_splits", "workspace_sizes", "MAX_SPLITS"]

MAX_SPLITS = 128        # most vocabulary chunks per row
OUT_BLOCK = 128         # output row width in registers; >= MAX_DRAFT + 1
CHAIN_ROWS = 8          # rows of a sequence the chain examines at once
CHAIN_SPLITS = 32       # partials of a row combined at once
ROW_ALIGN = 16          # elements: a row stride that is a multiple of this needs no shift
assert OUT_BLOCK >= MAX_DRAFT + 1

# block sizes: 32 * BLOCK_W logits per block
_GPU_BLOCK_W = 64       # 2048 logits per block on a GPU
_INTERP_BLOCK_W = 512   # 16384 logits per block in the interpreter (fewer Python-level steps)
_PROGRAMS_PER_SM = 4    # default launch plan on a GPU

LOG2E = tl.constexpr(1.4426950408889634)


def interpreter_active() -> bool:
    """True when this module's kernels were built by the Triton interpreter (they run on CPU
    tensors): ``TRITON_INTERPRET=1`` was set when this module was first imported."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - very old triton
        return False
    return isinstance(_row_pass_kernel, InterpretedFunction)


@triton.jit
def _exp2_numpy(x):
    return tl.exp2(x)


@triton.jit
def _exp2_ftz(x):
    # libdevice's exp2f under Triton's default ftz reflection: one MUFU.EX2 (ex2.approx.ftz),
    # where tl.exp2 adds a range fix-up for subnormal results (three more instructions per
    # element); results below 2**-126 become 0, which no sum of exp(v - max) notices
    return libdevice.exp2(x)


try:
    from triton.runtime.interpreter import InterpretedFunction as _Interpreted
except ImportError:  # pragma: no cover - very old triton
    _Interpreted = ()
if isinstance(_exp2_numpy, _Interpreted):   # the interpreter has no libdevice
    _exp2_ftz = _exp2_numpy  # noqa: F811


@triton.jit
def _seq_of_row(cu_ptr, r, batch, BLOCK_B: tl.constexpr):
    # sequence b of row r: the number of sequences whose bonus row cu[k] + k lies before r
    b = tl.zeros((), dtype=tl.int32)
    for k0 in range(0, batch, BLOCK_B):
        ks = k0 + tl.arange(0, BLOCK_B)
        cuv = tl.load(cu_ptr + ks, mask=ks < batch, other=0).to(tl.int32)
        b += tl.sum(((ks < batch) & (cuv + ks < r)).to(tl.int32), axis=0)
    return b


@triton.jit
def _row_block(logits_ptr, row_off, mrow, t0, lo_e, hi_e, num_words, inv_t, thr, need_sum,
               run_max, run_arg, run_sum,
               MASKED: tl.constexpr, HAS_MASK: tl.constexpr, ALL_GREEDY: tl.constexpr,
               HAS_TOP_P: tl.constexpr, SHIFTED: tl.constexpr, ALIGNED: tl.constexpr, BLOCK_W: tl.constexpr,
               LANES: tl.constexpr = 0):
    # Tokens t0 .. t0 + 32 * BLOCK_W - 1 of one row (its token 0 is element row_off of the
    # logits): update the chunk's online statistics. ALIGNED: row_off + t0 is a multiple of 16.
    # MASKED: only elements in [lo_e, hi_e) are read (multiples of 16 in the aligned edge
    # blocks, so those loads vectorise too; exact row bounds in the small end pieces).
    # SHIFTED: t0 need not be a multiple of 32 (mask bits read across two words).
    # LANES = 1 (greedy rows): run_max / run_arg are per-lane [BLOCK_W, 32] state, updated
    # without any reduction (the caller reduces once per chunk): run_arg holds the first token t0
    # of the block that set the lane's maximum (the token is t0 + the lane's offset); blocks come
    # in token order, so a strict ">" keeps the lowest id of each lane's maximum.
    # LANES = 2 (rows of sampling sequences: the max and the softmax sum, no argmax): run_max /
    # run_sum are per-lane [BLOCK_W, 32] and in units of the raw logits x (v = x * inv_t with
    # inv_t > 0, so the max of v is the max of x times inv_t, bit for bit: rounding is
    # monotone); run_max starts at -FLT_MAX (finite, so that x - run_max is never -inf - -inf)
    # and each element costs one exponential, exp(-|x - m| * inv_t): when x > m the lane's sum
    # is rescaled (s * e + 1) and m becomes x, else e is added. A masked token's -inf adds
    # exp(-inf) = 0; an allowed -FLT_MAX adds 1 at m = -FLT_MAX (right); an allowed NaN makes
    # the sum NaN; the caller treats a lane sum of 0 as "nothing allowed" (max -inf).
    ninf = float("-inf")
    c = tl.arange(0, 32)
    a = tl.arange(0, BLOCK_W)
    loc = a[:, None] * 32 + c[None, :]                              # [BLOCK_W, 32]
    tok = t0 + loc                                                  # token ids
    if ALIGNED:
        base = (row_off + t0) // 16 * 16   # == row_off + t0; written so the compiler sees the alignment
    else:
        base = row_off + t0
    offs = base + loc.to(tl.int64)
    if MASKED:
        inb = (offs >= lo_e) & (offs < hi_e)
        x = tl.load(logits_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    else:
        x = tl.load(logits_ptr + offs).to(tl.float32)
    if HAS_MASK:
        if SHIFTED:
            # the tile starts at bit t0 % 32 of word t0 // 32 (t0 may be negative): each row of
            # 32 tokens reads a 64-bit window of two neighbouring words
            sh = t0 & 31
            wl = (t0 >> 5) + a
            lo = tl.load(mrow + wl, mask=(wl >= 0) & (wl < num_words), other=0)
            hi = tl.load(mrow + wl + 1, mask=(wl + 1 >= 0) & (wl + 1 < num_words), other=0)
            comb = (hi.to(tl.uint32).to(tl.uint64) << 32) | lo.to(tl.uint32).to(tl.uint64)
            allowed = ((comb[:, None] >> (sh + c)[None, :].to(tl.uint64)) & 1) != 0
        else:
            w = t0 // 32 + a
            if MASKED:
                word = tl.load(mrow + w, mask=w < num_words, other=0)
            else:
                word = tl.load(mrow + w)
            allowed = (word[:, None] & (1 << c)[None, :]) != 0
        if MASKED:
            allowed = allowed & inb
    else:
        if MASKED:
            allowed = inb
        else:
            allowed = tok >= 0
    v = x * inv_t
    # NaN on an allowed token becomes +inf: a row max of +inf marks the row invalid
    vn = tl.where(v == v, v, float("inf"))
    if HAS_TOP_P:
        allowed = allowed & (vn >= thr)
    if LANES == 1:
        better = allowed & (vn > run_max)           # one compare with the mask bit as predicate
        run_arg = tl.where(better, t0, run_arg)     # the block's first token: no per-element id
        run_max = tl.where(better, vn, run_max)
    elif LANES == 2:
        xm = tl.where(allowed, x, ninf)
        d = xm - run_max
        up = d > 0
        e = _exp2_ftz(tl.abs(d) * (inv_t * -LOG2E))
        run_sum = tl.where(up, run_sum * e + 1.0, run_sum + e)
        run_max = tl.where(up, xm, run_max)
    else:
        vm = tl.where(allowed, vn, ninf)
        bmax = tl.max(vm)
        barg = tl.min(tl.where(vm == bmax, tok, _INT_MAX))
        if not ALL_GREEDY:
            if need_sum:
                new_max = tl.maximum(run_max, bmax)
                ref = tl.where(new_max == ninf, 0.0, new_max)
                run_sum = run_sum * tl.exp(run_max - ref) + tl.sum(tl.exp(vm - ref))
        run_arg = tl.where(bmax > run_max, barg, run_arg)
        run_max = tl.maximum(run_max, bmax)
    return run_max, run_arg, run_sum


@triton.jit
def _reduce_lane_argmax(lane_max, lane_arg, run_max, run_arg, BLOCK_W: tl.constexpr):
    # per-lane maxima (LANES = 1) into the running max / lowest-id argmax of the chunk
    lane_tok = lane_arg + (tl.arange(0, BLOCK_W)[:, None] * 32 + tl.arange(0, 32)[None, :])
    bmax = tl.max(lane_max)
    barg = tl.min(tl.where(lane_max == bmax, lane_tok, _INT_MAX))
    run_arg = tl.where(bmax > run_max, barg, run_arg)   # earlier tokens (lower ids) win ties
    run_max = tl.maximum(run_max, bmax)
    return run_max, run_arg


@triton.jit
def _finish_sequence(
    b, logits_ptr, stride_lr, mask_ptr, stride_mr, draft_ptr, cu_ptr, temp_ptr, unif_ptr, thr_ptr,
    dprob_ptr, stride_dr, stride_dv,
    part_max_ptr, part_arg_ptr, part_sum_ptr,
    out_ptr, stride_ob, acc_ptr, emit_ptr, err_ptr, pend_row_ptr, pend_max_ptr, pend_sum_ptr,
    V, num_splits, max_draft,
    HAS_MASK: tl.constexpr, ALL_GREEDY: tl.constexpr, NO_DRAFT_PROBS: tl.constexpr,
    HAS_TOP_P: tl.constexpr, CHAIN_R: tl.constexpr, CHAIN_S: tl.constexpr, OUT_W: tl.constexpr,
):
    # The accept / reject chain of sequence b, CHAIN_R rows at a time: combine each row's
    # partials (read past L1: other programs wrote them), decide every row at once, stop at the
    # first row that rejects, fails or is the bonus row; write the output row and counts.
    ninf = float("-inf")
    start = tl.load(cu_ptr + b - 1, mask=b > 0, other=0).to(tl.int32)
    n = tl.load(cu_ptr + b).to(tl.int32) - start
    row0 = start + b
    sampling = tl.full((), 0, tl.int1)
    inv_t = tl.full((), 1.0, tl.float32)
    if not ALL_GREEDY:
        sampling, inv_t = _inv_temperature(temp_ptr, b)
    fits = n <= max_draft
    nrows = tl.where(fits, n + 1, 0)
    f = tl.full((), _INT_MAX, tl.int32)         # position of the stopping row
    tok_f = tl.full((), -1, tl.int32)           # the token emitted there
    bad_f = tl.full((), 0, tl.int32)            # 1: that row is invalid
    pend = tl.full((), -1, tl.int32)            # rejected row needing the residual draw
    pmax = tl.full((), 0.0, tl.float32)
    psum = tl.full((), 0.0, tl.float32)
    li = tl.arange(0, CHAIN_R)
    ls = tl.arange(0, CHAIN_S)
    # per lane (the interpreter cannot combine a loaded-compare scalar with a vector)
    samp = (li * 0 + sampling.to(tl.int32)) != 0
    for c0 in range(0, nrows, CHAIN_R):
        if f == _INT_MAX:
            i = c0 + li
            valid = i < nrows
            r64 = (row0 + i).to(tl.int64)
            m = tl.full([CHAIN_R], ninf, tl.float32)
            arg = tl.full([CHAIN_R], -1, tl.int32)
            z = tl.zeros([CHAIN_R], dtype=tl.float32)
            for s0 in range(0, num_splits, CHAIN_S):
                so = s0 + ls
                sm = valid[:, None] & (so < num_splits)[None, :]
                po = r64[:, None] * num_splits + so[None, :]
                pm = tl.load(part_max_ptr + po, mask=sm, other=ninf, cache_modifier=".cg")
                pa = tl.load(part_arg_ptr + po, mask=sm, other=-1, cache_modifier=".cg")
                cm = tl.max(pm, axis=1)
                ca = tl.min(tl.where(sm & (pm == cm[:, None]), pa, _INT_MAX), axis=1)
                if not ALL_GREEDY:
                    nm = tl.maximum(m, cm)
                    ref = tl.where(nm == ninf, 0.0, nm)
                    ps = tl.load(part_sum_ptr + po, mask=sm, other=0.0, cache_modifier=".cg")
                    z = tl.where(m > ninf, z * tl.exp(m - ref), 0.0) + \
                        tl.sum(tl.where(pm > ninf, ps * tl.exp(pm - ref[:, None]), 0.0), axis=1)
                arg = tl.where(cm > m, ca, arg)     # later chunks hold higher ids: ties keep arg
                m = tl.maximum(m, cm)
            invalid = (m == ninf) | (m == float("inf"))
            is_bonus = i == n
            x = tl.load(draft_ptr + start + i, mask=valid & (i < n), other=-1).to(tl.int32)
            if ALL_GREEDY:
                accepted = x == arg
                emitted = tl.where(accepted & (is_bonus == 0), x, arg)
            else:
                safe_max = tl.where(m > ninf, m, 0.0)
                x_in = (x >= 0) & (x < V)
                xs = tl.where(x_in, x, 0)
                lx = tl.load(logits_ptr + r64 * stride_lr + xs.to(tl.int64), mask=valid,
                             other=0.0).to(tl.float32)
                vx = lx * inv_t
                ok_x = x_in & (vx == vx)
                if HAS_MASK:
                    word = tl.load(mask_ptr + r64 * stride_mr + xs // 32, mask=valid, other=0)
                    ok_x = ok_x & (((word >> (xs % 32)) & 1) != 0)
                if HAS_TOP_P:
                    ok_x = ok_x & (vx >= tl.load(thr_ptr + r64, mask=valid, other=ninf))
                w_x = tl.exp(vx - safe_max)
                z_safe = tl.where(z > 0, z, 1.0)
                p_x = tl.where(ok_x, w_x.to(tl.float64) / z_safe.to(tl.float64), 0.0)
                if NO_DRAFT_PROBS:
                    q_x = tl.full([CHAIN_R], 1.0, tl.float64)
                else:
                    qo = (start + i).to(tl.int64) * stride_dr + xs.to(tl.int64) * stride_dv
                    q_x = tl.load(dprob_ptr + qo, mask=valid & x_in & (is_bonus == 0),
                                  other=0.0).to(tl.float64)
                u0 = tl.load(unif_ptr + 2 * r64, mask=valid & samp, other=0.0)
                accepted = tl.where(samp, u0 * q_x < p_x, x == arg)
                # sampling: the recovered or bonus token is drawn by _residual_kernel (a bonus
                # row has no draft: never "accepted")
                drawn = tl.where(samp, -1, arg)
                to_pend = samp & (accepted == 0) & (invalid == 0)
                emitted = tl.where(accepted & (is_bonus == 0), x, drawn)
            stop = valid & (invalid | is_bonus | (accepted == 0))
            fc = tl.min(tl.where(stop, i, _INT_MAX))
            sel = stop & (i == fc)
            found = fc < _INT_MAX
            tok_f = tl.where(found, tl.max(tl.where(sel, emitted, -1)), tok_f)
            bad_f = tl.where(found, tl.max(tl.where(sel, invalid.to(tl.int32), 0)), bad_f)
            if not ALL_GREEDY:
                pick = sel & to_pend
                pend = tl.where(found, tl.max(tl.where(pick, row0 + i, -1)), pend)
                pmax = tl.where(found, tl.sum(tl.where(pick, safe_max, 0.0)), pmax)
                psum = tl.where(found, tl.sum(tl.where(pick, z, 0.0)), psum)
            f = tl.minimum(f, fc)
    err = tl.where(fits, tl.where(bad_f != 0, f, -1), max_draft + 1)
    acc = tl.where(err >= 0, -1, f)
    js = tl.arange(0, OUT_W)
    xj = tl.load(draft_ptr + start + js, mask=js < acc, other=-1).to(tl.int32)
    val = tl.where(js < acc, xj, tl.where(js == acc, tok_f, -1))
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + js, val, mask=js <= max_draft)
    tl.store(acc_ptr + b, acc)
    tl.store(emit_ptr + b, tl.where(acc >= 0, acc + 1, 0))
    tl.store(err_ptr + b, err)
    if not ALL_GREEDY:
        tl.store(pend_row_ptr + b, tl.where(err >= 0, -1, pend))
        tl.store(pend_max_ptr + b, pmax)
        tl.store(pend_sum_ptr + b, psum)


@triton.jit(do_not_specialize=["batch", "blocks_per_split", "num_splits", "max_draft", "stride_ob"])
def _row_pass_kernel(
    logits_ptr, stride_lr,                 # fp32|fp16|bf16 [R, V] (last dim contiguous)
    mask_ptr, stride_mr, num_words,        # int32 [R, >= ceil(V/32)] (HAS_MASK)
    draft_ptr,                             # int32|int64 [N]
    cu_ptr,                                # int32|int64 [B] inclusive cumulative draft counts
    temp_ptr,                              # fp32 [B] (not ALL_GREEDY)
    unif_ptr,                              # fp64 [R, 2] contiguous (not ALL_GREEDY)
    thr_ptr,                               # fp32 [R] top-p thresholds on v (HAS_TOP_P)
    dprob_ptr, stride_dr, stride_dv,       # float [N, V] (not NO_DRAFT_PROBS; FUSED)
    part_max_ptr, part_arg_ptr, part_sum_ptr,  # [R, S]
    count_ptr,                             # int32 [B] programs done per sequence, 0 between launches (FUSED)
    out_ptr, stride_ob,                    # int32 [B, max_draft + 1] (FUSED)
    acc_ptr, emit_ptr, err_ptr,            # int32 [B] (FUSED)
    pend_row_ptr, pend_max_ptr, pend_sum_ptr,  # [B] (FUSED, not ALL_GREEDY)
    batch, V, blocks_per_split, num_splits, max_draft,
    HAS_MASK: tl.constexpr, ALL_GREEDY: tl.constexpr, NO_DRAFT_PROBS: tl.constexpr,
    HAS_TOP_P: tl.constexpr, SHIFTED: tl.constexpr, FUSED: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_B: tl.constexpr, NUM_STAGES: tl.constexpr,
    CHAIN_R: tl.constexpr, CHAIN_S: tl.constexpr, OUT_W: tl.constexpr,
):
    r = tl.program_id(0)
    s = tl.program_id(1)
    r64 = r.to(tl.int64)
    ninf = float("-inf")

    inv_t = tl.full((), 1.0, tl.float32)
    need_sum = tl.full((), 0, tl.int1)
    thr = tl.full((), ninf, tl.float32)
    if FUSED or not ALL_GREEDY:
        b = _seq_of_row(cu_ptr, r, batch, BLOCK_B)
        end_b = tl.load(cu_ptr + b).to(tl.int32)
    if not ALL_GREEDY:
        # every row of a sampling sequence needs the max and the softmax sum (the bonus row: its
        # max, for validity); the race of the one row per sequence that draws a token (the
        # rejected row or the bonus row) runs in _residual_kernel, so pass A pays no per-token hash
        sampling, inv_t = _inv_temperature(temp_ptr, b)
        need_sum = sampling
    if HAS_TOP_P:
        thr = tl.load(thr_ptr + r)

    run_max = tl.full((), ninf, tl.float32)
    run_arg = tl.full((), -1, tl.int32)
    run_sum = tl.full((), 0.0, tl.float32)

    row_off = r64 * stride_lr
    mrow = mask_ptr + r64 * stride_mr
    BLK: tl.constexpr = BLOCK_W * 32
    # Element space: the row is [row_off, row_off + V); its whole 16-element groups are
    # [a_lo, a_hi). Blocks of BLK elements start at floor16(row_off) (token `off`): full blocks
    # are read unmasked, the first / last block with masks at group granularity (vectorised
    # too), and the partial groups at the two ends (< 16 tokens each) as 32-token pieces.
    if SHIFTED:
        off = -((row_off % 16).to(tl.int32))
    else:
        off = tl.zeros((), dtype=tl.int32)
    a_lo = (row_off + 15) // 16 * 16
    a_hi = (row_off + V) // 16 * 16
    head = tl.minimum((a_lo - row_off).to(tl.int32), V)     # tokens [0, head): head piece
    tail = tl.maximum((a_hi - row_off).to(tl.int32), head)  # tokens [tail, V): tail piece
    nblocks = tl.cdiv(V - off, BLK)
    j_full0 = tl.where(off < 0, 1, 0)          # a shifted row's block 0 holds tokens < 0
    j_part = (V - off) // BLK                  # the first block that is not full
    blk0 = s * blocks_per_split
    blk1 = tl.minimum(blk0 + blocks_per_split, nblocks)
    if SHIFTED:
        # in token order (ties go to the lowest id): head piece, first block, full blocks, ...
        if (off < 0) & (blk0 == 0) & (blk1 > 0):
            if head > 0:
                run_max, run_arg, run_sum = _row_block(
                    logits_ptr, row_off, mrow, 0, row_off, row_off + head, num_words, inv_t, thr, need_sum,
                    run_max, run_arg, run_sum,
                    True, HAS_MASK, ALL_GREEDY, HAS_TOP_P, True, False, 1)
            run_max, run_arg, run_sum = _row_block(
                logits_ptr, row_off, mrow, off, a_lo, a_hi, num_words, inv_t, thr, need_sum,
                    run_max, run_arg, run_sum,
                True, HAS_MASK, ALL_GREEDY, HAS_TOP_P, SHIFTED, True, BLOCK_W)
    if ALL_GREEDY:
        # the full blocks: per-lane maxima, one reduction at the end (no shuffles or barriers
        # in the streaming loop); ties: lanes hold increasing token ids, the lowest id wins
        lane_max = tl.full((BLOCK_W, 32), ninf, tl.float32)
        lane_arg = tl.full((BLOCK_W, 32), -1, tl.int32)
        for j in tl.range(tl.maximum(blk0, j_full0), tl.minimum(blk1, j_part), num_stages=NUM_STAGES):
            lane_max, lane_arg, run_sum = _row_block(  # unmasked: vectorised loads
                logits_ptr, row_off, mrow, off + j * BLK, a_lo, a_hi, num_words, inv_t, thr, need_sum,
                    lane_max, lane_arg, run_sum,
                False, HAS_MASK, ALL_GREEDY, HAS_TOP_P, SHIFTED, True, BLOCK_W, 1)
        run_max, run_arg = _reduce_lane_argmax(lane_max, lane_arg, run_max, run_arg, BLOCK_W)
    else:
        # two loops, chosen once per row: a row of a sampling sequence (max and sum per lane, no
        # argmax), a row of a greedy sequence (per-lane max / argmax)
        if need_sum:
            lane_max = tl.full((BLOCK_W, 32), -3.4028234663852886e38, tl.float32)
            lane_sum = tl.zeros((BLOCK_W, 32), dtype=tl.float32)
            for j in tl.range(tl.maximum(blk0, j_full0), tl.minimum(blk1, j_part), num_stages=NUM_STAGES):
                lane_max, run_arg, lane_sum = _row_block(
                    logits_ptr, row_off, mrow, off + j * BLK, a_lo, a_hi, num_words, inv_t, thr, need_sum,
                    lane_max, run_arg, lane_sum,
                    False, HAS_MASK, ALL_GREEDY, HAS_TOP_P, SHIFTED, True, BLOCK_W, 2)
            # a lane sum of 0: nothing allowed in the lane; NaN: an allowed NaN (the row is invalid)
            bsum0 = tl.sum(lane_sum)
            xmax = tl.where(bsum0 > 0, tl.max(lane_max), tl.where(bsum0 == bsum0, ninf, float("inf")))
            xref = tl.where(xmax == ninf, 0.0, xmax)
            bsum = tl.sum(lane_sum * tl.exp((lane_max - xref) * inv_t))
            bmax = xmax * inv_t                        # the chunk's max of v
            new_max = tl.maximum(run_max, bmax)
            ref = tl.where(new_max == ninf, 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - ref) + bsum * tl.exp(bmax - ref)
            run_max = new_max
        else:
            lane_max = tl.full((BLOCK_W, 32), ninf, tl.float32)
            lane_arg = tl.full((BLOCK_W, 32), -1, tl.int32)
            for j in tl.range(tl.maximum(blk0, j_full0), tl.minimum(blk1, j_part), num_stages=NUM_STAGES):
                lane_max, lane_arg, run_sum = _row_block(
                    logits_ptr, row_off, mrow, off + j * BLK, a_lo, a_hi, num_words, inv_t, thr, need_sum,
                    lane_max, lane_arg, run_sum,
                    False, HAS_MASK, ALL_GREEDY, HAS_TOP_P, SHIFTED, True, BLOCK_W, 1)
            run_max, run_arg = _reduce_lane_argmax(lane_max, lane_arg, run_max, run_arg, BLOCK_W)
    if (j_part < blk1) & (j_part >= tl.maximum(blk0, j_full0)):     # this chunk holds the row's tail
        run_max, run_arg, run_sum = _row_block(
            logits_ptr, row_off, mrow, off + j_part * BLK, a_lo, a_hi, num_words, inv_t, thr, need_sum,
            run_max, run_arg, run_sum,
            True, HAS_MASK, ALL_GREEDY, HAS_TOP_P, SHIFTED, True, BLOCK_W)
    if (tail < V) & (blk0 <= nblocks - 1) & (nblocks - 1 < blk1):   # the row's last partial group
        run_max, run_arg, run_sum = _row_block(
            logits_ptr, row_off, mrow, tail, row_off + tail, row_off + V, num_words, inv_t, thr, need_sum,
            run_max, run_arg, run_sum,
            True, HAS_MASK, ALL_GREEDY, HAS_TOP_P, True, False, 1)

    o = r64 * num_splits + s
    tl.store(part_max_ptr + o, run_max)
    tl.store(part_arg_ptr + o, run_arg)
    if not ALL_GREEDY:
        tl.store(part_sum_ptr + o, run_sum)
    if FUSED:
        # the program that completes its sequence's count runs the sequence's chain
        tl.debug_barrier()
        start_b = tl.load(cu_ptr + b - 1, mask=b > 0, other=0).to(tl.int32)
        total = (end_b - start_b + 1) * num_splits
        done = tl.atomic_add(count_ptr + b, 1, sem="acq_rel")
        if done == total - 1:
            _finish_sequence(
                b, logits_ptr, stride_lr, mask_ptr, stride_mr, draft_ptr, cu_ptr, temp_ptr, unif_ptr, thr_ptr,
                dprob_ptr, stride_dr, stride_dv,
                part_max_ptr, part_arg_ptr, part_sum_ptr,
                out_ptr, stride_ob, acc_ptr, emit_ptr, err_ptr, pend_row_ptr, pend_max_ptr, pend_sum_ptr,
                V, num_splits, max_draft,
                HAS_MASK, ALL_GREEDY, NO_DRAFT_PROBS, HAS_TOP_P, CHAIN_R, CHAIN_S, OUT_W)
            tl.atomic_xchg(count_ptr + b, 0)


@triton.jit(do_not_specialize=["num_splits", "max_draft", "stride_ob"])
def _chain_kernel(
    logits_ptr, stride_lr, mask_ptr, stride_mr, draft_ptr, cu_ptr, temp_ptr, unif_ptr, thr_ptr,
    dprob_ptr, stride_dr, stride_dv,
    part_max_ptr, part_arg_ptr, part_sum_ptr,
    out_ptr, stride_ob, acc_ptr, emit_ptr, err_ptr, pend_row_ptr, pend_max_ptr, pend_sum_ptr,
    V, num_splits, max_draft,
    HAS_MASK: tl.constexpr, ALL_GREEDY: tl.constexpr, NO_DRAFT_PROBS: tl.constexpr,
    HAS_TOP_P: tl.constexpr, CHAIN_R: tl.constexpr, CHAIN_S: tl.constexpr, OUT_W: tl.constexpr,
):
    # fused=False: the chain of sequence program_id(0), after pass A
    _finish_sequence(
        tl.program_id(0), logits_ptr, stride_lr, mask_ptr, stride_mr, draft_ptr, cu_ptr, temp_ptr, unif_ptr,
        thr_ptr, dprob_ptr, stride_dr, stride_dv,
        part_max_ptr, part_arg_ptr, part_sum_ptr,
        out_ptr, stride_ob, acc_ptr, emit_ptr, err_ptr, pend_row_ptr, pend_max_ptr, pend_sum_ptr,
        V, num_splits, max_draft,
        HAS_MASK, ALL_GREEDY, NO_DRAFT_PROBS, HAS_TOP_P, CHAIN_R, CHAIN_S, OUT_W)


# ---------------------------------------------------------------------------------------------
# host side

_DUMMIES: dict[tuple[str, torch.dtype], torch.Tensor] = {}


def _dummy(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    key = (str(device), dtype)
    t = _DUMMIES.get(key)
    if t is None:
        t = torch.zeros(2, dtype=dtype, device=device)
        _DUMMIES[key] = t
    return t


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 1


def plan_splits(rows: int, vocab_size: int, device: torch.device, *, block_words: int | None = None,
                num_splits: int | None = None, programs_per_sm: int | None = None,
                shifted: bool = False) -> tuple[int, int, int]:
    """``(block_words, num_splits, blocks_per_split)`` for a row count and vocabulary size.

    On a GPU the vocabulary of a row is cut into chunks so that about ``programs_per_sm``
    (default 4) programs per SM run, rounded down so that one wave holds every program (a
    second, partial wave would nearly double the step); in the interpreter one program per row
    reads the whole row with large blocks. ``shifted`` rows (row stride not a multiple of 16
    elements) may span one block more.
    """
    if block_words is None:
        if device.type == "cuda":
            block_words = _GPU_BLOCK_W
        else:  # one block per row when the vocabulary is small (less numpy work per step)
            block_words = min(_INTERP_BLOCK_W, triton.next_power_of_2(triton.cdiv(vocab_size, 32)))
    span = vocab_size + (ROW_ALIGN - 1 if shifted else 0)
    nblocks = max(1, triton.cdiv(span, 32 * block_words))
    if num_splits is None:
        if device.type == "cuda":
            target = (programs_per_sm or _PROGRAMS_PER_SM) * _sm_count(device)
            num_splits = max(1, target // max(rows, 1))
        else:
            num_splits = 1
    num_splits = max(1, min(num_splits, nblocks, MAX_SPLITS))
    per = triton.cdiv(nblocks, num_splits)
    num_splits = triton.cdiv(nblocks, per)
    return block_words, num_splits, per


def workspace_sizes(rows: int, batch: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Scratch tensors the kernels need for ``rows`` logit rows and ``batch`` sequences.

    ``count`` (the fused chain's per-sequence counters) must start at zero; the kernels leave
    it at zero. One workspace serves one stream at a time."""
    f32, i32 = torch.float32, torch.int32
    rs = (rows * MAX_SPLITS,)
    bs = (batch * MAX_SPLITS,)
    return {
        "part_max": (rs, f32), "part_arg": (rs, i32), "part_sum": (rs, f32), "count": ((batch,), i32),
        "pend_row": ((batch,), i32), "pend_max": ((batch,), f32), "pend_sum": ((batch,), f32),
        "res_key": (bs, f32), "res_win": (bs, i32), "p_key": (bs, f32), "p_win": (bs, i32),
    }


def verify_triton(
    draft_token_ids: torch.Tensor,       # int32|int64 [N]
    cu_num_draft_tokens: torch.Tensor,   # int32|int64 [B]
    target_logits: torch.Tensor,         # fp32|fp16|bf16 [N + B, V], last dim contiguous
    bitmask: torch.Tensor | None,        # int32 [N + B, >= ceil(V/32)], last dim contiguous
    draft_probs: torch.Tensor | None,    # float [N, V]
    temperature: torch.Tensor | None,    # fp32 [B]
    top_p_threshold: torch.Tensor | None,  # fp32 [N + B]
    uniforms: torch.Tensor | None,       # float64 [N + B, 2] contiguous
    output_token_ids: torch.Tensor,      # int32 [B, max_draft + 1]  (written)
    num_accepted: torch.Tensor,          # int32 [B]  (written)
    num_emitted: torch.Tensor,           # int32 [B]  (written)
    error_position: torch.Tensor,        # int32 [B]  (written)
    *,
    workspace: dict[str, torch.Tensor] | None = None,
    block_words: int | None = None,
    num_splits: int | None = None,
    programs_per_sm: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    fused: bool = True,
) -> None:
    """Launch the fused kernels; same contract and outputs as ``torch_ref.verify_reference``.

    ``workspace`` maps the names of :func:`workspace_sizes` to flat tensors at least that large;
    missing or too small entries are (re)allocated and stored back into the dict (a workspace
    must not be shared by launches that may run at the same time, e.g. on two streams).
    ``block_words`` / ``num_splits`` / ``programs_per_sm`` override the launch plan (tests use
    them to exercise multi-chunk rows in the interpreter); ``num_warps`` and ``num_stages``
    (software pipelining of the full-block loop: cp.async stages on sm80+) tune pass A.
    ``fused=False`` runs the accept chain as a second kernel instead of in pass A's last
    program per sequence (same results). No host synchronisation.
    """
    dev = target_logits.device
    if dev.type != "cuda" and not interpreter_active():
        raise ValueError("the triton backend needs CUDA tensors, or TRITON_INTERPRET=1 set before "
                         "structgen.kernels.triton_verify is first imported (CPU tensors)")
    if target_logits.stride(1) != 1:
        target_logits = target_logits.contiguous()
    rows, vocab = target_logits.shape
    batch = cu_num_draft_tokens.numel()
    shifted = target_logits.stride(0) % ROW_ALIGN != 0
    bw, splits, per = plan_splits(rows, vocab, dev, block_words=block_words, num_splits=num_splits,
                                  programs_per_sm=programs_per_sm, shifted=shifted)
    ws = workspace if workspace is not None else {}
    for name, (shape, dtype) in workspace_sizes(rows, batch).items():
        t = ws.get(name)
        if t is None or t.numel() < shape[0] or t.dtype != dtype or t.device != dev:
            ws[name] = (torch.zeros if name == "count" else torch.empty)(shape, dtype=dtype, device=dev)

    all_greedy = temperature is None
    no_dp = draft_probs is None or all_greedy
    has_mask = bitmask is not None
    has_top_p = top_p_threshold is not None and not all_greedy
    f32 = torch.float32
    mask_t = bitmask if has_mask else _dummy(dev, torch.int32)
    mask_stride = bitmask.stride(0) if bitmask is not None else 0
    num_words = bitmask.shape[1] if bitmask is not None else 0
    # (an empty draft list gets a dummy of the same dtype: no new kernel variant)
    draft_t = draft_token_ids if draft_token_ids.numel() else _dummy(dev, draft_token_ids.dtype)
    temp_t = temperature if temperature is not None else _dummy(dev, f32)
    unif_t = uniforms if (uniforms is not None and not all_greedy) else _dummy(dev, torch.float64)
    thr_t = top_p_threshold if has_top_p else _dummy(dev, f32)
    dp_t = draft_probs if not no_dp else _dummy(dev, f32)
    dp_s0, dp_s1 = ((draft_probs.stride(0), draft_probs.stride(1)) if draft_probs is not None and not no_dp
                    else (0, 0))
    max_draft = output_token_ids.shape[1] - 1
    parts = (ws["part_max"], ws["part_arg"], ws["part_sum"])
    outs = (output_token_ids, output_token_ids.stride(0), num_accepted, num_emitted, error_position,
            ws["pend_row"], ws["pend_max"], ws["pend_sum"])
    flags = dict(HAS_MASK=has_mask, ALL_GREEDY=all_greedy, NO_DRAFT_PROBS=no_dp, HAS_TOP_P=has_top_p)
    chain = dict(CHAIN_R=CHAIN_ROWS, CHAIN_S=CHAIN_SPLITS, OUT_W=OUT_BLOCK)

    _row_pass_kernel[(rows, splits)](
        target_logits, target_logits.stride(0),
        mask_t, mask_stride, num_words,
        draft_t, cu_num_draft_tokens, temp_t, unif_t, thr_t,
        dp_t, dp_s0, dp_s1,
        *parts, ws["count"], *outs,
        batch, vocab, per, splits, max_draft,
        SHIFTED=shifted, FUSED=fused, BLOCK_W=bw, BLOCK_B=128, NUM_STAGES=num_stages,
        **flags, **chain, num_warps=num_warps,
    )
    if not fused:
        _chain_kernel[(batch,)](
            target_logits, target_logits.stride(0), mask_t, mask_stride,
            draft_t, cu_num_draft_tokens, temp_t, unif_t, thr_t,
            dp_t, dp_s0, dp_s1,
            *parts, *outs,
            vocab, splits, max_draft,
            **flags, **chain, num_warps=1,
        )
    if not all_greedy:
        # one row per sequence: its own plan, so that the batch's rows fill the GPU too
        _, rsplits, rper = plan_splits(batch, vocab, dev, block_words=bw, num_splits=num_splits,
                                       programs_per_sm=programs_per_sm)
        res = (ws["res_key"], ws["res_win"], ws["p_key"], ws["p_win"])
        _residual_kernel[(batch, rsplits)](
            target_logits, target_logits.stride(0), target_logits.stride(1),
            mask_t, mask_stride, num_words,
            temp_t, unif_t, thr_t, draft_t, cu_num_draft_tokens,
            dp_t, dp_s0, dp_s1,
            ws["pend_row"], ws["pend_max"], ws["pend_sum"],
            *res,
            batch, vocab, rper, rsplits,
            HAS_MASK=has_mask, HAS_TOP_P=has_top_p, NO_DRAFT_PROBS=no_dp, BLOCK_W=bw, num_warps=num_warps,
        )
        _residual_finish_kernel[(batch,)](
            ws["pend_row"], num_accepted, output_token_ids, output_token_ids.stride(0),
            *res, rsplits, MAX_S=MAX_SPLITS, num_warps=1,
        )
