"""Verify one speculative step: grammar masks + target logits in, accepted counts and tokens out.

Pure tensor maths; knows nothing of grammars. One contract (:func:`verify`), two backends:
the torch reference ``structgen.kernels.torch_ref`` (the oracle, and the CPU path) and the fused
Triton kernels ``structgen.kernels.triton_verify``, imported only when chosen.

Terms follow the speculative-sampling papers and vLLM's rejection sampler: a draft token is
*accepted* or rejected; at the first rejection the *recovered* token is emitted in its place;
when every draft of a sequence is accepted the *bonus* token is drawn from the row after the
last draft. Each sequence therefore emits ``num_accepted + 1`` tokens.

Layout (``B`` sequences, ``N`` draft tokens in all, ``R = N + B`` logit rows, vocabulary ``V``)::

    draft_token_ids      int32|int64 [N]            drafts of all sequences, flattened
    cu_num_draft_tokens  int32|int64 [B]            INCLUSIVE cumulative draft counts: sequence b
                                                    owns drafts [cu[b-1], cu[b]) (cu[-1] = 0)
    target_logits        fp32|fp16|bf16 [R, V]      sequence b's rows are cu[b-1] + b .. cu[b] + b:
                                                    one per draft position, then its bonus row
    bitmask              int32 [R, >= ceil(V/32)]   bit j of word w allows token 32*w + j
    draft_probs          float [N, V]               the distributions the drafts were sampled from
    temperature, top_p   fp32 [B]
    uniforms             float64 [R, 2]             column 0: acceptance draw of a draft row;
                                                    column 1: seed of the row's token draw
    -> output_token_ids  int32 [B, max_draft + 1]   accepted drafts, then the recovered / bonus
                                                    token; -1 after it
       num_accepted      int32 [B]                  drafts accepted (-1: the sequence failed)
       num_emitted       int32 [B]                  num_accepted + 1 (0: the sequence failed)
       error_position    int32 [B]                  -1, or the position of the row that failed

The exact semantics (masking, greedy ties, the acceptance test, the exponential-race draws
and how the uniforms feed them, top-p) are written once, in the docstring of
``structgen/kernels/torch_ref.py``. Given the same uniforms both backends emit the same tokens (greedy:
always; sampling: barring float rounding at a decision boundary, which the GPU's fast exp/log
make a ~1e-6-probability event per draw; in the CPU interpreter the tests see none).

Also here: :class:`VerifyBufferPool` (buffers allocated once per shape and reused across
steps), and for CUDA the overlap helpers :func:`upload_async` and :class:`SideStream` (the CPU
builds the next masks while the GPU runs the target forward).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Union

from structgen.errors import VerifyError

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: ``uniforms=`` of :func:`verify`: float64 ``[N + B, 2]`` draws, a generator or a seed to draw
#: them with, or None (fresh draws)
Uniforms = Union["torch.Tensor", "torch.Generator", int, None]

__all__ = [
    "MAX_DRAFT",
    "VerifyOutput",
    "VerifyBuffers",
    "VerifyBufferPool",
    "verify",
    "resolve_backend",
    "load_kernels",
    "upload_async",
    "pinned_empty",
    "SideStream",
    "token_logprobs",
]

# Longest draft one sequence may carry (kernels never specialise on draft lengths). Must equal
# structgen/kernels/torch_ref.MAX_DRAFT (a test pins it); kept literal so importing this module stays light.
MAX_DRAFT = 127

_KERNELS_PKG = "structgen.kernels"
_BACKENDS = ("auto", "torch", "triton")



# ---------------------------------------------------------------------------------------------
# kernel modules (the subpackage structgen.kernels, imported on first use)

def load_kernels(name: str) -> ModuleType:
    """Import ``structgen.kernels.<name>`` (``"torch_ref"`` or ``"triton_verify"``) lazily, so
    that ``import structgen.generation.verify`` does not import the kernels (nor triton) until a backend is
    used."""
    return importlib.import_module(f"{_KERNELS_PKG}.{name}")


def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_backend(backend: str, device: torch.device) -> str:
    """``"auto"`` -> ``"triton"`` for CUDA tensors when triton is importable, else ``"torch"``."""
    if backend not in _BACKENDS:
        raise ValueError(f"verify: backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and _triton_importable() else "torch"
    return backend


# ---------------------------------------------------------------------------------------------
# outputs and buffers

@dataclass(frozen=True)
class VerifyOutput:
    """Result of :func:`verify` (tensors on the logits' device; shapes in the module doc)."""

    output_token_ids: torch.Tensor   # int32 [B, max_draft + 1]
    num_accepted: torch.Tensor       # int32 [B]
    num_emitted: torch.Tensor        # int32 [B]
    error_position: torch.Tensor     # int32 [B]

    @classmethod
    def allocate(cls, batch: int, max_draft: int, device: torch.device | str = "cpu") -> VerifyOutput:
        """Fresh output tensors for ``batch`` sequences of at most ``max_draft`` drafts."""
        import torch

        i32 = torch.int32
        return cls(torch.full((batch, max_draft + 1), -1, dtype=i32, device=device),
                   torch.zeros(batch, dtype=i32, device=device),
                   torch.zeros(batch, dtype=i32, device=device),
                   torch.full((batch,), -1, dtype=i32, device=device))

    def errors(self) -> list[tuple[int, int]]:
        """``(sequence, position)`` of every failed sequence (synchronises with the device)."""
        return [(b, int(p)) for b, p in enumerate(self.error_position.tolist()) if p >= 0]

    def raise_on_error(self) -> None:
        """Raise :class:`~structgen.errors.VerifyError` for the first failed sequence, if any
        (synchronises)."""
        errs = self.errors()
        if errs:
            b, pos = errs[0]
            raise VerifyError(f"verify: sequence {b} failed at row position {pos} (no viable token, "
                              f"non-finite allowed logits, or a draft longer than the output); "
                              f"{len(errs)} sequence(s) failed", sequence=b, position=pos)

    def tokens(self, b: int) -> list[int]:
        """The tokens sequence ``b`` emits (empty when it failed; synchronises)."""
        n = int(self.num_emitted[b])
        return [int(t) for t in self.output_token_ids[b, :n].tolist()]


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A host tensor in page-locked memory when CUDA is available (so uploads from it can be
    asynchronous), ordinary host memory otherwise."""
    import torch

    return torch.empty(shape, dtype=dtype, pin_memory=torch.cuda.is_available())


def upload_async(host: torch.Tensor, device_tensor: torch.Tensor,
                 stream: torch.cuda.Stream | None = None) -> torch.cuda.Event | None:
    """Copy ``host`` into ``device_tensor`` (same shape) without blocking the CPU.

    On CUDA the copy is queued on ``stream`` (default: the current stream) as a non-blocking
    copy; it is truly asynchronous only from pinned memory (:func:`pinned_empty`). Returns an
    event recorded after the copy: the consumer stream must ``wait_event`` it, and ``host``
    must not be rewritten before it completes. On CPU this is a plain copy returning None.
    """
    if device_tensor.device.type != "cuda":
        device_tensor.copy_(host)
        return None
    import torch

    s = stream if stream is not None else torch.cuda.current_stream(device_tensor.device)
    with torch.cuda.stream(s):
        device_tensor.copy_(host, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(s)
    return ev


class SideStream:
    """A CUDA side stream for work that overlaps the main stream (mask uploads, drafting).

    ``with side.launch(): ...`` queues the block's CUDA work on the side stream and records an
    event after it; ``side.join()`` makes the current stream wait for that event (no CPU
    blocking). On a CPU device every method is a no-op, so callers need no branches.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        import torch

        dev = torch.device(device) if device is not None else (
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        self.device = dev
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        self._event: torch.cuda.Event | None = None

    @contextmanager
    def launch(self) -> Iterator[torch.cuda.Stream | None]:
        """Context manager: CUDA work queued inside it goes to the side stream (yielded; None
        on a CPU device), and an event recorded after it is what :meth:`join` waits for."""
        if self.stream is None:
            yield None
            return
        import torch

        with torch.cuda.stream(self.stream):
            yield self.stream
            self._event = torch.cuda.Event()
            self._event.record(self.stream)

    def join(self) -> None:
        """Make the current stream wait for the work last launched on the side stream."""
        if self.stream is not None and self._event is not None:
            import torch

            torch.cuda.current_stream(self.device).wait_event(self._event)

    def synchronize(self) -> None:
        """Block the CPU until the side stream's work is done."""
        if self.stream is not None:
            self.stream.synchronize()


@dataclass
class VerifyBuffers:
    """Buffers for one ``(batch, max_draft, vocab_size, dtype, device)`` shape, reused every step.

    ``logits`` ``[batch * (max_draft + 1), V]`` and ``bitmask`` ``[same rows, ceil(V/32)]`` hold
    up to that many rows; :meth:`rows` gives views of the first ``R``. ``bitmask_host`` is the
    pinned host copy the CPU fills (the device buffer itself on a CPU device). ``out`` receives
    the results and ``workspace`` the Triton kernels' scratch (``[rows, MAX_SPLITS]`` partials).
    """

    batch: int
    max_draft: int
    vocab_size: int
    dtype: torch.dtype
    device: torch.device
    logits: torch.Tensor | None
    bitmask: torch.Tensor
    bitmask_host: torch.Tensor
    draft_token_ids: torch.Tensor
    cu_num_draft_tokens: torch.Tensor
    uniforms: torch.Tensor
    out: VerifyOutput
    workspace: dict[str, torch.Tensor] = field(default_factory=dict)

    def rows(self, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``(logits[:num_rows], bitmask[:num_rows])`` (no allocation)."""
        if self.logits is None:
            raise ValueError("these buffers were allocated without a logits buffer (logits=False)")
        if not 0 < num_rows <= self.logits.shape[0]:
            raise ValueError(f"num_rows must be in 1..{self.logits.shape[0]}, got {num_rows}")
        return self.logits[:num_rows], self.bitmask[:num_rows]

    def upload_bitmask(self, num_rows: int,
                       stream: torch.cuda.Stream | None = None) -> torch.cuda.Event | None:
        """Queue the copy of ``bitmask_host[:num_rows]`` to the device (see :func:`upload_async`)."""
        if self.bitmask_host is self.bitmask:
            return None
        return upload_async(self.bitmask_host[:num_rows], self.bitmask[:num_rows], stream)


class VerifyBufferPool:
    """Verify buffers allocated once per ``(batch, max_draft, vocab_size, dtype, device)`` and reused.

    ``vocab_allocations`` counts the vocabulary-sized tensors allocated so far (logits, device
    and host bitmask: three per new shape); a generation loop that reuses its shapes keeps it
    constant. ``allocations`` counts every tensor allocated.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[object, ...], VerifyBuffers] = {}
        self.vocab_allocations = 0
        self.allocations = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, batch: int, max_draft: int, vocab_size: int, dtype: torch.dtype,
            device: torch.device | str, *, logits: bool = True) -> VerifyBuffers:
        """The buffers of that shape, allocated on first request. ``logits=False``: no logits
        buffer (a caller that passes the model's own logits tensor; ``buffers.logits`` is None)."""
        import torch

        if batch < 1 or vocab_size < 1:
            raise ValueError("batch and vocab_size must be >= 1")
        if not 0 <= max_draft <= MAX_DRAFT:
            raise ValueError(f"max_draft must be in 0..{MAX_DRAFT}, got {max_draft}")
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        key = (batch, max_draft, vocab_size, dtype, str(dev), logits)
        buf = self._entries.get(key)
        if buf is not None:
            return buf
        rows = batch * (max_draft + 1)
        words = (vocab_size + 31) // 32
        logit_buf = torch.empty((rows, vocab_size), dtype=dtype, device=dev) if logits else None
        bitmask = torch.zeros((rows, words), dtype=torch.int32, device=dev)
        self.vocab_allocations += 2 if logits else 1
        if dev.type == "cuda":
            host = pinned_empty((rows, words), torch.int32)
            self.vocab_allocations += 1
        else:
            host = bitmask
        buf = VerifyBuffers(
            batch=batch, max_draft=max_draft, vocab_size=vocab_size, dtype=dtype, device=dev,
            logits=logit_buf, bitmask=bitmask, bitmask_host=host,
            draft_token_ids=torch.zeros(max(1, batch * max_draft), dtype=torch.int32, device=dev),
            cu_num_draft_tokens=torch.zeros(batch, dtype=torch.int32, device=dev),
            uniforms=torch.zeros((rows, 2), dtype=torch.float64, device=dev),
            out=VerifyOutput.allocate(batch, max_draft, dev),
        )
        self.allocations += 6 + int(logits) + 4 + (1 if host is not bitmask else 0)
        self._entries[key] = buf
        return buf

    def clear(self) -> None:
        """Drop every buffer (counters keep their totals)."""
        self._entries.clear()


# ---------------------------------------------------------------------------------------------
# the contract

def _bad(name: str, message: str) -> ValueError:
    return ValueError(f"verify: {name}: {message}")


def _check_tensor(t: object, name: str, ndim: int, dtypes: tuple[torch.dtype, ...],
                  device: torch.device | None) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise _bad(name, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise _bad(name, f"expected {ndim} dimension(s), got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise _bad(name, f"dtype {t.dtype} not in {[str(d) for d in dtypes]}")
    if device is not None and t.device != device:
        raise _bad(name, f"on {t.device}, but target_logits is on {device}")


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` contiguous on ``device`` (a copy only when needed; non-blocking from pinned memory)."""
    if t.device != device:
        t = t.to(device, non_blocking=True)
    return t.contiguous()


def _resolve_uniforms(uniforms: Uniforms, rows: int, device: torch.device) -> torch.Tensor:
    import torch

    f64 = torch.float64
    if isinstance(uniforms, torch.Tensor):
        _check_tensor(uniforms, "uniforms", 2, (f64,), None)
        if uniforms.shape != (rows, 2):
            raise _bad("uniforms", f"expected shape ({rows}, 2) (two float64 draws per logit row), "
                                   f"got {tuple(uniforms.shape)}")
        return _on(uniforms, device)
    if isinstance(uniforms, torch.Generator):
        return torch.rand((rows, 2), dtype=f64, generator=uniforms,
                          device=uniforms.device).to(device)
    if isinstance(uniforms, int) and not isinstance(uniforms, bool):
        g = torch.Generator().manual_seed(uniforms)  # drawn on the CPU: same draws on every device
        return torch.rand((rows, 2), dtype=f64, generator=g).to(device)
    if uniforms is None:
        return torch.rand((rows, 2), dtype=f64, device=device)
    raise _bad("uniforms", f"expected a float64 tensor, a torch.Generator, an int seed or None, "
                           f"got {type(uniforms).__name__}")


def verify(
    draft_token_ids: torch.Tensor,        # int32|int64 [N]
    cu_num_draft_tokens: torch.Tensor,    # int32|int64 [B]  inclusive cumulative draft counts
    target_logits: torch.Tensor,          # fp32|fp16|bf16 [N + B, V]
    bitmask: torch.Tensor | None,         # int32 [N + B, >= ceil(V/32)] or None (no grammar)
    draft_probs: torch.Tensor | None = None,   # float [N, V] or None: deterministic proposals
    temperature: torch.Tensor | None = None,   # fp32 [B]; < 1e-5 (0) -> greedy; None -> all greedy
    top_p: torch.Tensor | None = None,         # fp32 [B] in (0, 1] or None
    uniforms: Uniforms = None,            # float64 [N + B, 2] | torch.Generator | int seed | None
    *,
    backend: str = "auto",
    out: VerifyOutput | None = None,
    buffers: VerifyBuffers | None = None,
    max_draft: int | None = None,
    check_inputs: bool = True,
    workspace: dict[str, torch.Tensor] | None = None,
) -> VerifyOutput:
    """Verify the drafts of ``B`` sequences against the target logits in one step.

    Per sequence: accept drafts while the target agrees (greedy: the masked argmax equals the
    draft; sampling: ``u0 * q(x) < p(x)``), then emit the recovered token at the first
    rejection or the bonus token after the last draft. ``p`` is the masked, temperature-scaled
    (and top-p filtered) target distribution; masked tokens have probability exactly 0 and are
    never emitted. Semantics in full: ``structgen/kernels/torch_ref.py``.

    ``uniforms``: two float64 draws per logit row (shape ``[N + B, 2]``), or a generator / an
    int seed to draw them from (a seed draws on the CPU, so it gives the same tokens on every
    device), or None for the global RNG; unused (and not drawn) when every sequence is greedy.

    Outputs go to ``out`` (a :class:`VerifyOutput` of shape ``[B, max_draft + 1]``), to
    ``buffers.out`` (and the kernel scratch to ``buffers.workspace``) when ``buffers`` from a
    :class:`VerifyBufferPool` is given, else to new tensors; ``workspace`` (a dict, e.g. a
    ``VerifyBuffers.workspace``) keeps the Triton kernels' scratch across calls when ``out`` is
    given instead of ``buffers``. A sequence whose reached rows
    include one without a viable token (or with NaN/+inf allowed logits) gets
    ``num_accepted = -1``, ``num_emitted = 0``, its output row all -1 and ``error_position``
    set; :meth:`VerifyOutput.raise_on_error` turns that into :class:`~structgen.errors.VerifyError`.

    ``max_draft`` (the output width - 1) defaults to the out/buffers width, else the longest
    draft (read from ``cu_num_draft_tokens``: one host synchronisation). ``check_inputs``
    validates values too (cumulative counts, draft ids in ``[0, V)``, temperature, top-p and
    uniforms ranges; synchronises); shapes, dtypes and devices are always checked, raising
    ``ValueError``. With ``check_inputs=False`` an out-of-range draft is simply rejected.

    ``backend``: ``"torch"`` (reference), ``"triton"`` (CUDA tensors, or CPU tensors with
    ``TRITON_INTERPRET=1``), ``"auto"`` (Triton for CUDA tensors when triton is importable).

    Every input that is not on ``target_logits``' device is copied there (blocking unless it is
    in pinned memory): convenient for small per-sequence tensors; for the bitmask prefer
    :meth:`VerifyBuffers.upload_bitmask`, which overlaps the copy with the target forward.
    """
    import torch

    f32, f16, bf16, f64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
    ints = (torch.int32, torch.int64)
    _check_tensor(target_logits, "target_logits", 2, (f32, f16, bf16), None)
    dev = target_logits.device
    rows, vocab = target_logits.shape
    _check_tensor(draft_token_ids, "draft_token_ids", 1, ints, None)
    _check_tensor(cu_num_draft_tokens, "cu_num_draft_tokens", 1, ints, None)
    draft_token_ids = _on(draft_token_ids, dev)
    cu_num_draft_tokens = _on(cu_num_draft_tokens, dev)
    batch = cu_num_draft_tokens.numel()
    num_draft = draft_token_ids.numel()
    if batch < 1:
        raise _bad("cu_num_draft_tokens", "needs at least one sequence")
    if vocab < 1:
        raise _bad("target_logits", "empty vocabulary")
    if rows != num_draft + batch:
        raise _bad("target_logits", f"expected {num_draft} + {batch} = {num_draft + batch} rows "
                                    f"(one per draft token plus one bonus row per sequence), got {rows}")
    if bitmask is not None:
        _check_tensor(bitmask, "bitmask", 2, (torch.int32,), None)
        need = (vocab + 31) // 32
        if bitmask.shape[0] != rows or bitmask.shape[1] < need:
            raise _bad("bitmask", f"expected shape ({rows}, >= {need}), got {tuple(bitmask.shape)}")
        bitmask = _on(bitmask, dev)
    if draft_probs is not None:
        _check_tensor(draft_probs, "draft_probs", 2, (f32, f16, bf16, f64), None)
        draft_probs = draft_probs.to(dev, non_blocking=True)
        if tuple(draft_probs.shape) != (num_draft, vocab):
            raise _bad("draft_probs", f"expected shape ({num_draft}, {vocab}), "
                                      f"got {tuple(draft_probs.shape)}")
    if temperature is not None:
        _check_tensor(temperature, "temperature", 1, (f32, f16, bf16, f64), None)
        if temperature.numel() != batch:
            raise _bad("temperature", f"expected {batch} values, got {temperature.numel()}")
        temperature = _on(temperature.to(f32), dev)
    if top_p is not None:
        _check_tensor(top_p, "top_p", 1, (f32, f16, bf16, f64), None)
        top_p = top_p.to(dev)
        if top_p.numel() != batch:
            raise _bad("top_p", f"expected {batch} values, got {top_p.numel()}")
    name = resolve_backend(backend, dev)
    if name == "triton" and not _triton_importable():
        raise ValueError("verify: backend='triton' but triton is not installed (pip install triton)")

    if buffers is not None:
        out = buffers.out
    if out is not None:
        width = out.output_token_ids.shape[1] if out.output_token_ids.dim() == 2 else -1
        for fname, t, shape in (("output_token_ids", out.output_token_ids, (batch, width)),
                                ("num_accepted", out.num_accepted, (batch,)),
                                ("num_emitted", out.num_emitted, (batch,)),
                                ("error_position", out.error_position, (batch,))):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != torch.int32 \
                    or t.device != dev or not t.is_contiguous():
                raise _bad(f"out.{fname}", f"expected a contiguous int32 tensor of shape {shape} on {dev}")
        if width < 1:
            raise _bad("out.output_token_ids", "needs at least one column")
        if max_draft is not None and max_draft != width - 1:
            raise _bad("max_draft", f"{max_draft} does not match the output width {width}")
        max_draft = width - 1

    counts: list[int] | None = None
    if check_inputs or max_draft is None:
        cu_l = [int(c) for c in cu_num_draft_tokens.tolist()]
        counts = [c - p for c, p in zip(cu_l, [0] + cu_l[:-1])]
        if check_inputs:
            if min(counts) < 0:
                raise _bad("cu_num_draft_tokens", f"must be non-decreasing from >= 0, got {cu_l[:16]}")
            if cu_l[-1] != num_draft:
                raise _bad("cu_num_draft_tokens", f"last entry {cu_l[-1]} != number of drafts {num_draft}")
        if max_draft is None:
            max_draft = max(counts)
    assert max_draft is not None
    if not 0 <= max_draft <= MAX_DRAFT:
        raise _bad("max_draft", f"drafts of up to {MAX_DRAFT} tokens per sequence are supported, "
                                f"got {max_draft}")
    if check_inputs:
        assert counts is not None
        if max(counts) > max_draft:
            raise _bad("cu_num_draft_tokens", f"a sequence has {max(counts)} drafts, more than "
                                              f"max_draft={max_draft}")
        if num_draft and not bool(((draft_token_ids >= 0) & (draft_token_ids < vocab)).all()):
            raise _bad("draft_token_ids", f"ids must be in [0, {vocab})")
        if temperature is not None and not bool((torch.isfinite(temperature) & (temperature >= 0)).all()):
            raise _bad("temperature", "values must be finite and >= 0")
        if top_p is not None and not bool(((top_p > 0) & (top_p <= 1)).all()):
            raise _bad("top_p", "values must be in (0, 1]")

    sampling = temperature is not None
    unif = None
    thr = None
    if sampling:
        unif = _resolve_uniforms(uniforms, rows, dev)
        if check_inputs and isinstance(uniforms, torch.Tensor) and \
                not bool(((unif >= 0) & (unif < 1)).all()):
            raise _bad("uniforms", "values must be in [0, 1)")
        if top_p is not None:
            ref = load_kernels("torch_ref")
            thr = ref.top_p_thresholds(target_logits, bitmask, cu_num_draft_tokens, temperature, top_p)
    else:
        draft_probs = None  # greedy verification ignores draft probabilities

    if out is None:
        out = VerifyOutput.allocate(batch, max_draft, dev)
    if name == "torch" and not sampling and dev.type == "cpu":
        load_kernels("greedy_cpu").verify_greedy(
            draft_token_ids, cu_num_draft_tokens, target_logits, bitmask, out.output_token_ids,
            out.num_accepted, out.num_emitted, out.error_position)
    elif name == "torch":
        load_kernels("torch_ref").verify_reference(
            draft_token_ids, cu_num_draft_tokens, target_logits, bitmask, draft_probs, temperature,
            thr, unif, out.output_token_ids, out.num_accepted, out.num_emitted, out.error_position)
    else:
        load_kernels("triton_verify").verify_triton(
            draft_token_ids, cu_num_draft_tokens, target_logits, bitmask, draft_probs, temperature,
            thr, unif, out.output_token_ids, out.num_accepted, out.num_emitted, out.error_position,
            workspace=buffers.workspace if buffers is not None else workspace)
    return out


def token_logprobs(target_logits: torch.Tensor, bitmask: torch.Tensor, tokens: list[int], *,
                   temperature: float, top_p: float = 1.0, top: int = 0
                   ) -> list[tuple[float, list[tuple[int, float]]]]:
    """Log-probabilities of the tokens one sequence emitted, in the distributions :func:`verify`
    draws them from: per row ``i`` of ``target_logits`` ``[n, V]`` (``n = len(tokens)``: the
    sequence's rows, the accepted draft positions then the recovered / bonus row) and its packed
    mask ``bitmask`` ``[n, >= ceil(V/32)]``, ``(logprob of tokens[i], the top`` most likely
    ``(token, logprob)`` pairs, most likely first)``.

    The distribution is verify's ``p`` (``structgen/kernels/torch_ref.py``): the scaled logits
    ``v = float32(logit) * float32(1 / T)``, masked, restricted to the top-p nucleus when
    sampling with ``top_p < 1`` (the same thresholds verify uses), log-softmaxed. A greedy row
    (``T`` below ``GREEDY_TEMPERATURE``, 0 included) is reported at temperature 1. Tokens the
    mask or top-p rule out never appear among the top ones (a row may list fewer than ``top``).
    Runs on the logits' device; one host transfer for the whole sequence."""
    import torch

    ref = load_kernels("torch_ref")
    n = len(tokens)
    if n == 0:
        return []
    rows = target_logits[:n]                                                      # [n, V]
    vocab = rows.shape[1]
    dev = rows.device
    temp = torch.tensor([temperature], dtype=torch.float32, device=dev)           # [1]
    sampling, inv_t = ref.inverse_temperature(temp)
    v = rows.to(torch.float32) * inv_t                                            # [n, V]
    allowed = ref.unpack_bitmask(bitmask[:n], vocab)                               # [n, V]
    if bool(sampling[0]) and top_p < 1.0:
        cu = torch.tensor([n - 1], dtype=torch.int64, device=dev)                 # one sequence
        thr = ref.top_p_thresholds(rows, bitmask[:n], cu, temp,
                                   torch.tensor([top_p], dtype=torch.float32, device=dev))  # [n]
        allowed &= v >= thr[:, None]
    lp = torch.log_softmax(v.masked_fill(~allowed, float("-inf")), dim=-1)       # [n, V]
    ids = torch.tensor(tokens, dtype=torch.int64, device=dev)
    chosen = lp.gather(1, ids[:, None])[:, 0].tolist()                           # [n]
    if top <= 0:
        return [(float(c), []) for c in chosen]
    best, where = torch.topk(lp, min(top, vocab), dim=-1)                        # [n, top] each
    out = []
    for c, bl, wl in zip(chosen, best.tolist(), where.tolist()):
        out.append((float(c), [(int(w), float(b)) for b, w in zip(bl, wl) if b > float("-inf")]))
    return out
