"""Byte-level view of a tokenizer vocabulary: token id -> the exact bytes it adds.

A :class:`Vocabulary` knows nothing of grammars. It answers one question per token
id: which bytes does this token append to the output text? ``None`` means the token
never produces text -- special/control tokens (BOS, EOS, chat markers, ``<unk>``)
and padding ids between the tokenizer's size and the model's ``vocab_size`` -- so a
grammar must never allow it (EOS is handled separately, via :attr:`eos_token_ids`).

Supported tokenizer schemes (detected from the ``tokenizers`` backend's decoder, or
from the vocabulary content for tokenizers without a backend):

* ``"byte_level"``: byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM, and tiktoken
  files converted by transformers). Token strings are spelt in GPT-2's
  byte-to-unicode alphabet; each character stands for one byte.
* ``"sentencepiece"``: SentencePiece-style vocabularies (Llama 2, Mistral, Gemma):
  ``"\u2581"`` stands for a space and, with byte fallback, ``"<0xNN>"`` for the single
  byte ``0xNN``. The bytes are what the token adds *in the middle of a text*:
  ``"\u2581the"`` is ``b" the"``. (At the very start of an output, decoders strip
  one leading space; that is a property of detokenisation, not of the token.)
* Added tokens that are not special (e.g. Qwen2.5's ``<tool_call>``) are ordinary
  text: their content's UTF-8 bytes. Special added tokens map to ``None``.

Unsupported schemes (WordPiece ``##`` continuations, ``</w>`` suffix BPE, ...) raise
:class:`~structgen.errors.VocabularyError` rather than being guessed at.

This module imports neither torch nor transformers; numpy only.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from structgen.errors import VocabularyError
from structgen.json_types import JsonObject, JsonValue

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

__all__ = ["Vocabulary", "VocabLike", "FlatVocabLike", "byte_to_unicode", "unicode_to_byte"]

_SP_SPACE = "\u2581"
_BYTE_FALLBACK_RE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (256 entries).

    Printable Latin-1 bytes (``!``..``~``, ``\\xa1``..``\\xac``, ``\\xae``..``\\xff``)
    stand for themselves; the other 68 bytes, in increasing order, map to
    ``chr(256)``, ``chr(257)``, ... So the space byte 0x20 is ``"\u0120"`` (``Ġ``) and
    the newline 0x0A is ``"\u010a"`` (``Ċ``).
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def unicode_to_byte() -> dict[str, int]:
    """Inverse of :func:`byte_to_unicode`."""
    return {c: b for b, c in byte_to_unicode().items()}


# str.translate table: alphabet character -> chr(byte); every other code point below
# 0x144 -> a sentinel that fails ``.encode("latin-1")`` (so nothing passes silently).
_SENTINEL = "\uffff"
_BYTE_LEVEL_TRANSLATE: dict[int, str] = {cp: _SENTINEL for cp in range(0x144)}
_BYTE_LEVEL_TRANSLATE.update({ord(c): chr(b) for c, b in unicode_to_byte().items()})


class Vocabulary:
    """Immutable byte-level view of a vocabulary, for token-mask computation.

    ``token_bytes[i]`` is the bytes token ``i`` adds to the output text, or ``None``
    when token ``i`` can never be produced as text (special/control tokens, padding
    ids). A token whose bytes would be empty is stored as ``None`` too: it cannot
    advance any grammar and would let generation stall.

    ``len(vocab) == vocab.vocab_size == len(vocab.token_bytes)``: one entry per row
    of the model's logits.

    Construct directly for toy vocabularies::

        Vocabulary([b"a", b"b", b"ab", None], eos_token_ids=[3])

    or from a Hugging Face tokenizer with :meth:`from_tokenizer`. Instances are
    picklable (lazily computed arrays are dropped and rebuilt on demand), hashable
    and compare equal when their contents are equal (see :attr:`content_hash`).
    """

    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        eos_token_ids: Iterable[int],
        vocab_size: int | None = None,
        special_ids: Iterable[int] = (),
        *,
        scheme: str = "custom",
    ) -> None:
        """Build from an explicit table.

        ``vocab_size`` (default ``len(token_bytes)``) may exceed the table; the extra
        ids are padding (``None``). Ids in ``special_ids`` are forced to ``None``.
        ``eos_token_ids`` are deduplicated, order kept; each must be a valid id.
        Raises :class:`VocabularyError` on an entry that is neither bytes nor None, a
        ``vocab_size`` smaller than the table, or an out-of-range id.
        """
        n = len(token_bytes)
        size = n if vocab_size is None else int(vocab_size)
        if size < n:
            raise VocabularyError(f"vocab_size {size} is smaller than the {n} token entries")
        if size <= 0:
            raise VocabularyError("a vocabulary needs at least one token id")
        table: list[bytes | None] = [None] * size
        for i, tb in enumerate(token_bytes):
            if tb is None:
                continue
            if isinstance(tb, (bytearray, memoryview)):
                tb = bytes(tb)
            if not isinstance(tb, bytes):
                raise VocabularyError(f"token {i}: expected bytes or None, got "
                                      f"{type(tb).__name__} {tb!r:.40}")
            table[i] = tb or None
        specials = frozenset(int(i) for i in special_ids)
        for i in specials:
            if not 0 <= i < size:
                raise VocabularyError(f"special id {i} outside 0..{size - 1}")
            table[i] = None
        eos = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        for i in eos:
            if not 0 <= i < size:
                raise VocabularyError(f"EOS id {i} outside 0..{size - 1}")
        self._token_bytes: tuple[bytes | None, ...] = tuple(table)
        self._eos: tuple[int, ...] = eos
        self._special: frozenset[int] = specials
        self._size = size
        self._scheme = scheme
        self._cache: dict[str, Any] = {}

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: object,
        vocab_size: int | None = None,
        *,
        eos_token_ids: Iterable[int] = (),
    ) -> Vocabulary:
        """Byte table of a Hugging Face tokenizer (fast or slow) or a ``tokenizers.Tokenizer``.

        ``vocab_size`` is the model's vocabulary size (rows of its logits); it defaults
        to the tokenizer's largest id + 1. Ids from the tokenizer's size up to it are
        padding (``None``). If the model's ``vocab_size`` is *smaller* than the
        tokenizer, the ids beyond it must all be special tokens (they are dropped);
        otherwise :class:`VocabularyError` is raised.

        EOS ids: the tokenizer's ``eos_token_id`` (if any), then ``eos_token_ids``
        (e.g. a generation config's extra stop tokens).

        Special tokens (``None``): added tokens flagged special, and the tokenizer's
        BOS/EOS/UNK ids. (The pad token is *not* treated as special on its own: some
        tokenizers alias it to an ordinary text token.)

        Cost: a few hundred milliseconds for a 150k vocabulary.
        """
        backend = _backend_of(tokenizer)
        if backend is not None:
            vocab = backend.get_vocab(with_added_tokens=True)
            added = dict(backend.get_added_tokens_decoder())
        else:
            get_vocab = getattr(tokenizer, "get_vocab", None)
            if get_vocab is None:
                raise VocabularyError(f"{type(tokenizer).__name__} is not a tokenizer "
                                      "(no get_vocab())")
            vocab = dict(get_vocab())
            added = dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        if not vocab:
            raise VocabularyError("the tokenizer has an empty vocabulary")

        scheme, byte_fallback = _detect_scheme(backend, vocab)

        n = max(vocab.values()) + 1
        strings: list[str | None] = [None] * n
        for s, i in vocab.items():
            strings[i] = s
        for i, tok in added.items():  # make sure added tokens are placed by their id
            if i >= n:
                strings.extend([None] * (i + 1 - n))
                n = i + 1
            strings[i] = str(tok)

        special: set[int] = {i for i, tok in added.items() if getattr(tok, "special", False)}
        for attr in ("bos_token_id", "eos_token_id", "unk_token_id"):
            value = getattr(tokenizer, attr, None)
            if isinstance(value, int):
                special.add(value)

        added_plain = {i: str(tok) for i, tok in added.items() if i not in special}
        table = _decode_strings(strings, scheme, byte_fallback, skip=special | set(added_plain))
        for i, content in added_plain.items():
            table[i] = content.encode("utf-8")
        for i in special:
            if i < n:
                table[i] = None

        size = n if vocab_size is None else int(vocab_size)
        if size < n:
            beyond = [i for i in range(size, n) if table[i] is not None]
            if beyond:
                raise VocabularyError(
                    f"model vocab_size {size} is smaller than the tokenizer ({n} ids) and "
                    f"ids {beyond[:5]} beyond it are ordinary tokens")
            table = table[:size]
            special = {i for i in special if i < size}

        eos: list[int] = []
        tok_eos = getattr(tokenizer, "eos_token_id", None)
        if isinstance(tok_eos, int):
            eos.append(tok_eos)
        eos.extend(int(i) for i in eos_token_ids)
        return cls(table, eos, size, special, scheme=scheme)

    def with_token_text(self, texts: dict[int, bytes | str]) -> Vocabulary:
        """A copy in which each id of ``texts`` (a special token, say) produces the given text:
        how a grammar treats a special token as a trigger -- e.g. Mistral's ``[TOOL_CALLS]``
        control token becomes the bytes ``[TOOL_CALLS]``, which a triggered grammar's trigger
        matches (the token and that text spelled by ordinary tokens then both open the region).
        Decoding the copy writes that text for the id. Raises :class:`VocabularyError` for an
        id outside the vocabulary or empty text."""
        table = list(self._token_bytes)
        specials = set(self._special)
        for i, text in texts.items():
            i = int(i)
            if not 0 <= i < self._size:
                raise VocabularyError(f"token id {i} outside 0..{self._size - 1}")
            data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
            if not data:
                raise VocabularyError(f"token {i}: the text must not be empty")
            table[i] = data
            specials.discard(i)
        return Vocabulary(table, self._eos, self._size, specials, scheme=self._scheme)

    # ------------------------------------------------------------------ basic API

    @property
    def token_bytes(self) -> tuple[bytes | None, ...]:
        """Per id, the bytes the token adds to the text, or None (never allowed)."""
        return self._token_bytes

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation (tokenizer EOS first, then any extras)."""
        return self._eos

    @property
    def vocab_size(self) -> int:
        """Number of token ids (rows of the model's logits), padding included."""
        return self._size

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of special/control tokens (all map to None; padding ids not included)."""
        return self._special

    @property
    def scheme(self) -> str:
        """``"byte_level"``, ``"sentencepiece"`` or ``"custom"`` (built from a table)."""
        return self._scheme

    def __len__(self) -> int:
        return self._size

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenate the bytes of ``ids``; ``None`` tokens (specials) add nothing.

        Raises :class:`VocabularyError` for an id outside ``0..vocab_size-1``.
        """
        tb = self._token_bytes
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self._size:
                raise VocabularyError(f"token id {i} outside 0..{self._size - 1}")
            b = tb[i]
            if b is not None:
                out.append(b)
        return b"".join(out)

    # ------------------------------------------------------------------ numpy views

    @property
    def lengths(self) -> NDArray[np.int32]:
        """int32 ``[vocab_size]``: byte length of each token, 0 for None. Read-only."""
        arr = self._cache.get("lengths")
        if arr is None:
            arr = np.fromiter((0 if b is None else len(b) for b in self._token_bytes),
                              dtype=np.int32, count=self._size)
            arr.setflags(write=False)
            self._cache["lengths"] = arr
        return arr

    @property
    def offsets(self) -> NDArray[np.int64]:
        """int64 ``[vocab_size + 1]``: token ``i``'s bytes are
        ``flat_bytes[offsets[i]:offsets[i + 1]]`` (CSR layout). Read-only."""
        arr = self._cache.get("offsets")
        if arr is None:
            arr = np.zeros(self._size + 1, dtype=np.int64)
            np.cumsum(self.lengths, out=arr[1:])
            arr.setflags(write=False)
            self._cache["offsets"] = arr
        return arr

    @property
    def flat_bytes(self) -> NDArray[np.uint8]:
        """uint8 ``[sum(lengths)]``: all token bytes concatenated in id order. Read-only."""
        arr = self._cache.get("flat_bytes")
        if arr is None:
            blob = b"".join(b for b in self._token_bytes if b is not None)
            arr = np.frombuffer(blob, dtype=np.uint8)  # read-only view of bytes
            self._cache["flat_bytes"] = arr
        return arr

    @property
    def ids_by_length(self) -> NDArray[np.int32]:
        """int32 ``[num_text_tokens]``: ids of tokens with bytes (None ids excluded),
        sorted by byte length ascending, ties by id. Read-only."""
        arr = self._cache.get("ids_by_length")
        if arr is None:
            lengths = self.lengths
            order = np.argsort(lengths, kind="stable").astype(np.int32)
            arr = order[lengths[order] > 0]
            arr.setflags(write=False)
            self._cache["ids_by_length"] = arr
        return arr

    @property
    def max_token_length(self) -> int:
        """Longest token in bytes (0 for a vocabulary with no text tokens)."""
        return int(self.lengths.max()) if self._size else 0

    @property
    def byte_matrix(self) -> NDArray[np.uint8]:
        """uint8 ``[vocab_size, max(1, max_token_length)]``: row ``i`` holds token ``i``'s
        bytes left-aligned, zero-padded (use :attr:`lengths` to know where they end;
        None tokens are all-zero rows of length 0). Read-only. Memory: V x L bytes
        (about 16 MB for Llama 3)."""
        arr = self._cache.get("byte_matrix")
        if arr is None:
            lengths = self.lengths
            width = max(1, self.max_token_length)
            arr = np.zeros((self._size, width), dtype=np.uint8)
            flat = self.flat_bytes
            if flat.size:
                starts = self.offsets[:-1]
                rows = np.repeat(np.arange(self._size, dtype=np.int64), lengths)
                cols = np.arange(flat.size, dtype=np.int64) - np.repeat(starts, lengths)
                arr[rows, cols] = flat
            arr.setflags(write=False)
            self._cache["byte_matrix"] = arr
        return arr

    @property
    def content_hash(self) -> str:
        """Hex sha256 of (vocab_size, every entry with None distinguished from bytes, EOS
        ids). Stable across processes and versions of Python/numpy; use as a cache key."""
        h = self._cache.get("content_hash")
        if h is None:
            marks = np.fromiter((-1 if b is None else len(b) for b in self._token_bytes),
                                dtype="<i4", count=self._size)
            d = hashlib.sha256(b"structgen.vocab.v1\0")
            d.update(np.array([self._size, len(self._eos)], dtype="<i8").tobytes())
            d.update(marks.tobytes())
            d.update(self.flat_bytes.tobytes())
            d.update(np.array(self._eos, dtype="<i8").tobytes())
            h = d.hexdigest()
            self._cache["content_hash"] = h
        return h

    # ------------------------------------------------------------------ dunder

    def __getstate__(self) -> _State:
        return {"token_bytes": self._token_bytes, "eos": self._eos, "special": self._special,
                "size": self._size, "scheme": self._scheme}

    def __setstate__(self, state: _State) -> None:
        self._token_bytes = state["token_bytes"]
        self._eos = state["eos"]
        self._special = state["special"]
        self._size = state["size"]
        self._scheme = state["scheme"]
        self._cache = {}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        if self is other:
            return True
        a, b = self._cache.get("content_hash"), other._cache.get("content_hash")
        if a is not None and b is not None:  # both known (a dict lookup hashed them): compare those
            return bool(a == b)
        return (self._size == other._size and self._eos == other._eos
                and self._token_bytes == other._token_bytes)

    def __hash__(self) -> int:
        return hash(self.content_hash)

    def __repr__(self) -> str:
        text = int(np.count_nonzero(self.lengths))
        return (f"Vocabulary(scheme={self._scheme!r}, vocab_size={self._size}, "
                f"text_tokens={text}, eos_token_ids={self._eos})")


class _State(TypedDict):
    """A pickled :class:`Vocabulary`."""

    token_bytes: tuple[bytes | None, ...]
    eos: tuple[int, ...]
    special: frozenset[int]
    size: int
    scheme: str


class VocabLike(Protocol):
    """What the masks read of a vocabulary: a :class:`Vocabulary`, or any object with these
    attributes (a ``content_hash`` string, when present, keys its caches)."""

    @property
    def token_bytes(self) -> Sequence[bytes | None]:
        """Per id, the bytes the token adds to the text, or None (never allowed)."""

    @property
    def eos_token_ids(self) -> Iterable[int]:
        """Ids that end generation."""

    @property
    def vocab_size(self) -> int:
        """Number of token ids, padding included."""


@runtime_checkable
class FlatVocabLike(VocabLike, Protocol):
    """A :class:`VocabLike` that also has :class:`Vocabulary`'s flat numpy views (the mask
    engine then builds its tables from them)."""

    @property
    def lengths(self) -> ArrayLike:
        """Byte length of each token, 0 for None."""

    @property
    def offsets(self) -> ArrayLike:
        """Where each token's bytes start in :attr:`flat_bytes` (``vocab_size + 1`` entries)."""

    @property
    def flat_bytes(self) -> ArrayLike:
        """All token bytes concatenated in id order."""


# ---------------------------------------------------------------------- helpers

def _backend_of(tokenizer: object) -> Tokenizer | None:
    """The ``tokenizers.Tokenizer`` behind a fast HF tokenizer, the object itself if it
    is one, else None."""
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - tokenizers ships with transformers
        return None
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    backend = getattr(tokenizer, "_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


def _decoder_types(node: JsonValue) -> list[JsonObject]:
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        out: list[JsonObject] = []
        children = node.get("decoders", [])
        for child in children if isinstance(children, list) else []:
            out.extend(_decoder_types(child))
        return out
    return [node]


def _is_space_replace(node: JsonObject) -> bool:
    """Whether a decoder node is SentencePiece's ``Replace('▁', ' ')``."""
    pattern = node.get("pattern", {})
    return (node.get("type") == "Replace" and isinstance(pattern, dict) and pattern.get("String") == _SP_SPACE
            and node.get("content") == " ")


def _detect_scheme(backend: Tokenizer | None, vocab: dict[str, int]) -> tuple[str, bool]:
    """Return ``(scheme, byte_fallback)`` from the backend decoder, else from content."""
    if backend is not None and backend.decoder is not None:
        nodes = _decoder_types(json.loads(backend.decoder.__getstate__()))
        types = [n.get("type") for n in nodes]
        if "ByteLevel" in types:
            return "byte_level", False
        sp_replace = any(_is_space_replace(n) for n in nodes)
        if "Metaspace" in types or sp_replace:
            fallback = "ByteFallback" in types or bool(getattr(backend.model, "byte_fallback",
                                                               False))
            return "sentencepiece", fallback
        raise VocabularyError(
            f"unsupported tokenizer decoder {types}: only byte-level BPE (ByteLevel) and "
            "SentencePiece-style (Metaspace / Replace('\u2581', ' ') [+ ByteFallback]) "
            "vocabularies can be mapped to exact bytes")
    # No backend decoder: judge by the vocabulary content.
    strings = list(vocab)
    total = len(strings)
    alphabet = set(unicode_to_byte())
    if "\u0120" in alphabet and sum(1 for s in strings if "\u0120" in s) * 50 >= total:
        single = {s for s in strings if len(s) == 1}
        if alphabet <= single:
            return "byte_level", False
    if sum(1 for s in strings if _SP_SPACE in s) * 50 >= total:
        return "sentencepiece", "<0x0A>" in vocab
    raise VocabularyError(
        "cannot tell how this tokenizer spells bytes: no tokenizers backend decoder, and "
        "the vocabulary looks neither byte-level (GPT-2 alphabet) nor SentencePiece (\u2581)")


def _decode_strings(strings: list[str | None], scheme: str, byte_fallback: bool,
                    skip: set[int]) -> list[bytes | None]:
    """Token strings -> bytes for the detected scheme; ids in ``skip`` are left None."""
    n = len(strings)
    out: list[bytes | None] = [None] * n
    ids = [i for i in range(n) if strings[i] is not None and i not in skip]
    if scheme == "byte_level":
        parts = [strings[i] for i in ids]
        joined = "".join(parts).translate(_BYTE_LEVEL_TRANSLATE)  # type: ignore[arg-type]
        try:
            blob = joined.encode("latin-1")
        except UnicodeEncodeError:
            blob = None
        if blob is not None:  # fast path: every character is in the alphabet
            pos = 0
            for i, s in zip(ids, parts):
                end = pos + len(s)  # type: ignore[arg-type]
                out[i] = blob[pos:end]
                pos = end
        else:
            for i in ids:
                out[i] = _byte_level_token(strings[i])  # type: ignore[arg-type]
        return out
    # SentencePiece
    for i in ids:
        s = strings[i]
        assert s is not None
        if byte_fallback and len(s) == 6:
            m = _BYTE_FALLBACK_RE.fullmatch(s)
            if m:
                out[i] = bytes([int(m.group(1), 16)])
                continue
        out[i] = s.replace(_SP_SPACE, " ").encode("utf-8")
    return out


def _byte_level_token(s: str) -> bytes:
    """One byte-level token string -> bytes, as the ``tokenizers`` ByteLevel decoder
    does: if any character is outside the alphabet, the token's UTF-8 text is used."""
    t = s.translate(_BYTE_LEVEL_TRANSLATE)
    try:
        return t.encode("latin-1")
    except UnicodeEncodeError:
        return s.encode("utf-8")
