"""Matcher and automaton against brute-force oracles.

The oracle never uses the code under test: languages are enumerated with the IR's
naive reference interpreter (``ir.reference_accepts``) over every string of a small
alphabet, and a token is allowed iff prefix + token bytes is a prefix of some string of
the language (and EOS iff the prefix itself is in the language).
"""

from __future__ import annotations

import itertools
import pickle
import random

import numpy as np
import pytest
from _toy_vocab import ToyVocab
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from structgen.config import CompileOptions
from structgen.errors import CompileLimitError, GrammarError
from structgen.grammar import ir
from structgen.grammar.compiler import compile_grammar
from structgen.kernels.bitmask import allocate_bitmask
from structgen.masks.matcher import Matcher

ALPHABET = b"abc"
MAXLEN = 6




def toy_vocab(tokens: list[bytes], pad: int = 3) -> ToyVocab:
    tb: list[bytes | None] = list(tokens) + [None]  # EOS
    eos = len(tb) - 1
    return ToyVocab(tb, (eos,), len(tb) + pad)


# -- strategies ---------------------------------------------------------------

def _maxlen(e: ir.Expr) -> float:
    if isinstance(e, ir.ByteSet):
        return 1
    if isinstance(e, ir.Seq):
        return sum(_maxlen(x) for x in e.items)
    if isinstance(e, ir.Alt):
        return max((_maxlen(x) for x in e.items), default=0)
    if isinstance(e, ir.Repeat):
        return float("inf") if e.max is None else e.max * _maxlen(e.item)
    if isinstance(e, (ir.And, ir.Diff)):
        return _maxlen(e.left)
    raise TypeError(e)


byte_sets = st.sets(st.sampled_from(list(ALPHABET)), min_size=1, max_size=3).map(lambda s: ir.byteset(s))


def exprs(max_leaves: int = 8) -> st.SearchStrategy[ir.Expr]:
    def extend(children: st.SearchStrategy[ir.Expr]) -> st.SearchStrategy[ir.Expr]:
        return st.one_of(
            st.lists(children, min_size=2, max_size=3).map(lambda xs: ir.seq(*xs)),
            st.lists(children, min_size=2, max_size=3).map(lambda xs: ir.alt(*xs)),
            st.tuples(children, st.integers(0, 2), st.integers(0, 2)).map(
                lambda t: ir.rep(t[0], min(t[1], t[2]), max(t[1], t[2]))),
            st.tuples(children, children).map(lambda t: ir.and_(t[0], t[1])),
            st.tuples(children, children).map(lambda t: ir.diff(t[0], t[1])),
        )
    leaves = st.one_of(byte_sets, st.sampled_from([b"a", b"ab", b"ca", b"bcb"]).map(ir.lit))
    return st.recursive(leaves, extend, max_leaves=max_leaves)


def language(g: ir.Grammar) -> set[bytes]:
    out = set()
    for n in range(MAXLEN + 1):
        for tup in itertools.product(ALPHABET, repeat=n):
            s = bytes(tup)
            if ir.reference_accepts(g, s):
                out.add(s)
    return out


def oracle_mask(lang: set[bytes], prefix: bytes, vocab: ToyVocab) -> set[int]:
    prefixes = {s[:i] for s in lang for i in range(len(s) + 1)}
    allowed = set()
    for tid, tb in enumerate(vocab.token_bytes):
        if tb is None:
            if tid in vocab.eos_token_ids and prefix in lang:
                allowed.add(tid)
        elif prefix + tb in prefixes:
            allowed.add(tid)
    return allowed


