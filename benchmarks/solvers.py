"""Compile time and run time of lineax-dispatch's iterative solvers against their
lineax counterparts, for an expensive matrix-free operator.

What is measured
----------------

The operator is a plain `lineax.FunctionLinearOperator` (`closure_convert=False`,
the function an `eqx.Partial` holding the weights, so that they are the operator's
arrays and jit arguments; tagged `lx.positive_semidefinite_tag`) whose function is
symmetric positive definite:

    A x = SHIFT * x + B^T (B x),    B x = s_L * (W_L @ (... s_1 * (W_1 @ x)))

with `L` dense `n x n` float32 layers `W_i ~ N(0, 1/n)` and per-layer elementwise
scales `s_i ~ U(0.5, 1.5)` (as in `callsites.py`; see `_operators.py`), the
transpose applied by hand (`W_1^T (s_1 * ... W_L^T (s_L * y))`, each `W^T y`
written `y @ W`), so one `mv` is `2 L` matrix-vector products. The scales are
multiplied by a common factor that makes the largest eigenvalue of `B^T B` about 1
(found by power iteration), so the spectrum of `A` lies in about
`[SHIFT, 1 + SHIFT]` (condition number about 50) and CG converges in a few tens
of steps at `rtol = atol = 1e-5`.

Pairs (ours vs lineax's counterpart), all with the same `rtol`, `atol` and
`max_steps` on both sides and lineax's defaults for everything else:

    cg        lxd.CG              vs lx.CG
    bicgstab  lxd.BiCGStab        vs lx.BiCGStab
    gmres     lxd.GMRES           vs lx.GMRES
    lsmr      lxd.LSMR            vs lx.LSMR
    normal    lxd.Normal(lxd.CG)  vs lx.Normal(lx.CG)
    minres    lxd.MINRES          vs lx.CG (lineax has no MINRES)

A pair whose lineax-dispatch solver cannot be imported (or built with these
arguments) yet is skipped with a note; a pair whose measurement raises is reported
as failed and the others are still measured.

For each solver (each side of each pair), with a freshly built operator each time
(a new function object in the `eqx.Partial`, hence a new static part, so that no
cache of jax or equinox carries over), the program

    f(params, b) = lx.linear_solve(op(params), b, solver, throw=False)

(returning the solution, `stats["num_steps"]` and the result code) is jitted with
the operator's arrays (the weights) as an *argument* and its static part closed
over, as `equinox.filter_jit` would split it (closing over the operator would
embed the weights as HLO constants), and timed as in `_common.time_program`:
trace, lower, compile, first call (XLA:CPU defers part of its compile work for
dot-heavy code to it) and run, the median of at least 5 further executions.

"compile total" = trace + lower + compile + (first call - run). Each solver is
measured `--repeats` times (default 3; lineax and ours alternate), and the repeat
with the median compile total is reported (all repeats' compile totals and run
times are kept in the JSON). The same is done for ONE bare `op.mv` (jitted the same
way, `f(params, x) = op(params).mv(x)`), and each solver's compile total is also
reported as a multiple of it. Before the measurements one bare `mv` is measured
at the real size and discarded (warm-up).

Also reported per solver:

- `mv` copies in the compiled program: the number of `dot` instructions of the
  optimised HLO that take an `n x n` operand, divided by `2 L`;
- f traces: how many times the user's Python function runs while tracing,
  compiling and first calling the solve, counted on a small operator (n=16, two
  layers) built with `closure_convert=False` (so each `mv` call site calls the
  Python function); the small operator is closed over, not passed as an argument
  (a Python function is not a valid `jax.jit` argument). This also warms up the
  Python side of every solver before the timed measurements;
- the relative residual `|A x - b| / |b|` of the solution (computed outside jit)
  and the relative difference between the two sides' solutions.

`OPENBLAS_NUM_THREADS` is set to 1 (unless already set) before jax is imported.

How to run
----------

    .venv/bin/python benchmarks/solvers.py                    # n=1024, L=32, all pairs
    .venv/bin/python benchmarks/solvers.py --quick --solvers cg   # n=128, L=4, 1 repeat
    .venv/bin/python benchmarks/solvers.py --solvers cg,bicgstab --repeats 5

Results: `benchmarks/results/solvers.json` and `benchmarks/results/solvers.png`
(`--out` to change the folder).

Code: this file (command line and main), `_solvers_pairs.py` (the pairs),
`_solvers_measure.py` (operator, programs, measurements), `_solvers_report.py`
(tables, plot, acceptance); shared: `_common.py`, `_operators.py`, `_plotting.py`.
"""

