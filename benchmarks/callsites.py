"""Compile time and run time of an expensive linear operator against its number of
call sites, for plain lineax and for each lineax-dispatch policy.

What is measured
----------------

The operator is a `FunctionLinearOperator` whose function is a chain of `L` dense
`n x n` layers, `x -> s_L * (W_L @ (... s_1 * (W_1 @ x)))`, float32, weights drawn
from `jax.random` with a fixed seed (`s_i` is a per-layer elementwise scale, so
that XLA sees `L` separate matmuls; see `_operators.py`). It is built with
`closure_convert=False`, its function an `eqx.Partial` holding the weights, so
that they are the operator's arrays whatever jax's closure conversion does (as in
`solvers.py` and `auto.py`). It used to be built with lineax's default
`closure_convert=True`, which leaves the weights as the operator's arrays only
while jax keeps captured arrays as constants of the closure-converted jaxpr: with
`jax_use_simplified_jaxpr_constants` on, jax 0.10 inlines them as literals, the
operator has no array leaves, `params` below is empty and the weights (128 MiB at
the defaults) are compiled in as HLO constants.

For each number of call sites `k` the program is

    f(xs) = op.mv(xs[0]) + op.mv(xs[1]) + ... + op.mv(xs[k - 1])

written as a Python loop, so each `mv` is a separate call site in the traced
program. The operator's arrays (the weights) are an *argument* of the jitted function
and its static part (the function, the policy) is closed over, as
`equinox.filter_jit` would split it: closing over the arrays would embed them as
literal constants in the HLO and measure the serialisation of those, not the
compiler.

Variants: plain `lineax.FunctionLinearOperator`, and
`lineax_dispatch.FunctionLinearOperator` with `Lazy()`, `Outline()` and
`Materialise(batch_size=MATERIALISE_BATCH)`.

For each (variant, k), in this process, with a freshly built operator (a new
function object in the `eqx.Partial`, hence a new static part, so that neither
jax's caches nor equinox's process-wide cache of `Outline`'s callee carry over),
`jax.jit(f)` is timed on `(params, xs)` (`params`: the operator's arrays) as in
`_common.time_program`: trace, lower, compile, first call (for `Outline` this
includes compiling the outlined callee; for dot-heavy code XLA:CPU defers part of
its compile work to the first execution) and run, the median of several further
executions (at least 3). For `Outline` each call is a host callback that hands
the operator's arrays (all the weights, not only the vector) to the callee, so its
run time grows with the operator's size; for `Materialise` each call of `f` builds
the matrix again (XLA merges the k identical builds into one).

"compile total" = trace + lower + compile + (first call - run), and "run per
mv" = run / k. Each (variant, k) is measured `--repeats` times (default 3), each
time with a fresh operator, and the repeat with the median compile total is
reported (all compile totals are kept in the JSON). Before any of this, each
variant is run once at k=1 with the real weights and discarded (warm-up).
Ratios are reported against the same variant at k=1 and against plain lineax at
the same k.

A quick check at the start shows that a fresh operator makes `Outline`'s callee
compile again (by counting how often the user's Python function runs, with
`closure_convert=False`), while reusing one operator does not.

`OPENBLAS_NUM_THREADS` is set to 1 (unless already set) before jax is imported.

How to run
----------

    .venv/bin/python benchmarks/callsites.py            # n=1024, L=32, k=1,2,4,8,16
    .venv/bin/python benchmarks/callsites.py --quick    # n=256, L=8, k=1,2,4
    .venv/bin/python benchmarks/callsites.py --n 512 --layers 16 --ks 1,4,16

Results: `benchmarks/results/callsites.json` and `benchmarks/results/callsites.png`.
Tables and plot: `_callsites_report.py`; shared: `_common.py`, `_operators.py`,
`_plotting.py`.
"""

# `_common` first: it sets OPENBLAS_NUM_THREADS before jax is imported.
import _common


# isort: split
import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
from _callsites_report import BASELINE, format_ratios, format_table, plot, ratios
from _common import (
    count_runs,
    median_trial,
    relative_error,
    RESULTS_DIR,
    SEED,
    time_program,
)
from _operators import apply_chain, random_layers

import lineax_dispatch as lxd


DEFAULT_N = 1024
DEFAULT_LAYERS = 32
DEFAULT_KS = (1, 2, 4, 8, 16)
QUICK_N = 256
QUICK_LAYERS = 8
QUICK_KS = (1, 2, 4)
MATERIALISE_BATCH = 128
REPEATS = 3
MIN_RUNS = 3


# --------------------------------------------------------------------------------------
# The operator


