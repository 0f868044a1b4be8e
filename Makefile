# One entry for set-up: `make demo` runs the demo sweep, measures this host's collectives, writes the report, then
# runs the batch-size recipe for the tiny model on the demo's emulated device (DEMO_RECIPE);
# `make test` lints (ruff check and ruff format --check), checks the import layers (lint-imports, contracts in
# pyproject.toml), then runs the tests.
# Both create .venv and install what they need (torch==2.13.0, the CPU build, on this path).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
# The tests run on one worker more than the host has cores: most of a test's time is processes starting and waiting.
WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

.PHONY: setup sysdeps demo test bench gpu-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	bash scripts/setup-venv.sh $(VENV) "$(TORCH)" -e ".[dev]"
	touch $@

sysdeps:
	bash scripts/install-system-deps.sh

# The recipe of the demo: a global batch of 4,096 tokens (32 samples of 128) on 1 to 64 emulated GPUs, ZeRO-0 and
# ZeRO-3, measured at dp 1 and 2 (at most 4 micro-steps a point), extrapolated past them.
DEMO_RECIPE ?= --gbs-tokens 4096 --gpus 1,2,4,8,16,32,64 --zero 0,3 --recompute none --max-grad-acc 4 \
	--sweep-dir runs/demo-recipe model=tiny train.seq_len=128 hardware.memory_gb=0.047 train.warmup_steps=2 \
	train.steps=8 launch.repeats=2

demo: setup
	$(VENV)/bin/scaling sweep demo
	$(VENV)/bin/scaling collectives --sweep-dir runs/demo parallel.dp=2
	$(VENV)/bin/scaling report runs/demo
	$(VENV)/bin/scaling recipe $(DEMO_RECIPE)
	$(VENV)/bin/scaling report runs/demo-recipe

test: setup sysdeps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -n $(WORKERS) --dist loadgroup $(PYTEST_ARGS)

bench: setup
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

# The GPU path on this machine's CUDA devices (<= 10 minutes on one H100); writes benchmarks/gpu/<device>.md.
# Uses the python that has your CUDA build of torch (GPU_PY=...), else .venv's; without CUDA it says so and fails.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PY) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) runs reports
