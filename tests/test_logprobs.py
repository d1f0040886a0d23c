"""``logprobs`` / ``top_logprobs``: the reported numbers against an oracle written here.

The oracle does not use the step machine: it runs the model itself over prompt + output in one
plain forward, computes the grammar's allowed tokens at every output position by brute force
over a finite language (every string of the regex is listed; a token is allowed when the
output so far plus its bytes is still a prefix of one of them, EOS when the output is one of
them), masks, divides by the temperature (1 when greedy), applies top-p as
``structgen/kernels/torch_ref.py`` documents it, and takes the log-softmax. The reported
logprob of every token and its ``top_logprobs`` must match it, greedy and sampled, speculative
or not, one sequence or a batch, through the Python API and through a real server with the
official ``openai`` client.
"""

from __future__ import annotations

import json
from itertools import product
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _servers import running  # noqa: E402

import structgen
from structgen.errors import ConfigError

pytestmark = pytest.mark.assets

NAMES = ("alice", "bob", "carol")
REGEX = r'\{"name": "(alice|bob|carol)", "age": [1-9][0-9]?\}'
LANGUAGE = [f'{{"name": "{n}", "age": {a}}}'.encode() for n, a in product(NAMES, range(1, 100))]
PROMPTS = ["Person:", "Give one person as JSON:"]
ATOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tokenizer_by_alias) -> SimpleNamespace:
    from _tiny_gguf import byte_to_unicode
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    model = build_tiny_llama(tok, "random")
    # each token's bytes from GPT-2's own byte-level spelling (not structgen's vocabulary)
    decoder = {c: b for b, c in byte_to_unicode().items()}
    by_bytes: dict[bytes, list[int]] = {}
    for i in range(len(tok)):
        if i == tok.eos_token_id:
            continue
        data = bytes(decoder[c] for c in tok.convert_ids_to_tokens(i))
        by_bytes.setdefault(data, []).append(i)
    return SimpleNamespace(lm=CausalLM(model, tok), model=model, tok=tok, eos=tok.eos_token_id,
                           eos_ids=[tok.eos_token_id], by_bytes=by_bytes,
                           bytes_of={i: b for b, ids in by_bytes.items() for i in ids})


def _allowed(t: SimpleNamespace, out: bytes) -> list[int]:
    """Tokens allowed after the output bytes ``out`` (brute force over the language)."""
    ids: set[int] = set()
    for w in LANGUAGE:
        if not w.startswith(out):
            continue
        rest = w[len(out):]
        for n in range(1, len(rest) + 1):
            ids.update(t.by_bytes.get(rest[:n], ()))
    if out in LANGUAGE:
        ids.update(t.eos_ids)
    return sorted(ids)


def _oracle(t: SimpleNamespace, prompt: list[int], tokens: list[int], temperature: float,
            top_p: float = 1.0) -> list[torch.Tensor]:
    """Per output token: the log-probabilities ``[V]`` it was drawn from (-inf: ruled out)."""
    with torch.no_grad():
        logits = t.model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0].float()  # [P+n-1, V]
    inv_t = torch.tensor(1.0) / torch.tensor(temperature) if temperature > 0 else torch.tensor(1.0)
    out = b""
    rows = []
    for j, tok in enumerate(tokens):
        v = logits[len(prompt) - 1 + j] * inv_t                                        # [V]
        allowed = torch.zeros_like(v, dtype=torch.bool)
        allowed[_allowed(t, out)] = True
        v = v.masked_fill(~allowed, float("-inf"))
        if temperature > 0 and top_p < 1:
            p = torch.softmax(v.double(), -1)
            order = torch.argsort(p, descending=True, stable=True)
            k = int(torch.searchsorted(torch.cumsum(p[order], 0), torch.tensor([top_p], dtype=torch.float64)))
            k = min(k, int(allowed.sum()) - 1)
            v = v.masked_fill(v < v[order[k]], float("-inf"))
        rows.append(torch.log_softmax(v, -1))
        assert rows[-1][tok] > float("-inf"), f"token {tok} at {j} is not allowed by the oracle"
        out += t.bytes_of.get(tok, b"")
    return rows


Entry = tuple[int, float, list[tuple[int, float]]]  # token, logprob, [(token, logprob)] top