def make_weights(n: int, layers: int, seed: int = SEED):
    """Weights `W_i ~ N(0, 1/n)` and per-layer scales `s_i ~ U(0.5, 1.5)`, float32."""
    keys = jax.random.split(jax.random.key(seed), 2 * layers)
    return jax.block_until_ready(random_layers(keys, n, layers))


def make_chain(weights, scales) -> Callable:
    """`x -> s_L * (W_L @ ... s_1 * (W_1 @ x))` as an `eqx.Partial` holding the
    arrays, around a new function object each call."""

    def chain(weights, scales, x):
        return apply_chain(weights, scales, x)

    return eqx.Partial(chain, weights, scales)


def _lineax_builder(fn, structure):
    return lx.FunctionLinearOperator(fn, structure, (), closure_convert=False)


def _dispatch_builder(policy: lxd.AbstractPolicy) -> Callable:
    def build(fn, structure):
        return lxd.FunctionLinearOperator(
            fn, structure, (), closure_convert=False, policy=policy
        )

    return build


def variant_builders(batch_size: int) -> dict[str, Callable]:
    """Name -> `(fn, structure) -> operator` (`closure_convert=False`), plain lineax
    first."""
    return {
        BASELINE: _lineax_builder,
        "Lazy": _dispatch_builder(lxd.Lazy()),
        "Outline": _dispatch_builder(lxd.Outline()),
        f"Materialise({batch_size})": _dispatch_builder(
            lxd.Materialise(batch_size=batch_size)
        ),
    }


def make_sum_of_mvs(k: int) -> Callable:
    """`f(op, xs) = sum_i op.mv(xs[i])`, one call site per `i`."""

    def sum_of_mvs(op, xs):
        total = op.mv(xs[0])
        for i in range(1, k):
            total = total + op.mv(xs[i])
        return total

    return sum_of_mvs


def make_program(op, k: int) -> tuple[Callable, object]:
    """`(f, params)` with `f(params, xs) = sum_i op.mv(xs[i])`: the operator's arrays
    (the weights) are a jit argument and its static part (the function, the
    policy) is closed over, the split `equinox.filter_jit` makes."""
    params, static = eqx.partition(op, eqx.is_array)
    sum_of_mvs = make_sum_of_mvs(k)

    def f(params, xs):
        return sum_of_mvs(eqx.combine(params, static), xs)

    return f, params


# --------------------------------------------------------------------------------------
# Measurements


def measure(build: Callable, weights, scales, k: int, n: int) -> tuple[dict, jax.Array]:
    """Times one (variant, k) with a fresh operator; returns the timings and output."""
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    op = build(make_chain(weights, scales), structure)
    xs = jax.random.normal(jax.random.key(SEED + k), (k, n), jnp.float32)
    program, params = make_program(op, k)
    timings, _, out = time_program(program, params, xs, MIN_RUNS)
    runs = timings.pop("runs")
    timings = dict(k=k, **timings, run_per_mv_s=timings["run_s"] / k, runs=runs)
    return timings, out


def measure_repeated(
    build: Callable, weights, scales, k: int, n: int, repeats: int
) -> tuple[dict, jax.Array]:
    """`measure` `repeats` times; the repeat with the median compile total, with
    every repeat's compile total (in increasing order) added as
    `compile_total_all_s`."""
    trials = [measure(build, weights, scales, k, n) for _ in range(repeats)]
    timings, out = median_trial(trials, "compile_total_s")
    timings["compile_total_all_s"] = sorted(t["compile_total_s"] for t, _ in trials)
    return timings, out


def check_fresh_operator_recompiles(n: int = 16, layers: int = 2) -> dict:
    """Counts runs of the user's Python function (closure_convert=False) under
    `Outline`: a fresh operator should run it once while tracing (shape
    evaluation) and once at the first call (compiling the callee); the same
    operator in a new `jit` should run it zero times (equinox's caches hit)."""
    weights, scales = make_weights(n, layers, SEED + 1)
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    xs = jnp.ones((2, n), jnp.float32)
    counter = [0]

    def fresh_operator():
        chain = make_chain(weights, scales)

        def counted(x):
            counter[0] += 1
            return chain(x)

        return lxd.FunctionLinearOperator(
            counted, structure, closure_convert=False, policy=lxd.Outline()
        )

    def runs(op) -> dict:
        # The operator holds a plain Python function (the weights are closed over,
        # not leaves), which is not a valid `jax.jit` argument: close over the
        # (tiny) operator instead.
        trace, first_call = count_runs(
            lambda xs: make_sum_of_mvs(2)(op, xs), xs, counter
        )
        return dict(trace=trace, first_call=first_call)

    op = fresh_operator()
    result = dict(
        first_operator=runs(op),
        same_operator_new_jit=runs(op),
        fresh_operator=runs(fresh_operator()),
    )
    result["fresh_operator_recompiles_callee"] = (
        result["fresh_operator"]["first_call"] >= 1
        and result["same_operator_new_jit"]["first_call"] == 0
    )
    return result


