"""Compile time and run time of an expensive linear operator against its number of
call sites, for plain lineax and for each lineax-dispatch policy.

What is measured
----------------

The operator is a `FunctionLinearOperator` whose function is a chain of `L` dense
`n x n` layers, `x -> s_L * (W_L @ (... s_1 * (W_1 @ x)))`, float32, weights drawn
from `jax.random` with a fixed seed (`s_i` is a per-layer elementwise scale, so
that XLA sees `L` separate matmuls). It is built with lineax's default
`closure_convert=True`.

For each number of call sites `k` the program is

    f(xs) = op.mv(xs[0]) + op.mv(xs[1]) + ... + op.mv(xs[k - 1])

written as a Python loop, so each `mv` is a separate call site in the traced
program. The operator's arrays (the weights) are an *argument* of the jitted function
and its static part (the closure-converted jaxpr, the policy) is closed over,
as `equinox.filter_jit` would split it: closing over the whole operator would
embed the weights (128 MiB at the defaults) as literal constants in the HLO and
measure the serialisation of those, not the compiler.

Variants: plain `lineax.FunctionLinearOperator`, and
`lineax_dispatch.FunctionLinearOperator` with `Lazy()`, `Outline()` and
`Materialise(batch_size=MATERIALISE_BATCH)`.

For each (variant, k), in this process, with a freshly built operator (a new
function object, hence a new closure-converted jaxpr, so that neither jax's
caches nor equinox's process-wide cache of `Outline`'s callee carry over):

- trace: `jax.jit(f).trace(params, xs)` (`params`: the operator's arrays);
- lower: `traced.lower()`;
- compile: `lowered.compile()`;
- first call: the first execution of the compiled object. For `Outline` this
  includes compiling the outlined callee; for dot-heavy code XLA:CPU defers part
  of its compile work to the first execution;
- run: the median of several further executions (`block_until_ready`). For
  `Outline` each call is a host callback that hands the operator's arrays (all
  the weights, not only the vector) to the callee, so its run time grows with
  the operator's size; for `Materialise` each call of `f` builds the matrix
  again (XLA merges the k identical builds into one).

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
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import lineax as lx  # noqa: E402

import lineax_dispatch as lxd  # noqa: E402


SEED = 0
DEFAULT_N = 1024
DEFAULT_LAYERS = 32
DEFAULT_KS = (1, 2, 4, 8, 16)
QUICK_N = 256
QUICK_LAYERS = 8
QUICK_KS = (1, 2, 4)
MATERIALISE_BATCH = 128
REPEATS = 3
# Steady-state timing: at least MIN_RUNS calls, more while under RUN_BUDGET_S.
MIN_RUNS = 3
MAX_RUNS = 25
RUN_BUDGET_S = 1.0
RESULTS_DIR = Path(__file__).resolve().parent / "results"
BASELINE = "lineax"


# --------------------------------------------------------------------------------------
# The operator


def make_weights(n: int, layers: int, seed: int = SEED):
    """Weights `W_i ~ N(0, 1/n)` and per-layer scales `s_i ~ U(0.5, 1.5)`, float32."""
    keys = jax.random.split(jax.random.key(seed), 2 * layers)
    weights = tuple(
        jax.random.normal(keys[i], (n, n), jnp.float32) / jnp.sqrt(n)
        for i in range(layers)
    )
    scales = tuple(
        jax.random.uniform(keys[layers + i], (n,), jnp.float32, 0.5, 1.5)
        for i in range(layers)
    )
    return jax.block_until_ready((weights, scales))


def make_chain(weights, scales) -> Callable:
    """A new function object `x -> s_L * (W_L @ ... s_1 * (W_1 @ x))` each call."""

    def chain(x):
        for w, s in zip(weights, scales):
            x = s * (w @ x)
        return x

    return chain


def _lineax_builder(fn, structure, closure_convert=True):
    return lx.FunctionLinearOperator(fn, structure, (), closure_convert)


def _dispatch_builder(policy: lxd.AbstractPolicy) -> Callable:
    def build(fn, structure, closure_convert=True):
        return lxd.FunctionLinearOperator(
            fn, structure, (), closure_convert, policy=policy
        )

    return build


def variant_builders(batch_size: int) -> dict[str, Callable]:
    """Name -> `(fn, structure, closure_convert=True) -> operator`, plain lineax
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
    (the weights) are a jit argument and its static part (the closure-converted
    jaxpr, the policy) is closed over, the split `equinox.filter_jit` makes."""
    params, static = eqx.partition(op, eqx.is_array)
    sum_of_mvs = make_sum_of_mvs(k)

    def f(params, xs):
        return sum_of_mvs(eqx.combine(params, static), xs)

    return f, params


# --------------------------------------------------------------------------------------
# Timing


def _timed(thunk: Callable):
    start = time.perf_counter()
    out = thunk()
    return out, time.perf_counter() - start


def steady_run_time(compiled, args, first_call_s: float) -> tuple[float, int]:
    """Median wall time of further calls; as many as fit RUN_BUDGET_S, within
    [MIN_RUNS, MAX_RUNS]."""
    estimate = max(first_call_s, 1e-6)
    _, warm = _timed(lambda: jax.block_until_ready(compiled(*args)))
    estimate = min(estimate, max(warm, 1e-6))
    runs = int(min(MAX_RUNS, max(MIN_RUNS, RUN_BUDGET_S // estimate)))
    times = [warm]
    for _ in range(runs - 1):
        times.append(_timed(lambda: jax.block_until_ready(compiled(*args)))[1])
    return statistics.median(times), runs


def measure(build: Callable, weights, scales, k: int, n: int) -> tuple[dict, jax.Array]:
    """Times one (variant, k) with a fresh operator; returns the timings and output."""
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    op = build(make_chain(weights, scales), structure)
    xs = jax.random.normal(jax.random.key(SEED + k), (k, n), jnp.float32)
    program, params = make_program(op, k)
    f = jax.jit(program)
    traced, trace_s = _timed(lambda: f.trace(params, xs))
    lowered, lower_s = _timed(traced.lower)
    compiled, compile_s = _timed(lowered.compile)
    out, first_s = _timed(lambda: jax.block_until_ready(compiled(params, xs)))
    run_s, runs = steady_run_time(compiled, (params, xs), first_s)
    first_extra_s = max(first_s - run_s, 0.0)
    timings = dict(
        k=k,
        trace_s=trace_s,
        lower_s=lower_s,
        compile_s=compile_s,
        first_call_s=first_s,
        first_call_extra_s=first_extra_s,
        compile_total_s=trace_s + lower_s + compile_s + first_extra_s,
        run_s=run_s,
        run_per_mv_s=run_s / k,
        runs=runs,
    )
    return timings, out


def measure_repeated(
    build: Callable, weights, scales, k: int, n: int, repeats: int
) -> tuple[dict, jax.Array]:
    """`measure` `repeats` times; the repeat with the median compile total, with
    every repeat's compile total added as `compile_total_all_s`."""
    trials = [measure(build, weights, scales, k, n) for _ in range(repeats)]
    trials.sort(key=lambda trial: trial[0]["compile_total_s"])
    timings, out = trials[(len(trials) - 1) // 2]
    timings["compile_total_all_s"] = [t["compile_total_s"] for t, _ in trials]
    return timings, out


def relative_error(out: jax.Array, reference: jax.Array) -> float:
    return float(jnp.linalg.norm(out - reference) / jnp.linalg.norm(reference))


# --------------------------------------------------------------------------------------
# The cache check


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

    def count_runs(op) -> dict:
        # closure_convert=False keeps a Python function in the operator, which is
        # not a valid `jax.jit` argument: close over the (tiny) operator instead.
        f = jax.jit(lambda xs: make_sum_of_mvs(2)(op, xs))
        before = counter[0]
        traced = f.trace(xs)
        after_trace = counter[0]
        jax.block_until_ready(traced.lower().compile()(xs))
        return dict(trace=after_trace - before, first_call=counter[0] - after_trace)

    op = fresh_operator()
    result = dict(
        first_operator=count_runs(op),
        same_operator_new_jit=count_runs(op),
        fresh_operator=count_runs(fresh_operator()),
    )
    result["fresh_operator_recompiles_callee"] = (
        result["fresh_operator"]["first_call"] >= 1
        and result["same_operator_new_jit"]["first_call"] == 0
    )
    return result


# --------------------------------------------------------------------------------------
# Reporting


def environment() -> dict:
    return dict(
        python=sys.version.split()[0],
        jax=jax.__version__,
        jaxlib=jaxlib.__version__,
        lineax=lx.__version__ if hasattr(lx, "__version__") else "?",
        equinox=eqx.__version__ if hasattr(eqx, "__version__") else "?",
        lineax_dispatch=lxd.__version__,
        platform=platform.platform(),
        machine=platform.machine(),
        cpu_count=os.cpu_count(),
        jax_backend=jax.default_backend(),
        jax_devices=[str(d) for d in jax.devices()],
        OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS"),
    )


def ratios(results: dict[str, list[dict]]) -> dict:
    """Compile total over the same variant at the smallest k, and over plain
    lineax at the same k."""
    base = {r["k"]: r["compile_total_s"] for r in results[BASELINE]}
    out = {}
    for name, rows in results.items():
        first = rows[0]["compile_total_s"]
        out[name] = {
            "vs_own_first_k": {r["k"]: r["compile_total_s"] / first for r in rows},
            "vs_lineax_same_k": {
                r["k"]: r["compile_total_s"] / base[r["k"]] for r in rows
            },
        }
    return out


def format_table(results: dict[str, list[dict]]) -> str:
    header = (
        f"{'variant':<18}{'k':>3}{'trace':>9}{'lower':>9}{'compile':>9}"
        f"{'1st-extra':>11}{'comp.total':>12}{'run/mv':>12}{'runs':>6}{'rel.err':>10}"
    )
    lines = [header, "-" * len(header)]
    for name, rows in results.items():
        for r in rows:
            lines.append(
                f"{name:<18}{r['k']:>3}{r['trace_s']:>8.3f}s{r['lower_s']:>8.3f}s"
                f"{r['compile_s']:>8.3f}s{r['first_call_extra_s']:>10.3f}s"
                f"{r['compile_total_s']:>11.3f}s{r['run_per_mv_s'] * 1e3:>9.3f} ms"
                f"{r['runs']:>6}{r['rel_err_vs_lineax']:>10.1e}"
            )
    return "\n".join(lines)


def format_ratios(table: dict, ks: Sequence[int]) -> str:
    header = f"{'variant':<18}" + "".join(f"{'k=' + str(k):>9}" for k in ks)
    lines = []
    for title, key in (
        (f"compile total / same variant at k={ks[0]}", "vs_own_first_k"),
        ("compile total / plain lineax at the same k", "vs_lineax_same_k"),
    ):
        lines += ["", title, header]
        for name, r in table.items():
            lines.append(f"{name:<18}" + "".join(f"{r[key][k]:>8.2f}x" for k in ks))
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], config: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, rows in results.items():
        ks = [r["k"] for r in rows]
        left.plot(ks, [r["compile_total_s"] for r in rows], "o-", label=name)
        right.plot(ks, [r["run_per_mv_s"] * 1e3 for r in rows], "o-", label=name)
    for ax, title, ylabel in (
        (left, "compile total (trace+lower+compile+first-call extra)", "seconds"),
        (right, "steady run time per mv", "milliseconds"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("independent call sites k")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    left.legend(fontsize=8)
    fig.suptitle(
        f"{config['layers']}-layer n={config['n']} float32 FunctionLinearOperator, "
        f"jax {jax.__version__} {jax.default_backend()}, "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    env = environment()
    config = dict(
        n=args.n,
        layers=args.layers,
        ks=list(args.ks),
        dtype="float32",
        materialise_batch_size=args.batch_size,
        repeats=args.repeats,
        closure_convert=True,
        seed=SEED,
        operator_passed_as_jit_argument=True,
    )
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    print("config: " + ", ".join(f"{k}={v}" for k, v in config.items()))

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

    args.out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out / "callsites.json", args.out / "callsites.png"
    payload = dict(
        environment=env,
        config=config,
        cache_check=check,
        results=results,
        ratios=ratio_table,
        outline_target=dict(
            ratio=outline, threshold=1.5, met=bool(outline <= 1.5)
        ),
        total_seconds=elapsed,
    )
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    plot(results, config, png_path)
    print(f"wrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
