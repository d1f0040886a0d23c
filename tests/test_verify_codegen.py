"""The Triton verify kernels compile for real GPUs (sm_80, sm_90) on this CPU-only machine, and the
machine code has the properties the bandwidth target needs.

``benchmarks/verify_codegen.py`` drives Triton's own compiler and ptxas against a stand-in CUDA
driver (nothing runs), so this checks what the interpreter tests cannot: that every kernel
variant compiles for the target, that pass A reads the logits with 16-byte vector loads
(aligned rows, and rows whose stride is not a multiple of 16 elements, e.g. V = 50,257), that
no kernel spills registers inside a loop of its machine code, and that new batch sizes and draft
lengths compile nothing new.
It runs in a subprocess because it replaces Triton's process-wide driver.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.mark.slow
def test_kernels_compile_for_gpus_with_vector_loads(tmp_path: Path) -> None:
    out = tmp_path / "codegen.json"
    cmd = [sys.executable, "-m", "benchmarks.verify_codegen", "--arch", "80,90",
           "--vocab", "151936,50257", "--dtypes", "bf16,fp32", "--modes", "greedy,sample+probs",
           "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.exists(), res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads(out.read_text())
    problems = [(c["arch"], c["vocab"], c["dtype"], c["mode"], p)
                for c in report["configs"] for p in c["problems"]]
    assert not problems, problems
    assert len(report["configs"]) == 2 * 2 * 2 * 2
    for c in report["configs"]:
        row = c["kernels"]["_row_pass_kernel"]
        assert row["target"].startswith(f"sm_{c['arch']}")
        assert row["loop_spill_instructions"] == 0, (c["arch"], c["vocab"], row)
        assert row["programs_per_sm"] >= 4, (c["arch"], c["vocab"], row)
        loops = c["stream_loop"]
        where = (c["arch"], c["vocab"], c["dtype"], c["mode"], loops)
        # greedy rows keep per-lane maxima (no per-iteration reductions): by the issue model their
        # loop's instructions allow well over the GPU's memory bandwidth (memory-bound)
        assert loops["greedy"]["compute_bound_vs_peak"] >= 1.2, where
        if c["mode"] == "greedy":
            assert set(loops) == {"greedy"}, where
        else:
            # rows of sampling sequences: per-lane max and softmax sum, one exponential per
            # logit, no race in pass A; the residual kernel's race loop, in blocks whose bound
            # cannot win, about as cheap
            assert set(loops) == {"greedy", "draft"}, where
            assert loops["draft"]["compute_bound_vs_peak"] >= 0.9, where
            assert loops["draft"]["mufu"] <= 16 and loops["greedy"]["mufu"] == 0, where
            race = c["residual_loop"]["race"]
            assert race["compute_bound_vs_peak_skipping_race"] >= 0.8, (where, race)
            assert c["sampling_step"]["vs_peak_all_blocks_skip_race"] >= 0.8, (where, c["sampling_step"])
        assert c["stream_loads_no_mask"].get("16", 0) >= 4           # the logits: 16-byte loads
        # the fused chain: a greedy step is one launch
        if c["mode"] == "greedy":
            assert set(c["kernels"]) == {"_row_pass_kernel"}
    assert all(r["ok"] for r in report["recompile"]), report["recompile"]
    assert res.returncode == 0, res.stdout[-3000:]


def _sass(lines: list[str]) -> str:
    return "\n".join(f"        /*{16 * i:04x}*/                   {text} ;" for i, text in enumerate(lines))


def test_sass_loops_tells_loops_from_backward_jumps() -> None:
    from benchmarks.verify_codegen import _loop_spills, sass_loops

    sass = _sass([
        "STL.64 [R1], R2",            # 0x00 parked before the loop: not in a loop
        "BRA.DIV ~URZ, 0xa0",         # 0x10 to an out-of-line slow path
        "FADD R3, R3, R4",            # 0x20 loop header
        "LDL R5, [R1]",               # 0x30 inside the loop
        "@P0 BRA 0x20",               # 0x40 back edge
        "@!P1 CALL.REL.NOINC 0x70",   # 0x50 loop exit by a jump-like call
        "BRA 0x20",                   # 0x60 second back edge
        "LDL.LU.64 R8, [R1]",         # 0x70 after the loop: not in a loop
        "CALL.REL.NOINC 0xc0",        # 0x80 a subroutine called outside the loop
        "EXIT",                       # 0x90
        "SHFL.BFLY PT, R7, R7, 0x1, 0x1f",  # 0xa0 the slow path ...
        "BRA 0x20",                   # 0xb0 ... jumps back: not a loop of its own
        "STL [R1+0x8], R9",           # 0xc0 subroutine (called outside loops)
        "RET.REL.NODEC R4 0x0",       # 0xd0
    ])
    _insts, loops, bodies, _dominated = sass_loops(sass)
    assert bodies == {0x20: {0x20, 0x30, 0x40, 0x50, 0x60}}
    assert {0x20, 0x30, 0x40, 0x50, 0x60} <= loops
    assert not loops & {0x00, 0x10, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0}
    assert _loop_spills(sass) == 1
    # the same subroutine called from inside the loop counts as inside it
    inside = sass.replace("@!P1 CALL.REL.NOINC 0x70", "@!P1 CALL.REL.NOINC 0xc0").replace(
        "CALL.REL.NOINC 0xc0 ;\n        /*0090*/", "BRA 0x90 ;\n        /*0090*/")
    assert _loop_spills(inside) == 2


def test_stream_loop_model_tells_the_row_loops_apart() -> None:
    from benchmarks.verify_codegen import sampling_step_model, stream_loop_model

    sass = _sass([
        "LDG.E.128 R4, [R2.64]",      # 0x00 greedy loop: loads, no MUFU
        "FMNMX R8, R8, R4, !PT",      # 0x10
        "@P0 BRA 0x0",                # 0x20
        "LDG.E.128 R4, [R2.64]",      # 0x30 draft loop: loads and one MUFU
        "MUFU.EX2 R9, R4",            # 0x40
        "FADD R10, R10, R9",          # 0x50
        "@P0 BRA 0x30",               # 0x60
        "LDG.E.128 R4, [R2.64]",      # 0x70 race loop: header
        "FMNMX R8, R8, R4, !PT",      # 0x80
        "@!P1 BRA 0xe0",              # 0x90 a block that cannot win skips the race
        "IMAD R11, R11, 0x7feb352d, RZ",  # 0xa0 the race region: the hash ...
        "@!P2 BRA 0xe0",              # 0xb0 ... and the cheap bound: no token can win
        "FFMA.FTZ R12, R12, R11, R4",  # 0xc0 the logarithms
        "FFMA.FTZ R12, R12, R11, R4",  # 0xd0
        "@P0 BRA 0x70",               # 0xe0 back edge
        "LDG.E R4, [R2.64]",          # 0xf0 a loop with fewer loads: not a streaming loop
        "@P0 BRA 0xf0",               # 0x100
        "EXIT",                       # 0x110
    ])
    loops = stream_loop_model(sass, 90)
    assert loops is not None and set(loops) == {"greedy", "draft", "race"}
    assert loops["greedy"]["instructions"] == 3 and loops["greedy"]["mufu"] == 0
    assert loops["draft"]["instructions"] == 4 and loops["draft"]["mufu"] == 1
    assert loops["race"]["instructions"] == 8 and loops["race"]["instructions_skipping_race"] == 4
    assert loops["race"]["instructions_hash_only"] == 6
    assert all(v["bytes_per_warp_iteration"] == 512 for v in loops.values())
    race = {k: v for k, v in loops.items() if k == "race"}
    step = sampling_step_model(loops, race)
    assert step is not None
    # loops this short are memory-bound: 7 rows' bytes in the time of 8 rows' (the race's row
    # is read again)
    assert step["vs_peak_all_blocks_skip_race"] == round(7 / 8, 2)
    assert step["vs_peak_all_blocks_run_race"] <= step["vs_peak_expected"]
    assert step["vs_peak_expected"] <= step["vs_peak_all_blocks_skip_race"]
    assert step["vs_peak_expected"] <= step["vs_peak_expected_real_logits"]
    assert step["vs_peak_expected_real_logits"] <= step["vs_peak_all_blocks_skip_race"]
    # the mix's ends are the two extreme cases
    ends = [sampling_step_model(loops, race, log_fraction=f, hash_fraction=f)["vs_peak_expected"]
            for f in (0.0, 1.0)]
    assert ends == [step["vs_peak_all_blocks_skip_race"], step["vs_peak_all_blocks_run_race"]]
    assert sampling_step_model(loops, None) is None


def test_sampling_step_model_race_mix() -> None:
    """A compute-bound race: the step's bandwidth by hand, for each mix of hash and logarithms."""
    from benchmarks.verify_codegen import REAL_HASH_FRACTION, REAL_LOG_FRACTION, sampling_step_model

    # pass A memory-bound (twice the issue rate needed); the race's full loop issues at a fifth
    # of the bandwidth: 1,000 instructions, 100 on the skip path, 400 with the hash only
    loops = {"draft": dict(instructions=4, bytes_per_warp_iteration=512, compute_bound_vs_peak=2.0)}
    race = {"race": dict(instructions=1000, instructions_skipping_race=100, instructions_hash_only=400,
                         bytes_per_warp_iteration=512, compute_bound_vs_peak=0.2)}

    def by_hand(h: float, lg: float) -> float:
        # in units of one row's memory time: pass A 7 rows, then the race row's issue time
        # (5 units for the full loop), at least its memory time
        race_time = 5.0 * (100 + h * 300 + lg * 600) / 1000
        return round(7 / (7 + max(race_time, 1.0)), 2)

    step = sampling_step_model(loops, race, log_fraction=0.1, hash_fraction=0.5)
    assert step is not None
    assert step["vs_peak_all_blocks_skip_race"] == by_hand(0, 0) == round(7 / 8, 2)
    assert step["vs_peak_all_blocks_run_race"] == by_hand(1, 1) == round(7 / 12, 2)
    assert step["vs_peak_expected"] == by_hand(0.5, 0.1)
    assert step["vs_peak_expected_real_logits"] == by_hand(REAL_HASH_FRACTION, REAL_LOG_FRACTION)
    assert sampling_step_model(loops, race, log_fraction=0.0)["vs_peak_expected"] == by_hand(1, 0)
