"""Issue 34, item 2: every path that builds the dense matrix of one of our operators
checks the memory budget of its policy, whichever package's function was called
(`lx.materialise`, `lx.diagonal`, `lxd.diagonal`, `as_matrix`...); the diagonal of
a matrix-free operator is built a chunk of basis vectors at a time where only it
fits; `lx.linearise` keeps our operator type and policy."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd


N = 256
# The 256x256 float32 matrix is 262 KB; one basis vector and its image 2 KB.
BUDGET = "16KB"
MESSAGE = "over the memory budget of its"
STRUCTURE = jax.ShapeDtypeStruct((N,), jnp.float32)


def _fn(x):
    # Not diagonal, not tridiagonal: lineax would materialise it for its diagonal.
    return 2.0 * x - 0.5 * jnp.roll(x, 3)


def _jac_fn(x, args):
    return jnp.sin(x) * args + jnp.roll(x, 3)


def _x0(n=N, dtype=jnp.float32):
    return jnp.linspace(0.1, 0.9, n).astype(dtype)


POLICIES = {
    "materialise": lambda b: lxd.Materialise(memory_budget=b),
    "materialise-chunked": lambda b: lxd.Materialise(batch_size=4, memory_budget=b),
    "auto": lambda b: lxd.Auto(b),
}


def _function(policy, n=N, dtype=jnp.float32):
    structure = jax.ShapeDtypeStruct((n,), dtype)
    return lxd.FunctionLinearOperator(_fn, structure, policy=policy)


def _jacobian(policy, n=N, dtype=jnp.float32, jac=None):
    return lxd.JacobianLinearOperator(
        _jac_fn, _x0(n, dtype), jnp.asarray(2.0, dtype), jac=jac, policy=policy
    )


def _temporaries(f) -> int | None:
    """Bytes of temporaries of `f` compiled, or `None` where the backend does not
    say."""
    analysis = jax.jit(f).lower().compile().memory_analysis()
    return None if analysis is None else analysis.temp_size_in_bytes


def _expected_diagonal(n=N, dtype=jnp.float32):
    plain = lx.FunctionLinearOperator(_fn, jax.ShapeDtypeStruct((n,), dtype))
    return lx.diagonal(plain)


# 1. The operators of the issue: n = 4096 float32 under a 1 MB budget.


@pytest.mark.parametrize("make", [POLICIES["materialise"], POLICIES["auto"]])
def test_issue_operator(make):
    op = _function(make("1MB"), n=4096)
    for call in (
        lambda: lx.materialise(op),
        lambda: lx.materialise(op).as_matrix(),
        lambda: lxd.materialise(op),
        lambda: op.as_matrix(),
        lambda: lx.tridiagonal(op),
    ):
        with pytest.raises(ValueError, match=MESSAGE):
            jax.eval_shape(call)
    # Only the diagonal is built: it fits, under either package's function.
    expected = _expected_diagonal(4096)
    for diagonal in (lx.diagonal, lxd.diagonal):
        np.testing.assert_allclose(jax.jit(lambda: diagonal(op))(), expected)
        temporaries = _temporaries(lambda: diagonal(op))
        if temporaries is not None:
            assert temporaries <= 10**6


# 2. Every dense path raises, at trace time, naming what it needs and the budget.


def _dense_paths(op):
    return {
        "lx.materialise": lambda: lx.materialise(op),
        "lxd.materialise": lambda: lxd.materialise(op),
        "lx.materialise.as_matrix": lambda: lx.materialise(op).as_matrix(),
        "as_matrix": lambda: op.as_matrix(),
        "lx.tridiagonal": lambda: lx.tridiagonal(op),
        "lxd.tridiagonal": lambda: lxd.tridiagonal(op),
    }


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("kind", ["function", "jacobian-fwd", "jacobian-bwd"])
def test_dense_paths_raise_at_trace_time(kind, policy):
    p = POLICIES[policy](BUDGET)
    op = _function(p) if kind == "function" else _jacobian(p, jac=kind[-3:])
    for name, call in _dense_paths(op).items():
        with pytest.raises(ValueError, match=MESSAGE) as info:
            jax.eval_shape(call)
        message = str(info.value)
        assert "`operator" in message, name
        assert f"{type(p).__name__}` policy: 16 KB" in message, name
        assert "256x256" in message, name


def _composite(kind, first, second, policy):
    """The composite `kind` of `first` (and `second`, for a sum or product)."""
    return {
        "tagged": lambda: lxd.TaggedLinearOperator(
            first, lx.symmetric_tag, policy=policy
        ),
        "mul": lambda: first * 2.0,
        "neg": lambda: -first,
        "div": lambda: first / 2.0,
        "add": lambda: first + second,
        "composed": lambda: first @ second,
    }[kind]()


@pytest.mark.parametrize("kind", ["tagged", "mul", "neg", "div", "add", "composed"])
def test_composites_check_the_budget(kind):
    p = lxd.Materialise(memory_budget=BUDGET)
    op = _composite(kind, _function(p), _function(p), p)
    for call in _dense_paths(op).values():
        with pytest.raises(ValueError, match=MESSAGE):
            jax.eval_shape(call)


def test_composite_budget_guards_children_without_one():
    """A composite's budget guards the dense matrices of its operands, ours under
    `Lazy` and plain lineax ones alike."""
    p = lxd.Materialise(memory_budget=BUDGET)
    ours = _function(lxd.Lazy())
    plain = lx.FunctionLinearOperator(_fn, STRUCTURE)
    for op in (
        lxd.AddLinearOperator(ours, ours, policy=p),
        lxd.AddLinearOperator(plain, plain, policy=p),
        lxd.MulLinearOperator(plain, 2.0, policy=p),
        lxd.ComposedLinearOperator(plain, ours, policy=p),
    ):
        with pytest.raises(ValueError, match=MESSAGE):
            jax.eval_shape(lambda: lx.materialise(op))
    # Without a budget anywhere, they build as lineax does.
    lazy = lxd.AddLinearOperator(plain, ours, policy=lxd.Lazy())
    assert lx.materialise(lazy).as_matrix().shape == (N, N)


# 3. The diagonal alone, in chunks within the budget.


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("diagonal", [lx.diagonal, lxd.diagonal], ids=["lx", "lxd"])
def test_diagonal_is_built_within_the_budget(diagonal, policy):
    op = _function(POLICIES[policy](BUDGET))
    got = jax.jit(lambda: diagonal(op))()
    np.testing.assert_allclose(got, _expected_diagonal(), rtol=1e-6)
    assert got.dtype == jnp.float32
    temporaries = _temporaries(lambda: diagonal(op))
    if temporaries is not None:
        assert temporaries <= lxd.parse_memory_budget(BUDGET)
    # Eagerly too.
    np.testing.assert_allclose(diagonal(op), _expected_diagonal(), rtol=1e-6)


@pytest.mark.parametrize("jac", ["fwd", "bwd", None])
def test_jacobian_diagonal_within_the_budget(jac):
    op = _jacobian(lxd.Materialise(memory_budget=BUDGET), jac=jac)
    plain = lx.JacobianLinearOperator(
        _jac_fn, _x0(), jnp.asarray(2.0, jnp.float32), jac=jac
    )
    expected = lx.diagonal(plain)
    np.testing.assert_allclose(jax.jit(lambda: lx.diagonal(op))(), expected, rtol=1e-6)
    np.testing.assert_allclose(lxd.diagonal(op), expected, rtol=1e-6)


@pytest.mark.parametrize("kind", ["tagged", "mul", "neg", "div", "add", "composed"])
def test_composite_diagonal_within_the_budget(kind):
    p = lxd.Materialise(memory_budget=BUDGET)
    f, plain_f = _function(p), lx.FunctionLinearOperator(_fn, STRUCTURE)
    make = {
        "tagged": lambda a: lx.TaggedLinearOperator(a, lx.symmetric_tag),
        "mul": lambda a: a * 2.0,
        "neg": lambda a: -a,
        "div": lambda a: a / 2.0,
        "add": lambda a: a + a,
        "composed": lambda a: a @ a,
    }[kind]
    ours, plain = make(f), make(plain_f)
    if kind == "tagged":
        ours = lxd.TaggedLinearOperator(f, lx.symmetric_tag, policy=p)
    got = jax.jit(lambda: lx.diagonal(ours))()
    np.testing.assert_allclose(got, lx.diagonal(plain), rtol=1e-6)


def test_diagonal_of_a_pytree_space():
    structure = {
        "a": jax.ShapeDtypeStruct((100,), jnp.float32),
        "b": jax.ShapeDtypeStruct((156,), jnp.float32),
    }
    fn = lambda x: {"a": 2.0 * x["a"] + x["b"][:100], "b": x["b"] - x["b"][0]}
    op = lxd.FunctionLinearOperator(
        fn, structure, policy=lxd.Materialise(memory_budget=BUDGET)
    )
    expected = lx.diagonal(lx.FunctionLinearOperator(fn, structure))
    np.testing.assert_allclose(jax.jit(lambda: lx.diagonal(op))(), expected)


def test_diagonal_raises_when_one_column_does_not_fit():
    op = _function(lxd.Materialise(memory_budget=100))
    for diagonal in (lx.diagonal, lxd.diagonal):
        with pytest.raises(ValueError, match=MESSAGE) as info:
            jax.eval_shape(lambda: diagonal(op))
        assert "`operator" in str(info.value)
        assert "100 B" in str(info.value)


def test_diagonal_tagged_operator_applies_once():
    """A diagonal-tagged operator: one application to a vector of ones, as lineax,
    even where its policy's budget is below the dense matrix."""
    op = lxd.FunctionLinearOperator(
        lambda x: 3.0 * x,
        STRUCTURE,
        lx.diagonal_tag,
        policy=lxd.Materialise(memory_budget=BUDGET),
    )
    np.testing.assert_allclose(lx.diagonal(op), 3.0 * jnp.ones(N))
    assert isinstance(lx.materialise(op), lxd.DiagonalLinearOperator)


