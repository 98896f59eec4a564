"""The fixed cost of one cheap solve: the first call of a jitted program that
solves once with CG on a cheap operator (or finds a root with optimistix's Newton,
`--program newton`), `lxd.jit` and our solver against `jax.jit` and lineax's,
measured in the same process, with the trace, lowering and XLA compile apart.

What is measured
----------------

The operator is `x -> A x + 0.1 roll(x, 1) + 0.1 roll(x, -1)` (`A` a dense SPD
`n x n`, float32), tagged positive semidefinite, built afresh for each program (a
new function object: no trace is reused), solved by CG(1e-5, 1e-5). Variants:

- `jax.jit + lineax`: lineax's operator and `lx.CG` under `jax.jit` (the base);
- `lxd.jit + ours`: our operator (default policy) and `lxd.CG` under `lxd.jit`;
- `lxd.jit + lx.CG`: our operator and lineax's CG under `lxd.jit` (what `lxd.jit`
  itself costs; with `--program newton`, lineax's `AutoLinearSolver`);
- `jax.jit + ours`: our operator and `lxd.CG` under `jax.jit` (what our CG costs).

With `--program loop` (n = 1024 by default) the program applies the operator
twice per step of a `fori_loop` of 20 steps (`y -> A y / |A y|`, with `A = M^T M`
applied as a normal operator applies it, `M^T (M y)`), its function reading the
matrix as a module's global, so that lineax's closure conversion keeps it in the
operator's static half: `jax.jit` puts the `mv` inline, `lxd.jit` keeps a call in
the loop body. `M` is random (with a symmetric `M` XLA:CPU's compile time differs,
for `jax.jit` too). The program solves nothing: its two `lxd.jit` variants run the
same program. Results: `fixed_cost-loop.json` and `.png`.

With `--program newton` the program is `optx.root_find` with `optx.Newton(1e-5,
1e-5)` of `F(y) = tanh(A y) / 4 + y - 1` from `y = b` (a new function object each
time), its linear solves by the solver's automatic choice: lineax's
`AutoLinearSolver(well_posed=None)` (optimistix's default) for "lineax" and
`lxd.AutoSolver()` for "ours", which chooses inside optimistix's loop (a nested
trace). Results: `fixed_cost-newton.json` and `.png`.

Each of `--rounds` rounds measures every variant once, in turn: the first call
(trace + lower + compile + run), and for a second fresh program its stages apart
(`jax.jit`'s `trace`, `lower`, `compile`; for `lxd.jit`, `lower` covers its trace
and rewrite). Reported: per variant the median first call and the median and
quartiles over the rounds of its ratio to the base measured in the same round
(target: `lxd.jit + ours` at most 1.05x).

How to run
----------

    python -m benchmarks.fixed_cost              # n = 64, 21 rounds
    python -m benchmarks.fixed_cost --quick      # n = 32, 3 rounds
    python -m benchmarks.fixed_cost --program newton
    python -m benchmarks.fixed_cost --program loop [--n 256]

Results: `benchmarks/results/fixed_cost.json` and `.png`.
"""

import statistics
import time
import types

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx

import lineax_dispatch as lxd

from . import harness


FULL = dict(n=64, rounds=21)
QUICK = dict(n=32, rounds=3)

BASE = "jax.jit + lineax"
VARIANTS = {
    BASE: (lx, lx, jax.jit),
    "lxd.jit + ours": (lxd, lxd, lxd.jit),
    "lxd.jit + lx.CG": (lxd, lx, lxd.jit),
    "jax.jit + ours": (lxd, lxd, jax.jit),
}


def _cg_program(n: int, matrix, operators, solvers, jit):
    def fn(x):
        return matrix @ x + 0.1 * jnp.roll(x, 1) + 0.1 * jnp.roll(x, -1)

    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    op = operators.FunctionLinearOperator(fn, structure, lx.positive_semidefinite_tag)
    solver = solvers.CG(1e-5, 1e-5)
    return jit(lambda b: lx.linear_solve(op, b, solver).value)


def _newton_program(n: int, matrix, operators, solvers, jit):
    del n, operators  # optimistix builds the Jacobian operator

    def residual(y, args):
        return 0.25 * jnp.tanh(matrix @ y) + y - 1.0

    linear = (
        lxd.AutoSolver() if solvers is lxd else lx.AutoLinearSolver(well_posed=None)
    )
    solver = optx.Newton(1e-5, 1e-5, linear_solver=linear)
    return jit(lambda b: optx.root_find(residual, solver, b, throw=False).value)


# The loop program's matrix, read by `_gram` as a user's function reads a module's
# array (a global: no leaf of the function, unlike an array in a closure's cell,
# which equinox makes one). Set by each program built, before it is traced.
_GLOBAL = types.SimpleNamespace(matrix=None)


def _gram(x):
    return _GLOBAL.matrix.T @ (_GLOBAL.matrix @ x)


