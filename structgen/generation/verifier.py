"""The verify half of a step: a sequence's :class:`StepPlan` up to the target forward, the draft
cut of a batched step (:func:`cut_drafts`), and :class:`StepVerifier`, which fills the plans'
masks into pooled buffers while the forward runs and verifies every plan in ONE call of
:func:`structgen.generation.verify.verify`. The sequences themselves are
:class:`structgen.generation.step.Sequence`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from structgen.config import SpecConfig
from structgen.generation import verify as verification
from structgen.generation.drafters import Candidate
from structgen.generation.pacing import StepCost, best_draft_length, expected_accepts
from structgen.generation.verify import VerifyBufferPool, VerifyOutput, token_logprobs

if TYPE_CHECKING:
    from structgen.generation.step import Sequence

__all__ = ["StepPlan", "StepVerifier", "cut_drafts", "overlap_masks_enabled"]


@dataclass
class StepPlan:
    """One sequence's step up to the target forward (see :meth:`Sequence.prepare`): the
    pre-validated draft, the candidate it came from, the sequence's uniforms for verification,
    its remaining budget and, once :meth:`Sequence.fill_masks` ran, its mask rows."""

    draft: list[int]            # pre-validated draft tokens (k)
    cand: Candidate | None      # the candidate they came from (drafter segments, probs)
    uniforms: torch.Tensor      # float64 [k+1, 2]: the sequence's own draws for verification
    budget: int                 # tokens the sequence may still emit
    narrowed: list[bool] = field(default_factory=list)  # per mask row: the budget rule removed a token
    bitmask: torch.Tensor | None = None  # int32 [k+1, W]: one mask per draft position plus the
                                         # bonus row (rows of the step's pooled host buffer)
    # per emitted token (sequences recording logprobs only): (logprob, [(token, logprob)] top)
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None

    def truncate(self, k: int) -> None:
        """Keep the first ``k`` draft tokens (and their uniforms; the candidate cut alike)."""
        self.draft = self.draft[:k]
        self.uniforms = self.uniforms[: k + 1]
        c = self.cand
        if c is None:
            return
        c.truncate(k)
        if not k:
            self.cand = None


_MASK_WORKER: ThreadPoolExecutor | None = None
_MASK_WORKER_LOCK = threading.Lock()



def _mask_worker() -> ThreadPoolExecutor:
    """One process-wide worker thread that fills masks while the main thread runs a CPU forward
    (torch's CPU kernels and the compiled mask walks release the GIL)."""
    global _MASK_WORKER
    with _MASK_WORKER_LOCK:
        if _MASK_WORKER is None:
            _MASK_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="structgen-masks")
        return _MASK_WORKER


def overlap_masks_enabled(cfg: SpecConfig, device: torch.device | str) -> bool:
    """Whether a step builds its masks while the target forward runs (``SpecConfig.overlap_masks``;
    None = on for CUDA only: on the CPU the masks are a small part of a step and the hand-off to
    the worker thread gains nothing; see ``benchmarks/results/overlap-*.json``)."""
    if cfg.overlap_masks is not None:
        return bool(cfg.overlap_masks)
    return torch.device(device).type == "cuda"


