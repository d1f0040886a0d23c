"""Torch reference of the verify step: the oracle for the Triton kernels, and the CPU path.

It states the semantics of :func:`structgen.generation.verify.verify` in plain tensor code; the Triton
backend (``triton_verify``) must give the same tokens for the same inputs and uniforms.

Layout (vLLM rejection-sampler terms). ``B`` sequences, ``N`` draft tokens in total,
``R = N + B`` logit rows, ``V`` vocabulary entries:

* ``draft_token_ids``  int32|int64 ``[N]``: the drafts of all sequences, flattened;
* ``cu_num_draft_tokens`` int32|int64 ``[B]``: INCLUSIVE cumulative draft counts; sequence b
  owns drafts ``[cu[b-1], cu[b])`` (``cu[-1]`` read as 0) and logit rows
  ``cu[b-1] + b ... cu[b] + b``: one row per draft position, then its bonus row;
* ``target_logits`` ``[R, V]`` and the packed ``bitmask`` int32 ``[R, >= ceil(V/32)]`` of the
  same rows (bit j of word w allows token 32*w + j; bits of tokens >= V are ignored).

Row maths. A row's scaled logits are ``v = float32(logit) * inv_t`` with ``inv_t = 1`` for a
greedy sequence and ``inv_t = float32(1 / T)`` for a sampling one. A token is *viable* when
the mask allows it, it is inside the top-p nucleus (when top-p is on) and ``v > -inf``. A row
with no viable token, or an allowed token whose ``v`` is NaN or +inf, is *invalid*: the
sequence reports an error (``num_accepted = -1``, ``error_position`` = that row's position)
instead of a token. Masked tokens have probability exactly 0.

Greedy sequences (``T < GREEDY_TEMPERATURE``): accept draft i while it equals the argmax of
the viable ``v`` of row i (ties: lowest token id); at the first mismatch emit that argmax
(the *recovered* token); when every draft is accepted emit the argmax of the bonus row.

Sampling sequences: ``p = softmax(v)`` over viable tokens, ``M`` = max viable ``v``,
``w_j = exp(v_j - M)`` (float32) and ``Z = sum_j w_j`` (float64 here, float32 online in the
kernel). Draft i (token x) is accepted iff ``u0 * q(x) < p(x)`` in float64, where
``p(x) = w_x / Z`` (0 when x is not viable or out of range), ``q(x) = draft_probs[i, x]``, or
``q(x) = 1`` when the draft has no probabilities (a deterministic proposal: grammar-forced,
prompt lookup). Draft probabilities are used as given (masked tokens need no masking:
``p = 0`` there); they must be the distribution the draft was sampled from.
On rejection the recovered token is drawn from ``normalize(max(p - q, 0))``: for a
deterministic proposal that is ``p`` with x removed; with draft probabilities the residual
weights are ``r_j = w_j / float32(Z) - q_j`` in float32, counted where ``r_j > 0`` on viable
tokens, and when
no weight is positive the token is drawn from ``p`` instead. The bonus token is drawn from
``p`` of the bonus row.

Uniforms: float64 ``[R, 2]`` in [0, 1). Column 0 of a draft row is its acceptance draw.
Column 1 of a row seeds that row's token draw, an exponential race (the Gumbel-max trick)
that a single pass over the vocabulary can run online: with ``seed = mix32(floor(u1 * 2**32))``
token j gets the noise ``g_j = -log(-log(U_j))``, ``U_j = ((h_j >> 9) + 0.5) * 2**-23`` from the
32-bit hash ``h_j = mix32((j * 0x9E3779B1) ^ seed)``, and the drawn token is the argmax of
``log(weight_j) + g_j`` over positive weights (ties: lowest id); for ``p`` that key is
``v_j + g_j``. With 23-bit ``U`` the noise lies in [-2.81, 16.64], so a token whose key is
more than ~19.4 below the best can never win: tokens with probability below ~4e-9 relative
to the most likely one are never drawn (a bias far below any test's resolution).

Top-p (``top_p[b] < 1``, sampling sequences only): per row, sort the viable tokens by ``p``
(descending), take the shortest prefix whose float64 mass reaches ``top_p``, and keep every
token whose ``v`` is at least the ``v`` of the prefix's last token (ties at the edge kept);
the result is a per-row threshold on ``v`` (:func:`top_p_thresholds`), shared by both backends.
"""

