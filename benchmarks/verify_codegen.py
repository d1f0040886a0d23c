"""Compile the Triton verify kernels for NVIDIA GPUs on a machine without one, and read the code.

The Triton interpreter (``TRITON_INTERPRET=1``) checks what the kernels compute; it says
nothing about the machine code a GPU would run. This tool drives the real compiler instead:
it points Triton at a stand-in CUDA driver that reports a chosen target (``--arch 80,90``:
A100, H100/H200), runs :func:`structgen.kernels.triton_verify.verify_triton` on CPU tensors of
the real shapes with every launch turned into a compile-only warm-up (so every kernel gets
exactly the specialisation a real launch would: 16-byte alignment of pointers and of strides,
strides equal to 1), and reports per kernel:

* that it compiles (PTX and cubin, through the ptxas Triton ships);
* registers per thread, spills and stack bytes (``ptxas -v``; a spill instruction inside a loop
  of the machine code is a problem, a value parked outside the loop is not), and the shared
  memory a program needs; the programs per SM that the registers allow;
* the widths of the global loads of pass A, in bytes: the logits must be read with 16-byte
  (vectorised, ``ld.global.v4`` / ``cp.async ... 16``) loads, and 16-bit logits must never be
  read with 2-byte scalar loads (the check compiles pass A with the chain unfused too, so that
  only the streaming loop's loads are counted);
* that changing the batch size and the draft length between steps compiles nothing new.

Examples::

    python -m benchmarks.verify_codegen                       # sm_80 + sm_90, full matrix
    python -m benchmarks.verify_codegen --arch 90 --vocab 151936,50257 --dtypes bf16,fp32 \\
        --modes greedy,sample+probs --out out.json
    python -m benchmarks.verify_codegen --smoke               # sm_90, V = 50,257 bf16 greedy (CI)

``--out`` (or ``--json``) writes the report with the shared envelope of ``benchmarks/common/envelope.py``.

Exit status 1 when a check fails. It patches Triton's process-wide driver, so run it in a
process of its own (the test does). Needs ``triton`` (3.x) with its bundled ptxas.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import envelope as envelope_lib

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
# Spills outside the loops (a few values parked across the streaming loop) cost a few
# instructions per program and are reported, not flagged; spill instructions inside a loop are.
# Without cuobjdump to find the loops, more than this many spilled bytes are flagged.
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

        from structgen.generation.verify import load_kernels

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

        from benchmarks.verify import make_inputs

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


_INST_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_TARGET_RE = re.compile(r"0x([0-9a-f]+)\s*$")


def sass_loops(sass: str) -> tuple[list[tuple[int, str]], set[int], dict[int, set[int]], Any]:
    """The instructions of a kernel's machine code, the addresses that lie inside a loop, each
    loop's own addresses (keyed by the address of its header; nested loops included), and a
    function from an instruction's address to the addresses its basic block dominates.

    Builds the control-flow graph of the SASS listing (basic blocks; branch, call, return and
    exit edges), its dominator tree, and the natural loop of every back edge (an edge to a block
    that dominates its source). A backward jump that is not a back edge, such as the return
    from an out-of-line slow path (``BRA.DIV`` to a block placed after the kernel body that
    jumps back), is not a loop. Subroutines called from inside a loop count as inside it."""
    insts = [(int(m.group(1), 16), m.group(2).strip()) for m in _INST_RE.finditer(sass)]
    if not insts:
        return insts, set(), {}, lambda addr: set()
    addrs = [a for a, _ in insts]
    index = {a: i for i, a in enumerate(addrs)}

    def parse(text: str) -> tuple[str, bool, int | None]:
        pred = text.startswith("@")
        body = text.split(None, 1)[1] if pred else text
        op = body.split(None, 1)[0]
        m = _TARGET_RE.search(body)
        return op, pred, int(m.group(1), 16) if m else None

    leaders = {0}
    info = [parse(t) for _, t in insts]
    for i, (op, _pred, target) in enumerate(info):
        base = op.split(".")[0]
        if base in ("BRA", "CALL", "EXIT", "RET", "BRX", "JMP", "JMX"):
            leaders.add(i + 1)
            if base in ("BRA", "CALL") and target in index:
                leaders.add(index[target])
    starts = sorted(x for x in leaders if x < len(insts))
    block_of = {}
    for b, lo in enumerate(starts):
        hi = starts[b + 1] if b + 1 < len(starts) else len(insts)
        for i in range(lo, hi):
            block_of[i] = b
    n = len(starts)
    ends = [(starts[b + 1] if b + 1 < n else len(insts)) - 1 for b in range(n)]
    succ: list[set[int]] = [set() for _ in range(n)]
    calls: list[tuple[int, int]] = []
    for b in range(n):
        op, pred, target = info[ends[b]]
        base = op.split(".")[0]
        fall = ends[b] + 1 < len(insts)
        unconditional = not pred and op == "BRA" and "," not in insts[ends[b]][1]
        if base == "BRA":
            if target in index:
                succ[b].add(block_of[index[target]])
            if fall and not unconditional:
                succ[b].add(b + 1)
        elif base == "CALL":
            if target in index:
                calls.append((b, block_of[index[target]]))
            if fall:
                succ[b].add(b + 1)
        elif base in ("EXIT", "RET", "BRX", "JMP", "JMX"):
            if pred and fall:
                succ[b].add(b + 1)
        elif fall:
            succ[b].add(b + 1)
    # ptxas also uses CALL.REL.NOINC as a jump (out of a loop, to code that ends in EXIT): a call
    # whose target reaches an EXIT is a branch; one whose target only returns is a subroutine
    def reaches_exit(c: int) -> bool:
        region, work = {c}, [c]
        while work:
            x = work.pop()
            if info[ends[x]][0].split(".")[0] == "EXIT":
                return True
            for y in succ[x] | {c2 for b2, c2 in calls if b2 == x}:
                if y not in region:
                    region.add(y)
                    work.append(y)
        return False

    jumps = {c for _, c in calls if reaches_exit(c)}
    for b, callee in calls:      # a subroutine is entered from its call sites
        succ[b].add(callee)
        if callee in jumps and not info[ends[b]][1] and ends[b] + 1 < len(insts):
            succ[b].discard(b + 1)           # an unconditional jump does not fall through
    calls = [(b, c) for b, c in calls if c not in jumps]
    pred_of: list[set[int]] = [set() for _ in range(n)]
    for b in range(n):
        for c in succ[b]:
            pred_of[c].add(b)
    # dominators (iterative, in reverse post-order from the entry block)
    order, seen, stack = [], {0}, [(0, iter(sorted(succ[0])))]
    while stack:
        b, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            order.append(b)
            stack.pop()
        elif nxt not in seen:
            seen.add(nxt)
            stack.append((nxt, iter(sorted(succ[nxt]))))
    rpo = order[::-1]
    pos = {b: i for i, b in enumerate(rpo)}
    idom = {0: 0}

    def meet(a: int, b: int) -> int:
        while a != b:
            while pos[a] > pos[b]:
                a = idom[a]
            while pos[b] > pos[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            done = [p for p in pred_of[b] if p in idom]
            if not done:
                continue
            new = done[0]
            for p in done[1:]:
                new = meet(new, p)
            if idom.get(b) != new:
                idom[b], changed = new, True

    def dominates(h: int, b: int) -> bool:
        while b != h and b != 0:
            b = idom[b]
        return b == h

    in_loop: set[int] = set()
    bodies: dict[int, set[int]] = {}
    for b in seen:
        for h in succ[b]:
            if h in seen and dominates(h, b):           # a back edge b -> h
                body, work = {h, b}, ([b] if b != h else [])
                while work:
                    x = work.pop()
                    for p in pred_of[x]:
                        if p not in body and p in seen:
                            body.add(p)
                            work.append(p)
                in_loop |= body
                bodies.setdefault(h, set()).update(body)
    callees = [c for b, c in calls if b in in_loop]
    while callees:                                      # subroutines called inside a loop
        c = callees.pop()
        if c in in_loop:
            continue
        region, work = {c}, [c]
        while work:
            x = work.pop()
            for y in succ[x]:
                if y not in region and y not in in_loop:
                    region.add(y)
                    work.append(y)
        in_loop |= region
    addrs_of = lambda blocks: {addrs[i] for b in blocks for i in range(starts[b], ends[b] + 1)}  # noqa: E731
    loops = {addrs[starts[h]]: addrs_of(body) for h, body in bodies.items()}

    def dominated(addr: int) -> set[int]:
        d = block_of[index[addr]]
        return addrs_of(b for b in seen if dominates(d, b))

    return insts, addrs_of(in_loop), loops, dominated


def _loop_spills(sass: str) -> int:
    """Local-memory (spill) instructions inside a loop of the machine code."""
    insts, loop_addrs, _, _ = sass_loops(sass)
    return sum(1 for addr, text in insts if re.search(r"\b(STL|LDL)\b", text) and addr in loop_addrs)


def ptxas_info(ptx: str, arch: int) -> dict[str, Any]:
    """Registers, spills and stack of a PTX kernel (``ptxas -v``), and the spill instructions
    that sit inside a loop (``cuobjdump -sass`` of the cubin)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        cubin = Path(d) / "k.cubin"
        src.write_text(ptx)
        cmd = [ptxas, f"-arch=sm_{arch}{suffix}", "-v", str(src), "-o", str(cubin)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        sass = ""
        if res.returncode == 0:
            dump = subprocess.run([str(Path(ptxas).with_name("cuobjdump")), "-sass", str(cubin)],
                                  capture_output=True, text=True)
            sass = dump.stdout if dump.returncode == 0 else ""
    text = res.stdout + res.stderr
    if res.returncode != 0:
        return {"error": text.strip()[-400:]}
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else 0  # noqa: E731
    return {"registers": num(r"Used (\d+) registers"), "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"), "stack": num(r"(\d+) bytes stack frame"),
            "loop_spill_instructions": _loop_spills(sass) if sass else None, "sass": sass}


