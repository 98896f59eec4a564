"""Reliability: no silent wrong answers (non-finite operators and tolerances), the
memory guard on every path that builds a dense matrix, eager batch calls compiled
once, and clear errors for bad input."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd

from .helpers.small_operators import (
    function_operator as _function_operator,
    matrix as _matrix,
    N,
    PSD as _PSD,
)


# 1. Non-finite operators and tolerances.

_ITERATIVE = {
    "CG": lambda: lxd.CG(rtol=1e-8, atol=1e-8),
    "CG-inline": lambda: lxd.CG(rtol=1e-8, atol=1e-8, layout="inline"),
    "MINRES": lambda: lxd.MINRES(rtol=1e-8, atol=1e-8),
    "GMRES": lambda: lxd.GMRES(rtol=1e-8, atol=1e-8),
    "BiCGStab": lambda: lxd.BiCGStab(rtol=1e-8, atol=1e-8),
    "LSMR": lambda: lxd.LSMR(rtol=1e-8, atol=1e-8),
    "Normal(CG)": lambda: lxd.Normal(lxd.CG(rtol=1e-8, atol=1e-8)),
    "AutoSolver-iterative": lambda: lxd.AutoSolver(1e-8, 1e-8, memory_budget=1),
}


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("name", list(_ITERATIVE))
def test_non_finite_operator_is_never_a_success(name, bad):
    b = jnp.ones(N)
    for operator in (
        lxd.MatrixLinearOperator(_matrix(bad), _PSD),
        _function_operator(_matrix(bad)),
    ):
        sol = lx.linear_solve(operator, b, _ITERATIVE[name](), throw=False)
        assert sol.result != lx.RESULTS.successful
        with pytest.raises(Exception, match="non-finite"):
            lx.linear_solve(operator, b, _ITERATIVE[name]()).value.block_until_ready()
    # CG and MINRES stop at once (every comparison with NaN is false): the code is
    # the one for non-finite input, as lineax's.
    if name in ("CG", "CG-inline", "MINRES", "AutoSolver-iterative"):
        assert sol.result == lx.RESULTS.nonfinite_input


@pytest.mark.parametrize("cls", [lxd.CG, lxd.GMRES, lxd.BiCGStab, lxd.MINRES, lxd.LSMR])
@pytest.mark.parametrize("field", ["rtol", "atol"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "1e-6", None])
def test_bad_tolerance_is_an_error_at_construction(cls, field, value):
    kwargs = dict(rtol=1e-6, atol=1e-6)
    kwargs[field] = value
    with pytest.raises(
        ValueError, match=f"{cls.__name__}\\(\\.\\.\\., {field}=\\.\\.\\.\\)"
    ):
        cls(**kwargs)


def test_bad_norm_and_auto_solver_tolerance():
    with pytest.raises(ValueError, match="norm"):
        lxd.CG(1e-6, 1e-6, norm="max")
    with pytest.raises(ValueError, match="AutoSolver\\(\\.\\.\\., rtol"):
        lxd.AutoSolver(rtol=float("nan"))
    # NumPy numbers are numbers.
    lxd.CG(np.float32(1e-6), np.float64(1e-6), max_steps=np.int64(10))


# 2. The memory guard on every path that builds a dense matrix.

_BUDGET = "1KB"  # a 4x4 float64 matrix is 128 bytes, a 16x16 one 2 KB


def _big_operator(policy):
    a = 3.0 * jnp.eye(16) + 0.01
    structure = jax.ShapeDtypeStruct((16,), jnp.float64)
    return lxd.FunctionLinearOperator(lambda x: a @ x, structure, _PSD, policy=policy)


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_batch_solve_direct_checks_the_budget_in_force(batch):
    bs = jnp.ones((batch, 16))
    operator = _big_operator(lxd.Lazy())
    with pytest.raises(ValueError, match="over the memory budget of its `Auto`"):
        lxd.batch_solve(operator, bs, lx.LU(), policy=lxd.Auto(_BUDGET))
    with pytest.raises(ValueError, match="over the memory budget of its `Materialise`"):
        lxd.batch_solve(
            _big_operator(lxd.Materialise(memory_budget=_BUDGET)), bs, lx.LU()
        )
    # The same solve under an ample budget works.
    sol = lxd.batch_solve(operator, bs, lx.LU(), policy=lxd.Auto("1MB"))
    assert sol.value.shape == (batch, 16)


def test_every_dense_path_checks_the_budget():
    materialise = _big_operator(lxd.Materialise(memory_budget=_BUDGET))
    auto = _big_operator(lxd.Auto(_BUDGET))
    x = jnp.ones(16)
    message = "over the memory budget of its"
    for call in (
        lambda: materialise.mv(x),
        lambda: lxd.batch_mv(materialise, jnp.ones((3, 16))),
        lambda: lxd.batch_mv(materialise, jnp.ones((20, 16))),
        lambda: lxd.materialise(materialise),
        lambda: lxd.materialise(auto),
        lambda: lxd.dense_matrix(materialise),
        lambda: lxd.dense_matrix(auto),
        lambda: materialise.as_matrix(),
        lambda: lx.linear_solve(auto, x, lx.LU()),
        lambda: jax.jit(lambda v: lxd.batch_mv(materialise, v))(jnp.ones((3, 16))),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    # Under a policy without a budget, the same paths build the matrix.
    lazy = _big_operator(lxd.Lazy())
    assert lxd.dense_matrix(lazy).shape == (16, 16)
    assert isinstance(lxd.materialise(lazy), lxd.PyTreeLinearOperator)


# 3. Eager batch calls: one state, compiled once.


def test_progress_keeps_one_solver_state():
    operator = _big_operator(lxd.Lazy())
    bs = jnp.ones((48, 16))
    sol = lxd.batch_solve(operator, bs, lx.LU(), batch_size=16, progress=True)
    reference = lxd.batch_solve(operator, bs, lx.LU())
    assert jax.tree_util.tree_structure(sol.state) == jax.tree_util.tree_structure(
        reference.state
    )
    for got, want in zip(
        jax.tree_util.tree_leaves(sol.state), jax.tree_util.tree_leaves(reference.state)
    ):
        assert got.shape == want.shape
    # The state can be reused.
    again = lx.linear_solve(operator, bs[0], lx.LU(), state=sol.state)
    np.testing.assert_allclose(again.value, sol.value[0], rtol=1e-12)
    np.testing.assert_allclose(sol.value, reference.value, rtol=1e-12)


@pytest.mark.parametrize(
    "policy, kwargs",
    [
        (lxd.Lazy(), dict(progress=True, batch_size=16)),
        (lxd.Lazy(), dict(batch_size=4)),
        (lxd.Lazy(), dict(policy=lxd.Scan())),
        (lxd.Materialise(4), {}),
    ],
    ids=["progress", "batch_size", "Scan", "Materialise-chunked"],
)
def test_eager_batch_calls_compile_once(policy, kwargs):
    """A second eager call with the same operator and shapes runs the compiled
    chunk function: the user's function is not traced again."""
    traces = []
    a = 3.0 * jnp.eye(16) + 0.01

    def fn(x):
        traces.append(1)
        return a @ x

    structure = jax.ShapeDtypeStruct((16,), jnp.float64)
    operator = lxd.FunctionLinearOperator(
        fn, structure, _PSD, closure_convert=False, policy=policy
    )
    bs = jnp.ones((48, 16))
    solver = lxd.CG(rtol=1e-8, atol=1e-8)
    first = lxd.batch_solve(operator, bs, solver, **kwargs).value
    count = len(traces)
    assert count >= 1
    second = lxd.batch_solve(operator, 2 * bs, solver, **kwargs).value
    assert len(traces) == count
    np.testing.assert_allclose(second, 2 * first, rtol=1e-7)
    lxd.batch_mv(operator, bs)
    count = len(traces)
    lxd.batch_mv(operator, 2 * bs)
    assert len(traces) == count