TOKENS = [b"a", b"b", b"c", b"ab", b"ba", b"ca", b"abc", b"cc", b"bcb", b"aaa", b"cab"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(e=exprs(), walk=st.lists(st.integers(0, 1000), min_size=0, max_size=6))
def test_masks_equal_brute_force(e: ir.Expr, walk: list[int]) -> None:
    assume(_maxlen(e) <= MAXLEN)
    g = ir.Grammar({"s": e}, "s")
    lang = language(g)
    assume(lang)
    cg = compile_grammar(g)
    vocab = toy_vocab(TOKENS)
    m = Matcher(cg, vocab)
    prefix = b""
    history: list[bytes] = [b""]
    for choice in walk:
        allowed = oracle_mask(lang, prefix, vocab)
        assert set(m.allowed_token_ids()) == allowed, (prefix, e)
        assert m.is_accepting() == (prefix in lang)
        text_tokens = sorted(t for t in allowed if vocab.token_bytes[t] is not None)
        if not text_tokens:
            break
        tid = text_tokens[choice % len(text_tokens)]
        assert m.accept_token(tid)
        prefix += vocab.token_bytes[tid]
        history.append(prefix)
    # disallowed tokens are rejected without changing state
    before = m.num_accepted
    for tid, tb in enumerate(vocab.token_bytes):
        if tb is not None and tid not in oracle_mask(lang, prefix, vocab):
            assert not m.accept_token(tid)
    assert m.num_accepted == before
    # grammar as validator
    for s in lang:
        assert cg.accepts(s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(e=exprs(), toks=st.lists(st.integers(0, len(TOKENS) - 1), min_size=1, max_size=8),
       back=st.integers(0, 8))
def test_rollback_and_validate_agree_with_replay(e: ir.Expr, toks: list[int], back: int) -> None:
    g = ir.Grammar({"s": e}, "s")
    try:
        cg = compile_grammar(g)
    except GrammarError:
        return  # empty language
    vocab = toy_vocab(TOKENS)
    m = Matcher(cg, vocab)
    f = m.fork()
    n_valid = m.validate_tokens(toks)
    n_acc = f.accept_tokens(toks)
    assert n_valid == n_acc
    assert m.num_accepted == 0  # validate does not advance
    back = min(back, n_acc)
    f.rollback(back)
    replay = Matcher(cg, vocab)
    assert replay.accept_tokens(toks[: n_acc - back]) == n_acc - back
    assert f.allowed_token_ids() == replay.allowed_token_ids()
    assert f.is_accepting() == replay.is_accepting()


def dyck_grammar() -> ir.Grammar:
    # s := "[" (s ("," s)*)? "]"
    return ir.Grammar({"s": ir.seq(ir.lit("["), ir.opt(ir.seq(ir.ref("s"), ir.star(
        ir.seq(ir.lit(","), ir.ref("s"))))), ir.lit("]"))}, "s")


def dyck_viable(p: bytes) -> tuple[bool, bool]:
    """(is a viable prefix, is complete) for the nested-list language, by hand."""
    depth = 0
    prev = None
    if not p:
        return True, False
    if p[:1] != b"[":
        return False, False
    for i, ch in enumerate(p):
        c = bytes([ch])
        if c == b"[":
            if prev not in (None, b"[", b","):
                return False, False
            depth += 1
        elif c == b"]":
            if prev not in (b"[", b"]") or depth == 0:
                return False, False
            depth -= 1
            if depth == 0 and i != len(p) - 1:
                return False, False
        elif c == b",":
            if prev != b"]" or depth == 0:
                return False, False
        else:
            return False, False
        prev = c
    return True, depth == 0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([b"[", b"]", b",", b"[[", b"]]", b"],", b",[", b"[]", b"x"]), max_size=12))
def test_recursive_grammar_masks(pieces: list[bytes]) -> None:
    cg = compile_grammar(dyck_grammar())
    toks = [b"[", b"]", b",", b"[[", b"]]", b"],", b",[", b"[]", b"]]]", b"x", b"[],["]
    vocab = toy_vocab(toks)
    m = Matcher(cg, vocab)
    prefix = b""
    for piece in pieces:
        allowed = set(m.allowed_token_ids())
        for tid, tb in enumerate(vocab.token_bytes):
            if tb is None:
                assert (tid in allowed) == dyck_viable(prefix)[1]
            else:
                assert (tid in allowed) == dyck_viable(prefix + tb)[0], (prefix, tb)
        tid = toks.index(piece)
        ok = m.accept_token(tid)
        assert ok == dyck_viable(prefix + piece)[0]
        if ok:
            prefix += piece


