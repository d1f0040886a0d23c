"""How often the verify kernel's sampling race computes exact keys (its logarithms) for a block.

The Triton pass draws recovered and bonus tokens with a Gumbel race over the vocabulary: the key
of token i is ``v_i + g_i`` with ``g_i = -log(-log(u_i))`` from a per-token hash. A block of
2,048 tokens needs the two logarithms only where some token's cheap bound ``v_i + gb(u_i)``
(``triton_verify._gumbel_upper``: no logarithm) reaches the chunk's running key; other blocks are
skipped exactly (and a block whose max plus ``GUMBEL_BOUND`` cannot reach it skips the hash
too). This replays that rule with the torch reference's noise on the benchmark's
inputs (``benchmarks/verify.py``: batch 32 x 7 rows x V = 151,936, two chunks per row) and
prints the fractions of blocks that compute the hash and the exact keys. CPU only; about a minute::

    python benchmarks/verify_race_skip.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from verify import make_inputs  # noqa: E402

from structgen.verify import load_kernels  # noqa: E402

V, BLK, SPLITS = 151936, 2048, 2


def main() -> None:
    ref = load_kernels("torch_ref")
    inp = make_inputs(32, 6, V, torch.bfloat16, "cpu", "sample")
    logits = inp["target_logits"].float()
    allowed = ref.unpack_bitmask(inp["bitmask"], V)
    rows = logits.shape[0]
    seeds = ref.race_seeds(inp["uniforms"][:, 1])
    u = ref.race_uniforms(seeds, V)
    g = -torch.log(-torch.log(u))                             # as ref.gumbel_noise
    vm = torch.where(allowed, logits, float("-inf"))
    k = 127 - ((1.0 - u).view(torch.int32) >> 23)            # as triton_verify._gumbel_upper
    gb = k.to(torch.float32) * 0.6931471805599453 + 1e-3
    assert bool((gb >= g).all())
    nblocks = math.ceil(V / BLK)
    per_split = math.ceil(nblocks / SPLITS)
    exact = hashed = total = 0
    for r in range(rows):
        for s in range(SPLITS):
            key = float("-inf")
            for j in range(s * per_split, min(nblocks, (s + 1) * per_split)):
                sl = slice(j * BLK, min(V, (j + 1) * BLK))
                v = vm[r, sl]
                total += 1
                if not float(v.max()) + ref.GUMBEL_BOUND >= key:    # the block's first test
                    continue
                hashed += 1
                if bool(((v > float("-inf")) & (v + gb[r, sl] >= key)).any()):
                    exact += 1
                    key = max(key, float((v + g[r, sl]).max()))
    print(f"race rows x blocks: {total}; the hash computed for {hashed / total:.1%} of the blocks, "
          f"exact keys (the logarithms) for {exact / total:.1%}")


if __name__ == "__main__":
    main()
