"""lineax-dispatch as the `linear_solver` of optimistix: Newton, Chord, GaussNewton,
Dogleg, LevenbergMarquardt, IndirectLevenbergMarquardt and ImplicitAdjoint. Each case
checks value, derivative (grad) and batch (vmap) in one jitted call against
optimistix's default linear solver's (computed once per nonlinear solver).
`AutoSolver`'s choices on Bratu's problem: tests/solvers/test_auto_solver.py."""

import functools as ft

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
import pytest

import lineax_dispatch as lxd


TOL = dict(rtol=1e-10, atol=1e-10)  # of the linear solvers


def root_fn(y, a):
    return jnp.tanh(y) + a * y + 0.1 * jnp.roll(y, 1) ** 2 - jnp.arange(1.0, 5.0) / 10


ROOT_TOL = dict(rtol=1e-9, atol=1e-9)
ROOT_MAX_STEPS = 64
A = jnp.array(2.0)
A_BATCH = jnp.array([1.5, 2.0, 3.0])


def residuals(p, data):
    x, y = data
    return p[0] * jnp.exp(-p[1] * x) + p[2] - y


# Exact data of two decays (the second for the batch): a zero-residual minimum,
# well separated from `P0` and well conditioned (cond(J) < 30), that every
# Gauss-Newton-type solver approaches quadratically or nearly so. With `LSQ_TOL`
# the termination test passes while the loss still falls by many orders of
# magnitude more than its rounding error; at rtol=atol=1e-10 (or with noisy data)
# the last steps of the trust-region solvers compare losses at their rounding
# level, and whether such a step is accepted (and the solve ends before
# `max_steps`) depends on the CPU's floating-point path.
X = jnp.linspace(0.0, 2.0, 12)
P_TRUE = jnp.array([[1.5, 0.7, 0.2], [1.2, 1.1, 0.4]])
Y, Y2 = (p[0] * jnp.exp(-p[1] * X) + p[2] for p in P_TRUE)
P0 = jnp.array([1.0, 1.0, 0.0])
LSQ_TOL = dict(rtol=1e-6, atol=1e-6)
LSQ_MAX_STEPS = 256
# Fits are compared (with each other and with `P_TRUE`) at 1e-6: the last step is
# under about 1e-6 and leaves an error of at most ~1e-8, so where exactly a solve
# stops does not matter.
LSQ_RTOL = 1e-6


ROOT_LINEAR_SOLVERS = {
    "AutoSolver": lambda: lxd.AutoSolver(**TOL),
    "AutoSolver-iterative": lambda: lxd.AutoSolver(**TOL, memory_budget=1),
    "LU+Auto": lambda: lxd.PolicySolver(lx.LU(), lxd.Auto()),
    "GMRES+Auto": lambda: lxd.PolicySolver(lxd.GMRES(**TOL), lxd.Auto()),
    "GMRES+Outline": lambda: lxd.PolicySolver(lxd.GMRES(**TOL), lxd.Outline()),
    "lineaxGMRES+Lazy": lambda: lxd.PolicySolver(lx.GMRES(**TOL), lxd.Lazy()),
    "LU+Materialise": lambda: lxd.PolicySolver(lx.LU(), lxd.Materialise(2)),
}

LSQ_LINEAR_SOLVERS = {
    "AutoSolver": lambda: lxd.AutoSolver(**TOL, well_posed=False),
    "AutoSolver-iterative": lambda: lxd.AutoSolver(
        **TOL, well_posed=False, memory_budget=1
    ),
    # `well_posed` left at its default, as a least-squares user writes it.
    "AutoSolver-default": lambda: lxd.AutoSolver(),
    "AutoSolver-default-iterative": lambda: lxd.AutoSolver(**TOL, memory_budget=1),
    "QR+Auto": lambda: lxd.PolicySolver(lx.QR(), lxd.Auto()),
    "Normal(CG)+Auto": lambda: lxd.PolicySolver(lxd.Normal(lxd.CG(**TOL)), lxd.Auto()),
}


def _root(solver_cls, linear_solver):
    kwargs = {} if linear_solver is None else dict(linear_solver=linear_solver)
    solver = solver_cls(**ROOT_TOL, **kwargs)

    def solve(a):
        return optx.root_find(
            root_fn, solver, jnp.zeros(4), a, max_steps=ROOT_MAX_STEPS
        ).value

    return solve


def _solution(sol):
    return sol.value, sol.stats["num_steps"], sol.result == optx.RESULTS.successful


