"""Where `lxd.CG`'s compile goes, against lineax's CG: the program of
`benchmarks.fixed_cost` (one cheap CG solve, `jax.jit`), compiled with lineax's
CG, with ours, and with ours less each of its safeguards in turn, then all of
them: an ablation, to say what each costs to compile, not settings to use.

Variants:

- `lineax`: `lx.CG(1e-5, 1e-5)` (the base);
- `ours`: `lxd.CG(1e-5, 1e-5)` as it is (`layout="auto"`);
- `no check`: `check_residual=False` (a passing updated residual is not
  confirmed on the true residual);
- `no stall rule`: `stagnation_iters=None`;
- `no refresh`: `stabilise_every=None` (lineax's CG refreshes every 10 steps too);
- `no scaling`: the right-hand side's power of two (`rhs_unit_and_finite`) replaced by 1
  (patched: there is no setting for it), so neither its reduction nor the
  division and multiplication back are compiled;
- `none of them`: all four.

Each round compiles every variant once, in turn, a fresh program each (lowered,
then `.compile()` timed); reported per variant: the median compile time and the
median of its ratio to lineax's in the same round. Nothing here is a target:
`benchmarks.fixed_cost` measures the whole first call.

How to run
----------

    python -m benchmarks.cg_compile             # n = 64, 15 rounds
    python -m benchmarks.cg_compile --quick     # n = 32, 3 rounds

Results: `benchmarks/results/cg_compile.json` and `.png`.
"""

import contextlib
import statistics
import time

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

import lineax_dispatch as lxd

from . import harness


FULL = dict(n=64, rounds=15)
QUICK = dict(n=32, rounds=3)
TOL = (1e-5, 1e-5)
OFF = dict(check_residual=False, stagnation_iters=None, stabilise_every=None)
# Variant: (solver, whether the right-hand side's scaling is patched out).
VARIANTS = {
    "lineax": (lambda: lx.CG(*TOL), False),
    "ours": (lambda: lxd.CG(*TOL), False),
    "no check": (lambda: lxd.CG(*TOL, check_residual=False), False),
    "no stall rule": (lambda: lxd.CG(*TOL, stagnation_iters=None), False),
    "no refresh": (lambda: lxd.CG(*TOL, stabilise_every=None), False),
    "no scaling": (lambda: lxd.CG(*TOL), True),
    "none of them": (lambda: lxd.CG(*TOL, **OFF), True),
}


def _program(n: int, matrix, solver):
    """The solve of `benchmarks.fixed_cost`'s CG program, a fresh function."""

    def fn(x):
        return matrix @ x + 0.1 * jnp.roll(x, 1) + 0.1 * jnp.roll(x, -1)

    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    module = lxd if isinstance(solver, lxd.CG) else lx
    op = module.FunctionLinearOperator(fn, structure, lx.positive_semidefinite_tag)
    return jax.jit(lambda b: lx.linear_solve(op, b, solver, throw=False).value)


def _compiled(n: int, matrix, variant: str, b):
    """`(compile seconds, the compiled program)` of `variant`."""
    make, unscaled = VARIANTS[variant]
    with harness.without_rhs_scaling() if unscaled else contextlib.nullcontext():
        lowered = _program(n, matrix, make()).lower(b)
    start = time.perf_counter()
    compiled = lowered.compile()
    return time.perf_counter() - start, compiled


def measure(n: int, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n)) / np.sqrt(n)
    matrix = jnp.asarray(m @ m.T + np.eye(n), jnp.float32)
    b = jnp.ones(n, jnp.float32)
    reference = None
    for variant in VARIANTS:  # JAX's own first-use costs, and the answers agree
        value = np.asarray(_compiled(n, matrix, variant, b)[1](b))
        reference = value if reference is None else reference
        assert harness.relative_error(value, reference) < 1e-4, variant
    times: dict = {v: [] for v in VARIANTS}
    for round_ in range(rounds):
        order = list(VARIANTS)[:: -1 if round_ % 2 else 1]
        for variant in order:
            times[variant].append(_compiled(n, matrix, variant, b)[0])
    base = times["lineax"]
    return {
        v: dict(
            compile_s=statistics.median(t),
            over_lineax=statistics.median(a / c for a, c in zip(t, base)),
            all_compile_s=t,
        )
        for v, t in times.items()
    }


def plot(results: dict, path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(results)
    ax.bar(range(len(names)), [1e3 * results[v]["compile_s"] for v in names])
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("compile, ms (median)")
    fig.suptitle(f"CG's compile, ablated; {harness.jax_label()}", fontsize=9)
    harness.save(fig, path)


def main(argv=None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--n", type=int, help="size (default 64)")
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    if args.n is not None:
        settings["n"] = args.n
    env = harness.environment(load_average=True)
    results = measure(settings["n"], settings["rounds"])
    print(
        harness.table(
            ["variant", "compile", "x lineax's"],
            [
                [v, f"{1e3 * r['compile_s']:.1f} ms", f"{r['over_lineax']:.3f}"]
                for v, r in results.items()
            ],
        )
    )
    payload = dict(environment=env, settings=settings, results=results)
    harness.write_results(args.out, "cg_compile", payload, lambda p: plot(results, p))


if __name__ == "__main__":
    main()
