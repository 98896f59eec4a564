# `make demo` and `make test` each set up `.venv` on a fresh machine (python3,
# make and git only) and then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One BLAS thread per process: OpenBLAS threads fight on a small loaded box.
export OPENBLAS_NUM_THREADS ?= 1
export XLA_PYTHON_CLIENT_PREALLOCATE ?= false

.PHONY: demo test test-newest lint typecheck docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[$*]"
	touch $@

# The showcase writes demo.json and demo.png into DEMO_OUT (git-ignored), so it
# changes no tracked file; the docs' figure is rewritten by
#   .venv/bin/python demo.py --out benchmarks/results
DEMO_OUT ?= demo-results
demo: $(VENV)/.installed-benchmarks
	$(BIN)/python demo.py --out $(DEMO_OUT)

# Lint and typecheck (seconds), then the tests.
test: lint typecheck
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=15 tests

# The same test suite on Python 3.13 with the newest JAX pip gives there (jax >= 0.11
# needs Python >= 3.12), in `.venv-newest`: the second leg of CI. `.ci/python313`
# finds a Python 3.13 or builds one from Debian's source package (about 10 minutes
# on 2 cores, once: the build is kept in ~/.cache/lineax-dispatch/python3.13).
NEWEST := .venv-newest
test-newest:
	@test -x $(NEWEST)/bin/python || { \
		py=$$(.ci/python313) && $$py -m venv $(NEWEST) && \
		$(NEWEST)/bin/python -m pip install --quiet --upgrade pip; }
	@test $(NEWEST)/.installed -nt pyproject.toml || { \
		$(NEWEST)/bin/python -m pip install --quiet --upgrade -e ".[tests]" && \
		touch $(NEWEST)/.installed; }
	$(NEWEST)/bin/python -c "import jax, sys; print('Python', sys.version.split()[0], 'jax', jax.__version__)"
	$(NEWEST)/bin/python -m pytest -q -n 2 --dist worksteal --durations=15 tests

# ruff: the rule set is in pyproject.toml ([tool.ruff.lint]).
lint: $(VENV)/.installed-tests
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

# pyright in basic mode over lineax_dispatch/ ([tool.pyright] in pyproject.toml),
# against the packages in .venv; any error fails it. Part of `make test`, so it is
# installed with the tests.
typecheck: $(VENV)/.installed-tests
	$(BIN)/pyright --pythonpath $(BIN)/python

# The documentation site, into site/; any warning fails it.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

# Every benchmark in benchmarks/ (many minutes), rewriting the JSON files and plots
# in benchmarks/results/ that the docs' Benchmarks page is built from. To check the
# command lines without touching the results:
#   make bench BENCH_FLAGS=--quick BENCH_OUT=/tmp/bench
BENCH_OUT ?= benchmarks/results
BENCH_FLAGS ?=
bench: $(VENV)/.installed-benchmarks
	$(BIN)/python -m benchmarks.callsites $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.callsites --layers 64 $(BENCH_FLAGS) \
		--out $(BENCH_OUT)/callsites-64-layers
	$(BIN)/python -m benchmarks.solvers --solvers cg,bicgstab $(BENCH_FLAGS) \
		--out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.solvers --solvers gmres,lsmr,normal,minres \
		--repeats 1 $(BENCH_FLAGS) --out $(BENCH_OUT)/solvers-others
	$(BIN)/python -m benchmarks.auto $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.replay --grid $(BENCH_OUT)/auto.json \
		--out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.batch $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.autosolver $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.program $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.dispatch $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.eager $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.fixed_cost $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.steady $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.sharded $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.stacked --rolled $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.families --repeats 2 $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.fit_cost_model --results $(BENCH_OUT)
	$(BIN)/python -m benchmarks.realistic $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.dependent_sites $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.compile_race $(BENCH_FLAGS) --out $(BENCH_OUT)
	$(BIN)/python -m benchmarks.preconditioners $(BENCH_FLAGS) --out $(BENCH_OUT)
	# The README's headline table, read again from the results just written.
	test "$(BENCH_OUT)" != benchmarks/results || $(BIN)/python docs/hooks/figures.py

clean:
	rm -rf $(VENV) $(NEWEST) .pytest_cache site
