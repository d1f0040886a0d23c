"""Compile the Triton verify kernels for NVIDIA GPUs on a machine without one, and read the code.

The Triton interpreter (``TRITON_INTERPRET=1``) checks what the kernels compute; it says
nothing about the machine code a GPU would run. This tool drives the real compiler instead:
it points Triton at a stand-in CUDA driver that reports a chosen target (``--arch 80,90``:
A100, H100/H200), runs :func:`structgen.kernels.triton_verify.verify_triton` on CPU tensors of
the real shapes with every launch turned into a compile-only warm-up (so every kernel gets
exactly the specialisation a real launch would: 16-byte alignment of pointers and of strides,
strides equal to 1), and reports per kernel:

* that it compiles (PTX and cubin, through the ptxas Triton ships);
* registers per thread, spills and stack bytes (``ptxas -v``), and the shared memory a
  program needs; the programs per SM that the registers allow;
* the widths of the global loads of pass A, in bytes: the logits must be read with 16-byte
  (vectorised, ``ld.global.v4`` / ``cp.async ... 16``) loads, and 16-bit logits must never be
  read with 2-byte scalar loads (the check compiles pass A with the chain unfused too, so that
  only the streaming loop's loads are counted);
* that changing the batch size and the draft length between steps compiles nothing new.

Examples::

    python benchmarks/verify_codegen.py                       # sm_80 + sm_90, full matrix
    python benchmarks/verify_codegen.py --arch 90 --vocab 151936,50257 --dtypes bf16,fp32 \\
        --modes greedy,sample+probs --json out.json

Exit status 1 when a check fails. It patches Triton's process-wide driver, so run it in a
process of its own (the test does). Needs ``triton`` (3.x) with its bundled ptxas.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
MODES = ("greedy", "sample", "sample+probs")
SM_COUNT = {80: 108, 86: 84, 89: 128, 90: 132}
REGS_PER_SM = 65536
MAX_THREADS_PER_SM = {80: 2048, 86: 1536, 89: 1536, 90: 2048}
SHARED_PER_SM = {80: 164 * 1024, 86: 100 * 1024, 89: 100 * 1024, 90: 228 * 1024}

# A scalar-logits pass A issues 16+ narrow loads per thread per block (x 2-3 block variants);
# the vectorised one only a few: the two end pieces of a row (< 16 tokens each, about one load
# per thread) and per-row scalars (the cumulative counts, a temperature, the draft token).
NARROW_OK = 8
# ptxas may keep a value or two on the stack outside the loop (one STL / LDL per program)
SPILL_OK = 16

_LOAD_RE = re.compile(r"\b(ld\.global(?:\.[a-z0-9_]+)*)\s"
                      r"|\bcp\.async\.c[ag]\.shared\.global[^;]*,\s*(0x[0-9a-f]+|\d+)")


class _Target:
    """A stand-in for Triton's CUDA driver: reports one target, launches nothing."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def is_active(self) -> bool:
        return True


