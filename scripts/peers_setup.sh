#!/usr/bin/env bash
# Build the peers' own environment for `make bench-peers`: llama-cpp-python compiled from
# source for this CPU (GGML_NATIVE), in a venv apart from the project's, so
# neither peer's dependencies touch ours. The built wheel is kept in a cache directory outside
# the repository: the ~7-minute compile happens once per machine.
# PEERS_ISA=avx2: llama.cpp built for an AVX2-only x86 CPU (no AVX-512, no VNNI) in
# .venv-peers-avx2, to compare with thor run as one (THOR_CPU_ISA=avx2, docs/performance.md).
set -euo pipefail
PEERS_ISA="${PEERS_ISA:-native}"
if [ "$PEERS_ISA" = avx2 ]; then
  PEERS_VENV="${PEERS_VENV:-.venv-peers-avx2}"
  LLAMA_CMAKE="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF"
else
  PEERS_VENV="${PEERS_VENV:-.venv-peers}"
  LLAMA_CMAKE="-DGGML_NATIVE=ON"
fi
PYTHON="${PYTHON:-python3}"
LLAMA_CPP_VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
WHEELS="${THOR_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/thor-runtime/wheels}/$PEERS_ISA"
mkdir -p "$WHEELS"
test -x "$PEERS_VENV/bin/python" || "$PYTHON" -m venv "$PEERS_VENV"
PY="$PEERS_VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_CPP_VERSION from source ($PEERS_ISA CPU build, several minutes)"
  CMAKE_ARGS="$LLAMA_CMAKE" "$PY" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
    -w "$WHEELS" "llama-cpp-python==$LLAMA_CPP_VERSION"
fi
# pip keeps a locally built wheel in its own cache, keyed by the source only: not across ISAs
"$PY" -m pip install -q --no-cache-dir --force-reinstall --no-deps --find-links "$WHEELS" "llama-cpp-python==$LLAMA_CPP_VERSION"
"$PY" -m pip install -q --find-links "$WHEELS" "llama-cpp-python==$LLAMA_CPP_VERSION"
# transformers' generate runs in the project's venv, where it is already pinned (the test oracle)
# with the CPU torch: a second torch here would cost gigabytes for the same library.
echo "peers environment ready: $PEERS_VENV"