def _loop_program(n: int, matrix, operators, solvers, jit):
    del solvers
    _GLOBAL.matrix = matrix
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    op = operators.FunctionLinearOperator(lambda x: _gram(x), structure)

    def step(i, y):
        return op.mv(y) / jnp.linalg.norm(op.mv(y))

    return jit(lambda b: jax.lax.fori_loop(0, 20, step, b))


PROGRAMS = {"cg": _cg_program, "newton": _newton_program, "loop": _loop_program}
# Each program's size unless `--n` is given.
SIZES = {"cg": 64, "newton": 64, "loop": 1024}


def _stages(program, b) -> dict:
    if hasattr(program, "trace"):
        t0 = time.perf_counter()
        traced = program.trace(b)
        t1 = time.perf_counter()
        lowered = traced.lower()
    else:  # `lxd.jit`: its trace and rewrite are part of `lower`
        t0 = t1 = time.perf_counter()
        lowered = program.lower(b)
    t2 = time.perf_counter()
    lowered.compile()
    t3 = time.perf_counter()
    return dict(trace_s=t1 - t0, lower_s=t2 - t1, compile_s=t3 - t2)


def measure(n: int, rounds: int, program: str = "cg") -> dict:
    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n)) / np.sqrt(n)
    # The loop program's `M` is the random matrix itself: with `M` symmetric
    # (`M^T = M`) XLA:CPU compiles its program at a speed of its own.
    matrix = jnp.asarray(m if program == "loop" else m @ m.T + np.eye(n), jnp.float32)
    b = jnp.ones(n, jnp.float32)
    build = PROGRAMS[program]
    reference = None
    for name, parts in VARIANTS.items():  # JAX's own first-use costs, once
        value = np.asarray(build(n, matrix, *parts)(b))
        reference = value if reference is None else reference
        assert harness.relative_error(value, reference) < 1e-4, name
    rows: dict = {name: dict(first_s=[], stages=[]) for name in VARIANTS}
    for _ in range(rounds):
        for name, parts in VARIANTS.items():
            jitted = build(n, matrix, *parts)
            t = time.perf_counter()
            jax.block_until_ready(jitted(b))
            rows[name]["first_s"].append(time.perf_counter() - t)
            rows[name]["stages"].append(_stages(build(n, matrix, *parts), b))
    base = rows[BASE]["first_s"]
    out: dict = {}
    for name, row in rows.items():
        ratios = [a / c for a, c in zip(row["first_s"], base)]
        q1, q2, q3 = np.quantile(ratios, [0.25, 0.5, 0.75])
        out[name] = dict(
            first_s=statistics.median(row["first_s"]),
            ratio_median=float(q2),
            ratio_quartiles=[float(q1), float(q3)],
            all_first_s=row["first_s"],
            **{
                key: statistics.median(s[key] for s in row["stages"])
                for key in ("trace_s", "lower_s", "compile_s")
            },
        )
    return out


def report(results: dict) -> None:
    headers = [
        "variant",
        "first call",
        "x base (quartiles)",
        "trace",
        "lower",
        "compile",
    ]
    print(
        harness.table(
            headers,
            [
                [
                    name,
                    f"{1e3 * r['first_s']:.1f} ms",
                    f"{r['ratio_median']:.3f} ({r['ratio_quartiles'][0]:.3f}-"
                    f"{r['ratio_quartiles'][1]:.3f})",
                    f"{1e3 * r['trace_s']:.1f} ms",
                    f"{1e3 * r['lower_s']:.1f} ms",
                    f"{1e3 * r['compile_s']:.1f} ms",
                ]
                for name, r in results.items()
            ],
        )
    )


def plot(results: dict, path, program: str = "cg") -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(results)
    ax.boxplot(
        [
            [
                a / c
                for a, c in zip(results[v]["all_first_s"], results[BASE]["all_first_s"])
            ]
            for v in names
        ]
    )
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.axhline(1.05, color="grey", linestyle=":", label="target 1.05x")
    ax.set_ylabel(f"first call / {BASE}'s, per round")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)
    what = {
        "cg": "one cheap CG solve",
        "newton": "optimistix Newton, AutoSolver",
        "loop": "two mvs a step of a fori_loop",
    }[program]
    fig.suptitle(f"{what}; {harness.jax_label(openblas=True)}", fontsize=9)
    harness.save(fig, path)


def main(argv=None) -> None:
    """Measure, print the report, write `fixed_cost.json` and `.png`."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--program", choices=tuple(PROGRAMS), default="cg")
    parser.add_argument("--n", type=int, help="size (default: the program's)")
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL, program=args.program)
    if not args.quick:
        settings["n"] = SIZES[args.program]
    if args.n is not None:
        settings["n"] = args.n
    env = harness.environment(load_average=True)
    results = measure(settings["n"], settings["rounds"], args.program)
    report(results)
    payload = dict(environment=env, settings=settings, results=results)
    name = "fixed_cost" if args.program == "cg" else f"fixed_cost-{args.program}"
    harness.write_results(
        args.out, name, payload, lambda p: plot(results, p, args.program)
    )


if __name__ == "__main__":
    main()