# 4. `lx.linearise` keeps our operator type and policy.


@pytest.mark.parametrize("jac", ["fwd", "bwd", None])
def test_lineax_linearise_keeps_type_and_policy(jac):
    p = lxd.Auto(BUDGET)
    op = _jacobian(p, jac=jac)
    for linearise in (lx.linearise, lxd.linearise):
        lin = linearise(op)
        assert isinstance(lin, lxd.FunctionLinearOperator)
        assert lin.policy == p
        x = jnp.ones(N, jnp.float32)
        np.testing.assert_allclose(lin.mv(x), op.mv(x), rtol=1e-5)
        with pytest.raises(ValueError, match=MESSAGE):
            jax.eval_shape(lambda: lx.materialise(lin))


@pytest.mark.parametrize("kind", ["tagged", "mul", "neg", "div", "add", "composed"])
def test_lineax_linearise_keeps_composites(kind):
    # Auto: within the budget its `mv` does not build the matrix (Materialise's
    # would, and raise).
    p = lxd.Auto(BUDGET)
    j = _jacobian(p)
    op = _composite(kind, j, j, p)
    lin = lx.linearise(op)
    assert isinstance(lin, lxd.AbstractDispatchOperator)
    assert isinstance(lin, type(op))
    assert lin.policy == p
    x = jnp.linspace(-1.0, 1.0, N).astype(jnp.float32)
    np.testing.assert_allclose(lin.mv(x), op.mv(x), rtol=1e-5)


