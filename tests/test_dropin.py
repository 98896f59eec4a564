"""The drop-in promises: `lxd.jit` takes operators as arguments, `Outline` is never
stale, reflected operator arithmetic keeps the policy, integer vectors as lineax,
strict dtype and rank promotion, and the default policy behaves as lineax."""

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
    STRUCTURE as _STRUCTURE,
)


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


def test_lxd_jit_static_arguments_by_name_position_and_negative_index():
    # A static array is part of the key (its value shapes the program); names and
    # positions are read once per function, for each number of positional
    # arguments a call passes (`-1` is the last one passed).
    traces = []

    def f(x, power, scale=1.0):
        traces.append(1)
        return scale * x ** int(power.sum())

    x = jnp.arange(1.0, 4.0)
    by_name = lxd.jit(f, static_argnames="power")
    two, three = np.array([1, 1]), np.array([1, 2])
    np.testing.assert_allclose(by_name(x, two), x**2)
    np.testing.assert_allclose(by_name(x, power=three), x**3)
    np.testing.assert_allclose(by_name(x, two, 2.0), 2 * x**2)  # positional `power`
    before = len(traces)
    np.testing.assert_allclose(by_name(x, two), x**2)  # the same static value
    assert len(traces) == before

    traced = lxd.jit(
        lambda *args: tuple(isinstance(a, jax.core.Tracer) for a in args),
        static_argnums=-1,
    )
    y = jnp.ones(2)
    assert traced(y, y) == (True, False)
    assert traced(y, y, y) == (True, True, False)
    assert traced(y, y) == (True, False)


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


def test_default_policy_is_auto_and_runs_as_lineax():
    """An operator without `policy=` carries `Auto()` (composites too) and gives
    lineax's results: eagerly through one compiled `mv`, and under a plain
    `jax.jit`, where each call site is decided alone (inline on the CPU, as
    lineax)."""
    traces = []

    def fn(x):
        traces.append(1)
        return 2.0 * x

    operator = lxd.FunctionLinearOperator(fn, _STRUCTURE, closure_convert=False)
    assert operator.policy == lxd.Auto()
    assert lxd.MatrixLinearOperator(jnp.eye(2)).policy == lxd.Auto()
    assert (operator + operator).policy == lxd.Auto()
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