# 6. Validation.


@pytest.mark.parametrize("value", ["0.5", 0.5, float("nan"), float("inf"), "1e-3"])
def test_budgets_below_a_byte_are_errors(value):
    for make in (lxd.Auto, lambda b: lxd.Materialise(memory_budget=b)):
        with pytest.raises(ValueError, match="memory_budget"):
            make(value)


def test_numpy_integers_are_accepted():
    assert lxd.Auto(np.int64(1000)).memory_budget == 1000
    assert lxd.Materialise(np.int64(3), np.int64(1000)) == lxd.Materialise(3, 1000)
    assert lxd.VmapBatch(np.int32(4)).batch_size == 4
    assert isinstance(lxd.VmapBatch(np.int32(4)).batch_size, int)
    # A budget is compared by value, whatever its spelling.
    assert lxd.Materialise(memory_budget="2GB") == lxd.Materialise(memory_budget=2e9)
    operator = _big_operator(lxd.Lazy())
    sol = lxd.batch_solve(operator, jnp.ones((5, 16)), lx.LU(), batch_size=np.int64(2))
    assert sol.value.shape == (5, 16)


@pytest.mark.parametrize(
    "field", ["bytes_per_second", "flops_per_second", "cache_bytes_per_second"]
)
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_cost_model_rates_must_be_positive(field, value):
    with pytest.raises(ValueError, match=f"CostModel\\({field}"):
        lxd.CostModel(**{field: value})


