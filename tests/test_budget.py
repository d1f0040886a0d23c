"""The budget rule (structgen.masks.budget) against brute-force oracles on toy vocabularies.

Oracles: breadth-first search over byte strings (the runtime's own BFS is not used for the
token numbers) and over token sequences, with acceptance checked by walking the bytes from the
start; random walks that obey the rule must always end accepted within their budget.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from _toy_vocab import ToyVocab

from structgen.frontends.constraint import compile_constraint
from structgen.grammar.completion import INFINITE, completion_lengths
from structgen.masks.matcher import Matcher

sys.path.insert(0, str(Path(__file__).parent))
import _schemas  # noqa: E402

GRAMMARS = [
    ("regex", r"(ab|c{3,5}d)+x?[0-9]{2,4}"),
    ("regex", r"a{2,7}|b[cd]{3}"),
    ("grammar", 'start: "(" expr ")" | "x"\nexpr: start ("+" start)*\n'),
    ("grammar", 'start: item+\nitem: "ab" | "c" item "d"\n'),
    ("json", {"type": "string", "minLength": 3, "maxLength": 6}),
    ("json", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}),
    ("json", _schemas.PERSON),
    ("json", _schemas.STATUS_TAGS),
]


def _vocab(seed: int, missing: bytes = b"") -> ToyVocab:
    """Every single byte (but ``missing``) plus some random multi-byte tokens over JSON-ish
    text; EOS last."""
    rng = random.Random(seed)
    pieces = set()
    alphabet = b'abcdx0123456789{}[]":,() +-ntrueflsgmoiphd'
    for _ in range(120):
        n = rng.randint(2, 5)
        pieces.add(bytes(rng.choice(alphabet) for _ in range(n)))
    for frag in (b'{"', b'":', b'",', b'"}', b'"]', b'name', b'age', b'status', b'tags', b'open'):
        pieces.add(frag)
    tokens: list[bytes | None] = [bytes([b]) for b in range(256) if b not in missing] + sorted(pieces)
    tokens.append(None)
    return ToyVocab(tokens, (len(tokens) - 1,), len(tokens))


def _bfs_bytes(rt, cid: int, limit: int = 200_000) -> int | None:
    """Fewest bytes from ``cid`` to acceptance, by plain breadth-first search."""
    if rt.is_accepting(cid):
        return 0
    seen = {cid}
    frontier = [cid]
    depth = 0
    while frontier and len(seen) < limit:
        depth += 1
        nxt = []
        for c in frontier:
            for b in range(256):
                t = rt.step(c, b)
                if t >= 0 and t not in seen:
                    if rt.is_accepting(t):
                        return depth
                    seen.add(t)
                    nxt.append(t)
        frontier = nxt
    return None


def _random_prefix(m: Matcher, rng: random.Random, steps: int) -> None:
    for _ in range(steps):
        allowed = [t for t in m.allowed_token_ids() if t not in m.vocab.eos_token_ids]
        if not allowed:
            return
        m.accept_token(rng.choice(allowed))


@pytest.mark.parametrize("kind,spec", GRAMMARS)
def test_byte_distance_is_exact(kind, spec):
    g = compile_constraint(kind, spec)
    rt = g.engine
    cl = completion_lengths(rt)
    rng = random.Random(1)
    for _ in range(25):
        c = rt.start
        for _ in range(rng.randrange(0, 25)):
            live = rt.live_bytes(c).tolist()
            if not live:
                break
            c = rt.step(c, rng.choice(live))
        want = _bfs_bytes(rt, c)
        got = cl.distance(c)
        assert (want is None) == (got >= INFINITE)
        if want is not None:
            assert got == want
            w = cl.completion(c)
            assert len(w) == want and rt.is_accepting(rt.walk(c, w))


@pytest.mark.parametrize("kind,spec", GRAMMARS[:5])
def test_token_need_bounds_the_true_minimum(kind, spec):
    """``tokens_to_finish`` >= the true fewest tokens (BFS over token sequences) + EOS."""
    g = compile_constraint(kind, spec)
    vocab = _vocab(2)
    rng = random.Random(3)
    for _trial in range(8):
        m = Matcher(g, vocab)
        _random_prefix(m, rng, rng.randrange(0, 6))
        need = m.tokens_to_finish()
        # BFS over token sequences, up to need - 1 tokens
        eos = vocab.eos_token_ids[0]
        frontier = [m.fork()]
        best = None
        for depth in range(need):
            if any(f.is_accepting() for f in frontier):
                best = depth + 1
                break
            nxt = {}
            for f in frontier:
                for t in f.allowed_token_ids():
                    if t == eos:
                        continue
                    h = f.fork()
                    h.accept_token(t)
                    nxt.setdefault(h._hist[-1], h)
            frontier = list(nxt.values())
        assert best is not None and best <= need


@pytest.mark.parametrize("kind,spec", GRAMMARS)
def test_random_walks_under_the_rule_always_finish(kind, spec):
    g = compile_constraint(kind, spec)
    vocab = _vocab(5)
    eos = vocab.eos_token_ids[0]
    rng = random.Random(7)
    start_need = Matcher(g, vocab).tokens_to_finish()
    for _trial in range(30):
        budget = start_need + rng.randrange(0, 12)
        m = Matcher(g, vocab)
        out = []
        while True:
            left = budget - len(out)
            assert left >= 1
            allowed = m.allowed_token_ids(budget=left)
            assert allowed, "the rule dead-ended"
            # validate_tokens applies the same rule
            for t in rng.sample(allowed, min(5, len(allowed))):
                assert m.validate_tokens([t], budget=left) == 1
            t = rng.choice(allowed)
            assert m.accept_token(t)
            out.append(t)
            if t == eos:
                break
        assert len(out) <= budget
        assert m.is_terminated()


# b"z" and the bytes >= 0x80: not every byte is a token, so the rule cannot bound a token's need
# by its byte distance and computes it exactly everywhere
@pytest.mark.parametrize("missing", [b"", b"z" + bytes(range(0x80, 0x100))])
def test_rule_rejects_exactly_the_tokens_that_no_longer_fit(missing):
    g = compile_constraint("json", _schemas.PERSON)
    vocab = _vocab(9, missing)
    m = Matcher(g, vocab)
    m.accept_tokens([vocab.token_bytes.index(b'{"'), vocab.token_bytes.index(b"name")])
    need = m.tokens_to_finish()
    for left in range(need, need + 4):
        words, narrowed = m.budget_mask_words(left)
        kept = set(m.allowed_token_ids(budget=left))
        for t in m.allowed_token_ids():
            h = m.fork()
            h.accept_token(t)
            fits = t == vocab.eos_token_ids[0] or h.tokens_to_finish() <= left - 1
            assert (t in kept) == fits
            # a draft token is checked by the same rule
            assert (m.validate_tokens([t], budget=left) == 1) == fits
        assert narrowed == (kept != set(m.allowed_token_ids()))
    # far from the end nothing is removed
    words, narrowed = m.budget_mask_words(need + 500)
    assert not narrowed
    assert set(m.allowed_token_ids(budget=need + 500)) == set(m.allowed_token_ids())


def test_budget_survives_a_flush():
    g = compile_constraint("json", _schemas.STATUS_TAGS)
    vocab = _vocab(4)
    m = Matcher(g, vocab)
    before = m.tokens_to_finish()
    m._eng.flush()
    assert m.tokens_to_finish() == before
    assert m.allowed_token_ids(budget=before)


@pytest.mark.assets
@pytest.mark.parametrize("alias", ["llama3", "mistral", "smollm2-135m"])
def test_random_walks_on_real_vocabularies(alias, tokenizer_by_alias):
    """Uniformly random tokens under the rule, on real vocabularies (byte-level BPE, and
    SentencePiece with byte fallback): every walk ends with EOS within its budget on a
    document that jsonschema accepts."""
    import json

    import jsonschema

    from structgen.masks.vocab import Vocabulary

    vocab = Vocabulary.from_tokenizer(tokenizer_by_alias(alias))
    eos = set(vocab.eos_token_ids)
    rng = random.Random(11)
    for schema in (_schemas.PERSON, _schemas.STATUS_TAGS):
        g = compile_constraint("json", schema)
        need = Matcher(g, vocab).tokens_to_finish()
        for k in (0, 1, 4, 9):
            m = Matcher(g, vocab)
            out = []
            while not m.is_terminated():
                left = need + k - len(out)
                assert left >= 1
                t = rng.choice(m.allowed_token_ids(budget=left))
                assert m.accept_token(t)
                out.append(t)
            assert len(out) <= need + k and out[-1] in eos
            jsonschema.validate(json.loads(vocab.decode_bytes(out[:-1])), schema)


def test_on_budget_option_is_checked():
    from structgen.config import GenerationOptions
    from structgen.errors import ConfigError

    assert GenerationOptions().on_budget == "close"
    assert GenerationOptions(on_budget="cut").on_budget == "cut"
    with pytest.raises(ConfigError) as info:
        GenerationOptions(on_budget="stretch")
    assert info.value.key == "on_budget"
