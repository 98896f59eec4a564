"""`Auto` does not materialise a solve whose tolerance is within the rounding of
a dense product (`Observation.materialise_keeps_answer`): a float32 CG solve of
the normal operator `J^T J + 0.1 I` (J a chain of dense layers, n = 256) to
`rtol = atol = 1e-5` converges from the user's `mv` (two products through the
chain) and stalls short of its tolerance from the dense matrix, whose products
round as inner products of 256 terms."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

import lineax_dispatch as lxd


N, LAYERS = 256, 8


def _normal_operator(policy):
    keys = jax.random.split(jax.random.key(3), LAYERS)
    weights = [jax.random.normal(k, (N, N), jnp.float32) / np.sqrt(N) for k in keys]

    def chain(v):
        for w in weights:
            v = w @ v
        return v

    def fn(x):
        y, vjp = jax.vjp(chain, x)
        return vjp(y)[0] + 0.1 * x

    structure = jax.ShapeDtypeStruct((N,), jnp.float32)
    return lxd.FunctionLinearOperator(
        fn, structure, lx.positive_semidefinite_tag, policy=policy
    )


def _solve(op, b, solver):
    sol = lx.linear_solve(op, b, solver, throw=False)
    return sol.value, sol.stats["num_steps"], sol.result == lx.RESULTS.successful


def test_a_tight_float32_solve_is_not_materialised_and_keeps_lazy_s_answer():
    b = jax.random.normal(jax.random.key(4), (N,), jnp.float32)
    solver = lxd.CG(rtol=1e-5, atol=1e-5, max_steps=200)
    auto = _normal_operator(lxd.Auto(runs=1, race=False))
    report = lxd.explain(lambda b: _solve(auto, b, solver), b)
    (row,) = report.rows
    assert row.decision.strategy != "Materialise"
    assert any(
        r.startswith("Materialise not allowed: a dense product of 256 terms")
        for r in row.decision.reasons
    )
    got = jax.jit(lambda b: _solve(auto, b, solver))(b)
    lazy = _normal_operator(lxd.Lazy())
    want = jax.jit(lambda b: _solve(lazy, b, solver))(b)
    assert bool(got[2]) and bool(want[2])
    assert int(got[1]) == int(want[1])
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-5)


def test_a_loose_solve_may_be_materialised():
    b = jax.random.normal(jax.random.key(4), (N,), jnp.float32)
    solver = lxd.CG(rtol=1e-3, atol=1e-3, max_steps=200)
    auto = _normal_operator(lxd.Auto(runs=1, race=False))
    (row,) = lxd.explain(lambda b: _solve(auto, b, solver), b).rows
    assert not any("dense product" in r for r in row.decision.reasons)
