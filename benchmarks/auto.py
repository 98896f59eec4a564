"""How close `lxd.Auto` under `lxd.jit` comes to the best fixed policy (and to plain
lineax), scored twice: compile (including the first call's extra) plus ONE run of
the compiled program, with `Auto(runs=1)`; and compile plus 100 runs, with the
default `Auto()` (`runs=100`).

What is measured
----------------

A grid of cases (kind x workload x n x call sites k), each under every fixed
policy of lineax-dispatch, under plain lineax, and under `Auto`:

- operator kinds, all `FunctionLinearOperator`s of float32 `n x n` maps:

  - "cheap": one dense matrix-vector product, `x -> M @ x`, with
    `M = I + G G^T / (SHIFT lambda_max(G G^T))` (`G ~ N(0, 1/n)`), so `M` is
    symmetric positive definite with its spectrum in about `[1, 1 + 1 / SHIFT]`.
  - "expensive": a chain of `L` dense layers (as in `callsites`),
    `C x = s_L * (W_L @ (... s_1 * (W_1 @ x)))`, `W_i ~ N(0, 1/n)`,
    `s_i ~ U(0.5, 1.5)`. For `mv` the operator is `C` itself (`L` matmuls); for
    solves it is the SPD `x -> x + C^T (C x)` (transposes applied by hand, `2 L`
    matmuls), the scales multiplied by a common factor (power iteration) so that
    `C^T C` has its largest eigenvalue about `1 / SHIFT`. `L` is `--layers`
    (default 32) but at most what keeps the weights within 256 MiB (`L = 4` at
    n=4096); the table's `L` column gives the layers actually used.

  Solves use operators tagged `lx.positive_semidefinite_tag`; with `SHIFT = 0.02`
  (condition number about 50) CG converges in a few tens of steps. The spectrum
  starts at 1, not at `SHIFT`: lineax's CG, and `lxd.CG` after it, report
  `singular` when a curvature `p^T A p` falls below `100 rcond p^T p` with
  `rcond = 2 eps n`, about `0.1 p^T p` at n=4096 in float32, so an operator whose
  Rayleigh quotients are small in absolute terms fails at large n. The
  right-hand side `b` is `RHS_SCALE = 1/16` times a standard normal vector, so
  that even `b * 16` stays at a scale where float32 rounding of the residual
  (about `eps * cond * |b|`) is below `atol = 1e-5`; with `b` of unit scale the
  solves with `b * 4` and beyond stalled at `max_steps`.

- workloads, with `k` independent call sites written as a Python loop (each a
  separate copy in the traced program):

  - "mv": `f(x) = sum_{i<k} op.mv(x * (i + 1))`;
  - "solve": `f(b) = sum_{i<k} lx.linear_solve(op, b * (i + 1), solver,
    throw=False).value` with `solver = lxd.CG(rtol=1e-5, atol=1e-5,
    max_steps=200)` (the program also returns the largest step count and whether
    every solve succeeded).

- variants:

  - `Lazy`, `Outline`, `Materialise`: `lxd.FunctionLinearOperator` with the fixed
    policy `lxd.Lazy()`, `lxd.Outline()`, `lxd.Materialise(batch_size=128)`,
    compiled with `jax.jit`; `Roll`: with `lxd.Roll()`, compiled with `lxd.jit`
    (which rolls its sites, and repeated solves, into one loop body). `Materialise` is skipped where the matrix would exceed
    1 GiB (recorded; it never does in the default grid). `VmapBatch`/`Scan` equal
    `Lazy` for single vectors and are not run.
  - `lineax`: plain `lx.FunctionLinearOperator` with `jax.jit`, the reference
    (for solves with lineax's own `lx.CG(rtol=1e-5, atol=1e-5, max_steps=200)`,
    i.e. no lineax-dispatch at all).
  - `Auto` and `Auto1`: `lxd.FunctionLinearOperator(..., policy=lxd.Auto())`
    (runs=100) and `policy=lxd.Auto(runs=1)`, compiled with `lxd.jit`, which traces
    the program once, reads each operator's call sites and the cost of its `mv`
    from the traced program, decides and rewrites it: all of that is in Auto's
    time. For "mv" the
    decision is `jitted.decisions(params, x)`; for "solve" the decision is made
    inside `CG.prepare` (once per solve, as one call site run the solver's
    expected number of iterations), and the strategy reported is what
    `solver.prepare(op)` returns (evaluated with `eqx.filter_eval_shape`, after the
    timing), with the reasons from `op.policy.decision(op, call_sites=1,
    executions=expected_iterations(200, n))`, the call `prepare` makes.

How the operator reaches the compiled program. Each measurement builds a fresh
operator whose function is `eqx.Partial(new_function_object, *arrays)` with
`closure_convert=False`: the arrays (matrix, weights, scales) are leaves of the
operator, and the Python function is new each time, so the operator's key (and
with it Auto's history and cost cache, equinox's cache of `Outline`'s callee and
jax's tracing caches) is new and nothing carries over between variants. The
operator is split `eqx.partition(op, eqx.is_array)`: its arrays are an *argument*
of the jitted function, the rest (function, policy, tags) is closed over, as
`equinox.filter_jit` splits it (`lxd.jit` has `jax.jit` semantics, so the
operator itself, which holds a Python function, cannot be an argument). Closing
over the arrays instead can make them HLO constants (with lineax's default
`closure_convert=True`, whether the closed-over arrays stay operator leaves or
become literals of the closure-converted jaxpr depends on jax's
`jax_use_simplified_jaxpr_constants` setting); compiling 128 MiB of constants
adds about a second to every program, for every variant alike, which is not what
is compared here.

Timing, per (case, variant), with a fresh operator:

- trace: `jax.jit(f).trace(params, x)`. For `lxd.jit` variants:
  `jitted.decisions(params, x)` (the one trace, the analysis and the rewrite);
- lower: `traced.lower()`. For `lxd.jit` variants: `jitted.lower(params, x)` (the
  lowering of the rewritten program);
- compile: `lowered.compile()`;
- first call: the first execution (`block_until_ready`). It includes compiling
  `Outline`'s callee, and the work XLA:CPU defers to the first execution;
- run: the median of up to 5 further executions, as many as fit in 1 s (one for
  a program that runs longer).

"compile total" = trace + lower + compile + first call - one run, i.e. compile
with the first call's extra; the score at `runs` is compile total + `runs` x run.
The best of a case, per score, is the least score among Lazy, Outline,
Materialise, Roll and plain lineax; Auto is scored with the variant told that
number of runs (`Auto1` at runs=1, `Auto` at runs=100).
With `--repeats r` each (case, variant) is measured r times and the repeat with
the median total is kept (all totals are in the JSON).

Skipped measurements, to keep the default grid within about 15 minutes on two
cores (each recorded with its reason in the JSON and shown as `skip` in the
table): within one (kind, workload, n) the call-site counts are run in increasing
order, and at each k after the first the fixed variants are measured best-first
(by their total at the previous k); a fixed variant is not measured when lower
bounds on both its scores already exceed twice the best score measured at this k,
so it cannot be the best. The bounds are 0.8 x runs x (its run time at the
previous k) x (k / previous k) for `Lazy` and `Outline` (each of the k sites runs
its own `mv`s: `Outline` with a host callback that copies all the weights each
time, which makes its solves of the large expensive operators take tens of
seconds), and 0.8 x its score at the previous k for `Materialise` and `Roll`
(their build or loop body is shared by the k sites). Auto and lineax are always
measured.

Before the grid, every variant is run once on a tiny case and discarded
(warm-up), and for each (kind, n) `Outline` is run once (its first call at a size
pays a one-off first touch of the host memory the callback copies into).

A separate measurement: the expensive operator at n=1024, L=32 (`--quick`: n=256,
L=4) with the "mv" workload at k=1 and k=16, under `lxd.jit` + Auto and under plain
lineax: compile total at k=16 / compile total at k=1 (target for Auto: <= 1.15).

Targets over the grid, for both scores: median Auto / best <= 1.05, worst <= 1.5,
and Auto / plain lineax <= 1.05 wherever plain lineax is the best.

Noise. With the default `--repeats 1` single cells are noisy on a shared 2-core
machine: in the recorded run, Auto's total against the fixed policy it chose
(the same compiled program plus Auto's observing trace) ranged from 0.66x to 1.78x
(median 1.02x) at a load average of about 3.5. Use `--repeats 3` (and a subset of
the grid) to confirm a single cell.

How to run
----------

    python -m benchmarks.auto           # n=64,256,1024,4096; k=1,4,16; L=32:
                                        # about 11 minutes
    python -m benchmarks.auto --quick   # n=64,256; k=1,4; L=4: 1 minute
    python -m benchmarks.auto --n 256,1024 --sites 1,16 --layers 16
    python -m benchmarks.auto --kinds expensive --workloads solve

Results: `auto.json` and `auto.png` in `benchmarks/results/` (`--out` to change
the folder).

Code: this file (command line and main), `_auto_grid.py` (constants, operators,
programs), `_auto_measure.py` (timing, skipping, the call-site measurement),
`_auto_report.py` (table, summary, plot); shared: `harness.py`. (Some 1,100 lines
in all: one file, or one with a single companion, would be far over 400 lines.)
"""