class StepVerifier:
    """The verify half of a generation loop's steps, over buffers allocated once per call.

    Holds a :class:`~structgen.generation.verify.VerifyBufferPool` entry for ``capacity`` sequences of up
    to ``max_draft_tokens`` drafts: the packed masks (filled in place by the sequences; pinned
    host memory uploaded with a non-blocking copy on CUDA), drafts, cumulative counts, uniforms,
    outputs and the Triton kernels' scratch, plus the temperatures / top-p values and, once a
    draft model proposes with probabilities, an ``[capacity * max_draft_tokens, V]`` float32
    block for them. A step only writes into these (views of their first rows): the loop itself
    allocates no vocabulary-sized tensor per step. The logits are the target model's own output
    tensor, passed as it is (its dtype: the kernels read bf16 / fp16 directly).
    """

    def __init__(self, cfg: SpecConfig, vocab_size: int, device: torch.device | str, capacity: int) -> None:
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.capacity = capacity
        self.max_draft = cfg.max_draft_tokens
        self.pool = VerifyBufferPool()
        self.buf = self.pool.get(capacity, self.max_draft, vocab_size, torch.float32, self.device,
                                 logits=False)
        # per-sequence sampling rows of the verify contract, fp32 [capacity] each: filled with
        # the call's values once; rewritten (one small host-to-device copy) only in a step
        # whose sequences bring other values (per-request temperature / top-p in a batch)
        f32 = torch.float32
        self.temperature = torch.full((capacity,), cfg.temperature, dtype=f32, device=self.device)
        self.top_p = torch.full((capacity,), cfg.top_p, dtype=f32, device=self.device)
        self._written: dict[str, list[float]] = {"temperature": [cfg.temperature] * capacity,
                                                 "top_p": [cfg.top_p] * capacity}
        self._dprobs: torch.Tensor | None = None   # float32 [capacity * max_draft, V], on first use
        self.overlap = overlap_masks_enabled(cfg, self.device)

    def mask_rows(self, plans: list[StepPlan]) -> list[torch.Tensor]:
        """Each plan's ``[k+1, W]`` rows of the pooled host bitmask, in batch order."""
        views = []
        row = 0
        host = self.buf.bitmask_host
        for p in plans:
            n = len(p.draft) + 1
            views.append(host[row: row + n])
            row += n
        return views

    def forward_with_masks(self, forward: Callable[[], torch.Tensor], seqs: list[Sequence],
                           plans: list[StepPlan]) -> tuple[torch.Tensor, float]:
        """Run the target ``forward`` and fill every plan's masks into the pooled rows; with
        overlap the masks are built while the forward runs (CUDA: after its kernels are queued;
        CPU: on the mask worker thread). Returns the logits and the seconds the forward call
        took (the masks' own time goes to each sequence's ``time_masks``)."""
        views = self.mask_rows(plans)

        def fill() -> None:
            for s, p, v in zip(seqs, plans, views):
                s.fill_masks(p, v)

        if not self.overlap:
            fill()
            t0 = time.perf_counter()
            return forward(), time.perf_counter() - t0
        if self.device.type == "cuda":
            t0 = time.perf_counter()
            logits = forward()          # queued on the GPU; the CPU returns at once
            dt = time.perf_counter() - t0
            fill()
            return logits, dt
        fut = _mask_worker().submit(fill)
        t0 = time.perf_counter()
        try:
            logits = forward()
            dt = time.perf_counter() - t0
        finally:
            fut.result()                # the masks (and any error raised while building them)
        return logits, dt

    def _rows(self, name: str, values: list[float]) -> torch.Tensor:
        """The first ``len(values)`` rows of the ``name`` buffer holding ``values`` (written
        only when they differ from what the buffer holds)."""
        buf: torch.Tensor = getattr(self, name)
        b = len(values)
        if self._written[name][:b] != values:
            buf[:b].copy_(torch.tensor(values, dtype=torch.float32))
            self._written[name][:b] = values
        return buf[:b]

    def _draft_prob_rows(self, n: int) -> torch.Tensor:
        if self._dprobs is None:
            self._dprobs = torch.zeros((self.capacity * self.max_draft, self.vocab_size),
                                       dtype=torch.float32, device=self.device)
            self.pool.vocab_allocations += 1
        return self._dprobs[:n]

    def run(self, seqs: list[Sequence], plans: list[StepPlan],
            logits: torch.Tensor) -> list[tuple[int, list[int]]]:
        """Verify the steps of several sequences in ONE call of :func:`structgen.generation.verify.verify`.

        ``logits`` ``[sum(k_b + 1), V]``: sequence ``b``'s rows are the target logits at its
        ``[pending] + draft`` positions, in batch order (the verify contract's flattened layout);
        its masks are in the pooled rows :meth:`forward_with_masks` filled. Each sequence brings
        its own masks and uniforms, so its verdict is the one it would get alone. Returns
        ``(num_accepted, emitted tokens)`` per sequence (after the opt-in lossy acceptance, when
        configured)."""
        cfg = self.cfg
        buf = self.buf
        b = len(plans)
        lens = [len(p.draft) for p in plans]
        n = sum(lens)
        rows = n + b
        cu: list[int] = []
        total = 0
        for k in lens:
            total += k
            cu.append(total)
        cu_t = buf.cu_num_draft_tokens[:b]
        cu_t.copy_(torch.tensor(cu, dtype=torch.int32))                              # [B]
        drafts = buf.draft_token_ids[:n]
        if n:
            drafts.copy_(torch.tensor([t for p in plans for t in p.draft], dtype=torch.int32))  # [N]
        bitmask = buf.bitmask[:rows]                                                   # [N+B, W]
        ev = buf.upload_bitmask(rows)
        if ev is not None:
            torch.cuda.current_stream(self.device).wait_event(ev)
        uniforms = None
        draft_probs = None
        temperature = top_p = None
        temps = [s.cfg.temperature for s in seqs]
        if any(t > 0 for t in temps):  # else every row is greedy: no sampling rows at all
            temperature = self._rows("temperature", temps)                            # [B]
            tops = [s.cfg.top_p for s in seqs]
            if any(t > 0 and q < 1 for t, q in zip(temps, tops)):
                top_p = self._rows("top_p", tops)                                      # [B]
            uniforms = buf.uniforms[:rows]                                             # [N+B, 2]
            row = 0
            for p in plans:
                uniforms[row: row + len(p.draft) + 1].copy_(p.uniforms)
                row += len(p.draft) + 1
            probs = [s.draft_probs(p.cand) for s, p in zip(seqs, plans)]
            if any(q is not None for q in probs):
                # a sequence without draft probabilities proposed deterministically: point masses
                draft_probs = self._draft_prob_rows(n)                                 # [N, V]
                row = 0
                for q, p in zip(probs, plans):
                    k = len(p.draft)
                    if not k:
                        continue
                    dst = draft_probs[row: row + k]
                    if q is None:
                        dst.zero_()
                        dst[torch.arange(k), torch.tensor(p.draft)] = 1.0
                    else:
                        w = min(int(q.shape[1]), self.vocab_size)
                        dst[:, :w].copy_(q[:k, :w])
                        if w < self.vocab_size:
                            dst[:, w:].zero_()
                    row += k
        full = buf.out
        out = VerifyOutput(full.output_token_ids[:b], full.num_accepted[:b], full.num_emitted[:b],
                           full.error_position[:b])
        # looked up on its module at each call, so that a wrapper installed there sees every step
        verification.verify(drafts, cu_t, logits, bitmask, draft_probs=draft_probs, temperature=temperature,
                            top_p=top_p, uniforms=uniforms, backend=cfg.backend, out=out,
                            workspace=buf.workspace, check_inputs=False)
        accepted = out.num_accepted.tolist()
        tokens = out.output_token_ids.tolist()
        results: list[tuple[int, list[int]]] = []
        row = 0
        for i, (s, p) in enumerate(zip(seqs, plans)):
            k = lens[i]
            n_acc = int(accepted[i])
            if n_acc < 0:
                raise RuntimeError(f"verification found a fully masked row (grammar dead end) in "
                                   f"sequence {i} of the batch")
            emitted = [int(t) for t in tokens[i][: n_acc + 1]]
            if cfg.verify_threshold is not None and k:
                n_acc, emitted = s.lossy_accept(p.draft, logits[row: row + k + 1], bitmask[row: row + k + 1],
                                          n_acc, emitted)
            if s.top_logprobs is not None:
                # emitted token j was drawn at the sequence's row j (a draft position, then the
                # recovered / bonus row): only a sequence that asked pays for this
                keep = emitted[: p.budget]
                p.logprobs = token_logprobs(logits[row: row + len(keep)], bitmask[row: row + len(keep)],
                                            keep, temperature=s.cfg.temperature, top_p=s.cfg.top_p,
                                            top=s.top_logprobs)
            results.append((n_acc, emitted))
            row += k + 1
        return results


def cut_drafts(plans: list[StepPlan], cost: StepCost) -> None:
    """Cut every draft to the common length that maximises expected tokens per unit of forward
    time (:func:`~structgen.generation.pacing.best_draft_length`; pre-validated prefixes stay
    valid, so this is lossless for greedy decoding and keeps sampling exact)."""
    top = max(len(p.draft) for p in plans)
    if top == 0:
        return
    best_k = best_draft_length([expected_accepts(p.cand, len(p.draft)) for p in plans], cost.pass_cost())
    if best_k >= top:
        return
    for p in plans:
        if len(p.draft) > best_k:
            p.truncate(best_k)