# A throughput model of the streaming loop (an estimate, not a measurement): per SM and clock,
# 4 warp instructions issue (one per sub-partition) and the 16 special-function lanes retire
# half a warp's MUFU (exp2 / log2 / rcp); the GPU's SM clock, SM count and peak DRAM bandwidth.
ISSUE_PER_CLK = 4.0
MUFU_PER_CLK = 0.5
GPU_MODEL = {80: ("A100-SXM4-80GB", 108, 1.41e9, 2.04e12), 90: ("H200", 132, 1.98e9, 4.8e12)}
_LOAD_BYTES_RE = re.compile(r"\b(LDGSTS|LDG)(\.[\w]+)*")


def stream_loop_model(sass: str, arch: int) -> dict[str, Any] | None:
    """The loops that stream the logits (those with as many global loads as the most-loading
    loop) by the rows they serve: ``greedy`` (per-lane max / argmax, no MUFU), ``draft`` (a
    sampling draft row: per-lane max and softmax sum, MUFU but no hash), ``race`` (a bonus row:
    holds the hash's multiply). For each: its instructions per iteration of one warp, the bytes
    those loads bring, and the bandwidth the instruction issue and the MUFU pipe would allow on
    the whole GPU (``GPU_MODEL``), against its peak. A loop's instructions are counted once
    each, as if every branch inside ran; the race loop is also given without its race region
    (a block whose bound cannot win, which skips the hash and logarithms)."""
    insts, _, loops, dominated = sass_loops(sass)
    text = dict(insts)
    name, sms, clock, peak = GPU_MODEL.get(arch, GPU_MODEL[90])

    def load_bytes(body: set[int]) -> int:
        nbytes = 0
        for a in body:
            m = _LOAD_BYTES_RE.search(text[a])
            if m and "DEPBAR" not in text[a]:
                widths = [int(w) for w in re.findall(r"\.[US]?(8|16|32|64|128)\b", m.group(0))]
                bits = widths[-1] if widths else 32
                nbytes += 32 * bits // 8
        return nbytes

    loaded = {h: load_bytes(body) for h, body in loops.items()}
    most = max(loaded.values(), default=0)
    if not most:
        return None

    def bound(addrs: set[int], nbytes: int) -> tuple[int, int, float]:
        ops = [text[a].split()[1 if text[a].startswith("@") else 0].split(".")[0] for a in addrs]
        n, mufu = len(ops), ops.count("MUFU")
        cycles = max(n / ISSUE_PER_CLK, mufu / MUFU_PER_CLK)
        return n, mufu, sms * clock * nbytes / cycles

    out: dict[str, Any] = {}
    for header in sorted(h for h, b in loaded.items() if b == most):
        body = loops[header]
        n, mufu, full = bound(body, most)
        entry = dict(instructions=n, mufu=mufu, bytes_per_warp_iteration=most, gpu=name,
                     compute_bound_tbps=round(full / 1e12, 2), peak_tbps=round(peak / 1e12, 2),
                     compute_bound_vs_peak=round(full / peak, 2))
        # the race's region: what the first block holding one of the hash's multiplies (by
        # 0x7FEB352D; the multiply by the golden ratio may be hoisted out of the loop) dominates
        race = [a for a in body if re.search(r"0x7feb352d", text[a], re.I)]
        if race:
            region = dominated(min(race)) & body
            n2, _, part = bound(body - region, most)
            entry.update(instructions_skipping_race=n2,
                         compute_bound_vs_peak_skipping_race=round(part / peak, 2))
            # inside the race region, the largest part that a later block dominates: the
            # logarithms (a block whose cheap bound cannot win computes only the hash)
            logs = max((d for a in sorted(region) if min(race) not in (d := dominated(a) & body)),
                       key=len, default=set())
            entry["instructions_hash_only"] = bound(body - logs, most)[0]
            kind = "race"
        else:
            kind = "draft" if mufu else "greedy"
        out.setdefault(kind, entry)
    return out


