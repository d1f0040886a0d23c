"""What the integrations share: the vocabulary of a tokenizer (memoised per tokenizer object),
the ``strict`` override of the JSON Schema options and the bitmask tensor a host engine fills.
Private to :mod:`structgen.integrations`."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeAlias

from structgen.config import JsonSchemaOptions
from structgen.masks.vocab import Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch
    from numpy.typing import NDArray

    #: the packed int32 bitmask ``[rows, ceil(vocab_size / 32)]`` a host engine hands over
    Bitmask: TypeAlias = "torch.Tensor | NDArray[np.int32]"

_VOCAB_LOCK = threading.Lock()
_VOCABS: weakref.WeakKeyDictionary[object, dict[tuple[int | None, tuple[int, ...]], Vocabulary]] = (
    weakref.WeakKeyDictionary())


def eos_ids(tokenizer: object, eos_token_ids: int | Iterable[int] | None) -> tuple[int, ...]:
    """The EOS ids given (one id or several), else the tokenizer's ``eos_token_id`` (or none)."""
    if eos_token_ids is None:
        t = getattr(tokenizer, "eos_token_id", None)
        return () if t is None else (int(t),)
    if isinstance(eos_token_ids, int):
        return (eos_token_ids,)
    return tuple(int(x) for x in eos_token_ids)


def vocabulary(tokenizer: object, vocab_size: int | None, eos: tuple[int, ...]) -> Vocabulary:
    """``Vocabulary.from_tokenizer`` memoised per (tokenizer object, size, EOS ids)."""
    key = (vocab_size, eos)
    with _VOCAB_LOCK:
        try:
            per_tok = _VOCABS.setdefault(tokenizer, {})
        except TypeError:  # not weak-referenceable / hashable: no cache
            per_tok = {}
        v = per_tok.get(key)
        if v is None:
            v = Vocabulary.from_tokenizer(tokenizer, vocab_size=vocab_size, eos_token_ids=eos)
            per_tok[key] = v
    return v


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """A CPU int32 torch tensor ``[rows, ceil(vocab_size/32)]``, every token allowed. Imports
    torch (the integrations themselves do not)."""
    from structgen.kernels.bitmask import allocate_bitmask as allocate

    return allocate(int(rows), vocab_size)


def with_strict(json_options: JsonSchemaOptions | None, strict: bool | None) -> JsonSchemaOptions | None:
    """``json_options`` with ``strict`` set, when it is given (None keeps the options' own)."""
    if strict is None:
        return json_options
    return replace(json_options or JsonSchemaOptions(), strict=strict)
