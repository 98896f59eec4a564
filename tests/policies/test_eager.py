"""Eager `mv`: the short path from `op.mv(v)` to the policy's compiled `mv`,
against lineax's eager `mv`; vectors that need a cast or do not match take the
general path (cast, or a `ValueError`)."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch._compat import XLA_OUTLINE
from lineax_dispatch.operators import _dispatch_operator as _base


_POLICIES = [lxd.Lazy(), lxd.Auto(), lxd.Roll(), lxd.Outline()]


def _pair(policy, dtype=jnp.float64):
    a = jnp.asarray(np.arange(12.0).reshape(4, 3) / 7.0, dtype)

    def fn(t):
        return {"y": a @ t["x"], "z": 2.0 * t["w"]}

    structure = {
        "x": jax.ShapeDtypeStruct((3,), dtype),
        "w": jax.ShapeDtypeStruct((2,), dtype),
    }
    ours = lxd.FunctionLinearOperator(fn, structure, policy=policy)
    theirs = lx.FunctionLinearOperator(fn, structure)
    return ours, theirs


def _vector(dtype=jnp.float64, scale=1.0):
    return {
        "x": jnp.arange(3.0, dtype=dtype) * scale,
        "w": jnp.ones(2, dtype) * scale,
    }


@pytest.mark.parametrize("policy", _POLICIES, ids=lambda p: type(p).__name__)
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
def test_eager_mv_matches_lineax_at_every_call(policy, dtype):
    ours, theirs = _pair(policy, dtype)
    for scale in (1.0, -2.0, 0.5):
        v = _vector(dtype, scale)
        got, expected = ours.mv(v), theirs.mv(v)
        for key in ("y", "z"):
            assert got[key].dtype == expected[key].dtype
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-12)


@pytest.mark.parametrize("policy", _POLICIES, ids=lambda p: type(p).__name__)
def test_later_eager_calls_skip_the_general_path(policy, monkeypatch):
    """After the first eager `mv` of an operator, a vector of exactly its input
    structure goes straight to the compiled `mv`: the general check is not run
    (on jax 0.10 `Outline` runs the function inline eagerly, so every call takes
    the general path)."""
    checks = []
    original = _base.check_vector

    def check_vector(*args, **kwargs):
        checks.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(_base, "check_vector", check_vector)
    ours, theirs = _pair(policy)
    ours.mv(_vector())
    checks.clear()
    for scale in (2.0, 3.0):
        got = ours.mv(_vector(scale=scale))
        np.testing.assert_allclose(got["y"], theirs.mv(_vector(scale=scale))["y"])
    short = not isinstance(policy, lxd.Outline) or XLA_OUTLINE is not None
    assert (not checks) if short else len(checks) == 2


@pytest.mark.parametrize("policy", _POLICIES, ids=lambda p: type(p).__name__)
def test_eager_vectors_that_need_a_cast_or_do_not_match(policy):
    """A vector of another dtype (an integer, a NumPy array, a Python list) is
    cast as before; one of another shape or structure raises the ValueError
    naming the input structure, also after the short path has been taken."""
    ours, theirs = _pair(policy)
    ours.mv(_vector())
    ints = {"x": jnp.arange(3), "w": jnp.ones(2, jnp.int32)}
    got = ours.mv(ints)
    assert got["y"].dtype == jnp.float64
    np.testing.assert_allclose(got["y"], theirs.mv(_vector())["y"], rtol=1e-12)
    numpy = {"x": np.arange(3.0), "w": np.ones(2)}
    np.testing.assert_allclose(ours.mv(numpy)["z"], 2.0 * np.ones(2))
    with pytest.raises(ValueError, match="input structure"):
        ours.mv({"x": jnp.ones(4), "w": jnp.ones(2)})
    with pytest.raises(ValueError, match="input structure"):
        ours.mv(jnp.ones(5))


def test_eager_composites_and_policy_changes():
    """A composite of our operators, an operator given another policy, and an
    operator rebuilt with other arrays each get their own compiled `mv`."""
    m = jnp.asarray(np.eye(3) * 2.0 + 0.1)
    left = lxd.MatrixLinearOperator(m, policy=lxd.Lazy())
    right = lxd.FunctionLinearOperator(
        lambda x: jnp.cumsum(x), jax.ShapeDtypeStruct((3,), jnp.float64)
    )
    v = jnp.arange(1.0, 4.0)
    composed = left @ right
    for _ in range(2):
        np.testing.assert_allclose(composed.mv(v), m @ np.cumsum(v), rtol=1e-12)
        np.testing.assert_allclose((left + right).mv(v), m @ v + np.cumsum(v))
    other = lxd.with_policy(left, lxd.Auto())
    np.testing.assert_allclose(other.mv(v), m @ v, rtol=1e-12)
    rebuilt = lxd.MatrixLinearOperator(2 * m, policy=lxd.Lazy())
    for _ in range(2):
        np.testing.assert_allclose(rebuilt.mv(v), 2 * m @ v, rtol=1e-12)
        np.testing.assert_allclose(left.mv(v), m @ v, rtol=1e-12)
