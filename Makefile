# One entry for set-up: `make demo` runs the demo sweep, measures this host's collectives and writes the report;
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

demo: setup
	$(VENV)/bin/scaling sweep demo
	$(VENV)/bin/scaling collectives --sweep-dir runs/demo parallel.dp=2
	$(VENV)/bin/scaling report runs/demo

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