def test_cost_model_cache_bytes_may_be_zero_not_negative():
    assert lxd.CostModel(cache_bytes=0).cache_bytes == 0
    with pytest.raises(ValueError, match="CostModel\\(cache_bytes"):
        lxd.CostModel(cache_bytes=-1)


def test_batch_api_argument_errors():
    operator = _big_operator(lxd.Lazy())
    bs = jnp.ones((2, 16))
    with pytest.raises(TypeError, match="`operator` of `lxd.batch_solve`"):
        lxd.batch_solve(jnp.eye(16), bs)
    with pytest.raises(TypeError, match="`operator` of `lxd.batch_mv`"):
        lxd.batch_mv(jnp.eye(16), bs)
    with pytest.raises(TypeError, match="`solver` of `lxd.batch_solve`"):
        lxd.batch_solve(operator, bs, "LU")
    with pytest.raises(TypeError, match="policy"):
        lxd.batch_mv(operator, bs, policy="Lazy")
    # One device is a meaningful mesh.
    sol = lxd.batch_solve(operator, bs, lx.LU(), mesh=jax.devices()[0])
    np.testing.assert_allclose(sol.value, lxd.batch_solve(operator, bs, lx.LU()).value)
    with pytest.raises(ValueError, match="`mesh`"):
        lxd.batch_solve(operator, bs, lx.LU(), mesh=3)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_bicgstab_solves_an_exact_one_step_system(dtype):
    """`b` an eigenvector of A: the first half-step solves the system exactly
    (s = 0, so t = A s = 0, and omega = 0/0 gave NaN marked not successful). An
    exact solve is a success, as `optx.root_find` with Newton and BiCGStab needs
    on such a Jacobian."""
    n = 4
    b = jnp.ones(n, dtype)
    for operator in (
        lxd.MatrixLinearOperator(2 * jnp.eye(n, dtype=dtype)),
        lxd.FunctionLinearOperator(lambda x: 2 * x, jax.ShapeDtypeStruct((n,), dtype)),
    ):
        solution = lx.linear_solve(operator, b, lxd.BiCGStab(1e-6, 1e-6), throw=False)
        assert solution.result == lx.RESULTS.successful
        np.testing.assert_allclose(solution.value, 0.5 * np.ones(n), rtol=1e-6)
    # Singular on s (A s = 0 with s != 0): a breakdown, not a success.
    singular = lxd.MatrixLinearOperator(jnp.diag(jnp.array([1.0, 0.0], dtype)))
    solution = lx.linear_solve(
        singular, jnp.ones(2, dtype), lxd.BiCGStab(1e-6, 1e-6), throw=False
    )
    assert solution.result != lx.RESULTS.successful


def test_lsmr_with_no_steps_is_not_a_success():
    """`LSMR(max_steps=0)` takes no step: the initial guess, `max_steps_reached`
    and 0 steps (lineax, whose bug ours had copied, takes one and reports the
    non-solution as a success); a right-hand side the guess already solves is a
    success."""
    matrix = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]])
    operator = lxd.MatrixLinearOperator(matrix)
    solver = lxd.LSMR(1e-6, 1e-6, max_steps=0)
    b = jnp.array([1.0, 2.0, 3.0])
    solution = lx.linear_solve(operator, b, solver, throw=False)
    assert solution.result == lx.RESULTS.max_steps_reached
    assert int(solution.stats["num_steps"]) == 0
    np.testing.assert_allclose(solution.value, 0.0)
    solved = lx.linear_solve(operator, jnp.zeros(3), solver, throw=False)
    assert solved.result == lx.RESULTS.successful
    # One step allowed: lineax's count, one step.
    one = lx.linear_solve(operator, b, lxd.LSMR(1e-6, 1e-6, max_steps=1), throw=False)
    assert int(one.stats["num_steps"]) == 1


def test_batch_mv_casts_an_integer_stack_as_mv_casts_a_vector():
    matrix = jnp.arange(9.0).reshape(3, 3)
    operator = lxd.MatrixLinearOperator(matrix)
    stack = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
    got = lxd.batch_mv(operator, stack)
    assert got.dtype == matrix.dtype
    expected = jnp.stack([operator.mv(v) for v in stack])
    np.testing.assert_allclose(got, expected)
    with pytest.raises(ValueError, match="vectors"):
        lxd.batch_mv(operator, jnp.ones((2, 3), jnp.complex64))
