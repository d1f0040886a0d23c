"""Token masks over slices of real tokenizer vocabularies against independent oracles.

* Regular grammars: the third-party ``regex`` module's partial matching decides whether a
  byte string is a viable prefix of a pattern (``regex.fullmatch(p, s, partial=True)``);
  a token is allowed iff prefix + token is viable. Patterns are ASCII with positive
  classes only, so byte and code-point semantics coincide.
* Recursive grammars: brute force over the vocabulary slice, one token at a time, with a
  hand-written viability check of the nested-list language.
"""

from __future__ import annotations

import random

import pytest
import regex as re_oracle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen.frontends.regex import compile_regex
from structgen.grammar import ir
from structgen.grammar.compiler import compile_grammar
from structgen.masks import trie as native
from structgen.masks.engine import engine_for
from structgen.masks.matcher import Matcher
from structgen.masks.vocab import Vocabulary

pytestmark = pytest.mark.assets

ALIASES = ["llama3", "qwen2", "gpt2", "mistral"]


@pytest.fixture(params=["default", "split", "deep-split", "numpy"])
def engine_mode(request, monkeypatch) -> str:
    """Run a test on each mask path: the default (compiled walks when numba is present,
    counted-repetition positions from item runs), rooted split walks taken for every
    configuration of several stacks (by default a configuration whose stacks are mostly not
    yet split is walked whole; counted positions walked too), the same forced to take more
    stack frames (any undecided token triggers a deeper top), and the numpy walks."""
    from collections import OrderedDict

    from structgen.frontends.json_schema import compiler as json_schema
    from structgen.grammar import compiler
    from structgen.masks import engine

    # fresh compiled grammars (each has its own engine, which reads the mode when built)
    monkeypatch.setattr(compiler, "_CACHE", OrderedDict())
    monkeypatch.setattr(json_schema, "_CACHE", OrderedDict())
    if request.param in ("split", "deep-split"):
        monkeypatch.setattr(engine, "_SPLIT_COLD_MAX", 1 << 30)
        monkeypatch.setattr(engine, "_COUNTED_MASKS", False)
    if request.param == "deep-split":
        monkeypatch.setattr(engine, "_WALK_IDS_MAX", 1)
    elif request.param == "numpy":
        monkeypatch.setattr(engine.native, "available", lambda: False)
    return request.param


_FULL_VOCABS: dict[int, tuple[object, Vocabulary]] = {}


def _full_vocab(tokenizer) -> Vocabulary:
    """``Vocabulary.from_tokenizer(tokenizer)``, built once per tokenizer (the tests only read it;
    a 128k-token table takes about half a second, and the property tests slice it per example)."""
    got = _FULL_VOCABS.get(id(tokenizer))
    if got is None:
        got = _FULL_VOCABS[id(tokenizer)] = (tokenizer, Vocabulary.from_tokenizer(tokenizer))
    return got[1]


def _slice_vocab(tokenizer, n: int, seed: int, must: bytes = b"") -> Vocabulary:
    """A vocabulary with a random slice of the real token table (other ids -> None)."""
    full = _full_vocab(tokenizer)
    rng = random.Random(seed)
    ids = [i for i, b in enumerate(full.token_bytes) if b is not None]
    keep = set(rng.sample(ids, min(n, len(ids))))
    # make sure short tokens over the pattern alphabet are present so walks can progress
    for i, b in enumerate(full.token_bytes):
        if b is not None and len(b) <= 3 and must and all(c in must for c in b):
            keep.add(i)
    table = [b if i in keep else None for i, b in enumerate(full.token_bytes)]
    return Vocabulary(table, full.eos_token_ids, full.vocab_size)


# control bytes after text (and text that reads them or not) exercise the slice walks' rejection of
# "plain text, then a control byte" tokens (structgen.masks._walk_kernels.slice_from answering 3)
ATOMS = ["a", "b", "ab", "ba", "[ab]", "[a-c]", "c", "[0-9]", "x", " ", '"', ",", "[ -~]", "[ -!#-~]",
         "\\n", "[\\t-\\r -~]"]


