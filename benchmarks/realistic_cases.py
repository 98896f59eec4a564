"""The programs of `benchmarks.realistic`: written as users write them
(Python-unrolled loops of `mv`s and solves), each a function of a size `scale`
returning `(function, n, spd, program)`: the operator's function (an
`eqx.Partial` whose arrays are leaves), its size, whether it is SPD, and the
program of the operator and a vector.

Programs
--------

- `rk4_stencil`: 6 steps of classic RK4 (24 `mv` sites) of `u' = -A u`, `A` a
  2-D variable-coefficient five-point stencil on an `s x s` grid (s = 48).
- `power_iteration`: 12 steps `x <- A x / |A x|`, `A` a chain of 12 dense
  256 x 256 layers.
- `implicit_cg`: 3 implicit Euler steps `(I + A) x_{k+1} = x_k`, `A = B^T B`,
  `B` a chain of 8 dense 512 x 512 layers, `lxd.CG`.
- `heat_lineax_cg`: 4 implicit steps of the 2-D heat equation (s = 32) with
  lineax's own `lx.CG`.
- `arnoldi`: 8 steps of Arnoldi (modified Gram-Schmidt) of a chain of 16 dense
  128 x 128 layers.
- `newton_residual`: two steps of iterative refinement `x <- x + A^{-1}(b - A x)`
  (both `mv` and solves of one SPD operator `I + B^T B`, `B` 8 dense 256 x 256
  layers, `lxd.CG`).
- `small_dense_sum`: the sum of 8 independent `mv`s of a chain of 32 dense
  64 x 64 layers.
- `stencil_1d_steps`: 16 explicit Euler steps of a 1-D three-point stencil at
  n = 4096 (a cheap `mv`).
- `optx_newton`: optimistix's `Newton` on `A y + 0.1 tanh(y) = x`, `A = I + B^T B`,
  `B` 4 dense 128 x 128 layers (the `mv` inside optimistix's loop, its Jacobian
  solved by lineax's default solver).
- `optx_gauss_newton`: optimistix's `GaussNewton` on the residual
  `B theta - x + 0.05 theta^3`, `B` a chain of 6 dense 128 x 128 layers.
- `rk2_small_stencil`: 12 midpoint steps (24 `mv` sites) of the 2-D stencil on a
  16 x 16 grid.
- `implicit_stencil_large`: 2 implicit Euler steps of the 2-D stencil on a 96 x 96
  grid with `lxd.CG`.

Halves: a program's half is fixed by its position in the list above (even:
`fit`, odd: `held_out`), chosen before any measurement (the last four were added
after the first eight had been measured, at the end of the list, so that no
earlier program changes half); a constant of the decision
rule is set from the `fit` half only, and the `held_out` half scores it.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx

import lineax_dispatch as lxd


def _size(n: int, scale: float, least: int = 8) -> int:
    return max(least, int(round(n * scale)))


def _dense_chain(n: int, layers: int, seed: int):
    keys = jax.random.split(jax.random.key(seed), layers)
    return tuple(
        jnp.eye(n, dtype=jnp.float32)
        + 0.5 * jax.random.normal(k, (n, n), jnp.float32) / jnp.sqrt(n)
        for k in keys
    )


def _chain(weights, x):
    for w in weights:
        x = w @ x
    return x


def _normal(weights, x):
    y = _chain(weights, x)
    for w in reversed(weights):
        y = w.T @ y
    return y


def fresh_program(name: str, policy, scale: float) -> tuple:
    """`(body, op, x)`: program `name` at `scale` as a new function object `body(op,
    x)` (no cache of JAX's carries over between calls of this), its operator under
    `policy` (`None`: plain lineax) and its input, on the device."""
    fn, n, spd, program = PROGRAMS[name](scale)
    op = operator(fn, n, policy, spd)
    x = jax.block_until_ready(jax.random.normal(jax.random.key(7), (n,), jnp.float32))
    return (lambda op, x: program(op, x)), op, x


def operator(fn, n: int, policy, spd: bool):
    """`fn` (an `eqx.Partial` whose arrays are leaves) as a plain lineax operator
    (policy `None`) or one of ours."""
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    tags = lx.positive_semidefinite_tag if spd else ()
    if policy is None:
        return lx.FunctionLinearOperator(fn, structure, tags, closure_convert=False)
    return lxd.FunctionLinearOperator(
        fn, structure, tags, closure_convert=False, policy=policy
    )


def _stencil_2d(s: int, seed: int):
    coefficient = 1.0 + jax.random.uniform(jax.random.key(seed), (s, s), jnp.float32)

    def apply(c, x):
        u = x.reshape(s, s)
        p = jnp.pad(u, 1)
        lap = 4 * u - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]
        return (c * lap).reshape(-1) * (s / 4.0) ** 2 / s**2

    return eqx.Partial(apply, coefficient), s * s


def rk4_stencil(scale: float):
    fn, n = _stencil_2d(_size(48, scale), 0)
    dt = 0.2

    def program(op, u):
        for _ in range(6):
            k1 = -op.mv(u)
            k2 = -op.mv(u + 0.5 * dt * k1)
            k3 = -op.mv(u + 0.5 * dt * k2)
            k4 = -op.mv(u + dt * k3)
            u = u + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return u

    return fn, n, False, program


def power_iteration(scale: float):
    n = _size(256, scale)
    fn = eqx.Partial(_chain, _dense_chain(n, 12, 1))

    def program(op, x):
        for _ in range(12):
            x = op.mv(x)
            x = x / jnp.linalg.norm(x)
        return x

    return fn, n, False, program


def _shifted_normal(weights, x):
    return x + _normal(weights, x)


def implicit_cg(scale: float):
    n = _size(512, scale)
    fn = eqx.Partial(_shifted_normal, _dense_chain(n, 8, 2))
    return fn, n, True, _solves(lxd.CG(rtol=1e-5, atol=1e-5), 3)


def _solves(solver, steps: int) -> Callable:
    """The program of `steps` dependent solves `x <- A^{-1} x` with `solver`."""

    def program(op, x):
        for _ in range(steps):
            x = lx.linear_solve(op, x, solver).value
        return x

    return program


def _implicit_heat(s: int, seed: int):
    """`I + 4 A` of the 2-D stencil on an `s x s` grid, and its size."""
    stencil, n = _stencil_2d(s, seed)
    return eqx.Partial(lambda c, x: x + 4.0 * stencil(x), None), n


def heat_lineax_cg(scale: float):
    fn, n = _implicit_heat(_size(32, scale), 3)
    return fn, n, True, _solves(lx.CG(rtol=1e-5, atol=1e-5), 4)


def arnoldi(scale: float):
    n = _size(128, scale)
    fn = eqx.Partial(_chain, _dense_chain(n, 16, 4))

    def program(op, x):
        basis = [x / jnp.linalg.norm(x)]
        for _ in range(8):
            w = op.mv(basis[-1])
            for v in basis:
                w = w - jnp.vdot(v, w) * v
            basis.append(w / jnp.linalg.norm(w))
        return jnp.stack(basis)

    return fn, n, False, program


def newton_residual(scale: float):
    n = _size(256, scale)
    fn = eqx.Partial(_shifted_normal, _dense_chain(n, 8, 5))
    solver = lxd.CG(rtol=1e-5, atol=1e-5)

    def program(op, b):
        x = jnp.zeros_like(b)
        for _ in range(2):
            x = x + lx.linear_solve(op, b - op.mv(x), solver).value
        return x

    return fn, n, True, program


def small_dense_sum(scale: float):
    n = _size(64, scale)
    fn = eqx.Partial(_chain, _dense_chain(n, 32, 6))

    def program(op, x):
        return sum(op.mv(x * (1.0 + 0.1 * i)) for i in range(8))

    return fn, n, False, program


def stencil_1d_steps(scale: float):
    n = _size(4096, scale)

    def apply(_, x):
        p = jnp.pad(x, 1)
        return 2 * x - p[:-2] - p[2:]

    fn = eqx.Partial(apply, None)

    def program(op, x):
        for _ in range(16):
            x = x - 0.2 * op.mv(x)
        return x

    return fn, n, False, program


def optx_newton(scale: float):
    n = _size(128, scale)
    fn = eqx.Partial(_shifted_normal, _dense_chain(n, 4, 7))
    solver = optx.Newton(rtol=1e-5, atol=1e-5)

    def program(op, x):
        def residual(y, _):
            return op.mv(y) + 0.1 * jnp.tanh(y) - x

        y0 = jnp.zeros_like(x)
        return optx.root_find(residual, solver, y0, max_steps=20, throw=False).value

    return fn, n, True, program


def optx_gauss_newton(scale: float):
    n = _size(128, scale)
    fn = eqx.Partial(_chain, _dense_chain(n, 6, 8))
    solver = optx.GaussNewton(rtol=1e-5, atol=1e-5)

    def program(op, x):
        def residual(theta, _):
            return op.mv(theta) - x + 0.05 * theta**3

        theta0 = jnp.zeros_like(x)
        found = optx.least_squares(residual, solver, theta0, max_steps=20, throw=False)
        return found.value

    return fn, n, False, program


def rk2_small_stencil(scale: float):
    fn, n = _stencil_2d(_size(16, scale), 9)
    dt = 0.2

    def program(op, u):
        for _ in range(12):
            half = u - 0.5 * dt * op.mv(u)
            u = u - dt * op.mv(half)
        return u

    return fn, n, False, program


def implicit_stencil_large(scale: float):
    fn, n = _implicit_heat(_size(96, scale), 10)
    return fn, n, True, _solves(lxd.CG(rtol=1e-5, atol=1e-5), 2)


PROGRAMS: dict[str, Callable] = {
    f.__name__: f
    for f in (
        rk4_stencil,
        power_iteration,
        implicit_cg,
        heat_lineax_cg,
        arnoldi,
        newton_residual,
        small_dense_sum,
        stencil_1d_steps,
        optx_newton,
        optx_gauss_newton,
        rk2_small_stencil,
        implicit_stencil_large,
    )
}
HALF = {name: ("fit", "held_out")[i % 2] for i, name in enumerate(PROGRAMS)}
