"""The solvers run on the right-hand side divided by a power of two (`rhs_unit`),
and their tolerances are taken in those units: `atol / unit + rtol * |x|`,
computed as `(atol + rtol * |x unit|) / unit` (`_tolerance`), so that no scalar
`atol / unit` is computed before a loop (XLA:CPU compiles such a scalar as a
kernel of its own). Also `any_nonzero`, CG's test of a vanished residual, in one
reduction."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch._reductions import any_nonzero


_TAGS = (lx.symmetric_tag, lx.positive_semidefinite_tag)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("traced", [False, True])
def test_the_tolerance_in_units_is_atol_over_unit_plus_rtol_times_x(dtype, traced):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=64) * np.exp(rng.uniform(-8, 8, 64))).astype(dtype)
    atol, rtol = 1e-6, 1e-4
    if traced:
        solver = lxd.CG(rtol=np.asarray(rtol, dtype), atol=np.asarray(atol, dtype))
    else:
        solver = lxd.CG(rtol=rtol, atol=atol)
    for exponent in range(-40, 41, 5):
        unit = np.ldexp(dtype(1), exponent)
        got = jax.jit(lambda x, u: solver._tolerance(x, u))(x, jnp.asarray(unit))
        want = dtype(atol) / unit + dtype(rtol) * np.abs(x)
        assert got.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(
        np.asarray(solver._tolerance(jnp.asarray(x))),
        dtype(atol) + dtype(rtol) * abs(x),
    )


_SOLVERS = {
    "CG": lambda atol: lxd.CG(0.0, atol, max_steps=200),
    "CG-inline": lambda atol: lxd.CG(0.0, atol, max_steps=200, layout="inline"),
    "GMRES": lambda atol: lxd.GMRES(0.0, atol, max_steps=200),
    "BiCGStab": lambda atol: lxd.BiCGStab(0.0, atol, max_steps=200),
    "MINRES": lambda atol: lxd.MINRES(0.0, atol, max_steps=200),
    "Normal": lambda atol: lxd.Normal(lxd.CG(0.0, atol, max_steps=200)),
}


@pytest.mark.parametrize("name", list(_SOLVERS))
@pytest.mark.parametrize("exponent", [-30, 0, 30])
def test_an_absolute_tolerance_holds_in_the_user_s_units(name, exponent):
    # With `rtol = 0` the stopping test is `|b - A y| <= atol` in the user's
    # units: taken in the system's without the division by `unit`, the solve
    # would stop at a residual `unit` times too large (or run on far past it).
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    matrix = (q * np.linspace(1.0, 10.0, 12)) @ q.T
    scale = 2.0**exponent
    b = rng.normal(size=12) * scale
    atol = 1e-6 * scale
    op = lxd.MatrixLinearOperator(jnp.asarray(matrix), _TAGS)
    sol = jax.jit(lambda v: lx.linear_solve(op, v, _SOLVERS[name](atol), throw=False))(
        jnp.asarray(b)
    )
    assert sol.result == lx.RESULTS.successful
    residual = np.max(np.abs(b - matrix @ np.asarray(sol.value)))
    assert residual <= 2 * atol
    # Not solved far past the tolerance either: the same solve with an atol a
    # thousand times larger stops at a larger residual.
    loose = jax.jit(
        lambda v: lx.linear_solve(op, v, _SOLVERS[name](1e3 * atol), throw=False)
    )(jnp.asarray(b))
    assert loose.stats["num_steps"] <= sol.stats["num_steps"]
    assert np.max(np.abs(b - matrix @ np.asarray(loose.value))) <= 2e3 * atol


def _loop_inputs(jaxpr: jax.extend.core.Jaxpr) -> list:
    """The operands of every `while` equation of `jaxpr` and its sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            found.append((jaxpr, eqn))
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if isinstance(inner, jax.extend.core.Jaxpr):
                found.extend(_loop_inputs(inner))
    return found


