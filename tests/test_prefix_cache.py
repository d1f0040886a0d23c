"""The prefix cache (structgen/generation/prefix_cache.py) and its use by the llama.cpp backend.

Oracles: a fresh prefill of the same prompt with the cache off (its next-token logits, bit for
bit), plain decoding with the cache off for whole generations, and the cache's own counters for
what was reused. The llama.cpp tests run on the tiny GGUFs the tests write (f32, q8_0 and a
K-quant one) and need llama-cpp-python.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from _schemas import PERSON
from _tiny_gguf import write_tiny_gguf

import structgen
from structgen.generation.prefix_cache import BLOCK, PrefixCache

HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python is not installed")


# -- the cache alone ---------------------------------------------------------------------------

def _always(length: int) -> bool:
    return True


def test_lookup_finds_the_longest_saved_block_prefix() -> None:
    cache = PrefixCache(1 << 20)
    tokens = list(range(5 * BLOCK + 7))
    cache.save("v", tokens[: 2 * BLOCK], "two", 10)
    cache.save("v", tokens[: 4 * BLOCK], "four", 10)
    assert cache.lookup("v", tokens, _always) == (4 * BLOCK, "four")
    assert cache.lookup("v", tokens, lambda n: n <= 3 * BLOCK) == (2 * BLOCK, "two")
    other = tokens[:3 * BLOCK] + [9999] + tokens[3 * BLOCK + 1:]
    assert cache.lookup("v", other, _always) == (2 * BLOCK, "two")
    assert cache.lookup("w", tokens, _always) == (0, None)   # another variant sees nothing
    assert cache.lookup("v", tokens[: BLOCK - 1], _always) == (0, None)
    assert cache.stats.hits == 3 and cache.stats.tokens_reused == 4 * BLOCK + 2 * BLOCK + 2 * BLOCK


def test_memory_bound_evicts_least_recently_used() -> None:
    cache = PrefixCache(250)
    a, b, c = ([k] * BLOCK for k in (1, 2, 3))
    cache.save("v", a, "a", 100)
    cache.save("v", b, "b", 100)
    assert cache.lookup("v", a, _always)[1] == "a"   # a is now the most recently used
    cache.save("v", c, "c", 100)                      # 300 bytes > 250: b goes
    assert cache.lookup("v", b, _always) == (0, None)
    assert cache.lookup("v", a, _always)[1] == "a" and cache.lookup("v", c, _always)[1] == "c"
    assert cache.stats.bytes == 200 and cache.stats.evicted == 1
    cache.save("v", [4] * BLOCK, "too big", 251)     # larger than the bound: never kept
    assert cache.lookup("v", [4] * BLOCK, _always) == (0, None)
    off = PrefixCache(0)
    off.save("v", a, "a", 1)
    assert off.lookup("v", a, _always) == (0, None) and off.plan("v", a, 0, _always) == []


def test_copies_of_the_cache_start_empty() -> None:
    """A deep copy or a pickle of a model carries an empty cache of the same bound (a copy of
    the weights may compute other values, e.g. with the stock attention)."""
    import copy
    import pickle

    cache = PrefixCache(1000, block=16)
    cache.save("v", [1] * 16, "s", 10)
    for other in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert other.max_bytes == 1000 and other.block == 16
        assert other.lookup("v", [1] * 16, _always) == (0, None)


def test_plan_saves_at_the_end_the_hint_and_where_prompts_branch() -> None:
    cache = PrefixCache(1 << 20)
    system = list(range(1000, 1000 + 3 * BLOCK + 10))
    first = system + [1, 2, 3] * 60
    n = len(first)
    last = (n - BLOCK) // BLOCK * BLOCK

    def allowed(length: int) -> bool:
        return length == n or length <= n - BLOCK

    cache.note([first])
    assert cache.plan("v", first, 0, allowed) == [last]
    assert cache.plan("v", first, 0, allowed, shared_prefix=len(system)) == [3 * BLOCK, last]
    second = system + [7, 8] * 40
    cache.note([second])
    # the first prompt now branches from the second after the system prompt
    assert 3 * BLOCK in cache.plan("v", first, 0, allowed)
    cache.save("v", first[: 3 * BLOCK], "s", 1)
    assert 3 * BLOCK not in cache.plan("v", first, 0, allowed)     # saved already
    assert cache.plan("v", first, last, allowed) == []             # nothing above the start


# -- the llama.cpp backend ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("prefix")
    out = {w: str(write_tiny_gguf(folder / f"tiny-{w}.gguf", weights=w)) for w in ("f32", "q8_0")}
    if HAVE_LLAMA_CPP:
        from _tiny_gguf import quantize_gguf

        src = write_tiny_gguf(folder / "tiny256-f32.gguf", n_embd=256, n_ff=512, n_head=8, n_head_kv=2)
        out["q4_k_m"] = str(quantize_gguf(src, folder / "tiny256-q4km.gguf"))
    return out


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def _next_logits(lm, ids: list[int]) -> torch.Tensor:
    lm.prefill(ids[:-1])
    return lm.extend(ids[-1:])


@needs_llama_cpp
@pytest.mark.parametrize("weights", ["f32", "q8_0", "q4_k_m"])
@pytest.mark.parametrize("threads", [1, 2])
def test_restored_prefix_gives_the_fresh_prefill_logits(gguf_files, weights: str, threads: int) -> None:
    """Prompts sharing a system prompt: the logits after a restored prefix equal, bit for bit,
    those of a fresh prefill with the cache off, whatever the lengths around block edges."""
    from structgen.generation.llamacpp import load_gguf

    lm = load_gguf(gguf_files[weights], n_threads=threads, n_ctx=2048)
    lm.prefix_cache.clear()
    hits, reused = lm.prefix_cache.stats.hits, lm.prefix_cache.stats.tokens_reused
    system = _prompt(1, 5 * BLOCK + 11, lm.vocab_size)
    cases = [system + _prompt(10 + k, tail, lm.vocab_size)
             for k, tail in enumerate([3, 40, 70, 200, 53, 600, 1])]
    cases.append(list(system))                      # the system prompt alone, then again
    cases.append(list(system))
    cases.append(system[: 4 * BLOCK + 1])           # ends exactly on a saved block edge
    lm.prefix_cache.max_bytes = 0                   # the oracle: fresh prefills
    fresh = [_next_logits(lm, ids) for ids in cases]
    lm.prefix_cache.max_bytes = 1 << 30
    for i, ids in enumerate(cases):
        assert torch.equal(_next_logits(lm, ids), fresh[i]), (weights, threads, i)
    st = lm.prefix_cache.stats
    assert st.restore_failures == 0
    assert st.hits - hits >= len(cases) - 2
    assert st.tokens_reused - reused >= 4 * BLOCK * (len(cases) - 2)


@needs_llama_cpp
def test_batched_rows_restore_and_join_exactly(gguf_files) -> None:
    """A batch of prompts sharing a system prompt: the first row's prefill saves it, the others
    restore it (also rows joining later); each row's step logits equal its fresh prefill's."""
    from structgen.generation.llamacpp import load_gguf

    lm = load_gguf(gguf_files["q8_0"], n_threads=1, n_ctx=2048)
    lm.prefix_cache.clear()
    system = _prompt(2, 4 * BLOCK + 5, lm.vocab_size)
    prompts = [system + _prompt(20 + k, 30 + 41 * k, lm.vocab_size) for k in range(5)]
    lm.prefix_cache.max_bytes = 0
    fresh = [_next_logits(lm, p) for p in prompts]
    lm.prefix_cache.max_bytes = 1 << 30
    hits = lm.prefix_cache.stats.hits
    kv = lm.new_batch_cache(rows=5)
    kv.prefill([p[:-1] for p in prompts[:3]])
    assert lm.prefix_cache.stats.hits == hits + 2    # rows 1 and 2 restored row 0's system prompt
    assert kv.join([p[:-1] for p in prompts[3:]])
    assert lm.prefix_cache.stats.hits == hits + 4
    assert not kv.join([prompts[0][:-1]])           # no free sequence left
    step = kv.extend([p[-1:] for p in prompts])
    for r in range(5):
        assert torch.equal(step[r: r + 1], fresh[r]), r
    kv.select([4, 1])                                # rows leave; their sequences are reused
    assert kv.join([prompts[2][:-1]])
    step = kv.extend([prompts[4][-1:], prompts[1][-1:], prompts[2][-1:]])
    assert torch.equal(step[2:3], fresh[2])
    # the one-sequence cache after the batched one, then a batched cache of more streams:
    # states do not cross cache layouts (llama.cpp refuses them)
    assert torch.equal(_next_logits(lm, prompts[3]), fresh[3])
    wider = lm.new_batch_cache(rows=7)
    wider.prefill([prompts[1][:-1]])
    assert torch.equal(wider.extend([prompts[1][-1:]]), fresh[1])
    assert lm.prefix_cache.stats.restore_failures == 0


@needs_llama_cpp
def test_generate_with_a_shared_system_prompt_is_unchanged(gguf_files) -> None:
    """Whole generations through messages with one system prompt: the same tokens with the
    cache on as with it off, and later calls restore the system prompt."""
    from structgen.generation.llamacpp import load_gguf

    lm = load_gguf(gguf_files["f32"], n_threads=1, n_ctx=2048)
    system = "You extract people from text. " + " ".join(f"Rule {i}: keep field {i}." for i in range(40))
    questions = ["Alice is 30.", "Bob is 41 and lives in Paris.", "Carol, 25."]

    def run(q: str):
        return structgen.generate(lm, schema=PERSON, max_new_tokens=40,
                                  messages=[{"role": "system", "content": system},
                                            {"role": "user", "content": q}])

    lm.prefix_cache.clear()
    lm.prefix_cache.max_bytes = 0
    plain = [run(q).tokens for q in questions]
    lm.prefix_cache.max_bytes = 1 << 30
    hits = lm.prefix_cache.stats.hits
    cached = [run(q).tokens for q in questions]
    assert cached == plain
    assert lm.prefix_cache.stats.hits >= hits + len(questions) - 1


# -- the transformers backend ------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_lm(tokenizer_by_alias):
    from _tiny_lm import build_tiny_llama

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    return CausalLM(build_tiny_llama(tok, "biased", hidden_size=128, intermediate_size=256), tok)


def test_transformers_restored_prefix_gives_the_fresh_prefill_logits(tiny_lm) -> None:
    """The transformers backend: restored prefixes (block edges of 128) then the rest give the
    logits of a fresh prefill with the cache off, bit for bit; rows of a batched prefill too."""
    from structgen.generation.model import BatchKV

    lm = tiny_lm
    lm.prefix_cache.clear()
    system = _prompt(3, 2 * 128 + 40, 50000)
    cases = [system + _prompt(30 + k, tail, 50000) for k, tail in enumerate([5, 90, 200, 1])]
    cases.append(list(system))
    lm.prefix_cache.max_bytes = 0
    fresh = [_next_logits(lm, ids) for ids in cases]
    lm.prefix_cache.max_bytes = 1 << 30
    hits = lm.prefix_cache.stats.hits
    for i, ids in enumerate(cases):
        assert torch.equal(_next_logits(lm, ids), fresh[i]), i
    assert lm.prefix_cache.stats.hits - hits >= len(cases) - 1

    def batch_step() -> torch.Tensor:
        kv = BatchKV(lm)
        kv.prefill([p[:-1] for p in cases[:3]])
        return kv.extend([p[-1:] for p in cases[:3]])

    lm.prefix_cache.max_bytes = 0
    fresh_step = batch_step()
    lm.prefix_cache.max_bytes = 1 << 30
    hits = lm.prefix_cache.stats.hits
    assert torch.equal(batch_step(), fresh_step)
    assert lm.prefix_cache.stats.hits - hits == 3


def test_transformers_generate_is_unchanged_by_the_cache(tiny_lm) -> None:
    lm = tiny_lm
    prompts = ["Rules: " + "copy every value exactly as written. " * 30 + f"Person {k}: " for k in range(3)]

    def run(prompt: str):
        return structgen.generate(lm, schema=PERSON, prompt=prompt, max_new_tokens=30).tokens

    lm.prefix_cache.max_bytes = 0
    plain = [run(p) for p in prompts]
    lm.prefix_cache.max_bytes = 1 << 30
    hits = lm.prefix_cache.stats.hits
    assert [run(p) for p in prompts] == plain
    assert lm.prefix_cache.stats.hits > hits
