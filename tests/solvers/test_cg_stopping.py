"""CG's check of the true residual: where lineax's CG converges on a solution
that meets the tolerance, ours converges in as many steps (the check allows for
the rounding of `b - A y` in the dtype); a backward solve under `jax.grad` uses
the forward solver's settings, so what it does where the tolerance is out of reach
is the user's to choose (`stagnation_iters`, `check_residual`)."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd


_PSD = lx.positive_semidefinite_tag


def _spd(n: int, seed: int, cond: float):
    """A float64 SPD matrix with eigenvalues spread over `[1, cond]`, and a
    right-hand side."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return (q * np.geomspace(1.0, cond, n)) @ q.T, rng.normal(size=n)


def _measure(matrix, b, x, tol) -> float:
    """lineax's residual test on `b - A x`, in float64: the largest of
    `|b - A x| / (tol + tol |b|)`, elementwise."""
    a, b, x = (np.asarray(v, np.float64) for v in (matrix, b, x))
    return float(np.max(np.abs(b - a @ x) / (tol + tol * np.abs(b))))


_CASES = [(seed, cond) for seed in range(10) for cond in (10.0, 30.0, 100.0, 300.0)]


@pytest.mark.parametrize("layout", ["one_site", "inline"])
@pytest.mark.parametrize(
    "dtype, tol", [(jnp.float64, 1e-12), (jnp.float32, 1e-6)], ids=["f64", "f32"]
)
def test_cg_preconditioned_by_the_inverse_takes_lineaxs_steps(dtype, tol, layout):
    """An SPD system preconditioned by its exact inverse: lineax's CG converges
    in two steps. Wherever its solution meets the tolerance (measured in float64),
    ours converges too, in as many steps, with `max_steps=3`. (Before, the check
    of the true residual, computed in float32, failed by rounding, and the solve
    went on to `max_steps_reached` or `stagnation`.)"""
    compared = 0
    for seed, cond in _CASES:
        matrix, b = _spd(10, seed, cond)
        inverse = np.linalg.inv(matrix)
        a, m, v = (jnp.asarray(x, dtype) for x in (matrix, inverse, b))
        op = lx.MatrixLinearOperator(a, _PSD)
        options = {"preconditioner": lx.MatrixLinearOperator(m, _PSD)}
        ref = lx.linear_solve(
            op, v, lx.CG(tol, tol, max_steps=3), options=options, throw=False
        )
        if ref.result != lx.RESULTS.successful or _measure(a, v, ref.value, tol) > 1:
            continue
        compared += 1
        solver = lxd.CG(tol, tol, max_steps=3, layout=layout)
        sol = lx.linear_solve(op, v, solver, options=options, throw=False)
        assert sol.result == lx.RESULTS.successful, (seed, cond, sol.result)
        assert int(sol.stats["num_steps"]) == int(ref.stats["num_steps"])
        np.testing.assert_allclose(sol.value, ref.value, rtol=100 * tol, atol=0)
    assert compared >= 6, compared


def test_normal_cg_preconditioned_by_the_inverse_takes_lineaxs_steps():
    """`Normal(CG)` in float64 with tol 1e-12, preconditioned by the exact inverse:
    where lineax's converges within 4 steps on a solution meeting its test (the
    normal equations' residual, measured in float64), ours does, in as many."""
    tol = 1e-12
    compared = 0
    for seed, cond in _CASES:
        matrix, b = _spd(10, seed, cond)
        inverse = np.linalg.inv(matrix)
        op = lx.MatrixLinearOperator(jnp.asarray(matrix))
        options = {"preconditioner": lx.MatrixLinearOperator(jnp.asarray(inverse))}
        ref = lx.linear_solve(
            op,
            jnp.asarray(b),
            lx.Normal(lx.CG(tol, tol, max_steps=4)),
            options=options,
            throw=False,
        )
        normal = matrix.T @ matrix
        if ref.result != lx.RESULTS.successful or (
            _measure(normal, matrix.T @ b, ref.value, tol) > 1
        ):
            continue
        compared += 1
        solver = lxd.Normal(lxd.CG(tol, tol, max_steps=4))
        sol = lx.linear_solve(op, jnp.asarray(b), solver, options=options, throw=False)
        assert sol.result == lx.RESULTS.successful, (seed, cond, sol.result)
        assert int(sol.stats["num_steps"]) == int(ref.stats["num_steps"])
    assert compared >= 6, compared


def _grad(matrix, b, solver):
    """`jax.grad` of a loss through the solve, `Materialise()` policy: the
    backward solve is a solve with the transposed operator and the same solver."""

    def loss(v):
        op = lxd.MatrixLinearOperator(matrix, _PSD, policy=lxd.Materialise())
        return jnp.sum(jnp.sin(lx.linear_solve(op, v, solver).value))

    return jax.block_until_ready(jax.jit(jax.grad(loss))(b))


def test_a_backward_solve_that_lineax_passes_passes():
    """float32, `CG(1e-6, 1e-6)`: the backward solve's true residual is within
    rounding of the tolerance (lineax's CG passes it on its updated residual);
    ours passes too, with the gradient of a dense solve."""
    matrix, b = _spd(32, 2, 100.0)
    matrix = jnp.asarray(matrix, jnp.float32)
    b = jnp.asarray(b, jnp.float32)
    want = jax.grad(lambda v: jnp.sum(jnp.sin(jnp.linalg.solve(matrix, v))))(b)
    for layout in ("one_site", "inline"):
        got = _grad(matrix, b, lxd.CG(1e-6, 1e-6, layout=layout))
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_the_backward_solve_is_the_users_choice():
    """Where float32 cannot reach the tolerance (1e-7 at condition number 10), the
    solves stop with `stagnation`, whose message names `stagnation_iters`: a field
    of CG, carried to the backward solve with the rest of the forward solver's
    settings. `check_residual=False` accepts the updated residual, as lineax's CG
    does."""
    matrix, b = _spd(32, 0, 10.0)
    matrix = jnp.asarray(matrix, jnp.float32)
    b = jnp.asarray(b, jnp.float32)
    with pytest.raises(Exception, match="stagnation"):
        _grad(matrix, b, lxd.CG(1e-7, 1e-7))
    assert lxd.CG(1e-7, 1e-7).stagnation_iters == 1
    # No stop for stagnation: the solves run to `max_steps` instead.
    with pytest.raises(Exception, match="maximum number of solver steps"):
        _grad(matrix, b, lxd.CG(1e-7, 1e-7, max_steps=100, stagnation_iters=None))
    # lineax's rule, in both directions.
    want = _grad(matrix, b, lx.CG(1e-6, 1e-6))
    for layout in ("one_site", "inline"):
        solver = lxd.CG(1e-6, 1e-6, check_residual=False, layout=layout)
        np.testing.assert_allclose(_grad(matrix, b, solver), want, rtol=1e-4)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_stagnation_iters_must_be_a_positive_int_or_none(value):
    with pytest.raises(ValueError, match="stagnation_iters"):
        lxd.CG(1e-6, 1e-6, stagnation_iters=value)
