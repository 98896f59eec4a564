"""k solves of the user's under `lxd.jit` are rolled into one loop only where the
k - 1 copies that saves cost more to compile than the loop
(`analyse._solves.rolling_pays`): k solves of a cheap `mv` stay as `jax.jit`
writes them."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd

from ..helpers.leaks import leak_checked


N = 12


def _stencil(x):
    return 2.5 * x - jnp.roll(x, 1) - jnp.roll(x, -1)


def _program(policy, k=3, module=lxd):
    """k dependent solves of the stencil, by our operator and CG (or lineax's)."""
    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    tag = lx.positive_semidefinite_tag
    if module is lxd:
        op = lxd.FunctionLinearOperator(_stencil, structure, tag, policy=policy)
    else:
        op = lx.FunctionLinearOperator(_stencil, structure, tag)
    solver = module.CG(rtol=1e-10, atol=1e-10)

    def program(b):
        x = b
        for i in range(k):
            x = lx.linear_solve(op, x * (1.0 + 0.1 * i), solver).value
        return x

    return program


def _solves(jaxpr, inside=False, found=None):
    """Whether each `linear_solve` equation of `jaxpr` (any depth) is in a loop."""
    found = [] if found is None else found
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "linear_solve":
            found.append(inside)
        loop = inside or eqn.primitive.name in ("scan", "while")
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _solves(sub, loop, found)
    return found


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("solve_copy, rolled", [(None, False), (10.0, True)])
def test_repeated_solves_are_rolled_where_the_copies_cost_more(solve_copy, rolled):
    model = None if solve_copy is None else lxd.CostModel(solve_copy=solve_copy)
    program = _program(lxd.Auto(cost_model=model))
    reference = _program(lxd.Lazy())
    b = jnp.linspace(1.0, 2.0, N)
    out = leak_checked(
        lambda: lxd.jit(program)(b), lambda: jax.jit(_program(None, module=lx))(b)
    )
    _close(out, jax.jit(reference)(b))
    found = _solves(jax.make_jaxpr(lxd.jit(program))(b).jaxpr)
    # Rolled: one solve, in the loop's body; else the three, as written.
    assert found == ([True] if rolled else [False, False, False])
    loss = lambda b: jnp.sum(program(b) ** 2)
    reference_loss = lambda b: jnp.sum(reference(b) ** 2)
    _close(jax.grad(lxd.jit(loss))(b), jax.jit(jax.grad(reference_loss))(b))
    tangent = jnp.cos(b)
    _close(
        jax.jvp(lxd.jit(program), (b,), (tangent,))[1],
        jax.jvp(jax.jit(reference), (b,), (tangent,))[1],
    )


def test_solves_of_a_policy_that_decides_nothing_are_rolled_as_before():
    """Without a solve record (a fixed policy), the cost is unknown: rolled."""
    program = _program(lxd.Lazy())
    b = jnp.linspace(1.0, 2.0, N)
    _close(lxd.jit(program)(b), jax.jit(program)(b))
    assert _solves(jax.make_jaxpr(lxd.jit(program))(b).jaxpr) == [True]
