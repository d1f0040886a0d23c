"""Model adapter: load a causal LM and run KV-cached forward passes that can roll back.

:class:`CausalLM` wraps a Hugging Face causal LM and its tokenizer. It keeps one
sequence's KV cache (a ``transformers.DynamicCache``); :meth:`CausalLM.extend` feeds new
tokens and returns their logits, :meth:`CausalLM.crop` drops rejected positions so that
the accepted prefix is never recomputed.

:class:`BatchKV` runs several sequences through one batched forward per step: a shared
left-padded ``DynamicCache`` whose rows may accept different numbers of tokens per step
(rejected positions stay behind as masked "holes"), explicit per-row position ids, and
rows that can be dropped when their sequence finishes.

Imports torch and transformers (only when this module is imported).
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, Union, cast

import torch

from structgen.assets.store import resolve_model
from structgen.errors import AssetError, ContextLengthError
from structgen.generation.llamacpp import LlamaCppLM, is_gguf_path, load_gguf
from structgen.generation.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from structgen.generation.rowinvariant import make_row_invariant, stock_copy
from structgen.masks.vocab import Vocabulary

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

#: what :func:`load_model` takes: a model alias or local path, a transformers model, or a
#: model already loaded
ModelSource: TypeAlias = Union[str, "os.PathLike[str]", "PreTrainedModel", "CausalLM", LlamaCppLM]

__all__ = ["BatchKV", "CausalLM", "ModelSource", "as_causal_lm", "check_context", "context_length",
           "load_model", "make_row_invariant", "resolve_dtype", "stock_copy", "vocabulary_for"]

_LOAD_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], tuple[PreTrainedModel, PreTrainedTokenizerBase]] = {}


def _cache_kwarg(model: torch.nn.Module) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# A transformers prefill runs in decodes of this many positions, aligned at multiples of it
# from position 0: matrix products of another number of rows round differently on the CPU, so
# a prompt prefilled on from a restored prefix (at such a boundary) computes exactly what a
# fresh prefill computes only when both split the prompt at the same places. 128 costs about
# 5% of a one-pass prefill on the CPU (64: 20%).
PREFILL_BLOCK = 128


#: a transformers prefix state: each layer's (keys, values)
KVState = list[tuple[torch.Tensor, torch.Tensor]]


def prefix_cache_of(model: torch.nn.Module) -> PrefixCache[KVState]:
    """The :class:`~structgen.generation.prefix_cache.PrefixCache` of a transformers model's
    weights (shared by every :class:`CausalLM` and :class:`BatchKV` on them)."""
    cache = getattr(model, "structgen_prefix_cache", None)
    if cache is None:
        with _LOAD_LOCK:
            cache = getattr(model, "structgen_prefix_cache", None)
            if cache is None:
                cache = PrefixCache[KVState](DEFAULT_PREFIX_CACHE_MB << 20, block=PREFILL_BLOCK)
                object.__setattr__(model, "structgen_prefix_cache", cache)
    return cache


def _cache_layers(cache: object) -> list[Any] | None:  # transformers' DynamicLayer: keys, values
    """A ``DynamicCache``'s per-layer holders, when every one is a plain, filled dynamic layer
    (None otherwise: a cache of another kind cannot be copied or assembled row by row)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return None
    return list(layers)


