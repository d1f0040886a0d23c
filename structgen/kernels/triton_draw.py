"""The sampling draw of the fused verify step (:mod:`structgen.kernels.triton_verify`): the
exponential race on each sampling sequence's stopping row, and the Triton helpers it shares
with pass A.

``_residual_kernel`` (grid ``(B, S')``) runs the race on the row the accept / reject chain
stopped at (``pend_row``: the rejected row, or the bonus row when every draft was accepted):
over ``max(p - q, 0)`` with draft probabilities (over ``p`` when that is empty), over ``p``
without the draft token for a deterministic draft, and over ``p`` for a bonus row; each of
its S' programs keeps the best key of one vocabulary chunk. ``_residual_finish_kernel`` (grid
``(B,)``) combines the chunks and writes the token. A block whose best possible key (its max
plus ``GUMBEL_BOUND``) cannot beat the running best skips the hash and the logarithms, and a
block where no token's cheap bound (``_gumbel_upper``) reaches it skips the logarithms; the
result is the same. The noise is :func:`structgen.kernels.torch_ref.gumbel_noise`'s, from the
same uniforms and hash.

Imported by :mod:`structgen.kernels.triton_verify` only (it imports triton at its top).
"""

from __future__ import annotations

import triton
import triton.language as tl

from structgen.kernels.torch_ref import GREEDY_TEMPERATURE, GUMBEL_BOUND

_INT_MAX = tl.constexpr(2147483647)
GREEDY_T = tl.constexpr(GREEDY_TEMPERATURE)
G_BOUND = tl.constexpr(GUMBEL_BOUND)


@triton.jit
def _mix32(x):
    # the mixer of torch_ref.mix32 on uint32 (wrapping multiplies, logical shifts)
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    x = x ^ (x >> 16)
    return x


@triton.jit
def _row_seed(unif_ptr, r):
    # mix32(floor(u1 * 2**32)) from column 1 of the row's uniforms (float64 [R, 2])
    u1 = tl.load(unif_ptr + 2 * r.to(tl.int64) + 1)
    k = (u1 * 4294967296.0).to(tl.int64).to(tl.uint32)
    return _mix32(k)


@triton.jit
def _race_u(tok, seed):
    # the uniform u in (0, 1) of torch_ref.gumbel_noise for the token ids ``tok`` (int32) of one
    # row; the noise is g = -log(-log(u)). _mix32 written out: a nested jit call costs
    # milliseconds per call in the interpreter
    h = (tok.to(tl.uint32) * 0x9E3779B1) ^ seed
    h = h ^ (h >> 16)
    h = h * 0x7FEB352D
    h = h ^ (h >> 15)
    h = h * 0x846CA68B
    h = h ^ (h >> 16)
    return ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07


@triton.jit
def _gumbel_upper(u):
    # a cheap upper bound of g = -log(-log(u)) (no logarithm): -log(u) >= 1 - u, and 1 - u is
    # exact in float32 (u has at most 24 significant bits) with 2**-k <= 1 - u for k = minus
    # its binary exponent, so g <= -log(1 - u) <= k * ln 2; the margin covers the rounding of
    # the computed g (a few 1e-6)
    k = 127 - ((1.0 - u).to(tl.int32, bitcast=True) >> 23)
    return k.to(tl.float32) * 0.6931471805599453 + 1e-3

@triton.jit
def _inv_temperature(temp_ptr, b):
    t = tl.load(temp_ptr + b).to(tl.float32)
    sampling = t >= GREEDY_T
    inv_t = tl.where(sampling, tl.math.div_rn(1.0, tl.where(sampling, t, 1.0)), 1.0)
    return sampling, inv_t

@triton.jit
def _combine_argmax(val_ptr, idx_ptr, base, so, smask):
    # max over the S partials of a row and the lowest token id reaching it (-1 if all -inf)
    vals = tl.load(val_ptr + base + so, mask=smask, other=float("-inf"))
    best = tl.max(vals, axis=0)
    ids = tl.load(idx_ptr + base + so, mask=smask, other=-1)
    win = tl.min(tl.where(smask & (vals == best), ids, _INT_MAX), axis=0)
    win = tl.where(best > float("-inf"), win, -1)
    return best, win, vals




