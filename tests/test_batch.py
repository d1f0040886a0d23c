"""Batched generation: one target forward per step for a whole micro-batch.

Oracles: each sequence generated alone with plain constrained decoding
(``speculative=False``, batch 1) for greedy exactness, ``jsonschema`` for validity, and a
from-scratch forward of the sequence's real tokens (no cache, no padding) for the batched
KV cache's logits. The models are tiny and randomly initialised (as in test_generate.py).
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
from test_generate import PROMPTS, SCHEMAS  # tests/ is on sys.path (rootdir conftest)

import structgen
from structgen.config import SpecConfig

pytestmark = pytest.mark.assets


def _tiny(tok, kind: str = "llama"):
    from structgen.generation.model import CausalLM

    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=50304, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                          eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # as in test_generate.py: prefer JSON-ish punctuation a little
            model.lm_head.weight.mul_(4.0)
    else:  # a model type without the plain-head fast path (learned absolute positions)
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=50257, n_embd=64, n_layer=2, n_head=4, n_positions=512,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
        model = GPT2LMHeadModel(cfg)
    return CausalLM(model.eval(), tok)


@pytest.fixture(scope="module")
def tiny_lm(tokenizer_by_alias):
    return _tiny(tokenizer_by_alias("gpt2"))


def _batch(n: int) -> tuple[list[str], list[dict]]:
    """``n`` prompts of different lengths with mixed schemas."""
    prompts = [PROMPTS[i % len(PROMPTS)] + " Note:" + " more context" * (2 * i) for i in range(n)]
    schemas = [SCHEMAS[(i + i // 3) % len(SCHEMAS)] for i in range(n)]
    return prompts, schemas


def _alone_plain(lm, schema, prompt, max_new, on_budget="close"):
    return structgen.generate(lm, schema=schema, prompt=prompt, max_new_tokens=max_new,
                              speculative=False, on_budget=on_budget)


@pytest.mark.parametrize("speculative", [True, False])
def test_batch_equals_plain_decoding_alone(tiny_lm, speculative: bool) -> None:
    prompts, schemas = _batch(7)
    max_new = 50
    rs = structgen.generate(tiny_lm, schema=schemas, prompt=prompts, max_new_tokens=max_new,
                            speculative=speculative, config=SpecConfig(batch_size=3))
    assert len(rs) == 7
    alone = [_alone_plain(tiny_lm, s, p, max_new) for s, p in zip(schemas, prompts)]
    for r, a, s in zip(rs, alone, schemas):
        assert r.tokens == a.tokens
        assert r.finish_reason == a.finish_reason
        if r.finish_reason in ("stop", "budget_close"):
            jsonschema.validate(json.loads(r.text), s)
            assert r.value == json.loads(r.text)
        else:
            assert len(r.tokens) == max_new and r.value is None
    st = rs.stats
    assert st.sequences == 7 and st.micro_batches == 3
    assert st.new_tokens == sum(len(r.tokens) for r in rs)
    assert st.row_forward_passes == sum(r.stats.forward_passes for r in rs)
    # the forwards really were batched: a micro-batch steps as long as its longest member
    per_micro = [max(r.stats.forward_passes for r in rs[lo: lo + 3]) for lo in range(0, 7, 3)]
    assert st.forward_passes == sum(per_micro) < st.row_forward_passes
    if not speculative:
        assert [r.stats.forward_passes for r in rs] == [a.stats.forward_passes for a in alone]
        assert st.drafted == 0
    assert st.tokens_per_second > 0


def test_rows_finish_early_and_at_length(tiny_lm) -> None:
    short = {"type": "boolean"}
    long = {"type": "array", "items": {"type": "string"}, "minItems": 50}
    prompts = ["yes or no?", "A long list of words, please: alpha, beta, gamma, delta",
               "Again: true or false", "words words words"]
    schemas = [short, long, short, long]
    rs = structgen.generate(tiny_lm, schema=schemas, prompt=prompts, max_new_tokens=12,
                            config=SpecConfig(batch_size=4), on_budget="cut")
    for r, s, p in zip(rs, schemas, prompts):
        a = _alone_plain(tiny_lm, s, p, 12, on_budget="cut")
        assert r.tokens == a.tokens
        if s is short:
            assert r.finish_reason == "stop" and isinstance(r.value, bool)
            assert len(r.tokens) < 12
        else:
            assert r.finish_reason == "length" and len(r.tokens) == 12 and r.value is None
    # the short rows left the batch early: they took part in fewer forwards
    assert max(rs[0].stats.forward_passes, rs[2].stats.forward_passes) < rs.stats.forward_passes


def test_sampled_batch_uses_each_sequence_seed(tiny_lm, monkeypatch) -> None:
    # with whole drafts (no batch-wide cut) each sequence uses exactly its own draws
    monkeypatch.setattr("structgen.generation.loop.BATCH_DRAFT_CUT", False)
    prompts, schemas = _batch(4)
    rs = structgen.generate(tiny_lm, schema=schemas, prompt=prompts, max_new_tokens=30,
                            temperature=1.0, seed=11, config=SpecConfig(batch_size=4))
    for i, (r, s, p) in enumerate(zip(rs, schemas, prompts)):
        a = structgen.generate(tiny_lm, schema=s, prompt=p, max_new_tokens=30, temperature=1.0,
                               seed=11 + i)
        assert r.tokens == a.tokens
        if r.finish_reason in ("stop", "budget_close"):
            jsonschema.validate(json.loads(r.text), s)


def _spy_verify(monkeypatch) -> list[list[float] | None]:
    """Record the per-sequence temperature row of every verify call."""
    import structgen.generation.verify as verify_mod

    seen: list[list[float] | None] = []
    real = verify_mod.verify

    def spy(*args, **kw):
        t = kw.get("temperature")
        seen.append(None if t is None else [round(float(x), 6) for x in t])
        return real(*args, **kw)

    monkeypatch.setattr(verify_mod, "verify", spy)
    return seen


def test_per_request_temperature_gives_each_request_its_own_distribution(tiny_lm, monkeypatch) -> None:
    """Greedy and hot requests share micro-batches: each gets exactly the tokens a run alone
    with its own temperature and seed gives (the oracle), so each has its own temperature's
    distribution; the verifier saw both temperatures in one per-sequence tensor."""
    monkeypatch.setattr("structgen.generation.loop.BATCH_DRAFT_CUT", False)  # whole drafts: same draws
    prompts, schemas = _batch(2)
    temps = [0.0, 1.5]
    alone = []
    for seed in (3, 8):
        alone.append([structgen.generate(tiny_lm, schema=s, prompt=p, max_new_tokens=16,
                                         temperature=t, seed=seed + i).tokens
                      for i, (s, p, t) in enumerate(zip(schemas, prompts, temps))])
    seen = _spy_verify(monkeypatch)
    for seed, expect in zip((3, 8), alone):
        rs = structgen.generate(tiny_lm, schema=schemas, prompt=prompts, max_new_tokens=16,
                                temperature=temps, seed=seed, config=SpecConfig(batch_size=2))
        assert [r.tokens for r in rs] == expect
    assert any(t is not None and 0.0 in t and 1.5 in t for t in seen)  # one verify, both rows
    # the greedy request is plain greedy decoding, whatever the seed
    assert alone[0][0] == alone[1][0] == _alone_plain(tiny_lm, schemas[0], prompts[0], 16).tokens
    # the hot request really samples: its two seeds give different outputs
    assert alone[0][1] != alone[1][1]


def test_per_request_top_p_and_uniform_lists(tiny_lm, monkeypatch) -> None:
    monkeypatch.setattr("structgen.generation.loop.BATCH_DRAFT_CUT", False)
    prompts, schemas = _batch(2)
    tops = [1.0, 0.3]
    rs = structgen.generate(tiny_lm, schema=schemas, prompt=prompts, max_new_tokens=12,
                            temperature=1.0, top_p=tops, seed=4, config=SpecConfig(batch_size=2))
    for i, (r, s, p, q) in enumerate(zip(rs, schemas, prompts, tops)):
        assert r.tokens == structgen.generate(tiny_lm, schema=s, prompt=p, max_new_tokens=12,
                                              temperature=1.0, top_p=q, seed=4 + i).tokens
    # a list with one value for every request is the scalar
    same = structgen.generate(tiny_lm, schema=schemas, prompt=prompts, max_new_tokens=12,
                              temperature=[1.0] * 2, seed=4, config=SpecConfig(batch_size=2))
    scalar = structgen.generate(tiny_lm, schema=schemas, prompt=prompts, max_new_tokens=12,
                                temperature=1.0, seed=4, config=SpecConfig(batch_size=2))
    assert [r.tokens for r in same] == [r.tokens for r in scalar]


def test_bad_per_request_sampling_options(tiny_lm) -> None:
    from structgen.errors import ConfigError

    prompts, schemas = _batch(2)
    with pytest.raises(ConfigError, match="request 1: .*temperature") as info:
        structgen.generate(tiny_lm, schema=schemas, prompt=prompts, temperature=[0.5, float("nan")])
    assert info.value.request_index == 1
    with pytest.raises(ConfigError, match="3 temperature values for 2 prompts"):
        structgen.generate(tiny_lm, schema=schemas, prompt=prompts, temperature=[0.5, 1.0, 0.0])
    with pytest.raises(ConfigError, match="single request"):
        structgen.generate(tiny_lm, schema=schemas[0], prompt=prompts[0], top_p=[0.5, 0.9])


def test_batch_with_draft_model(tiny_lm) -> None:
    prompts, schemas = _batch(3)
    rs = structgen.generate(tiny_lm, schema=schemas, prompt=prompts, max_new_tokens=30,
                            draft_model=tiny_lm, config=SpecConfig(batch_size=3))
    assert rs.stats.drafters["draft_model"]["proposed"] > 0
    for r, s, p in zip(rs, schemas, prompts):
        assert r.tokens == _alone_plain(tiny_lm, s, p, 30).tokens


def _reference_logits(lm, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()


@pytest.mark.parametrize("kind,padded_prefill", [("llama", False), ("llama", True), ("gpt2", False)])
def test_batch_kv_logits_match_unpadded_forward(tokenizer_by_alias, monkeypatch, kind: str,
                                                padded_prefill: bool) -> None:
    """Rows accept different numbers of tokens per step (holes), rows leave, the cache is
    compacted: every row's logits stay those of a plain forward over its real tokens.
    ``padded_prefill``: one left-padded batched prefill (the GPU path) instead of per-row
    prefills assembled into the batched cache (the CPU path)."""
    from structgen.generation.model import BatchKV

    if padded_prefill:
        monkeypatch.setattr(BatchKV, "_prefill_rows", lambda self, prompts, width, shared=None: False)
    lm = _tiny(tokenizer_by_alias("gpt2"), kind)
    rng = random.Random(0)
    rows = [[rng.randrange(50000) for _ in range(n)] for n in (9, 1, 4, 15, 0, 6)]
    kv = BatchKV(lm)
    kv.prefill(rows)
    ids = list(range(len(rows)))  # which original row each cache row holds
    compacted = False
    for step in range(8):
        feeds = [[rng.randrange(50000) for _ in range(rng.randint(1, 5))] for _ in ids]
        logits = kv.extend(feeds)
        assert logits.shape[0] == sum(len(f) for f in feeds)
        at = 0
        keep = []
        for r, f in zip(ids, feeds):
            ref = _reference_logits(lm, rows[r] + f)[-len(f):]
            torch.testing.assert_close(logits[at: at + len(f)], ref, atol=2e-4, rtol=1e-4)
            at += len(f)
            keep.append(rng.randint(0, len(f)))
        kv.commit(keep)
        for r, f, k in zip(ids, feeds, keep):
            rows[r] += f[:k]
        if step == 3:  # the second row finishes
            ids = [0, 2, 3, 4, 5]
            kv.select(ids)
        compacted |= kv.compact(0.2)
        assert kv.pos.tolist() == [len(rows[r]) for r in ids]
    assert compacted or kind != "llama"


def test_bad_batch_input(tiny_lm) -> None:
    from structgen.generation.loop import run_batch
    from structgen.generation.model import BatchKV, vocabulary_for

    g = structgen.compile_json_schema(SCHEMAS[0])
    vocab = vocabulary_for(tiny_lm)
    with pytest.raises(ValueError, match="at least one token"):
        run_batch(tiny_lm, vocab, [g, g], [[1, 2], []], SpecConfig())
    with pytest.raises(ValueError, match="grammars"):
        run_batch(tiny_lm, vocab, [g], [[1], [2]], SpecConfig())
    kv = BatchKV(tiny_lm)
    kv.prefill([[1, 2], [3]])
    with pytest.raises(ValueError, match="non-empty"):
        kv.extend([[4], []])
    kv.extend([[4, 5], [6]])
    with pytest.raises(ValueError, match="within the fed lengths"):
        kv.commit([1, 2])
