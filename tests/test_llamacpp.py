"""The llama.cpp backend (structgen/generation/llamacpp.py) on a tiny GGUF the tests write.

Oracles: plain one-token constrained decoding on the same backend (``speculative=False``) for
greedy exactness, ``jsonschema`` for validity, one-position passes for the logits of a
several-position verify pass, the sequence's output run alone for a batched run, and the
GGUF's own token strings for the vocabulary. Needs llama-cpp-python (``structgen[llamacpp]``);
without it every test but the missing-package error is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import jsonschema
import numpy as np
import pytest
import torch
from _schemas import NESTED, PERSON, STATUS_TAGS
from _tiny_gguf import CONTROL_TOKENS, byte_to_unicode, tiny_vocab, write_tiny_gguf

import structgen
from structgen.errors import AssetError
from structgen.generation.model import load_model

HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
needs_llama_cpp = pytest.mark.skipif(
    not HAVE_LLAMA_CPP,
    reason="llama-cpp-python is not installed (the structgen[llamacpp] extra; "
           "scripts/setup.sh with STRUCTGEN_LLAMACPP=1)")

SCHEMAS = [
    PERSON, STATUS_TAGS, NESTED,
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 500}, "maxItems": 6},
]

PROMPTS = [
    'Extract the name and the age: Alice is 30. JSON: {"name": "Alice", "age": 30}',
    'The ticket is "open" with tags a, b. Output: {"status": "open", "tags": ["a", "b"]}',
    "Give a JSON object with ok true, n 1.5 and child null:",
]


@pytest.fixture(scope="module")
def gguf_paths(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("gguf")
    return {w: str(write_tiny_gguf(folder / f"tiny-{w}.gguf", weights=w)) for w in ("f32", "f16", "q8_0")}


@pytest.fixture(scope="module")
def lm(gguf_paths):
    from structgen.generation.llamacpp import load_gguf

    return load_gguf(gguf_paths["f32"], n_threads=1, n_ctx=1024)


def test_missing_llama_cpp_is_a_clear_error(tmp_path, monkeypatch) -> None:
    """Without llama-cpp-python a GGUF path is an AssetError that says how to install it."""
    path = write_tiny_gguf(tmp_path / "m.gguf")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    from structgen.generation import llamacpp

    monkeypatch.setattr(llamacpp, "_MODELS", {})
    with pytest.raises(AssetError, match=r"structgen\[llamacpp\]"):
        load_model(str(path))


def test_missing_file_is_an_asset_error(tmp_path) -> None:
    with pytest.raises(AssetError, match="does not exist"):
        load_model(str(tmp_path / "absent.gguf"))


@needs_llama_cpp
def test_vocabulary_from_the_gguf(lm) -> None:
    """Per id the bytes of the GGUF's token string (byte-level spelling decoded); control tokens
    None; EOS = the GGUF's EOS (the only end-of-generation token of the tiny model)."""
    tokens, types, _merges = tiny_vocab()
    u2b = {u: b for b, u in byte_to_unicode().items()}
    vocab = lm.vocabulary()
    assert vocab.vocab_size == len(tokens) == lm.vocab_size
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        want = None if ty == 3 else bytes(u2b[c] for c in tok)
        assert vocab.token_bytes[i] == want, (i, tok)
    assert vocab.eos_token_ids[0] == 0 and set(vocab.special_ids) == set(range(len(CONTROL_TOKENS)))


@needs_llama_cpp
def test_tokenizer_round_trip_and_chat_template(lm) -> None:
    from structgen.generation.model import vocabulary_for

    vocab = vocabulary_for(lm)
    tok = lm.tokenizer
    for text in ['{"name": "Alice", "age": 30}', "héllo wörld ✓ 1234", "  spaces\n\nand\ttabs "]:
        ids = tok.encode(text, add_special_tokens=False)
        assert vocab.decode_bytes(ids) == text.encode("utf-8")
        assert tok.decode(ids) == text
    assert len(tok.encode('{"name":')) < len(b'{"name":')  # merges apply
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(2) == 1  # <|im_start|> and <|im_end|> parsed as special tokens


def _logits_one_by_one(lm, prefix: list[int], tokens: list[int]) -> torch.Tensor:
    lm.reset()
    lm.extend(prefix, all_logits=False)
    return torch.cat([lm.extend([t]) for t in tokens])