# benchmarks/verify_race_skip.py on verify.py's inputs: every race block computes the hash,
# 14.5% of them the logarithms
RACE_LOG_FRACTION = 0.145
# the same on a real model's logits (``--logits real --model qwen2.5-coder-0.5b``, T = 1,
# grammar-masked positions of the extraction tasks; results/race-skip-qwen2.5-coder-0.5b-t1.0.json):
# 60.9% of the blocks compute the hash, 5.4% the logarithms
REAL_HASH_FRACTION, REAL_LOG_FRACTION = 0.609, 0.054


def sampling_step_model(loops: dict[str, Any], residual: dict[str, Any] | None, k: int = 6,
                        log_fraction: float = RACE_LOG_FRACTION,
                        hash_fraction: float = 1.0) -> dict[str, Any] | None:
    """A sampling step at ``k`` drafts per sequence: pass A over k + 1 rows per sequence (the
    draft rows' loop: max and softmax sum), then the residual kernel's race over the one row
    per sequence that draws a token (the rejected row, or the bonus row), read again. Each
    kernel takes the larger of its issue time and its memory time (its rows' logits and masks
    at the peak bandwidth), one after the other; the step's bandwidth counts pass A's bytes
    once. The race is counted three ways: every block skipping it, every block running all of
    it, and the expected mix (the hash in ``hash_fraction`` of the blocks, the logarithms in
    ``log_fraction`` of them); ``vs_peak_expected_real_logits`` is that mix at the fractions
    measured on a real model's logits (``REAL_HASH_FRACTION``, ``REAL_LOG_FRACTION``)."""
    res = (residual or {}).get("race")
    if "draft" not in loops or res is None:
        return None
    d = loops["draft"]
    base = d["bytes_per_warp_iteration"]

    def issue(loop: dict[str, Any], instructions: float) -> float:
        # issue time of `instructions` of this loop, in units of the memory time of one pass-A
        # row iteration (the race loop's MUFU never binds: it uses precise logarithms)
        return loop["bytes_per_warp_iteration"] / base / loop["compute_bound_vs_peak"] \
            * instructions / loop["instructions"]

    full, hashed = res["instructions"], res.get("instructions_hash_only", res["instructions"])
    skip = res.get("instructions_skipping_race", full)

    def mix(h: float, lg: float) -> float:
        # instructions per block: every block the skip path, h of them the hash, lg the logarithms
        return issue(res, skip + h * (hashed - skip) + lg * (full - hashed))

    race = dict(skip=mix(0.0, 0.0), run=mix(1.0, 1.0), expected=mix(hash_fraction, log_fraction),
                real=mix(REAL_HASH_FRACTION, REAL_LOG_FRACTION))

    def step(case: str) -> float:
        pass_a = max((k + 1) * issue(d, d["instructions"]), k + 1)
        return round((k + 1) / (pass_a + max(race[case], 1.0)), 2)

    return dict(pass_a_rows=k + 1, residual_rows=1, race_log_fraction=log_fraction,
                race_hash_fraction=hash_fraction,
                pass_a_vs_peak=round(min(1.0, d["compute_bound_vs_peak"]), 2),
                vs_peak_all_blocks_skip_race=step("skip"), vs_peak_all_blocks_run_race=step("run"),
                vs_peak_expected=step("expected"), vs_peak_expected_real_logits=step("real"))


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
        sass = info.pop("sass", None)
        if name == "_residual_kernel" and sass:
            result["residual_loop"] = stream_loop_model(sass, comp.arch)
        entry = dict(grid=list(grid), target=target, num_warps=warps, shared_bytes=shared,
                     loads=load_widths(ptx), **info)
        if "registers" in info:
            entry["programs_per_sm"] = occupancy(comp.arch, info["registers"], warps, shared)
            if info["loop_spill_instructions"] is None:
                if info["spill_stores"] > SPILL_OK or info["spill_loads"] > SPILL_OK:
                    result["problems"].append(f"{name}: register spills {info}")
            elif info["loop_spill_instructions"]:
                result["problems"].append(f"{name}: spills inside a loop {info}")
        else:
            result["problems"].append(f"{name}: ptxas failed: {info.get('error')}")
        result["kernels"][name] = entry
    # the streaming loop alone (chain unfused, no grammar mask, so that the loads of pass A are
    # the logits' and a few per-row scalars): how pass A reads the logits
    for key, mask in (("stream_loads", True), ("stream_loads_no_mask", False)):
        unfused = comp.compile_case(32, 6, vocab, dtype, mode, fused=False, mask=mask)
        stream = [k for n, _, k in unfused if n == "_row_pass_kernel"]
        result[key] = load_widths(stream[0].asm["ptx"])
        if mask:
            sass = ptxas_info(stream[0].asm["ptx"], comp.arch).get("sass", "")
            result["stream_loop"] = stream_loop_model(sass, comp.arch) if sass else None
            if result["stream_loop"] and (step := sampling_step_model(result["stream_loop"],
                                                                       result.get("residual_loop"))):
                result["sampling_step"] = step
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
    ap.add_argument("--out", "--json", dest="out", default=None, help="write the report here")
    ap.add_argument("--smoke", action="store_true",
                    help="one configuration: sm_90, V = 50,257 (rows not 16-aligned), bf16, greedy (CI)")
    args = ap.parse_args(argv)
    envelope = envelope_lib.capture(argv, __file__)
    if args.smoke:
        args.arch, args.vocab, args.dtypes, args.modes = "90", "50257", "bf16", "greedy"
    archs = [int(a) for a in args.arch.split(",")]
    vocabs = [int(v) for v in args.vocab.split(",")]
    dtypes = args.dtypes.split(",")
    modes = args.modes.split(",")
    report: dict[str, Any] = {"configs": [], "recompile": []}
    try:
        import triton  # noqa: F401
        envelope_lib.add_peers(envelope, ["triton"])
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
                    for kind, sl in (r.get("stream_loop") or {}).items():
                        print(f"    {kind} rows' loop: {sl['instructions']} instructions ({sl['mufu']} MUFU) "
                              f"per {sl['bytes_per_warp_iteration']} B a warp loads: compute bound "
                              f"{sl['compute_bound_tbps']} TB/s = {sl['compute_bound_vs_peak']:.0%} of the "
                              f"{sl['gpu']}'s {sl['peak_tbps']} TB/s (model)"
                              + (f"; blocks skipping the race: {sl['instructions_skipping_race']} "
                                 f"instructions, {sl['compute_bound_vs_peak_skipping_race']:.0%}"
                                 if "instructions_skipping_race" in sl else ""))
                    if (res := (r.get("residual_loop") or {}).get("race")):
                        print(f"    residual kernel's loop: {res['instructions']} instructions, "
                              f"{res['instructions_skipping_race']} in blocks skipping the race, "
                              f"{res['instructions_hash_only']} with the hash only")
                    if (st := r.get("sampling_step")):
                        print(f"    sampling step (pass A over 7 rows per sequence, then one row's race): "
                              f"{st['vs_peak_all_blocks_skip_race']:.0%} of peak if every race block skips, "
                              f"{st['vs_peak_all_blocks_run_race']:.0%} if none does; expected "
                              f"{st['vs_peak_expected']:.0%}, on a real model's logits "
                              f"{st['vs_peak_expected_real_logits']:.0%} (pass A "
                              f"{st['pass_a_vs_peak']:.0%}; model)")
                    for p in r["problems"]:
                        print("    problem:", p)
        rc = check_no_recompile(comp, vocabs[0], dtypes[0], modes[-1])
        rc["arch"] = arch
        report["recompile"].append(rc)
        ok &= rc["ok"]
        print(f"sm_{arch} shape changes: {rc['distinct_kernels']} distinct compiled kernels "
              f"({'OK' if rc['ok'] else 'RECOMPILES'})")
    report["ok"] = ok
    if args.out:
        envelope_lib.write(args.out, envelope, report)
        print("wrote", args.out)
    print("codegen:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
