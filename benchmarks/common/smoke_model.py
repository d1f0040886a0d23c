"""The tiny random model the serving benchmarks' ``--smoke`` runs serve, saved as a model folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.common.checkout import ROOT, child_env


def save_smoke_model(folder: Path) -> None:
    """``bench_suite.tiny_model(favour=SMOKE_FAVOUR)`` saved to ``folder``, built in a
    child process so that the calling benchmark never imports torch itself."""
    code = ("import sys\nfrom benchmarks.bench_suite import SMOKE_FAVOUR, tiny_model\n"
            "lm = tiny_model(favour=SMOKE_FAVOUR)\nlm.model.save_pretrained(sys.argv[1])\n"
            "lm.tokenizer.save_pretrained(sys.argv[1])\n")
    env = {**child_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True, cwd=ROOT, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
