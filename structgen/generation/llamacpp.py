"""llama.cpp model backend: GGUF models run by llama-cpp-python's low-level C API.

:func:`load_gguf` returns a :class:`LlamaCppLM`, which has the contract the generation loop
(:mod:`structgen.generation.loop`) uses for :class:`~structgen.generation.model.CausalLM`:
``extend`` feeds tokens after the cached prefix and returns the logits of every fed position
(one ``llama_decode`` call, a verify pass), ``crop`` drops rejected positions
(``llama_memory_seq_rm``), ``reset`` empties the cache; ``tokenizer`` encodes with llama.cpp's
own tokenizer and renders the GGUF's chat template; :meth:`LlamaCppLM.vocabulary` builds the
grammar-side :class:`~structgen.masks.vocab.Vocabulary` from the GGUF's tokens (the bytes
llama.cpp itself outputs for each id), so token masks match llama.cpp's tokenisation.
:class:`LlamaCppBatchKV` runs several sequences in one ``llama_decode`` per step, one llama.cpp
sequence id per row (no padding: a step feeds only the rows' real positions).

Exactness: a position's logits must not depend on how many positions a pass computes, or
greedy speculative output could differ from plain one-token decoding. ggml's CPU matrix
products take a different kernel for a one-column product (a dot product per output) than for
two or more columns (llamafile's tiled GEMM), so a one-position pass rounds differently. With
``row_invariant`` (the default) a pass that would compute one position also computes a
scratch position (a copy of the token at position 0 of a scratch sequence, removed after the
pass), so every product has at least two columns -- where that is needed: always for float
weights, and for quantized ones only when a one-position pass measured once on the scratch
sequence rounds otherwise than a longer pass (where it does not, a one-position pass stays a
matrix-vector product, several times cheaper on a CPU than two columns; figures in
``docs/guides/llamacpp.md``); flash attention (on) processes each query
row on its own and skips masked cache cells, so rows of other sequences do not change a row's
attention either. ggml's tiled K-quant kernel serves products of 8 or more columns (on
by default; ``GGML_CPU_TILED_MM=0`` turns it off for the process): on a model with K-quant or
IQ weights every pass that returns logits for several positions (a verify pass, a batched
step) is split into ``llama_decode`` calls of at most :data:`ROW_INVARIANT_COLUMNS` positions,
so those products always take the dot-product kernel, while a prompt prefill (no logits but
the last; the same for plain and speculative decoding of one prompt) keeps the tiled kernel,
about twice as fast on long prompts. Weight repacking is off by default (``repack``) for the
same reason. See ``tests/test_llamacpp.py`` for what is checked and
``benchmarks/results/llamacpp-row-invariance.md`` for the measurements.

Batched rows get one cache stream each (``kv_unified`` off): every sequence has its own cells,
in the order of its positions, as a sequence alone has. With one cache shared by all rows
(llama.cpp's unified cache), freed cells (rejected drafts) are refilled by any row, so a row's
later tokens can sit in cells before its earlier ones and attention accumulates that row in
another order than the row alone does: measured on SmolLM2-135M Q4_1, 1 of 4 batched greedy
outputs equal to one-at-a-time decoding (3 of 4 without flash attention); with a stream per
row, 4 of 4 (``benchmarks/results/llamacpp-qwen2.5-coder-0.5b.md``). A step still feeds every
row's positions to ONE ``llama_decode``; llama.cpp splits it into micro-batches of rows that feed
the same number of positions.

llama-cpp-python is imported only when a GGUF model is loaded (``pip install
'structgen[llamacpp]'``); everything else in structgen works without it.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from structgen.assets.store import is_gguf_path
from structgen.errors import AssetError, ConfigError
from structgen.generation.messages import Message
from structgen.generation.pacing import StepCost
from structgen.generation.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from structgen.generation.prompts import render_chat_template
from structgen.masks.vocab import Vocabulary

#: a sequence's saved llama.cpp state (``llama_state_seq_get_data``'s bytes)
SeqState = ctypes.Array[ctypes.c_uint8]

__all__ = ["GGUFTokenizer", "LlamaCppBatchKV", "LlamaCppLM", "is_gguf_path", "load_gguf"]

INSTALL_HINT = ("install the llama.cpp backend with `pip install 'structgen[llamacpp]'` (builds "
                "llama-cpp-python from source: 10-20 minutes on 2 cores the first time; "
                "scripts/setup.sh does it unless STRUCTGEN_LLAMACPP=0)")

_DEFAULT_CTX = 4096        # positions per sequence when the caller gives none (and the model allows)
_CHUNK = 512               # positions per llama_decode call when prefilling a long prompt
# A prefill decode of at least this many positions computes every position's keys and values
# bit-identically however the prompt is split into decodes (measured on Qwen2.5-Coder-0.5B
# Q4_K_M and the tests' f32 model, 1 to 4 threads: 63 positions or fewer take other kernels and
# round differently). Prefills keep every decode at this size or more, so a prompt restored
# from the prefix cache and prefilled on from there holds the bytes a fresh prefill holds.
PREFILL_MIN_COLUMNS = 64
# prefix lengths the cache saves are multiples of this (finer than PREFILL_MIN_COLUMNS: a
# saved prefix may end anywhere, as long as the decodes around it keep their minimum size)
PREFIX_BLOCK = 16
# ggml's tiled K-quant kernel takes products of 8 or more columns (ggml-cpu/tiled, "rows >= 8");
# fewer columns take the per-column dot products a one-position pass takes
ROW_INVARIANT_COLUMNS = 7
# weight types ggml's tiled kernel serves (ggml_tiled_supported in ggml-cpu/tiled/tiled.cpp)
_TILED_TYPES = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                          "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"})

# a decode's fixed cost in positions before any was timed: large, so that a batched step stays
# one decode until one-position decodes have been measured (the scratch check times some)
_DECODE_COST_PRIOR = 32.0
# weight types whose one-column and several-column products take differently rounding kernels
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})

_LOCK = threading.Lock()
_MODELS: dict[tuple[str, bool], _GGUFModel] = {}
_BACKEND_READY = False
_LOG_CALLBACK: object = None  # keeps the ctypes callback alive while llama.cpp holds it


def tiled_kernel_enabled() -> bool:
    """Whether ggml may take its tiled K-quant kernel in this process: ggml's own reading of
    ``GGML_CPU_TILED_MM`` (unset or a non-zero number), which it makes once per process."""
    value = os.environ.get("GGML_CPU_TILED_MM")
    if value is None:
        return True
    try:
        return int(value.strip() or "0") != 0
    except ValueError:
        return False  # atoi() of text that is not a number is 0


def _weight_types(path: Path) -> frozenset[str] | None:
    """The type names of the GGUF's weight matrices (tensors of two or more dimensions), read
    from its tensor table; None when it cannot be read."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        return frozenset(t.tensor_type.name for t in reader.tensors if sum(d > 1 for d in t.shape) >= 2)
    except Exception:  # noqa: BLE001 - no gguf package or an unusual file: the caller assumes the worst
        return None