def patterns() -> st.SearchStrategy[str]:
    leaf = st.sampled_from(ATOMS)

    def ext(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.lists(children, min_size=2, max_size=3).map("".join),
            st.lists(children, min_size=2, max_size=3).map(lambda xs: "(?:" + "|".join(xs) + ")"),
            st.tuples(children, st.sampled_from(["*", "+", "?", "{1,3}", "{2}"])).map(
                lambda t: "(?:" + t[0] + ")" + t[1]),
        )
    return st.recursive(leaf, ext, max_leaves=6)


@pytest.mark.parametrize("alias", ALIASES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(pattern=patterns(), seed=st.integers(0, 10**6), walk=st.lists(st.integers(0, 10**6), max_size=5))
def test_regex_masks_equal_partial_match_oracle(tokenizer_by_alias, alias: str, pattern: str,
                                                seed: int, walk: list[int]) -> None:
    tok = tokenizer_by_alias(alias)
    vocab = _slice_vocab(tok, 3000, seed, must=b'abcx0123456789 ",\n')
    cg = compile_grammar(ir.Grammar({"s": compile_regex(pattern)}, "s"))
    oracle = re_oracle.compile(pattern.encode())
    m = Matcher(cg, vocab)
    prefix = b""
    for choice in [*walk, None]:
        allowed = set(m.allowed_token_ids())
        expect = set()
        for i, b in enumerate(vocab.token_bytes):
            if b is not None and oracle.fullmatch(prefix + b, partial=True) is not None:
                expect.add(i)
        if oracle.fullmatch(prefix) is not None:
            expect.update(vocab.eos_token_ids)
        assert allowed == expect, (pattern, prefix)
        text = sorted(t for t in allowed if vocab.token_bytes[t] is not None)
        if choice is None or not text:
            break
        t = text[choice % len(text)]
        assert m.accept_token(t)
        prefix += vocab.token_bytes[t]


def _nested_viable(p: bytes) -> bool:
    depth = 0
    prev = b""
    for i in range(len(p)):
        c = p[i:i + 1]
        if c == b"[":
            if prev not in (b"", b"[", b","):
                return False
            depth += 1
        elif c == b"]":
            if prev not in (b"[", b"]") or depth == 0:
                return False
            depth -= 1
        elif c == b",":
            if prev != b"]" or depth == 0:
                return False
        else:
            return False
        if depth == 0 and i != len(p) - 1:
            return False
        prev = c
    return True


@pytest.mark.parametrize("alias", ["llama3", "qwen2"])
def test_recursive_grammar_brute_force(tokenizer_by_alias, alias: str, engine_mode: str) -> None:
    tok = tokenizer_by_alias(alias)
    full = _full_vocab(tok)
    # every token made only of brackets and commas, plus a random slice of the rest
    rng = random.Random(0)
    keep = {i for i, b in enumerate(full.token_bytes) if b and set(b) <= set(b"[],")}
    keep |= set(rng.sample([i for i, b in enumerate(full.token_bytes) if b], 2000))
    table = [b if i in keep else None for i, b in enumerate(full.token_bytes)]
    vocab = Vocabulary(table, full.eos_token_ids, full.vocab_size)
    g = ir.Grammar({"s": ir.seq(ir.lit("["), ir.opt(ir.seq(ir.ref("s"), ir.star(
        ir.seq(ir.lit(","), ir.ref("s"))))), ir.lit("]"))}, "s")
    cg = compile_grammar(g)
    m = Matcher(cg, vocab)
    assert engine_for(cg).native == (engine_mode != "numpy" and native.available())
    prefix = b""
    for _step in range(25):
        allowed = set(m.allowed_token_ids())
        expect = {i for i, b in enumerate(vocab.token_bytes) if b and _nested_viable(prefix + b)}
        balanced = prefix.count(b"[") == prefix.count(b"]") and prefix != b""
        if balanced:
            expect.update(vocab.eos_token_ids)
        assert allowed == expect, prefix
        text = sorted(t for t in allowed if vocab.token_bytes[t])
        if not text:
            break
        # prefer opening brackets early so the walk goes deep
        opening = [t for t in text if vocab.token_bytes[t].startswith(b"[")]
        t = rng.choice(opening if opening and _step < 12 else text)
        assert m.accept_token(t)
        prefix += vocab.token_bytes[t]


def _ascii_slice(tokenizer, n: int, seed: int, must: bytes) -> Vocabulary:
    """A vocabulary slice (:func:`_slice_vocab`) keeping only ASCII tokens, so every prefix
    decodes and characters are bytes."""
    full = _slice_vocab(tokenizer, n, seed=seed, must=must)
    table = [b if b is not None and all(c < 0x80 for c in b) else None for b in full.token_bytes]
    return Vocabulary(table, full.eos_token_ids, full.vocab_size)


def _key_re(name: str) -> str:
    """Regex for a property name in every JSON spelling (raw or ``\\uXXXX``; ``name`` holds
    letters a-e only, whose hex codes have no letters, so hex case does not arise)."""
    return '"' + "".join(f"(?:{c}|\\\\u{ord(c):04x})" for c in name) + '"'


def _replay_against_regex(g, vocab: Vocabulary, doc: str, oracle: str,
                          max_step: int | None = None) -> tuple[Matcher, int]:
    """Walk ``doc`` through a matcher token by token (the longest allowed token that continues
    it, at most ``max_step`` bytes), checking at every step that the mask equals the ``regex``
    module's partial-match oracle over the whole vocabulary. Returns the matcher at the end
    and the number of masks checked."""
    ids = [i for i, b in enumerate(vocab.token_bytes) if b]
    m = Matcher(g, vocab)
    prefix = b""
    checked = 0
    while len(prefix) < len(doc.encode()):
        allowed = set(m.allowed_token_ids())
        for i in ids:
            t = vocab.token_bytes[i]
            ok = re_oracle.fullmatch(oracle, (prefix + t).decode("ascii"), partial=True) is not None
            assert (i in allowed) == ok, (prefix, t)
        checked += 1
        rest = doc.encode()[len(prefix):]
        step = max((i for i in allowed if vocab.token_bytes[i] and rest.startswith(vocab.token_bytes[i])
                    and (max_step is None or len(vocab.token_bytes[i]) <= max_step)),
                   key=lambda i: len(vocab.token_bytes[i]))
        assert m.accept_token(step)
        prefix += vocab.token_bytes[step]
    return m, checked


@pytest.mark.parametrize("alias", ["llama3", "qwen2"])
def test_shared_rule_masks_match_regex_oracle(tokenizer_by_alias, alias: str, engine_mode: str) -> None:
    """A schema whose string values share one called rule (and a nested object), so masks
    are assembled from the per-(rule, state) context-independent caches. Its language is
    regular and written out below as a regex (compact JSON, declared keys in order, JSON
    strings and keys with every escape form); the third-party ``regex`` module's partial matching is
    the oracle at every step of a valid document, over an ASCII-only vocabulary slice (so
    that every prefix decodes)."""
    from structgen.json_schema import compile_json_schema

    word = {"type": "string"}
    schema = {"type": "object", "additionalProperties": False, "required": ["a", "b", "c", "d"],
              "properties": {"a": word, "b": word, "c": {"type": "array", "items": word, "maxItems": 3},
                             "d": {"type": "object", "additionalProperties": False, "required": ["e"],
                                   "properties": {"e": word}}}}
    w = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
    k = _key_re
    oracle = (r'\{' + k("a") + ':' + w + ',' + k("b") + ':' + w + ',' + k("c") + r':\[(?:' + w
              + r'(?:,' + w + r'){0,2})?\],' + k("d") + r':\{' + k("e") + ':' + w + r'\}\}')
    g = compile_json_schema(schema, for_generation=False)  # the oracle writes every escape form
    assert len(g.rules) > 1  # the string value is a called rule
    vocab = _ascii_slice(tokenizer_by_alias(alias), 4000, seed=7, must=b'abcde {}[]":,\\')
    doc = '{"a":"abc cab","b":"a\\"b","c":["ab","c b"],"d":{"e":"bad"}}'
    assert re_oracle.fullmatch(oracle, doc)
    _replay_against_regex(g, vocab, doc, oracle)
    assert engine_for(g).stats["ci_misses"] > 0  # the split path ran
    if engine_mode == "deep-split":
        assert any(len(k[1]) > 1 for k in engine_for(g).ci_cache)  # tops of more than one frame


@pytest.mark.parametrize("alias", ["llama3", "qwen2"])
def test_counted_string_masks_match_regex_oracle(tokenizer_by_alias, alias: str, engine_mode: str) -> None:
    """Long ``maxLength`` strings: one automaton state per character, where positions far
    from the bounds share their vocabulary walks (bounded-horizon state classes). The
    ``regex`` module's partial matching with the same counted repetitions is the oracle at
    every step of a document that runs through the middle and up to both ends of the
    counts (an ASCII-only vocabulary slice, so characters are bytes)."""
    from structgen.json_schema import compile_json_schema

    schema = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
              "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 90},
                             "b": {"type": "string", "maxLength": 260}}}
    ch = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
    oracle = r'\{' + _key_re("a") + ':"' + ch + r'{3,90}",' + _key_re("b") + ':"' + ch + r'{0,260}"\}'
    g = compile_json_schema(schema, for_generation=False)  # the oracle writes every escape form
    vocab = _ascii_slice(tokenizer_by_alias(alias), 3000, seed=11, must=b'abcdehqtx {}":,\\')
    a = "ab cd, ea \\\"q\\\" " * 6  # 90 characters (escapes count once)
    b = "the cab, bade a deed " * 12 + "ab"  # 254 characters
    doc = '{"a":"' + a[:88] + 'x","b":"' + b + '"}'
    assert re_oracle.fullmatch(oracle, doc)
    # short steps (at most 3 bytes) so most character positions get a mask of their own
    m, checked = _replay_against_regex(g, vocab, doc, oracle, max_step=3)
    assert m.is_accepting() and checked > 100
    if engine_mode == "split" and native.available() and g.engine.flushes == 0:
        # walks were shared (a flush of the tables resets these counters)
        assert any(shared > 0 for shared in engine_for(g).horizon.shared.values())
    if engine_mode == "default" and native.available():
        assert engine_for(g).counted.hits > 0  # positions answered from item runs


