"""Do llama.cpp's logits for a position depend on how many positions a pass computes?

Writes the tiny GGUF models of ``tests/_tiny_gguf.py`` (f32, f16, q8_0, q4_0 at hidden 64; f32
and a llama.cpp-quantized Q4_K_M at hidden 256) to a temporary folder and prints, per weights
type and setting (``row_invariant`` scratch position, flash attention, weight repacking), the
largest absolute difference between the logits of an 8-position pass and those of one-position
passes (and of 2-position passes) over the same tokens. One thread. Needs llama-cpp-python.

    python -m benchmarks.llamacpp_row_invariance          # GGML_CPU_TILED_MM=0 (the backend's default)
    GGML_CPU_TILED_MM=1 python -m benchmarks.llamacpp_row_invariance
    python -m benchmarks.llamacpp_row_invariance --smoke  # f32 and q8_0, the backend's defaults only

``--out`` writes every row with the shared envelope of ``benchmarks/common/envelope.py``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.common import envelope as envelope_lib
from structgen.generation.llamacpp import load_gguf
from tests._tiny_gguf import quantize_gguf, write_tiny_gguf


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="f32 and q8_0 with the backend's defaults only")
    ap.add_argument("--out", type=Path, default=None, help="results JSON (default: none)")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv)
    folder = Path(tempfile.mkdtemp(prefix="gguf-inv-"))
    kinds = ("f32", "q8_0") if args.smoke else ("f32", "f16", "q8_0", "q4_0")
    paths = {w: write_tiny_gguf(folder / f"tiny-{w}.gguf", weights=w) for w in kinds}
    if not args.smoke:
        big = write_tiny_gguf(folder / "tiny256-f32.gguf", n_embd=256, n_ff=512, n_head=8, n_head_kv=2)
        paths["f32(256)"] = big
        paths["q4_k_m(256)"] = quantize_gguf(big, folder / "tiny256-q4km.gguf")
    # row_invariant, flash_attn, repack; the backend's defaults are (True, True, False)
    settings = [(True, True, False)] if args.smoke else list(
        itertools.product((False, True), (True, False), (False, True)))
    rows = []
    for name, p in paths.items():
        for ri, fa, rp in settings:
            lm = load_gguf(p, n_threads=1, n_ctx=512, row_invariant=ri, flash_attn=fa, repack=rp)
            ids = lm.tokenizer.encode('Extract: {"name": "Bob", "age": 41, "tags": ["a", "b"]} and more text')
            prefix, tail = ids[:10], ids[10:18]
            lm.reset()
            lm.extend(prefix, all_logits=False)
            alone = torch.cat([lm.extend([t]) for t in tail])
            lm.reset()
            lm.extend(prefix, all_logits=False)
            together = lm.extend(tail)
            lm.reset()
            lm.extend(prefix, all_logits=False)
            pairs = torch.cat([lm.extend(tail[i:i + 2]) for i in range(0, 8, 2)])
            d1, d2 = (together - alone).abs().max().item(), (together - pairs).abs().max().item()
            rows.append({"weights": name, "row_invariant": ri, "flash_attn": fa, "repack": rp,
                         "max_abs_diff_8_vs_1": d1, "max_abs_diff_8_vs_2": d2})
            print(f"{name:12s} row_invariant={ri!s:5} flash_attn={fa!s:5} repack={rp!s:5} | "
                  f"8 vs 1: {d1:.3g}  8 vs 2: {d2:.3g}", flush=True)
    if args.out is not None:
        envelope_lib.write(args.out, envelope, {"mode": "smoke" if args.smoke else "full", "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
