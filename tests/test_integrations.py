"""Integrations: the transformers logits processor and the vLLM-style backend adapter.

Oracles: ``structgen.generate(..., speculative=False)`` for greedy constrained decoding
(token identity), ``jsonschema`` for validity, brute force over a finite language ("choice")
for the backend's verbs, and replay from the start for rollback.
"""

from __future__ import annotations

import enum
import json
import subprocess
import sys
from collections import OrderedDict

import jsonschema
import numpy as np
import pytest
import torch
from _schemas import PERSON, STATUS_TAGS
from hypothesis import given, settings
from hypothesis import strategies as st

import structgen
from structgen.errors import ConfigError, StructgenError
from structgen.generation.sampling import unpack_bitmask
from structgen.integrations import (
    IntegrationError,
    StructgenBackend,
    StructgenGrammar,
    StructgenLogitsProcessor,
    TokenRejectedError,
    compile_constraint,
)
from structgen.kernels.bitmask import allocate_bitmask
from structgen.masks.matcher import Matcher
from structgen.masks.vocab import Vocabulary

SCHEMAS = [
    PERSON, STATUS_TAGS,
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4},
]

PROMPTS = [  # different lengths: the batch is left-padded
    "Extract: Bob Smith is 42 years old. JSON:",
    "JSON:",
    'The ticket status is "open" with tags urgent, db. Output:',
]


