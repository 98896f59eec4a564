"""The solvers' stopping and breakdown tests do not depend on the scale of the
operator or of the right-hand side: scaling `A` by `10^k` and `b` by `10^m` gives
the same result and the same iterate up to the scaling; norms that would overflow
when squared are taken scaled; a zero or tiny right-hand side is solved."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd


_TAGS = (lx.symmetric_tag, lx.positive_semidefinite_tag)

_SOLVERS = {
    "CG": lambda rtol, atol: lxd.CG(rtol, atol, max_steps=500),
    "CG-inline": lambda rtol, atol: lxd.CG(rtol, atol, max_steps=500, layout="inline"),
    "GMRES": lambda rtol, atol: lxd.GMRES(rtol, atol, max_steps=500),
    "BiCGStab": lambda rtol, atol: lxd.BiCGStab(rtol, atol, max_steps=500),
    "MINRES": lambda rtol, atol: lxd.MINRES(rtol, atol, max_steps=500),
    "LSMR": lambda rtol, atol: lxd.LSMR(rtol, atol, max_steps=500),
    "Normal": lambda rtol, atol: lxd.Normal(lxd.CG(rtol, atol, max_steps=500)),
}


def _spd(n: int, low: float, high: float, seed: int = 0):
    """A float64 SPD matrix with eigenvalues spread evenly over `[low, high]`, and a
    right-hand side."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return (q * np.linspace(low, high, n)) @ q.T, rng.normal(size=n)


def _solve(name, matrix, b, dtype, rtol, atol=0.0):
    op = lxd.MatrixLinearOperator(jnp.asarray(matrix, dtype), _TAGS)
    solver = _SOLVERS[name](rtol, atol)
    sol = jax.jit(lambda v: lx.linear_solve(op, v, solver, throw=False))(
        jnp.asarray(b, dtype)
    )
    return np.asarray(sol.value, np.float64), sol.result, int(sol.stats["num_steps"])


def _residual(matrix, b, x) -> float:
    """`max |b - A x| / max |b|`, in float64."""
    return float(np.max(np.abs(b - matrix @ x)) / np.max(np.abs(b)))


def _dominant(n: int, seed: int = 0):
    """A float64 SPD matrix, diagonally dominant (diagonal in `[2, 4]`), and a
    right-hand side `A x` for an `x` whose entries are 0.5 to 1.5 in magnitude:
    every entry of `b` and `x` is of order 1, so that a relative elementwise
    tolerance (`atol=0`) is within reach in float32."""
    rng = np.random.default_rng(seed)
    off = rng.uniform(-1, 1, size=(n, n))
    off = (off + off.T) / (2 * n)
    matrix = np.diag(rng.uniform(2, 4, size=n)) + off
    x = rng.choice([-1.0, 1.0], size=n) * rng.uniform(0.5, 1.5, size=n)
    return matrix, matrix @ x


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(_SOLVERS))
def test_scaling_the_operator_and_the_right_hand_side(name, dtype):
    """`10^k A x = 10^m b` gives `10^(m-k)` times the solution of `A x = b`, with
    the same result code (`atol=0`: the tolerance is relative)."""
    matrix, b = _dominant(24)
    rtol = 1e-5 if dtype == jnp.float32 else 1e-10
    x0, result0, _ = _solve(name, matrix, b, dtype, rtol)
    assert result0 == lx.RESULTS.successful
    exponents = (-8, -2, 0, 2, 8) if dtype == jnp.float32 else (-60, -8, 0, 8, 60)
    # (`Normal` solves `A^H A`, of `A`'s scale squared, and its inner products
    # are of the fourth power: in float32 `A` is kept within 1e-4 to 1e4.)
    operator_exponents = (-4, -2, 0, 2, 4) if name == "Normal" else exponents
    if dtype == jnp.float64:
        operator_exponents = exponents
    for k in operator_exponents:
        for m in exponents:
            a, c = matrix * 10.0**k, b * 10.0**m
            x, result, _ = _solve(name, a, c, dtype, rtol)
            assert result == result0, (k, m, result)
            scaled = x * 10.0 ** (k - m)
            np.testing.assert_allclose(
                scaled, x0, rtol=0, atol=100 * rtol * np.max(np.abs(x0))
            )