@needs_llama_cpp
@pytest.mark.parametrize("weights", ["f32", "f16", "q8_0"])
def test_verify_pass_logits_equal_one_position_passes(gguf_paths, weights: str) -> None:
    """Row invariance: the logits of each position of an 8-position pass equal, bit for bit,
    those of one-position passes (and after a crop the cache holds what it held before)."""
    from structgen.generation.llamacpp import load_gguf

    lm = load_gguf(gguf_paths[weights], n_threads=1, n_ctx=1024)
    ids = lm.tokenizer.encode('Extract: {"name": "Bob", "age": 41, "tags": ["a", "b"]} and more text')
    prefix, tail = ids[:10], ids[10:18]
    alone = _logits_one_by_one(lm, prefix, tail)
    lm.reset()
    lm.extend(prefix, all_logits=False)
    together = lm.extend(tail)  # [8, V]
    assert together.shape == (8, lm.vocab_size)
    assert torch.equal(together, alone)
    # crop back and feed again: the same logits (the cache lost exactly the cropped positions)
    lm.crop(len(prefix) + 3)
    again = lm.extend(tail[3:])
    assert torch.equal(again, alone[3:])


@needs_llama_cpp
def test_scratch_position_only_where_one_column_rounds_otherwise(gguf_paths) -> None:
    """Float weights always get the scratch position (a one-column product takes another
    kernel); quantized ones get it only when the one-position pass measured on the scratch
    sequence differs from a longer pass. Either way the logits of one-position passes equal
    those of a longer pass (``test_verify_pass_logits_equal_one_position_passes``), and the
    measurement leaves the sequence's cache as it was."""
    from structgen.generation.llamacpp import load_gguf

    f32 = load_gguf(gguf_paths["f32"], n_threads=1, n_ctx=1024)
    assert f32.gguf.float_weights and f32.one_column_exact(f32.ctx) is False
    q8 = load_gguf(gguf_paths["q8_0"], n_threads=1, n_ctx=1024)
    assert not q8.gguf.float_weights
    ids = q8.tokenizer.encode("a few words of a prompt")
    q8.reset()
    q8.extend(ids[:-1], all_logits=False)
    before = q8.extend(ids[-1:])
    exact = q8.one_column_exact(q8.ctx)
    assert isinstance(exact, bool) and q8.gguf.one_column_exact == {1: exact}
    q8.crop(len(ids) - 1)
    assert torch.equal(q8.extend(ids[-1:]), before)


@needs_llama_cpp
@pytest.mark.parametrize("weights", ["f32", "q8_0"])
def test_batched_step_as_one_decode_or_a_decode_per_row_gives_the_same_logits(gguf_paths, weights) -> None:
    """A batched step runs as one decode or as a decode per row, whichever the measured decode
    times say is faster (per row only where a lone position needs no scratch position); both
    give every row the logits of its one-position passes."""
    from structgen.generation.llamacpp import load_gguf

    lm = load_gguf(gguf_paths[weights], n_threads=1, n_ctx=1024)
    ids = lm.tokenizer.encode('Extract: {"name": "Bob", "age": 41} and some more of the text')
    prefixes = [ids[:8], ids[:11], ids[:9]]
    fed = [[ids[8]], ids[11:14], [ids[9]]]
    alone = [_logits_one_by_one(lm, p, f) for p, f in zip(prefixes, fed)]
    for per_row in (False, True, None):
        kv = lm.new_batch_cache()
        kv.prefill(prefixes)
        if per_row is not None and not (per_row and lm.gguf.float_weights):
            kv._per_row_cheaper = lambda fed, choice=per_row: choice
        step = kv.extend(fed)
        assert torch.equal(step, torch.cat(alone)), per_row