from __future__ import annotations

import torch

__all__ = [
    "MAX_DRAFT",
    "GREEDY_TEMPERATURE",
    "GUMBEL_BOUND",
    "mix32",
    "race_seeds",
    "race_uniforms",
    "gumbel_noise",
    "unpack_bitmask",
    "row_layout",
    "inverse_temperature",
    "top_p_thresholds",
    "verify_reference",
]

# Longest draft one sequence may carry per verify call (output rows are MAX_DRAFT + 1 wide at
# most). A fixed bound: kernels never specialise on draft lengths.
MAX_DRAFT = 127
# Temperatures below this (0 included) select greedy verification for the sequence.
GREEDY_TEMPERATURE = 1e-5
# Upper bound of the race noise g (its true maximum is -log(-log(1 - 2**-24)) = 16.635...).
GUMBEL_BOUND = 17.0

_M32 = 0xFFFFFFFF
_MIX_A = 0x7FEB352D
_MIX_B = 0x846CA68B
_GOLDEN = 0x9E3779B1


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """``(a * c) mod 2**32`` for int64 ``a`` in [0, 2**32) without int64 overflow."""
    lo = a & 0xFFFF
    hi = a >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (xor-shift / multiply rounds) on int64 tensors holding uint32 values."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, _MIX_A)
    x = x ^ (x >> 15)
    x = _mul32(x, _MIX_B)
    x = x ^ (x >> 16)
    return x


def race_seeds(u: torch.Tensor) -> torch.Tensor:
    """Row seeds ``mix32(floor(u * 2**32))`` (int64 ``[n]``) from float64 uniforms ``[n]``."""
    k = (u.to(torch.float64) * 4294967296.0).to(torch.int64) & _M32
    return mix32(k)