def _default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def _lib() -> ModuleType:
    """The ``llama_cpp`` module, its backend initialised and its log output silenced once."""
    global _BACKEND_READY, _LOG_CALLBACK
    try:
        import llama_cpp
    except ImportError as e:
        raise AssetError("a GGUF model needs llama-cpp-python, which is not installed: "
                         + INSTALL_HINT) from e
    with _LOCK:
        if not _BACKEND_READY:
            @llama_cpp.llama_log_callback
            def _quiet(level: int, text: bytes, user_data: object) -> None:  # llama.cpp's load chatter
                return None

            _LOG_CALLBACK = _quiet
            llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _BACKEND_READY = True
    return llama_cpp


class _GGUFModel:
    """A loaded ``llama_model`` (the weights) shared by every :class:`LlamaCppLM` of the file;
    freed when the last reference goes."""

    is_gguf_model = True  # CausalLM(model, tokenizer) on these weights gives a LlamaCppLM

    def __init__(self, path: Path, *, repack: bool) -> None:
        lib = _lib()
        self.lib = lib
        self.path = path
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0 if not lib.llama_supports_gpu_offload() else -1
        params.use_extra_bufts = bool(repack)
        ptr = lib.llama_model_load_from_file(os.fsencode(path), params)
        if not ptr:
            raise AssetError(f"llama.cpp could not load {path} (not a GGUF model it supports, or damaged)")
        self.ptr = ptr
        self.vocab = lib.llama_model_get_vocab(ptr)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(ptr))
        # the most positions one pass that returns logits may hold (None: no limit), so that a
        # position's logits do not depend on the pass (see the module docstring)
        types = _weight_types(path)
        tiled = types is None or bool(types & _TILED_TYPES)
        self.max_logit_columns = ROW_INVARIANT_COLUMNS if tiled_kernel_enabled() and tiled else None
        # whether a one-position pass computes what a pass of several positions computes for it,
        # per thread count: never assumed for float matrices (a one-column product takes the
        # dot-product kernel, several columns tinyBLAS, which sums in another order); for
        # quantized ones it is checked once (:meth:`LlamaCppLM.one_column_exact`)
        self.float_weights = types is None or bool(types & _FLOAT_TYPES)
        self.one_column_exact: dict[int, bool] = {}
        # the time of one llama_decode by its number of positions, per thread count: whether
        # a batched step runs as one decode or as a decode per row (:class:`LlamaCppBatchKV`)
        self.decode_cost: dict[int, StepCost] = {}
        self._vocabulary: Vocabulary | None = None
        self.tokenizer = GGUFTokenizer(self)
        self.name_or_path = str(path)
        # KV states of prompt prefixes, shared by every context of these weights
        self.prefix_cache = PrefixCache[SeqState](DEFAULT_PREFIX_CACHE_MB << 20, block=PREFIX_BLOCK)

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None when the key is absent."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = self.lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes llama.cpp outputs for ``token`` (control tokens: empty unless ``special``)."""
        buf = ctypes.create_string_buffer(64)
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def vocabulary(self) -> Vocabulary:
        """The grammar-side vocabulary (built once, a few milliseconds per thousand tokens):
        per id the bytes llama.cpp outputs for it; control tokens and other tokens that output
        no text are None; EOS ids are the GGUF's EOS first, then every other end-of-generation
        token llama.cpp knows (``<|im_end|>``, ``<|eot_id|>``, ...)."""
        if self._vocabulary is None:
            lib, vocab = self.lib, self.vocab
            table: list[bytes | None] = []
            special: list[int] = []
            eog: list[int] = []
            for i in range(self.n_vocab):
                if lib.llama_vocab_is_eog(vocab, i):
                    eog.append(i)
                if lib.llama_vocab_is_control(vocab, i):
                    special.append(i)
                    table.append(None)
                    continue
                table.append(self.piece(i) or None)
            eos = int(lib.llama_vocab_eos(vocab))
            order = ([eos] if 0 <= eos < self.n_vocab else []) + eog
            self._vocabulary = Vocabulary(table, order, self.n_vocab, special)
        return self._vocabulary

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            self.lib.llama_model_free(ptr)