# `_common` first: it sets OPENBLAS_NUM_THREADS before jax is imported.
import _common


# isort: split
import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from _common import RESULTS_DIR, SEED
from _solvers_measure import COUNT_LAYERS, COUNT_N, make_weights, run_all, SHIFT
from _solvers_pairs import ATOL, available_pairs, MAX_STEPS, PAIRS, RTOL
from _solvers_report import (
    ACCEPTANCE,
    acceptance,
    format_details,
    format_summary,
    format_table,
    plot,
)


DEFAULT_N = 1024
DEFAULT_LAYERS = 32
QUICK_N = 128
QUICK_LAYERS = 4
REPEATS = 3
QUICK_REPEATS = 1


# --------------------------------------------------------------------------------------
# Main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n", type=int, default=None, help=f"size (default {DEFAULT_N})"
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help=f"layers of B (default {DEFAULT_LAYERS}; one mv is 2x this many matvecs)",
    )
    parser.add_argument(
        "--solvers",
        type=lambda s: tuple(k.strip().lower() for k in s.split(",") if k.strip()),
        default=tuple(PAIRS),
        help="comma-separated pairs among " + ",".join(PAIRS) + " (default all)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="fresh-operator repeats per solver, the median-compile one reported "
        f"(default {REPEATS}; {QUICK_REPEATS} with --quick)",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=MAX_STEPS,
        help=f"max_steps of every solver, both sides (default {MAX_STEPS})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"n={QUICK_N}, layers={QUICK_LAYERS}, repeats={QUICK_REPEATS} unless "
        "given",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder")
    args = parser.parse_args(argv)
    unknown = [k for k in args.solvers if k not in PAIRS]
    if unknown:
        parser.error(f"unknown solvers {unknown}; choose among {list(PAIRS)}")
    n_default, layers_default, repeats_default = (
        (QUICK_N, QUICK_LAYERS, QUICK_REPEATS)
        if args.quick
        else (DEFAULT_N, DEFAULT_LAYERS, REPEATS)
    )
    args.n = n_default if args.n is None else args.n
    args.layers = layers_default if args.layers is None else args.layers
    args.repeats = repeats_default if args.repeats is None else args.repeats
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    env = _common.environment()
    config = dict(
        n=args.n,
        layers=args.layers,
        matvecs_per_mv=2 * args.layers,
        shift=SHIFT,
        dtype="float32",
        rtol=RTOL,
        atol=ATOL,
        max_steps=args.max_steps,
        repeats=args.repeats,
        solvers=list(args.solvers),
        closure_convert=False,
        tags=["positive_semidefinite_tag"],
        seed=SEED,
        operator_passed_as_jit_argument=True,
        f_trace_count_operator=dict(
            n=COUNT_N, layers=COUNT_LAYERS, closure_convert=False
        ),
    )
    _common.print_setup(env, config)

    pairs, skipped = available_pairs(args.solvers)
    for key, why in skipped.items():
        print(f"  skipping {key}: {why}", flush=True)
    if not pairs:
        print("nothing to measure")
        return

    weights, scales, factor = make_weights(args.n, args.layers)
    config["scale_factor_per_layer"] = factor
    results, bare_mv, failed = run_all(args, pairs, weights, scales)
    if not results:
        print("every selected pair failed: " + repr(failed))
        return
    accept = acceptance(results)
    elapsed = time.perf_counter() - start

    print()
    print(format_table(results))
    print()
    print(format_details(results))
    not_measured = {**skipped, **failed}
    print(format_summary(results, bare_mv, args.layers, accept, not_measured))
    print(f"total benchmark time: {elapsed:.1f} s")

    payload = dict(
        environment=env,
        config=config,
        skipped=skipped,
        failed=failed,
        bare_mv=bare_mv,
        results=results,
        acceptance=dict(criteria=ACCEPTANCE, results=accept),
        total_seconds=elapsed,
    )
    _common.write_results(
        args.out, "solvers", payload, lambda path: plot(results, bare_mv, config, path)
    )


if __name__ == "__main__":
    main()
