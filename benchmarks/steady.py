"""Repeated cheap solves at steady state: the run time of one jitted CG solve of a
cheap operator, our `lxd.CG` against lineax's `lx.CG`, both under `jax.jit` and
measured in the same process, interleaved call by call, with each program's first
call (trace, compile and one run).

What is measured
----------------

Operators a PDE or least-squares user solves many times (float32, SPD, tagged
positive semidefinite), each `(shape, n)`:

- `stencil2d`: the 2-D five-point Laplacian plus a shift, on an `s x s` grid
    (`jnp.pad` and four slices);
- `stencil1d`: the 1-D three-point Laplacian plus a shift (two `jnp.roll`s);
- `dense`: a dense `n x n` SPD matrix applied by `A @ x`.

Each solve is `CG(rtol=1e-5, atol=1e-5)` from zero on a fixed random right-hand
side; ours carries `policy=lxd.Lazy()` so that both programs apply the same `mv`
inline. Ours runs in two layouts: `lxd.CG`'s default (`layout="auto"`, which
decides for `Auto`'s default of 100 runs: the layout it took is reported) and
`layout="inline"` (`mv` where lineax's CG writes it: what `"auto"` takes for a
solve run often enough), the latter also under `lxd.jit` (its call from Python
included). Each side is compiled three times apart (two copies of one program
ran 2-5% apart on the dense cells: each executable holds the operator's matrix as
a constant of its own). Reported per case: the steps each took (equal but for
rounding), the median over 101 rounds of each side's time (a round calls every
copy once, in a shuffled order of its own: a call's time depends on the call
before it; a side's time in a round is the median of its copies'), the median
over the rounds of each of ours' ratio to lineax (target for repeated solves: at
most 1.05x), and the median first call of 5 fresh programs of each.

How to run
----------

    python -m benchmarks.steady           # every case, 101 rounds, 3 copies
    python -m benchmarks.steady --quick   # n <= 1024, 11 rounds, 1 copy
    python -m benchmarks.steady --max-n 16384 --calls 21 --rounds 2 --copies 1

Results: `benchmarks/results/steady.json` and `.png`.
"""

import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

import lineax_dispatch as lxd

from . import harness


FULL = dict(calls=101, rounds=5, max_n=16384, copies=3)
QUICK = dict(calls=11, rounds=1, max_n=1024, copies=1)
CASES = (
    ("stencil2d", 1024),
    ("stencil2d", 4096),
    ("stencil2d", 16384),
    ("stencil1d", 1024),
    ("stencil1d", 4096),
    ("dense", 64),
    ("dense", 1024),
)
SIDES = ("lineax", "ours", "ours inline", "ours inline, lxd.jit")
TARGET = 1.05


def operator_function(shape: str, n: int) -> Callable:
    """The `mv` of case `(shape, n)` (a new function object at each call)."""
    if shape == "stencil2d":
        s = int(round(n**0.5))

        def stencil2d(x):
            g = x.reshape(s, s)
            p = jnp.pad(g, 1)
            near = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:]
            return (4.05 * g - near).reshape(-1)

        return stencil2d
    if shape == "stencil1d":
        return lambda x: 2.05 * x - jnp.roll(x, 1) - jnp.roll(x, -1)
    rng = np.random.default_rng(harness.SEED)
    m = rng.standard_normal((n, n)) / np.sqrt(n)
    matrix = jnp.asarray(m @ m.T + np.eye(n), jnp.float32)
    return lambda x: matrix @ x


def program(shape: str, n: int, side: str) -> Callable:
    """The jitted solve of case `(shape, n)` with `side`'s operator and CG."""
    module, extra = (lx, {}) if side == "lineax" else (lxd, dict(policy=lxd.Lazy()))
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    op = module.FunctionLinearOperator(
        operator_function(shape, n), structure, lx.positive_semidefinite_tag, **extra
    )
    solver = module.CG(rtol=1e-5, atol=1e-5, max_steps=10 * n)
    if side.startswith("ours inline"):
        solver = lxd.CG(rtol=1e-5, atol=1e-5, max_steps=10 * n, layout="inline")

    def solve(b):
        sol = lx.linear_solve(op, b, solver, throw=False)
        return sol.value, sol.stats["num_steps"]

    return (lxd.jit if side.endswith("lxd.jit") else jax.jit)(solve)


