"""Hardening of the engine layer (issue 26): matcher misuse is a typed error, deep input is
a typed error or handled without recursion, and matching stays within a memory budget
while staying exact.

Oracles: Python's ``re`` for regular languages, ``json`` for instances, brute force for
token masks; memory bounds are checked in a subprocess under ``resource`` limits so this
process cannot blow up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import structgen
from structgen import ir
from structgen.automaton import compile_grammar
from structgen.errors import MatcherUsageError, StructgenError
from structgen.matcher import Matcher, allocate_bitmask, bitmask_words, fill_bitmasks

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ToyVocab:
    token_bytes: list
    eos_token_ids: tuple = ()
    vocab_size: int = 0
    content_hash: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.vocab_size:
            self.vocab_size = len(self.token_bytes)


def _ab_matcher(**kw: object) -> tuple[Matcher, ToyVocab]:
    """A matcher of ``a+b`` over the tokens a, b, ab, EOS (40 ids: two bitmask words)."""
    cg = compile_grammar(ir.Grammar({"s": ir.seq(ir.plus(ir.lit(b"a")), ir.lit(b"b"))}, "s"))
    tb: list[bytes | None] = [b"a", b"b", b"ab", None] + [b"zz"] * 36
    vocab = ToyVocab(tb, (3,), 40)
    return Matcher(cg, vocab, **kw), vocab  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# 11. Matcher misuse
# ---------------------------------------------------------------------------------------------

def test_matcher_usage_error_is_typed_and_exported() -> None:
    assert issubclass(MatcherUsageError, StructgenError)
    assert issubclass(MatcherUsageError, ValueError) and issubclass(MatcherUsageError, TypeError)
    assert structgen.MatcherUsageError is MatcherUsageError
    assert "MatcherUsageError" in structgen.__all__


@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.int64, np.uint32, np.float32])
def test_fill_bitmask_rejects_wrong_numpy_dtype(dtype: type) -> None:
    m, vocab = _ab_matcher()
    bm = np.full((2, bitmask_words(vocab.vocab_size)), 7, dtype=dtype)
    with pytest.raises(MatcherUsageError, match="int32"):
        m.fill_bitmask(bm, 0)
    assert (bm == 7).all()  # nothing written


def test_fill_bitmask_rejects_wrong_torch_dtype() -> None:
    torch = pytest.importorskip("torch")
    m, vocab = _ab_matcher()
    for dt in (torch.int16, torch.uint8, torch.int64, torch.float32):
        bm = torch.zeros((2, bitmask_words(vocab.vocab_size)), dtype=dt)
        with pytest.raises(MatcherUsageError, match="int32"):
            m.fill_bitmask(bm, 0)
        assert (bm == 0).all()


@pytest.mark.parametrize("row", [-1, -2, 2, 100, 1.0, True, "0", None])
def test_fill_bitmask_rejects_bad_rows(row: object) -> None:
    m, vocab = _ab_matcher()
    bm = np.full((2, bitmask_words(vocab.vocab_size)), -1, dtype=np.int32)
    with pytest.raises(MatcherUsageError):
        m.fill_bitmask(bm, row)  # type: ignore[arg-type]
    assert (bm == -1).all()  # row=-1 used to write the last row


def test_fill_bitmask_rejects_bad_shapes_and_objects() -> None:
    m, vocab = _ab_matcher()
    w = bitmask_words(vocab.vocab_size)
    bad = [np.full((w,), -1, np.int32), np.full((2, w - 1), -1, np.int32),
           np.full((2, w, 1), -1, np.int32), [[-1] * w], "bitmask", None]
    for bm in bad:
        with pytest.raises(MatcherUsageError):
            m.fill_bitmask(bm, 0)
    ro = np.full((1, w), -1, np.int32)
    ro.flags.writeable = False
    with pytest.raises(MatcherUsageError, match="read-only"):
        m.fill_bitmask(ro, 0)


def _bits(words: np.ndarray) -> set[int]:
    bits = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")
    return set(np.nonzero(bits)[0].tolist())


def test_fill_bitmask_zeroes_extra_columns_numpy_torch_and_batch() -> None:
    torch = pytest.importorskip("torch")
    m, vocab = _ab_matcher()
    w = bitmask_words(vocab.vocab_size)
    expect = {0, 2}  # a, ab (b needs an a first; EOS not yet)
    bm = np.full((3, w + 3), -1, dtype=np.int32)  # a model whose logits are wider
    m.fill_bitmask(bm, 1)
    assert _bits(bm[1]) == expect
    assert (bm[1, w:] == 0).all() and (bm[0] == -1).all() and (bm[2] == -1).all()
    tb = torch.full((3, w + 3), -1, dtype=torch.int32)
    m.fill_bitmask(tb, 2)
    assert _bits(tb[2].numpy()) == expect and (tb[2, w:] == 0).all() and (tb[:2] == -1).all()
    # non-contiguous (a column slice of a wider tensor) is written correctly too
    big = torch.full((2, 2 * (w + 1)), -1, dtype=torch.int32)
    view = big[:, ::2]
    m.fill_bitmask(view, 0)
    assert _bits(view[0].contiguous().numpy()) == expect and (big[0, 1::2] == -1).all()
    # the batch path: extra columns zeroed for matchers, all ones for a None matcher
    bb = np.full((2, w + 2), 5, dtype=np.int32)
    fill_bitmasks([m, None], bb)
    assert _bits(bb[0]) == expect and (bb[0, w:] == 0).all() and (bb[1] == -1).all()


def test_fill_bitmasks_rejects_misuse() -> None:
    m, vocab = _ab_matcher()
    w = bitmask_words(vocab.vocab_size)
    bm = np.zeros((2, w), dtype=np.int32)
    with pytest.raises(MatcherUsageError):
        fill_bitmasks([m], bm, [-1])
    with pytest.raises(MatcherUsageError):
        fill_bitmasks([m], bm, [2])
    with pytest.raises(MatcherUsageError):
        fill_bitmasks([m, m], bm, [0, 0])
    with pytest.raises(MatcherUsageError):
        fill_bitmasks([m], np.zeros((2, w), dtype=np.int16))
    with pytest.raises(MatcherUsageError):
        fill_bitmasks(["not a matcher"], bm)
    with pytest.raises(ValueError):  # a MatcherUsageError, still a ValueError for old callers
        fill_bitmasks([m, m], bm, [0])


@pytest.mark.parametrize("bad", [-1, -10])
def test_negative_max_rollback_is_rejected(bad: int) -> None:
    with pytest.raises(MatcherUsageError, match="max_rollback"):
        _ab_matcher(max_rollback=bad)


def test_max_rollback_bounds_history() -> None:
    m, _ = _ab_matcher(max_rollback=0)
    assert m.accept_token(0) and m.accept_token(0)
    assert m.num_accepted == 0
    with pytest.raises(MatcherUsageError):
        m.rollback(1)
    with pytest.raises(MatcherUsageError):
        _ab_matcher(max_rollback=1.5)  # type: ignore[arg-type]


def test_rollback_misuse() -> None:
    m, _ = _ab_matcher()
    assert m.accept_token(0)
    for n in (-1, 2, 1.0, "1"):
        with pytest.raises(MatcherUsageError):
            m.rollback(n)  # type: ignore[arg-type]
    assert m.num_accepted == 1
    m.rollback(np.int64(1))
    assert m.num_accepted == 0


def test_token_ids_outside_the_vocabulary_are_typed_errors() -> None:
    m, vocab = _ab_matcher()
    for bad in (-1, vocab.vocab_size, 10**12):
        with pytest.raises(MatcherUsageError, match="outside the vocabulary"):
            m.accept_token(bad)
        with pytest.raises(MatcherUsageError):
            m.is_token_allowed(bad)
        with pytest.raises(MatcherUsageError):
            m.validate_tokens([0, bad])
    for bad in (1.7, "0", None, True):
        with pytest.raises(MatcherUsageError):
            m.accept_token(bad)  # type: ignore[arg-type]
    assert m.num_accepted == 0
    # grammar-forbidden ids in range are a verdict, not an error
    assert m.accept_token(1) is False
    assert m.accept_token(np.int32(0)) is True


def test_allocate_bitmask_arguments() -> None:
    pytest.importorskip("torch")
    for rows, v in ((-1, 10), (1, 0), (1, -5), (1.5, 10), (1, "10")):
        with pytest.raises(MatcherUsageError):
            allocate_bitmask(rows, v)  # type: ignore[arg-type]
    assert tuple(allocate_bitmask(2, 33).shape) == (2, 2)


def test_matcher_needs_a_compiled_grammar() -> None:
    _, vocab = _ab_matcher()
    with pytest.raises(MatcherUsageError):
        Matcher("a+b", vocab)  # type: ignore[arg-type]
