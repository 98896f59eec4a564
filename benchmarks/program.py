"""Program-level dispatch: compile and run time of k call sites of an expensive
operator under `lxd.jit` with the `Roll` policy (dependent sites rolled into one
loop body, independent ones stacked into one call) and with `Auto` (deciding from
the traced program) against plain lineax under `jax.jit`, measured in the same
process; a reused `jax.jit` function; and eager `mv`.

What is measured
----------------

The operator is the dense-layer chain of `_operators.py` (`L` layers `n x n`,
float32) as a `FunctionLinearOperator` over an `eqx.Partial` holding the weights
(`closure_convert=False`, so the weights are the operator's arrays). The program
takes the operator and the inputs as arguments (`lxd.jit` reads them as
`equinox.filter_jit` does; plain lineax runs under `equinox.filter_jit`) and is,
for k call sites,

- independent: `sum(op.mv(xs[i]) for i in range(k))`;
- dependent: `x = op.mv(x); x = x * (c_i / |x|)` k times (each call fed the
  previous output, `c_i` a per-site literal).

For each (case, pattern, k, variant) a fresh operator is built (a new function
object, so no cache carries over), and the time of lowering (the trace and, for
`lxd.jit`, the rewrite), compiling and the first call are measured; "compile
total" = lower + compile + (first call - run), "run" the median of further calls,
"run per mv" = run / k. Each is measured `--repeats` times and the repeat with the
median compile total kept. Ratios: against the same variant at k=1 (the targets:
16 sites within 1.15x of 1 site) and against plain lineax at the same k (run per
mv within 1.10x of inline).

Eager `mv`: the second and later calls of `op.mv(v)` outside any trace, for plain
lineax (op-by-op dispatch) and for operators of ours under `Lazy` and `Auto` (one
compiled `mv`, compiled once per operator kind and signature), against a jitted
`mv` (targets: within 1.5x of the jitted `mv`, and 10x faster than lineax at 24
layers n=256).

`OPENBLAS_NUM_THREADS` is set to 1 (unless already set) before jax is imported.

How to run
----------

    .venv/bin/python benchmarks/program.py            # (1024, 32) and (256, 24)
    .venv/bin/python benchmarks/program.py --quick    # (128, 8), k = 1, 4

Results: `benchmarks/results/program.json` and `benchmarks/results/program.png`.
"""

# `_common` first: it sets OPENBLAS_NUM_THREADS before jax is imported.
import _common


# isort: split
import argparse
import statistics
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
from _operators import apply_chain, random_layers
from _plotting import jax_label, openblas_label, pyplot, save

import lineax_dispatch as lxd


def _operator(weights, scales, n: int, policy):
    fn = eqx.Partial(lambda w, s, x: apply_chain(w, s, x), weights, scales)
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    if policy is None:
        return lx.FunctionLinearOperator(fn, structure, closure_convert=False)
    return lxd.FunctionLinearOperator(
        fn, structure, closure_convert=False, policy=policy
    )


def independent(op, xs):
    return sum(op.mv(xs[i]) for i in range(xs.shape[0]))


def dependent(op, xs):
    x = xs[0]
    for i in range(xs.shape[0]):
        x = op.mv(x)
        x = x * ((1.0 + 0.01 * i) / jnp.sqrt(jnp.vdot(x, x)))
    return x


PATTERNS = {"independent": independent, "dependent": dependent}
VARIANTS = {"lineax": None, "lxd.jit + Roll": lxd.Roll(), "lxd.jit + Auto": lxd.Auto()}
OURS = [v for v in VARIANTS if v != "lineax"]


