#!/usr/bin/env bash
# Run the checks CI runs: ruff, import layering, mypy, the documentation build (mkdocs --strict),
# then pytest. Extra arguments go to pytest
# (e.g. `bash scripts/test.sh -m "not slow"` or `bash scripts/test.sh tests/test_cli_validate.py`).
# Needs scripts/setup.sh to have run (it makes .venv).
#
# Then, where scripts/setup.sh made vLLM's environment (.venv-vllm), tests/test_vllm.py runs with
# that interpreter (in .venv it skips: no vLLM there): about 4 minutes on 2 cores. It runs on a
# full run (no arguments); STRUCTGEN_VLLM_TESTS=1 runs it after a run with arguments too, and
# STRUCTGEN_VLLM_TESTS=0 never.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
    echo "[test] error: .venv is missing; run 'bash scripts/setup.sh' first" >&2
    exit 2
fi

# 2-core machines: competing OpenMP threads slow torch down many-fold. No hub access exists,
# so make transformers fail fast instead of retrying the network.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export STRUCTGEN_HYPOTHESIS_PROFILE="${STRUCTGEN_HYPOTHESIS_PROFILE:-ci}"

echo "[test] ruff check"
"$PY" -m ruff check . || { echo "[test] ruff check failed" >&2; exit 1; }

echo "[test] import layering (import-linter; contracts in pyproject.toml)"
.venv/bin/lint-imports --no-cache || { echo "[test] import layering check failed" >&2; exit 1; }

# the configuration in pyproject.toml: the whole package checked, grammar/ and masks/ strict
echo "[test] mypy"
"$PY" -m mypy || { echo "[test] mypy failed" >&2; exit 1; }

# --strict: a broken link, a missing page or a documented public name without a docstring fails
# the build. The site goes to a temporary folder, never into the repository. STRUCTGEN_SKIP_DOCS=1
# skips this step for quick local runs of a few test files (CI never sets it).
if [ "${STRUCTGEN_SKIP_DOCS:-0}" = 1 ]; then
    echo "[test] mkdocs build skipped (STRUCTGEN_SKIP_DOCS=1)"
else
    echo "[test] mkdocs build --strict"
    "$PY" -c 'import mkdocs, mkdocstrings, material' 2>/dev/null \
        || { echo "[test] error: mkdocs (the docs extra) is missing; run 'bash scripts/setup.sh'" >&2; exit 1; }
    SITE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/structgen-site.XXXXXX")
    NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --quiet --site-dir "$SITE_DIR"
    rc=$?
    rm -rf "$SITE_DIR"
    [ "$rc" -eq 0 ] || { echo "[test] mkdocs build --strict failed" >&2; exit 1; }
fi

echo "[test] pytest"
"$PY" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "[test] error: pytest collected no tests (exit 5); that counts as a failure" >&2
    rc=1
fi

# vLLM's own environment (scripts/setup_vllm.sh): the integration tests on a real vLLM engine
VLLM_PY=.venv-vllm/bin/python
run_vllm=${STRUCTGEN_VLLM_TESTS:-$([ "$#" -eq 0 ] && echo 1 || echo 0)}
if [ "$run_vllm" = 1 ] && [ -x "$VLLM_PY" ]; then
    echo "[test] pytest tests/test_vllm.py in .venv-vllm"
    # a present but broken environment must fail here, not skip the whole module quietly
    if ! "$VLLM_PY" -c 'from vllm import LLM; import structgen.integrations.vllm' >/dev/null 2>&1; then
        echo "[test] error: vLLM does not import in .venv-vllm; run 'bash scripts/setup_vllm.sh'" >&2
        exit 1
    fi
    # its own numba cache (another numba version than .venv's); the CPU engine's KV cache in GiB
    NUMBA_CACHE_DIR="$PWD/.venv-vllm/numba-cache" VLLM_CPU_KVCACHE_SPACE=2 HF_HUB_OFFLINE=1 \
        OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 "$VLLM_PY" -m pytest tests/test_vllm.py
    vrc=$?
    if [ "$vrc" -ne 0 ]; then
        echo "[test] tests/test_vllm.py failed in .venv-vllm (exit $vrc)" >&2
        [ "$rc" -ne 0 ] || rc=1
    fi
elif [ "$run_vllm" = 1 ]; then
    echo "[test] no .venv-vllm (STRUCTGEN_VLLM=0 at set-up): tests/test_vllm.py not run with vLLM"
fi
exit "$rc"