@pytest.mark.parametrize("n, scale", [(512, 0.01), (64, 1e-3)])
def test_cg_on_a_well_conditioned_operator_of_small_scale(n, scale):
    """Eigenvalues `0.5 scale` to `2.5 scale` (condition number 5), float32: CG
    reported `singular` at step 0 (its curvature test compared `p^T A p` with the
    residual's `r^T r`), and so did `AutoSolver`, which chose CG."""
    matrix, b = _spd(n, 0.5 * scale, 2.5 * scale)
    for name in ("CG", "CG-inline"):
        x, result, steps = _solve(name, matrix, b, jnp.float32, 1e-5, 1e-5)
        assert result == lx.RESULTS.successful, (name, result, steps)
        assert _residual(matrix, b, x) < 1e-4
    op = lxd.FunctionLinearOperator(
        lambda v: jnp.asarray(matrix, jnp.float32) @ v,
        jax.ShapeDtypeStruct((n,), jnp.float32),
        _TAGS,
    )
    solver = lxd.AutoSolver(1e-5, 1e-5, memory_budget=1)
    sol = lx.linear_solve(op, jnp.asarray(b, jnp.float32), solver, throw=False)
    assert sol.result == lx.RESULTS.successful
    assert _residual(matrix, b, np.asarray(sol.value, np.float64)) < 1e-4


def test_cg_on_the_poisson_matrix():
    """The 1-D Poisson matrix at n = 512 with `b = 1`, float32 (condition number
    1e5): CG reported `singular` at step 0; the solution is reached."""
    n = 512
    matrix = 2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)
    b = np.ones(n)
    for name in ("CG", "CG-inline"):
        op = lxd.MatrixLinearOperator(jnp.asarray(matrix, jnp.float32), _TAGS)
        solver = lxd.CG(1e-4, 0.0, max_steps=4 * n, layout=name[3:] or "one_site")
        sol = lx.linear_solve(op, jnp.ones(n, jnp.float32), solver, throw=False)
        assert sol.result != lx.RESULTS.singular, name
        assert int(sol.stats["num_steps"]) > 100
        x = np.asarray(sol.value, np.float64)
        exact = np.linalg.solve(matrix, b)
        assert np.max(np.abs(x - exact)) < 1e-2 * np.max(np.abs(exact))


def test_cg_in_float16_is_not_singular():
    """In float16 a well-conditioned solve reaches the tolerance (or reports that
    it cannot), never `singular`."""
    matrix, b = _spd(8, 1.0, 3.0)
    for name in ("CG", "CG-inline"):
        x, result, _ = _solve(name, matrix, b, jnp.float16, 1e-2)
        assert result != lx.RESULTS.singular, name
        assert _residual(matrix, b, x) < 0.05, name


@pytest.mark.parametrize("name", list(_SOLVERS))
def test_a_right_hand_side_whose_squared_norm_overflows(name):
    """float32 `b` of entries about 1e20 (finite; `|b|^2` overflows): solved, not
    `nonfinite_input`, and not `x = 0` passed off as a success."""
    matrix, b = _spd(6, 1.0, 3.0)
    x, result, _ = _solve(name, matrix, 1e20 * b, jnp.float32, 1e-5, 1e-5)
    assert result == lx.RESULTS.successful, result
    assert _residual(matrix, 1e20 * b, x) < 1e-4