def warm_up(builders: dict[str, Callable], weights, scales, n: int) -> None:
    """One discarded measurement per variant at k=1 with the real weights. The
    first `Outline` call at a given size pays a one-off ~0.5 s (first touch of the
    host memory its callback copies the weights into) that would otherwise land on
    the k=1 row only."""
    for build in builders.values():
        measure(build, weights, scales, 1, n)


def run_all(args: argparse.Namespace) -> dict[str, list[dict]]:
    builders = variant_builders(args.batch_size)
    weights, scales = make_weights(args.n, args.layers)
    warm_up(builders, weights, scales, args.n)
    results: dict[str, list[dict]] = {name: [] for name in builders}
    for k in args.ks:
        reference = None
        for name, build in builders.items():
            timings, out = measure_repeated(
                build, weights, scales, k, args.n, args.repeats
            )
            reference = out if reference is None else reference
            timings["rel_err_vs_lineax"] = relative_error(out, reference)
            results[name].append(timings)
            print(
                f"  k={k:<3} {name:<18} compile total "
                f"{timings['compile_total_s']:8.3f} s"
                f"   run/mv {timings['run_per_mv_s'] * 1e3:9.3f} ms",
                flush=True,
            )
    return results


# --------------------------------------------------------------------------------------
# Main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n", type=int, default=None, help=f"size (default {DEFAULT_N})"
    )
    parser.add_argument(
        "--layers", type=int, default=None, help=f"layers (default {DEFAULT_LAYERS})"
    )
    parser.add_argument(
        "--ks",
        type=lambda s: tuple(int(k) for k in s.split(",")),
        default=None,
        help="comma-separated call-site counts (default "
        + ",".join(map(str, DEFAULT_KS))
        + ")",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=MATERIALISE_BATCH,
        help=f"Materialise batch_size (default {MATERIALISE_BATCH})",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        help="fresh-operator repeats per (variant, k), the median kept "
        f"(default {REPEATS})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"n={QUICK_N}, layers={QUICK_LAYERS}, ks="
        + ",".join(map(str, QUICK_KS))
        + " unless given",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder")
    args = parser.parse_args(argv)
    n_default, layers_default, ks_default = (
        (QUICK_N, QUICK_LAYERS, QUICK_KS)
        if args.quick
        else (DEFAULT_N, DEFAULT_LAYERS, DEFAULT_KS)
    )
    args.n = n_default if args.n is None else args.n
    args.layers = layers_default if args.layers is None else args.layers
    args.ks = tuple(sorted(set(ks_default if args.ks is None else args.ks)))
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    env = _common.environment()
    config = dict(
        n=args.n,
        layers=args.layers,
        ks=list(args.ks),
        dtype="float32",
        materialise_batch_size=args.batch_size,
        repeats=args.repeats,
        closure_convert=False,
        seed=SEED,
        operator_passed_as_jit_argument=True,
    )
    _common.print_setup(env, config)

    check = check_fresh_operator_recompiles()
    print(
        "cache check (Outline, closure_convert=False; runs of the Python function "
        f"during trace / first call): first operator {check['first_operator']}, "
        f"same operator in a new jit {check['same_operator_new_jit']}, "
        f"fresh operator {check['fresh_operator']} -> fresh operator recompiles "
        f"callee: {check['fresh_operator_recompiles_callee']}",
        flush=True,
    )

    results = run_all(args)
    ratio_table = ratios(results)
    elapsed = time.perf_counter() - start

    print()
    print(format_table(results))
    print(format_ratios(ratio_table, args.ks))
    outline = ratio_table["Outline"]["vs_own_first_k"][args.ks[-1]]
    print(
        f"\nOutline compile total at k={args.ks[-1]} / k={args.ks[0]}: {outline:.2f}x "
        f"(target <= 1.5x: {'met' if outline <= 1.5 else 'NOT met'})"
    )
    print(f"total benchmark time: {elapsed:.1f} s")

    payload = dict(
        environment=env,
        config=config,
        cache_check=check,
        results=results,
        ratios=ratio_table,
        outline_target=dict(ratio=outline, threshold=1.5, met=bool(outline <= 1.5)),
        total_seconds=elapsed,
    )
    _common.write_results(
        args.out, "callsites", payload, lambda path: plot(results, config, path)
    )


if __name__ == "__main__":
    main()
