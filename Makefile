# One entry for set-up: `make demo` runs the demo sweep, measures this host's collectives, runs the batch-size recipe
# for the tiny model on the demo's emulated device (DEMO_RECIPE), then writes both reports (one process: 2 s less);
# `make test` lints (ruff check and ruff format --check), checks the import layers (lint-imports, contracts in
# pyproject.toml), then runs the tests; `make test-fast` runs the ones that start no process (about a minute).
# Both create .venv and install what they need at the versions of requirements.lock (`make lock` refreshes it):
# torch==2.13.0 is PyTorch's CPU build (2.13.0+cpu) where pip's find-links or index offers it, else the default
# index's (scripts/setup-venv.sh); `make test-lowest` runs the fast tests on the lowest versions pyproject.toml allows.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
LOCK := requirements.lock
PYTEST_ARGS ?=
# The tests run on one worker more than the host has cores: most of a test's time is processes starting and waiting.
# (Two more, 4 workers on 2 cores, took CI from 10 min 40 s to 12 min 56 s: 3 min more CPU in contention.)
WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

.PHONY: setup install lowest-deps install-lowest setup-lowest sysdeps demo test test-fast test-lowest lock bench gpu-check clean

setup: $(VENV)/.installed

# In two steps: the packages (`make install`: downloads and links, and the project's editable build, which writes
# scaling.egg-info into this checkout), then their bytecode, compiled for what the processes import
# (scripts/compile_imports.py: one process, about 16 s of CPU), not for every installed file. The processes these
# targets start may write what else they import (the rendezvous modules torchrun imports at run time, a test's own
# imports): with PYTHONDONTWRITEBYTECODE set, as it is on some hosts, each of them would compile those modules anew at
# every start.
export PYTHONDONTWRITEBYTECODE :=
install: $(VENV)/.linked

$(VENV)/.linked: pyproject.toml $(LOCK)
	COMPILE_BYTECODE=0 bash scripts/setup-venv.sh $(VENV) "$(TORCH)" -c $(LOCK) -e ".[dev]"
	touch $@

$(VENV)/.installed: $(VENV)/.linked
	$(PY) scripts/compile_imports.py
	touch $@

$(VENV)/bin/uv:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q uv

# Every package of -e '.[dev]' (all extras) pinned, as uv resolves them for this Python and platform with torch the
# CPU build of $(TORCH) from pip's find-links. Run it after editing pyproject.toml's dependencies; commit both.
lock: $(VENV)/bin/uv
	echo "$(TORCH)" | bash scripts/uv.sh $(PY) pip compile -q --python $(PY) --custom-compile-command "make lock" \
		--extra dev pyproject.toml - -o $(LOCK)

# The tests that start no process and take no more than a few seconds each, chosen by marker (pyproject.toml lists
# the markers; tests/conftest.py fails a test that starts a process without the marker that says so).
FAST := -m "not torchrun and not subprocess and not slurm and not browser and not slow"
test-fast: setup
	$(PY) -m pytest -n $(WORKERS) -p no:cacheprovider $(FAST) $(PYTEST_ARGS)

# The lower bounds of pyproject.toml, checked: every direct dependency at the lowest version it allows (uv's
# lowest-direct; what they pull in at their newest) in $(LOWEST), and the fast tests (FAST, above) on it.
# torch is the build setup-venv.sh chooses, the +cpu build named in full where it is offered: lowest-direct would
# take PyPI's plain 2.13.0, the CUDA build, over it.
# Its bytecode is compiled, as .venv's, for what the processes import (scripts/compile_imports.py), not for every file.
# CI installs its dependencies beside `make setup`, then the project, and runs its tests beside `make test`'s at the
# lowest CPU priority (.ci/run).
LOWEST ?= .venv-lowest
# One worker per core: without bytecode (above) every worker compiles what it imports, so a third costs more than it
# gains (43 s against 56 s here). CI runs it in one process (LOWEST_WORKERS=0) beside `make test`, where its CPU, not
# its wall, is what counts: 34 s of CPU against 47 s on two workers, which each collect and compile the same modules.
# One process compiles what it imports as it goes, once: compile_imports beforehand would import it all twice (and
# modules the lane never imports), so with LOWEST_WORKERS=0 the lane leaves it out.
# What differs between the two environments is every direct dependency's version but torch's (the same build in
# both), so the modules that exercise torch alone (the FLOPs formulas and counter, the decoder's modules, the memory
# predictors' traces on fake tensors and per pipeline stage, the batches) add nothing here and are left to `make
# test`, as are those that read only this repository's own files with the standard library (the import layers and
# circles, the modules' docstrings, the documents' layout and RESULTS' tables, CI's summary); the ones left exercise
# Hydra and OmegaConf (composition, the sweepers, the job key), pandas, seaborn and matplotlib (the analysis), numpy
# and scipy (the fits), transformers, W&B, Optuna, submitit, psutil and PyYAML.
LOWEST_WORKERS ?= $(shell nproc)
TORCH_ONLY := --ignore=tests/test_flops.py --ignore=tests/test_model.py --ignore=tests/test_memory.py \
	--ignore=tests/test_stage_memory.py --ignore=tests/test_data.py -k "not flops_counted_on_fake_tensors"
