"""Verify-step benchmark: fused Triton kernel vs torch reference vs an unfused pipeline.

Full mode (a CUDA GPU): for batch 1/8/32/64 sequences x 7 rows (6 drafts + the bonus row) x
V = 151,936 bf16 logits with grammar bitmasks, it times

* ``fused``: the Triton backend of :func:`structgen.generation.verify.verify` (pooled buffers, no input
  checks: what the generation loop runs; the accept chain inside pass A); a launch-config
  sweep on batch 32 picks ``(block_words, num_warps, num_stages, programs_per_sm)`` first.
  Timed eagerly and as a CUDA-graph replay (kernel time without Python launch overhead; the
  headline figures use the replay, for the unfused pipeline too). ``two-kernel``: the same with
  ``fused=False`` (the chain as a second launch). The fused kernel's graph is then replayed
  ``--stress`` times, every result compared with the reference (the chain synchronises programs
  through counters: an ordering bug would show as a mismatch);
* ``reference``: the torch reference backend (the oracle; not meant to be fast);
* ``unfused``: what engines do in separate passes: bitmask apply (unpack + masked_fill), fp32
  softmax materialised, then a vectorised rejection step (exponential race on fp32 probs);

in three modes (greedy; sampling with deterministic drafts; sampling with draft probabilities),
checks the fused tokens against the reference, and reports the achieved bandwidth
``(logits + bitmask bytes) / time`` against the device's peak (table below, or
``--peak-tbps``). Targets from the issue: >= 70% of peak at batch 32 and >= 3x faster than
the unfused pipeline. It also measures the overlap helpers: a simulated target forward on the
GPU while the CPU fills the next masks into pinned memory, uploaded with a non-blocking copy on
a side stream, against the serial order. Results go to
``benchmarks/results/verify-<device>.json`` (and a PNG when matplotlib is installed).

``--smoke`` (CI, CPU): tiny shapes through the same code paths, the Triton kernels under
``TRITON_INTERPRET=1``; checks reference == triton and prints a few timings (written with
``--out``). Exit status 1 on any mismatch. Results files carry the shared envelope of
``benchmarks/common/envelope.py``. Examples::

    python -m benchmarks.verify --smoke
    python -m benchmarks.verify                      # on a GPU; about 2-4 minutes
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import envelope as envelope_lib
from benchmarks.common.checkout import ROOT

RESULTS = ROOT / "benchmarks" / "results"

# Peak DRAM bandwidth in TB/s by device-name substring (first match wins; most specific first).
PEAK_TBPS: list[tuple[str, float]] = [
    ("GH200", 4.0), ("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35), ("H800", 3.35),
    ("H20", 4.0), ("B200", 8.0), ("B100", 8.0), ("A100-SXM4-80GB", 2.039), ("A100 80GB PCIe", 1.935),
    ("A100", 1.555), ("A800", 2.039), ("L40S", 0.864), ("L40", 0.864), ("L4", 0.3), ("A10G", 0.6),
    ("A10", 0.6), ("RTX 4090", 1.008), ("RTX 3090", 0.936), ("V100", 0.9), ("T4", 0.32),
]
# (block_words, num_warps, num_stages, programs_per_sm): the default plan first
SWEEP = [(64, 4, 3, 4), (64, 4, 3, 2), (64, 4, 3, 8), (64, 4, 3, 16), (32, 4, 3, 8), (64, 4, 1, 4),
         (64, 8, 3, 4), (128, 8, 3, 4), (128, 4, 2, 4), (256, 8, 2, 4)]
MODES = ("greedy", "sample", "sample+probs")


def peak_tbps(name: str) -> float | None:
    for key, tb in PEAK_TBPS:
        if key.lower() in name.lower():
            return tb
    return None


# ---------------------------------------------------------------------------------------------
# inputs

def make_inputs(batch: int, k: int, vocab: int, dtype: Any, device: Any, mode: str, seed: int = 0) -> dict:
    """``batch`` sequences of ``k`` drafts: peaked LLM-like logits (a few strong tokens per row),
    random grammar masks of mixed density, drafts that follow the masked argmax 80% of the time.
    Generated on ``device`` (seeded)."""
    import torch

    from structgen.generation.verify import load_kernels

    ref = load_kernels("torch_ref")
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    rows = batch * (k + 1)
    n = batch * k

    def ints(shape: tuple[int, ...]) -> torch.Tensor:
        t = torch.randint(-2**31, 2**31 - 1, shape, generator=g, device=dev, dtype=torch.int64)
        return t.to(torch.int32)

    cu = torch.arange(1, batch + 1, dtype=torch.int32, device=dev) * k
    logits = torch.randn(rows, vocab, generator=g, device=dev) * 2
    top = torch.randint(0, vocab, (rows, 8), generator=g, device=dev)
    logits.scatter_add_(1, top, torch.rand(rows, 8, generator=g, device=dev) * 12)
    words = (vocab + 31) // 32
    bitmask = ints((rows, words))
    dense = torch.rand(rows, generator=g, device=dev) < 0.5
    bitmask = torch.where(dense[:, None], bitmask | ints((rows, words)), bitmask)
    allowed = ref.unpack_bitmask(bitmask, vocab)
    am = torch.where(allowed, logits, float("-inf")).argmax(1)
    _, _, row_draft = ref.row_layout(cu, n)
    drafts = torch.randint(0, vocab, (n,), generator=g, device=dev)
    follow = torch.rand(rows, generator=g, device=dev) < 0.8
    sel = (row_draft >= 0) & follow
    drafts[row_draft[sel]] = am[sel]
    temperature = None if mode == "greedy" else torch.ones(batch, device=dev)
    probs = None
    if mode == "sample+probs":
        d_rows = row_draft >= 0
        probs = torch.softmax(torch.where(allowed[d_rows], logits[d_rows], float("-inf")) * 0.8, -1)
    uniforms = torch.rand((rows, 2), dtype=torch.float64, generator=g, device=dev)
    return dict(draft_token_ids=drafts, cu_num_draft_tokens=cu, target_logits=logits.to(dtype),
                bitmask=bitmask, draft_probs=probs, temperature=temperature, uniforms=uniforms)


def bytes_read(inp: dict) -> int:
    lg, bm = inp["target_logits"], inp["bitmask"]
    return lg.numel() * lg.element_size() + bm.numel() * bm.element_size()


# ---------------------------------------------------------------------------------------------
# the unfused baseline (separate passes, fp32 probabilities materialised)

def unfused_pipeline(inp: dict, meta: dict) -> Any:
    """Bitmask apply -> softmax -> rejection, vectorised torch (no host synchronisation)."""
    import torch

    lg, bm = inp["target_logits"], inp["bitmask"]
    rows, vocab = lg.shape
    shifts = meta["shifts"]
    allowed = ((bm.unsqueeze(-1) >> shifts) & 1).reshape(rows, -1)[:, :vocab].bool()
    masked = lg.masked_fill(~allowed, float("-inf"))                     # pass 1: apply the bitmask
    drafts, batch, k = inp["draft_token_ids"].long(), meta["batch"], meta["k"]
    dr, br = meta["draft_rows"], meta["bonus_rows"]
    if inp["temperature"] is None:
        am = masked.argmax(1)                                            # pass 2: argmax
        ok = (am[dr] == drafts).view(batch, k)
        rec = am[dr].view(batch, k)
        bonus = am[br]
    else:
        probs = torch.softmax(masked.float() / inp["temperature"][meta["row_seq"]][:, None], -1)  # pass 2
        u = inp["uniforms"]
        p_x = probs[dr].gather(1, drafts[:, None]).squeeze(1)          # pass 3: rejection
        noise = torch.empty_like(probs).exponential_()   # default generator: CUDA-graph capturable
        if inp["draft_probs"] is None:
            ok = (u[dr, 0] < p_x).view(batch, k)
            resid = probs[dr].scatter(1, drafts[:, None], 0.0)
        else:
            q = inp["draft_probs"].float()
            ok = (u[dr, 0] * q.gather(1, drafts[:, None]).squeeze(1) < p_x).view(batch, k)
            resid = (probs[dr] - q).clamp_min(0)
        rec = (resid / noise[dr]).argmax(1).view(batch, k)
        bonus = (probs[br] / noise[br]).argmax(1)
    acc = torch.cumprod(ok.int(), 1).sum(1)                              # accepted prefix length
    out = torch.full((batch, k + 1), -1, dtype=torch.long, device=lg.device)
    cols = torch.arange(k + 1, device=lg.device)[None, :]
    out = torch.where(cols < acc[:, None], torch.cat([drafts.view(batch, k), bonus[:, None]], 1), out)
    last = torch.where(acc < k, rec.gather(1, acc.clamp_max(k - 1)[:, None]).squeeze(1), bonus)
    out.scatter_(1, acc[:, None], last[:, None])
    return out, acc


def unfused_meta(inp: dict, batch: int, k: int) -> dict:
    import torch

    dev = inp["target_logits"].device
    rows = batch * (k + 1)
    r = torch.arange(rows, device=dev)
    is_bonus = (r % (k + 1)) == k
    return dict(batch=batch, k=k, draft_rows=r[~is_bonus], bonus_rows=r[is_bonus], row_seq=r // (k + 1),
                shifts=torch.arange(32, dtype=torch.int32, device=dev))


# ---------------------------------------------------------------------------------------------
# timing

def timer(device: Any) -> Callable[[Callable[[], Any], int], float]:
    """Median seconds of ``fn`` over ``reps`` runs (CUDA: triton's do_bench, which flushes L2)."""
    if device.type == "cuda":
        import triton.testing

        def bench(fn: Callable[[], Any], reps: int) -> float:
            ms = triton.testing.do_bench(fn, warmup=10, rep=max(20, reps * 5), return_mode="median")
            return float(ms) / 1e3
        return bench

    def bench_cpu(fn: Callable[[], Any], reps: int) -> float:
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)
    return bench_cpu