class Compiler:
    """Turns kernel launches into compiles for ``arch``; records every compiled kernel."""

    def __init__(self, arch: int) -> None:
        import torch
        import triton
        import triton.runtime.jit as jit

        from structgen.verify import load_kernels

        triton.runtime.driver.set_active(_Target(arch))
        self.arch = arch
        self.launches: list[tuple[str, tuple[int, ...], Any]] = []

        def getitem(fn: Any, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                kernel = fn.run(*args, grid=grid, warmup=True, **kwargs)
                self.launches.append((fn.__name__, tuple(grid), kernel))
            return launch

        jit.KernelInterface.__getitem__ = getitem
        tv = load_kernels("triton_verify")
        for obj in vars(tv).values():   # binders and caches made for an earlier target
            if isinstance(obj, jit.JITFunction):
                obj.device_caches.clear()
        plan = tv.plan_splits
        tv.interpreter_active = lambda: True        # CPU tensors are fine: nothing runs
        tv._sm_count = lambda device: SM_COUNT.get(arch, 132)
        tv.plan_splits = lambda rows, vocab, device, **kw: plan(rows, vocab, torch.device("cuda"), **kw)
        self.tv = tv

    def compile_case(self, batch: int, k: int, vocab: int, dtype: Any, mode: str, *, mask: bool = True,
                     **kw: Any) -> list:
        import torch

        sys.path.insert(0, str(ROOT / "benchmarks"))
        from verify import make_inputs

        inp = make_inputs(batch, k, vocab, dtype, "cpu", mode)
        i32 = torch.int32
        out = torch.empty(batch, k + 1, dtype=i32)
        acc, emit, err = (torch.empty(batch, dtype=i32) for _ in range(3))
        before = len(self.launches)
        self.tv.verify_triton(inp["draft_token_ids"], inp["cu_num_draft_tokens"], inp["target_logits"],
                              inp["bitmask"] if mask else None, inp["draft_probs"], inp["temperature"],
                              None, inp["uniforms"], out, acc, emit, err, **kw)
        return self.launches[before:]


def load_widths(ptx: str) -> dict[int, int]:
    """Global load instructions of a kernel by width in bytes."""
    out: collections.Counter = collections.Counter()
    for m in _LOAD_RE.finditer(ptx):
        if m.group(1):
            parts = m.group(1).split(".")
            vec = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
            bits = next((int(p[1:]) for p in parts if re.fullmatch(r"[bfsu]\d+", p)), 32)
            out[vec * bits // 8] += 1
        else:
            out[int(m.group(2), 0)] += 1
    return dict(sorted(out.items()))


def ptxas_info(ptx: str, arch: int) -> dict[str, Any]:
    """Registers, spills and stack of a PTX kernel, from ``ptxas -v``."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [ptxas, f"-arch=sm_{arch}{suffix}", "-v", str(src), "-o", str(Path(d) / "k.cubin")]
        res = subprocess.run(cmd, capture_output=True, text=True)
    text = res.stdout + res.stderr
    if res.returncode != 0:
        return {"error": text.strip()[-400:]}
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else 0  # noqa: E731
    return {"registers": num(r"Used (\d+) registers"), "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"), "stack": num(r"(\d+) bytes stack frame")}


def occupancy(arch: int, regs: int, warps: int, shared: int) -> int:
    """Programs per SM the registers, threads and shared memory allow."""
    threads = 32 * warps
    by_regs = REGS_PER_SM // max(1, -(-regs * threads // 256) * 256)
    by_threads = MAX_THREADS_PER_SM.get(arch, 2048) // threads
    by_shared = SHARED_PER_SM.get(arch, 100 * 1024) // shared if shared else 32
    return max(0, min(by_regs, by_threads, by_shared, 32))


def check_config(comp: Compiler, vocab: int, dtype_name: str, mode: str) -> dict[str, Any]:
    import torch

    dtype = getattr(torch, DTYPES[dtype_name])
    elsize = torch.tensor([], dtype=dtype).element_size()
    result: dict[str, Any] = dict(arch=comp.arch, vocab=vocab, dtype=dtype_name, mode=mode,
                                  row_stride_aligned=vocab % 16 == 0, kernels={}, problems=[])
    t0 = time.perf_counter()
    launches = comp.compile_case(32, 6, vocab, dtype, mode)
    for name, grid, kernel in launches:
        ptx = kernel.asm["ptx"]
        info = ptxas_info(ptx, comp.arch)
        shared = int(getattr(kernel.metadata, "shared", 0))
        warps = int(kernel.metadata.num_warps)
        target = m.group(1) if (m := re.search(r"^\.target\s+(\S+)", ptx, re.M)) else "?"
        if target.rstrip("a") != f"sm_{comp.arch}":
            result["problems"].append(f"{name}: compiled for {target}, not sm_{comp.arch}")
        entry = dict(grid=list(grid), target=target, num_warps=warps, shared_bytes=shared,
                     loads=load_widths(ptx), **info)
        if "registers" in info:
            entry["programs_per_sm"] = occupancy(comp.arch, info["registers"], warps, shared)
            if info["spill_stores"] > SPILL_OK or info["spill_loads"] > SPILL_OK:
                result["problems"].append(f"{name}: register spills {info}")
        else:
            result["problems"].append(f"{name}: ptxas failed: {info.get('error')}")
        result["kernels"][name] = entry
    # the streaming loop alone (chain unfused, no grammar mask, so that the loads of pass A are
    # the logits' and a few per-row scalars): how pass A reads the logits
    for key, mask in (("stream_loads", True), ("stream_loads_no_mask", False)):
        unfused = comp.compile_case(32, 6, vocab, dtype, mode, fused=False, mask=mask)
        stream = [k for n, _, k in unfused if n == "_row_pass_kernel"]
        result[key] = load_widths(stream[0].asm["ptx"])
    widths = result["stream_loads_no_mask"]
    if widths.get(16, 0) < 2 * elsize:
        result["problems"].append(f"pass A reads the logits without 16-byte loads: {widths}")
    if widths.get(elsize, 0) > NARROW_OK:
        result["problems"].append(f"pass A reads the logits with {elsize}-byte scalar loads: {widths}")
    result["compile_seconds"] = round(time.perf_counter() - t0, 2)
    return result


def check_no_recompile(comp: Compiler, vocab: int, dtype_name: str, mode: str) -> dict[str, Any]:
    """Batch sizes and draft lengths of a generation loop compile nothing after the first step."""
    import torch

    dtype = getattr(torch, DTYPES[dtype_name])
    seen: dict[str, set] = collections.defaultdict(set)
    for batch, k in ((1, 6), (8, 3), (32, 6), (64, 0), (5, 7)):
        for name, _grid, kernel in comp.compile_case(batch, k, vocab, dtype, mode):
            seen[name].add(id(kernel))
    counts = {name: len(ids) for name, ids in seen.items()}
    return dict(vocab=vocab, dtype=dtype_name, mode=mode, distinct_kernels=counts,
                ok=all(c == 1 for c in counts.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="80,90", help="compute capabilities, e.g. 80,90")
    ap.add_argument("--vocab", default="32000,50257,128256,151936")
    ap.add_argument("--dtypes", default="fp32,fp16,bf16")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    archs = [int(a) for a in args.arch.split(",")]
    vocabs = [int(v) for v in args.vocab.split(",")]
    dtypes = args.dtypes.split(",")
    modes = args.modes.split(",")
    report: dict[str, Any] = {"configs": [], "recompile": []}
    try:
        import triton
        report["triton"] = triton.__version__
    except ImportError:
        print("triton is not installed", file=sys.stderr)
        return 2
    ok = True
    for arch in archs:
        comp = Compiler(arch)   # a new stand-in driver; the kernels' JIT caches start afresh
        for vocab in vocabs:
            for dt in dtypes:
                for mode in modes:
                    r = check_config(comp, vocab, dt, mode)
                    report["configs"].append(r)
                    ok &= not r["problems"]
                    ks = ", ".join(f"{n.strip('_')} {e.get('registers', '?')} regs/"
                                   f"{e.get('programs_per_sm', '?')} per SM" for n, e in r["kernels"].items())
                    print(f"sm_{arch} V={vocab:6d} {dt} {mode:12s} {'OK ' if not r['problems'] else 'BAD'} "
                          f"loads {r['stream_loads_no_mask']} / with mask {r['stream_loads']}  {ks}  "
                          f"({r['compile_seconds']} s)")
                    for p in r["problems"]:
                        print("    problem:", p)
        rc = check_no_recompile(comp, vocabs[0], dtypes[0], modes[-1])
        rc["arch"] = arch
        report["recompile"].append(rc)
        ok &= rc["ok"]
        print(f"sm_{arch} shape changes: {rc['distinct_kernels']} distinct compiled kernels "
              f"({'OK' if rc['ok'] else 'RECOMPILES'})")
    report["ok"] = ok
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
        print("wrote", args.json)
    print("codegen:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
