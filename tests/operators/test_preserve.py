"""Policies survive transposition, arithmetic and lineax's operator functions."""

import jax
import jax.numpy as jnp
import lineax as lx
import pytest

import lineax_dispatch as lxd

from ..helpers.zoo import build, KINDS, POLICIES, vector


def _all_nodes(op):
    yield op
    for name in ("operator", "operator1", "operator2"):
        child = getattr(op, name, None)
        if isinstance(child, lx.AbstractLinearOperator):
            yield from _all_nodes(child)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_arithmetic_keeps_policy(policy):
    p = POLICIES[policy]
    a = build("matrix", dispatch=True, policy=p)
    f = build("function", dispatch=True, policy=p)
    results = {
        "add": a + f,
        "sub": a - f,
        "mul": a * 2.0,
        "rmul": 2.0 * a,
        "div": a / 2.0,
        "neg": -a,
        "matmul": a @ f,
        "T": (a @ f).T,
        "transpose": (a + f).transpose(),
    }
    expected_types = {
        "add": lxd.AddLinearOperator,
        "sub": lxd.AddLinearOperator,
        "mul": lxd.MulLinearOperator,
        "rmul": lxd.MulLinearOperator,
        "div": lxd.DivLinearOperator,
        "neg": lxd.NegLinearOperator,
        "matmul": lxd.ComposedLinearOperator,
    }
    x = vector(a)
    pa, pf = build("matrix", dispatch=False), build("function", dispatch=False)
    plain = {
        "add": pa + pf,
        "sub": pa - pf,
        "mul": pa * 2.0,
        "rmul": 2.0 * pa,
        "div": pa / 2.0,
        "neg": -pa,
        "matmul": pa @ pf,
        "T": (pa @ pf).T,
        "transpose": (pa + pf).transpose(),
    }
    for name, op in results.items():
        if name in expected_types:
            assert type(op) is expected_types[name], name
        for node in _all_nodes(op):
            assert isinstance(node, lxd.AbstractDispatchOperator), (name, node)
            assert node.policy == p, name
        assert jnp.allclose(op.mv(x), plain[name].mv(x)), name


def test_mixed_policies_combine_to_default_and_keep_their_own():
    a = build("matrix", dispatch=True, policy=lxd.Outline())
    f = build("function", dispatch=True, policy=lxd.Materialise())
    total = a + f
    assert total.policy == lxd.Auto()  # the default policy
    assert total.operator1.policy == lxd.Outline()
    assert total.operator2.policy == lxd.Materialise()
    # Transposing keeps each node's own policy.
    t = total.T
    assert t.operator1.policy == lxd.Outline()
    assert t.operator2.policy == lxd.Materialise()
    # With a plain lineax operator, ours decides.
    plain = build("function", dispatch=False)
    assert (a + plain).policy == lxd.Outline()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_with_policy_converts_recursively(kind):
    plain = build(kind, dispatch=False)
    ours = lxd.with_policy(plain, lxd.Outline())
    assert isinstance(ours, type(plain))
    for node in _all_nodes(ours):
        assert isinstance(node, lxd.AbstractDispatchOperator)
        assert node.policy == lxd.Outline()
    x = vector(plain)
    assert jax.tree_util.tree_all(
        jax.tree_util.tree_map(jnp.allclose, ours.mv(x), plain.mv(x))
    )
    again = lxd.with_policy(ours, lxd.Lazy())
    assert all(node.policy == lxd.Lazy() for node in _all_nodes(again))


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("function", ["materialise", "linearise"])
def test_operator_functions_keep_policy(kind, function):
    p = lxd.Materialise(batch_size=3)
    ours = build(kind, dispatch=True, policy=p)
    plain = build(kind, dispatch=False)
    result = getattr(lxd, function)(ours)
    expected = getattr(lx, function)(plain)
    assert isinstance(result, lxd.AbstractDispatchOperator)
    assert result.policy == p
    assert isinstance(result, type(expected))
    x = vector(plain)
    assert jax.tree_util.tree_all(
        jax.tree_util.tree_map(jnp.allclose, result.mv(x), expected.mv(x))
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_diagonal_and_tridiagonal_match_lineax(kind):
    ours = build(kind, dispatch=True, policy=lxd.Outline())
    plain = build(kind, dispatch=False)
    assert jnp.allclose(lxd.diagonal(ours), lx.diagonal(plain))
    for got, expected in zip(lxd.tridiagonal(ours), lx.tridiagonal(plain)):
        assert jnp.allclose(got, expected)


def test_lineax_functions_on_plain_operators_give_default_policy():
    plain = build("function", dispatch=False)
    result = lxd.materialise(plain)
    assert isinstance(result, lxd.PyTreeLinearOperator)
    assert result.policy == lxd.Auto()  # the default policy


def test_adopt_changes_only_the_top_policy_of_an_operator_of_ours():
    # A solver fixing an `Auto` operator's policy (`adopt`): the same operator with
    # that policy at its top node, the original untouched, the same arrays; plain
    # lineax children converted.
    from lineax_dispatch.operators import adopt

    structure = jax.ShapeDtypeStruct((3,), jnp.float32)
    scale = jnp.arange(1.0, 4.0, dtype=jnp.float32)
    tag = lx.positive_semidefinite_tag
    op = lxd.FunctionLinearOperator(
        lambda x: scale * x, structure, tag, policy=lxd.Auto()
    )
    fixed = adopt(op, lxd.Lazy())
    assert type(fixed) is type(op) and fixed.policy == lxd.Lazy()
    assert op.policy == lxd.Auto()
    assert lx.is_positive_semidefinite(fixed)
    leaves = jax.tree_util.tree_leaves
    assert all(a is b for a, b in zip(leaves(fixed), leaves(op), strict=True))
    x = jnp.arange(3.0, dtype=jnp.float32)
    assert jnp.array_equal(fixed.mv(x), scale * x)
    with pytest.raises(TypeError, match="`policy` must be a lineax-dispatch policy"):
        adopt(op, "Lazy")  # pyright: ignore[reportArgumentType]
    tagged = lxd.TaggedLinearOperator(
        lx.MatrixLinearOperator(jnp.eye(3)), lx.symmetric_tag, policy=lxd.Auto()
    )
    converted = adopt(tagged, lxd.Lazy())
    assert isinstance(converted.operator, lxd.AbstractDispatchOperator)
    assert converted.operator.policy == lxd.Lazy()
