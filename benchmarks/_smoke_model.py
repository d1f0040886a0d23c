"""The tiny random model the serving benchmarks' ``--smoke`` runs serve, saved as a model folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def save_smoke_model(folder: Path) -> None:
    """``bench_suite.tiny_model(favour=SMOKE_FAVOUR)`` saved to ``folder``, built in a
    child process so that the calling benchmark never imports torch itself."""
    code = ("import sys\nfrom bench_suite import SMOKE_FAVOUR, tiny_model\n"
            "lm = tiny_model(favour=SMOKE_FAVOUR)\nlm.model.save_pretrained(sys.argv[1])\n"
            "lm.tokenizer.save_pretrained(sys.argv[1])\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "benchmarks")))}
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True, cwd=ROOT, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