def test_eos_and_termination() -> None:
    cg = compile_grammar(ir.Grammar({"s": ir.lit("ab")}, "s"))
    vocab = toy_vocab([b"a", b"b", b"ab"])
    eos = vocab.eos_token_ids[0]
    m = Matcher(cg, vocab)
    assert not m.accept_token(eos)
    assert m.forced_bytes() == b"ab"
    assert m.forced_tokens() == [2]
    assert m.accept_token(0) and not m.is_accepting()
    assert m.accept_token(1) and m.is_accepting() and not m.is_terminated()
    assert m.allowed_token_ids() == [eos]
    assert m.accept_token(eos) and m.is_terminated()
    assert not m.accept_token(0)
    m.rollback(1)
    assert not m.is_terminated() and m.is_accepting()
    with pytest.raises(ValueError):
        m.rollback(5)
    # padding ids beyond the tokenizer are never allowed
    assert all(t < len(vocab.token_bytes) for t in m.allowed_token_ids())
    assert not m.accept_token(vocab.vocab_size - 1)


def test_fill_bitmask_packs_bits() -> None:
    cg = compile_grammar(ir.Grammar({"s": ir.plus(ir.byteset([ord("a")]))}, "s"))
    toks = [bytes([97 + (i % 3)]) * (1 + i // 3) for i in range(70)]  # a, b, c, aa, bb, ...
    vocab = toy_vocab(toks)
    m = Matcher(cg, vocab)
    bm = allocate_bitmask(2, vocab.vocab_size)
    m.fill_bitmask(bm, row=1)
    words = bm[1].numpy().view(np.uint32)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    expect = {i for i, t in enumerate(toks) if set(t) == {97}}
    assert set(np.nonzero(bits)[0].tolist()) == expect
    assert (bm[0] == -1).all()  # other rows untouched


@pytest.mark.parametrize("kind", ["torch", "numpy", "threads"])
def test_fill_bitmasks_batch_equals_oracle(kind: str) -> None:
    """Many matchers (two grammars, several states, a stopped row) into one bitmask, rows in
    a scattered order: every row is its matcher's mask by the hand-written Dyck oracle and
    the ``a+`` rule; a None matcher's row is all ones; rows not named stay untouched."""
    from concurrent.futures import ThreadPoolExecutor

    from structgen.masks.matcher import fill_bitmasks

    toks = [b"[", b"]", b",", b"[[", b"]]", b"],", b",[", b"[]", b"a", b"aa", b"a]"]
    vocab = toy_vocab(toks)
    eos = vocab.eos_token_ids[0]
    dyck = compile_grammar(dyck_grammar())
    plus_a = compile_grammar(ir.Grammar({"s": ir.plus(ir.byteset([ord("a")]))}, "s"))
    prefixes = [b"", b"[", b"[[]", b"[[],[]]", b"[["]
    ms: list[Matcher | None] = []
    expect: list[set[int] | None] = []
    for p in prefixes:
        m = Matcher(dyck, vocab)
        for ch in p:
            assert m.accept_token(toks.index(bytes([ch])))
        ms.append(m)
        ok = {t for t, tb in enumerate(toks) if dyck_viable(p + tb)[0]}
        expect.append(ok | ({eos} if dyck_viable(p)[1] else set()))
    for p in (b"", b"aa"):
        m = Matcher(plus_a, vocab)
        for _ in p:
            assert m.accept_token(toks.index(b"a"))
        ms.append(m)
        expect.append({t for t, tb in enumerate(toks) if set(tb) == {97}} | ({eos} if p else set()))
    ms.append(None)
    expect.append(None)
    rows = [7, 0, 3, 8, 1, 5, 2, 9]  # row 4 and 6 not named
    n_rows = 10
    if kind == "numpy":
        bm = np.full((n_rows, (vocab.vocab_size + 31) // 32), 12345, dtype=np.int32)
    else:
        bm = allocate_bitmask(n_rows, vocab.vocab_size)
        bm[4] = 12345
        bm[6] = 12345
    if kind == "threads":
        with ThreadPoolExecutor(2) as ex:
            fill_bitmasks(ms, bm, rows, executor=ex)
            fill_bitmasks(ms, bm, rows, executor=ex)  # second time: every mask cached
    else:
        fill_bitmasks(ms, bm, rows)
    arr = bm if isinstance(bm, np.ndarray) else bm.numpy()
    for r, want in zip(rows, expect):
        bits = np.unpackbits(arr[r].view(np.uint8), bitorder="little")
        if want is None:
            assert bits.all()
        else:
            assert set(np.nonzero(bits)[0].tolist()) == want, r
    assert (arr[4] == 12345).all() and (arr[6] == 12345).all()
    with pytest.raises(ValueError):
        fill_bitmasks(ms, bm, rows[:-1])


def test_compiled_grammar_identity_and_pickle() -> None:
    g = dyck_grammar()
    a = compile_grammar(g)
    b = compile_grammar(dyck_grammar())
    assert a is b  # content cache
    c = pickle.loads(pickle.dumps(a))
    assert c == a and hash(c) == hash(a)
    assert c.accepts("[[],[]]") and not c.accepts("[[]")


def test_compile_limits() -> None:
    # an item that is a prefix of another item cannot be counted: the repetition unrolls
    big = ir.Grammar({"s": ir.rep(ir.alt(ir.lit("a"), ir.lit("ab")), 0, 5000)}, "s")
    with pytest.raises(CompileLimitError):
        compile_grammar(big, CompileOptions(max_states=1000))
    with pytest.raises(GrammarError):
        compile_grammar(ir.Grammar({"s": ir.ref("missing")}, "s"))
    with pytest.raises(GrammarError):
        compile_grammar(ir.Grammar({"s": ir.NEVER}, "s"))
    # intersection over a recursive rule is not regular
    rec = dyck_grammar().rules["s"]
    with pytest.raises(GrammarError):
        compile_grammar(ir.Grammar({"s": rec, "t": ir.and_(ir.ref("s"), ir.lit("[]"))}, "t"))


def test_duck_typed_vocabularies_are_keyed_by_content() -> None:
    """A vocabulary without ``content_hash`` must not be keyed by ``id()``: ids are reused
    after collection, and keys outlive the vocabulary in shared caches (engine mask caches,
    the compiled-walk trie), so a new vocabulary could be served an old one's masks."""
    import gc

    from structgen.masks.matcher import vocab_table

    cg = compile_grammar(ir.Grammar({"s": ir.alt(ir.lit("ab"), ir.lit("cd"))}, "s"))
    for i in range(30):
        toks = [b"ab", b"a", b"b"] if i % 2 else [b"cd", b"c", b"d"]
        v = toy_vocab(toks)
        m = Matcher(cg, v)
        assert set(m.allowed_token_ids()) == {0, 1}, (i, toks)
        assert vocab_table(v).key == vocab_table(toy_vocab(list(toks))).key
        del m, v
        gc.collect()


@pytest.mark.parametrize("lo,hi", [(0, 5000), (3, 400), (1000, 1000)])
def test_counted_repetition_is_compact_and_exact(lo: int, hi: int) -> None:
    """A bounded repetition of a prefix-free item compiles to one counted rule (a few states,
    not ``hi`` unrolled copies) that accepts exactly ``lo..hi`` items; the oracle is the
    IR's reference semantics."""
    item = ir.alt(ir.lit("ab"), ir.lit("cd"), ir.seq(ir.lit("x"), ir.rep(ir.lit("y"), 0, 2), ir.lit("z")))
    e = ir.rep(item, lo, hi)
    g = compile_grammar(ir.Grammar({"s": e}, "s"), CompileOptions(max_states=1000))
    assert any(type(r).__name__ == "CountedRule" for r in g.rules)
    pieces = ["ab", "cd", "xz", "xyz", "xyyz"]
    rng = random.Random(lo * 7919 + hi)
    for n in sorted({0, 1, lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, rng.randint(0, hi + 3)}):
        if n < 0:
            continue
        text = "".join(rng.choice(pieces) for _ in range(n))
        assert g.accepts(text) == (lo <= n <= hi), n
        if n <= 12:
            assert g.accepts(text) == ir.reference_accepts(ir.Grammar({"s": e}, "s"), text)
        if n > 0:
            assert not g.accepts(text + "x")  # an unfinished item
