# One entry for set-up: `make demo` runs the demo sweep and its report, `make test` runs the tests.
# Both create .venv and install what they need (torch==2.13.0, the CPU build, on this path).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup sysdeps demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

sysdeps:
	bash scripts/install-system-deps.sh

demo: setup
	$(VENV)/bin/scaling sweep demo
	$(VENV)/bin/scaling report runs/demo

test: setup sysdeps
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs reports
