"""Look-ahead (structgen.masks.lookahead): masks prepared on the background thread are the
masks, and they are there when the next token comes.

Oracles: Python's ``re`` on the text so far (a regex grammar over a toy vocabulary, with the
tables flushed at every safe point while the thread works), and a second compiled grammar of
the same schema that never looks ahead (a real 128k-token vocabulary)."""

from __future__ import annotations

import json
import random
from collections import OrderedDict

import pytest
from _ab_oracle import AB_EOS, AB_TOKENS, ab_regex, ab_step, ab_vocab
from _toy_vocab import ToyVocab

from structgen.errors import MatcherUsageError
from structgen.masks import lookahead
from structgen.masks.engine import engine_for
from structgen.masks.matcher import Matcher


def test_masks_stay_exact_while_looking_ahead_and_flushing() -> None:
    rx, cg = ab_regex(6)
    cg.engine.table_budget = 1  # every safe point flushes: job ids go stale under the thread
    vocab = ab_vocab()
    rng = random.Random(3)
    for _ in range(10):
        m = Matcher(cg, vocab)  # type: ignore[arg-type]
        text = ""
        for step in range(rng.randrange(5, 40)):
            m.start_look_ahead(max_configs=8, max_depth=4)
            if step % 2:  # every other step checked while the thread works
                assert lookahead.wait_idle()
            t = ab_step(m, rx, text, rng)
            if t == AB_EOS:
                break
            text += AB_TOKENS[t].decode()  # type: ignore[union-attr]
    assert lookahead.wait_idle()


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string",
                                                 "pattern": "^[0-9]{5}$"}},
                "required": ["city"]}},
    "required": ["name", "age"]}
DOC = {"name": "Ada Lovelace", "age": 36, "tags": ["red", "blue"],
       "address": {"city": "London", "zip": "12345"}}


def _fresh_grammar(monkeypatch: pytest.MonkeyPatch):
    """The schema compiled anew: its own engine and caches."""
    from structgen.frontends.json_schema import compiler as json_schema
    from structgen.grammar import compiler
    from structgen.json_schema import compile_json_schema

    monkeypatch.setattr(compiler, "_CACHE", OrderedDict())
    monkeypatch.setattr(json_schema, "_CACHE", OrderedDict())
    return compile_json_schema(SCHEMA)


def test_the_next_mask_is_ready_and_equal_over_a_real_vocabulary(tokenizer_by_alias, monkeypatch) -> None:
    from structgen.masks.vocab import Vocabulary

    tok = tokenizer_by_alias("llama3")
    vocab = Vocabulary.from_tokenizer(tok)
    ids = tok.encode(json.dumps(DOC, separators=(",", ":")), add_special_tokens=False)
    plain = Matcher(_fresh_grammar(monkeypatch), vocab)
    cg = _fresh_grammar(monkeypatch)
    ahead = Matcher(cg, vocab)
    eng = engine_for(cg)
    ready = 0
    for t in ids:
        ahead.start_look_ahead()
        assert lookahead.wait_idle()
        assert (ahead.get_bitmask_words() == plain.get_bitmask_words()).all()
        few, few_plain = ahead.forbidden_token_ids(), plain.forbidden_token_ids()  # free states
        assert (few is None) == (few_plain is None) and (few is None or (few == few_plain).all())
        assert ahead.accept_token(t) and plain.accept_token(t)
        ready += eng.cached_mask(ahead._hist[-1], ahead._vt) is not None
    assert (ahead.get_bitmask_words() == plain.get_bitmask_words()).all()
    assert ahead.is_accepting() and plain.is_accepting()
    # the configuration after each token was prepared before the token came (a token longer
    # than the look-ahead's 8 bytes may end past it)
    assert ready >= 0.9 * len(ids), (ready, len(ids))


def test_look_ahead_arguments_are_checked_and_a_finished_matcher_is_a_no_op() -> None:
    from structgen import compile_regex

    vocab = ToyVocab([b"a", None], (1,), 2)
    m = Matcher(compile_regex("a"), vocab)  # type: ignore[arg-type]
    with pytest.raises(MatcherUsageError):
        m.start_look_ahead(max_configs=-1)
    with pytest.raises(MatcherUsageError):
        m.start_look_ahead(max_depth="3")  # type: ignore[arg-type]
    m.start_look_ahead(max_configs=0)  # nothing to do
    assert m.accept_token(0) and m.accept_token(1)
    m.start_look_ahead()  # terminated: nothing to look at
    assert lookahead.wait_idle()
