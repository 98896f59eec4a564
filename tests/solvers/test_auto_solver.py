"""`AutoSolver`'s choices on Bratu's problem and on small operators: direct or
matrix-free by the memory budget (its own and the operator's policy's), the
operator's tags and whether the problem is well posed; as the `linear_solver` of
optimistix's Newton, with the choices `lxd.explain` reports."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
import pytest

import lineax_dispatch as lxd


TOL = dict(rtol=1e-10, atol=1e-10)  # of the linear solvers


def _bratu(u, lam):
    n = round(u.size**0.5)
    grid = jnp.pad(u.reshape(n, n), 1)
    lap = grid[:-2, 1:-1] + grid[2:, 1:-1] + grid[1:-1, :-2] + grid[1:-1, 2:]
    lap = (lap - 4 * grid[1:-1, 1:-1]) * (n + 1) ** 2
    return (-lap - lam * jnp.exp(grid[1:-1, 1:-1])).reshape(-1)


_PSD = frozenset({lx.symmetric_tag, lx.positive_semidefinite_tag})


def test_memory_budget_keeps_newton_matrix_free():
    """A budget below the dense Jacobian: `AutoSolver` picks CG and solves; a
    materialising policy reports the bytes it would need, naming the budget."""
    n = 12  # 144 unknowns: a 165,888-byte float64 Jacobian.
    budget = 100_000
    operator = lxd.JacobianLinearOperator(_bratu, jnp.zeros(n * n), 5.0, tags=_PSD)
    chosen, reasons = lxd.AutoSolver(memory_budget=budget).choose(operator)
    assert isinstance(chosen, lxd.CG)
    assert "over the budget" in reasons[0]

    def solve(linear_solver):
        solver = optx.Newton(rtol=1e-9, atol=1e-9, linear_solver=linear_solver)
        return optx.root_find(_bratu, solver, jnp.zeros(n * n), 5.0, tags=_PSD)

    sol = jax.jit(solve, static_argnums=0)(lxd.AutoSolver(**TOL, memory_budget=budget))
    reference = jax.jit(solve, static_argnums=0)(lx.AutoLinearSolver(well_posed=None))
    assert sol.result == optx.RESULTS.successful
    np.testing.assert_allclose(sol.value, reference.value, rtol=1e-8, atol=1e-10)
    over = lxd.PolicySolver(lx.LU(), lxd.Materialise(memory_budget=budget))
    with pytest.raises(ValueError, match="over the memory budget of its `Materialise`"):
        solve(over)


def test_auto_solver_factorises_small_and_iterates_on_large_stencils():
    small = lxd.JacobianLinearOperator(_bratu, jnp.zeros(8 * 8), 5.0, tags=_PSD)
    large = lxd.JacobianLinearOperator(_bratu, jnp.zeros(64 * 64), 5.0, tags=_PSD)
    solver = lxd.AutoSolver(memory_budget="4GB")
    assert isinstance(solver.select(small), lx.AutoLinearSolver)
    assert isinstance(solver.select(large), lxd.CG)
    nonsymmetric = lxd.JacobianLinearOperator(_bratu, jnp.zeros(64 * 64), 5.0)
    assert isinstance(solver.select(nonsymmetric), lxd.GMRES)


def test_auto_solver_choices_follow_what_the_direct_solver_needs():
    n = 40
    a = jnp.eye(n) + 0.01 * jnp.arange(n * n, dtype=jnp.float64).reshape(n, n) / n**2

    def fn(x):
        return a @ x

    structure = jax.ShapeDtypeStruct((n,), jnp.float64)
    # The operator's own budget counts too: no direct choice that `as_matrix`
    # would then refuse.
    small = lxd.FunctionLinearOperator(fn, structure, policy=lxd.Auto("10KB"))
    solver = lxd.AutoSolver(**TOL, memory_budget="1GB")
    assert isinstance(solver.select(small), lxd.GMRES)
    x = lx.linear_solve(small, jnp.ones(n), solver).value
    np.testing.assert_allclose(a @ x, jnp.ones(n), rtol=1e-8)
    # Not well posed: SVD when direct, LSMR when iterative, whatever the shape.
    big = lxd.FunctionLinearOperator(fn, structure)
    chosen, reasons = lxd.AutoSolver(well_posed=False).choose(big)
    assert isinstance(chosen, lx.AutoLinearSolver) and reasons[0].startswith("SVD")
    tiny = lxd.AutoSolver(well_posed=False, memory_budget=1000)
    assert isinstance(tiny.select(big), lxd.LSMR)
    # A diagonal needs only its diagonal, and a matrix's mvs are not free.
    diagonal = lxd.DiagonalLinearOperator(jnp.arange(1.0, 2001.0))
    assert isinstance(
        lxd.AutoSolver(memory_budget="1MB").select(diagonal), lx.AutoLinearSolver
    )
    _, reasons = lxd.AutoSolver().choose(lxd.MatrixLinearOperator(a))
    assert "from the operator's entries" in reasons[0]


def test_explain_reports_auto_solver_choices():
    def solve(lam, budget):
        linear_solver = lxd.AutoSolver(**TOL, memory_budget=budget)
        solver = optx.Newton(rtol=1e-9, atol=1e-9, linear_solver=linear_solver)
        u0 = jnp.zeros(16)
        return optx.root_find(_bratu, solver, u0, lam, tags=_PSD).value

    direct = lxd.explain(lambda lam: solve(lam, None), 5.0)
    assert [s.solver for s in direct.solves] == ["AutoLinearSolver"]
    assert "16x16 -> AutoLinearSolver: Cholesky" in str(direct)
    matrix_free = lxd.explain(lambda lam: solve(lam, 1000), 5.0)
    # AutoSolver's choice, then the layout that CG (`layout="auto"`) took.
    assert [s.solver for s in matrix_free.solves] == ["CG", "CG (one-site layout)"]
    assert "over the budget of 1 KB" in str(matrix_free)
    assert matrix_free.rows[0].operator == "FunctionLinearOperator"