def _check(rows: list[torch.Tensor], entries: list[Entry], k: int) -> None:
    """``entries``: (token, logprob, [(token, logprob)] top) per output token."""
    assert len(rows) == len(entries)
    for j, (row, (tok, lp, top)) in enumerate(zip(rows, entries)):
        assert lp == pytest.approx(float(row[tok]), abs=ATOL), (j, tok)
        finite = int(torch.isfinite(row).sum())
        assert len(top) == min(k, finite), (j, top)
        want, ids = torch.topk(row, len(top))
        assert [lp for _, lp in top] == pytest.approx(want.tolist(), abs=ATOL), j
        for (got_id, _), w_id, w_lp in zip(top, ids.tolist(), want.tolist()):
            close = torch.nonzero((row - w_lp).abs() < 1e-3).flatten().tolist()
            assert got_id == w_id or got_id in close, (j, got_id, w_id)  # ties may swap


def _entries(result: Any) -> list[Entry]:
    return [(e.token_id, e.logprob, [(a.token_id, a.logprob) for a in e.top_logprobs])
            for e in result.logprobs]


def _ids(t: SimpleNamespace, prompt: str) -> list[int]:
    from structgen.generation.api import prompt_ids

    return prompt_ids(t.lm, prompt, None)


# ---------------------------------------------------------------------------- Python API

@pytest.mark.parametrize("speculative", [False, True])
def test_greedy_logprobs_match_the_oracle(tiny, speculative: bool) -> None:
    for prompt in PROMPTS:
        r = structgen.generate(tiny.lm, regex=REGEX, prompt=prompt, max_new_tokens=48, on_budget="cut",
                               speculative=speculative, logprobs=True, top_logprobs=5)
        assert r.complete and r.tokens[-1] == tiny.eos and len(r.logprobs) == len(r.tokens)
        _check(_oracle(tiny, _ids(tiny, prompt), r.tokens, 0.0), _entries(r), 5)
        # the grammar-forced EOS (no forward pass): probability 1, its own only alternative
        last = r.logprobs[-1]
        assert last.logprob == 0.0 and [a.token_id for a in last.top_logprobs] == [tiny.eos]
        assert "".join(e.token for e in r.logprobs[:-1]) == r.text


def test_speculation_does_not_change_logprobs(tiny) -> None:
    runs = [structgen.generate(tiny.lm, regex=REGEX, prompt=PROMPTS[0], max_new_tokens=48,
                               speculative=s, logprobs=True, top_logprobs=3) for s in (False, True)]
    plain, spec = runs
    assert spec.tokens == plain.tokens
    assert spec.stats.forward_passes < plain.stats.forward_passes  # drafts were accepted
    for a, b in zip(_entries(plain), _entries(spec)):
        assert a[0] == b[0] and a[1] == pytest.approx(b[1], abs=ATOL)
        assert [x for x, _ in a[2]] == [x for x, _ in b[2]]


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sampled_logprobs_match_the_oracle(tiny, speculative: bool, seed: int, top_p: float) -> None:
    r = structgen.generate(tiny.lm, regex=REGEX, prompt=PROMPTS[0], max_new_tokens=48, on_budget="cut",
                           temperature=0.7, top_p=top_p, seed=seed, speculative=speculative,
                           logprobs=True, top_logprobs=4)
    _check(_oracle(tiny, _ids(tiny, PROMPTS[0]), r.tokens, 0.7, top_p), _entries(r), 4)


def test_batch_logprobs_match_the_oracle(tiny) -> None:
    rs = structgen.generate(tiny.lm, regex=REGEX, prompt=PROMPTS, max_new_tokens=48, on_budget="cut",
                            logprobs=True, top_logprobs=2)
    for prompt, r in zip(PROMPTS, rs):
        _check(_oracle(tiny, _ids(tiny, prompt), r.tokens, 0.0), _entries(r), 2)


