"""The Triton verify kernels compile for real GPUs (sm_80, sm_90) on this CPU-only machine, and the
machine code has the properties the bandwidth target needs.

``benchmarks/verify_codegen.py`` drives Triton's own compiler and ptxas against a stand-in CUDA
driver (nothing runs), so this checks what the interpreter tests cannot: that every kernel
variant compiles for the target, that pass A reads the logits with 16-byte vector loads
(aligned rows, and rows whose stride is not a multiple of 16 elements, e.g. V = 50,257), that
no kernel spills registers, and that new batch sizes and draft lengths compile nothing new.
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
    cmd = [sys.executable, str(ROOT / "benchmarks" / "verify_codegen.py"), "--arch", "80,90",
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
        assert row["spill_stores"] <= 16 and row["programs_per_sm"] >= 4, (c["arch"], c["vocab"], row)
        assert c["stream_loads_no_mask"].get("16", 0) >= 4           # the logits: 16-byte loads
        # the fused chain: greedy and deterministic-draft steps are one launch
        if c["mode"] == "greedy":
            assert set(c["kernels"]) == {"_row_pass_kernel"}
    assert all(r["ok"] for r in report["recompile"]), report["recompile"]
    assert res.returncode == 0, res.stdout[-3000:]