def test_import_does_not_pull_torch() -> None:
    code = ("import sys, structgen.integrations as i; assert i.StructgenBackend; "
            "bad = [m for m in ('torch', 'transformers', 'pydantic') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(_repo_root()))


def test_vllm_plugin_import_loads_no_numba() -> None:
    """vLLM imports its plug-ins in every process it starts, and its worker start-up scans the
    globals of every loaded module, which fails on llvmlite's library wrapper: loading the
    plug-in module must not load numba (the mask engine loads it on first use)."""
    code = ("import sys, structgen.integrations.vllm; "
            "bad = [m for m in ('numba', 'llvmlite') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(_repo_root()))


def _repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- backend (toy vocab)

TOY_TOKENS = [b"a", b"b", b"ab", b"ba", b"c", b"abc", b"x", b"bab", None]
TOY_EOS = 8
CHOICES = ["ab", "abc", "ba", "b", "bab"]


def _toy_vocab() -> Vocabulary:
    return Vocabulary(TOY_TOKENS, eos_token_ids=[TOY_EOS])


def _oracle_valid_prefix(tokens: list[int], choices: list[str]) -> int:
    """Brute force: how many leading tokens keep the output a prefix of some choice (EOS is
    valid exactly when the output is one of the choices; nothing is valid after EOS)."""
    words = [c.encode() for c in choices]
    out = b""
    for n, t in enumerate(tokens):
        if t == TOY_EOS:  # complete output: EOS accepted; nothing after it
            return n + 1 if out in words else n
        nxt = out + TOY_TOKENS[t]
        if not any(w.startswith(nxt) for w in words):
            return n
        out = nxt
    return len(tokens)


def _oracle_mask(prefix: bytes, terminated: bool, choices: list[str]) -> set[int]:
    words = [c.encode() for c in choices]
    if terminated:
        return {TOY_EOS}
    allowed = {t for t, b in enumerate(TOY_TOKENS)
               if b is not None and any(w.startswith(prefix + b) for w in words)}
    if prefix in words:
        allowed.add(TOY_EOS)
    return allowed


def _bits(bitmask: torch.Tensor, row: int, vocab_size: int) -> set[int]:
    return set(torch.nonzero(unpack_bitmask(bitmask[row:row + 1], vocab_size)[0]).flatten().tolist())


token_lists = st.lists(st.integers(0, len(TOY_TOKENS) - 1), max_size=6)


@settings(max_examples=150, deadline=None)
@given(tokens=token_lists, pre=token_lists)
def test_validate_tokens_equals_brute_force_and_fork_accept(tokens: list[int], pre: list[int]) -> None:
    backend = StructgenBackend(vocab=_toy_vocab())
    g = backend.compile_grammar("choice", CHOICES)
    # move to some reachable state first
    pre = pre[: _oracle_valid_prefix(pre, CHOICES)]
    assert g.accept_tokens("r", pre)
    before = backend.allocate_token_bitmask(1)
    g.fill_bitmask(before, 0)
    got = g.validate_tokens(tokens)
    assert len(got) == _oracle_valid_prefix(pre + tokens, CHOICES) - len(pre)
    assert got == tokens[: len(got)]
    # the same count as accepting one by one on a fork
    fork = g.matcher.fork()
    n = 0
    for t in tokens:
        if not fork.accept_token(t):
            break
        n += 1
    assert n == len(got)
    # no state change
    after = backend.allocate_token_bitmask(1)
    g.fill_bitmask(after, 0)
    assert torch.equal(before, after)
    assert g.num_processed_tokens == len(pre)


@settings(max_examples=150, deadline=None)
@given(tokens=token_lists, k=st.integers(0, 6))
def test_rollback_equals_replay_and_mask_oracle(tokens: list[int], k: int) -> None:
    vocab = _toy_vocab()
    backend = StructgenBackend(vocab=vocab)
    tokens = tokens[: _oracle_valid_prefix(tokens, CHOICES)]
    g = backend.compile_grammar("choice", CHOICES)
    assert g.accept_tokens("r", tokens)
    k = min(k, len(tokens))
    g.rollback(k)
    kept = tokens[: len(tokens) - k]
    replay = backend.compile_grammar("choice", CHOICES)
    assert replay.accept_tokens("r2", kept)
    bm = backend.allocate_token_bitmask(3)
    g.fill_bitmask(bm, 0)
    replay.fill_bitmask(bm, 1)
    m = Matcher(backend.compile("choice", CHOICES), vocab)
    assert m.accept_tokens(kept) == len(kept)
    m.fill_bitmask(bm, 2)
    assert torch.equal(bm[0], bm[1]) and torch.equal(bm[0], bm[2])
    assert g.is_terminated() == replay.is_terminated() == (TOY_EOS in kept)
    prefix = b"".join(TOY_TOKENS[t] for t in kept if t != TOY_EOS)
    assert _bits(bm, 0, vocab.vocab_size) == _oracle_mask(prefix, TOY_EOS in kept, CHOICES)
    assert g.num_processed_tokens == len(kept)


def test_accept_tokens_is_all_or_nothing_and_errors() -> None:
    backend = StructgenBackend(vocab=_toy_vocab())
    g = backend.compile_grammar("CHOICE", json.dumps(CHOICES))
    assert not g.accept_tokens("r", [0, 6])  # "a" then "x": rejected, nothing accepted
    assert g.num_processed_tokens == 0 and g.matcher.num_accepted == 0
    assert g.accept_tokens("r", [1, 0])  # "ba"
    assert not g.is_terminated() and g.is_accepting()
    assert g.accept_tokens("r", [TOY_EOS]) and g.is_terminated()
    assert g.validate_tokens([0, 1]) == []
    with pytest.raises(IntegrationError, match="cannot roll back 4"):
        g.rollback(4)
    g.rollback(3)
    assert g.num_processed_tokens == 0
    g.accept_tokens("r", [1])
    g.reset()
    assert g.matcher.num_accepted == 0 and g.num_processed_tokens == 0
    with pytest.raises(ConfigError, match="unknown request_type"):
        backend.compile_grammar("ebnf", "x")
    with pytest.raises(ConfigError, match="choice"):
        backend.compile_grammar("choice", [])
    with pytest.raises(ConfigError, match="choice 1"):
        backend.compile_grammar("choice", ["a", 3])
    with pytest.raises(ConfigError):
        StructgenBackend()
    assert isinstance(IntegrationError("x"), StructgenError)


def test_backend_caches_and_request_types() -> None:
    class Options(enum.Enum):  # shaped like a serving engine's request-type enum
        JSON = enum.auto()
        JSON_OBJECT = enum.auto()
        REGEX = enum.auto()
        GRAMMAR = enum.auto()
        CHOICE = enum.auto()

    vocab = Vocabulary([bytes([b]) for b in range(256)] + [None], eos_token_ids=[256])
    backend = StructgenBackend(vocab=vocab)
    s1 = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    s2 = {"properties": {"b": {"type": "string"}, "a": {"type": "integer"}}, "type": "object"}
    g1 = backend.compile_grammar(Options.JSON, s1)
    g2 = backend.compile_grammar("json", json.loads(json.dumps(s2)))
    assert g1.matcher.grammar is g2.matcher.grammar  # one compiled grammar, two requests
    assert backend.cache_hits == 1 and backend.cache_misses == 1
    assert g1.matcher is not g2.matcher
    checks = [
        (Options.JSON_OBJECT, None, ['{"k":[1,{}]}'], ["[1]", '"s"']),
        (Options.REGEX, r"[a-c]{2}\d", ["ab1", "cc9"], ["ab", "abcd", "a1"]),
        (Options.GRAMMAR, 'start: "x" start | "y"', ["y", "xxy"], ["x", "yy"]),
        (Options.CHOICE, ["yes", "no"], ["yes", "no"], ["ye", "yesno", "n"]),
    ]
    for kind, spec, good, bad in checks:
        for text in good + bad:
            g = backend.compile_grammar(kind, spec)
            ids = list(text.encode()) + [256]
            assert (len(g.validate_tokens(ids)) == len(ids)) == (text in good), (kind, text)
    misses = backend.cache_misses
    backend.compile_grammar("json", s1)
    assert backend.cache_misses == misses  # still cached
    backend.destroy()
    backend.compile_grammar("json", s1)
    assert backend.cache_misses == misses + 1


def test_compile_constraint_errors_are_typed() -> None:
    with pytest.raises(structgen.SchemaError):
        compile_constraint("json", {"type": 5})
    with pytest.raises(structgen.GrammarError):
        compile_constraint("grammar", "start: undefined_rule")
    with pytest.raises(structgen.RegexError):
        compile_constraint("regex", "a(")
    with pytest.raises(ConfigError):
        compile_constraint("regex", 5)


# --------------------------------------------------------------------------- real tokenizer


@pytest.mark.assets
def test_backend_serving_loop_gpt2(tokenizer_by_alias) -> None:
    """A serving-engine-style loop: batch bitmask, random logits, accept; speculative-style
    validate + accept + rollback on the way; every finished output validates."""
    tok = tokenizer_by_alias("gpt2")
    backend = StructgenBackend(tok, vocab_size=50304)
    assert backend.vocab_size == 50304
    gen = torch.Generator().manual_seed(0)
    reqs = {f"r{i}": (backend.compile_grammar("json", s), s) for i, s in enumerate(SCHEMAS)}
    outs: dict[str, list[int]] = {r: [] for r in reqs}
    bm = backend.allocate_token_bitmask(len(reqs))
    eos = tok.eos_token_id
    for _step in range(120):
        live = [r for r, (g, _s) in reqs.items() if not g.is_terminated()]
        if not live:
            break
        for i, r in enumerate(live):
            reqs[r][0].fill_bitmask(bm, i)
        allowed = unpack_bitmask(bm[: len(live)], 50304)  # [live, V]
        assert not allowed[:, 50257:].any()  # padding rows never allowed
        logits = torch.randn((len(live), 50304), generator=gen)
        logits[:, eos] += 4.0  # end soon when allowed
        tokens = logits.masked_fill(~allowed, float("-inf")).argmax(-1).tolist()
        for r, t in zip(live, tokens):
            g = reqs[r][0]
            # a speculative engine validates a draft, accepts it and may roll part back
            draft = [t, t, t]
            ok = g.validate_tokens(draft)
            assert ok[:1] == [t]
            assert g.accept_tokens(r, ok)
            g.rollback(len(ok) - 1)
            outs[r].append(t)
    for r, (g, schema) in reqs.items():
        if g.is_terminated():
            assert outs[r][-1] == eos
            jsonschema.validate(json.loads(tok.decode(outs[r][:-1])), schema)
    assert any(g.is_terminated() for g, _s in reqs.values())


# --------------------------------------------------------------------------- logits processor


@pytest.mark.assets
def test_processor_masks_match_matcher_and_padding(tokenizer_by_alias) -> None:
    tok = tokenizer_by_alias("gpt2")
    schema = SCHEMAS[2]
    proc = StructgenLogitsProcessor(schema, tok)
    assert isinstance(proc, __import__("transformers").LogitsProcessor)
    ids = torch.tensor([[50256, 50256, 40], [11, 12, 13]])  # [2, 3]
    scores = torch.zeros((2, 50304))
    out = proc(ids, scores)
    vocab = proc.vocab
    assert vocab is not None and vocab.vocab_size == 50304 and proc.prompt_length == 3
    ref = Matcher(structgen.compile_json_schema(schema), vocab)
    allowed = set(ref.allowed_token_ids())
    for row in range(2):
        assert set(torch.nonzero(torch.isfinite(out[row])).flatten().tolist()) == allowed
    assert torch.isinf(out[:, 50257:]).all()
    # feed "[" then "true": masks follow; EOS only once the array is complete
    lb = tok.convert_tokens_to_ids("[")
    true = tok.convert_tokens_to_ids("true")
    rb = tok.convert_tokens_to_ids("]")
    ids = torch.cat([ids, torch.tensor([[lb], [lb]])], 1)
    proc(ids, scores)
    ids = torch.cat([ids, torch.tensor([[true], [true]])], 1)
    proc(ids, scores)
    ids = torch.cat([ids, torch.tensor([[rb], [rb]])], 1)
    out = proc(ids, scores)
    assert torch.isfinite(out[:, 50256]).all()  # complete: EOS allowed
    ids = torch.cat([ids, torch.tensor([[50256], [50256]])], 1)
    out = proc(ids, scores)
    assert proc.is_finished(0) and proc.is_finished(1)
    assert [torch.isfinite(out[r]).nonzero().flatten().tolist() for r in range(2)] == [[50256]] * 2
    ids = torch.cat([ids, torch.tensor([[50256], [50256]])], 1)  # padding after EOS: ignored
    proc(ids, scores)
    # a token the grammar forbids -> typed error naming row and position
    proc.reset()
    proc(ids[:, :3], scores)
    with pytest.raises(TokenRejectedError, match="batch row 1") as ei:
        proc(torch.cat([ids[:, :3], torch.tensor([[lb], [true]])], 1), scores)
    assert ei.value.row == 1 and ei.value.position == 3 and ei.value.token_id == true
    with pytest.raises(ConfigError):
        StructgenLogitsProcessor("start: 'a'", tok)  # Lark text must go in grammar=
    with pytest.raises(ConfigError, match="2 grammars"):
        StructgenLogitsProcessor(SCHEMAS[:2], tok)(ids[:1, :3], scores[:1])


@pytest.fixture(scope="module")
def tiny_models(tokenizer_by_alias):
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    return {kind: CausalLM(build_tiny_llama(tok, kind), tok) for kind in ("random", "biased")}


def _left_padded(tok, prompts):
    ids = [tok.encode(p) for p in prompts]
    width = max(len(x) for x in ids)
    pad = tok.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    return input_ids, mask


def _generated(row: list[int], eos: int) -> list[int]:
    """Tokens up to and including the first EOS."""
    return row[: row.index(eos) + 1] if eos in row else row


@pytest.mark.assets
@pytest.mark.model
@pytest.mark.parametrize("kind", ["random", "biased"])
def test_processor_greedy_equals_plain_constrained_decoding(tiny_models, kind: str) -> None:
    lm = tiny_models[kind]
    tok = lm.tokenizer
    eos = tok.eos_token_id
    input_ids, mask = _left_padded(tok, PROMPTS)
    proc = StructgenLogitsProcessor(SCHEMAS, tok)  # mixed schemas: one per row
    out = lm.model.generate(input_ids=input_ids, attention_mask=mask, logits_processor=[proc],
                            do_sample=False, max_new_tokens=40, pad_token_id=eos)
    new = out[:, input_ids.shape[1]:].tolist()
    finished = 0
    for row, (prompt, schema) in enumerate(zip(PROMPTS, SCHEMAS)):
        # the logits processor knows no token budget: the reference cuts at it too
        ref = structgen.generate(lm, schema=schema, prompt=prompt, max_new_tokens=40,
                                 speculative=False, on_budget="cut")
        got = _generated(new[row], eos)
        assert got == ref.tokens, (row, tok.decode(got), ref.text)
        if ref.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(tok.decode(got[:-1])), schema)
    if kind == "biased":
        assert finished == len(PROMPTS)
    # one processor serves consecutive generate calls (a new batch starts afresh)
    proc = StructgenLogitsProcessor(SCHEMAS[2], tok)
    for rows in (slice(0, 3), slice(1, 2)):
        out = lm.model.generate(input_ids=input_ids[rows], attention_mask=mask[rows],
                                logits_processor=[proc], do_sample=False, max_new_tokens=40,
                                pad_token_id=eos)
    ref = structgen.generate(lm, schema=SCHEMAS[2], prompt=PROMPTS[1], max_new_tokens=40,
                             speculative=False)
    assert _generated(out[0, input_ids.shape[1]:].tolist(), eos) == ref.tokens


@pytest.mark.assets
@pytest.mark.model
def test_processor_look_ahead_keeps_greedy_output(tiny_models, monkeypatch) -> None:
    """With look-ahead on, every call hands each live row to the background thread, and greedy
    output is still plain constrained decoding's; by default nothing looks ahead; a bad
    setting is a typed error."""
    from structgen.frontends.json_schema import compiler as json_schema
    from structgen.grammar import compiler
    from structgen.masks import lookahead
    from structgen.masks import matcher as matcher_module

    lm = tiny_models["biased"]
    tok = lm.tokenizer
    eos = tok.eos_token_id
    input_ids, mask = _left_padded(tok, PROMPTS)
    submitted: list[object] = []
    real_submit = lookahead.submit
    monkeypatch.setattr(matcher_module, "submit", lambda holder, job: (submitted.append(holder),
                                                                      real_submit(holder, job)))
    # a fresh compile of each schema, looking ahead first: the background thread works on
    # tables nothing warmed before
    monkeypatch.setattr(compiler, "_CACHE", OrderedDict())
    monkeypatch.setattr(json_schema, "_CACHE", OrderedDict())
    for look_ahead in (True, False):
        submitted.clear()
        proc = StructgenLogitsProcessor(SCHEMAS, tok, **({"look_ahead": True} if look_ahead else {}))
        out = lm.model.generate(input_ids=input_ids, attention_mask=mask, logits_processor=[proc],
                                do_sample=False, max_new_tokens=30, pad_token_id=eos)
        assert lookahead.wait_idle()
        new = out[:, input_ids.shape[1]:].tolist()
        for row, (prompt, schema) in enumerate(zip(PROMPTS, SCHEMAS)):
            ref = structgen.generate(lm, schema=schema, prompt=prompt, max_new_tokens=30,
                                     speculative=False, on_budget="cut")
            assert _generated(new[row], eos) == ref.tokens, (look_ahead, row)
        if not look_ahead:
            assert submitted == []
        else:
            assert set(map(id, submitted)) == set(map(id, proc.matchers))
            assert len(submitted) >= len(PROMPTS) * 5
    with pytest.raises(ConfigError, match="look_ahead"):
        StructgenLogitsProcessor(SCHEMAS[0], tok, look_ahead="yes")  # type: ignore[arg-type]


@pytest.mark.assets
@pytest.mark.model
@pytest.mark.parametrize("kind", ["random", "biased"])
def test_processor_closes_within_max_new_tokens(tiny_models, kind: str) -> None:
    """With max_new_tokens the processor applies generate's budget rule: every row ends on
    EOS with a document that validates, and greedy output equals structgen.generate's."""
    lm = tiny_models[kind]
    tok = lm.tokenizer
    eos = tok.eos_token_id
    input_ids, mask = _left_padded(tok, PROMPTS)
    budget = 24
    proc = StructgenLogitsProcessor(SCHEMAS, tok, max_new_tokens=budget)
    out = lm.model.generate(input_ids=input_ids, attention_mask=mask, logits_processor=[proc],
                            do_sample=False, max_new_tokens=budget, pad_token_id=eos)
    new = out[:, input_ids.shape[1]:].tolist()
    for row, (prompt, schema) in enumerate(zip(PROMPTS, SCHEMAS)):
        got = _generated(new[row], eos)
        assert got[-1] == eos and len(got) <= budget, (row, tok.decode(got))
        jsonschema.validate(json.loads(tok.decode(got[:-1])), schema)
        ref = structgen.generate(lm, schema=schema, prompt=prompt, max_new_tokens=budget,
                                 speculative=False)
        assert got == ref.tokens, (row, tok.decode(got), ref.text)


@pytest.mark.assets
@pytest.mark.model
def test_processor_budget_below_shortest_output_is_typed(tiny_models) -> None:
    from structgen.errors import TokenBudgetError

    lm = tiny_models["biased"]
    tok = lm.tokenizer
    input_ids, mask = _left_padded(tok, PROMPTS[:2])
    proc = StructgenLogitsProcessor([SCHEMAS[0], PERSON], tok, max_new_tokens=3)
    with pytest.raises(TokenBudgetError) as err:
        lm.model.generate(input_ids=input_ids, attention_mask=mask, logits_processor=[proc],
                          do_sample=False, max_new_tokens=3, pad_token_id=tok.eos_token_id)
    assert err.value.request_index in (0, 1)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        StructgenLogitsProcessor(SCHEMAS[0], tok, max_new_tokens=0)


@pytest.mark.assets
@pytest.mark.model
def test_processor_sampling_outputs_are_valid(tiny_models) -> None:
    lm = tiny_models["biased"]
    tok = lm.tokenizer
    eos = tok.eos_token_id
    schema = SCHEMAS[0]
    input_ids, mask = _left_padded(tok, PROMPTS)
    input_ids = input_ids.repeat(2, 1)
    mask = mask.repeat(2, 1)
    proc = StructgenLogitsProcessor(schema, tok)
    torch.manual_seed(1)
    out = lm.model.generate(input_ids=input_ids, attention_mask=mask, logits_processor=[proc],
                            do_sample=True, temperature=1.5, top_k=200, max_new_tokens=40,
                            pad_token_id=eos)
    new = out[:, input_ids.shape[1]:].tolist()
    texts = set()
    finished = 0
    for row in new:
        got = _generated(row, eos)
        text = tok.decode([t for t in got if t != eos])
        if got[-1] == eos:
            finished += 1
            jsonschema.validate(json.loads(text), schema)
        else:  # cut short: still a viable prefix of the grammar
            assert structgen.compile_json_schema(schema).accepts_prefix(text)
        texts.add(text)
    assert finished >= 3
    assert len(texts) > 1  # it did sample


@pytest.mark.assets
@pytest.mark.model
def test_processor_beam_search_outputs_are_valid(tiny_models) -> None:
    lm = tiny_models["biased"]
    tok = lm.tokenizer
    eos = tok.eos_token_id
    input_ids, mask = _left_padded(tok, PROMPTS[:2])
    proc = StructgenLogitsProcessor(SCHEMAS[1], tok)
    out = lm.model.generate(input_ids=input_ids, attention_mask=mask, logits_processor=[proc],
                            do_sample=False, num_beams=3, max_new_tokens=30, pad_token_id=eos)
    for row in out[:, input_ids.shape[1]:].tolist():
        got = _generated(row, eos)
        assert got[-1] == eos
        jsonschema.validate(json.loads(tok.decode(got[:-1])), SCHEMAS[1])


def test_numpy_bitmask_rows() -> None:
    backend = StructgenBackend(vocab=_toy_vocab())
    g: StructgenGrammar = backend.compile_grammar("choice", CHOICES)
    arr = np.zeros((2, 1), dtype=np.int32)
    g.fill_bitmask(arr, 1)
    t = allocate_bitmask(2, 9)
    g.fill_bitmask(t, 0)
    assert arr[1, 0] == int(t[0, 0]) and arr[0, 0] == 0


def test_processor_free_text_sets_only_the_forbidden_logits(tokenizer_by_alias) -> None:
    """In free text (a triggered grammar between its triggers) the processor sets only the
    few forbidden logits; at every step its output equals the scores masked with the
    matcher's whole mask (oracle: a separate matcher's allowed ids), in a copy by default
    and in place with inplace=True."""
    from structgen.calls.triggered import Region, TriggeredGrammar, body_grammar, compile_triggered

    tok = tokenizer_by_alias("gpt2")
    region = Region("<tool_call>", body_grammar("json", {"type": "object", "properties": {
        "n": {"type": "integer"}}, "required": ["n"]}), "</tool_call>")
    g = compile_triggered(TriggeredGrammar((region,)))
    text = 'Let me check. <tool_call>{"n":12}</tool_call> Done <tool it is.'
    new = tok.encode(text)
    prompt = tok.encode("Hi")
    width = 50304  # wider than the tokenizer: the padding columns are forbidden too
    gen = torch.Generator().manual_seed(0)
    # float32 scores are written through a numpy view, others with a torch op; one row or two
    for inplace, dtype, rows in ((False, torch.float32, 1), (True, torch.float32, 1),
                                 (False, torch.bfloat16, 1), (True, torch.bfloat16, 2),
                                 (False, torch.float32, 2)):
        proc = StructgenLogitsProcessor(g, tok, inplace=inplace)
        ref = None
        few = 0
        for k in range(len(new) + 1):
            ids = torch.tensor([prompt + new[:k]] * rows)
            scores = torch.randn((rows, width), generator=gen).to(dtype)
            before = scores.clone()
            out = proc(ids, scores)
            if ref is None:
                ref = Matcher(g, proc.vocab)
            else:
                assert ref.accept_token(new[k - 1])
            allowed = torch.zeros(width, dtype=torch.bool)
            allowed[ref.allowed_token_ids()] = True
            want = before.masked_fill(~allowed, float("-inf"))
            assert torch.equal(out, want), (inplace, dtype, rows, k, tok.decode(new[:k]))
            assert (out is scores) == inplace and torch.equal(scores, want if inplace else before)
            few += proc.matchers[0].forbidden_token_ids() is not None
        assert few > len(new) // 2  # most steps are free text here


def _free_text_grammar():
    from structgen.calls.triggered import Region, TriggeredGrammar, body_grammar, compile_triggered

    region = Region("<tool_call>", body_grammar("json", {"type": "object", "properties": {
        "n": {"type": "integer"}}, "required": ["n"]}), "</tool_call>")
    return compile_triggered(TriggeredGrammar((region,)))


def test_processor_default_writes_in_place_only_what_nobody_keeps(tokenizer_by_alias) -> None:
    """inplace=None (the default): the first call of a generation returns a copy; later calls
    write into the scores they are given until the caller is seen keeping an earlier call's
    scores, and from then on copy. Oracle: each step's scores masked with a separate
    matcher's allowed ids; what the caller kept is never written after it was returned."""
    g = _free_text_grammar()
    width = 50304  # the padding columns past the tokenizer are forbidden in free text too
    tok = tokenizer_by_alias("gpt2")
    new = tok.encode("Let me check the weather for you in a moment, please wait here.")
    prompt = tok.encode("Hi")
    gen = torch.Generator().manual_seed(1)
    for keep_at in (None, 0, 3):  # a caller that keeps nothing, or every step's from keep_at
        proc = StructgenLogitsProcessor(g, tok)
        ref = Matcher(g, Vocabulary.from_tokenizer(tok, width))
        kept: list[tuple[torch.Tensor, torch.Tensor]] = []
        for k in range(len(new)):
            if k:
                assert ref.accept_token(new[k - 1])
            scores = torch.randn((1, width), generator=gen)
            before = scores.clone()
            out = proc(torch.tensor([prompt + new[:k]]), scores)
            allowed = torch.zeros(width, dtype=torch.bool)
            allowed[ref.allowed_token_ids()] = True
            assert torch.equal(out, before.masked_fill(~allowed, float("-inf")))
            in_place = out is scores
            # in place from the second call, until the call after the first kept scores
            assert in_place == (k >= 1 and (keep_at is None or k <= keep_at)), (keep_at, k)
            if keep_at is not None and k >= keep_at:
                kept.append((scores, scores.clone()))
            for t, values in kept:
                assert torch.equal(t, values)
            del out, scores
    # a caller that writes every step's scores into one buffer: in place from the second call
    proc = StructgenLogitsProcessor(g, tok)
    buf = torch.empty((1, width))
    for k in range(4):
        buf.copy_(torch.randn((1, width), generator=gen))
        assert (proc(torch.tensor([prompt + new[:k]]), buf) is buf) == (k >= 1)
    with pytest.raises(ConfigError, match="inplace"):
        StructgenLogitsProcessor(g, tok, inplace="yes")


@pytest.mark.assets
@pytest.mark.model
def test_processor_keeps_generate_output_logits_untouched(tiny_models) -> None:
    """generate(output_logits=..., output_scores=...) with the default processor: the raw
    logits are the model's own (no -inf; equal to inplace=False's), every step's scores are
    its own masked tensor equal to inplace=False's, and so are the tokens."""
    from transformers import LogitsProcessorList

    lm = tiny_models["random"]
    tok = lm.tokenizer
    g = _free_text_grammar()
    ids = torch.tensor([tok.encode("Hello there,")])

    def run(inplace, logits: bool, scores: bool):
        return lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 logits_processor=LogitsProcessorList([StructgenLogitsProcessor(
                                     g, tok, inplace=inplace)]), max_new_tokens=12,
                                 pad_token_id=tok.eos_token_id, return_dict_in_generate=True,
                                 output_logits=logits, output_scores=scores)

    copy = run(False, True, True)
    assert len(copy.logits) > 2
    assert all(not torch.isfinite(s).all() for s in copy.scores)  # something is forbidden
    for logits, scores in ((True, True), (True, False), (False, True)):
        auto = run(None, logits, scores)
        assert torch.equal(auto.sequences, copy.sequences)
        if logits:
            for step, (raw, want) in enumerate(zip(auto.logits, copy.logits)):
                assert torch.isfinite(raw).all() and torch.equal(raw, want), (scores, step)
        if scores:
            assert len({id(s) for s in auto.scores}) == len(auto.scores)
            for step, (s, want) in enumerate(zip(auto.scores, copy.scores)):
                assert torch.equal(s, want), (logits, step)
    # inplace=True writes into the tensor generate keeps as the raw logits
    assert not all(torch.isfinite(raw).all() for raw in run(True, True, False).logits)
