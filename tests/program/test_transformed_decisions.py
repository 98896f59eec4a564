"""`lxd.jit` of a transformed function (`jax.vmap`, `jax.grad`, `jax.jacfwd`,
`jax.jvp` of a function applying an `Auto` operator at several sites): the
transformation's calls of the operator's `mv` (batched, a primal with residuals, a
transpose, a JVP) are decided for as the computations they are, among the
strategies that apply to any repeated call (`Lazy`, `Roll`), and `lxd.explain`
names the transformation; the results are `jax.jit`'s."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lineax_dispatch as lxd

from ..helpers.leaks import leak_checked
from ..helpers.roll_programs import _MODELS


N = 8
_WEIGHTS = jnp.eye(N) + 0.1 * jnp.arange(N * N, dtype=jnp.float64).reshape(N, N) / N**2


def _operator(policy):
    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    fn = lambda v: jnp.tanh(_WEIGHTS @ v) + _WEIGHTS.T @ v
    return lxd.FunctionLinearOperator(fn, structure, policy=policy)


def _program(op):
    def f(x):
        return jnp.sum(jnp.sin(op.mv(op.mv(op.mv(x)))))

    return f


def _jvp(f):
    return lambda x: jax.jvp(f, (x,), (jnp.cos(x),))


_TRANSFORMATIONS = {
    "vmap": (jax.vmap, ("vmap",), True),
    "grad": (jax.grad, ("grad", "transpose"), False),
    "jacfwd": (jax.jacfwd, ("jvp",), False),
    "jvp": (_jvp, ("jvp",), False),
}


@pytest.mark.parametrize("name", _TRANSFORMATIONS)
@pytest.mark.parametrize("model", [None, "roll"])
def test_transformed_programs_are_decided_and_explained(name, model):
    transform, words, batched = _TRANSFORMATIONS[name]
    cost_model = None if model is None else _MODELS[model]
    auto = transform(_program(_operator(lxd.Auto(cost_model=cost_model))))
    lazy = transform(_program(_operator(lxd.Lazy())))
    x = jnp.linspace(0.1, 1.0, N)
    if batched:
        x = jnp.stack([x, 2 * x, -x])
    expected = jax.jit(lazy)(x)
    got = leak_checked(lambda: lxd.jit(auto)(x), lambda: jax.jit(lazy)(x))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    decisions = lxd.jit(auto).decisions(x)
    assert len(decisions) == 1, decisions
    report = lxd.explain(auto, x)
    assert report.rows, str(report)
    for row in report.rows:
        assert any(w in row.decision.reasons[-1] for w in words), str(report)
        assert row.decision.strategy in ("Lazy", "Roll"), str(report)
    if model == "roll":
        # The three dependent sites of one transformed computation (vmap's first
        # site is batched otherwise than the next two: a group of its own).
        assert "Roll" in {row.decision.strategy for row in report.rows}, str(report)
        assert "Roll" in {d.strategy for d in decisions.values()}


def test_plain_and_transformed_sites_of_one_operator():
    """The decision of an operator kind is its plain sites' where it has some; the
    transformed ones have rows of their own in the report."""
    op = _operator(lxd.Auto(cost_model=_MODELS["roll"]))
    f = _program(op)

    def both(x):
        return f(x), jax.grad(f)(x)

    x = jnp.linspace(0.1, 1.0, N)
    lazy = _program(_operator(lxd.Lazy()))
    expected = jax.jit(lambda x: (lazy(x), jax.grad(lazy)(x)))(x)
    got = lxd.jit(both)(x)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    report = lxd.explain(both, x)
    plain = [r for r in report.rows if "transformation" not in r.decision.reasons[-1]]
    assert len(plain) == 1 and plain[0].call_sites == 3, str(report)
    (decision,) = lxd.jit(both).decisions(x).values()
    assert decision == plain[0].decision
    assert len(report.rows) > 1, str(report)
