#!/usr/bin/env bash
# `make test-gpu`: on a machine with an NVIDIA GPU, every CUDA test, the device self-test and a
# short device benchmark (CUDA beside this machine's CPU), logs and JSON into one folder.
# PY: the Python that has the project's dependencies (default: the venv's, else python3).
# Exit status: non-zero when any of the three failed; each still runs.
set -u
OUT=${GPU_OUT:-results/gpu}
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1      # one log of everything; JSON and the plot beside it
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
status=0
step() { echo "== $1 ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || status=1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
  || status=1

step "CUDA tests (pytest -m cuda)"
# only the files that hold CUDA tests: the others may need packages a GPU host lacks
files=$(grep -rl --include="test_*.py" "mark.cuda" tests)
"$PY" -m pytest -m cuda -v -rs -p no:cacheprovider $files || status=1

step "device self-test (a tiny random checkpoint; CPU fp32 is the reference)"
"$PY" -c "from tests.helpers.tiny import make_tiny_dir; make_tiny_dir('$OUT/.tiny', 'qwen3', seed=0)" \
  >/dev/null 2>&1 || status=1
"$PY" -m thor_app.cli selftest --model "$OUT/.tiny" --device cuda --dtype bf16 || status=1

step "the CLI on the device: thor generate --device cuda, speculative"
"$PY" -m thor_app.cli generate "pick up the red cup and place it on the table. pick up the red cup and" \
  --model "$OUT/.tiny" --device cuda --spec ngram --max-tokens 32 --json || status=1

step "benchmark: thor bench --device cuda (every shape; this host's CPU beside it), then FP8 KV"
"$PY" -m thor_app.cli bench --device cuda --repeats 3 --json "$OUT/bench-cuda.json" || status=1
"$PY" -m thor_app.tools.bench_device --device cuda --kv-dtype fp8 --shapes qwen2.5-0.5b,qwen3-8b --repeats 3 \
  --json "$OUT/bench-cuda-fp8kv.json" || status=1
rm -rf "$OUT/.tiny"
step "done: status $status"
exit $status
