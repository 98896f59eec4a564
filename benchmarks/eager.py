"""Eager `mv`: each of the first calls of `op.mv(v)` outside any trace, for
operators of ours (`Lazy`, `Auto`, `Roll`) and plain lineax, against a jitted `mv`
(`equinox.filter_jit(lambda op, v: op.mv(v))`) at the same call, measured in the
same process.

What is measured
----------------

The operator is the dense-layer chain of `harness` (`L` layers `n x n`,
float32) as a `FunctionLinearOperator` over an `eqx.Partial` holding the weights,
built as `benchmarks.program` builds it. In each of `--repeats` rounds every
variant is built afresh (a new function object: nothing cached carries over) and
called `--calls` times in a row, as a user's eager code calls it; the first call
includes the compile. Per call index the median over the rounds is kept, and its
ratio to the jitted `mv`'s at the same index (the target: within 1.5x of the
jitted `mv` from the second call on). Then `--rounds` further calls of each
variant, interleaved (each round calls every variant once, so that a slow spell
of the machine falls on all of them): the steady state. Plain lineax is lineax
built with `closure_convert=False` (as ours) and with its default (whose eager
`mv` evaluates the closure-converted function's jaxpr one operation at a time).

How to run
----------

    python -m benchmarks.eager            # (256, 24), (1024, 32), (64, 4)
    python -m benchmarks.eager --quick    # (64, 4)

Results: `benchmarks/results/eager.json` and `benchmarks/results/eager.png`.
"""

import statistics

import equinox as eqx
import jax.numpy as jnp

import lineax_dispatch as lxd

from . import harness
from .program import _operator


FULL = dict(cases=[(256, 24), (1024, 32), (64, 4)], repeats=7, calls=10, rounds=21)
QUICK = dict(cases=[(64, 4)], repeats=2, calls=5, rounds=5)

JITTED = "jitted mv"
VARIANTS = {
    "lineax": (None, False),
    "lineax default": (None, True),
    "lxd Lazy": (lxd.Lazy(), False),
    "lxd Auto": (lxd.Auto(), False),
    "lxd Roll": (lxd.Roll(), False),
}


def _calls(layers, n: int) -> dict:
    """A fresh call of each variant and of the jitted `mv`."""
    weights, scales = layers
    v = jnp.ones(n, jnp.float32)
    calls = {}
    for variant, (policy, convert) in VARIANTS.items():
        op = _operator(weights, scales, n, policy, convert)
        calls[variant] = lambda op=op: op.mv(v)
    jitted = eqx.filter_jit(lambda o, v: o.mv(v))
    op = _operator(weights, scales, n, None)
    calls[JITTED] = lambda: jitted(op, v)
    return calls


def measure(layers, n: int, repeats: int, calls: int, rounds: int) -> dict:
    """Per variant: the median time of each of the first `calls` calls over
    `repeats` fresh builds, each call's ratio to the jitted `mv`'s, and the steady
    state over `rounds` interleaved calls."""
    first: dict = {}
    for _ in range(repeats):
        for variant, call in _calls(layers, n).items():
            first.setdefault(variant, []).append(harness.call_times(call, calls))
    out: dict = {}
    for variant, runs in first.items():
        out[variant] = dict(
            calls_s=[statistics.median(r[i] for r in runs) for i in range(calls)]
        )
    live = _calls(layers, n)
    for call in live.values():
        harness.call_times(call, 2)
    later: dict = {variant: [] for variant in live}
    for _ in range(rounds):
        for variant, call in live.items():
            later[variant] += harness.call_times(call, 1)
    jitted = out[JITTED]
    jitted["steady_s"] = statistics.median(later[JITTED])
    for variant, row in out.items():
        row["steady_s"] = statistics.median(later[variant])
        row["ratio_vs_jitted"] = [
            t / j for t, j in zip(row["calls_s"], jitted["calls_s"])
        ]
        row["worst_ratio_from_call_2"] = max(row["ratio_vs_jitted"][1:])
        row["steady_ratio_vs_jitted"] = row["steady_s"] / jitted["steady_s"]
    return out


def report(results: dict) -> None:
    for case, rows in results.items():
        print(f"\n{case}")
        headers = [
            "variant",
            "call 1 (ms)",
            "calls 2.. (ms)",
            "x jitted",
            "worst",
            "steady",
        ]
        table = [
            [
                variant,
                f"{1e3 * row['calls_s'][0]:.1f}",
                " ".join(f"{1e3 * t:.2f}" for t in row["calls_s"][1:]),
                " ".join(f"{r:.2f}" for r in row["ratio_vs_jitted"][1:]),
                f"{row['worst_ratio_from_call_2']:.2f}",
                f"{1e3 * row['steady_s']:.3f} ms ({row['steady_ratio_vs_jitted']:.2f}x)",
            ]
            for variant, row in rows.items()
        ]
        print(harness.table(headers, table))


def plot(results: dict, path) -> None:
    plt = harness.pyplot()
    fig, axes = plt.subplots(
        1, len(results), figsize=(5.5 * len(results), 4), squeeze=False
    )
    for ax, (case, rows) in zip(axes[0], results.items()):
        for variant, row in rows.items():
            if variant.startswith("lineax"):
                continue
            calls = range(2, len(row["calls_s"]) + 1)
            ax.plot(list(calls), row["ratio_vs_jitted"][1:], marker="o", label=variant)
        ax.axhline(1.5, color="grey", linestyle=":", label="target 1.5x")
        ax.set_xlabel("call")
        ax.set_ylabel("time / jitted mv's at the same call")
        ax.set_title(case)
        ax.legend(fontsize=8)
    fig.suptitle(f"eager mv; {harness.jax_label(openblas=True)}", fontsize=9)
    harness.save(fig, path)


def main(argv=None) -> None:
    """Measure, print the report, write `eager.json` and `eager.png`."""
    parser = harness.parser(__doc__, FULL, QUICK)
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    env = harness.environment(load_average=True)
    results = {}
    for n, depth in settings["cases"]:
        case = f"{depth} layers, n={n}"
        results[case] = measure(
            harness.chain_layers(n, depth),
            n,
            settings["repeats"],
            settings["calls"],
            settings["rounds"],
        )
    report(results)
    payload = dict(environment=env, settings=settings, results=results)
    harness.write_results(args.out, "eager", payload, lambda p: plot(results, p))


if __name__ == "__main__":
    main()
