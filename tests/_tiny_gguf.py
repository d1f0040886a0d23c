"""A tiny llama-architecture GGUF model written by the tests themselves (no download).

:func:`write_tiny_gguf` writes a 2-layer Llama (hidden 64, 4 query heads, 2 key/value heads)
with random weights and a small but real byte-level BPE tokenizer: 3 control tokens
(``<|endoftext|>`` = BOS = EOS, ``<|im_start|>``, ``<|im_end|>``), the 256 byte tokens in
GPT-2's byte-to-unicode spelling, and a few hundred merges learned from a JSON-flavoured
corpus by :func:`train_bpe` (so tokens span several bytes, like ``"name"`` pieces and
``Ġtrue``). The metadata are the ``tokenizer.ggml.*`` keys llama.cpp reads for a ``gpt2``
(BPE) vocabulary with the ``qwen2`` pre-tokenizer, plus a ChatML chat template.

Like ``tests/_tiny_lm.py``'s ``kind="biased"``, every token embedding has a constant first
coordinate and the output matrix's first column is a per-token bias towards closing
punctuation and EOS, so grammar-constrained outputs end within a few dozen tokens. The weights
come from a seeded generator: the same arguments write the same file.

Needs the ``gguf`` package (``structgen[assets]``); costs a few milliseconds.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

_CORPUS = (
    '{"name": "Alice", "age": 30, "email": "alice@example.com", "active": true, "tags": ["a", "b"]}\n'
    '{"name": "Bob", "age": 41, "score": 1.5, "city": null, "active": false, "id": 12345}\n'
    '{"title": "The quick brown fox", "year": 2024, "items": [1, 2, 3], "ok": true}\n'
    "Extract the name, the age and the city of the person as JSON. Return only the object.\n"
    "The person is called Carol, she is 27 years old and lives in Paris; her id is 9.\n"
    "user assistant system: answer with a JSON value that matches the schema.\n"
)

# words of the corpus: runs of letters (with one leading space or quote), single digits, and
# runs of other characters, as the qwen2 pre-tokenizer splits them (close enough for merges)
_WORD = re.compile(r"""[^\r\n\w]?[A-Za-z]+|\d| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+""")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the spelling of byte-level tokens)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def train_bpe(text: str, n_merges: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges (in byte-to-unicode spelling) learned greedily from ``text``:
    the most frequent adjacent pair inside a word is merged, ties broken by the pair's
    spelling, until ``n_merges`` merges or no pair occurs twice. Deterministic."""
    b2u = byte_to_unicode()
    words = Counter("".join(b2u[b] for b in w.encode("utf-8")) for w in _WORD.findall(text))
    split = {w: list(w) for w in words}
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, parts in split.items():
            for a, b in zip(parts, parts[1:]):
                pairs[(a, b)] += words[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        for w, parts in split.items():
            out: list[str] = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            split[w] = out
    return merges


def tiny_vocab(n_merges: int = 300) -> tuple[list[str], list[int], list[str]]:
    """(token strings, token types, merges as ``"a b"`` lines) of the tiny tokenizer.
    Types: 3 = control, 1 = normal (llama.cpp's ``LLAMA_TOKEN_TYPE_*``)."""
    b2u = byte_to_unicode()
    merges = train_bpe(_CORPUS * 3, n_merges)
    tokens = list(CONTROL_TOKENS) + [b2u[b] for b in range(256)]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            tokens.append(a + b)
            seen.add(a + b)
    types = [3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS))
    return tokens, types, [f"{a} {b}" for a, b in merges]


# token -> bias (first column of the output matrix; the hidden state's first coordinate is large)
_BIAS = [('"', 1.1), ("}", 1.0), ("]", 1.0), (",", 0.5), ("1", 0.3)]


def write_tiny_gguf(path: Path, *, seed: int = 0, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                    n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 1024, weights: str = "f32",
                    biased: bool = True) -> Path:
    """Write the tiny model to ``path`` and return it.

    ``weights``: the type of the 2-D weight matrices, ``"f32"``, ``"f16"``, ``"q8_0"`` or
    ``"q4_0"`` (quantized by the ``gguf`` package; ``n_embd`` and ``n_ff`` must then be
    multiples of 32); norms are always float32. ``biased=False`` leaves the weights purely
    random (outputs then often run to the length limit)."""
    import gguf

    tokens, types, merges = tiny_vocab()
    n_vocab = len(tokens)
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("structgen-tiny-llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[weights]

    def matrix(name: str, a: np.ndarray) -> None:
        # numpy shape (rows, columns) = (outputs, inputs), as in Hugging Face checkpoints
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    embd = normal(n_vocab, n_embd, scale=1.0)
    out = normal(n_vocab, n_embd, scale=4.0 / np.sqrt(n_embd))
    if biased:
        embd[:, 0] = 8.0
        out[:, 0] = 0.0
        index = {t: i for i, t in enumerate(tokens)}
        for token, bias in _BIAS:
            out[index[token], 0] = bias
        out[0, 0] = 1.2  # EOS
    matrix("token_embd.weight", embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        matrix(p + "attn_q.weight", normal(n_head * head_dim, n_embd, scale=n_embd ** -0.5))
        matrix(p + "attn_k.weight", normal(n_head_kv * head_dim, n_embd, scale=n_embd ** -0.5))
        matrix(p + "attn_v.weight", normal(n_head_kv * head_dim, n_embd, scale=n_embd ** -0.5))
        matrix(p + "attn_output.weight", normal(n_embd, n_head * head_dim, scale=0.5 * n_embd ** -0.5))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        matrix(p + "ffn_gate.weight", normal(n_ff, n_embd, scale=n_embd ** -0.5))
        matrix(p + "ffn_up.weight", normal(n_ff, n_embd, scale=n_embd ** -0.5))
        matrix(p + "ffn_down.weight", normal(n_embd, n_ff, scale=0.5 * n_ff ** -0.5))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    matrix("output.weight", out)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def quantize_gguf(src: Path, dst: Path, ftype: str = "q4_k_m") -> Path:
    """Quantize a GGUF with llama.cpp itself (``llama_model_quantize``; needs llama-cpp-python):
    ``ftype`` ``"q4_k_m"`` (Q4_K with Q6_K for some tensors, the usual CPU download) or
    ``"q8_0"``. K-quants need every matrix's input width to be a multiple of 256 (write the
    source with ``n_embd=256, n_ff=512``); other widths fall back to simpler types."""
    import llama_cpp

    codes = {"q4_k_m": 15, "q8_0": 7}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = codes[ftype]
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed with code {rc}")
    return Path(dst)
