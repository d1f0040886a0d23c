"""The bad-input battery (benchmarks/bad_inputs.py) runs, classifies and writes its table.

``--smoke`` runs a few inputs per category in the shared sandbox; none may crash, hang, overrun
its memory, lose data or reach the network or a file (the full run's figures are in
``benchmarks/results/bad-inputs.json``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAILURES = ("crash", "hang", "memory", "data_loss", "network", "file_access")


def test_battery_smoke_writes_a_table_of_tracked_outcomes(tmp_path: Path) -> None:
    out = tmp_path / "bad-inputs.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bad_inputs.py"), "--smoke",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(out.read_text())
    assert {"commit", "date", "machine", "command", "table", "cases"} <= set(report)
    table = report["table"]
    assert set(table) == {"schema", "grammar", "regex", "config", "cli", "generation", "asset", "total"}
    assert table["total"]["inputs"] == len(report["cases"]) >= 10
    assert sum(table["total"][k] for k in ("ok", "typed", "crash", "hang", "memory")) == \
        table["total"]["inputs"]
    failed = [c for c in report["cases"] if set(c["flags"]) & set(FAILURES)]
    assert not failed, json.dumps(failed, indent=1)
    assert "| category |" in proc.stdout and out.with_suffix(".md").is_file()