# 5. Within the budget (or without one), lineax's behaviour, float64 and complex.


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.parametrize(
    "policy",
    [lxd.Lazy(), lxd.Outline(), lxd.Materialise(), lxd.Auto("1GB")],
    ids=["lazy", "outline", "materialise", "auto"],
)
@pytest.mark.parametrize("kind", ["function", "jacobian"])
def test_within_budget_matches_lineax(kind, policy, dtype):
    n = 8
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        a = a + 1j * a.T
    structure = jax.ShapeDtypeStruct((n,), dtype)
    if kind == "function":
        ours = lxd.FunctionLinearOperator(lambda x: a @ x, structure, policy=policy)
        plain = lx.FunctionLinearOperator(lambda x: a @ x, structure)
    else:
        fn = lambda x, args: args @ x + 0.1 * x**2
        x0 = jnp.linspace(0.1, 0.5, n).astype(dtype)
        ours = lxd.JacobianLinearOperator(fn, x0, a, policy=policy)
        plain = lx.JacobianLinearOperator(fn, x0, a)
    materialised = lx.materialise(ours)
    expected = lx.materialise(plain)
    assert isinstance(materialised, type(expected))
    assert isinstance(materialised, lxd.AbstractDispatchOperator)
    assert materialised.policy == policy
    np.testing.assert_array_equal(materialised.as_matrix(), expected.as_matrix())
    assert materialised.as_matrix().dtype == expected.as_matrix().dtype
    for diagonal in (lx.diagonal, lxd.diagonal):
        got = diagonal(ours)
        np.testing.assert_array_equal(got, lx.diagonal(plain))
        assert got.dtype == lx.diagonal(plain).dtype
    np.testing.assert_array_equal(ours.as_matrix(), plain.as_matrix())
    lin = lx.linearise(ours)
    assert isinstance(lin, lxd.AbstractDispatchOperator) and lin.policy == policy
    np.testing.assert_allclose(lin.as_matrix(), lx.linearise(plain).as_matrix())


def test_plain_lineax_operators_are_untouched():
    plain = lx.FunctionLinearOperator(_fn, STRUCTURE)
    assert type(lx.materialise(plain)) is lx.PyTreeLinearOperator
    assert type(lx.linearise(plain)) is lx.FunctionLinearOperator
    jac = lx.JacobianLinearOperator(_jac_fn, _x0(), jnp.asarray(2.0, jnp.float32))
    assert type(lx.linearise(jac)) is lx.FunctionLinearOperator
    np.testing.assert_allclose(lx.diagonal(plain), _expected_diagonal())


def test_complex_diagonal_in_chunks():
    n = 64
    dtype = jnp.complex64
    a = jnp.asarray(
        np.random.default_rng(1).standard_normal((n, n))
        + 1j * np.random.default_rng(2).standard_normal((n, n)),
        dtype,
    )
    structure = jax.ShapeDtypeStruct((n,), dtype)
    ours = lxd.FunctionLinearOperator(
        lambda x: a @ x, structure, policy=lxd.Materialise(memory_budget="4KB")
    )
    with pytest.raises(ValueError, match=MESSAGE):
        jax.eval_shape(lambda: lx.materialise(ours))
    got = lx.diagonal(ours)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, jnp.diag(a), rtol=1e-5)