def same_output(a: Any, b: Any) -> dict:
    import torch

    tok_eq = torch.equal(a.output_token_ids.cpu(), b.output_token_ids.cpu())
    acc_eq = torch.equal(a.num_accepted.cpu(), b.num_accepted.cpu())
    rows_eq = (a.output_token_ids.cpu() == b.output_token_ids.cpu()).all(1).float().mean().item()
    return dict(tokens_equal=bool(tok_eq), accepted_equal=bool(acc_eq), sequences_equal_fraction=rows_eq)


def run_case(batch: int, k: int, vocab: int, dtype: Any, device: Any, mode: str, reps: int,
             config: dict | None, ref_reps: int, stress_reps: int = 0) -> dict:
    from structgen.generation.verify import VerifyBufferPool, load_kernels, verify

    tv = load_kernels("triton_verify")
    bench = timer(device)
    inp = make_inputs(batch, k, vocab, dtype, device, mode)
    pool = VerifyBufferPool()
    buf = pool.get(batch, k, vocab, dtype, device)
    cfg = dict(config or {})
    args = (inp["draft_token_ids"], inp["cu_num_draft_tokens"], inp["target_logits"], inp["bitmask"],
            inp["draft_probs"], inp["temperature"], None, inp["uniforms"])

    fused = _launcher(tv, args, buf.out, buf.workspace, cfg)
    two_kernel = _launcher(tv, args, buf.out, buf.workspace, dict(cfg, fused=False))

    def reference() -> Any:
        return verify(*args[:6], uniforms=inp["uniforms"], backend="torch", check_inputs=False, max_draft=k)

    meta = unfused_meta(inp, batch, k)

    def unfused() -> None:
        unfused_pipeline(inp, meta)

    t_fused_eager = bench(fused, reps)
    t_unf_eager = bench(unfused, reps)
    t_two_eager = bench(two_kernel, reps)
    t_ref = bench(reference, ref_reps)
    # kernel time without Python launch overhead: replay CUDA graphs of both pipelines
    t_fused, t_unf, t_two, graph_note = t_fused_eager, t_unf_eager, t_two_eager, "eager"
    stress = None
    want = reference()
    if device.type == "cuda":
        try:
            replay = cuda_graph(fused)
            t_fused = bench(replay, reps)
            t_unf = bench(cuda_graph(unfused), reps)
            t_two = bench(cuda_graph(two_kernel), reps)
            graph_note = "cuda-graph"
            # the fused chain synchronises programs through counters: replay it many times and
            # compare every result (a memory-ordering bug would show up as a mismatch)
            import torch

            equal = 0
            for _ in range(stress_reps):
                buf.out.output_token_ids.fill_(-7)
                replay()
                torch.cuda.synchronize()
                equal += int(same_output(want, buf.out)["tokens_equal"])
            stress = dict(replays=stress_reps, equal=equal,
                          counters_zero=bool((buf.workspace["count"] == 0).all().item()))
        except Exception as e:  # capture unsupported here: keep eager figures, say so
            graph_note = f"eager (graph capture failed: {repr(e)[:120]})"
    fused()
    check = same_output(want, buf.out)
    nbytes = bytes_read(inp)
    return dict(batch=batch, rows=batch * (k + 1), vocab=vocab, dtype=str(dtype).split(".")[-1], mode=mode,
                bytes=nbytes, timing=graph_note, fused_s=t_fused, unfused_s=t_unf,
                fused_eager_s=t_fused_eager, unfused_eager_s=t_unf_eager, reference_s=t_ref,
                two_kernel_s=t_two, two_kernel_eager_s=t_two_eager, stress=stress,
                fused_gbps=nbytes / t_fused / 1e9, fused_eager_gbps=nbytes / t_fused_eager / 1e9,
                speedup_vs_unfused=t_unf / t_fused, speedup_vs_unfused_eager=t_unf_eager / t_fused_eager,
                speedup_vs_reference=t_ref / t_fused_eager, config=cfg or "default",
                vocab_allocations=pool.vocab_allocations, **check)


