# `make demo` and `make test` each set up `.venv` on a fresh machine (python3,
# make and git only) and then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One BLAS thread per process: OpenBLAS threads fight on a small loaded box.
export OPENBLAS_NUM_THREADS ?= 1
export XLA_PYTHON_CLIENT_PREALLOCATE ?= false

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-benchmarks
	$(BIN)/python demo.py

test: $(VENV)/.installed-tests
	$(BIN)/python -m pytest -q -n 2 tests

bench: $(VENV)/.installed-benchmarks
	$(BIN)/python benchmarks/callsites.py

clean:
	rm -rf $(VENV) .pytest_cache
