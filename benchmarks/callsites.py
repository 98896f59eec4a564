"""Compile time and run time of an expensive linear operator against its number of
call sites, for plain lineax and for each lineax-dispatch policy.

What is measured
----------------

The operator is a `FunctionLinearOperator` whose function is the dense-layer
chain of `harness` (`L` dense `n x n` float32 layers, weights drawn from
`jax.random` with a fixed seed). It is built with `closure_convert=False`, its
function an `eqx.Partial` holding the weights, so that they are the operator's
arrays whatever jax's closure conversion does (as in `solvers` and `auto`). With
lineax's default `closure_convert=True` they stay the operator's arrays only while
jax keeps captured arrays as constants of the closure-converted jaxpr: with
`jax_use_simplified_jaxpr_constants` on, jax 0.10 inlines them as literals and the
weights (128 MiB at the defaults) are compiled in as HLO constants.

For each number of call sites `k` the program is (`--pattern independent`, the
default)

    f(xs) = op.mv(xs[0]) + op.mv(xs[1]) + ... + op.mv(xs[k - 1])

or (`--pattern dependent`) `x = op.mv(x) * (c_i / |x|)` k times from `xs[0]`,
written as a Python loop, so each `mv` is a separate call site in the traced
program; the operator's arrays are an *argument* of the jitted function and its
static part is closed over (`harness.split_program`). Everything runs under a
plain `jax.jit` (no `lxd.jit`: `benchmarks.program` measures that).

Variants: plain `lineax.FunctionLinearOperator`, and
`lineax_dispatch.FunctionLinearOperator` with `Lazy()`, `Outline()`, `Auto()` and
`Materialise(batch_size=MATERIALISE_BATCH)`. On jax >= 0.11 `Outline` is a call
marked `jax.Inline.XLA_LATE` at each site; on jax 0.10 a host callback.

For each (variant, k), with a freshly built operator (a new function object in
the `eqx.Partial`, hence a new static part, so that neither jax's caches nor
equinox's process-wide cache of `Outline`'s callee carry over), `jax.jit(f)` is
timed as in `harness.time_program`, with at least 3 runs. For `Outline` on jax 0.10
each call is a host callback that hands the operator's arrays (all the weights,
not only the vector) to the callee, so its run time grows with the operator's
size; for
`Materialise` each call of `f` builds the matrix again (XLA merges the k identical
builds into one).

"run per mv" = run / k. Each (variant, k) is measured `--repeats` times (default
3), each time with a fresh operator, and the repeat with the median compile total
is reported (all compile totals are kept in the JSON). Before any of this, each
variant is run once at k=1 with the real weights and discarded (warm-up). Ratios
are reported against the same variant at k=1 and against plain lineax at the
same k.

A quick check at the start shows that a fresh operator makes `Outline`'s callee
compile again (by counting how often the user's Python function runs, with
`closure_convert=False`), while reusing one operator does not.

How to run
----------

    python -m benchmarks.callsites            # n=1024, L=32, k=1,2,4,8,16
    python -m benchmarks.callsites --quick    # n=256, L=8, k=1,2,4
    python -m benchmarks.callsites --n 512 --layers 16 --ks 1,4,16

Results: `callsites.json` and `callsites.png` (`callsites-dependent.*` for the
dependent pattern) in `benchmarks/results/` on jax 0.10, in
`benchmarks/results/jax-<major>.<minor>/` on other versions (`--out DIR`).
"""

import time
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.callsites_report import (
    BASELINE,
    format_ratios,
    format_table,
    plot,
    ratios,
)
from benchmarks.harness import SEED
from lineax_dispatch.policies._outline import outline_runs_here


FULL = dict(n=1024, layers=32, ks=(1, 2, 4, 8, 16))
QUICK = dict(n=256, layers=8, ks=(1, 2, 4))
MATERIALISE_BATCH = 128
REPEATS = 3
MIN_RUNS = 3


# ------------------------------------------------------------------ cases


def make_chain(weights, scales) -> Callable:
    """The chain as an `eqx.Partial` holding the arrays, around a new function
    object each call."""

    def chain(weights, scales, x):
        return harness.apply_chain(weights, scales, x)

    return eqx.Partial(chain, weights, scales)


def variant_builders(batch_size: int) -> dict[str, Callable]:
    """Name -> `(fn, structure) -> operator` (`closure_convert=False`), plain lineax
    first."""

    def ours(policy: lxd.AbstractPolicy) -> Callable:
        return lambda fn, structure: lxd.FunctionLinearOperator(
            fn, structure, (), closure_convert=False, policy=policy
        )

    builders = {
        BASELINE: lambda fn, structure: lx.FunctionLinearOperator(
            fn, structure, (), closure_convert=False
        ),
        "Lazy": ours(lxd.Lazy()),
        "Outline": ours(lxd.Outline()),
        "Auto": ours(lxd.Auto()),
        f"Materialise({batch_size})": ours(lxd.Materialise(batch_size=batch_size)),
    }
    if not outline_runs_here():  # refused on this backend (docs/accelerators.md)
        del builders["Outline"]
    return builders


def make_chain_of_mvs(k: int) -> Callable:
    """`f(op, xs)`: `x = op.mv(x) * (c_i / |x|)` k times from `x = xs[0]`, one call
    site per `i`, each fed the previous one's output (`c_i` a per-site literal)."""

    def chain_of_mvs(op, xs):
        x = xs[0]
        for i in range(k):
            x = op.mv(x)
            x = x * ((1.0 + 0.01 * i) / jnp.sqrt(jnp.vdot(x, x)))
        return x

    return chain_of_mvs