def measure(variant: str, pattern: str, layers, n: int, k: int):
    weights, scales = layers
    policy = VARIANTS[variant]
    op = _operator(weights, scales, n, policy)
    xs = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
    program = PATTERNS[pattern]
    jitted = (eqx.filter_jit if variant == "lineax" else lxd.jit)(program)
    lowered, lower_s = _common.timed(lambda: jitted.lower(op, xs))
    compiled, compile_s = _common.timed(lowered.compile)
    if variant == "lineax":  # equinox's compiled wrapper splits the operator
        call = lambda: compiled(op, xs)  # noqa: E731
    else:  # jax's compiled program of the traced halves of the arguments
        dynamic = eqx.filter(op, eqx.is_array)
        call = lambda: compiled(dynamic, xs)  # noqa: E731
    out, first_s = _common.timed(lambda: jax.block_until_ready(call()))
    runs = [_common.timed(lambda: jax.block_until_ready(call()))[1] for _ in range(5)]
    run_s = statistics.median(runs)
    return dict(
        lower_s=lower_s,
        compile_s=compile_s,
        first_call_s=first_s,
        compile_total_s=lower_s + compile_s + max(first_s - run_s, 0.0),
        run_s=run_s,
        run_per_mv_s=run_s / k,
    ), np.asarray(out)


def eager(layers, n: int, calls: int = 5) -> dict:
    weights, scales = layers
    v = jnp.ones(n, jnp.float32)
    out = {}
    for variant, policy in (
        ("lineax", None),
        ("lxd Lazy", lxd.Lazy()),
        ("lxd Auto", lxd.Auto()),
    ):
        op = _operator(weights, scales, n, policy)
        times = [
            _common.timed(lambda: jax.block_until_ready(op.mv(v)))[1]
            for _ in range(calls)
        ]
        out[variant] = dict(first_s=times[0], later_s=statistics.median(times[1:]))
    jitted = eqx.filter_jit(lambda o, v: o.mv(v))
    op = _operator(weights, scales, n, None)
    jax.block_until_ready(jitted(op, v))
    out["jitted mv"] = dict(
        later_s=statistics.median(
            [
                _common.timed(lambda: jax.block_until_ready(jitted(op, v)))[1]
                for _ in range(5)
            ]
        )
    )
    return out


def nested(ks, repeats: int) -> dict:
    """A `jax.jit` function reused at k sites (JAX's known case:
    `jit(lambda x: sum(i * x for i in range(256)))`), under `jax.jit` and
    `lxd.jit`."""
    rows = {}
    for variant in ("jax.jit", "lxd.jit"):
        for k in ks:
            trials = []
            for _ in range(repeats):
                # A new inner function each time: nothing cached carries over.
                inner = jax.jit(lambda x: sum(i * x for i in range(256)))

                def program(x, inner=inner):
                    return sum(inner(x + j) for j in range(k))

                x = jnp.ones(64, jnp.float32)
                jitted = (jax.jit if variant == "jax.jit" else lxd.jit)(program)
                lowered, lower_s = _common.timed(lambda: jitted.lower(x))
                compiled, compile_s = _common.timed(lowered.compile)
                _, first_s = _common.timed(lambda: jax.block_until_ready(compiled(x)))
                run_s = statistics.median(
                    [
                        _common.timed(lambda: jax.block_until_ready(compiled(x)))[1]
                        for _ in range(5)
                    ]
                )
                total = lower_s + compile_s + max(first_s - run_s, 0.0)
                trials.append((dict(compile_total_s=total, run_s=run_s), None))
            timings, _ = _common.median_trial(trials, "compile_total_s")
            rows[f"{variant} k={k}"] = timings
            print("nested jit", variant, k, timings, flush=True)
        base = rows[f"{variant} k={ks[0]}"]["compile_total_s"]
        for k in ks:
            rows[f"{variant} k={k}"]["compile_vs_k1"] = (
                rows[f"{variant} k={k}"]["compile_total_s"] / base
            )
    return rows