@needs_llama_cpp
def test_k_quant_passes_are_row_invariant_with_the_tiled_kernel(tmp_path) -> None:
    """On K-quant weights ggml's tiled kernel (on unless GGML_CPU_TILED_MM=0) serves products of
    8+ columns: every position of a 16-position verify pass and of a batched step still equals,
    bit for bit, its one-position pass, while a prompt prefill runs in one decode."""
    from _tiny_gguf import quantize_gguf

    from structgen.generation.llamacpp import ROW_INVARIANT_COLUMNS, load_gguf, tiled_kernel_enabled

    src = write_tiny_gguf(tmp_path / "tiny256-f32.gguf", n_embd=256, n_ff=512, n_head=8, n_head_kv=2)
    lm = load_gguf(quantize_gguf(src, tmp_path / "tiny256-q4km.gguf"), n_threads=1, n_ctx=1024)
    assert lm.gguf.max_logit_columns == (ROW_INVARIANT_COLUMNS if tiled_kernel_enabled() else None)
    ids = lm.tokenizer.encode('Extract: {"name": "Bob", "age": 41, "tags": ["a", "b", "c"]} and more of '
                              'the same text to feed')
    prefix, tail = ids[:12], ids[12:28]
    alone = _logits_one_by_one(lm, prefix, tail)
    lm.reset()
    lm.extend(prefix, all_logits=False)
    assert torch.equal(lm.extend(tail), alone)
    kv = lm.new_batch_cache()
    kv.prefill([prefix, prefix[:-2]])
    step = kv.extend([tail[:9], prefix[-2:] + tail[:7]])  # 18 positions, two rows
    assert torch.equal(step[:9], alone[:9])
    assert torch.equal(step[11:], alone[:7])


@needs_llama_cpp
@pytest.mark.parametrize("case", range(len(SCHEMAS)))
def test_greedy_speculative_equals_plain(lm, case: int) -> None:
    schema = SCHEMAS[case]
    for prompt in PROMPTS:
        plain = structgen.generate(lm, schema=schema, prompt=prompt, max_new_tokens=60, speculative=False)
        spec = structgen.generate(lm, schema=schema, prompt=prompt, max_new_tokens=60)
        assert spec.tokens == plain.tokens, (case, prompt)
        if plain.complete:
            jsonschema.validate(json.loads(spec.text), schema)
        assert spec.stats.forward_passes <= plain.stats.forward_passes


@needs_llama_cpp
def test_outputs_finish_and_validate(lm) -> None:
    """The biased tiny model ends its outputs: every (schema, prompt) pair gives a complete,
    valid document within 60 tokens."""
    for schema in SCHEMAS:
        for prompt in PROMPTS:
            r = structgen.generate(lm, schema=schema, prompt=prompt, max_new_tokens=60)
            assert r.complete, (schema, prompt, r.text)
            jsonschema.validate(json.loads(r.text), schema)


@needs_llama_cpp
def test_batch_equals_one_at_a_time(lm) -> None:
    """Sixteen mixed-schema requests in one call: each output equals its run alone (greedy)."""
    prompts = [PROMPTS[i % len(PROMPTS)] + " more" * i for i in range(16)]
    schemas = [SCHEMAS[i % len(SCHEMAS)] for i in range(16)]
    batch = structgen.generate(lm, schema=schemas, prompt=prompts, max_new_tokens=60)
    assert batch.stats.forward_passes < sum(r.stats.forward_passes for r in batch)
    for p, s, got in zip(prompts, schemas, batch):
        alone = structgen.generate(lm, schema=s, prompt=p, max_new_tokens=60, speculative=False)
        assert got.tokens == alone.tokens, (p, s)


@needs_llama_cpp
def test_messages_use_the_gguf_chat_template(lm) -> None:
    msgs = [{"role": "user", "content": "Give me a person as JSON."}]
    r = structgen.generate(lm, schema=SCHEMAS[0], messages=msgs, max_new_tokens=60)
    jsonschema.validate(json.loads(r.text), SCHEMAS[0])


def test_gguf_writer_is_deterministic(tmp_path) -> None:
    a = write_tiny_gguf(tmp_path / "a.gguf", weights="f16").read_bytes()
    b = write_tiny_gguf(tmp_path / "b.gguf", weights="f16").read_bytes()
    assert a == b and a[:4] == b"GGUF"
    assert np.frombuffer(a[4:8], dtype="<u4")[0] == 3  # GGUF version


