"""How often the verify kernel's sampling race computes exact keys (its logarithms) for a block.

The Triton pass draws recovered and bonus tokens with a Gumbel race over the vocabulary: the key
of token i is ``v_i + g_i`` with ``g_i = -log(-log(u_i))`` from a per-token hash. A block of
2,048 tokens needs the two logarithms only where some token's cheap bound ``v_i + gb(u_i)``
(``triton_verify._gumbel_upper``: no logarithm) reaches the chunk's running key; other blocks are
skipped exactly (and a block whose max plus ``GUMBEL_BOUND`` cannot reach it skips the hash
too). This replays that rule with the torch reference's noise and prints the fractions of
blocks that compute the hash and the exact keys. CPU only.

Two sources of rows:

- ``--logits synthetic`` (default): the benchmark's inputs (``benchmarks/verify.py``: batch 32
  x 7 rows x V = 151,936, peaked random logits, random masks), about a minute::

      python -m benchmarks.verify_race_skip

- ``--logits real``: a real model's logits along grammar-constrained sampled trajectories of the
  extraction tasks (``benchmarks/tasks/suite.py``), each row masked by the grammar's bitmask at that
  position, scaled by ``1 / temperature`` and rounded to bfloat16 as the kernel reads them.
  Every position is replayed as a bonus row (the race over all allowed tokens); rows are also
  reported by how many tokens the grammar allows (free-text positions allow most of the
  vocabulary)::

      python -m benchmarks.verify_race_skip --logits real --model qwen2.5-coder-0.5b

``--smoke`` (CI): the synthetic rows at batch 2 x 7 rows x V = 16,384, a few seconds. ``--out``
writes the figures with the shared envelope of ``benchmarks/common/envelope.py``.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch

from benchmarks.common import envelope as envelope_lib
from benchmarks.verify import make_inputs
from structgen.generation.verify import load_kernels

ref = load_kernels("torch_ref")
BLK = 2048
# allowed-token count buckets for --logits real: [lo, hi)
BUCKETS = ((1, 2), (2, 1024), (1024, 32768), (32768, 1 << 30))


def replay(vm: torch.Tensor, u01: torch.Tensor, splits: int) -> list[tuple[int, int, int]]:
    """Per row ``(blocks, hashed, exact)`` of the race's skip rule on viable scaled logits
    ``vm`` float32 ``[R, V]`` (-inf where not allowed), each row's race seeded from its float64
    uniform ``u01`` ``[R]`` as the reference seeds it."""
    V = vm.shape[1]
    seeds = ref.race_seeds(u01)                               # int64 [R]
    u = ref.race_uniforms(seeds, V)                           # [R, V]
    g = ref.gumbel_noise(seeds, V)                            # [R, V]
    k = 127 - ((1.0 - u).view(torch.int32) >> 23)            # as triton_verify._gumbel_upper
    gb = k.to(torch.float32) * 0.6931471805599453 + 1e-3
    assert bool((gb >= g).all())
    nblocks = math.ceil(V / BLK)
    per_split = math.ceil(nblocks / splits)
    out = []
    for r in range(vm.shape[0]):
        total = hashed = exact = 0
        for s in range(splits):
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
        out.append((total, hashed, exact))
    return out


def summary(stats: list[tuple[int, int, int]]) -> dict[str, Any]:
    total = sum(s[0] for s in stats)
    return {"rows": len(stats), "blocks": total,
            "hashed": sum(s[1] for s in stats) / max(total, 1),
            "exact": sum(s[2] for s in stats) / max(total, 1)}


def synthetic(splits: int, batch: int = 32, V: int = 151936) -> dict[str, Any]:
    """The race's figures on ``benchmarks/verify.py``'s inputs: ``batch`` sequences x 7 rows x
    ``V`` bfloat16 logits (the default is the benchmark's shape)."""
    inp = make_inputs(batch, 6, V, torch.bfloat16, "cpu", "sample")
    logits = inp["target_logits"].float()
    allowed = ref.unpack_bitmask(inp["bitmask"], V)
    vm = torch.where(allowed, logits, float("-inf"))
    return {"source": "synthetic (benchmarks/verify.py inputs)", "vocab": V, "batch": batch, "splits": splits,
            "all": summary(replay(vm, inp["uniforms"][:, 1], splits))}


def real_rows(model: str, temperature: float, tasks: int, max_new: int, seed: int) -> torch.Tensor:
    """Scaled, masked bfloat16-rounded logits ``[R, V]`` (float32, -inf where not allowed) of
    every sampled position of grammar-constrained trajectories."""
    from benchmarks.tasks.suite import EXTRACTION_TASKS, extraction_messages
    from structgen.generation.api import prompt_ids, resolve_grammar
    from structgen.generation.model import load_model, vocabulary_for
    from structgen.kernels.bitmask import allocate_bitmask
    from structgen.masks.matcher import Matcher

    lm = load_model(model)
    vocab = vocabulary_for(lm)
    V = lm.vocab_size
    eos = set(vocab.eos_token_ids)
    gen = torch.Generator().manual_seed(seed)
    _, inv_t = ref.inverse_temperature(torch.tensor([temperature]))      # [1], as the kernel's
    rows = []
    for task in EXTRACTION_TASKS[:tasks]:
        g, _ = resolve_grammar(schema=task["schema"])
        m = Matcher(g, vocab)
        ids = prompt_ids(lm, None, extraction_messages(task))
        lm.reset()
        bm = allocate_bitmask(1, V)
        feed = ids
        for _ in range(max_new):
            logits = lm.extend(feed, all_logits=False, float32=False)       # [1, V]
            m.fill_bitmask(bm, 0)
            v, allowed = ref._scaled(logits.to(torch.bfloat16), bm, inv_t)  # [1, V] each
            vm = torch.where(allowed, v, float("-inf"))[0]
            rows.append(vm)
            tok = int(torch.multinomial(torch.softmax(vm, 0), 1, generator=gen))
            if not m.accept_token(tok):
                raise AssertionError(f"sampled token {tok} rejected by the matcher")
            if tok in eos or m.is_terminated():
                break
            feed = [tok]
    return torch.stack(rows)


def real(model: str, temperature: float, tasks: int, max_new: int, seed: int,
         splits: int) -> dict[str, Any]:
    vm = real_rows(model, temperature, tasks, max_new, seed)
    R, V = vm.shape
    u01 = torch.rand(R, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    stats = replay(vm, u01, splits)
    n_allowed = (vm > float("-inf")).sum(1).tolist()
    res = {"source": f"real: {model}, extraction tasks, T = {temperature}", "vocab": V,
           "splits": splits, "temperature": temperature, "all": summary(stats), "by_allowed": []}
    for lo, hi in BUCKETS:
        sel = [s for s, n in zip(stats, n_allowed) if lo <= n < hi]
        if sel:
            res["by_allowed"].append({"allowed": [lo, hi], **summary(sel)})
    return res


def show(res: dict[str, Any]) -> None:
    a = res["all"]
    print(f"{res['source']}; V = {res['vocab']:,}, {res['splits']} chunks per row")
    print(f"  {a['rows']} rows x blocks: {a['blocks']}; the hash computed for {a['hashed']:.1%} "
          f"of the blocks, exact keys (the logarithms) for {a['exact']:.1%}")
    for b in res.get("by_allowed", []):
        lo, hi = b["allowed"]
        print(f"  allowed tokens in [{lo:,}, {hi:,}): {b['rows']} rows; hash {b['hashed']:.1%}, "
              f"exact keys {b['exact']:.1%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logits", choices=("synthetic", "real"), default="synthetic")
    ap.add_argument("--model", default="smollm2-135m", help="--logits real: a model alias or path")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--tasks", type=int, default=4, help="--logits real: extraction tasks used")
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--splits", type=int, default=2, help="vocabulary chunks per row (the plan's S)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="synthetic rows, batch 2, V = 16,384 (CI)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    if args.smoke:
        res = synthetic(args.splits, batch=2, V=16384)
    elif args.logits == "synthetic":
        res = synthetic(args.splits)
    else:
        res = real(args.model, args.temperature, args.tasks, args.max_new_tokens, args.seed,
                   args.splits)
    show(res)
    if args.out is not None:
        envelope_lib.write(args.out, envelope, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
