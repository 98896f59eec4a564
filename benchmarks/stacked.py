"""Independent call sites at small k: the run time per program call of k
independent sites of an expensive operator under `lxd.jit` (`Roll`, and `Auto`)
against the same sites inline (lineax's program, our operator under `Lazy`),
measured in the same process, with plain-JAX references: the chain `vmap`ped over
the k inputs (a stack) and a `lax.fori_loop` over them (a roll).

What is measured
----------------

The operator is the dense-layer chain of `harness` (`L` layers `n x n`, float32),
built as `benchmarks.program` builds it; the program is
`sum(op.mv(xs[i]) for i in range(k))` with the operator and the inputs as
arguments (under `equinox.filter_jit` for the inline program). `--rolled` also
measures `Roll` with stacking switched off (every group rolled into one loop),
to compare the two rewrites at the same k. Per variant and k: the median of
`--calls` calls after a warm-up (target: stacked sites within 1.10x of inline
at k = 2, 4, 8 and 16).

How to run
----------

    python -m benchmarks.stacked              # n=256, 24 layers, k = 2, 4, 8, 16
    python -m benchmarks.stacked --quick      # n=64, 4 layers, k = 2, 4

Results: `benchmarks/results/stacked.json` and `.png`.
"""

import statistics
import time
from unittest import mock

import equinox as eqx
import jax
import jax.numpy as jnp

import lineax_dispatch as lxd
from lineax_dispatch.program.rewrite import _rules

from . import harness, program


FULL = dict(n=256, layers=24, ks=[2, 4, 8, 16], calls=200)
QUICK = dict(n=64, layers=4, ks=[2, 4], calls=20)


def _time(f, *args, calls: int) -> float:
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(n: int, layers: int, ks, calls: int, rolled: bool) -> dict:
    weights, scales = harness.chain_layers(n, layers)
    chain = lambda ws, x: harness.apply_chain(ws, scales, x)
    ws = list(weights)
    out: dict = {}
    for k in ks:
        xs = jax.random.normal(jax.random.key(k), (k, n), jnp.float32)
        row: dict = {}
        ours = [
            ("inline", lxd.Lazy(), eqx.filter_jit),
            ("Roll", lxd.Roll(), lxd.jit),
            ("Auto", lxd.Auto(), lxd.jit),
        ]
        for name, policy, jit in ours:
            op = program._operator(weights, scales, n, policy)
            row[name] = _time(jit(program.independent), op, xs, calls=calls)
        if rolled:
            with mock.patch.object(_rules, "plan_stack", lambda *a: None):
                op = program._operator(weights, scales, n, lxd.Roll())
                f = lxd.jit(program.independent)
                row["Roll, rolled"] = _time(f, op, xs, calls=calls)
        jax_vmap = jax.jit(
            lambda ws, xs: jnp.sum(jax.vmap(chain, (None, 0))(ws, xs), 0)
        )
        jax_fori = jax.jit(
            lambda ws, xs: jax.lax.fori_loop(
                0, xs.shape[0], lambda i, acc: acc + chain(ws, xs[i]), jnp.zeros(n)
            )
        )
        jax_inline = jax.jit(lambda ws, xs: sum(chain(ws, xs[i]) for i in range(k)))
        row["jax inline"] = _time(jax_inline, ws, xs, calls=calls)
        row["jax vmap"] = _time(jax_vmap, ws, xs, calls=calls)
        row["jax fori"] = _time(jax_fori, ws, xs, calls=calls)
        ratios = {
            name: t
            / (row["inline"] if not name.startswith("jax") else row["jax inline"])
            for name, t in row.items()
        }
        out[f"k={k}"] = dict(run_s=row, ratio_vs_inline=ratios)
        print(
            k,
            {
                name: f"{1e3 * t:.3f} ms ({ratios[name]:.2f}x)"
                for name, t in row.items()
            },
            flush=True,
        )
    return out


def plot(results: dict, ks, path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [n for n in results[f"k={ks[0]}"]["ratio_vs_inline"] if "inline" not in n]
    for name in names:
        ax.plot(
            ks,
            [results[f"k={k}"]["ratio_vs_inline"][name] for k in ks],
            marker="o",
            label=name,
        )
    ax.axhline(1.10, color="grey", linestyle=":", label="target 1.10x")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("independent sites k")
    ax.set_ylabel("run per call / inline's")
    ax.legend(fontsize=8)
    fig.suptitle(f"stacked sites; {harness.jax_label(openblas=True)}", fontsize=9)
    harness.save(fig, path)


def main(argv=None) -> None:
    """Measure, print, write `stacked.json` and `.png`."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--rolled", action="store_true", help="also Roll unstacked")
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    env = harness.environment(load_average=True)
    results = measure(s["n"], s["layers"], s["ks"], s["calls"], args.rolled)
    payload = dict(environment=env, settings=s, results=results)
    harness.write_results(
        args.out, "stacked", payload, lambda p: plot(results, s["ks"], p)
    )


if __name__ == "__main__":
    main()
