"""The benchmarks of lineax-dispatch, each run as `python -m benchmarks.NAME` from
the repository root (`make bench` runs them all and rewrites `results/`):

- `callsites`: compile and run time against the number of call sites, per policy;
- `solvers`: lineax-dispatch's iterative solvers against lineax's;
- `auto`: `Auto` under `lxd.jit` against the best fixed policy, over a grid;
- `batch`: `lxd.batch_solve` with many right-hand sides, and its peak memory;
- `program`: program-level dispatch (`lxd.jit` with `Roll` and `Auto`);
- `autosolver`: `lxd.AutoSolver` against a factorisation and CG (Bratu, Newton);
- `fixed_cost`: the first call of one cheap CG solve, `lxd.jit` against `jax.jit`;
- `steady`: repeated cheap CG solves at steady state, `lxd.CG` against `lx.CG`;
- `sharded`: per-device memory, collectives and compile at 1-8 devices;
- `families`, `stacked`, `dispatch`, `eager`, `replay`, `fit_cost_model`: see
    each module's docstring and docs/benchmarks*.md.

`harness` holds what they share: timing, the environment record, the operators
built from dense layers, the command line, and (from `output`, re-exported) tables,
plots and the results files.

Importing the package sets `OPENBLAS_NUM_THREADS` to 1 (unless already set), so
that it is set before any benchmark imports jax: OpenBLAS threads fight on a
small, loaded machine.
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
