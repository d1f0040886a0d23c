#!/usr/bin/env bash
# Set up structgen on a fresh machine; safe to run again (steps already done are skipped).
#
#   bash scripts/setup.sh            # .venv + editable install with test and docs extras + assets
#   SETUP_FORCE=1 bash scripts/setup.sh   # redo the pip steps even if the stamp says done
#   STRUCTGEN_ASSETS="llama3" bash scripts/setup.sh   # choose which assets to pull ("" = none)
#
# Steps:
#   1. .venv (python3 -m venv) unless it exists; python >= 3.10 required.
#   2. Without a working CUDA GPU (no nvidia-smi, or it fails): torch==2.13.0 first. On these
#      machines that resolves to the CPU wheel on local disk; any other torch request would
#      download gigabytes of CUDA wheels.
#   3. pip install -e '.[test,docs]' and a check that structgen, structgen.kernels and
#      structgen.grammars import from the repository root (docs: mkdocs for scripts/test.sh).
#   4. Tokenizer and model assets the tests and the demo use: `python -m structgen.tools.assets pull
#      ALIAS...` (the same job as `structgen models pull`; cached under ~/.cache/structgen, so later
#      runs are quick).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
ASSETS=${STRUCTGEN_ASSETS-llama3 qwen2 gpt2 mistral smollm2-135m}
TORCH_CPU_VERSION=2.13.0

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# 1. virtual environment -------------------------------------------------------------------
if [ ! -x "$PY" ]; then
    command -v python3 >/dev/null || die "python3 not found (structgen needs Python >= 3.10)"
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "python3 is $(python3 -V 2>&1); structgen needs Python >= 3.10"
    log "creating .venv with $(python3 -V 2>&1)"
    python3 -m venv "$VENV"
fi
pip_install() {
    # pip warns once per package about index folders that do not hold it; that is noise here.
    "$PY" -m pip install --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$" || true; }
    return "${PIPESTATUS[0]}"
}

# Python 3.11's venv ships setuptools 65, too old for PEP 639 license metadata (needs >= 77);
# the packaging test builds a wheel without build isolation, so the venv needs a recent one.
if ! "$PY" - <<'PYEOF' 2>/dev/null
import sys
try:
    import setuptools, wheel  # noqa: F401
except ImportError:
    sys.exit(1)
sys.exit(int(setuptools.__version__.split(".")[0]) < 77)
PYEOF
then
    log "upgrading pip/setuptools/wheel in .venv"
    pip_install -q -U pip "setuptools>=77" wheel
fi

# 2. torch -----------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GPU=1
    log "CUDA GPU found: torch comes from the regular dependency resolution (torch>=2.4)"
else
    GPU=0
    have=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
    if [ "${have%%+*}" != "$TORCH_CPU_VERSION" ]; then
        log "no CUDA GPU: installing torch==$TORCH_CPU_VERSION (CPU build) first"
        pip_install -q "torch==$TORCH_CPU_VERSION"
    else
        log "torch $have already installed"
    fi
fi

# 3. structgen itself, editable, with the test and docs extras -------------------------------
STAMP="$VENV/.structgen-setup"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1) gpu=$GPU"
check_import() {
    # From the repository root (cwd on sys.path), as tests and users run it.
    "$PY" -c 'import structgen, structgen.kernels, structgen.grammars, structgen.tools.cli' 2>/dev/null
}
if [ "${SETUP_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && check_import; then
    log "structgen already installed (pyproject.toml unchanged)"
else
    log "pip install -e '.[test,docs]'"
    if [ "$GPU" = 0 ]; then
        # the pin keeps pip from replacing the CPU torch with a CUDA build while resolving
        pip_install -q -c <(echo "torch==$TORCH_CPU_VERSION") -e '.[test,docs]'
    else
        pip_install -q -e '.[test,docs]'
    fi
    check_import || die "structgen (with structgen.kernels, structgen.grammars) does not import from the repository root after the editable install"
    echo "$want" > "$STAMP"
fi

# 4. assets ----------------------------------------------------------------------------------
if [ -z "$ASSETS" ]; then
    log "STRUCTGEN_ASSETS is empty: no assets pulled"
elif [ -f structgen/tools/assets.py ]; then
    log "assets: python -m structgen.tools.assets pull $ASSETS (cached after the first run)"
    # shellcheck disable=SC2086  # word splitting intended: one alias per word
    "$PY" -m structgen.tools.assets pull $ASSETS || die "pulling assets ($ASSETS) failed (see above)"
else
    log "structgen/tools/assets.py does not exist yet: skipping tokenizer/model assets ($ASSETS);"
    log "tests that need them skip themselves and 'structgen demo' runs without a model"
fi

log "done: run 'bash scripts/test.sh' (tests) or '.venv/bin/structgen demo' (main job)"
