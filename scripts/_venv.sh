# Shared by scripts/setup.sh and scripts/setup_vllm.sh (sourced, not run): the virtual
# environment step and pip without its index-folder noise. The caller defines VENV, PY, log and die.

# Create $VENV with python3 (>= 3.10) unless it already has a Python.
make_venv() {
    [ -x "$PY" ] && return 0
    command -v python3 >/dev/null || die "python3 not found (structgen needs Python >= 3.10)"
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "python3 is $(python3 -V 2>&1); structgen needs Python >= 3.10"
    log "creating $VENV with $(python3 -V 2>&1)"
    python3 -m venv "$VENV"
}

# pip install into $PY's environment. pip warns once per package about index folders that do
# not hold it; that is noise here.
pip_install() {
    "$PY" -m pip install --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$" || true; }
    return "${PIPESTATUS[0]}"
}

# Python 3.11's venv ships setuptools 65, too old for structgen's PEP 639 license metadata
# (needs >= 77; the packaging test builds a wheel without build isolation): upgrade it once.
ensure_setuptools() {
    if ! "$PY" - <<'PYEOF' 2>/dev/null
import sys
try:
    import setuptools, wheel  # noqa: F401
except ImportError:
    sys.exit(1)
sys.exit(int(setuptools.__version__.split(".")[0]) < 77)
PYEOF
    then
        log "upgrading pip/setuptools/wheel in $VENV"
        pip_install -q -U pip "setuptools>=77" wheel
    fi
}