def test_cli_names_a_missing_gguf_file(tmp_path, capsys) -> None:
    """`structgen generate --model X.gguf` with no such file: exit 2, one line naming it."""
    from structgen.cli import main

    (tmp_path / "s.json").write_text(json.dumps(PERSON))
    rc = main(["generate", "--model", str(tmp_path / "absent.gguf"), "--schema", str(tmp_path / "s.json"),
               "--prompt", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and "absent.gguf does not exist" in err, err


@needs_llama_cpp
def test_cli_generates_with_a_gguf_file(gguf_paths, tmp_path, capsys) -> None:
    """`structgen generate --model X.gguf` runs the llama.cpp backend: a complete value that
    validates (jsonschema), equal to what the Python API gives for the same file."""
    from structgen.cli import main

    (tmp_path / "s.json").write_text(json.dumps(PERSON))
    rc = main(["generate", "--model", gguf_paths["f32"], "--schema", str(tmp_path / "s.json"),
               "--prompt", PROMPTS[0], "--max-new-tokens", "40"])
    out = capsys.readouterr().out
    assert rc == 0, out
    line = json.loads(out.splitlines()[0])
    assert line["valid"] and jsonschema.Draft202012Validator(PERSON).is_valid(line["value"])
    api = structgen.generate(gguf_paths["f32"], schema=PERSON, prompt=PROMPTS[0], max_new_tokens=40)
    assert api.text == line["text"]


@needs_llama_cpp
@pytest.mark.parametrize("how", ["flag", "config"])
def test_cli_threads_reach_llama_cpp(gguf_paths, tmp_path, capsys, monkeypatch, how) -> None:
    """`--threads N` (or `generation.threads: N` in the YAML file) is llama.cpp's thread count:
    the context the run decodes with reports N threads (llama_n_threads)."""
    from structgen.cli import main
    from structgen.generation import llamacpp

    seen: list[int] = []
    real = llamacpp._Context.decode

    def spy(self, *a, **k):
        seen.append(int(self.lib.llama_n_threads(self.ptr)))
        return real(self, *a, **k)

    monkeypatch.setattr(llamacpp._Context, "decode", spy)
    (tmp_path / "s.json").write_text(json.dumps(PERSON))
    extra = ["--threads", "3"]
    if how == "config":
        (tmp_path / "c.yaml").write_text("generation:\n  threads: 3\n")
        extra = ["--config", str(tmp_path / "c.yaml")]
    rc = main(["generate", "--model", gguf_paths["f32"], "--schema", str(tmp_path / "s.json"),
               "--prompt", PROMPTS[0], "--max-new-tokens", "40", *extra])
    assert rc == 0, capsys.readouterr().err
    assert seen and set(seen) == {3}


def test_cli_refuses_zero_threads(tmp_path, capsys) -> None:
    from structgen.cli import main

    (tmp_path / "s.json").write_text(json.dumps(PERSON))
    rc = main(["generate", "--model", str(tmp_path / "m.gguf"), "--schema", str(tmp_path / "s.json"),
               "--prompt", "x", "--threads", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--threads" in err, err


@needs_llama_cpp
def test_gguf_draft_model_is_exact(gguf_paths) -> None:
    """A GGUF draft model (q8_0 weights of the same tiny model) for a GGUF target: it drafts,
    and the greedy output equals plain decoding of the target."""
    from structgen.generation.llamacpp import load_gguf

    target = load_gguf(gguf_paths["f32"], n_threads=1, n_ctx=1024)
    draft = load_gguf(gguf_paths["q8_0"], n_threads=1, n_ctx=1024)
    for schema, prompt in zip(SCHEMAS, PROMPTS):
        plain = structgen.generate(target, schema=schema, prompt=prompt, max_new_tokens=60, speculative=False)
        spec = structgen.generate(target, schema=schema, prompt=prompt, max_new_tokens=60, draft_model=draft)
        assert spec.tokens == plain.tokens, (schema, prompt)
        assert spec.stats.drafters["draft_model"]["proposed"] > 0


@needs_llama_cpp
@pytest.mark.parametrize("script", ["lossless", "generate", "batch"])
def test_benchmark_smoke_on_llamacpp(script, tmp_path) -> None:
    """``python -m benchmarks.SCRIPT --backend llamacpp --smoke`` on the tiny GGUF: exit 0, and greedy
    speculative (and batched) outputs token-identical to plain one-at-a-time decoding."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / f"{script}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{script}", "--backend", "llamacpp",
                           "--smoke", "--out", str(out)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["envelope"]["command"][1:5] == ["-m", f"benchmarks.{script}", "--backend", "llamacpp"]
    if script == "lossless":
        s = report["summary"]
        assert s["backend"] == "llamacpp" and s["model"] == "tiny-gguf" and s["cases"] == s["passed"] == 2
    elif script == "generate":
        assert report["meta"]["backend"] == "llamacpp"
        assert report["summary"]["identical_greedy_outputs"] == "2/2"
    else:
        assert report["meta"]["backend"] == "llamacpp"
        for engine, s in report["summary"].items():
            if engine != "single-plain":
                assert s["identical_to_single_plain"] == "4/4", (engine, s)
