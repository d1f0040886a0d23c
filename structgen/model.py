"""Model adapter: load a causal LM and run KV-cached forward passes that can roll back.

:class:`CausalLM` wraps a Hugging Face causal LM and its tokenizer. It keeps one
sequence's KV cache (a ``transformers.DynamicCache``); :meth:`CausalLM.extend` feeds new
tokens and returns their logits, :meth:`CausalLM.crop` drops rejected positions so that
the accepted prefix is never recomputed.

Imports torch and transformers (only when this module is imported).
"""

from __future__ import annotations

import inspect
import os
import threading
from pathlib import Path
from typing import Any

import torch

from .errors import AssetError

__all__ = ["CausalLM", "load_model", "vocabulary_for"]

_LOAD_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], tuple[Any, Any]] = {}


def _cache_kwarg(model: Any) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class CausalLM:
    """A causal LM plus tokenizer with a single rollback-able KV cache.

    ``vocab_size`` is the width of the logits (the model's embedding rows), which may be
    larger than the tokenizer's vocabulary; the padding rows are never allowed by a grammar.
    """

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self._cache_kw = _cache_kwarg(model)
        self.cache: Any = None
        self.length = 0  # tokens held in the cache
        out_emb = model.get_output_embeddings()
        self.vocab_size = (int(out_emb.weight.shape[0]) if out_emb is not None
                           else int(model.config.vocab_size))
        self.forward_passes = 0

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.length = 0

    @torch.inference_mode()
    def extend(self, token_ids: list[int], *, all_logits: bool = True) -> torch.Tensor:
        """Feed ``token_ids`` after the cached prefix; return float32 logits
        ``[len(token_ids), vocab_size]`` (or ``[1, vocab_size]`` for the last position only)."""
        if self.cache is None:
            self.reset()
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)  # [1, n]
        kwargs = {self._cache_kw: self.cache, "use_cache": True}
        if not all_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=ids, **kwargs)
        self.forward_passes += 1
        self.length += len(token_ids)
        return out.logits[0].float()  # [n, V]

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached positions."""
        remove = self.length - length
        if remove < 0:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        if remove:
            self.cache.crop(-remove)
            self.length = length


def load_model(model: Any, tokenizer: Any = None, *, dtype: torch.dtype = torch.float32) -> CausalLM:
    """A :class:`CausalLM` from a transformers model object, a local directory, or an alias
    known to :mod:`structgen.assets` (fetched and cached on first use). Loaded models are
    memoised per (path, dtype)."""
    if isinstance(model, CausalLM):
        return model
    if not isinstance(model, (str, os.PathLike)):
        if tokenizer is None:
            name = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
            if not name:
                raise AssetError("pass tokenizer= with a model object that has no name_or_path")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(name)
        return CausalLM(model, tokenizer)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .assets import resolve_model

    path = Path(resolve_model(model))
    key = (str(path), str(dtype))
    with _LOAD_LOCK:
        got = _LOADED.get(key)
        if got is None:
            m = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
            tok = AutoTokenizer.from_pretrained(str(path))
            got = (m, tok)
            _LOADED[key] = got
    m, tok = got
    return CausalLM(m, tokenizer if tokenizer is not None else tok)


_VOCABS: dict[int, Any] = {}


def vocabulary_for(lm: CausalLM) -> Any:
    """The grammar-side :class:`~structgen.vocab.Vocabulary` of ``lm`` (cached per tokenizer),
    with the model's logits width as vocab size and the generation config's EOS ids."""
    key = id(lm.tokenizer)
    v = _VOCABS.get(key)
    if v is None:
        from .vocab import Vocabulary

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