def measure_case(shape: str, n: int, calls: int, rounds: int, copies: int) -> dict:
    b = jax.random.normal(jax.random.key(harness.SEED), (n,), jnp.float32)
    first: dict = {side: [] for side in SIDES}
    for _ in range(rounds):
        for side in SIDES:
            fresh = program(shape, n, side)
            first[side].append(
                harness.timed(lambda: jax.block_until_ready(fresh(b)))[1]
            )
    # `copies` programs of each side, compiled apart: each executable holds its
    # operator's constants where it holds them, and two copies of one program
    # ran 2-5% apart on the dense cells.
    compiled = {
        side: [program(shape, n, side) for _ in range(copies)] for side in SIDES
    }
    values, steps = {}, {}
    for side, copies_of_side in compiled.items():
        for f in copies_of_side:
            value, step = f(b)
        values[side], steps[side] = np.asarray(value), int(step)
    calls_of = [(side, f) for side in SIDES for f in compiled[side]]
    times: dict = {side: [] for side in SIDES}
    order = np.random.default_rng(harness.SEED)
    for _ in range(calls):
        # Each round in an order of its own (a seeded shuffle): a call's time
        # depends on the call before it (the cache a dense matrix is left in, the
        # runtime's threads awake or asleep), so each program takes each place
        # and follows each other about as often. A side's time in a round is the
        # median of its copies'.
        this_round: dict = {side: [] for side in SIDES}
        for index in order.permutation(len(calls_of)):
            side, f = calls_of[index]
            this_round[side].append(
                harness.timed(lambda: jax.block_until_ready(f(b)))[1]
            )
        for side, t in this_round.items():
            times[side].append(statistics.median(t))
    run = {side: statistics.median(t) for side, t in times.items()}
    first_call = {side: statistics.median(t) for side, t in first.items()}
    ours = [side for side in SIDES if side != "lineax"]
    return dict(
        shape=shape,
        n=n,
        layout=chosen_layout(shape, n),
        steps=steps,
        run_s=run,
        first_call_s=first_call,
        # The median over the rounds of each round's ratio (each side called
        # once a round, in turn): steadier than the ratio of the medians where
        # the machine's speed drifts during the case.
        run_ratio={
            side: statistics.median(
                a / c for a, c in zip(times[side], times["lineax"], strict=True)
            )
            for side in ours
        },
        first_ratio={side: first_call[side] / first_call["lineax"] for side in ours},
        rel_diff={
            side: float(
                np.linalg.norm(values[side] - values["lineax"])
                / np.linalg.norm(values["lineax"])
            )
            for side in ours
        },
    )


def chosen_layout(shape: str, n: int) -> str:
    """The layout `lxd.CG`'s default (`"auto"`) takes for case `(shape, n)`."""
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    op = lxd.FunctionLinearOperator(
        operator_function(shape, n),
        structure,
        lx.positive_semidefinite_tag,
        policy=lxd.Lazy(),
    )
    return lxd.CG(rtol=1e-5, atol=1e-5, max_steps=10 * n).init(op, {})[2].value[0]


def report(rows: list[dict]) -> None:
    headers = [
        "case",
        "steps",
        "lineax run",
        "ours (auto: layout)",
        "ours/lineax",
        "inline/lineax",
        "inline, lxd.jit",
        "first call ours, inline",
    ]
    table = [
        [
            f"{r['shape']} n={r['n']}",
            f"{r['steps']['lineax']}/{r['steps']['ours']}",
            f"{1e6 * r['run_s']['lineax']:.0f} us",
            f"{1e6 * r['run_s']['ours']:.0f} us ({r['layout']})",
            _ratio(r["run_ratio"]["ours"]),
            _ratio(r["run_ratio"]["ours inline"]),
            _ratio(r["run_ratio"]["ours inline, lxd.jit"]),
            f"{r['first_ratio']['ours']:.3f}, {r['first_ratio']['ours inline']:.3f}",
        ]
        for r in rows
    ]
    print(harness.table(headers, table))


def _ratio(ratio: float) -> str:
    return f"{ratio:.3f} ({harness.met(ratio <= TARGET)})"


def plot(rows: list[dict], path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['shape']}\nn={r['n']}\n({r['layout']})" for r in rows]
    x = np.arange(len(rows))
    bars = (
        ("ours", "run", "run_ratio"),
        ("ours inline", "run", "run_ratio"),
        ("ours inline, lxd.jit", "run", "run_ratio"),
        ("ours", "first call", "first_ratio"),
        ("ours inline", "first call", "first_ratio"),
    )
    for i, (side, what, key) in enumerate(bars):
        ax.bar(
            x + 0.16 * (i - 2),
            [r[key][side] for r in rows],
            0.16,
            label=f"{side}, {what}",
        )
    ax.axhline(TARGET, color="grey", linestyle=":", label=f"target {TARGET}x")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("lxd.CG / lx.CG")
    ax.legend(fontsize=8)
    fig.suptitle(f"one cheap CG solve; {harness.jax_label(openblas=True)}", fontsize=9)
    harness.save(fig, path)


def main(argv=None) -> None:
    """Measure, print the report, write `steady.json` and `.png`."""
    parser = harness.parser(__doc__, FULL, QUICK)
    for name in FULL:
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, help=f"(default {FULL[name]})")
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    settings = {name: getattr(args, name) for name in FULL}
    env = harness.environment(load_average=True)
    harness.print_setup(env, settings)
    rows = [
        measure_case(
            shape, n, settings["calls"], settings["rounds"], settings["copies"]
        )
        for shape, n in CASES
        if n <= settings["max_n"]
    ]
    report(rows)
    payload = dict(environment=env, settings=settings, cases=rows)
    harness.write_results(args.out, "steady", payload, lambda p: plot(rows, p))


if __name__ == "__main__":
    main()
