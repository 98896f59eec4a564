"""Reliability: no silent wrong answers, the memory guard on every path that builds a
dense matrix, eager batch calls compiled once, `lxd.jit` taking operators, Outline
never stale, clear errors for bad input, and the drop-in promises (reflected
operator arithmetic, integer vectors, strict dtype promotion)."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd


N = 4
_STRUCTURE = jax.ShapeDtypeStruct((N,), jnp.float64)
_PSD = (lx.positive_semidefinite_tag, lx.symmetric_tag)


def _matrix(bad=None):
    a = 3.0 * jnp.eye(N) + 0.1
    return a if bad is None else a.at[1, 1].set(bad)


def _function_operator(a, policy=None, tags=_PSD):
    return lxd.FunctionLinearOperator(
        lambda x: a @ x, _STRUCTURE, tags, policy=policy or lxd.Lazy()
    )


# 1. Non-finite operators and tolerances.

_ITERATIVE = {
    "CG": lambda: lxd.CG(rtol=1e-8, atol=1e-8),
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
    if name in ("CG", "MINRES", "AutoSolver-iterative"):
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


# 4. `lxd.jit` takes operators (arrays traced, the rest static).


def test_lxd_jit_takes_operators_as_arguments():
    traces = []
    a = jnp.arange(1.0, N + 1.0)

    def fn(x):
        traces.append(1)
        return a * x

    operator = lxd.FunctionLinearOperator(
        fn, _STRUCTURE, closure_convert=False, policy=lxd.Auto()
    )
    v = jnp.ones(N)
    f = lxd.jit(lambda o, v: o.mv(v))
    np.testing.assert_allclose(f(operator, v), a)
    np.testing.assert_allclose(f(operator, 2 * v), 2 * a)
    # Operators with other arrays, the same function: the same compiled program.
    other = lxd.MatrixLinearOperator(jnp.diag(a), policy=lxd.Auto())
    g = lxd.jit(lambda o, v: o.mv(v))
    np.testing.assert_allclose(g(other, v), a)
    np.testing.assert_allclose(
        g(lxd.MatrixLinearOperator(jnp.diag(2 * a), policy=lxd.Auto()), v), 2 * a
    )
    np.testing.assert_allclose(
        lxd.jit(lambda o, v: o.mv(v), static_argnums=0)(operator, v), a
    )

    @lxd.jit(static_argnames="k")
    def scaled(o, v, k):
        return k * o.mv(v), "a string", o

    value, text, same = scaled(operator, v, k=3)
    np.testing.assert_allclose(value, 3 * a)
    assert text == "a string" and isinstance(same, lxd.FunctionLinearOperator)
    grad = jax.grad(lambda x: lxd.jit(lambda o, v: o.mv(v).sum())(operator, x))(v)
    np.testing.assert_allclose(grad, a)
    batched = jax.vmap(lambda x: f(operator, x))(jnp.ones((3, N)))
    np.testing.assert_allclose(batched, jnp.broadcast_to(a, (3, N)))
    donated = lxd.jit(lambda x, y: x + y, donate_argnums=0)
    np.testing.assert_allclose(donated(jnp.ones(3), jnp.ones(3)), 2 * jnp.ones(3))
    with pytest.raises(TypeError, match="jax.jit"):
        lxd.jit(lambda x: x, not_a_jit_keyword=1)


# 5. Outline: never stale.


@pytest.mark.parametrize("closure_convert", [True, False])
def test_outline_sees_changed_python_state(closure_convert):
    state = {"scale": 1.0}

    def fn(x):
        return state["scale"] * x

    x = jnp.ones(N)
    results = {}
    for scale in (1.0, 5.0):
        state["scale"] = scale
        for policy in (lxd.Lazy(), lxd.Outline()):
            operator = lxd.FunctionLinearOperator(
                fn, _STRUCTURE, closure_convert=closure_convert, policy=policy
            )
            results[scale, type(policy).__name__] = jax.jit(lambda v: operator.mv(v))(x)
        plain = lx.FunctionLinearOperator(
            fn, _STRUCTURE, closure_convert=closure_convert
        )
        results[scale, "lineax"] = jax.jit(lambda v: plain.mv(v))(x)
    for key, value in results.items():
        np.testing.assert_allclose(value, key[0] * x, err_msg=str(key))


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


@pytest.mark.parametrize("field", ["bytes_per_second", "flops_per_second"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_cost_model_rates_must_be_positive(field, value):
    with pytest.raises(ValueError, match=f"CostModel\\({field}"):
        lxd.CostModel(**{field: value})


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


# 7. Drop-in.


def test_reflected_arithmetic_keeps_the_policy():
    ours = lxd.MatrixLinearOperator(_matrix(), policy=lxd.Outline())
    plain = lx.MatrixLinearOperator(_matrix())
    for result in (
        plain + ours,
        ours + plain,
        plain - ours,
        plain @ ours,
        ours @ plain,
    ):
        assert isinstance(result, lxd.AbstractDispatchOperator), type(result)
        assert result.policy == lxd.Outline()
    x = jnp.arange(1.0, N + 1.0)
    np.testing.assert_allclose((plain - ours).mv(x), jnp.zeros(N), atol=1e-12)
    np.testing.assert_allclose((plain @ ours).mv(x), _matrix() @ (_matrix() @ x))
    # Python asks the right operand first only when its class subclasses the left
    # operand's: another lineax class on the left makes lineax's plain sum, in
    # which our operand still applies its own policy.
    mixed = lx.DiagonalLinearOperator(jnp.ones(N)) + ours
    assert type(mixed) is lx.AddLinearOperator
    assert mixed.operator2.policy == lxd.Outline()
    np.testing.assert_allclose(mixed.mv(x), x + _matrix() @ x)


@pytest.mark.parametrize("policy", [lxd.Lazy(), lxd.Auto(), lxd.Outline()])
def test_integer_vectors_are_accepted_as_lineax_does(policy):
    operator = lxd.MatrixLinearOperator(_matrix(), policy=policy)
    plain = lx.MatrixLinearOperator(_matrix())
    v = jnp.arange(N)
    np.testing.assert_allclose(jax.jit(lambda v: operator.mv(v))(v), plain.mv(v))
    function = _function_operator(_matrix(), policy)
    np.testing.assert_allclose(jax.jit(lambda v: function.mv(v))(v), plain.mv(v))
    # A vector of the wrong shape, or of a type that cannot be cast safely, is
    # still an error.
    with pytest.raises(ValueError, match="vector"):
        operator.mv(jnp.ones(N + 1))
    with pytest.raises(ValueError, match="vector"):
        operator.mv(jnp.ones(N, jnp.complex128))


_POLICIES = [
    lxd.Lazy(),
    lxd.Auto(),
    lxd.Outline(),
    lxd.Materialise(),
    lxd.Materialise(2),
    lxd.VmapBatch(2),
    lxd.Scan(),
]


@pytest.mark.parametrize("policy", _POLICIES, ids=lambda p: type(p).__name__)
def test_strict_promotion(policy, strict_promotion):
    assert jax.config.jax_numpy_dtype_promotion == "strict"
    assert jax.config.jax_numpy_rank_promotion == "raise"
    s32 = jax.ShapeDtypeStruct((3,), jnp.float32)
    s64 = jax.ShapeDtypeStruct((3,), jnp.float64)
    identity = lxd.IdentityLinearOperator(s32, s64, policy=policy)
    out = identity.mv(jnp.ones(3, jnp.float32))
    assert out.dtype == jnp.float64
    assert jax.jit(lambda v: identity.mv(v))(jnp.ones(3, jnp.float32)).dtype == (
        jnp.float64
    )
    a = jnp.array([[4.0, 1.0, 0.0], [1.0, 3.0, 0.5], [0.0, 0.5, 2.0]])
    function = lxd.FunctionLinearOperator(lambda x: a @ x, s64, _PSD, policy=policy)
    b = jnp.ones(3)
    expected = jnp.linalg.solve(a, b)
    for solver in (lxd.CG(1e-10, 1e-10), lxd.GMRES(1e-10, 1e-10), lx.LU()):
        value = jax.jit(lambda b: lx.linear_solve(function, b, solver).value)(b)
        np.testing.assert_allclose(value, expected, rtol=1e-8)
    stack = jnp.stack([b, 2 * b])
    np.testing.assert_allclose(lxd.batch_mv(function, stack), stack @ a.T)
    np.testing.assert_allclose(
        lxd.batch_solve(function, stack, lxd.CG(1e-10, 1e-10)).value,
        jnp.stack([expected, 2 * expected]),
        rtol=1e-8,
    )
    np.testing.assert_allclose(jax.jit(lambda v: function.T.mv(v))(b), a.T @ b)


# 9. The default policy.


def test_default_policy_is_lazy_and_runs_as_lineax():
    """Until program-level dispatch lands, an operator without `policy=` behaves as
    lineax's: the same results, eagerly and under `jax.jit`."""
    traces = []

    def fn(x):
        traces.append(1)
        return 2.0 * x

    operator = lxd.FunctionLinearOperator(fn, _STRUCTURE, closure_convert=False)
    assert operator.policy == lxd.Lazy()
    assert lxd.MatrixLinearOperator(jnp.eye(2)).policy == lxd.Lazy()
    assert (operator + operator).policy == lxd.Lazy()
    plain = lx.FunctionLinearOperator(fn, _STRUCTURE, closure_convert=False)
    x = jnp.arange(1.0, N + 1.0)
    traces.clear()
    for scale in (1.0, 2.0, 3.0):
        np.testing.assert_allclose(operator.mv(scale * x), plain.mv(scale * x))
    # lineax dispatches the function op by op at each eager call (3 runs); ours
    # runs one compiled `mv`, traced once.
    assert len(traces) == 3 + 1
    traces.clear()
    jitted = jax.jit(lambda v: operator.mv(v) + operator.mv(2 * v))(x)
    np.testing.assert_allclose(
        jitted, jax.jit(lambda v: plain.mv(v) + plain.mv(2 * v))(x)
    )