import argparse
import time
from collections.abc import Callable, Sequence

from benchmarks import harness
from benchmarks._auto_grid import (
    ATOL,
    KINDS,
    layers_for,
    MATERIALISE_BATCH,
    MATERIALISE_CAP_BYTES,
    MAX_STEPS,
    RHS_SCALE,
    RTOL,
    SHIFT,
    WEIGHT_CAP_BYTES,
    WORKLOADS,
)
from benchmarks._auto_measure import (
    run_grid,
    sites_check,
    SKIP_FACTOR,
    SKIP_MARGIN,
    warm_up,
)
from benchmarks._auto_report import format_results, plot, summarise, worst_cases
from benchmarks.harness import SEED


FULL = dict(n=(64, 256, 1024, 4096), sites=(1, 4, 16), layers=32)
QUICK = dict(n=(64, 256), sites=(1, 4), layers=4)
# The separate call-site measurement.
SITES_CHECK = dict(n=1024, layers=32, sites=(1, 16))
QUICK_SITES_CHECK = dict(n=256, layers=4, sites=(1, 16))


# ------------------------------------------------------------------ main


def _name_list(choices: Sequence[str]) -> Callable:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(v for v in text.split(",") if v)
        bad = [v for v in names if v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {choices}")
        return names

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; sizes left out take the defaults (or `--quick`'s)."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument(
        "--n",
        type=harness.int_list,
        help=f"comma-separated sizes (default {harness.joined(FULL['n'])})",
    )
    parser.add_argument(
        "--sites",
        type=harness.int_list,
        help="comma-separated call-site counts (default "
        f"{harness.joined(FULL['sites'])})",
    )
    parser.add_argument(
        "--layers",
        type=int,
        help=f"layers of the expensive operator (default {FULL['layers']}; fewer "
        "where the weights would exceed 256 MiB)",
    )
    parser.add_argument(
        "--kinds", type=_name_list(KINDS), default=KINDS, help="cheap,expensive"
    )
    parser.add_argument(
        "--workloads", type=_name_list(WORKLOADS), default=WORKLOADS, help="mv,solve"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="fresh-operator repeats per (case, variant), the median total kept "
        "(default 1)",
    )
    parser.add_argument(
        "--no-sites-check",
        action="store_true",
        help="skip the separate k=16 / k=1 compile measurement",
    )
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    args.n = tuple(sorted(set(args.n)))
    args.sites = tuple(sorted(set(args.sites)))
    args.sites_check = (
        None
        if args.no_sites_check
        else dict(QUICK_SITES_CHECK if args.quick else SITES_CHECK)
    )
    if args.sites_check is not None and args.quick and args.layers != QUICK["layers"]:
        args.sites_check["layers"] = args.layers
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    env = harness.environment(load_average=True)
    config = dict(
        kinds=list(args.kinds),
        workloads=list(args.workloads),
        n=list(args.n),
        sites=list(args.sites),
        layers=args.layers,
        layers_per_n={n: layers_for(n, args.layers) for n in args.n},
        weight_cap_bytes=WEIGHT_CAP_BYTES,
        materialise_batch_size=MATERIALISE_BATCH,
        materialise_cap_bytes=MATERIALISE_CAP_BYTES,
        solver=f"lxd.CG(rtol={RTOL}, atol={ATOL}, max_steps={MAX_STEPS}) "
        f"(lineax reference: lx.CG, same arguments)",
        shift=SHIFT,
        rhs_scale=RHS_SCALE,
        repeats=args.repeats,
        dtype="float32",
        closure_convert=False,
        operator_arrays="jit argument (eqx.partition), static part closed over",
        skip_rule=dict(factor=SKIP_FACTOR, margin=SKIP_MARGIN),
        seed=SEED,
        sites_check=args.sites_check,
    )
    harness.print_setup(env, config)
    capped = {
        n: layers
        for n, layers in config["layers_per_n"].items()
        if layers < args.layers
    }
    if "expensive" in args.kinds and capped:
        print(
            "expensive operator: fewer layers where the weights would exceed "
            f"{WEIGHT_CAP_BYTES // 2**20} MiB: "
            + ", ".join(f"n={n}: L={layers}" for n, layers in capped.items())
        )

    warm_up()
    print(f"warm-up done ({time.perf_counter() - start:.1f} s)", flush=True)

    rows = run_grid(
        args.kinds, args.n, args.workloads, args.sites, args.layers, args.repeats
    )

    check = None
    if args.sites_check is not None:
        print("  separate call-site measurement", flush=True)
        check = sites_check(args.sites_check, args.repeats)

    summary = summarise(rows)
    elapsed = time.perf_counter() - start
    env["load_average_end"] = harness.load_average_now()

    print(format_results(rows, summary, check))
    print(
        f"total benchmark time: {elapsed:.1f} s; load average at start "
        f"{env['load_average']}, at end {env['load_average_end']}"
    )

    payload = dict(
        environment=env,
        config=config,
        cases=rows,
        summary=summary,
        worst_cases=worst_cases(rows),
        sites_check=check,
        total_seconds=elapsed,
    )
    harness.write_results(
        args.out, "auto", payload, lambda path: plot(rows, summary, check, config, path)
    )


if __name__ == "__main__":
    main()