def _root_checks(solver_cls, linear_solver):
    """At `A`: the root, steps taken, success and d(sum of the root)/da; and the
    roots over `A_BATCH`; in one compiled call."""
    kwargs = {} if linear_solver is None else dict(linear_solver=linear_solver)
    solver = solver_cls(**ROOT_TOL, **kwargs)

    def solve(a):
        sol = optx.root_find(root_fn, solver, jnp.zeros(4), a, max_steps=ROOT_MAX_STEPS)
        return _solution(sol)

    def summed(a):
        out = solve(a)
        return out[0].sum(), out

    @jax.jit
    def run(a, batch):
        grad, out = jax.grad(summed, has_aux=True)(a)
        return out, grad, jax.vmap(solve)(batch)

    return run(A, A_BATCH)


@ft.cache
def _root_reference(solver_cls):
    return _root_checks(solver_cls, None)


def _assert_converged(steps, success, max_steps):
    assert jnp.all(success)
    assert jnp.all(steps < max_steps // 5), steps


@pytest.mark.parametrize("solver_cls", [optx.Newton, optx.Chord])
@pytest.mark.parametrize("name", list(ROOT_LINEAR_SOLVERS))
def test_root_find(solver_cls, name):
    """The Newton and Chord iterates of two linear solvers differ by their linear
    solves' errors (1e-10) only: the roots agree to far below 1e-7."""
    ours = _root_checks(solver_cls, ROOT_LINEAR_SOLVERS[name]())
    (y, steps, success), grad, (ys, batch_steps, batch_success) = ours
    (y_ref, steps_ref, _), grad_ref, (ys_ref, batch_steps_ref, _) = _root_reference(
        solver_cls
    )
    for s, ok in [(steps, success), (batch_steps, batch_success)]:
        _assert_converged(s, ok, ROOT_MAX_STEPS)
    _assert_converged(jnp.append(batch_steps_ref, steps_ref), True, ROOT_MAX_STEPS)
    np.testing.assert_allclose(y, y_ref, rtol=1e-7)
    assert jnp.max(jnp.abs(root_fn(y, A))) < 1e-8
    np.testing.assert_allclose(grad, grad_ref, rtol=1e-6)
    np.testing.assert_allclose(ys, ys_ref, rtol=1e-7)


LSQ_SOLVERS = [
    optx.GaussNewton,
    optx.Dogleg,
    optx.LevenbergMarquardt,
    optx.IndirectLevenbergMarquardt,
]


def _lsq_checks(solver_cls, linear_solver):
    """For data `Y`: the fit, steps taken, success and d(fit)/dY; and the fits of
    `Y` and `Y2` batched; in one compiled call."""
    kwargs = {} if linear_solver is None else dict(linear_solver=linear_solver)
    solver = solver_cls(**LSQ_TOL, **kwargs)

    def fit(y):
        sol = optx.least_squares(residuals, solver, P0, (X, y), max_steps=LSQ_MAX_STEPS)
        return _solution(sol)

    def fit_and_aux(y):
        out = fit(y)
        return out[0], out

    @jax.jit
    def run(y, ys):
        jac, out = jax.jacrev(fit_and_aux, has_aux=True)(y)
        return out, jac, jax.vmap(fit)(ys)

    return run(Y, jnp.stack([Y, Y2]))


@ft.cache
def _lsq_reference(solver_cls):
    return _lsq_checks(solver_cls, None)


def _pinv_jacobian():
    """d(fit)/dY at a zero-residual minimum: the pseudoinverse of the residuals'
    Jacobian with respect to the parameters."""
    jac = jax.jacfwd(residuals)(P_TRUE[0], (X, Y))
    return np.linalg.pinv(np.asarray(jac))


@pytest.mark.parametrize("solver_cls", LSQ_SOLVERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", list(LSQ_LINEAR_SOLVERS))
def test_least_squares(solver_cls, name):
    ours = _lsq_checks(solver_cls, LSQ_LINEAR_SOLVERS[name]())
    (p, steps, success), jac, (ps, batch_steps, batch_success) = ours
    (p_ref, steps_ref, _), jac_ref, (ps_ref, batch_steps_ref, _) = _lsq_reference(
        solver_cls
    )
    # Both converge in well under `LSQ_MAX_STEPS`: 5 to 14 steps here, the same
    # with XLA's AVX-512, AVX2 or SSE4.2 code (`--xla_cpu_max_isa`).
    for s, ok in [(steps, success), (batch_steps, batch_success)]:
        _assert_converged(s, ok, LSQ_MAX_STEPS)
    _assert_converged(jnp.append(batch_steps_ref, steps_ref), True, LSQ_MAX_STEPS)
    np.testing.assert_allclose(p, p_ref, rtol=LSQ_RTOL)
    np.testing.assert_allclose(p, P_TRUE[0], rtol=LSQ_RTOL)
    np.testing.assert_allclose(jac, jac_ref, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(jac, _pinv_jacobian(), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(ps, ps_ref, rtol=LSQ_RTOL)
    np.testing.assert_allclose(ps, P_TRUE, rtol=LSQ_RTOL)


def _adjoint_solve(a, adjoint):
    solver = optx.Newton(**ROOT_TOL)
    return optx.root_find(root_fn, solver, jnp.zeros(4), a, adjoint=adjoint).value


def _adjoint_checks(adjoint):
    """At 2.5: the Jacobian of the root (reverse mode) and its tangent (forward
    mode); the gradients of its sum over [1.5, 2.5]; in one compiled call."""

    def solve(a):
        return _adjoint_solve(a, adjoint)

    @jax.jit
    def run(a, batch):
        jac = jax.jacrev(solve)(a)
        _, tangent = jax.jvp(solve, (a,), (jnp.ones(()),))
        grads = jax.vmap(jax.grad(lambda a: solve(a).sum()))(batch)
        return jac, tangent, grads

    return run(jnp.array(2.5), jnp.array([1.5, 2.5]))


@ft.cache
def _adjoint_reference():
    return _adjoint_checks(optx.ImplicitAdjoint())


@pytest.mark.parametrize(
    "linear_solver",
    [
        lxd.PolicySolver(lxd.GMRES(**TOL), lxd.Auto()),
        lxd.PolicySolver(lxd.GMRES(**TOL), lxd.Outline()),
        lxd.AutoSolver(**TOL),
        lxd.AutoSolver(**TOL, memory_budget=1),
    ],
    ids=["GMRES+Auto", "GMRES+Outline", "AutoSolver", "AutoSolver-iterative"],
)
def test_implicit_adjoint(linear_solver):
    jac, tangent, grads = _adjoint_checks(optx.ImplicitAdjoint(linear_solver))
    expected, _, expected_grads = _adjoint_reference()
    np.testing.assert_allclose(jac, expected, rtol=1e-7)
    # Forward mode goes through the same linear solver.
    np.testing.assert_allclose(tangent, expected, rtol=1e-7)
    # And a batch of gradients.
    np.testing.assert_allclose(grads, expected_grads, rtol=1e-7)


def test_implicit_adjoint_of_least_squares():
    """GaussNewton's implicit adjoint with a matrix-free normal-equations solver."""

    def fit(y, adjoint):
        solver = optx.GaussNewton(**LSQ_TOL)
        return optx.least_squares(residuals, solver, P0, (X, y), adjoint=adjoint).value

    lsq = lxd.PolicySolver(lxd.Normal(lxd.CG(**TOL)), lxd.Auto())
    ours = jax.jit(jax.jacrev(lambda y: fit(y, optx.ImplicitAdjoint(lsq))))(Y)
    expected = jax.jit(jax.jacrev(lambda y: fit(y, optx.ImplicitAdjoint())))(Y)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(ours, _pinv_jacobian(), rtol=1e-5, atol=1e-8)


def test_chord_keeps_a_linearised_operator_in_its_state():
    """Chord stores the linear solver's state (which holds a closure-converted
    operator) in its own state; `PolicySolver` keeps only arrays there, so even
    lineax's GMRES works under jit and grad."""
    solve = _root(optx.Chord, lxd.PolicySolver(lx.GMRES(**TOL), lxd.Auto()))
    (expected, _, _), expected_grad, _ = _root_reference(optx.Chord)
    np.testing.assert_allclose(jax.jit(solve)(A), expected, rtol=1e-7)
    # Under `checking_leaks`, lowering the gradient of optimistix's Chord reports a
    # leak with its default linear solver too (an error inside jax's report), so
    # the leak check covers the forward solve.
    with jax.checking_leaks():
        jax.jit(solve).lower(A)
    grad = jax.jit(jax.grad(lambda a: solve(a).sum()))(A)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-6)


def test_states_of_different_operators_stay_different():
    """The arrays-only state keeps each operator's function apart (in its static
    part): a state made by one jit and solved in another uses its own operator,
    and a `cond` between two operators' states is refused, not mixed up."""
    solver = lxd.PolicySolver(lx.GMRES(**TOL), lxd.Lazy())
    structure = jax.ShapeDtypeStruct((3,), jnp.float64)

    def operator(a, double):
        fn = (lambda x: a * (x + x)) if double else (lambda x: a * x)
        return lx.linearise(lx.FunctionLinearOperator(fn, structure))

    init = jax.jit(
        lambda a, double: solver.init(operator(a, double), {}), static_argnums=1
    )
    compute = jax.jit(lambda state, b: solver.compute(state, b, {})[0])
    b = jnp.ones(3)
    np.testing.assert_allclose(compute(init(2.0, False), b), b / 2)
    np.testing.assert_allclose(compute(init(2.0, True), b), b / 4)

    def both(a, pick_first):
        return jax.lax.cond(
            pick_first,
            lambda: solver.init(operator(a, False), {}),
            lambda: solver.init(operator(a, True), {}),
        )

    with pytest.raises(TypeError, match="pytree"):
        jax.jit(both)(2.0, False)