def race_uniforms(seeds: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The uniforms ``u`` float32 ``[n, vocab_size]`` in (0, 1) behind the race noise, for int64
    row seeds ``[n]``: 23 hash bits per token, ``(bits + 0.5) * 2**-23``."""
    tok = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    h = mix32(_mul32(tok, _GOLDEN)[None, :] ^ seeds[:, None])
    return ((h >> 9).to(torch.float32) + 0.5) * (2.0 ** -23)


def gumbel_noise(seeds: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Race noise ``g = -log(-log(u))`` float32 ``[n, vocab_size]`` for int64 row seeds ``[n]``
    (see module doc)."""
    u = race_uniforms(seeds, vocab_size)
    return -torch.log(-torch.log(u))


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed int32 ``[R, W]`` -> bool ``[R, vocab_size]``; bits of tokens >= vocab_size dropped."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1  # [R, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def row_layout(cu_num_draft_tokens: torch.Tensor, num_draft: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per logit row: ``row_seq`` int64 ``[R]`` (its sequence), ``is_bonus`` bool ``[R]`` and
    ``row_draft`` int64 ``[R]`` (its index into ``draft_token_ids``; -1 on bonus rows)."""
    cu = cu_num_draft_tokens.to(torch.int64)
    batch = cu.numel()
    dev = cu.device
    counts = torch.diff(cu, prepend=torch.zeros(1, dtype=torch.int64, device=dev))
    rows = num_draft + batch
    row_seq = torch.repeat_interleave(torch.arange(batch, device=dev), counts + 1, output_size=rows)
    is_bonus = torch.zeros(rows, dtype=torch.bool, device=dev)
    is_bonus[cu + torch.arange(batch, device=dev)] = True
    row_draft = torch.arange(rows, device=dev) - row_seq
    row_draft[is_bonus] = -1
    return row_seq, is_bonus, row_draft


def inverse_temperature(temperature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``sampling`` bool ``[B]`` (T >= GREEDY_TEMPERATURE) and ``inv_t`` float32 ``[B]``
    (``float32(1 / T)`` for sampling sequences, 1 for greedy ones)."""
    t = temperature.to(torch.float32)
    sampling = t >= GREEDY_TEMPERATURE
    one = torch.ones_like(t)
    inv_t = torch.where(sampling, one / torch.where(sampling, t, one), one)
    return sampling, inv_t


def _scaled(target_logits: torch.Tensor, bitmask: torch.Tensor | None, row_scale: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``v`` float32 ``[R, V]`` and ``allowed`` bool ``[R, V]`` (mask only, no top-p)."""
    vocab = target_logits.shape[1]
    v = target_logits.to(torch.float32) * row_scale[:, None]
    if bitmask is None:
        allowed = torch.ones_like(v, dtype=torch.bool)
    else:
        allowed = unpack_bitmask(bitmask, vocab)
    return v, allowed


def top_p_thresholds(target_logits: torch.Tensor, bitmask: torch.Tensor | None,
                     cu_num_draft_tokens: torch.Tensor, temperature: torch.Tensor,
                     top_p: torch.Tensor) -> torch.Tensor:
    """Per-row top-p thresholds on the scaled logits ``v``: float32 ``[R]``, ``-inf`` where top-p
    is off (greedy sequence, ``top_p >= 1``, invalid row).

    Shared by both backends (the Triton path's separate top-p pass): it materialises float32
    probabilities and sorts the rows that use top-p, so it costs far more than the fused pass.
    """
    rows, _ = target_logits.shape
    dev = target_logits.device
    num_draft = rows - cu_num_draft_tokens.numel()
    row_seq, _, _ = row_layout(cu_num_draft_tokens, num_draft)
    sampling, inv_t = inverse_temperature(temperature)
    tp = top_p.to(torch.float64)
    use = (sampling & (tp < 1.0))[row_seq]
    thr = torch.full((rows,), float("-inf"), dtype=torch.float32, device=dev)
    idx = torch.nonzero(use).flatten()
    if idx.numel() == 0:
        return thr
    for chunk in idx.split(64):
        v, allowed = _scaled(target_logits[chunk], None if bitmask is None else bitmask[chunk],
                             inv_t[row_seq[chunk]])
        vm = torch.where(allowed & ~torch.isnan(v), v, float("-inf"))
        m = vm.amax(1)
        ok = m > float("-inf")
        w = torch.exp(vm - torch.where(ok, m, 0.0)[:, None]).to(torch.float64)
        p = w / w.sum(1, keepdim=True).clamp_min(1e-300)
        order = torch.argsort(p, dim=1, descending=True, stable=True)
        cum = torch.cumsum(torch.gather(p, 1, order), 1)
        n_viable = (vm > float("-inf")).sum(1)
        target = tp[row_seq[chunk]]
        k = torch.searchsorted(cum, target[:, None]).flatten()
        k = torch.minimum(k, (n_viable - 1).clamp_min(0))
        t = torch.gather(torch.gather(vm, 1, order), 1, k[:, None]).flatten()
        thr[chunk] = torch.where(ok, t, float("-inf"))
    return thr


def _race(keys: torch.Tensor) -> torch.Tensor:
    """Lowest-index argmax per row of float32 ``[n, V]``; -1 where a row is all -inf."""
    best = keys.amax(1)
    ids = torch.arange(keys.shape[1], device=keys.device)
    win = torch.where(keys == best[:, None], ids, keys.shape[1]).amin(1)
    return torch.where(best > float("-inf"), win, -1)


def verify_reference(
    draft_token_ids: torch.Tensor,       # int32|int64 [N]
    cu_num_draft_tokens: torch.Tensor,   # int32|int64 [B]  inclusive cumulative draft counts
    target_logits: torch.Tensor,         # fp32|fp16|bf16 [N + B, V]
    bitmask: torch.Tensor | None,        # int32 [N + B, >= ceil(V/32)] or None (no grammar)
    draft_probs: torch.Tensor | None,    # float [N, V] or None (deterministic proposals)
    temperature: torch.Tensor | None,    # fp32 [B] or None (all greedy)
    top_p_threshold: torch.Tensor | None,  # fp32 [N + B] from top_p_thresholds, or None
    uniforms: torch.Tensor | None,       # float64 [N + B, 2]; None only when all greedy
    output_token_ids: torch.Tensor,      # int32 [B, max_draft + 1]  (written)
    num_accepted: torch.Tensor,          # int32 [B]  (written)
    num_emitted: torch.Tensor,           # int32 [B]  (written)
    error_position: torch.Tensor,        # int32 [B]  (written)
) -> None:
    """Verify every sequence and write the four output tensors in place (module doc: semantics).

    Inputs are assumed checked by :func:`structgen.generation.verify.verify`. Costs several float32 and
    int64 ``[rows, V]`` temporaries and one host synchronisation; it is the oracle, not a fast path.
    """
    dev = target_logits.device
    rows, vocab = target_logits.shape
    batch = cu_num_draft_tokens.numel()
    num_draft = draft_token_ids.numel()
    max_draft = output_token_ids.shape[1] - 1
    ninf = float("-inf")

    row_seq, is_bonus, row_draft = row_layout(cu_num_draft_tokens.to(dev), num_draft)
    if temperature is None:
        sampling = torch.zeros(batch, dtype=torch.bool, device=dev)
        inv_t = torch.ones(batch, dtype=torch.float32, device=dev)
    else:
        sampling, inv_t = inverse_temperature(temperature.to(dev))
    v, allowed = _scaled(target_logits, bitmask, inv_t[row_seq])
    bad = (allowed & (torch.isnan(v) | torch.isposinf(v))).any(1)
    if top_p_threshold is not None:
        allowed = allowed & (v >= top_p_threshold[:, None])
    vm = torch.where(allowed & ~torch.isnan(v), v, ninf)            # [R, V] viable scaled logits
    del v, allowed
    row_max = vm.amax(1)                                              # [R]
    row_arg = _race(vm)                                               # [R] greedy argmax (or -1)
    invalid = bad | (row_max == ninf)

    drafts = draft_token_ids.to(device=dev, dtype=torch.int64)
    row_x = torch.where(row_draft >= 0, drafts[row_draft.clamp_min(0)] if num_draft else row_draft,
                        -1)                                           # [R] draft token of the row
    x_in = (row_x >= 0) & (row_x < vocab)
    samp_row = sampling[row_seq]
    safe_max = torch.where(row_max > ninf, row_max, 0.0)
    accept_s = torch.zeros(rows, dtype=torch.bool, device=dev)
    race_win = torch.full((rows,), -1, dtype=torch.int64, device=dev)
    z = torch.ones(rows, dtype=torch.float64, device=dev)
    seeds = None
    if bool(samp_row.any()):
        assert uniforms is not None
        seeds = race_seeds(uniforms[:, 1].to(dev))
        # Z for the acceptance test of sampling draft rows
        need_z = torch.nonzero(samp_row & ~is_bonus).flatten()
        for chunk in need_z.split(64):
            w = torch.exp(vm[chunk] - safe_max[chunk, None])
            z[chunk] = w.sum(1, dtype=torch.float64)
        vx = torch.gather(vm, 1, torch.where(x_in, row_x, 0)[:, None]).flatten()
        w_x = torch.exp(vx - safe_max).to(torch.float64)
        p_x = torch.where(x_in, w_x / z, 0.0)
        if draft_probs is None or num_draft == 0:   # (no draft rows: q is never read)
            q_x = torch.ones(rows, dtype=torch.float64, device=dev)
        else:
            q_x = torch.where(
                x_in,
                draft_probs[row_draft.clamp_min(0), torch.where(x_in, row_x, 0)].to(torch.float64),
                0.0)
        accept_s = uniforms[:, 0].to(dev) * q_x < p_x
        # races run by the single pass: bonus rows over p; deterministic-draft rows over p
        # without the draft token (the recovered token on rejection)
        race_rows = samp_row & (is_bonus if draft_probs is not None else torch.ones_like(is_bonus))
        idx = torch.nonzero(race_rows).flatten()
        for chunk in idx.split(32):
            keys = vm[chunk] + gumbel_noise(seeds[chunk], vocab)
            excl = row_x[chunk]
            hit = torch.nonzero((excl >= 0) & (excl < vocab)).flatten()
            keys[hit, excl[hit]] = ninf
            race_win[chunk] = _race(keys)

    # the accept / reject chain, per sequence (small per-row vectors on the host)
    cu_l = cu_num_draft_tokens.tolist()
    samp_l = sampling.tolist()
    inv_l, arg_l, x_l = invalid.tolist(), row_arg.tolist(), row_x.tolist()
    acc_s_l, win_l = accept_s.tolist(), race_win.tolist()
    out_rows: list[list[int]] = []
    acc_out: list[int] = []
    err_out: list[int] = []
    pending: list[tuple[int, int, int]] = []  # (sequence, row, output slot) for the residual draw
    start = 0
    for b in range(batch):
        end = int(cu_l[b])
        n = end - start
        row0 = start + b
        toks = [-1] * (max_draft + 1)
        acc, err = -1, -1
        if n > max_draft:
            err = max_draft + 1
        else:
            for i in range(n + 1):
                r = row0 + i
                if inv_l[r]:
                    err = i
                    break
                if i == n:
                    toks[i] = win_l[r] if samp_l[b] else arg_l[r]
                    acc = n
                    break
                x = x_l[r]
                ok = acc_s_l[r] if samp_l[b] else x == arg_l[r]
                if ok:
                    toks[i] = x
                    continue
                acc = i
                if not samp_l[b]:
                    toks[i] = arg_l[r]
                elif draft_probs is None:
                    toks[i] = win_l[r]
                else:
                    pending.append((b, r, i))
                break
        if err >= 0:
            acc = -1
            toks = [-1] * (max_draft + 1)
        out_rows.append(toks)
        acc_out.append(acc)
        err_out.append(err)
        start = end

    if pending:
        assert draft_probs is not None and seeds is not None
        rr = torch.tensor([r for _, r, _ in pending], dtype=torch.int64, device=dev)
        p = torch.exp(vm[rr] - safe_max[rr, None]) / z[rr].to(torch.float32)[:, None]
        res = p - draft_probs[row_draft[rr]].to(torch.float32)
        g = gumbel_noise(seeds[rr], vocab)
        viable = vm[rr] > ninf
        rkey = torch.where(viable & (res > 0), torch.log(torch.where(res > 0, res, 1.0)) + g, ninf)
        rwin = _race(rkey)
        pwin = _race(vm[rr] + g)
        drawn = torch.where(rwin >= 0, rwin, pwin).tolist()
        for (b, _, i), tok in zip(pending, drawn):
            out_rows[b][i] = tok

    output_token_ids.copy_(torch.tensor(out_rows, dtype=torch.int32).reshape(batch, max_draft + 1))
    acc_t = torch.tensor(acc_out, dtype=torch.int32)
    num_accepted.copy_(acc_t)
    num_emitted.copy_(torch.where(acc_t >= 0, acc_t + 1, 0))
    error_position.copy_(torch.tensor(err_out, dtype=torch.int32))