class GGUFTokenizer:
    """The part of a Hugging Face tokenizer's interface structgen uses, on llama.cpp's own
    tokenizer: :meth:`encode`, :meth:`decode`, ``chat_template`` / :meth:`apply_chat_template`
    (the GGUF's Jinja template, rendered in a sandbox as transformers renders it),
    ``eos_token_id``, ``bos_token_id``."""

    def __init__(self, model: _GGUFModel) -> None:
        self._model = model
        lib, vocab = model.lib, model.vocab
        eos, bos = int(lib.llama_vocab_eos(vocab)), int(lib.llama_vocab_bos(vocab))
        self.eos_token_id: int | None = eos if eos >= 0 else None
        self.bos_token_id: int | None = bos if bos >= 0 else None
        self.eos_token = model.piece(eos, special=True).decode("utf-8", "replace") if eos >= 0 else ""
        self.bos_token = model.piece(bos, special=True).decode("utf-8", "replace") if bos >= 0 else ""
        self.chat_template: str | None = model.meta("tokenizer.chat_template")
        self.name_or_path = str(model.path)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` as llama.cpp tokenizes it; special-token text (e.g.
        ``<|im_start|>``) becomes the special token, as a Hugging Face tokenizer does.
        ``add_special_tokens`` adds BOS/EOS where the GGUF asks for them."""
        lib = self._model.lib
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (lib.llama_token * cap)()
        n = lib.llama_tokenize(self._model.vocab, data, len(data), buf, cap, add_special_tokens, True)
        if n < 0:
            cap = -n
            buf = (lib.llama_token * cap)()
            n = lib.llama_tokenize(self._model.vocab, data, len(data), buf, cap, add_special_tokens, True)
        return list(buf[:n])

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (special tokens as their text unless ``skip_special_tokens``)."""
        data = b"".join(self._model.piece(int(i), special=not skip_special_tokens) for i in ids)
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[Message], add_generation_prompt: bool = True,
                            tokenize: bool = False, **kwargs: object) -> str | list[int]:
        """Render the GGUF's chat template for ``messages``; token ids when ``tokenize``."""
        if not self.chat_template:
            raise ConfigError(f"{self.name_or_path} has no chat template: give prompt= instead of messages=")
        text = render_chat_template(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text


class _Context:
    """One ``llama_context`` (KV cache plus compute buffers) and a reusable ``llama_batch``.

    ``n_seq`` sequence ids share ``n_cells`` cache cells (``unified``: one cache for all) or
    each has ``n_cells // (n_seq + 1)`` cells of its own (a stream per sequence); sequence id
    ``n_seq`` is the scratch sequence of the row-invariant padding. Logits are requested for
    every fed position unless told."""

    def __init__(self, model: _GGUFModel, *, n_cells: int, n_seq: int, n_threads: int | None,
                 flash_attn: bool = True, unified: bool = True) -> None:
        lib = model.lib
        self.lib = lib
        self.model = model
        params = lib.llama_context_default_params()
        params.n_ctx = n_cells
        params.n_batch = _CHUNK
        params.n_ubatch = _CHUNK
        params.n_seq_max = n_seq + 1
        threads = n_threads or _default_threads()
        params.n_threads = threads
        params.n_threads_batch = threads
        params.kv_unified = unified
        params.flash_attn_type = 1 if flash_attn else 0  # LLAMA_FLASH_ATTN_TYPE_ENABLED / _DISABLED
        params.no_perf = True
        ptr = lib.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise AssetError(f"llama.cpp could not create a context of {n_cells} cells for {model.path}")
        self.ptr = ptr
        self.n_cells = int(lib.llama_n_ctx(ptr))
        self.n_seq = n_seq
        self.unified = unified
        self.cells_per_seq = self.n_cells if unified else self.n_cells // (n_seq + 1)
        self.scratch_seq = n_seq
        self.mem = lib.llama_get_memory(ptr)
        self.cost = model.decode_cost.setdefault(threads, StepCost(_DECODE_COST_PRIOR))
        self._cap = _CHUNK
        self.batch = lib.llama_batch_init(self._cap, 0, 1)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.mem, True)

    def remove(self, seq: int, start: int, stop: int = -1) -> None:
        """Drop positions ``start <= p < stop`` (``stop=-1``: to the end) of sequence ``seq``."""
        self.lib.llama_memory_seq_rm(self.mem, seq, start, stop)

    def snapshot(self, seq: int) -> tuple[SeqState, int]:
        """A copy of sequence ``seq``'s cache cells (positions, keys, values): ``(state, bytes)``."""
        size = int(self.lib.llama_state_seq_get_size(self.ptr, seq))
        buf = (ctypes.c_uint8 * size)()
        written = int(self.lib.llama_state_seq_get_data(self.ptr, buf, size, seq))
        return buf, written

    def restore(self, seq: int, state: SeqState, length: int) -> bool:
        """Load a :meth:`snapshot` of ``length`` positions into the empty sequence ``seq``;
        False (and ``seq`` left empty) when llama.cpp refuses it."""
        ok = int(self.lib.llama_state_seq_set_data(self.ptr, state, len(state), seq)) > 0
        if ok and int(self.lib.llama_memory_seq_pos_max(self.mem, seq)) == length - 1:
            return True
        self.remove(seq, 0)
        return False

    def decode(self, tokens: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """Run ``(token, position, sequence, wants_logits)`` entries in ONE ``llama_decode``;
        returns float32 logits ``[n_wanted, n_vocab]`` in entry order (a copy)."""
        n = len(tokens)
        if n > self._cap:
            raise ValueError(f"{n} positions in one pass: at most {self._cap}")
        b = self.batch
        for i, (tok, pos, seq, want) in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = want
        b.n_tokens = n
        t0 = time.perf_counter()
        rc = self.lib.llama_decode(self.ptr, b)
        self.cost.add(n, time.perf_counter() - t0)
        if rc != 0:
            if rc == 1:
                raise RuntimeError(f"llama.cpp's cache of {self.n_cells} cells is full (decode returned 1): "
                                   "load the model with a larger n_ctx")
            raise RuntimeError(f"llama_decode failed with code {rc}")
        wanted = sum(1 for t in tokens if t[3])
        if not wanted:
            return np.zeros((0, self.model.n_vocab), dtype=np.float32)
        ptr = self.lib.llama_get_logits(self.ptr)
        return np.ctypeslib.as_array(ptr, shape=(wanted, self.model.n_vocab)).copy()

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        if getattr(self, "batch", None) is not None:
            lib.llama_batch_free(self.batch)
            self.batch = None
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            lib.llama_free(ptr)


class LlamaCppLM:
    """A GGUF model with one rollback-able sequence cache: the llama.cpp counterpart of
    :class:`~structgen.generation.model.CausalLM` (same attributes and methods the generation
    loop uses).

    ``n_ctx``: positions of the sequence cache (default: the model's training context, at most
    4096). ``n_threads``: llama.cpp's threads (default: the CPU count, at most 8).
    ``row_invariant`` (default True): one-position passes compute a scratch position too, so
    that every pass takes the same matrix kernels (see the module docstring); False runs
    exactly the positions given. ``vocab_size`` is the logits' width (the GGUF's token count).
    ``prefix_cache`` (the weights' :class:`~structgen.generation.prefix_cache.PrefixCache`,
    shared by every LlamaCppLM of the file): see :meth:`prefill`.
    """

    def __init__(self, model: _GGUFModel, *, n_ctx: int | None = None, n_threads: int | None = None,
                 row_invariant: bool = True, flash_attn: bool = True) -> None:
        self.gguf = model
        self.model = model  # what `lm.model` names for transformers models: the weights
        self.tokenizer = model.tokenizer
        self.vocab_size = model.n_vocab
        self.device = torch.device("cpu")
        limit = model.n_ctx_train if model.n_ctx_train > 0 else _DEFAULT_CTX
        self.max_positions = int(n_ctx) if n_ctx else min(limit, _DEFAULT_CTX)
        self.n_threads = n_threads
        self.row_invariant = bool(row_invariant)
        self.flash_attn = bool(flash_attn)
        self.prefix_cache = model.prefix_cache
        # states saved under other threads or attention kernels would not be a fresh prefill's
        # bytes; llama.cpp also refuses a state saved in a cache of another layout (unified, or
        # one stream per sequence) or another number of streams
        self._variant = (self.flash_attn, n_threads or _default_threads())
        self._ctx: _Context | None = None
        self._batch_ctx: _Context | None = None
        self.length = 0
        self.forward_passes = 0

    @property
    def cache(self) -> _Context | None:
        """The sequence cache's llama.cpp context (None until first used)."""
        return self._ctx

    @property
    def ctx(self) -> _Context:
        """The llama.cpp context of one-at-a-time generation, created on first use."""
        if self._ctx is None:
            self._ctx = _Context(self.gguf, n_cells=self.max_positions + 8, n_seq=1, n_threads=self.n_threads,
                                 flash_attn=self.flash_attn)
        return self._ctx

    def vocabulary(self) -> Vocabulary:
        """The grammar-side :class:`~structgen.masks.vocab.Vocabulary` of the GGUF (cached)."""
        return self.gguf.vocabulary()

    def reset(self) -> None:
        """Empty the sequence cache."""
        self.ctx.clear()
        self.length = 0

    def prefill(self, token_ids: list[int], *, shared_prefix: int = 0) -> None:
        """Empty the cache and feed ``token_ids`` (a prompt but its last token; may be empty),
        reusing the longest prefix the prefix cache holds.

        ``shared_prefix``: how many leading tokens later prompts are likely to share (the
        conversation before the last message); the cache saves the state there. Exact: a
        restored prefix holds the bytes a fresh prefill computes, and every decode of the rest
        holds at least :data:`PREFILL_MIN_COLUMNS` positions, as a fresh prefill's decodes do,
        so the logits that follow are bit-identical to a fresh prefill's."""
        ids = [int(t) for t in token_ids]
        if len(ids) > self.max_positions:
            raise RuntimeError(f"{len(ids)} positions exceed the cache of {self.max_positions} "
                               "(load the GGUF with a larger n_ctx)")
        self.reset()
        self.prefill_sequence(self.ctx, 0, ids, shared_prefix)
        self.length = len(ids)
        self.forward_passes += 1

    def prefill_sequence(self, ctx: _Context, seq: int, ids: list[int], shared_prefix: int = 0,
                         *, noted: bool = False) -> int:
        """Prefill ``ids`` into the empty sequence ``seq`` of ``ctx`` (see :meth:`prefill`);
        ``noted``: the prompt was already shown to the cache's
        :meth:`~structgen.generation.prefix_cache.PrefixCache.note`. Returns the decodes run."""
        n = len(ids)
        cache = self.prefix_cache
        variant = (*self._variant, ctx.unified, ctx.n_seq)
        start, cuts = 0, []
        if cache.enabled and n >= PREFILL_MIN_COLUMNS:
            def allowed(length: int) -> bool:
                return length == n or length <= n - PREFILL_MIN_COLUMNS

            length, state = cache.lookup(variant, ids, allowed)
            if state is not None:
                if ctx.restore(seq, state, length):
                    start = length
                else:
                    cache.restore_failed(length)
            if not noted:
                cache.note([ids])
            # every decode between two points keeps its minimum size
            cuts = cache.plan(variant, ids, start, allowed, shared_prefix, min_gap=PREFILL_MIN_COLUMNS)
        decodes = 0
        points = sorted({start, n, *cuts})
        for a, b in zip(points, points[1:]):
            # balanced decodes of at most _CHUNK - 1 positions: each holds 256 or more when
            # there are several, and a span between two points holds PREFILL_MIN_COLUMNS or more
            parts = -(-(b - a) // (_CHUNK - 1))
            bounds = [a + (b - a) * i // parts for i in range(parts + 1)]
            for lo, hi in zip(bounds, bounds[1:]):
                ctx.decode([(ids[j], j, seq, False) for j in range(lo, hi)])
                decodes += 1
            if b in cuts:
                state, nbytes = ctx.snapshot(seq)
                cache.save(variant, ids[:b], state, nbytes)
        return decodes

    def extend(self, token_ids: list[int], *, all_logits: bool = True, float32: bool = True) -> torch.Tensor:
        """Feed ``token_ids`` after the cached prefix; return float32 logits
        ``[len(token_ids), vocab_size]`` (``all_logits=False``: ``[1, vocab_size]``, the last
        position's). Long inputs run in chunks of 512 positions; ``float32`` is accepted for
        the CausalLM signature (llama.cpp's logits are float32)."""
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("extend needs at least one token")
        if self.length + len(ids) > self.max_positions:
            raise RuntimeError(f"{self.length + len(ids)} positions exceed the cache of {self.max_positions} "
                               "(load the GGUF with a larger n_ctx)")
        ctx = self.ctx
        out: list[np.ndarray] = []
        for lo in range(0, len(ids), _CHUNK - 1):
            part = ids[lo: lo + _CHUNK - 1]
            last = lo + len(part) == len(ids)
            entries = [(t, self.length + j, 0, all_logits or (last and j == len(part) - 1))
                       for j, t in enumerate(part)]
            out.append(self._run(ctx, entries, [0]))
            self.length += len(part)
        self.forward_passes += 1
        logits = out[0] if len(out) == 1 else np.concatenate(out)
        return torch.from_numpy(logits)

    def _run(self, ctx: _Context, entries: list[tuple[int, int, int, bool]], seqs: list[int]) -> np.ndarray:
        """Decode ``entries`` (in order); with ``row_invariant``, a pass that returns logits for
        several positions runs in decodes of at most the model's ``max_logit_columns`` entries
        (a sequence's positions in order, split wherever), and a single-position decode gets a
        scratch position, so that no product has one column or takes another kernel."""
        cap = self.gguf.max_logit_columns
        if self.row_invariant and cap and len(entries) > cap and sum(e[3] for e in entries) > 1:
            parts = -(-len(entries) // cap)  # as few decodes as the cap allows, sizes balanced
            bounds = [len(entries) * i // parts for i in range(parts + 1)]
            return np.concatenate([self._decode(ctx, entries[lo:hi]) for lo, hi in zip(bounds, bounds[1:])])
        return self._decode(ctx, entries)

    def _decode(self, ctx: _Context, entries: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """One ``llama_decode``, padded with a scratch position when it holds one entry and a
        one-position pass would round otherwise than a longer one (see :meth:`_run`)."""
        pad = self.row_invariant and len(entries) == 1 and not self.one_column_exact(ctx)
        if pad:
            tok = entries[0][0]
            entries = entries + [(tok, 0, ctx.scratch_seq, True)]
        logits = ctx.decode(entries)
        if pad:
            ctx.remove(ctx.scratch_seq, 0)
            logits = logits[:1] if entries[0][3] else logits[:0]
        return logits

    def one_column_exact(self, ctx: _Context) -> bool:
        """Whether a one-position pass gives the logits a pass of several positions gives for
        the same position, bit for bit, so that it needs no scratch position. Never for float
        weights; for quantized ones it is measured once per thread count, on ``ctx``'s scratch
        sequence (four positions in one pass against four one-position passes): the answer
        depends on the CPU's kernels, and where it holds a one-position pass costs a
        one-column product, not two columns."""
        if self.gguf.float_weights:
            return False
        threads = self.n_threads or _default_threads()
        known = self.gguf.one_column_exact.get(threads)
        if known is None:
            seq, n = ctx.scratch_seq, self.vocab_size
            tokens = [(7 + 977 * i) % n for i in range(4)]
            ctx.remove(seq, 0)
            together = ctx.decode([(t, i, seq, True) for i, t in enumerate(tokens)])
            ctx.remove(seq, 0)
            alone = [ctx.decode([(t, i, seq, True)]) for i, t in enumerate(tokens)]
            ctx.remove(seq, 0)
            known = bool(np.array_equal(together, np.concatenate(alone)))
            self.gguf.one_column_exact[threads] = known
        return known

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached positions."""
        if length < 0 or length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        if length < self.length:
            self.ctx.remove(0, length)
            self.length = length

    def batch_context(self, n_seq: int, cells_per_seq: int) -> _Context:
        """A context for :class:`LlamaCppBatchKV`: ``n_seq`` sequences (plus the scratch one),
        each with a cache stream of ``cells_per_seq`` cells (reused while large enough)."""
        ctx = self._batch_ctx
        if ctx is None or ctx.n_seq < n_seq or ctx.cells_per_seq < cells_per_seq:
            self._batch_ctx = None
            ctx = _Context(self.gguf, n_cells=(n_seq + 1) * cells_per_seq, n_seq=n_seq,
                           n_threads=self.n_threads, flash_attn=self.flash_attn, unified=False)
            self._batch_ctx = ctx
        ctx.clear()
        return ctx

    def new_batch_cache(self, rows: int | None = None) -> LlamaCppBatchKV:
        """The batched cache :func:`structgen.generation.loop.run_batch` steps (what
        :class:`~structgen.generation.model.BatchKV` is for transformers models); ``rows``:
        how many sequences it may hold at once (default: those of its first prefill)."""
        return LlamaCppBatchKV(self, rows=rows)


class LlamaCppBatchKV:
    """Several sequences of a :class:`LlamaCppLM` stepped together: the llama.cpp counterpart of
    :class:`~structgen.generation.model.BatchKV` (same methods and counters).

    Row ``r`` of the batch is llama.cpp sequence ``seq[r]``, with a cache stream of its own that
    holds the model's whole context; a step feeds every row its tokens at its own positions in
    ONE ``llama_decode`` (no padding positions), :meth:`commit` removes each row's rejected
    positions, :meth:`select` drops finished rows (their cells are freed) and reorders the rest
    without moving any data, :meth:`join` prefills new rows into free sequences between two
    steps (continuous batching). Prompts are prefilled one after another, each as
    :meth:`LlamaCppLM.prefill` prefills it, through the model's prefix cache (the prompts of one
    prefill or join are shown to it first, so the first of several prompts sharing a system
    prompt saves it for the others). ``rows``: the sequences the cache may hold at once
    (default: those of its first prefill; a join beyond it is refused).
    """

    def __init__(self, lm: LlamaCppLM, rows: int | None = None) -> None:
        self.lm = lm
        self.rows = rows
        self.ctx: _Context | None = None
        self.seq: list[int] = []
        self.pos: list[int] = []
        self.forward_passes = 0
        self.real_positions = 0
        self.padded_positions = 0
        self._fed: list[int] = []

    @property
    def batch(self) -> int:
        """The number of sequences (rows) in the batch."""
        return len(self.seq)

    @property
    def length(self) -> int:
        """The longest row (positions held)."""
        return max(self.pos, default=0)

    def prefill(self, prompts: list[list[int]], shared: list[int] | None = None) -> None:
        """Start a fresh cache holding the given token lists (each may be empty). ``shared``:
        per prompt, the prefix-cache hint of :meth:`LlamaCppLM.prefill`."""
        n = len(prompts)
        self.ctx = self.lm.batch_context(max(n, self.rows or 0, 1), self.lm.max_positions + 8)
        self.seq, self.pos = [], []
        self._add(list(range(n)), prompts, shared)

    def join(self, prompts: list[list[int]], shared: list[int] | None = None) -> bool:
        """Add one row per new sequence after the rows held, prefilled into free sequences.
        Returns False, with nothing done, when the cache has too few free sequences."""
        if not prompts:
            return True
        if self.ctx is None or not self.seq:
            self.prefill(prompts, shared)
            return True
        used = set(self.seq)
        free = [s for s in range(self.ctx.n_seq) if s not in used]
        if len(free) < len(prompts):
            return False
        self._add(free[: len(prompts)], prompts, shared)
        return True

    def _add(self, seqs: list[int], prompts: list[list[int]], shared: list[int] | None) -> None:
        assert self.ctx is not None
        for p in prompts:
            if len(p) > self.lm.max_positions:
                raise RuntimeError(f"{len(p)} positions exceed the cache of {self.lm.max_positions} "
                                   "(load the GGUF with a larger n_ctx)")
        ids = [[int(t) for t in p] for p in prompts]
        self.lm.prefix_cache.note(ids)
        for i, (s, p) in enumerate(zip(seqs, ids)):
            hint = shared[i] if shared else 0
            self.forward_passes += self.lm.prefill_sequence(self.ctx, s, p, hint, noted=True)
            self.seq.append(s)
            self.pos.append(len(p))
            self.real_positions += len(p)

    def extend(self, rows: list[list[int]], *, float32: bool = True) -> torch.Tensor:
        """Feed every row its tokens (``len(rows) == batch``, each non-empty) in ONE decode.
        Returns float32 logits ``[sum(len(r)), vocab_size]``: row 0's positions, then row 1's,
        ... (the flattened layout of :func:`structgen.generation.verify.verify`)."""
        if len(rows) != self.batch or any(not r for r in rows):
            raise ValueError(f"extend needs {self.batch} non-empty token lists, got {[len(r) for r in rows]}")
        assert self.ctx is not None
        entries = [(int(t), self.pos[r] + j, self.seq[r], True)
                   for r, row in enumerate(rows) for j, t in enumerate(row)]
        if len(rows) > 1 and self._per_row_cheaper([len(r) for r in rows]):
            parts, at = [], 0
            for r, row in enumerate(rows):
                parts.append(self.lm._run(self.ctx, entries[at: at + len(row)], [self.seq[r]]))
                at += len(row)
            logits = np.concatenate(parts)
        else:
            logits = self.lm._run(self.ctx, entries, self.seq)
        self._fed = [len(r) for r in rows]
        for r, k in enumerate(self._fed):
            self.pos[r] += k
        self.forward_passes += 1
        self.real_positions += len(entries)
        return torch.from_numpy(logits)

    def _per_row_cheaper(self, fed: list[int]) -> bool:
        """Whether feeding the rows ``fed`` positions each in a decode per row is expected to be
        faster than one decode of them all (as the measured decode times say), where a lone
        position needs no scratch position (:meth:`LlamaCppLM.one_column_exact`). Either way
        each position's logits are those of its row alone, so this only chooses speed: on a CPU
        a one-position decode is a matrix-vector product, and one per row can beat one decode
        of every row's position."""
        assert self.ctx is not None
        lm, cap = self.lm, self.lm.gguf.max_logit_columns
        if lm.row_invariant and not lm.one_column_exact(self.ctx):
            # a lone position would need the scratch position: measured to round otherwise in
            # the cache of several streams (float weights), and there is nothing to gain either
            return False
        cost = self.ctx.cost.pass_cost()
        alone = sum(cost(k) for k in fed)
        total = sum(fed)
        if lm.row_invariant and cap and total > cap:
            parts = -(-total // cap)
            together = sum(cost(total * (i + 1) // parts - total * i // parts) for i in range(parts))
        else:
            together = cost(total)
        return alone < together

    def commit(self, keep: list[int]) -> None:
        """After :meth:`extend`: row ``r`` keeps the first ``keep[r]`` positions it was fed."""
        if len(keep) != len(self._fed) or any(not 0 <= k <= f for k, f in zip(keep, self._fed)):
            raise ValueError(f"keep {keep} must be within the fed lengths {self._fed}")
        assert self.ctx is not None
        for r, (k, f) in enumerate(zip(keep, self._fed)):
            if k < f:
                self.pos[r] -= f - k
                self.ctx.remove(self.seq[r], self.pos[r])

    def select(self, rows: list[int]) -> None:
        """Keep only the given rows (in that order); the other rows' cells are freed."""
        assert self.ctx is not None
        kept = set(rows)
        for r, s in enumerate(self.seq):
            if r not in kept:
                self.ctx.remove(s, 0)
        self.seq = [self.seq[r] for r in rows]
        self.pos = [self.pos[r] for r in rows]

    def compact(self, min_holes: float = 0.5) -> bool:
        """Nothing to squeeze: rejected positions are removed from the cache, not masked."""
        return False


def load_gguf(path: str | os.PathLike[str], *, n_ctx: int | None = None, n_threads: int | None = None,
              row_invariant: bool = True, repack: bool = False, flash_attn: bool = True) -> LlamaCppLM:
    """A :class:`LlamaCppLM` for the GGUF file at ``path`` (weights loaded once per file and
    ``repack`` setting, memory-mapped). ``repack`` lets llama.cpp repack quantized weights
    for its faster CPU kernels, whose results depend on the number of positions per pass
    (off by default: exactness first). Raises :class:`AssetError` when the file is missing
    or not loadable, or when llama-cpp-python is not installed."""
    p = Path(os.fspath(path)).expanduser()
    if not p.is_file():
        raise AssetError(f"GGUF model file {p} does not exist")
    key = (str(p.resolve()), bool(repack))
    with _LOCK:
        model = _MODELS.get(key)
    if model is None:
        model = _GGUFModel(p, repack=repack)
        with _LOCK:
            model = _MODELS.setdefault(key, model)
    return LlamaCppLM(model, n_ctx=n_ctx, n_threads=n_threads, row_invariant=row_invariant,
                      flash_attn=flash_attn)
