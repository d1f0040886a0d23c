"""Masks at the positions of counted repetitions (``maxLength`` strings, bounded patterns),
answered from item runs (:mod:`structgen.masks.counted_masks`), against the vocabulary walks
they replace, over a whole real vocabulary: multibyte and cut characters, escapes, tokens
that close the string and go on. At every step of random documents, both engines (one with
item runs, one with the walks alone) give the same mask; documents are drawn from the masks
themselves, with a bias to long tokens so that strings reach their bounds."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest

from structgen.errors import SchemaError
from structgen.frontends.json_schema import compiler as json_schema_compiler
from structgen.grammar import compiler as grammar_compiler
from structgen.json_schema import compile_json_schema
from structgen.masks import engine as engine_mod
from structgen.masks import trie as native
from structgen.masks.engine import engine_for
from structgen.masks.matcher import Matcher
from structgen.masks.vocab import Vocabulary

pytestmark = [pytest.mark.assets,
              pytest.mark.skipif(not native.available(), reason="item runs need the compiled walks")]

SCHEMAS = {
    "short strings in an array": {
        "type": "object", "required": ["s"], "additionalProperties": False,
        "properties": {"s": {"type": "array", "maxItems": 6,
                             "items": {"type": "string", "minLength": 2, "maxLength": 7}}}},
    "nullable strings, one long": {
        "type": "object", "required": ["a", "b"], "additionalProperties": False,
        "properties": {"a": {"type": ["string", "null"], "maxLength": 12},
                       "b": {"type": ["string", "null"], "minLength": 3, "maxLength": 300}}},
    "bounded pattern and a free string": {
        "type": "object", "required": ["p", "q"], "additionalProperties": False,
        "properties": {"p": {"type": "string", "pattern": "^[a-z]{2,9}$"},
                       "q": {"type": "string", "maxLength": 40}}},
    "a class run with length bounds": {
        "type": "object", "required": ["n", "m"], "additionalProperties": False,
        "properties": {"n": {"type": "string", "pattern": "^[^,\"]+$", "maxLength": 12},
                       "m": {"type": "string", "pattern": "^[a-z0-9_]{2,300}$", "minLength": 4,
                             "maxLength": 200}}},
    "two string branches": {
        "type": "object", "required": ["u"], "additionalProperties": False,
        "properties": {"u": {"anyOf": [{"type": "string", "maxLength": 3},
                                       {"type": "string", "minLength": 5, "maxLength": 9}]}}},
}


@pytest.fixture(scope="module")
def llama3(tokenizer_by_alias) -> Vocabulary:
    return Vocabulary.from_tokenizer(tokenizer_by_alias("llama3"))


def _fresh(schema: dict, *, item_runs: bool, monkeypatch: pytest.MonkeyPatch, generation: bool):
    """A grammar compiled afresh (its own engine), with item runs on or off."""
    monkeypatch.setattr(grammar_compiler, "_CACHE", OrderedDict())
    monkeypatch.setattr(json_schema_compiler, "_CACHE", OrderedDict())
    monkeypatch.setattr(engine_mod, "_COUNTED_MASKS", item_runs)
    return compile_json_schema(schema, for_generation=generation)


@pytest.mark.parametrize("generation", [False, True], ids=["validation", "generation"])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_item_runs_equal_the_walks(llama3: Vocabulary, monkeypatch: pytest.MonkeyPatch, name: str,
                                   generation: bool) -> None:
    schema = SCHEMAS[name]
    fast = _fresh(schema, item_runs=True, monkeypatch=monkeypatch, generation=generation)
    slow = _fresh(schema, item_runs=False, monkeypatch=monkeypatch, generation=generation)
    lengths = np.array([len(b) if b else 0 for b in llama3.token_bytes])
    checked = 0
    for seed in range(12):
        if checked >= 80:
            break
        rng = random.Random(seed)
        a, b = Matcher(fast, llama3), Matcher(slow, llama3)
        doc: list[int] = []
        for _ in range(40):
            monkeypatch.setattr(engine_mod, "_COUNTED_MASKS", True)
            wa = a.get_bitmask_words().copy()
            monkeypatch.setattr(engine_mod, "_COUNTED_MASKS", False)
            wb = b.get_bitmask_words().copy()
            assert np.array_equal(wa, wb), (name, llama3.decode_bytes(doc))
            checked += 1
            allowed = np.flatnonzero(np.unpackbits(wa.view(np.uint8), bitorder="little")[: llama3.vocab_size])
            allowed = [int(t) for t in allowed if t not in llama3.eos_token_ids]
            if not allowed:
                break
            # mostly long tokens, so that strings run into their bounds
            longest = sorted(allowed, key=lambda t: -lengths[t])[:8]
            tok = rng.choice(longest) if rng.random() < 0.6 else rng.choice(allowed)
            assert a.accept_token(tok) and b.accept_token(tok)
            doc.append(tok)
    monkeypatch.setattr(engine_mod, "_COUNTED_MASKS", True)
    assert checked >= 80
    if name != "two string branches":
        assert engine_for(fast).counted.hits > 0
    assert engine_for(slow).counted.hits == 0


CLASS_RUNS = ["^[^,\"]+$", "^[a-z0-9_]{2,30}$", "^\\d*$", "^(?:[A-Z]){1,4}$", "^[é-ü\\s]+$"]


@pytest.mark.parametrize("pattern", CLASS_RUNS)
@pytest.mark.parametrize("bounds", [(0, 3), (2, 6), (5, 40)])
def test_a_class_run_with_length_bounds_is_one_repetition(pattern: str, bounds: tuple[int, int]) -> None:
    """``pattern`` (one class between anchors) with ``minLength`` / ``maxLength``: the bounds
    narrow the run (one repetition, no intersection automaton), whose language is what
    jsonschema (reading the pattern as ECMA-262) accepts, string for string, in both escape
    spellings."""
    import itertools
    import json

    import jsonschema

    from structgen.json_schema import schema_for_re_validators

    lo, hi = bounds
    schema = {"type": "string", "pattern": pattern, "minLength": lo, "maxLength": hi}
    check = jsonschema.Draft202012Validator(schema_for_re_validators(schema))
    rng = random.Random(f"{pattern}{bounds}")
    alphabet = ["a", "Z", "7", "_", ",", '"', "\\", "é", "ü", " ", "\n", "\u2028", "日", "😀"]
    texts = {"".join(p) for n in range(3) for p in itertools.product(alphabet, repeat=n)}
    texts |= {"".join(rng.choice(alphabet) for _ in range(rng.randint(0, hi + 2))) for _ in range(400)}
    texts |= {ch * n for n in range(hi + 3) for ch in "aQ5"}
    for generation in (False, True):
        try:
            g = compile_json_schema(schema, for_generation=generation)
        except SchemaError:  # the run's bounds and the length bounds do not meet
            assert not any(check.is_valid(s) for s in texts)
            continue
        assert not any(r.kind == "dfa" for r in engine_for(g).rules)  # no intersection automaton
        for s in sorted(texts):
            want = check.is_valid(s)
            spellings = [json.dumps(s, ensure_ascii=False)] + ([] if generation else [json.dumps(s)])
            for doc in spellings:
                assert g.accepts(doc) == want, (doc, want)
