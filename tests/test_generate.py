"""Generation: speculative output equals plain constrained decoding; outputs validate.

A tiny randomly initialised Llama (2 layers) with the real GPT-2 tokenizer exercises every
code path quickly. The oracle for exactness is plain constrained decoding
(``speculative=False``); the oracle for validity is ``jsonschema`` / Lark's parser.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from _schemas import NESTED, PERSON, STATUS_TAGS

import structgen
from structgen.config import SpecConfig

pytestmark = pytest.mark.assets

SCHEMAS = [
    PERSON, STATUS_TAGS, NESTED,
]

PROMPTS = [
    "Extract: Bob Smith is 42 years old. JSON:",
    'The ticket status is "open" with tags urgent, db. Output: {"status": "open", "tags": ["urgent", "db"]}',
    "Give a JSON object with ok true, n 3.5 and child x 7:",
]


@pytest.fixture(scope="module")
def tiny_lm(tokenizer_by_alias):
    from transformers import LlamaConfig, LlamaForCausalLM

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50304, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # make the random model prefer JSON-ish punctuation a little
        model.lm_head.weight.mul_(4.0)
    return CausalLM(model.eval(), tok)


@pytest.mark.parametrize("case", range(len(SCHEMAS)))
def test_greedy_speculative_equals_plain(tiny_lm, case: int) -> None:
    schema = SCHEMAS[case]
    for prompt in PROMPTS:
        plain = structgen.generate(tiny_lm, schema=schema, prompt=prompt, max_new_tokens=80,
                                   speculative=False)
        spec = structgen.generate(tiny_lm, schema=schema, prompt=prompt, max_new_tokens=80,
                                  speculative=True)
        assert spec.tokens == plain.tokens
        assert spec.finish_reason == plain.finish_reason
        # on_budget="close" (the default): every output is complete within the budget
        assert plain.finish_reason in ("stop", "budget_close") and len(plain.tokens) <= 80
        jsonschema.validate(json.loads(plain.text), schema)
        assert spec.value == json.loads(plain.text)
        assert spec.stats.forward_passes <= plain.stats.forward_passes


def test_length_limit_and_stream(tiny_lm) -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    r = structgen.generate(tiny_lm, schema=schema, prompt="numbers:", max_new_tokens=7, on_budget="cut")
    assert len(r.tokens) <= 7
    assert r.finish_reason in ("length", "stop")
    if r.finish_reason == "length":
        assert len(r.tokens) == 7 and r.value is None
    pieces = list(structgen.stream(tiny_lm, schema=schema, prompt="numbers:", max_new_tokens=7,
                                   on_budget="cut"))
    assert "".join(pieces) == r.text
    closed = structgen.generate(tiny_lm, schema=schema, prompt="numbers:", max_new_tokens=7)
    assert len(closed.tokens) <= 7 and closed.complete
    jsonschema.validate(closed.value, schema)
    pieces = list(structgen.stream(tiny_lm, schema=schema, prompt="numbers:", max_new_tokens=7))
    assert "".join(pieces) == closed.text


def test_batch_mixed_schemas(tiny_lm) -> None:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(6)]
    schemas = [SCHEMAS[i % len(SCHEMAS)] for i in range(6)]
    rs = structgen.generate(tiny_lm, schema=schemas, prompt=prompts, max_new_tokens=60,
                            config=SpecConfig(batch_size=4))
    assert len(rs) == 6
    for r, s, p in zip(rs, schemas, prompts):
        single = structgen.generate(tiny_lm, schema=s, prompt=p, max_new_tokens=60)
        assert r.tokens == single.tokens
        if r.complete:
            jsonschema.validate(json.loads(r.text), s)


def test_lark_grammar_generation(tiny_lm) -> None:
    grammar = r"""
    start: expr
    expr: term (("+" | "-") term)*
    term: NUMBER | "(" expr ")"
    NUMBER: /[0-9]{1,3}/
    """
    plain = structgen.generate(tiny_lm, grammar=grammar, prompt="1+2=", max_new_tokens=30,
                               speculative=False)
    spec = structgen.generate(tiny_lm, grammar=grammar, prompt="1+2=", max_new_tokens=30)
    assert plain.tokens == spec.tokens


def test_pydantic_model_instance(tiny_lm) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int
        y: int

    r = structgen.generate(tiny_lm, schema=Point, prompt="point:", max_new_tokens=40)
    if r.complete:
        assert isinstance(r.value, Point)


def test_sampling_is_seeded(tiny_lm) -> None:
    s = SCHEMAS[0]
    a = structgen.generate(tiny_lm, schema=s, prompt=PROMPTS[0], temperature=1.0, seed=3,
                           max_new_tokens=40)
    b = structgen.generate(tiny_lm, schema=s, prompt=PROMPTS[0], temperature=1.0, seed=3,
                           max_new_tokens=40)
    assert a.tokens == b.tokens
    if a.complete:
        jsonschema.validate(json.loads(a.text), s)