def run(cases, ks, repeats: int) -> dict:
    results = {"nested jit": nested(ks, repeats)}
    for n, depth in cases:
        keys = jax.random.split(jax.random.key(_common.SEED), 2 * depth)
        layers = random_layers(keys, n, depth)
        case = f"{depth} layers, n={n}"
        results[case] = {"eager": eager(layers, n)}
        for pattern in PATTERNS:
            rows = {}
            for variant in VARIANTS:
                for k in ks:
                    trials = [
                        measure(variant, pattern, layers, n, k) for _ in range(repeats)
                    ]
                    timings, out = _common.median_trial(trials, "compile_total_s")
                    timings["all_compile_totals_s"] = [
                        t["compile_total_s"] for t, _ in trials
                    ]
                    rows[f"{variant} k={k}"] = timings
                    rows[f"{variant} k={k}"]["out"] = out
                    print(
                        case,
                        pattern,
                        variant,
                        k,
                        {
                            a: round(b, 4)
                            for a, b in timings.items()
                            if isinstance(b, float)
                        },
                        flush=True,
                    )
            for k in ks:
                theirs = rows[f"lineax k={k}"]
                reference = theirs.pop("out")
                for variant in OURS:
                    ours = rows[f"{variant} k={k}"]
                    ours["max_abs_difference_vs_lineax"] = float(
                        np.max(np.abs(ours.pop("out") - reference))
                    )
                    ours["compile_vs_lineax"] = (
                        ours["compile_total_s"] / theirs["compile_total_s"]
                    )
                    ours["run_per_mv_vs_lineax"] = (
                        ours["run_per_mv_s"] / theirs["run_per_mv_s"]
                    )
                for variant in VARIANTS:
                    row = rows[f"{variant} k={k}"]
                    base = rows[f"{variant} k={ks[0]}"]["compile_total_s"]
                    row["compile_vs_k1"] = row["compile_total_s"] / base
            results[case][pattern] = rows
    return results


def report(results: dict, ks) -> None:
    print("\nnested jit (a jitted 256-term function at k sites)")
    for name, row in results["nested jit"].items():
        print(
            f"    {name:22s} compile {row['compile_total_s']:.3f} s ({row['compile_vs_k1']:.2f}x k=1)"
        )
    for case, by_pattern in results.items():
        if case == "nested jit":
            continue
        print(f"\n{case}")
        e = by_pattern["eager"]
        jitted = e["jitted mv"]["later_s"]
        print(
            f"  eager mv (later calls): lineax {1e3 * e['lineax']['later_s']:.2f} ms; "
            + "; ".join(
                f"{v} {1e3 * e[v]['later_s']:.2f} ms ({e[v]['later_s'] / jitted:.2f}x "
                f"jitted, {e['lineax']['later_s'] / e[v]['later_s']:.1f}x faster than "
                "lineax)"
                for v in ("lxd Lazy", "lxd Auto")
            )
            + f"; jitted mv {1e3 * jitted:.2f} ms"
        )
        for pattern in PATTERNS:
            print(f"  {pattern}:")
            for name, row in by_pattern[pattern].items():
                extra = ""
                if "compile_vs_lineax" in row:
                    extra = (
                        f"  vs lineax: compile {row['compile_vs_lineax']:.2f}x, run/mv "
                        f"{row['run_per_mv_vs_lineax']:.2f}x"
                    )
                print(
                    f"    {name:22s} compile {row['compile_total_s']:.3f} s "
                    f"({row['compile_vs_k1']:.2f}x k=1)  run/mv "
                    f"{1e3 * row['run_per_mv_s']:.3f} ms{extra}"
                )


def plot(results: dict, ks, path: Path) -> None:
    plt = pyplot()
    cases = [c for c in results if c != "nested jit"]
    fig, axes = plt.subplots(
        1, len(cases), figsize=(5.5 * len(cases), 4), squeeze=False
    )
    for ax, case in zip(axes[0], cases):
        for pattern, style in (("independent", "-"), ("dependent", "--")):
            for variant in VARIANTS:
                rows = results[case][pattern]
                ax.plot(
                    ks,
                    [rows[f"{variant} k={k}"]["compile_total_s"] for k in ks],
                    style,
                    marker="o",
                    label=f"{variant}, {pattern}",
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("call sites k")
        ax.set_ylabel("compile total (s)")
        ax.set_title(case)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"program-level dispatch; {jax_label()}, {openblas_label()}", fontsize=9
    )
    save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=_common.RESULTS_DIR)
    args = parser.parse_args()
    if args.quick:
        cases, ks, repeats = [(128, 8)], [1, 4], 1
    else:
        cases, ks, repeats = [(1024, 32), (256, 24)], [1, 16], args.repeats
    env = _common.environment(load_average=True)
    results = run(cases, ks, repeats)
    report(results, ks)
    payload = dict(
        environment=env, cases=[list(c) for c in cases], ks=ks, results=results
    )
    _common.write_results(args.out, "program", payload, lambda p: plot(results, ks, p))


if __name__ == "__main__":
    main()
