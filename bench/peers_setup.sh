#!/usr/bin/env bash
# Build the peers' own environment for `make bench-peers`: llama-cpp-python compiled from
# source for this CPU (GGML_NATIVE), in a venv apart from the project's, so
# neither peer's dependencies touch ours. The built wheel is kept in a cache directory outside
# the repository: the ~7-minute compile happens once per machine.
set -euo pipefail
PEERS_VENV="${PEERS_VENV:-.venv-peers}"
PYTHON="${PYTHON:-python3}"
LLAMA_CPP_VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
WHEELS="${THOR_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/thor-runtime/wheels}"
mkdir -p "$WHEELS"
test -x "$PEERS_VENV/bin/python" || "$PYTHON" -m venv "$PEERS_VENV"
PY="$PEERS_VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_CPP_VERSION from source (native CPU build, several minutes)"
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$PY" -m pip wheel --no-deps --no-binary llama-cpp-python \
    -w "$WHEELS" "llama-cpp-python==$LLAMA_CPP_VERSION"
fi
"$PY" -m pip install -q --find-links "$WHEELS" "llama-cpp-python==$LLAMA_CPP_VERSION"
# transformers' generate runs in the project's venv, where it is already pinned (the test oracle)
# with the CPU torch: a second torch here would cost gigabytes for the same library.
echo "peers environment ready: $PEERS_VENV"