def test_nullable_counted_string_masks_match_regex_oracle(tokenizer_by_alias, engine_mode: str) -> None:
    """A long ``maxLength`` string that may also be ``null``: at every character the
    configuration has two stacks (the string may end there), and the tokens that leave the
    string are walked once per class of positions, not once per character. Masks equal the
    ``regex`` module's partial-match oracle at every step."""
    from structgen.json_schema import compile_json_schema

    schema = {"type": "object", "additionalProperties": False, "required": ["c"],
              "properties": {"c": {"type": ["string", "null"], "maxLength": 120}}}
    ch = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
    oracle = r'\{' + _key_re("c") + ':(?:"' + ch + r'{0,120}"|null)\}'
    g = compile_json_schema(schema, for_generation=False)
    vocab = _ascii_slice(tokenizer_by_alias("llama3"), 3000, seed=5, must=b'abcdehqtx {}":,\\')
    # 120 characters: through the class of positions far from the bounds up to the last one
    doc = '{"c":"' + ("a deed, the bead \\\"x\\\" " * 6)[:119] + 'e"}'
    assert re_oracle.fullmatch(oracle, doc)
    m, checked = _replay_against_regex(g, vocab, doc, oracle, max_step=4)
    assert m.is_accepting() and checked > 40
    if engine_mode == "split" and native.available() and g.engine.flushes == 0:
        assert len(engine_for(g).pending_cache) > 0  # the leaving tokens' walks were filed by class
    if engine_mode == "default" and native.available():
        assert engine_for(g).counted.hits > 0  # positions answered from item runs