def test_logprobs_off_by_default_and_checked(tiny) -> None:
    r = structgen.generate(tiny.lm, regex=REGEX, prompt=PROMPTS[0], max_new_tokens=48)
    assert r.logprobs is None
    r = structgen.generate(tiny.lm, regex=REGEX, prompt=PROMPTS[0], max_new_tokens=48, logprobs=True)
    assert all(e.top_logprobs == () for e in r.logprobs)
    for kw in ({"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}, {"logprobs": 1}):
        with pytest.raises(ConfigError):
            structgen.generate(tiny.lm, regex=REGEX, prompt=PROMPTS[0], max_new_tokens=8, **kw)


# ---------------------------------------------------------------------------- llama.cpp

def test_llamacpp_logprobs_match_its_logits(tmp_path) -> None:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from _tiny_gguf import write_tiny_gguf

    from structgen.generation.llamacpp import load_gguf
    from structgen.generation.model import vocabulary_for

    lm = load_gguf(str(write_tiny_gguf(tmp_path / "m.gguf")), n_threads=1, n_ctx=512)
    vocab = vocabulary_for(lm)
    prompt = "Person:"
    r = structgen.generate(lm, regex=REGEX, prompt=prompt, max_new_tokens=48, on_budget="cut",
                           logprobs=True, top_logprobs=3)
    ids = _ids(SimpleNamespace(lm=lm), prompt)
    lm.reset()
    lm.prefill(ids[:-1])
    logits = lm.extend(ids[-1:] + r.tokens[:-1]).float()                                  # [n, V]
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab.token_bytes):
        if b:
            by_bytes.setdefault(b, []).append(i)
    # two EOS tokens, <|endoftext|> and <|im_end|>: the last position has a forward pass
    t = SimpleNamespace(by_bytes=by_bytes, eos_ids=list(vocab.eos_token_ids))
    out = b""
    for j, e in enumerate(r.logprobs):
        allowed = torch.zeros(logits.shape[1], dtype=torch.bool)
        allowed[_allowed(t, out)] = True
        row = torch.log_softmax(logits[j].masked_fill(~allowed, float("-inf")), -1)
        assert e.logprob == pytest.approx(float(row[e.token_id]), abs=ATOL), j
        assert [a.logprob for a in e.top_logprobs] == pytest.approx(
            torch.topk(row, len(e.top_logprobs)).values.tolist(), abs=ATOL)
        out += vocab.token_bytes[e.token_id] or b""


# ---------------------------------------------------------------------------- the server

@pytest.fixture(scope="module")
def server(tiny):
    pytest.importorskip("uvicorn")
    openai = pytest.importorskip("openai")
    from structgen.serving.app import create_app
    from structgen.serving.engine import Engine

    engine = Engine(tiny.lm, max_running=4, max_queued=16, default_max_tokens=48, compile_workers=1)
    app = create_app(engine, model_name="tiny", api_key="k")
    with running(app) as url:
        yield SimpleNamespace(url=url, client=openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0,
                                                            timeout=120))


FMT = {"type": "regex", "regex": REGEX}
MESSAGES = [{"role": "user", "content": "Give one person as JSON."}]


def _chat_entries(tiny, content: list[Any]) -> list[Entry]:
    def tid(item: Any) -> int:
        ids = tiny.by_bytes.get(bytes(item.bytes), [])
        assert len(ids) == 1, item
        return ids[0]

    return [(tid(c), c.logprob, [(tid(a), a.logprob) for a in c.top_logprobs]) for c in content]


def test_chat_logprobs_match_the_oracle(tiny, server) -> None:
    from structgen.generation.api import prompt_ids

    r = server.client.chat.completions.create(model="tiny", messages=MESSAGES, logprobs=True, top_logprobs=3,
                                              extra_body={"response_format": FMT})
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and ch.logprobs.refusal is None
    content = ch.logprobs.content
    assert "".join(c.token for c in content) == ch.message.content
    entries = _chat_entries(tiny, content)
    tokens = [e[0] for e in entries] + [tiny.eos]  # the server leaves EOS out
    rows = _oracle(tiny, prompt_ids(tiny.lm, None, MESSAGES), tokens, 0.0)
    _check(rows[:-1], entries, 3)

    # streamed: each chunk carries its own tokens' entries; joined, the non-streamed ones
    chunks = list(server.client.chat.completions.create(model="tiny", messages=MESSAGES, logprobs=True,
                                                        top_logprobs=3, stream=True,
                                                        extra_body={"response_format": FMT}))
    streamed = [c for ch_ in chunks for c0 in ch_.choices if c0.logprobs for c in c0.logprobs.content]
    assert [(c.token, c.bytes, [a.token for a in c.top_logprobs]) for c in streamed] == \
        [(c.token, c.bytes, [a.token for a in c.top_logprobs]) for c in content]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=ATOL)
    # not asked: null
    r = server.client.chat.completions.create(model="tiny", messages=MESSAGES,
                                              extra_body={"response_format": FMT})
    assert r.choices[0].logprobs is None


