"""`lxd.CG` writes an `mv` whose copies compile as one (a single operation: one
matrix-vector product, one elementwise product) at three sites, as lineax's CG
does, and every other `mv` through its one slot: the same answers, steps and
result codes either way."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.solvers._sites import compiles_once


N = 12


def _spd(seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed).normal(size=(N, N)) / np.sqrt(N)
    return np.eye(N) + g @ g.T


def _one_op(a, policy=None):
    kw = {} if policy is None else dict(policy=policy)
    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    tag = lx.positive_semidefinite_tag
    return lxd.FunctionLinearOperator(lambda x: a @ x, structure, tag, **kw)


def _two_ops(a):
    # The same operator as two operations: its `mv` goes through the one slot.
    half = jnp.asarray(a) / 2
    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    tag = lx.positive_semidefinite_tag
    return lxd.FunctionLinearOperator(lambda x: half @ x + half @ x, structure, tag)


def test_which_operators_compile_as_one():
    a = jnp.asarray(_spd())
    assert compiles_once(_one_op(a))
    assert compiles_once(lxd.MatrixLinearOperator(a))
    assert compiles_once(lxd.DiagonalLinearOperator(jnp.ones(N)))
    assert not compiles_once(_two_ops(a))
    assert not compiles_once(_one_op(a, lxd.Outline()))
    # A plain lineax operator: its cost would need one more run of its function.
    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    assert not compiles_once(lx.FunctionLinearOperator(lambda x: a @ x, structure))
    assert not compiles_once(lx.MatrixLinearOperator(a))


@pytest.mark.parametrize("stabilise_every", [1, 3, None])
def test_three_sites_and_one_slot_agree(stabilise_every):
    a = _spd(1)
    b = jnp.linspace(1.0, 2.0, N)
    solver = lxd.CG(1e-10, 1e-10, stabilise_every=stabilise_every)
    expected = np.linalg.solve(a, np.asarray(b))
    steps = []
    for operator in (_one_op(jnp.asarray(a)), _two_ops(a)):

        def solve(b, op=operator):
            sol = lx.linear_solve(op, b, solver)
            return (
                sol.value,
                sol.stats["num_steps"],
                sol.result == lx.RESULTS.successful,
            )

        value, num_steps, ok = jax.jit(solve)(b)
        assert ok
        np.testing.assert_allclose(value, expected, rtol=1e-8)
        steps.append(int(num_steps))
    assert abs(steps[0] - steps[1]) <= 1, steps
    theirs = lx.linear_solve(
        lx.MatrixLinearOperator(jnp.asarray(a), lx.positive_semidefinite_tag),
        b,
        lx.CG(1e-10, 1e-10, stabilise_every=stabilise_every),
    )
    assert abs(steps[0] - int(theirs.stats["num_steps"])) <= 1


def test_three_sites_in_the_compiled_program():
    a = jnp.asarray(_spd(2))
    b = jnp.ones(N)
    solver = lxd.CG(1e-10, 1e-10)

    def dots(operator):
        f = jax.jit(lambda b: lx.linear_solve(operator, b, solver).value)
        lines = f.lower(b).as_text().splitlines()
        # Matrix-vector products (not the loop's inner products of vectors).
        return sum("dot_general" in x and f"{N}x{N}x" in x for x in lines)

    # One operation: the initial residual, the loop's product, the refresh.
    assert dots(_one_op(a)) == 3
    # Two: both in the one slot.
    assert dots(_two_ops(a)) == 2


def test_three_sites_keep_the_result_codes_and_vmap():
    a = _spd(3)
    bs = jnp.stack([jnp.linspace(1.0, 2.0, N), jnp.arange(1.0, N + 1.0)])
    solver = lxd.CG(1e-10, 1e-10, stabilise_every=2)
    operator = _one_op(jnp.asarray(a))
    batched = jax.vmap(lambda b: lx.linear_solve(operator, b, solver).value)(bs)
    np.testing.assert_allclose(
        batched, np.linalg.solve(a, np.asarray(bs).T).T, rtol=1e-8
    )
    bad = bs[0].at[0].set(jnp.nan)
    sol = lx.linear_solve(operator, bad, solver, throw=False)
    assert sol.result == lx.RESULTS.nonfinite_input
    # Tagged definite, but not: a direction of negative curvature.
    indefinite = _one_op(jnp.asarray(np.diag(np.r_[1.0, -1.0, np.ones(N - 2)])))
    sol = lx.linear_solve(indefinite, jnp.ones(N), solver, throw=False)
    assert sol.result == lx.RESULTS.breakdown
