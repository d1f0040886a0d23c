"""on_budget="close" through the generation loop, with a tiny random model over GPT-2's tokenizer.

Oracles: jsonschema (formats on) validates every output, Lark's own parser / Python's ``re``
check Lark and regex outputs, and plain one-token constrained decoding under the same rule
is the reference for greedy speculative output (token for token, finish reason included).
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from _schemas import NESTED, PERSON, STATUS_TAGS
from _tiny_lm import build_tiny_llama

import structgen
from structgen.config import SpecConfig
from structgen.errors import TokenBudgetError
from structgen.frontends.constraint import compile_constraint
from structgen.generation.loop import run_batch, run_sequence
from structgen.masks.matcher import Matcher

pytestmark = pytest.mark.assets

EVENT = {"type": "object", "properties": {
    "when": {"type": "string", "format": "date"},
    "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "minItems": 2, "maxItems": 3},
    "score": {"type": "number", "minimum": 0, "maximum": 10}},
    "required": ["when", "tags", "score"], "additionalProperties": False}
SCHEMAS = [PERSON, STATUS_TAGS, NESTED, EVENT]
LARK = 'start: "(" expr ")"\nexpr: atom ("+" atom)*\natom: NUMBER | start\nNUMBER: /[0-9]+/\n'
REGEX = r"[a-z]{3,8}@[a-z]{2,5}\.(com|org)"


@pytest.fixture(scope="module")
def tiny(tokenizer_by_alias):
    from structgen.generation.model import CausalLM, vocabulary_for

    torch.set_num_threads(1)
    tok = tokenizer_by_alias("gpt2")
    lm = CausalLM(build_tiny_llama(tok, "random"), tok)
    return lm, vocabulary_for(lm)


def _validator(schema):
    cls = jsonschema.Draft202012Validator
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _check_pair(lm, vocab, g, prompt, budget, cfg=None, **kw):
    cfg = cfg or SpecConfig()
    plain = run_sequence(lm, vocab, g, prompt, cfg, speculative=False, max_new_tokens=budget, **kw)
    spec = run_sequence(lm, vocab, g, prompt, cfg, speculative=True, max_new_tokens=budget, **kw)
    assert spec.tokens == plain.tokens
    assert spec.finish_reason == plain.finish_reason
    assert plain.finish_reason in ("stop", "budget_close")
    assert len(plain.tokens) <= budget and plain.tokens[-1] in vocab.eos_token_ids
    for r in (plain, spec):
        assert r.stats.budget_closes == int(r.finish_reason == "budget_close")
        assert (r.stats.budget_narrowed > 0) == (r.finish_reason == "budget_close")
    return plain


@pytest.mark.parametrize("case", range(len(SCHEMAS)))
def test_every_budget_gives_a_valid_output_and_spec_equals_plain(tiny, case):
    lm, vocab = tiny
    schema = SCHEMAS[case]
    g = compile_constraint("json", schema)
    need = Matcher(g, vocab).tokens_to_finish()
    prompt = lm.tokenizer.encode("Give JSON for the schema " + json.dumps(schema)[:60])
    closes = 0
    for k in range(0, 17, 2 if case else 1):
        r = _check_pair(lm, vocab, g, prompt, need + k)
        _validator(schema).validate(json.loads(r.text))
        closes += r.finish_reason == "budget_close"
    assert closes  # the random model runs long: the rule had to close some


def test_lark_and_regex_grammars(tiny):
    from lark import Lark

    lm, vocab = tiny
    parser = Lark(LARK)
    for kind, spec in (("grammar", LARK), ("regex", REGEX)):
        g = compile_constraint(kind, spec)
        need = Matcher(g, vocab).tokens_to_finish()
        prompt = lm.tokenizer.encode("Output:")
        for k in (0, 1, 3, 8, 16):
            r = _check_pair(lm, vocab, g, prompt, need + k)
            if kind == "grammar":
                parser.parse(r.text)
            else:
                assert re.fullmatch(REGEX, r.text)


def test_cut_keeps_todays_behaviour(tiny):
    lm, vocab = tiny
    g = compile_constraint("json", NESTED)
    prompt = lm.tokenizer.encode("JSON:")
    cut = run_sequence(lm, vocab, g, prompt, SpecConfig(), speculative=False, max_new_tokens=20,
                       on_budget="cut")
    assert cut.finish_reason == "length" and len(cut.tokens) == 20
    assert cut.stats.budget_closes == cut.stats.budget_narrowed == 0
    closed = run_sequence(lm, vocab, g, prompt, SpecConfig(), speculative=False, max_new_tokens=20)
    assert closed.finish_reason == "budget_close"
    _validator(NESTED).validate(json.loads(closed.text))
    # the rule only acts near the end: the outputs agree up to where it first removed a token
    assert closed.tokens[:5] == cut.tokens[:5]


def test_budget_below_the_shortest_output_is_a_typed_error(tiny):
    lm, vocab = tiny
    g = compile_constraint("json", PERSON)
    need = Matcher(g, vocab).tokens_to_finish()
    prompt = lm.tokenizer.encode("JSON:")
    with pytest.raises(TokenBudgetError) as info:
        run_sequence(lm, vocab, g, prompt, SpecConfig(), max_new_tokens=need - 1)
    e = info.value
    assert (e.needed, e.max_new_tokens) == (need, need - 1) and str(need) in str(e)
    with pytest.raises(TokenBudgetError) as info:
        structgen.generate(lm, schema=[{"type": "boolean"}, PERSON], prompt=["a", "b"],
                           max_new_tokens=need - 1)
    assert info.value.request_index == 1 and str(info.value).startswith("request 1: ")
    # on_budget="cut" allows it (the output is then cut short)
    r = run_sequence(lm, vocab, g, prompt, SpecConfig(), max_new_tokens=need - 1, on_budget="cut")
    assert r.finish_reason == "length"


def test_batch_with_per_sequence_budgets_equals_each_alone(tiny):
    lm, vocab = tiny
    gs = [compile_constraint("json", s) for s in SCHEMAS]
    prompts = [lm.tokenizer.encode(p) for p in ("one:", "two two:", "three three three:", "four:")]
    budgets = [Matcher(g, vocab).tokens_to_finish() + k for g, k in zip(gs, (0, 5, 9, 2))]
    outs, stats = run_batch(lm, vocab, gs, prompts, SpecConfig(), max_new_tokens=budgets)
    for g, p, b, r, s in zip(gs, prompts, budgets, outs, SCHEMAS):
        alone = run_sequence(lm, vocab, g, p, SpecConfig(), speculative=False, max_new_tokens=b)
        assert r.tokens == alone.tokens and r.finish_reason == alone.finish_reason
        assert len(r.tokens) <= b
        _validator(s).validate(json.loads(r.text))
    assert stats.budget_closes == sum(r.finish_reason == "budget_close" for r in outs)


def test_draft_model_drafts_under_the_rule(tiny):
    lm, vocab = tiny
    from structgen.generation.model import CausalLM

    draft = CausalLM(lm.model, lm.tokenizer)
    g = compile_constraint("json", STATUS_TAGS)
    need = Matcher(g, vocab).tokens_to_finish()
    prompt = lm.tokenizer.encode("Ticket:")
    cfg = SpecConfig(grammar_drafts=False, prompt_lookup=False)
    for k in (0, 3, 7):
        r = _check_pair(lm, vocab, g, prompt, need + k, cfg, draft_lm=draft)
        _validator(STATUS_TAGS).validate(json.loads(r.text))
        spec = run_sequence(lm, vocab, g, prompt, cfg, speculative=True, max_new_tokens=need + k,
                            draft_lm=draft)
        # the draft model is the target itself: its drafts under the rule are all accepted
        assert spec.stats.drafted == spec.stats.accepted


def test_sampling_outputs_are_complete(tiny):
    lm, vocab = tiny
    g = compile_constraint("json", PERSON)
    need = Matcher(g, vocab).tokens_to_finish()
    prompt = lm.tokenizer.encode("Person:")
    for seed in range(4):
        r = run_sequence(lm, vocab, g, prompt, SpecConfig(temperature=1.0), max_new_tokens=need + 3,
                         seed=seed)
        assert r.finish_reason in ("stop", "budget_close") and len(r.tokens) <= need + 3
        _validator(PERSON).validate(json.loads(r.text))