@torch.inference_mode()
def prefill_cache(model: torch.nn.Module, cache_kw: str, ids: list[int], prefix_cache: PrefixCache[KVState],
                  variant: Hashable, *, shared_prefix: int = 0, noted: bool = False,
                  logits_to_keep: bool = True) -> DynamicCache:
    """A ``DynamicCache`` holding ``ids`` prefilled by ``model`` (a causal LM, or its base model
    with ``logits_to_keep=False``): restored from ``prefix_cache`` up to the longest saved
    prefix, the rest run in aligned blocks of :data:`PREFILL_BLOCK` positions (the same blocks a
    fresh prefill runs, so the cache holds the same values), saving the prefixes the cache's
    :meth:`~structgen.generation.prefix_cache.PrefixCache.plan` names. ``variant``: what keeps
    states of other dtypes, thread counts or kernels apart."""
    from transformers import DynamicCache

    n = len(ids)
    cache = DynamicCache()
    start, cuts = 0, []
    use = prefix_cache.enabled and n >= prefix_cache.block

    def anywhere(length: int) -> bool:
        return True

    if use:
        length, state = prefix_cache.lookup(variant, ids, anywhere)
        if state is not None:
            for li, (k, v) in enumerate(state):
                cache.update(k, v, li)  # the next update concatenates: the saved tensors stay as they are
            start = length
        if not noted:
            prefix_cache.note([ids])
        cuts = prefix_cache.plan(variant, ids, start, anywhere, shared_prefix)
    dev = next(model.parameters()).device
    kwargs: dict[str, object] = {cache_kw: cache, "use_cache": True}
    if logits_to_keep:
        kwargs["logits_to_keep"] = 1
    for lo in range(start, n, PREFILL_BLOCK):
        hi = min(lo + PREFILL_BLOCK, n)
        model(input_ids=torch.tensor([ids[lo:hi]], dtype=torch.long, device=dev), **kwargs)
        if hi in cuts:
            layers = _cache_layers(cache)
            if layers is None:  # a cache of another kind: nothing to save
                cuts = []
                continue
            saved: KVState = [(layer.keys.clone(), layer.values.clone()) for layer in layers]
            nbytes = sum(t.numel() * t.element_size() for kv in saved for t in kv)
            prefix_cache.save(variant, ids[:hi], saved, nbytes)
    return cache