def cuda_graph(fn: Callable[[], Any]) -> Callable[[], None]:
    """Capture ``fn`` (already warmed up: kernels compiled) in a CUDA graph; returns its replay."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def _launcher(tv: Any, args: tuple, o: Any, workspace: dict, cfg: dict) -> Callable[[], None]:
    def fn() -> None:
        tv.verify_triton(*args, o.output_token_ids, o.num_accepted, o.num_emitted, o.error_position,
                         workspace=workspace, **cfg)
    return fn


def sweep_configs(vocab: int, dtype: Any, device: Any, reps: int) -> list[dict]:
    from structgen.generation.verify import VerifyBufferPool, load_kernels

    tv = load_kernels("triton_verify")
    bench = timer(device)
    out = []
    for mode in ("greedy", "sample"):
        inp = make_inputs(32, 6, vocab, dtype, device, mode)
        buf = VerifyBufferPool().get(32, 6, vocab, dtype, device)
        args = (inp["draft_token_ids"], inp["cu_num_draft_tokens"], inp["target_logits"], inp["bitmask"],
                inp["draft_probs"], inp["temperature"], None, inp["uniforms"])
        for bw, nw, ns, pps in SWEEP:
            o = buf.out
            fn = _launcher(tv, args, o, buf.workspace,
                           dict(block_words=bw, num_warps=nw, num_stages=ns, programs_per_sm=pps))
            try:
                fn()
                t = bench(cuda_graph(fn) if device.type == "cuda" else fn, reps)
                out.append(dict(mode=mode, block_words=bw, num_warps=nw, num_stages=ns, programs_per_sm=pps,
                                seconds=t, gbps=bytes_read(inp) / t / 1e9))
            except Exception as e:  # a config that does not compile on this device: record, go on
                out.append(dict(mode=mode, block_words=bw, num_warps=nw, num_stages=ns, programs_per_sm=pps,
                                error=repr(e)[:200]))
    return out


def measure_overlap(device: Any, batch: int, k: int, vocab: int, dtype: Any, hidden: int = 8192,
                    layers: int = 48) -> dict:
    """Serial vs overlapped step: simulated forward on the GPU, mask fill on the CPU into pinned
    memory, non-blocking upload on a side stream, then the fused verify."""
    import numpy as np
    import torch

    from structgen.generation.verify import SideStream, VerifyBufferPool, upload_async, verify

    rows = batch * (k + 1)
    inp = make_inputs(batch, k, vocab, dtype, device, "greedy")
    buf = VerifyBufferPool().get(batch, k, vocab, dtype, device)
    lg, bm = buf.rows(rows)
    lg.copy_(inp["target_logits"])
    host = buf.bitmask_host[:rows]
    src = inp["bitmask"].cpu().numpy()
    x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)
    w = torch.randn(hidden, hidden, device=device, dtype=torch.bfloat16) / hidden ** 0.5

    def forward() -> None:
        h = x
        for _ in range(layers):
            h = torch.tanh(h @ w)

    rng = np.random.default_rng(0)
    host_np = host.numpy()

    def cpu_fill() -> None:  # stands in for Matcher.fill_bitmask over the rows (~1-3 ms)
        for r in range(rows):
            host_np[r] = src[r] ^ rng.integers(0, 2, size=src.shape[1], dtype=np.int32)

    def step_verify() -> None:
        verify(inp["draft_token_ids"], inp["cu_num_draft_tokens"], lg, bm, backend="auto", buffers=buf,
               check_inputs=False)

    side = SideStream(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def serial() -> None:
        forward()
        sync()
        cpu_fill()
        bm.copy_(host)
        step_verify()
        sync()

    def overlapped() -> None:
        forward()                       # queued; the CPU returns at once
        cpu_fill()                      # runs while the GPU computes
        ev = upload_async(host, bm, side.stream)
        if ev is not None:
            torch.cuda.current_stream().wait_event(ev)
        step_verify()
        sync()

    def wall(fn: Callable[[], None], reps: int = 20) -> float:
        fn()
        sync()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    reps = 20 if device.type == "cuda" else 2
    t_fwd = wall(lambda: (forward(), sync()), reps)
    t_cpu = wall(cpu_fill, reps)
    t_serial = wall(serial, reps)
    t_over = wall(overlapped, reps)
    return dict(rows=rows, forward_s=t_fwd, cpu_fill_s=t_cpu, serial_step_s=t_serial,
                overlapped_step_s=t_over, saved_s=t_serial - t_over, ideal_saving_s=min(t_fwd, t_cpu))


# ---------------------------------------------------------------------------------------------
# modes

def smoke(out: Path | None = None, envelope: dict[str, Any] | None = None) -> int:
    """Tiny shapes on the CPU, the Triton kernels under the interpreter; writes ``out`` (with
    ``envelope``) when given. Returns the exit status: 1 on any mismatch."""
    import torch

    from structgen.generation.verify import verify

    device = torch.device("cpu")
    ok = True
    cases: list[dict[str, Any]] = []
    print("smoke: reference vs triton (interpreter) on tiny shapes")
    # each mode once, each with another dtype and shape (tests/test_verify_triton.py covers the
    # full matrix); the interpreter takes seconds per call
    shapes = ((1, 3, 1000, torch.bfloat16), (3, 2, 4133, torch.float16), (2, 4, 777, torch.float32))
    for (batch, k, vocab, dtype), mode in zip(shapes, MODES):
        inp = make_inputs(batch, k, vocab, dtype, device, mode, seed=batch)
        outs = []
        times = []
        for backend in ("torch", "triton"):
            t0 = time.perf_counter()
            outs.append(verify(**inp, backend=backend))
            times.append(time.perf_counter() - t0)
        meta = unfused_meta(inp, batch, k)
        t0 = time.perf_counter()
        unf_tokens, unf_acc = unfused_pipeline(inp, meta)
        t_unf = time.perf_counter() - t0
        check = same_output(outs[0], outs[1])
        if mode == "greedy":   # the unfused greedy pipeline is exact too
            check["unfused_equal"] = bool(torch.equal(unf_tokens.int(), outs[0].output_token_ids))
        good = check["tokens_equal"] and check["accepted_equal"] and check.get("unfused_equal", True)
        ok &= good
        cases.append(dict(batch=batch, k=k, vocab=vocab, dtype=str(dtype)[6:], mode=mode, ok=good,
                          reference_s=times[0], triton_interpreter_s=times[1], unfused_s=t_unf))
        print(f"  B={batch} k={k} V={vocab} {str(dtype)[6:]:8s} {mode:12s} "
              f"{'OK ' if good else 'MISMATCH'} reference {times[0] * 1e3:7.1f} ms  "
              f"triton-interpret {times[1] * 1e3:7.1f} ms  unfused {t_unf * 1e3:6.1f} ms")
    r = run_case(2, 3, 1000, torch.bfloat16, device, "sample", reps=2, config=None, ref_reps=2)
    print(f"  run_case: fused {r['fused_s'] * 1e3:.1f} ms (interpreter), tokens equal: {r['tokens_equal']}")
    ok &= r["tokens_equal"]
    ov = measure_overlap(device, 2, 2, 1000, torch.bfloat16, hidden=64, layers=2)
    print(f"  overlap helpers (CPU: no real overlap): serial {ov['serial_step_s'] * 1e3:.1f} ms, "
          f"overlapped {ov['overlapped_step_s'] * 1e3:.1f} ms")
    print("smoke:", "OK" if ok else "FAILED")
    if out is not None:
        envelope_lib.write(out, envelope or envelope_lib.capture(), dict(
            mode="smoke", device="cpu (triton interpreter)", ok=ok, cases=cases,
            run_case={k: v for k, v in r.items() if isinstance(v, (int, float, str, bool))},
            overlap=ov))
    return 0 if ok else 1


def full(args: argparse.Namespace, envelope: dict[str, Any]) -> int:
    import torch

    if not torch.cuda.is_available():
        print("full mode needs a CUDA GPU; use --smoke on a CPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    peak = args.peak_tbps or peak_tbps(name)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    k = args.rows_per_seq - 1
    print(f"device: {name}; peak {peak} TB/s; V={args.vocab} {args.dtype}; {args.rows_per_seq} rows/sequence")
    sweep = sweep_configs(args.vocab, dtype, device, args.reps)
    ok_cfg = [s for s in sweep if "error" not in s and s["mode"] == "greedy"]
    best = min(ok_cfg, key=lambda s: s["seconds"]) if ok_cfg else None
    config = ({k: best[k] for k in ("block_words", "num_warps", "num_stages", "programs_per_sm")}
              if best else None)
    for s in sweep:
        print("  sweep", s)
    cases = []
    for mode in MODES:
        for batch in args.batches:
            r = run_case(batch, k, args.vocab, dtype, device, mode, args.reps, config, ref_reps=3,
                         stress_reps=args.stress)
            r["fraction_of_peak"] = (r["fused_gbps"] / 1e3 / peak) if peak else None
            cases.append(r)
            frac = f"{r['fraction_of_peak'] * 100:5.1f}%" if peak else "  n/a"
            print(f"  {mode:12s} B={batch:3d} fused {r['fused_s'] * 1e6:8.1f} us "
                  f"{r['fused_gbps']:7.0f} GB/s ({frac} of peak)  unfused {r['unfused_s'] * 1e6:8.1f} us  "
                  f"x{r['speedup_vs_unfused']:.1f}  two-kernel {r['two_kernel_s'] * 1e6:8.1f} us  "
                  f"reference {r['reference_s'] * 1e3:7.2f} ms  stress {r['stress']}  "
                  f"tokens equal: {r['tokens_equal']}")
    # a vocabulary whose rows are not 16-element aligned (GPT-2's): the shifted block layout
    shifted = run_case(32, k, 50257, dtype, device, "greedy", args.reps, config, ref_reps=3,
                       stress_reps=args.stress)
    shifted["fraction_of_peak"] = (shifted["fused_gbps"] / 1e3 / peak) if peak else None
    print(f"  greedy V=50257 B=32 fused {shifted['fused_s'] * 1e6:8.1f} us {shifted['fused_gbps']:7.0f} GB/s "
          f"tokens equal: {shifted['tokens_equal']} stress {shifted['stress']}")
    overlap = None
    try:
        overlap = measure_overlap(device, 32, k, args.vocab, dtype)
        shown = {key: (round(v * 1e3, 3) if isinstance(v, float) else v) for key, v in overlap.items()}
        print("  overlap (ms)", shown)
    except Exception as e:  # recorded, not fatal
        overlap = dict(error=repr(e)[:300])
    b32 = [c for c in cases if c["batch"] == 32]
    targets = {
        "bandwidth_ge_70pct_at_batch32_greedy": bool(peak) and any(
            c["mode"] == "greedy" and c["fraction_of_peak"] >= 0.70 for c in b32),
        "speedup_ge_3x_vs_unfused_at_batch32": {c["mode"]: c["speedup_vs_unfused"] >= 3.0 for c in b32},
        "all_greedy_tokens_equal": all(c["tokens_equal"] for c in cases if c["mode"] == "greedy"),
        "fused_stress_all_equal": all(c["stress"] is None or (c["stress"]["equal"] == c["stress"]["replays"]
                                                                and c["stress"]["counters_zero"])
                                      for c in cases if c["mode"] == "greedy"),
    }
    envelope_lib.add_peers(envelope, ["triton"])
    result = dict(device=name, peak_tbps=peak, vocab=args.vocab, dtype=args.dtype,
                  rows_per_sequence=args.rows_per_seq, best_config=config, sweep=sweep, cases=cases,
                  shifted_vocab_case=shifted,
                  overlap=overlap, targets=targets)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")
    out = Path(args.out) if args.out else RESULTS / f"verify-{slug}.json"
    envelope_lib.write(out, envelope, result)
    print("targets:", targets)
    print("wrote", out)
    plot(result, out.with_suffix(".png"))
    return 0 if targets["all_greedy_tokens_equal"] and targets["fused_stress_all_equal"] else 1


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(MODES), figsize=(4 * len(MODES), 3.2), sharey=True)
    for ax, mode in zip(axes, MODES):
        cs = [c for c in result["cases"] if c["mode"] == mode]
        xs = [str(c["batch"]) for c in cs]
        for key, label in (("fused_s", "fused"), ("unfused_s", "unfused")):
            ax.plot(xs, [c["bytes"] / c[key] / 1e9 for c in cs], marker="o", label=label)
        if result["peak_tbps"]:
            ax.axhline(result["peak_tbps"] * 1e3, ls="--", c="gray", label="peak")
        ax.set_title(mode)
        ax.set_xlabel("batch")
    axes[0].set_ylabel("GB/s (logits + bitmask)")
    axes[0].legend()
    fig.suptitle(f"verify, {result['device']}, V={result['vocab']} {result['dtype']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (triton interpreter); CI")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    ap.add_argument("--rows-per-seq", type=int, default=7, help="draft length + 1")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--stress", type=int, default=100,
                    help="graph replays of the fused kernel checked against the reference per case")
    ap.add_argument("--peak-tbps", type=float, default=None, help="override the device peak bandwidth")
    ap.add_argument("--out", default=None,
                    help="results JSON (default benchmarks/results/verify-<device>.json; --smoke: "
                         "written only when given)")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    if args.smoke:
        # CPU tensors: the interpreter must be on before triton is first imported (torch does
        # not import triton, so setting it here is early enough)
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        envelope = envelope_lib.add_peers(envelope, ["triton"])
        return smoke(Path(args.out) if args.out else None, envelope)
    return full(args, envelope)


if __name__ == "__main__":
    sys.exit(main())