@triton.jit(do_not_specialize=["batch", "blocks_per_split", "num_splits"])
def _residual_kernel(
    logits_ptr, stride_lr, stride_lv, mask_ptr, stride_mr, num_words,
    temp_ptr, unif_ptr, thr_ptr, draft_ptr, cu_ptr,
    dprob_ptr, stride_dr, stride_dv,       # float [N, V] (not NO_DRAFT_PROBS)
    pend_row_ptr, pend_max_ptr, pend_sum_ptr,  # [B]
    res_key_ptr, res_win_ptr, p_key_ptr, p_win_ptr,  # [B, S]
    batch, V, blocks_per_split, num_splits,
    HAS_MASK: tl.constexpr, HAS_TOP_P: tl.constexpr, NO_DRAFT_PROBS: tl.constexpr, BLOCK_W: tl.constexpr,
):
    # The token drawn in each sequence's stopping row (pend_row; -1: none). A rejected draft
    # row: with draft probabilities the race over max(p - q, 0) (and over p, the fallback when
    # that is empty); for a deterministic draft the race over p without the draft token. The
    # bonus row (every draft accepted): the race over p.
    b = tl.program_id(0)
    s = tl.program_id(1)
    ninf = float("-inf")
    r = tl.load(pend_row_ptr + b)
    o = b.to(tl.int64) * num_splits + s
    run_rkey = tl.full((), ninf, tl.float32)
    run_rwin = tl.full((), -1, tl.int32)
    run_pkey = tl.full((), ninf, tl.float32)
    run_pwin = tl.full((), -1, tl.int32)
    if r >= 0:
        r64 = r.to(tl.int64)
        d64 = (r - b).to(tl.int64)                      # draft index of a rejected row
        is_bonus = r == tl.load(cu_ptr + b).to(tl.int32) + b
        res_on = is_bonus == 0                          # the residual race (draft probabilities)
        m = tl.load(pend_max_ptr + b)
        z = tl.load(pend_sum_ptr + b)
        _sampling, inv_t = _inv_temperature(temp_ptr, b)
        seed = _row_seed(unif_ptr, r)
        thr = tl.full((), ninf, tl.float32)
        if HAS_TOP_P:
            thr = tl.load(thr_ptr + r)
        excl = tl.full((), -1, tl.int32)
        if NO_DRAFT_PROBS:
            excl = tl.load(draft_ptr + d64, mask=res_on, other=-1).to(tl.int32)
        bits = tl.arange(0, 32)
        # res_on per element (the interpreter cannot combine a loaded-compare scalar with a tile)
        res_t = (tl.zeros((BLOCK_W, 32), dtype=tl.int32) + res_on.to(tl.int32)) != 0
        nblocks = tl.cdiv(V, BLOCK_W * 32)
        blk0 = s * blocks_per_split
        blk1 = tl.minimum(blk0 + blocks_per_split, nblocks)
        for blk in range(blk0, blk1):
            w = blk * BLOCK_W + tl.arange(0, BLOCK_W)
            tok = w[:, None] * 32 + bits[None, :]
            inb = tok < V
            x = tl.load(logits_ptr + r64 * stride_lr + tok.to(tl.int64) * stride_lv,
                        mask=inb, other=0.0).to(tl.float32)
            if HAS_MASK:
                word = tl.load(mask_ptr + r64 * stride_mr + w, mask=w < num_words, other=0)
                allowed = ((word[:, None] & (1 << bits)[None, :]) != 0) & inb
            else:
                allowed = inb
            v = x * inv_t
            if HAS_TOP_P:
                allowed = allowed & (v >= thr)
            if NO_DRAFT_PROBS:
                allowed = allowed & (tok != excl)       # p without the draft token
            vm = tl.where(allowed & (v == v), v, ninf)
            # a block is skipped when no token's bound can reach the running keys (exact):
            # g <= _gumbel_upper(u) <= GUMBEL_BOUND; with draft probabilities the residual key
            # log(max(p - q, 0)) + g <= log(p) + g, and log(p) <= v - (m + log z) + 1e-3 (the
            # rounding of p's exp and division)
            live = vm > ninf
            if NO_DRAFT_PROBS:
                lim = run_rkey - tl.max(vm)
            else:
                shift = m + tl.log(z) - 1e-3
                lim = tl.minimum(tl.where(res_on, run_rkey + shift, float("inf")), run_pkey) - tl.max(vm)
            if G_BOUND >= lim:
                u = _race_u(tok, seed)
                gb = _gumbel_upper(u)
                if NO_DRAFT_PROBS:
                    reach = vm + gb >= run_rkey
                else:
                    reach = (res_t & (vm - shift + gb >= run_rkey)) | (vm + gb >= run_pkey)
                if tl.max((live & reach).to(tl.int32)) > 0:
                    g = -tl.log(-tl.log(u))
                    if NO_DRAFT_PROBS:
                        rkey = tl.where(live, vm + g, ninf)
                    else:
                        q = tl.load(dprob_ptr + d64 * stride_dr + tok.to(tl.int64) * stride_dv,
                                    mask=inb & res_t, other=0.0).to(tl.float32)
                        p = tl.math.div_rn(tl.exp(vm - m), tl.zeros_like(vm) + z)
                        res = p - q
                        rkey = tl.where(live & res_t & (res > 0), tl.log(tl.where(res > 0, res, 1.0)) + g,
                                        ninf)
                    kmax = tl.max(rkey)
                    kwin = tl.min(tl.where(rkey == kmax, tok, _INT_MAX))
                    run_rwin = tl.where(kmax > run_rkey, kwin, run_rwin)
                    run_rkey = tl.maximum(run_rkey, kmax)
                    if not NO_DRAFT_PROBS:
                        pkey = vm + g
                        kmax = tl.max(pkey)
                        kwin = tl.min(tl.where(pkey == kmax, tok, _INT_MAX))
                        run_pwin = tl.where(kmax > run_pkey, kwin, run_pwin)
                        run_pkey = tl.maximum(run_pkey, kmax)
    tl.store(res_key_ptr + o, run_rkey)
    tl.store(res_win_ptr + o, run_rwin)
    tl.store(p_key_ptr + o, run_pkey)
    tl.store(p_win_ptr + o, run_pwin)


@triton.jit(do_not_specialize=["num_splits", "stride_ob"])
def _residual_finish_kernel(
    pend_row_ptr, acc_ptr, out_ptr, stride_ob,
    res_key_ptr, res_win_ptr, p_key_ptr, p_win_ptr,   # [B, S]
    num_splits, MAX_S: tl.constexpr,
):
    b = tl.program_id(0)
    r = tl.load(pend_row_ptr + b)
    if r >= 0:
        so = tl.arange(0, MAX_S)
        smask = so < num_splits
        base = b.to(tl.int64) * num_splits
        _rk, rwin, _rv = _combine_argmax(res_key_ptr, res_win_ptr, base, so, smask)
        _pk, pwin, _pv = _combine_argmax(p_key_ptr, p_win_ptr, base, so, smask)
        tok = tl.where(rwin >= 0, rwin, pwin)
        slot = tl.load(acc_ptr + b)
        tl.store(out_ptr + b.to(tl.int64) * stride_ob + slot, tok)
