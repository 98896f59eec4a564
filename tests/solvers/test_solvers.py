"""The one-`mv`-site solvers: answers, iteration counts, results codes, options,
autodiff and vmap, compared with lineax's solvers and dense solves. How often they
run the user's function: test_solver_traces.py."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd

from ..helpers.leaks import leak_checked
from ..helpers.solver_problems import (
    CHECK,
    function_operator,
    matrix,
    reference,
    rhs,
    SOLVERS,
    TOL,
)
from ..helpers.zoo import POLICIES, SOLVE_POLICIES


# Every test here runs under lineax's strict dtype and rank promotion.
pytestmark = pytest.mark.usefixtures("strict_promotion")


def _solve(operator, b, solver, **kwargs):
    sol = lx.linear_solve(operator, b, solver, throw=False, **kwargs)
    return sol.value, sol.result, sol.stats["num_steps"]


_CASES = [
    (name, kind, dtype)
    for name, (_, _, kinds) in SOLVERS.items()
    for kind in kinds
    for dtype in (jnp.float32, jnp.float64)
] + [
    ("cg", "psd", jnp.complex128),
    ("cg-inline", "psd", jnp.complex128),
    ("gmres", "nonsym", jnp.complex128),
    ("normal-cg", "tall", jnp.complex128),
]


def _lineax_alone(name, kind, dtype):
    """The same solve with lineax's own solver; where lineax has none that runs
    here, its `Normal(CG)`."""
    _, theirs, _ = SOLVERS[name]
    if theirs is None or (name == "lsmr" and dtype == jnp.float32):
        # lineax's LSMR raises on float32 with x64 enabled (as in these tests).
        theirs = lambda tol: lx.Normal(lx.CG(rtol=tol, atol=tol))  # noqa: E731
    b = jnp.asarray(rhs(kind, dtype))
    operator = function_operator(kind, dtype, dispatch=False)
    solver = theirs(TOL[dtype])
    return lambda: eqx.filter_jit(_solve)(operator, b, solver)


@pytest.mark.parametrize("name,kind,dtype", _CASES)
def test_matches_lineax_and_dense(name, kind, dtype):
    ours, theirs, _ = SOLVERS[name]
    tol = TOL[dtype]
    b = jnp.asarray(rhs(kind, dtype))
    operator = function_operator(kind, dtype, dispatch=False)
    value, result, steps = leak_checked(
        lambda: eqx.filter_jit(_solve)(operator, b, ours(tol)),
        _lineax_alone(name, kind, dtype),
    )
    assert result == lx.RESULTS.successful
    expected = reference(kind, dtype)
    error = np.max(np.abs(np.asarray(value) - expected)) / np.max(np.abs(expected))
    assert error < CHECK[dtype], error
    # lineax's own LSMR fails on float32 when x64 is enabled (as in these tests).
    if theirs is not None and not (name == "lsmr" and dtype == jnp.float32):
        _, their_result, their_steps = eqx.filter_jit(_solve)(operator, b, theirs(tol))
        if their_result == lx.RESULTS.successful:
            assert abs(int(steps) - int(their_steps)) <= max(1, 0.1 * int(their_steps))


@pytest.mark.parametrize("policy", SOLVE_POLICIES)
@pytest.mark.parametrize("name", list(SOLVERS))
def test_policies_and_override(name, policy):
    ours, _, kinds = SOLVERS[name]
    kind = kinds[-1]
    b = jnp.asarray(rhs(kind, jnp.float64))
    expected = reference(kind, jnp.float64)
    # The operator's own policy, through lineax's linear_solve...
    operator = function_operator(kind, jnp.float64, policy=POLICIES[policy])
    value, result, _ = eqx.filter_jit(_solve)(operator, b, ours(1e-10))
    assert result == lx.RESULTS.successful
    np.testing.assert_allclose(value, expected, rtol=1e-7, atol=1e-7)
    # ... and a plain lineax operator given the policy for one solve.
    plain = function_operator(kind, jnp.float64, dispatch=False)
    solve = eqx.filter_jit(
        lambda op, b: lxd.linear_solve(op, b, ours(1e-10), policy=POLICIES[policy])
    )
    np.testing.assert_allclose(solve(plain, b).value, expected, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("name", list(SOLVERS))
def test_nonfinite_input(name, bad):
    # (CG keeps no flag for it: its `gamma = <M r, r>` is non-finite then.)
    ours, _, kinds = SOLVERS[name]
    kind = kinds[-1]
    b = jnp.asarray(rhs(kind, jnp.float64)).at[0].set(bad)
    operator = function_operator(kind, jnp.float64)
    _, result, _ = eqx.filter_jit(_solve)(operator, b, ours(1e-8))
    assert result == lx.RESULTS.nonfinite_input
    with pytest.raises(Exception, match="non-finite"):
        lx.linear_solve(operator, b, ours(1e-8))


@pytest.mark.parametrize("name", list(SOLVERS))
def test_max_steps_reached(name):
    _, _, kinds = SOLVERS[name]
    kind = kinds[-1]
    solver = {
        "cg": lxd.CG(rtol=1e-12, atol=1e-12, max_steps=2),
        "cg-inline": lxd.CG(rtol=1e-12, atol=1e-12, max_steps=2, layout="inline"),
        "bicgstab": lxd.BiCGStab(rtol=1e-12, atol=1e-12, max_steps=2),
        "gmres": lxd.GMRES(rtol=1e-12, atol=1e-12, max_steps=2, restart=2),
        "normal-cg": lxd.Normal(lxd.CG(rtol=1e-12, atol=1e-12, max_steps=2)),
        "minres": getattr(lxd, "MINRES", lxd.CG)(rtol=1e-12, atol=1e-12, max_steps=2),
        "lsmr": getattr(lxd, "LSMR", lxd.CG)(rtol=1e-12, atol=1e-12, max_steps=2),
    }[name]
    b = jnp.asarray(rhs(kind, jnp.float64))
    operator = function_operator(kind, jnp.float64)
    _, result, steps = eqx.filter_jit(_solve)(operator, b, solver)
    assert result == lx.RESULTS.max_steps_reached
    assert steps == 2
    with pytest.raises(Exception, match="maximum number of solver steps"):
        lx.linear_solve(operator, b, solver)


def test_cg_not_definite_and_singular():
    solver = lxd.CG(rtol=1e-8, atol=1e-8)
    b = jnp.array([0.0, 1.0, 0.0])
    # Negative curvature along `b`: not positive definite.
    indefinite = lxd.MatrixLinearOperator(
        jnp.diag(jnp.array([1.0, -1.0, 2.0])), lx.positive_semidefinite_tag
    )
    _, result, _ = _solve(indefinite, b, solver)
    assert result == lx.RESULTS.breakdown
    with pytest.raises(Exception, match="breakdown"):
        lx.linear_solve(indefinite, b, solver)
    # Zero curvature along `b`, which is outside the range: singular.
    singular = lxd.MatrixLinearOperator(
        jnp.diag(jnp.array([1.0, 0.0, 2.0])), lx.positive_semidefinite_tag
    )
    _, result, _ = _solve(singular, b, solver)
    assert result == lx.RESULTS.singular
    with pytest.raises(Exception, match="non-finite|singular|well-posed"):
        lx.linear_solve(singular, b, solver)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_jvp_and_vjp_match_finite_differences(name):
    ours, _, kinds = SOLVERS[name]
    kind = kinds[-1]
    b0 = jnp.asarray(rhs(kind, jnp.float64))
    weights = jnp.asarray(
        np.random.default_rng(3).standard_normal(reference(kind, jnp.float64).shape)
    )

    def loss(theta, b):
        operator = function_operator(kind, jnp.float64, theta)
        x = lx.linear_solve(operator, b, ours(1e-12)).value
        return jnp.sum(weights * x)

    theta0, db = 1.3, jnp.asarray(np.random.default_rng(4).standard_normal(b0.shape))
    h = 1e-5

    # The finite difference, the JVP and the gradient in one compiled call.
    # (Not under `jax.checking_leaks()`: equinox's runtime-error machinery keeps
    # frames' locals alive and trips it, with lineax's own solvers too.)
    @jax.jit
    def run(t, b):
        fd = (loss(t + h, b + h * db) - loss(t - h, b - h * db)) / (2 * h)
        _, jvp = jax.jvp(loss, (t, b), (1.0, db))
        return fd, jvp, jax.grad(loss, argnums=(0, 1))(t, b)

    fd, jvp, (g_theta, g_b) = run(theta0, b0)
    np.testing.assert_allclose(jvp, fd, rtol=1e-5)
    np.testing.assert_allclose(g_theta + jnp.dot(g_b, db), fd, rtol=1e-5)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_vmap_over_operator_and_vector(name):
    ours, _, kinds = SOLVERS[name]
    kind = kinds[-1]
    b = jnp.asarray(rhs(kind, jnp.float64))
    thetas = jnp.array([1.0, 2.0, 0.5])
    bs = jnp.stack([b, 2 * b, -b])

    def solve(theta, b):
        operator = function_operator(kind, jnp.float64, theta)
        return lx.linear_solve(operator, b, ours(1e-10)).value

    out = jax.jit(jax.vmap(solve))(thetas, bs)
    expected = reference(kind, jnp.float64)
    for i, scale in enumerate([1.0, 1.0, -2.0]):
        np.testing.assert_allclose(out[i], scale * expected, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize(
    "name", ["cg", "cg-inline", "bicgstab", "gmres", "minres", "normal-cg"]
)
def test_preconditioner_and_y0_options(name):
    ours, _, kinds = SOLVERS[name]
    kind = "psd"
    a = jnp.asarray(matrix(kind, jnp.float64))
    operator = lxd.MatrixLinearOperator(a, lx.positive_semidefinite_tag)
    b = jnp.asarray(rhs(kind, jnp.float64))
    diag = lx.DiagonalLinearOperator(1 / jnp.diag(a))
    preconditioner = lx.TaggedLinearOperator(diag, lx.positive_semidefinite_tag)
    options = dict(preconditioner=preconditioner, y0=jnp.ones_like(b))
    value, result, _ = eqx.filter_jit(_solve)(operator, b, ours(1e-10), options=options)
    assert result == lx.RESULTS.successful
    np.testing.assert_allclose(value, reference(kind, jnp.float64), rtol=1e-7)
    bad = dict(y0=jnp.ones(3))
    with pytest.raises(ValueError, match=r"options\['y0'\]"):
        lx.linear_solve(operator, b, ours(1e-10), options=bad)


def test_cg_needs_a_definite_preconditioner():
    a = jnp.asarray(matrix("psd", jnp.float64))
    operator = lxd.MatrixLinearOperator(a, lx.positive_semidefinite_tag)
    untagged = dict(preconditioner=lx.DiagonalLinearOperator(jnp.ones(a.shape[0])))
    with pytest.raises(ValueError, match=r"options\['preconditioner'\].*semidefinite"):
        lx.linear_solve(
            operator, jnp.ones(a.shape[0]), lxd.CG(1e-8, 1e-8), options=untagged
        )


# `Normal` with every inner solver: ours (the normal equations as a one-site
# system) and lineax's (as `lx.Normal`: the inner solver on `A^H A` or `A A^H`).
_NORMAL_INNER = {
    "lxd.CG": lambda: lxd.CG(rtol=1e-12, atol=1e-12),
    "lxd.GMRES": lambda: lxd.GMRES(rtol=1e-12, atol=1e-12),
    "lxd.BiCGStab": lambda: lxd.BiCGStab(rtol=1e-12, atol=1e-12),
    "lxd.MINRES": lambda: lxd.MINRES(rtol=1e-12, atol=1e-12),
    "lxd.LSMR": lambda: lxd.LSMR(rtol=1e-12, atol=1e-12),
    "lx.CG": lambda: lx.CG(rtol=1e-12, atol=1e-12),
    "lx.GMRES": lambda: lx.GMRES(rtol=1e-12, atol=1e-12),
    "lx.LSMR": lambda: lx.LSMR(rtol=1e-12, atol=1e-12),
    "lx.Cholesky": lx.Cholesky,
    "lx.LU": lx.LU,
    "lx.QR": lx.QR,
}


@pytest.mark.parametrize("shape", [(8, 5), (5, 8)], ids=["tall", "wide"])
def test_normal_takes_every_inner_solver(shape):
    rng = np.random.default_rng(5)
    a = rng.standard_normal(shape) + np.eye(*shape)
    b = rng.standard_normal(shape[0])
    y0 = rng.standard_normal(shape[1])
    expected = np.linalg.lstsq(a, b, rcond=None)[0]
    # From `y0`, the least-squares solution nearest to it: `y0`'s component in the
    # null space of `a` (none for the tall one) is kept.
    from_y0 = expected + (np.eye(shape[1]) - np.linalg.pinv(a) @ a) @ y0

    # Every inner solver in one compiled call; ours also from an initial estimate.
    @jax.jit
    def solve_all(a, b, y0):
        operator = lxd.MatrixLinearOperator(a)
        out = {}
        for name, inner in _NORMAL_INNER.items():
            sol = lx.linear_solve(operator, b, lxd.Normal(inner()), throw=False)
            out[name] = sol.value, sol.result
            if name.startswith("lxd."):
                solver, options = lxd.Normal(inner()), {"y0": y0}
                sol = lx.linear_solve(operator, b, solver, options=options, throw=False)
                out[f"{name}, y0"] = sol.value, sol.result
        return out

    solutions = solve_all(a, b, y0)
    assert len(solutions) == len(_NORMAL_INNER) + 5
    for name, (value, result) in solutions.items():
        assert result == lx.RESULTS.successful, name
        want = from_y0 if name.endswith("y0") else expected
        np.testing.assert_allclose(value, want, rtol=1e-8, atol=1e-8, err_msg=name)


def _stencil_2d(side: int):
    def mv(x):
        g = x.reshape(side, side)
        p = jnp.pad(g, 1)
        return (
            4.05 * g - (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:])
        ).ravel()

    return mv


def _conds(side: int, layout: str, update: str) -> int:
    """The conditionals in the lowered program of a jitted CG solve (in `layout`,
    with `residual_update=update`) of the stencil on a `side x side` grid."""
    n = side * side
    op = lxd.FunctionLinearOperator(
        _stencil_2d(side),
        jax.ShapeDtypeStruct((n,), jnp.float64),
        lx.positive_semidefinite_tag,
        policy=lxd.Lazy(),
    )
    solver = lxd.CG(1e-8, 1e-8, layout=layout, residual_update=update)
    solve = jax.jit(lambda b: lx.linear_solve(op, b, solver).value)
    return solve.lower(jnp.ones(n, jnp.float64)).as_text().count("stablehlo.case")


@pytest.mark.parametrize("update", ["cond", "select"])
@pytest.mark.parametrize("layout", ["one_site", "inline"])
@pytest.mark.parametrize("side", [16, 64])
def test_cg_residual_update_matches_lineax_at_every_size(side, layout, update):
    # CG updates its residual in a `lax.cond` (from 4096 unknowns XLA:CPU would
    # otherwise compute the `mv` again inside the update) or in one expression.
    # Both give lineax's steps and solution, under jit, vmap and grad.
    n = side * side
    mv = _stencil_2d(side)
    structure = jax.ShapeDtypeStruct((n,), jnp.float64)
    tag = lx.positive_semidefinite_tag
    ours = lxd.FunctionLinearOperator(mv, structure, tag, policy=lxd.Lazy())
    plain = lx.FunctionLinearOperator(mv, structure, tag)
    bs = jax.random.normal(jax.random.key(0), (2, n), jnp.float64)

    def solve(op, solver, b):
        sol = lx.linear_solve(op, b, solver, throw=False)
        return sol.value, sol.stats["num_steps"], sol.result._value

    cg = lxd.CG(1e-8, 1e-8, layout=layout, residual_update=update)
    ours_solve = jax.jit(lambda b: solve(ours, cg, b))
    plain_solve = jax.jit(lambda b: solve(plain, lx.CG(1e-8, 1e-8), b))
    conds = _conds(side, layout, update) - _conds(side, layout, "select")
    assert conds == (1 if update == "cond" else 0)
    y, steps, result = ours_solve(bs[0])
    y_plain, steps_plain, _ = plain_solve(bs[0])
    assert int(result) == 0
    assert abs(int(steps) - int(steps_plain)) <= 1
    np.testing.assert_allclose(y, y_plain, rtol=1e-6, atol=1e-8)
    ys, _, results = jax.jit(jax.vmap(lambda b: solve(ours, cg, b)))(bs)
    assert np.all(np.asarray(results) == 0)
    np.testing.assert_allclose(ys[0], y, rtol=1e-6, atol=1e-8)
    grad = jax.grad(lambda b: jnp.sum(solve(ours, cg, b)[0] ** 2))
    grad_plain = jax.grad(lambda b: jnp.sum(solve(plain, lx.CG(1e-8, 1e-8), b)[0] ** 2))
    np.testing.assert_allclose(
        jax.jit(grad)(bs[1]), jax.jit(grad_plain)(bs[1]), rtol=1e-5, atol=1e-8
    )