def test_sampled_chat_logprobs_match_the_oracle(tiny, server) -> None:
    from structgen.generation.api import prompt_ids

    r = server.client.chat.completions.create(model="tiny", messages=MESSAGES, logprobs=True, top_logprobs=2,
                                              temperature=0.7, seed=5, extra_body={"response_format": FMT})
    entries = _chat_entries(tiny, r.choices[0].logprobs.content)
    tokens = [e[0] for e in entries] + [tiny.eos]
    _check(_oracle(tiny, prompt_ids(tiny.lm, None, MESSAGES), tokens, 0.7)[:-1], entries, 2)


def test_completion_logprobs_match_the_oracle(tiny, server) -> None:
    prompt = PROMPTS[1]
    r = server.client.completions.create(model="tiny", prompt=prompt, logprobs=2, max_tokens=48,
                                         extra_body={"response_format": FMT})
    ch = r.choices[0]
    lp = ch.logprobs
    assert "".join(lp.tokens) == ch.text
    assert lp.text_offset == [sum(len(x) for x in lp.tokens[:i]) for i in range(len(lp.tokens))]
    tokens = [tiny.by_bytes[x.encode()][0] for x in lp.tokens] + [tiny.eos]
    rows = _oracle(tiny, _ids(tiny, prompt), tokens, 0.0)
    entries = [(tok, v, [(tiny.by_bytes[s.encode()][0], w) for s, w in top.items()])
               for tok, v, top in zip(tokens, lp.token_logprobs, lp.top_logprobs)]
    _check(rows[:-1], entries, 2)
    # streamed: the same tokens, offsets counted across chunks
    chunks = list(server.client.completions.create(model="tiny", prompt=prompt, logprobs=2, max_tokens=48,
                                                   stream=True, extra_body={"response_format": FMT}))
    got = [(t, o) for c in chunks for c0 in c.choices if c0.logprobs
           for t, o in zip(c0.logprobs.tokens, c0.logprobs.text_offset)]
    assert got == list(zip(lp.tokens, lp.text_offset))


def test_bad_logprob_requests_are_400(server) -> None:
    import httpx

    def post(body: dict[str, Any], path: str = "/v1/chat/completions") -> httpx.Response:
        return httpx.post(server.url + path, content=json.dumps(body),
                          headers={"Authorization": "Bearer k", "Content-Type": "application/json"},
                          timeout=60)

    chat = {"messages": MESSAGES, "max_tokens": 4}
    for extra in ({"top_logprobs": 2}, {"logprobs": False, "top_logprobs": 2},
                  {"logprobs": True, "top_logprobs": 21}, {"logprobs": True, "top_logprobs": -1},
                  {"logprobs": 1}, {"logprobs": "yes"}, {"logprobs": True, "top_logprobs": 2.0}):
        r = post({**chat, **extra})
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["param"] in ("logprobs", "top_logprobs"), (extra, r.text)
    for bad in (6, -1, True, "2"):
        r = post({"prompt": "x", "max_tokens": 4, "logprobs": bad}, "/v1/completions")
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs", (bad, r.text)
    assert post({**chat, "logprobs": True, "top_logprobs": 0}).status_code == 200
    assert post({"prompt": "x", "max_tokens": 4, "logprobs": 0}, "/v1/completions").status_code == 200


def test_streamed_logprobs_with_reasoning_join_to_the_whole(server) -> None:
    """With reasoning (an OutputStream splits the output), each piece's entries ride on a chunk;
    joined they are the non-streamed list, which covers the whole output (thinking included)."""
    kw: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "logprobs": True, "top_logprobs": 1,
                          "max_tokens": 48,
                          "extra_body": {"reasoning": True, "thinking_budget": 6, "response_format": FMT}}
    whole = server.client.chat.completions.create(**kw).choices[0].logprobs.content
    chunks = list(server.client.chat.completions.create(stream=True, **kw))
    streamed = [c for ch in chunks for c0 in ch.choices if c0.logprobs for c in c0.logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in whole] and len(whole) > 6
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in whole], abs=ATOL)