@pytest.mark.parametrize(
    "name, scale", [("LSMR", 1e-20), ("MINRES", 1e-20), ("CG", 1e-12), ("Normal", 1e-6)]
)
def test_a_tiny_operator_is_not_solved_by_zero(name, scale):
    """An operator scaled by 1e-20 (float32): LSMR's absolute tolerance was met by
    `A^H r` at `x = 0`, not by `b - A x`; a success must be one of `b - A x`.
    (`Normal` solves `A^H A`, whose scale is `A`'s squared: in float32 its inner
    products underflow for an operator of 1e-20, so it is tested at 1e-6, where
    `atol` on `A^H r` passed at `x = 0` too. CG's curvature `p^H A p` of a
    residual near the tolerance is of the operator's scale times the residual's
    squared: at 1e-20 it is subnormal in float32, which some CPUs flush to 0.)"""
    matrix, b = _spd(6, 1.0, 3.0)
    x, result, _ = _solve(name, scale * matrix, b, jnp.float32, 1e-5, 1e-5)
    if result == lx.RESULTS.successful:
        assert _residual(scale * matrix, b, x) < 1e-4
    assert result == lx.RESULTS.successful


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(_SOLVERS))
def test_zero_and_tiny_right_hand_sides(name, dtype):
    """`b = 0` gives `x = 0` as a success; `b = 1e-30` is solved (with `atol=0`:
    `x = 0` would not meet the relative tolerance)."""
    matrix, _ = _spd(6, 1.0, 3.0)
    x, result, _ = _solve(name, matrix, np.zeros(6), dtype, 1e-5, 1e-5)
    assert result == lx.RESULTS.successful, result
    np.testing.assert_array_equal(x, 0)
    b = 1e-30 * np.ones(6)
    x, result, _ = _solve(name, matrix, b, dtype, 1e-5)
    assert result == lx.RESULTS.successful, result
    exact = np.linalg.solve(matrix, b)
    np.testing.assert_allclose(x, exact, rtol=1e-3)


def test_normal_on_an_operator_of_1e_20_is_no_false_success():
    """`Normal(CG)` in float32 on an operator scaled by 1e-20: `A^H A` is of scale
    1e-40, below float32's normal range, and its `<r, r>` underflows to 0. The
    solve stopped there and reported `x = 0` a success; a success must now be one
    of `b - A x`."""
    matrix, b = _spd(6, 1.0, 3.0)
    x, result, _ = _solve("Normal", 1e-20 * matrix, b, jnp.float32, 1e-5, 1e-5)
    if result == lx.RESULTS.successful:
        assert _residual(1e-20 * matrix, b, x) < 1e-4


@pytest.mark.parametrize("name", ["GMRES", "BiCGStab", "MINRES", "LSMR"])
def test_operators_of_scale_1e20_and_1e_20_in_float32(name):
    """float32 operators of scale 1e20 and 1e-20: the squares of their products
    (GMRES's Arnoldi norms, BiCGStab's `<t, t>`, MINRES's `beta^2`, LSMR's norms)
    overflow or underflow, and BiCGStab's `alpha` and `omega` (of the inverse
    scale) fell below its absolute breakdown threshold. Solved as at scale 1."""
    matrix, b = _dominant(24)
    x0, result0, _ = _solve(name, matrix, b, jnp.float32, 1e-5)
    assert result0 == lx.RESULTS.successful
    for k in (-20, 20):
        x, result, _ = _solve(name, matrix * 10.0**k, b, jnp.float32, 1e-5)
        assert result == lx.RESULTS.successful, (k, result)
        scaled = x * 10.0**k
        np.testing.assert_allclose(scaled, x0, rtol=0, atol=1e-3 * np.max(np.abs(x0)))


def test_normal_near_a_least_squares_solution():
    """`Normal(CG)` on a least-squares problem whose right-hand side is almost
    orthogonal to the operator's range (as a Gauss-Newton step near a fit's
    solution, where `A^H b` vanishes and `b` does not): solved, as lineax's is; a
    tolerance on `A^H r` scaled by `|A^H b| / |b|` was out of reach there."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 5))
    q, _ = np.linalg.qr(a, mode="complete")
    b = q[:, 5:] @ rng.standard_normal(35) + 1e-9 * (a @ rng.standard_normal(5))
    op = lxd.MatrixLinearOperator(jnp.asarray(a))
    for solver in (
        lxd.Normal(lxd.CG(1e-12, 1e-12)),
        lx.Normal(lx.CG(1e-12, 1e-12)),
    ):
        sol = lx.linear_solve(op, jnp.asarray(b), solver, throw=False)
        assert sol.result == lx.RESULTS.successful, type(solver).__module__
        expected = np.linalg.lstsq(a, b, rcond=None)[0]
        np.testing.assert_allclose(sol.value, expected, rtol=0, atol=1e-12)