PATTERNS = {"independent": lambda k: make_sum_of_mvs(k), "dependent": make_chain_of_mvs}


def make_sum_of_mvs(k: int) -> Callable:
    """`f(op, xs) = sum_i op.mv(xs[i])`, one call site per `i`."""

    def sum_of_mvs(op, xs):
        total = op.mv(xs[0])
        for i in range(1, k):
            total = total + op.mv(xs[i])
        return total

    return sum_of_mvs


# ------------------------------------------------------------------ measure


def measure(
    build: Callable, weights, scales, k: int, n: int, pattern: str = "independent"
) -> tuple[dict, jax.Array]:
    """Times one (variant, k) with a fresh operator; returns the timings and output."""
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    op = build(make_chain(weights, scales), structure)
    xs = jax.random.normal(jax.random.key(SEED + k), (k, n), jnp.float32)
    program, params, _ = harness.split_program(op, PATTERNS[pattern](k))
    timings, _, out = harness.time_program(program, params, xs, MIN_RUNS)
    runs = timings.pop("runs")
    timings = dict(k=k, **timings, run_per_mv_s=timings["run_s"] / k, runs=runs)
    return timings, out


def measure_repeated(
    build: Callable, weights, scales, k: int, n: int, repeats: int, pattern: str
) -> tuple[dict, jax.Array]:
    """`measure` `repeats` times; the repeat with the median compile total, with
    every repeat's compile total (in increasing order) as `compile_total_all_s`."""
    trials = [measure(build, weights, scales, k, n, pattern) for _ in range(repeats)]
    timings, out = harness.median_trial(trials, "compile_total_s")
    timings["compile_total_all_s"] = sorted(t["compile_total_s"] for t, _ in trials)
    return timings, out


def check_fresh_operator_recompiles(n: int = 16, layers: int = 2) -> dict:
    """Counts runs of the user's Python function (closure_convert=False) under
    `Outline`: a fresh operator should run it once while tracing (shape
    evaluation) and once at the first call (compiling the callee); the same
    operator in a new `jit` should run it zero times (equinox's caches hit)."""
    weights, scales = harness.chain_layers(n, layers, SEED + 1)
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
        # The operator holds a plain Python function (not a valid `jax.jit`
        # argument): close over the (tiny) operator instead.
        trace, first_call = harness.count_runs(
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


def run_all(args) -> dict[str, list[dict]]:
    """The warm-up, then every (variant, k)."""
    builders = variant_builders(args.batch_size)
    weights, scales = harness.chain_layers(args.n, args.layers)
    # One discarded measurement per variant at k=1 with the real weights: the
    # first `Outline` call at a given size pays a one-off ~0.5 s (first touch of
    # the host memory its callback copies the weights into).
    for build in builders.values():
        measure(build, weights, scales, 1, args.n)
    results: dict[str, list[dict]] = {name: [] for name in builders}
    for k in args.ks:
        reference = None
        for name, build in builders.items():
            timings, out = measure_repeated(
                build, weights, scales, k, args.n, args.repeats, args.pattern
            )
            reference = out if reference is None else reference
            timings["rel_err_vs_lineax"] = harness.relative_error(out, reference)
            results[name].append(timings)
            print(
                f"  k={k:<3} {name:<18} compile total "
                f"{timings['compile_total_s']:8.3f} s"
                f"   run/mv {timings['run_per_mv_s'] * 1e3:9.3f} ms",
                flush=True,
            )
    return results


# ------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None):
    """The command line; sizes left out take the defaults (or `--quick`'s)."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--n", type=int, help=f"size (default {FULL['n']})")
    parser.add_argument("--layers", type=int, help=f"layers (default {FULL['layers']})")
    parser.add_argument(
        "--ks",
        type=harness.int_list,
        help=f"comma-separated call-site counts (default {harness.joined(FULL['ks'])})",
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
        "--pattern",
        choices=sorted(PATTERNS),
        default="independent",
        help="independent sites (a sum) or dependent ones (each fed the previous "
        "output); default independent",
    )
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    args.ks = tuple(sorted(set(args.ks)))
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Measure, print the tables, write `callsites.json` and `callsites.png`."""
    args = parse_args(argv)
    start = time.perf_counter()
    env = harness.environment()
    config = dict(
        n=args.n,
        layers=args.layers,
        ks=list(args.ks),
        dtype="float32",
        materialise_batch_size=args.batch_size,
        pattern=args.pattern,
        repeats=args.repeats,
        closure_convert=False,
        seed=SEED,
        operator_passed_as_jit_argument=True,
    )
    harness.print_setup(env, config)

    check = check_fresh_operator_recompiles() if outline_runs_here() else {}
    if check:
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
    outline = ratio_table.get("Outline", {}).get("vs_own_first_k", {})
    outline = outline.get(args.ks[-1], float("nan"))
    print(
        f"\nOutline compile total at k={args.ks[-1]} / k={args.ks[0]}: {outline:.2f}x "
        f"(target <= 1.5x: {harness.met(outline <= 1.5)}; nan: Outline refused here)"
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
    name = "callsites" if args.pattern == "independent" else "callsites-dependent"
    harness.write_results(
        args.out, name, payload, lambda path: plot(results, config, path)
    )


if __name__ == "__main__":
    main()