class CausalLM:
    """A causal LM plus tokenizer with a single rollback-able KV cache.

    ``vocab_size`` is the width of the logits (the model's embedding rows), which may be
    larger than the tokenizer's vocabulary; the padding rows are never allowed by a grammar.
    ``row_invariant`` (default: on for bfloat16/float16 models on the CPU) patches the model
    in place so that a position's logits do not depend on the number of positions per pass
    (:func:`make_row_invariant`); ``False`` leaves the model untouched.
    """

    def __new__(cls, model: Any, *args: Any, **kwargs: Any) -> Any:
        # The weights of a GGUF model (``LlamaCppLM.model``) get a llama.cpp model with its own
        # cache, as a transformers model gets a CausalLM (a draft model's own copy, say).
        if getattr(model, "is_gguf_model", False):
            return as_causal_lm(LlamaCppLM(model))
        return super().__new__(cls)

    def __init__(self, model: Any, tokenizer: Any, *, row_invariant: bool | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        if row_invariant is None:
            row_invariant = (self.device.type == "cpu"
                             and getattr(model, "dtype", None) in (torch.bfloat16, torch.float16))
        self.row_invariant = bool(row_invariant) and make_row_invariant(model)
        self._cache_kw = _cache_kwarg(model)
        self.cache: DynamicCache | None = None
        self.length = 0  # tokens held in the cache
        out_emb = model.get_output_embeddings()
        self.vocab_size = (int(out_emb.weight.shape[0]) if out_emb is not None
                           else int(model.config.vocab_size))
        self.forward_passes = 0
        self.prefix_cache = prefix_cache_of(model)

    @property
    def prefix_variant(self) -> Hashable:
        """What the prefix cache keeps apart: states computed with another dtype, thread count,
        device or row-invariant patching are not this model's fresh-prefill bytes."""
        return (str(getattr(self.model, "dtype", "")), str(self.device), torch.get_num_threads(),
                self.row_invariant)

    def reset(self) -> None:
        """Drop the KV cache: the next :meth:`extend` starts from an empty context."""
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.length = 0

    def prefill(self, token_ids: list[int], *, shared_prefix: int = 0) -> None:
        """Empty the cache and feed ``token_ids`` (a prompt but its last token; may be empty),
        reusing the longest prefix the prefix cache holds (see :func:`prefill_cache`: exact,
        the logits that follow are bit-identical to a fresh prefill's).
        ``shared_prefix``: how many leading tokens later prompts are likely to share (the
        conversation before the last message); the cache saves the state there."""
        ids = [int(t) for t in token_ids]
        self.cache = prefill_cache(self.model, self._cache_kw, ids, self.prefix_cache, self.prefix_variant,
                                   shared_prefix=shared_prefix)
        self.length = len(ids)
        if ids:
            self.forward_passes += 1

    @torch.inference_mode()
    def extend(self, token_ids: list[int], *, all_logits: bool = True, float32: bool = True) -> torch.Tensor:
        """Feed ``token_ids`` after the cached prefix; return float32 logits
        ``[len(token_ids), vocab_size]`` (or ``[1, vocab_size]`` for the last position only);
        ``float32=False`` returns them in the model's own dtype (no conversion pass)."""
        if self.cache is None:
            self.reset()
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)  # [1, n]
        kwargs: dict[str, object] = {self._cache_kw: self.cache, "use_cache": True}
        if not all_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=ids, **kwargs)
        self.forward_passes += 1
        self.length += len(token_ids)
        logits = out.logits[0]  # [n, V]
        return logits.float() if float32 else logits

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached positions."""
        remove = self.length - length
        if remove < 0:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        if remove:
            assert self.cache is not None, "an empty cache holds no positions"
            self.cache.crop(-remove)
            self.length = length


# model types whose ``ForCausalLM`` logits are exactly ``lm_head(last_hidden_state)`` (no
# soft-capping or scaling): for these :class:`BatchKV` applies the head to the real positions
# only, not to the padding of a batched step
_PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3"})


class BatchKV:
    """One batched KV cache for ``B`` sequences of a :class:`CausalLM`, stepped together.

    Layout: the cache holds ``L`` slots per row; ``mask`` (bool ``[B, L]``) marks the slots
    that hold a real token of that row. Prompts are left-padded; a step feeds every row
    ``n_b >= 1`` tokens, padded to ``K = max(n_b)`` with masked dummy positions; after
    verification row ``b`` keeps the first ``keep_b <= n_b`` of them (:meth:`commit`), the
    rest become masked holes and the common tail is cropped. Position ids are explicit: a
    token's position is the number of real tokens before it in its row, so each row computes
    what it would compute alone (up to float rounding of differently shaped matmuls).
    :meth:`select` drops finished rows; :meth:`compact` squeezes the holes out (exact: the
    attended keys/values and their positions do not change).

    The model's own (single-sequence) cache in ``lm`` is not touched. A model that brings its
    own batched cache (``lm.new_batch_cache(rows)``, the llama.cpp backend's) gets that instead;
    ``rows`` is the most rows it will hold at once (this cache grows as needed and ignores it).
    """

    def __new__(cls, lm: Any, rows: int | None = None) -> Any:
        own = getattr(lm, "new_batch_cache", None)
        if own is not None:
            return own(rows)
        return super().__new__(cls)

    def __init__(self, lm: CausalLM, rows: int | None = None) -> None:
        from transformers import DynamicCache

        self.lm = lm
        self.cache = DynamicCache()
        self.device = lm.device
        self.mask = torch.zeros((0, 0), dtype=torch.bool)   # [B, L]
        self.pos = torch.zeros(0, dtype=torch.long)          # [B] real tokens per row
        self.forward_passes = 0
        self.real_positions = 0    # positions fed that belonged to a row
        self.padded_positions = 0  # dummy positions fed to square the batch
        self._fed = torch.zeros(0, dtype=torch.long)  # [B] tokens fed per row by the last extend
        model = lm.model
        self._base: torch.nn.Module | None = None
        self._head: torch.nn.Module | None = None
        if getattr(model.config, "model_type", None) in _PLAIN_HEAD_TYPES:
            base = getattr(model, "model", None)
            head = model.get_output_embeddings()
            if base is not None and head is not None:
                self._base, self._head = base, head
        self._cache_kw = _cache_kwarg(self._base if self._base is not None else model)

    @property
    def batch(self) -> int:
        """Rows currently held in the batched cache."""
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        """Cache slots per row (real tokens, holes and left padding)."""
        return int(self.mask.shape[1])

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                 rows: torch.Tensor | None, cols: torch.Tensor | None,
                 float32: bool = True) -> torch.Tensor | None:
        """Run ``ids`` ``[B, K]`` after the cache with the full 2-D ``mask`` ``[B, L + K]`` and
        position ids ``pos`` ``[B, K]``; return float32 (``float32=False``: the model's dtype)
        logits of the positions ``(rows, cols)`` as ``[R, V]`` (None when ``rows`` is None: a
        prefill)."""
        dev = self.device
        kwargs = {self._cache_kw: self.cache, "use_cache": True,
                  "attention_mask": mask.to(dev, dtype=torch.long), "position_ids": pos.to(dev)}
        ids = ids.to(dev)
        self.forward_passes += 1
        if self._base is not None and self._head is not None:
            hidden = self._base(input_ids=ids, **kwargs).last_hidden_state  # [B, K, H]
            if rows is None or cols is None:
                return None
            out = self._head(hidden[rows.to(dev), cols.to(dev)])  # [R, V]
            return out.float() if float32 else out
        if rows is None or cols is None:
            self.lm.model(input_ids=ids, logits_to_keep=1, **kwargs)
            return None
        logits = self.lm.model(input_ids=ids, **kwargs).logits  # [B, K, V]
        out = logits[rows.to(dev), cols.to(dev)]  # [R, V]
        return out.float() if float32 else out

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], shared: list[int] | None = None) -> None:
        """Start a fresh cache holding the given token lists (each may be empty), left-padded.
        ``shared``: per prompt, the prefix-cache hint of :meth:`CausalLM.prefill`."""
        from transformers import DynamicCache

        self.cache = DynamicCache()
        b = len(prompts)
        width = max((len(p) for p in prompts), default=0)
        self.mask = torch.zeros((b, width), dtype=torch.bool)
        self.pos = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        if width == 0:
            return
        ids = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
                self.mask[i, width - len(p):] = True
        self.real_positions += int(self.mask.sum())
        if self.device.type == "cpu" and self._prefill_rows(prompts, width, shared):
            return  # compute-bound device: no padded positions (and exactly the unbatched prefill)
        pos = (self.mask.long().cumsum(1) - 1).clamp(min=0)  # [B, width]
        self.padded_positions += b * width - int(self.mask.sum())
        self._forward(ids, self.mask, pos, None, None)

    def _prefill_rows(self, prompts: list[list[int]], width: int, shared: list[int] | None = None) -> bool:
        """Prefill row by row into single-sequence caches, as :meth:`CausalLM.prefill` does
        (through the prefix cache; the prompts are shown to it first, so the first of several
        prompts sharing a system prompt saves it for the others), and assemble the left-padded
        batched cache (padding slots hold zeros). False, with nothing done, when the cache
        type does not allow that assembly."""
        from transformers import DynamicCache

        model = self._base if self._base is not None else self.lm.model
        pc = self.lm.prefix_cache
        pc.note([p for p in prompts if p])
        parts: list[tuple[int, list[Any]]] = []
        for i, p in enumerate(prompts):
            if not p:
                continue
            c = prefill_cache(model, self._cache_kw, [int(t) for t in p], pc, self.lm.prefix_variant,
                              shared_prefix=shared[i] if shared else 0, noted=True,
                              logits_to_keep=self._base is None)
            self.forward_passes += 1
            layers = _cache_layers(c)
            if layers is None:
                return False
            parts.append((i, layers))
        first = parts[0][1]
        batched = DynamicCache()
        for li in range(len(first)):
            k0, v0 = first[li].keys, first[li].values  # [1, heads, n, D]
            keys = k0.new_zeros((len(prompts), k0.shape[1], width, k0.shape[3]))
            values = v0.new_zeros((len(prompts), v0.shape[1], width, v0.shape[3]))
            for i, layers in parts:
                n = layers[li].keys.shape[2]
                keys[i, :, width - n:] = layers[li].keys[0]
                values[i, :, width - n:] = layers[li].values[0]
            batched.update(keys, values, li)
        self.cache = batched
        return True

    @torch.inference_mode()
    def extend(self, rows: list[list[int]], *, float32: bool = True) -> torch.Tensor:
        """Feed every row its tokens (``len(rows) == B``, each non-empty) in ONE forward.

        Returns float32 logits ``[sum(len(r)), V]`` (``float32=False``: in the model's dtype):
        row 0's positions, then row 1's, ... (the flattened layout of
        :func:`structgen.generation.verify.verify`). Until :meth:`commit` every fed position counts as
        held by its row."""
        b = self.batch
        if len(rows) != b or any(not r for r in rows):
            raise ValueError(f"extend needs {b} non-empty token lists, got {[len(r) for r in rows]}")
        lens = torch.tensor([len(r) for r in rows], dtype=torch.long)  # [B]
        k = int(lens.max())
        ids = torch.empty((b, k), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            ids[i, len(r):] = r[-1]  # dummy positions: any valid id, masked below
        steps = torch.arange(k)
        new_mask = steps[None, :] < lens[:, None]              # [B, K]
        pos = self.pos[:, None] + torch.minimum(steps[None, :], (lens - 1)[:, None])  # [B, K]
        mask = torch.cat([self.mask, new_mask], dim=1)         # [B, L + K]
        row_idx = torch.repeat_interleave(torch.arange(b), lens)  # [R]
        col_idx = torch.cat([torch.arange(n) for n in lens.tolist()])  # [R]
        logits = self._forward(ids, mask, pos, row_idx, col_idx, float32)
        assert logits is not None
        self.mask = mask
        self._fed = lens
        self.real_positions += int(lens.sum())
        self.padded_positions += b * k - int(lens.sum())
        return logits

    @torch.inference_mode()
    def commit(self, keep: list[int]) -> None:
        """After :meth:`extend`: row ``b`` keeps the first ``keep[b]`` positions it was fed;
        the others become holes; the slots no row keeps are cropped from the tail."""
        fed = self._fed
        kt = torch.tensor(keep, dtype=torch.long)
        if kt.shape != fed.shape or bool(((kt < 0) | (kt > fed)).any()):
            raise ValueError(f"keep {keep} must be within the fed lengths {fed.tolist()}")
        k = int(fed.max())
        start = self.length - k
        steps = torch.arange(k)
        self.mask[:, start:] = steps[None, :] < kt[:, None]
        self.pos += kt
        top = int(kt.max()) if len(keep) else 0
        if top < k:
            self.cache.crop(-(k - top))
            self.mask = self.mask[:, : start + top]

    @torch.inference_mode()
    def select(self, rows: list[int]) -> None:
        """Keep only the given rows (in that order), e.g. when sequences finish."""
        idx = torch.tensor(rows, dtype=torch.long)
        if self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(idx.to(self.device))
        self.mask = self.mask[idx]
        self.pos = self.pos[idx]
        self.compact(min_holes=0.0 if not rows else 0.5)

    @torch.inference_mode()
    def join(self, prompts: list[list[int]], shared: list[int] | None = None) -> bool:
        """Add one row per new sequence (its token list, which may be empty) after the rows
        already held, between two steps: continuous batching. The new rows are prefilled on
        their own (:meth:`prefill` of a fresh cache) and both caches are left-padded to the
        longer one (padding slots hold zeros and are masked; position ids are explicit, so no
        row's attention changes). Returns False, with nothing done, when the held cache is not
        made of plain dynamic layers (the caller then waits for the batch to empty)."""
        from transformers import DynamicCache

        if not prompts:
            return True
        if self.batch == 0:
            self.prefill(prompts)
            return True
        old_layers = self._layers() if self.length else []
        if old_layers is None:
            return False
        new = BatchKV(self.lm)
        new.prefill(prompts, shared)
        new_layers = new._layers() if new.length else []
        if new_layers is None:
            return False
        width = max(self.length, new.length)
        b_old, b_new = self.batch, new.batch
        if width:
            template = old_layers or new_layers
            merged = DynamicCache()
            for li, ref in enumerate(template):
                parts = []
                for name in ("keys", "values"):
                    t = getattr(ref, name)  # [B, heads, L, D]
                    out = t.new_zeros((b_old + b_new, t.shape[1], width, t.shape[3]))
                    if old_layers:
                        src = getattr(old_layers[li], name)
                        out[:b_old, :, width - src.shape[2]:] = src
                    if new_layers:
                        src = getattr(new_layers[li], name)
                        out[b_old:, :, width - src.shape[2]:] = src
                    parts.append(out)
                merged.update(parts[0], parts[1], li)
            self.cache = merged
        mask = torch.zeros((b_old + b_new, width), dtype=torch.bool)
        mask[:b_old, width - self.length:] = self.mask
        mask[b_old:, width - new.length:] = new.mask
        self.mask = mask
        self.pos = torch.cat([self.pos, new.pos])
        self.forward_passes += new.forward_passes
        self.real_positions += new.real_positions
        self.padded_positions += new.padded_positions
        return True

    def _layers(self) -> list[Any] | None:
        """The cache's per-layer tensors holders, when they are plain dynamic layers."""
        return _cache_layers(self.cache)

    @torch.inference_mode()
    def compact(self, min_holes: float = 0.5) -> bool:
        """Squeeze out holes and common left padding when they are at least ``min_holes`` of
        the slots (each row's real slots keep their order and position ids; exact). Returns
        whether the cache was rewritten (only plain ``DynamicLayer`` caches are)."""
        b, length = self.mask.shape
        if b == 0 or length == 0:
            return False
        counts = self.mask.sum(1)                       # [B]
        width = int(counts.max())
        if length - width <= min_holes * length:
            return False
        layers = self._layers()
        if layers is None:
            return False
        # gather index per row: its real slots, right-aligned; left padding points at slot 0
        order = torch.argsort((~self.mask).to(torch.int8), dim=1, stable=True)  # real slots first
        src = torch.zeros((b, width), dtype=torch.long)
        new_mask = torch.zeros((b, width), dtype=torch.bool)
        for i in range(b):
            n = int(counts[i])
            if n:
                src[i, width - n:] = order[i, :n]
                new_mask[i, width - n:] = True
        dev = self.device
        for layer in layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)                # [B, heads, L, D]
                idx = src.to(dev)[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
                g = torch.gather(t, 2, idx)
                g = g * new_mask.to(dev)[:, None, :, None].to(g.dtype)  # padding slots hold zeros
                setattr(layer, name, g.contiguous())
        self.mask = new_mask
        return True


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@functools.lru_cache(maxsize=1)
def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.dtype`` or a name (``"float32"``/``"fp32"``, ``"bfloat16"``/``"bf16"``,
    ``"float16"``/``"fp16"``, ``"auto"``). ``"auto"`` is bfloat16 where the hardware computes
    it natively (a CUDA device with bf16 support, or a CPU with AVX512-BF16 / AMX) and float32
    otherwise. Weights converted to bfloat16 are a slightly different model than float32 ones;
    speculative output is compared with plain decoding of the same model and dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if _cpu_has_bf16() else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(_DTYPES) + ['auto']}")
    return _DTYPES[name]


def load_model(model: ModelSource, tokenizer: PreTrainedTokenizerBase | None = None, *,
               dtype: torch.dtype | str = torch.float32, threads: int | None = None) -> CausalLM:
    """A :class:`CausalLM` from a transformers model object, a local directory, or an alias
    of a model pulled into the cache (:mod:`structgen.assets.store`; an alias that is not
    cached raises :class:`AssetError` naming ``structgen models pull ALIAS``). Loaded models are
    memoised per (path, dtype). ``dtype`` applies to paths and aliases (see
    :func:`resolve_dtype`); model objects keep their own. A ``.gguf`` file gives a
    :class:`~structgen.generation.llamacpp.LlamaCppLM` (llama.cpp backend, ``structgen[llamacpp]``);
    ``threads`` is its number of llama.cpp threads (default: the CPU count, at most 8; a
    transformers model uses torch's, see ``torch.set_num_threads``)."""
    dtype = resolve_dtype(dtype)
    if isinstance(model, CausalLM):
        return model
    if isinstance(model, LlamaCppLM):
        return as_causal_lm(model)
    if isinstance(model, (str, os.PathLike)) and is_gguf_path(model):
        # llama.cpp backend (needs structgen[llamacpp]); dtype is the file's
        return as_causal_lm(load_gguf(model, n_threads=threads))
    if not isinstance(model, (str, os.PathLike)):
        if tokenizer is None:
            name = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
            if not name:
                raise AssetError("pass tokenizer= with a model object that has no name_or_path")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(name)
        return CausalLM(model, tokenizer)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(resolve_model(model))
    if is_gguf_path(path):  # a -gguf alias: the cached GGUF file, run by llama.cpp
        return as_causal_lm(load_gguf(path, n_threads=threads))
    key = (str(path), str(dtype))
    with _LOAD_LOCK:
        got = _LOADED.get(key)
        if got is None:
            got = (AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype),
                   AutoTokenizer.from_pretrained(str(path)))
            _LOADED[key] = got
    weights, own_tokenizer = got
    return CausalLM(weights, tokenizer if tokenizer is not None else own_tokenizer)


def as_causal_lm(lm: LlamaCppLM) -> CausalLM:
    """``lm`` where a :class:`CausalLM` is expected: the llama.cpp backend has the same
    attributes and methods (the generation loop duck-types its model)."""
    return cast(CausalLM, lm)


_VOCABS: dict[int, Vocabulary] = {}


def vocabulary_for(lm: CausalLM) -> Vocabulary:
    """The grammar-side :class:`~structgen.masks.vocab.Vocabulary` of ``lm`` (cached per tokenizer),
    with the model's logits width as vocab size and the generation config's EOS ids."""
    own = getattr(lm, "vocabulary", None)
    if callable(own):  # a backend that knows its vocabulary (llama.cpp: from the GGUF)
        return cast(Vocabulary, own())
    key = id(lm.tokenizer)
    v = _VOCABS.get(key)
    if v is None:
        eos: list[int] = []
        gc = getattr(lm.model, "generation_config", None)
        ge = getattr(gc, "eos_token_id", None) if gc is not None else None
        if isinstance(ge, int):
            eos.append(ge)
        elif isinstance(ge, (list, tuple)):
            eos.extend(int(x) for x in ge)
        v = Vocabulary.from_tokenizer(lm.tokenizer, vocab_size=lm.vocab_size, eos_token_ids=eos)
        _VOCABS[key] = v
    return v


# configuration fields that hold a model's maximum number of positions, by model family
_CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length",
                   "seq_length", "max_seq_len")
# tokenizers without a known limit report int(1e30) (transformers' VERY_LARGE_INTEGER)
_NO_TOKENIZER_LIMIT = 10**9


def context_length(lm: CausalLM) -> int | None:
    """The most positions ``lm`` takes (prompt plus generated tokens), or None when unknown.

    The model configuration decides (``max_position_embeddings``, or ``n_positions`` /
    ``n_ctx`` / ... for the families that name it so; the text config of multimodal models);
    the tokenizer's ``model_max_length`` is used only when the configuration gives nothing,
    because a tokenizer saved for another model may report a different (or a sentinel)
    limit."""
    own = getattr(lm, "max_positions", None)
    if isinstance(own, int):  # a backend with a fixed-size cache (llama.cpp)
        return own
    config = getattr(lm.model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        try:
            config = config.get_text_config()
        except Exception:  # noqa: BLE001 - older configs: keep the top-level one
            pass
    for name in _CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    limit = getattr(lm.tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < _NO_TOKENIZER_LIMIT:
        return limit
    return None


def check_context(lm: CausalLM, prompt_tokens: int, max_new_tokens: int, *,
                  draft_lm: CausalLM | None = None, request_index: int | None = None) -> None:
    """Raise :class:`~structgen.errors.ContextLengthError` when ``prompt_tokens +
    max_new_tokens`` exceeds the context of ``lm`` (or of ``draft_lm``, which reads the same
    positions). Models whose context is unknown are not checked."""
    limits = [(context_length(m), what) for m, what in ((lm, "model"), (draft_lm, "draft model"))
              if m is not None]
    known = [(n, what) for n, what in limits if n is not None]
    if not known:
        return
    limit, what = min(known)
    if prompt_tokens + max_new_tokens > limit:
        room = limit - prompt_tokens
        hint = (f"lower max_new_tokens to at most {room}" if room >= 1
                else "shorten the prompt")
        raise ContextLengthError(
            f"the prompt has {prompt_tokens} tokens and max_new_tokens is {max_new_tokens}: "
            f"{prompt_tokens + max_new_tokens} positions, more than the {what}'s context of "
            f"{limit} tokens ({hint})", prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens,
            context_length=limit, request_index=request_index)