SOURCE_ONLY := --ignore=tests/test_layers.py --ignore=tests/test_module_docstrings.py --ignore=tests/test_docs_layout.py \
	--ignore=tests/test_docs_results.py --ignore=tests/test_ci_summary.py
lowest-deps: $(LOWEST)/.deps

install-lowest: $(LOWEST)/.installed

setup-lowest: $(LOWEST)/.compiled

test-lowest: $(if $(filter 0,$(LOWEST_WORKERS)),install-lowest,setup-lowest)
	$(LOWEST)/bin/python -m pytest -n $(LOWEST_WORKERS) -p no:cacheprovider -q $(FAST) $(TORCH_ONLY) $(SOURCE_ONLY) \
		$(PYTEST_ARGS)

# In two steps: every dependency, resolved from pyproject.toml's static metadata (nothing is built in this checkout,
# so CI runs it beside `make setup`), then the project itself, editable, without dependencies (its build writes
# scaling.egg-info into the checkout, as `make setup`'s does: the two builds do not run at once).
$(LOWEST)/.deps: pyproject.toml
	rm -rf $(LOWEST)
	COMPILE_BYTECODE=0 bash scripts/setup-venv.sh $(LOWEST) "$(TORCH)" --resolution lowest-direct \
		-r pyproject.toml --extra dev
	touch $@

# The project's editable install (it writes scaling.egg-info into this checkout), then the bytecode (which writes
# nothing here): CI makes the first after `make install`, and its one-process lane (LOWEST_WORKERS=0) leaves the
# second out, compiling what it imports as it goes; `make test-lowest` on several workers makes both.
$(LOWEST)/.installed: $(LOWEST)/.deps
	bash scripts/uv.sh $(LOWEST)/bin/python pip install -q --python $(LOWEST)/bin/python --no-deps -e .
	touch $@

$(LOWEST)/.compiled: $(LOWEST)/.installed
	$(LOWEST)/bin/python scripts/compile_imports.py
	touch $@

sysdeps:
	bash scripts/install-system-deps.sh

# The recipe of the demo: a global batch of 2,048 tokens (16 samples of 128) on 1, 2, 8, 16 and 64 emulated GPUs
# (each count needs its own mbs, measured at dp 1 and 2), ZeRO-0 and ZeRO-3, at most 2 micro-steps a point, one run
# each, extrapolated past dp 2 under the network the demo measured (its alpha_beta.json, copied into the recipe's
# directory) up to the horizon, 8 (4x the largest measured dp): 16 GPUs is past it, 64 more than the batch can use.
DEMO_RECIPE ?= --gbs-tokens 2048 --gpus 1,2,8,16,64 --zero 0,3 --recompute none --max-grad-acc 2 \
	--sweep-dir runs/demo-recipe model=tiny train.seq_len=128 hardware.memory_gb=0.047 train.warmup_steps=2 \
	train.steps=6 launch.repeats=1

# The demo needs only `make install`: its processes compile what they import as they import it (the Makefile lets them
# write bytecode), once, one after the other; compile_imports would first compile the 189 modules every process of the
# project may import, transformers', Optuna's and submitit's included, which the demo never does (141.0 s against
# 118.9 s from fresh clones, the same 64 statuses; `make test` compiles them all, for its processes start at once).
demo: install
	$(VENV)/bin/scaling sweep demo
	$(VENV)/bin/scaling collectives --sweep-dir runs/demo parallel.dp=2
	mkdir -p runs/demo-recipe && { [ -e runs/demo-recipe/alpha_beta.json ] || cp runs/demo/alpha_beta.json runs/demo-recipe/; }
	$(VENV)/bin/scaling recipe $(DEMO_RECIPE)
	$(VENV)/bin/scaling report runs/demo runs/demo-recipe

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
	rm -rf $(VENV) $(LOWEST) runs reports
