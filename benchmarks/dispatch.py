"""What calling a compiled program costs from Python: `lxd.jit` against `jax.jit`
and `equinox.filter_jit`, on programs that run in microseconds, so that the call
itself is what is timed.

What is measured
----------------

Each program is compiled once and called `CALLS / 10` times (not timed); then, in interleaved
rounds (every round calls each variant, every other round in reverse order),
`CALLS` calls of each, each waited for (`jax.block_until_ready`); a variant's
figure is the median over rounds of its median call. The programs:

    vector      `x -> 2 x` on a vector of `n` numbers
    operator    `(op, x) -> op.mv(x)`, the operator (a `FunctionLinearOperator`
                over `equinox.Partial(fn, matrix)`, `n` x `n`) an argument;
                for `jax.jit`, which takes arrays only, its arrays are the
                argument and the rest is closed over (`harness.split_program`)
    closed      `x -> op.mv(x)`, the operator closed over

and the variants: `jax.jit` of plain lineax (the reference), `jax.jit` of ours
(`Lazy`, the default), `equinox.filter_jit` of plain lineax, `lxd.jit` of ours
(`Auto`) and `lxd.jit` of plain lineax. Ratios are against the reference.
Results: `benchmarks/results/dispatch.json` and `.png`.

Run: `python -m benchmarks.dispatch [--quick] [--n 8] [--rounds 9] [--out DIR]`.
"""

from statistics import median

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness


FULL = dict(n=8, rounds=9)
QUICK = dict(rounds=3)
CALLS = 500
REFERENCE = "jax.jit + lineax"
# The variants: (compiler, operator module, policy for ours).
VARIANTS = {
    REFERENCE: (jax.jit, lx, None),
    "jax.jit + ours (Lazy)": (jax.jit, lxd, lxd.Lazy),
    "eqx.filter_jit + lineax": (eqx.filter_jit, lx, None),
    "lxd.jit + ours (Auto)": (lxd.jit, lxd, lxd.Auto),
    "lxd.jit + lineax": (lxd.jit, lx, None),
}
PROGRAMS = ("vector", "operator", "closed")


def _apply(matrix, x):
    return matrix @ x


def program(name: str, variant: str, n: int) -> tuple:
    """`(compiled function, arguments)` of program `name` under `variant`."""
    compiler, module, policy = VARIANTS[variant]
    key = jax.random.key(harness.SEED)
    matrix = jax.random.normal(key, (n, n), jnp.float32) / n
    x = jnp.ones(n, jnp.float32)
    if name == "vector":
        return compiler(lambda x: 2 * x), (x,)
    kwargs = {} if policy is None else dict(policy=policy())
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    op = module.FunctionLinearOperator(
        eqx.Partial(_apply, matrix), structure, closure_convert=False, **kwargs
    )
    if name == "operator" and compiler is jax.jit:
        # `jax.jit` takes arrays only: the operator's arrays as the argument, the
        # rest closed over (as `equinox.filter_jit` splits it).
        f, params, _ = harness.split_program(op, lambda op, x: op.mv(x))
        return compiler(f), (params, x)
    if name == "operator":
        return compiler(lambda op, x: op.mv(x)), (op, x)
    return compiler(lambda x: op.mv(x)), (x,)


def measure(name: str, n: int, rounds: int) -> dict:
    """Every variant of program `name`, interleaved over `rounds`: microseconds
    per call and the ratio to the reference."""
    made = {v: program(name, v, n) for v in VARIANTS}
    for f, args in made.values():  # compile, then warm up (not timed)
        harness.call_times(lambda: f(*args), CALLS // 10)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    for round_ in range(rounds):
        for v in order[:: -1 if round_ % 2 else 1]:
            f, args = made[v]
            samples[v].append(harness.median_call_time(lambda: f(*args), CALLS))
    row: dict = dict(program=name, n=n)
    reference = median(samples[REFERENCE])
    for v, got in samples.items():
        us = median(got) * 1e6
        row[v] = dict(us=us, over_reference=median(got) / reference, rounds_us=got)
        print(f"  {name:<9} {v:<26} {us:8.1f} us  ({row[v]['over_reference']:.2f}x)")
    return row


def plot(rows: list[dict], path) -> None:
    """Microseconds per call, per program and variant."""
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(VARIANTS)
    for i, v in enumerate(VARIANTS):
        xs = [j + (i - (len(VARIANTS) - 1) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [r[v]["us"] for r in rows], width, label=v)
    ax.set_xticks(range(len(rows)), [r["program"] for r in rows])
    ax.set_ylabel("microseconds per call (median)")
    ax.set_title(f"calling a compiled program from Python ({harness.jax_label()})")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    harness.save(fig, path)


def main(argv=None):
    """Measure each program, print the figures, write `dispatch.json`/`.png`."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--n", type=int, help="vector size (default 8)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 9)")
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    env = harness.environment(load_average=True)
    config = dict(n=args.n, rounds=args.rounds, calls=CALLS, reference=REFERENCE)
    harness.print_setup(env, config)
    rows = [measure(name, args.n, args.rounds) for name in PROGRAMS]
    summary = {
        r["program"]: {v: round(r[v]["over_reference"], 3) for v in VARIANTS}
        for r in rows
    }
    print("per call, over the reference:", summary)
    payload = dict(environment=env, config=config, rows=rows, summary=summary)
    harness.write_results(args.out, "dispatch", payload, lambda p: plot(rows, p))


if __name__ == "__main__":
    main()