def _quoted_viable(data: bytes) -> bool:
    """Whether ``data`` is a prefix of ``x='...';`` where the body is UTF-8 text in which a
    quote appears only doubled (an SQL string literal), by hand: Python's incremental UTF-8
    decoder (a cut last character is fine) and a three-state scan of the quotes."""
    import codecs

    head = b"x='"
    if len(data) <= len(head):
        return head.startswith(data)
    if not data.startswith(head):
        return False
    rest = data[len(head):]
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(rest, final=False)
    except UnicodeDecodeError:
        return False
    state = "body"  # body, quote (a quote read: the end, or the first of a pair), end, done
    for ch in text:
        if state == "body":
            state = "quote" if ch == "'" else "body"
        elif state == "quote":
            if ch == "'":
                state = "body"
            elif ch == ";":
                state = "done"
            else:
                return False
        else:  # done: nothing may follow
            return False
    # bytes of a cut character begin neither a quote nor ';': only a body may hold them
    return state == "body" or len(text.encode()) == len(rest)


@pytest.mark.parametrize("alias", ["llama3", "qwen2"])
def test_utf8_string_body_masks_match_oracle(tokenizer_by_alias, alias: str, engine_mode: str) -> None:
    """A string body that reads every character but the quote (``'([^']|'')*'``): subtrees
    of well-formed UTF-8 text whose ASCII bytes loop are taken whole where every multibyte
    character leads back to the state. Every mask along a document with multibyte
    characters and doubled quotes equals a hand-written byte-level oracle over a real
    vocabulary slice that keeps its multibyte and broken-UTF-8 tokens."""
    from structgen.frontends.lark import compile_lark

    g = compile_lark('start: "x=" STRING ";"\nSTRING: "\'" /([^\']|\'\')*/ "\'"\n')
    # a random slice plus every token of at most 3 bytes (all single bytes among them)
    vocab = _slice_vocab(tokenizer_by_alias(alias), 6000, seed=5, must=bytes(range(256)))
    doc = "x='h\u00e9llo ''w\u00f6rld'' \u65e5\u672c\u8a9e \U0001f600 ok''';".encode()
    ids = [i for i, b in enumerate(vocab.token_bytes) if b]
    assert sum(any(c >= 0x80 for c in vocab.token_bytes[i]) for i in ids) > 500
    m = Matcher(g, vocab)
    prefix = b""
    checked = 0
    while prefix != doc:
        allowed = set(m.allowed_token_ids())
        for i in ids:
            t = vocab.token_bytes[i]
            assert (i in allowed) == _quoted_viable(prefix + t), (prefix, t)
        checked += 1
        rest = doc[len(prefix):]
        step = max((i for i in allowed if vocab.token_bytes[i] and rest.startswith(vocab.token_bytes[i])),
                   key=lambda i: len(vocab.token_bytes[i]))
        assert m.accept_token(step)
        prefix += vocab.token_bytes[step]
    assert m.is_accepting() and checked >= 10
    if engine_mode == "default" and native.available():
        eng = g.engine  # the multibyte-loop check answered yes somewhere
        assert ((eng.tab.utf8_memo[: eng.num_configs] == 1).any()
                or (eng.tab.state_utf8_memo[: eng.num_rule_states] == 1).any())
