"""The program families of `benchmarks.families`: operators a user of lineax and
optimistix writes, each at several sizes, applied by a mix of one to four solves
and `mv`s.

Families
--------

- `stencil`: the 2-D five-point Laplacian on an `s x s` grid (Dirichlet), shifted
  (`(4 + c) x - neighbours`), matrix-free, SPD (CG): a cheap `mv`, n = s^2.
- `adjoint`: `J^T J + lambda I` for a linear `J`, a chain of `L` dense layers,
  `J^T` by `jax.vjp` (CG): an expensive `mv` whose transpose JAX derives.
- `gauss_newton`: the Gauss-Newton normal operator `J^T J + lambda I` of a
  nonlinear least-squares fit, `J` the Jacobian of the residuals
  `tanh(A theta) * w - y` at a point (`jax.jvp` then `jax.vjp`), as a
  Levenberg-Marquardt step builds it (CG).
- `jacobian`: `lxd.JacobianLinearOperator` of a small residual network
  `x -> x + W2 tanh(W1 x)` (non-symmetric: GMRES), as a Newton step of
  optimistix builds it.

Mixes
-----

`(solves, mvs)`: `solves` dependent solves (each right-hand side the solution
before it, as implicit time steps or Newton steps), then `mvs` independent `mv`s
of the last solution, summed.
"""

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness


RTOL, ATOL, MAX_STEPS = 1e-5, 1e-5, 200
FAMILIES = ("stencil", "adjoint", "gauss_newton", "jacobian")
SIZES = {
    "stencil": (64, 256, 1024, 4096),
    "adjoint": (64, 256, 1024),
    "gauss_newton": (64, 256, 1024, 4096),
    "jacobian": (64, 256, 1024),
}
MIXES = ((1, 0), (2, 0), (4, 0), (1, 2), (2, 2), (0, 4), (1, 4))
# Layers of the adjoint family's J (fewer at large n: its weights stay under 64 MiB).
ADJOINT_LAYERS = 8
ADJOINT_CAP_BYTES = 64 * 2**20


@dataclasses.dataclass(frozen=True)
class Case:
    """One program: a family at size `n`, with `solves` solves and `mvs` `mv`s."""

    family: str
    n: int
    solves: int
    mvs: int

    @property
    def label(self) -> str:
        return f"{self.family} n={self.n} solves={self.solves} mvs={self.mvs}"


def cases() -> list[Case]:
    """Every case: each family at each of its sizes, with three mixes each,
    rotating through `MIXES` so that every mix meets every family."""
    out, turn = [], 0
    for family in FAMILIES:
        for n in SIZES[family]:
            for _ in range(3):
                solves, mvs = MIXES[turn % len(MIXES)]
                out.append(Case(family, n, solves, mvs))
                turn += 1
    return out


def split(all_cases: list[Case]) -> tuple[list[Case], list[Case]]:
    """`(fit, held_out)`: within each family, in the order of `cases()`, the cases
    alternate between the halves, so each half holds every family and size range;
    the held-out half is never used for fitting."""
    fit, held = [], []
    for family in FAMILIES:
        mine = [c for c in all_cases if c.family == family]
        fit += mine[0::2]
        held += mine[1::2]
    return fit, held


def _adjoint_layers(n: int) -> int:
    return max(1, min(ADJOINT_LAYERS, ADJOINT_CAP_BYTES // (4 * n * n)))


def family_arrays(family: str, n: int) -> tuple:
    """The arrays of a family's operator at size `n` (fixed seeds)."""
    keys = jax.random.split(jax.random.key(harness.SEED + 11), 4)
    if family == "stencil":
        return (jnp.asarray(0.05, jnp.float32),)
    if family == "adjoint":
        layers = _adjoint_layers(n)
        weights = tuple(
            jax.random.normal(k, (n, n), jnp.float32) / jnp.sqrt(n)
            for k in jax.random.split(keys[0], layers)
        )
        return weights, jnp.asarray(0.1, jnp.float32)
    if family == "gauss_newton":
        a = jax.random.normal(keys[1], (n, n), jnp.float32) / jnp.sqrt(n)
        w = jax.random.uniform(keys[2], (n,), jnp.float32, 0.5, 1.5)
        theta = 0.3 * jax.random.normal(keys[3], (n,), jnp.float32)
        return a, w, theta, jnp.asarray(0.1, jnp.float32)
    w1 = jax.random.normal(keys[1], (n, n), jnp.float32) / (2 * jnp.sqrt(n))
    w2 = jax.random.normal(keys[2], (n, n), jnp.float32) / (2 * jnp.sqrt(n))
    x0 = jax.random.normal(keys[3], (n,), jnp.float32)
    return w1, w2, x0


def _stencil(c, x):
    s = int(round(x.shape[0] ** 0.5))
    g = x.reshape(s, s)
    padded = jnp.pad(g, 1)
    near = padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]
    return ((4.0 + c) * g - near).reshape(-1)


def _adjoint(weights, lam, x):
    def j(v):
        for w in weights:
            v = w @ v
        return v

    y, vjp = jax.vjp(j, x)
    return vjp(y)[0] + lam * x


def _gauss_newton(a, w, theta, lam, v):
    def residual(t):
        return jnp.tanh(a @ t) * w - 0.5

    _, jv = jax.jvp(residual, (theta,), (v,))
    _, vjp = jax.vjp(residual, theta)
    return vjp(jv)[0] + lam * v


def _network(x, args):
    w1, w2 = args
    return x + w2 @ jnp.tanh(w1 @ x)


def make_operator(
    family: str, arrays: tuple, n: int, variant_policy, lineax_solvers: bool = False
):
    """The family's operator over `arrays`, a fresh function object (no trace is
    reused), plain lineax for `variant_policy` None, else ours under that policy;
    with the solver of its module (ours for ours), or lineax's where
    `lineax_solvers`. Returns `(operator, solver)`."""
    module = lx if variant_policy is None else lxd
    solvers = lx if lineax_solvers else module
    policy = {} if variant_policy is None else dict(policy=variant_policy)
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    spd = lx.positive_semidefinite_tag
    if family == "jacobian":
        w1, w2, x0 = arrays
        fn = eqx.Partial(lambda x, args: _network(x, args))
        op = module.JacobianLinearOperator(
            fn, x0, (w1, w2), closure_convert=False, **policy
        )
        solver = solvers.GMRES(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)
        return op, solver
    fns: dict[str, Callable] = dict(
        stencil=_stencil, adjoint=_adjoint, gauss_newton=_gauss_newton
    )
    base = fns[family]
    fn = eqx.Partial(lambda *a: base(*a), *arrays)
    op = module.FunctionLinearOperator(
        fn, structure, spd, closure_convert=False, **policy
    )
    solver = solvers.CG(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)
    return op, solver


def body(case: Case, solver) -> Callable:
    """The program of `case` as `body(op, x)`: its solves (dependent), then its
    `mv`s (independent) of the last solution. Returns the sum of the `mv`s (or
    the last solution), the largest step count and whether every solve
    succeeded."""

    def run(op, x):
        steps, ok = [jnp.array(0)], [jnp.array(True)]
        y = x
        for _ in range(case.solves):
            sol = lx.linear_solve(op, y, solver, throw=False)
            y = sol.value
            steps.append(sol.stats["num_steps"])
            ok.append(sol.result == lx.RESULTS.successful)
        out = y
        if case.mvs:
            out = sum(op.mv(y * (j + 1.0)) for j in range(case.mvs))
        return out, jnp.max(jnp.stack(steps)), jnp.all(jnp.stack(ok))

    return run