@pytest.mark.parametrize("layout", ["one_site", "inline"])
def test_cg_s_loop_reads_no_tolerance_divided_before_it(layout):
    matrix = jnp.eye(8) * 2.0
    op = lxd.MatrixLinearOperator(matrix, _TAGS)
    solver = lxd.CG(rtol=1e-5, atol=1e-5, layout=layout)
    state = solver.init(op, {})
    closed = jax.make_jaxpr(lambda b: solver.compute(state, b, {}))(jnp.ones(8))
    loops = _loop_inputs(closed.jaxpr)
    assert loops
    for jaxpr, loop in loops:
        made_by = {v: e for e in jaxpr.eqns for v in e.outvars}
        for var in loop.invars:
            if isinstance(var, jax.extend.core.Literal):
                continue
            eqn = made_by.get(var)
            scalar_division = (
                eqn is not None and eqn.primitive.name == "div" and var.aval.shape == ()
            )
            assert not scalar_division, eqn


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex64])
def test_any_nonzero(dtype):
    zeros = jnp.zeros(7, dtype)
    assert not bool(any_nonzero(zeros))
    assert not bool(any_nonzero(-zeros))
    for where in (0, 3, 6):
        for value in (1e-30, -2.0, np.inf, -np.inf, np.nan):
            assert bool(jax.jit(any_nonzero)(zeros.at[where].set(value)))
    assert not bool(any_nonzero(jnp.zeros(0, dtype)))
    batched = jax.vmap(any_nonzero)(jnp.stack([zeros, zeros.at[2].set(1.0)]))
    np.testing.assert_array_equal(np.asarray(batched), [False, True])


_ITERATE_IN_UNITS = {
    "CG": lambda: lxd.CG(rtol=1e-5, atol=0.0, max_steps=100),
    "CG-inline": lambda: lxd.CG(rtol=1e-5, atol=0.0, max_steps=100, layout="inline"),
    "GMRES": lambda: lxd.GMRES(rtol=1e-5, atol=0.0, max_steps=100, restart=6),
}


@pytest.mark.parametrize("name", list(_ITERATE_IN_UNITS))
@pytest.mark.parametrize("exponent", [-100, -106])
def test_a_solution_near_float32_s_smallest_normal_is_solved(name, exponent):
    # A float32 right-hand side of about 2^-100 and 2^-106 (1e-30, 1e-32) and
    # `atol=0`: the iterate in the system's units keeps every step above
    # float32's smallest normal number, below which XLA:CPU flushes to zero (an
    # iterate kept in the user's units lost its last steps and its update's
    # tolerance `rtol |y|` there, and reported `singular` at `max_steps`).
    rng = np.random.default_rng(2)
    q, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    matrix = (q * np.linspace(1.0, 50.0, 16)) @ q.T
    op = lxd.MatrixLinearOperator(jnp.asarray(matrix, jnp.float32), _TAGS)
    b = jnp.asarray(rng.normal(size=16) * 2.0**exponent, jnp.float32)
    solver = _ITERATE_IN_UNITS[name]()
    sol = jax.jit(lambda v: lx.linear_solve(op, v, solver, throw=False))(b)
    assert sol.result == lx.RESULTS.successful
    b64 = np.asarray(b, np.float64)
    residual = np.max(np.abs(b64 - matrix @ np.asarray(sol.value, np.float64)))
    assert residual <= 2e-5 * np.max(np.abs(b64))


@pytest.mark.parametrize("name", ["GMRES", "BiCGStab", "MINRES"])
def test_a_finite_right_hand_side_is_checked_by_the_unit_s_reduction(name):
    # The loop's `finite` flag comes from the reduction that finds the
    # right-hand side's power of two (`rhs_unit_and_finite`): no reduction of
    # `isfinite` before the loop.
    op = lxd.MatrixLinearOperator(jnp.eye(8) * 2.0, _TAGS)
    solver = _SOLVERS[name](1e-5)
    state = solver.init(op, {})
    closed = jax.make_jaxpr(lambda b: solver.compute(state, b, {})[0])(jnp.ones(8))
    (jaxpr, loop), *_ = _loop_inputs(closed.jaxpr)
    before = jaxpr.eqns[: jaxpr.eqns.index(loop)]
    assert "is_finite" not in [
        e.primitive.name for e in before if e.outvars[0].aval.shape
    ]
    for bad in (np.nan, np.inf, -np.inf):
        b = jnp.ones(8).at[3].set(bad)
        sol = jax.jit(lambda v: lx.linear_solve(op, v, solver, throw=False))(b)
        assert sol.result == lx.RESULTS.nonfinite_input
    sol = lx.linear_solve(op, jnp.ones(8), solver)
    np.testing.assert_allclose(np.asarray(sol.value), 0.5, rtol=1e-5)
