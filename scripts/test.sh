#!/usr/bin/env bash
# Run the checks CI runs: ruff, the documentation build (mkdocs --strict), then pytest. Extra
# arguments go to pytest
# (e.g. `bash scripts/test.sh -m "not slow"` or `bash scripts/test.sh tests/test_cli_validate.py`).
# Needs scripts/setup.sh to have run (it makes .venv).
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
    exit 1
fi
exit "$rc"
