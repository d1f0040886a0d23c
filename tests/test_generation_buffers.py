"""The generation loop's verify path: pooled buffers, the Triton backend, overlapped masks.

* Per step, the loop allocates no vocabulary-sized tensor outside the models' forwards and the
  verify kernel itself (oracle: every aten op's output storage is watched by a
  ``TorchDispatchMode``; a run of 3x the steps must allocate exactly as many such tensors as a
  short run, i.e. only per-call set-up). The Triton kernels' own scratch is pooled too
  (``test_verify_triton.py`` pins its pointers).
* With ``backend="triton"`` (the interpreter, in a spawned worker) generation is token-identical
  to plain constrained decoding on the torch reference (greedy; single and batched), and
  sampling gives the same tokens as the torch backend for the same seeds.
* Building masks while the forward runs (``overlap_masks``) changes nothing in the output.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from structgen.config import SpecConfig

pytestmark = pytest.mark.assets

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "tags": {"type": "array", "items": {"type": "string"},
                                                    "maxItems": 3}},
          "required": ["name", "tags"], "additionalProperties": False}
SCHEMA2 = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
           "required": ["ok", "n"], "additionalProperties": False}
PROMPTS = ['Extract: Bob Smith, tags "a" and "bb". JSON: {"name": "Bob Smith", "tags": ["a", "bb"]}',
           "Give a JSON object with ok true and n 7:",
           "name: Ann; tags: x, y:"]


def _setup(kind: str = "random") -> tuple[Any, Any, Any]:
    from _tiny_lm import build_tiny_llama
    from conftest import get_tokenizer_or_skip

    from structgen.generation.model import CausalLM
    from structgen.masks.vocab import Vocabulary

    tok = get_tokenizer_or_skip("gpt2")
    lm = CausalLM(build_tiny_llama(tok, kind), tok)
    return lm, tok, Vocabulary.from_tokenizer(tok)


def _compile(schema: dict) -> Any:
    import structgen

    return structgen.compile_json_schema(schema)


def _prompt_ids(tok: Any, text: str) -> list[int]:
    return list(tok(text)["input_ids"])


# --------------------------------------------------------------------------------------------
# allocation counting

class _VocabAllocations(TorchDispatchMode):
    """Counts op outputs with a dimension of at least ``min_dim`` (the mask width: every
    vocabulary-sized tensor has a ``V`` or ``ceil(V/32)`` dimension) on fresh storage (not an
    input's: views, in-place and ``out=`` results share their input's storage), outside paused
    spans."""

    def __init__(self, min_dim: int) -> None:
        super().__init__()
        self.min_dim = min_dim
        self.paused = 0
        self.hits: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.paused:
            seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor)}
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and max(t.shape, default=0) >= self.min_dim \
                        and t.untyped_storage().data_ptr() not in seen:
                    self.hits.append(f"{func} -> {tuple(t.shape)}")
        return out


def _pausing(mode: _VocabAllocations, fn: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        mode.paused += 1
        try:
            return fn(*args, **kwargs)
        finally:
            mode.paused -= 1
    return wrapped


@pytest.fixture(scope="module")
def setup() -> tuple[Any, Any, Any]:
    return _setup()


def _count_run(monkeypatch: pytest.MonkeyPatch, setup: Any, max_new: int, *, batch: bool,
               temperature: float = 0.0, draft: bool = False) -> tuple[int, list[str], int]:
    from structgen.generation import loop as speculative
    from structgen.generation import model
    from structgen.generation.verify import load_kernels

    lm, tok, vocab = setup
    words = (lm.vocab_size + 31) // 32
    mode = _VocabAllocations(words)
    # the models' forwards and the verify kernel are not the loop's own code
    for cls, name in ((model.CausalLM, "extend"), (model.BatchKV, "extend"), (model.BatchKV, "prefill"),
                      (model.CausalLM, "reset")):
        monkeypatch.setattr(cls, name, _pausing(mode, getattr(cls, name)))
    ref = load_kernels("torch_ref")
    monkeypatch.setattr(ref, "verify_reference", _pausing(mode, ref.verify_reference))
    cfg = SpecConfig(temperature=temperature, max_draft_tokens=6, backend="torch")
    draft_lm = lm if draft else None
    g = [_compile(SCHEMA), _compile(SCHEMA2), _compile(SCHEMA)]
    prompts = [_prompt_ids(tok, p) for p in PROMPTS]
    with mode:
        if batch:
            results, stats = speculative.run_batch(lm, vocab, g, prompts, cfg, max_new_tokens=max_new,
                                                   draft_lm=draft_lm, seeds=[1, 2, 3])
            steps = stats.forward_passes
        else:
            r = speculative.run_sequence(lm, vocab, g[0], prompts[0], cfg, max_new_tokens=max_new,
                                         draft_lm=draft_lm, seed=1)
            steps = r.stats.forward_passes
    return len(mode.hits), mode.hits, steps


@pytest.mark.parametrize("batch,temperature,draft", [(False, 0.0, False), (True, 0.0, False),
                                                     (True, 1.0, True), (False, 1.0, True)],
                         ids=["single-greedy", "batch-greedy", "batch-sampling-draft-model",
                              "single-sampling-draft-model"])
def test_no_vocabulary_sized_allocation_per_step(monkeypatch: pytest.MonkeyPatch, setup: Any,
                                                 batch: bool, temperature: float, draft: bool) -> None:
    # 12: at least the shortest output of every schema here (on_budget="close" checks it)
    short, short_hits, short_steps = _count_run(monkeypatch, setup, 12, batch=batch,
                                                temperature=temperature, draft=draft)
    long, long_hits, long_steps = _count_run(monkeypatch, setup, 40, batch=batch,
                                             temperature=temperature, draft=draft)
    # more steps in the long run: an allocation per step would then show as more hits (with
    # the mask columns beyond the vocabulary zeroed, the drafter skips forwards where one
    # token is left, so a sampled run needs few steps)
    assert long_steps > short_steps
    assert long == short, (short_hits, long_hits)


# --------------------------------------------------------------------------------------------
# overlapped masks

@pytest.mark.parametrize("batch", [False, True])
def test_overlapped_masks_change_nothing(setup: Any, batch: bool) -> None:
    from structgen.generation import loop as speculative

    lm, tok, vocab = setup
    g = [_compile(SCHEMA), _compile(SCHEMA2), _compile(SCHEMA)]
    prompts = [_prompt_ids(tok, p) for p in PROMPTS]
    outs = []
    for overlap in (False, True):
        cfg = SpecConfig(max_draft_tokens=6, overlap_masks=overlap)
        if batch:
            rs, _ = speculative.run_batch(lm, vocab, g, prompts, cfg, max_new_tokens=40)
            outs.append([r.tokens for r in rs])
        else:
            r = speculative.run_sequence(lm, vocab, g[0], prompts[0], cfg, max_new_tokens=40)
            outs.append(r.tokens)
            assert r.stats.time_masks > 0
    assert outs[0] == outs[1]


# --------------------------------------------------------------------------------------------
# the Triton backend in the loop (interpreter, in a spawned worker)

@pytest.fixture(scope="module")
def worker() -> Iterator[ProcessPoolExecutor]:
    pytest.importorskip("triton")
    from _interp import interpreter_worker

    yield from interpreter_worker()


def check_triton_generation() -> None:
    from structgen.generation import loop as speculative
    from structgen.generation.verify import load_kernels

    assert load_kernels("triton_verify").interpreter_active()
    lm, tok, vocab = _setup()
    g = [_compile(SCHEMA), _compile(SCHEMA2), _compile(SCHEMA)]
    prompts = [_prompt_ids(tok, p) for p in PROMPTS]
    plain = SpecConfig(max_draft_tokens=6, backend="torch")
    tri = SpecConfig(max_draft_tokens=6, backend="triton")
    for i in range(2):
        a = speculative.run_sequence(lm, vocab, g[i], prompts[i], plain, speculative=False, max_new_tokens=30)
        b = speculative.run_sequence(lm, vocab, g[i], prompts[i], tri, max_new_tokens=30)
        assert a.tokens == b.tokens, (i, a.tokens, b.tokens)
        assert b.stats.drafted > 0
    rs_a, _ = speculative.run_batch(lm, vocab, g, prompts, plain, speculative=False, max_new_tokens=24)
    rs_b, _ = speculative.run_batch(lm, vocab, g, prompts, tri, max_new_tokens=24)
    assert [r.tokens for r in rs_a] == [r.tokens for r in rs_b]
    # sampling, with draft-model probabilities: the same draws on both backends
    for backend_cfg in ((SpecConfig(temperature=1.0, max_draft_tokens=4, backend="torch"),
                         SpecConfig(temperature=1.0, max_draft_tokens=4, backend="triton")),):
        got = [speculative.run_batch(lm, vocab, g, prompts, c, max_new_tokens=16, draft_lm=lm,
                                     seeds=[5, 6, 7])[0] for c in backend_cfg]
        assert [r.tokens for r in got[0]] == [r.tokens for r in got[1]]


def test_generation_with_triton_backend(worker: ProcessPoolExecutor) -> None:
    worker.submit(check_triton_generation).result(timeout=900)


def test_seeded_batch_sampling_is_reproducible(setup: Any) -> None:
    """With every seed given, a batch's draft cuts do not depend on measured step times."""
    from structgen.generation import loop as speculative

    lm, tok, vocab = setup
    g = [_compile(SCHEMA), _compile(SCHEMA2), _compile(SCHEMA)]
    prompts = [_prompt_ids(tok, p) for p in PROMPTS]
    cfg = SpecConfig(temperature=1.0, max_draft_tokens=4)
    runs = [[r.tokens for r in speculative.run_batch(lm, vocab, g, prompts, cfg, max_new_tokens=16,
                                                      draft_lm=lm, seeds=[5, 6, 7])[0]] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
