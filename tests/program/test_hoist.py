"""Loop-invariant code of rolled calls runs once, before the loop; and k solves of
one `Auto` operator with the same arrays are decided together under `lxd.jit`
(one matrix build for all of them, where one solve alone would stay lazy)."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.program.analyse._hoist import split_invariant
from lineax_dispatch.solvers import expected_iterations


N = 6
_W = jnp.eye(N) + 0.2 * jax.random.normal(jax.random.key(1), (N, N), jnp.float64)


def _close(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12)


def _dots(jaxpr, inside=False, found=None):
    """`(output shape, inside a loop body)` of every dot product of `jaxpr`."""
    found = [] if found is None else found
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append((tuple(eqn.outvars[0].aval.shape), inside))
        loop = inside or eqn.primitive.name in ("scan", "while")
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _dots(sub, loop, found)
    return found


@jax.jit
def _gram_step(w, x):
    gram = w @ w.T  # reads only `w`: the same at every call
    return jnp.tanh(gram @ x)


def _repeated(w, x):
    for i in range(5):
        x = _gram_step(w, x) + 0.1 * i
    return x


def test_invariant_code_of_a_rolled_call_runs_before_the_loop():
    x = jnp.linspace(0.1, 1.0, N)
    with jax.checking_leaks():
        _close(lxd.jit(_repeated)(_W, x), jax.jit(_repeated)(_W, x))
    # The rewritten program: the Gram matrix built once, outside the loop; the
    # matrix-vector product in the loop body.
    dots = _dots(jax.make_jaxpr(lxd.jit(_repeated))(_W, x).jaxpr)
    assert sorted(set(dots)) == [((N,), True), ((N, N), False)]
    assert dots.count(((N, N), False)) == 1
    # Transformed, with respect to both arguments.
    loss = lambda w, x: jnp.sum(_repeated(w, x) ** 2)
    _close(
        jax.grad(lxd.jit(loss), argnums=(0, 1))(_W, x),
        jax.jit(jax.grad(loss, argnums=(0, 1)))(_W, x),
    )
    _close(
        lxd.jit(jax.grad(loss, argnums=(0, 1)))(_W, x),
        jax.jit(jax.grad(loss, argnums=(0, 1)))(_W, x),
    )
    tangents = (jnp.ones_like(_W), jnp.cos(x))
    _close(
        jax.jvp(lxd.jit(_repeated), (_W, x), tangents),
        jax.jvp(jax.jit(_repeated), (_W, x), tangents),
    )
    xs = jnp.stack([x, -x, 2 * x])
    _close(
        jax.vmap(lxd.jit(_repeated), in_axes=(None, 0))(_W, xs),
        jax.jit(jax.vmap(_repeated, in_axes=(None, 0)))(_W, xs),
    )


def test_effects_are_not_moved_out_of_the_loop():
    calls = []

    @jax.jit
    def step(w, x):
        jax.debug.callback(lambda: calls.append(1))
        return jnp.tanh((w @ w.T) @ x)

    def program(w, x):
        for i in range(4):
            x = step(w, x) + 0.1 * i
        return x

    x = jnp.linspace(0.1, 1.0, N)
    call = jax.make_jaxpr(step)(_W, x).jaxpr.eqns[0]
    assert split_invariant(call, (1,)) is None  # the callee has an effect
    _close(lxd.jit(program)(_W, x), jax.jit(program)(_W, x))
    jax.effects_barrier()
    assert len(calls) == 8  # four per run, as traced


def _spd_operator(policy, counter):
    keys = jax.random.split(jax.random.key(2), 2)
    layers = [jax.random.normal(k, (N, N), jnp.float64) / N for k in keys]

    def fn(x):
        counter.append(1)
        y = x
        for w in layers:
            y = w @ y
        for w in reversed(layers):
            y = w.T @ y
        return x + y

    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    return lxd.FunctionLinearOperator(
        fn, structure, lx.positive_semidefinite_tag, policy=policy
    )


def _solves(op, k):
    solver = lxd.CG(rtol=1e-10, atol=1e-10)

    def program(b):
        total = jnp.zeros(N)
        for i in range(k):
            total = total + lx.linear_solve(op, b * (i + 1), solver).value
        return total

    return program


def _shared_build_policy(k: int) -> lxd.Auto:
    """An `Auto` whose cost model makes one solve of the test's operator stay lazy
    while `k` solves that share a build materialise: the fixed compile time of a
    build set between the two thresholds, read off the model itself."""
    rate = 1e4  # bytes per second: run time counts as much as compile time here
    probe = lxd.Auto(
        runs=1,
        cost_model=lxd.CostModel(
            bytes_per_second=rate, cache_bytes_per_second=rate, materialise_fixed=0.0
        ),
    )
    op = _spd_operator(probe, [])
    executions = expected_iterations(None, N)

    def excess(decision):
        """Materialise's seconds minus Lazy's, without the fixed build time."""
        by = {e.strategy: e.seconds for e in decision.estimates}
        return by["Materialise"] - by["Lazy"]

    # One solve stays lazy when the fixed time exceeds `low`; k solves sharing a
    # build materialise while it is below `high`.
    low = -excess(probe.decision(op, executions=executions, solves=1))
    high = -excess(probe.decision(op, executions=k * executions, solves=1))
    assert low < high, (low, high)
    fixed = max((low + high) / 2, high / 2)
    model = lxd.CostModel(
        bytes_per_second=rate, cache_bytes_per_second=rate, materialise_fixed=fixed
    )
    return lxd.Auto(runs=1, cost_model=model)


@pytest.mark.parametrize("k", [1, 4])
def test_repeated_solves_of_one_operator_share_one_build(k):
    policy = _shared_build_policy(4)
    counter = []
    op = _spd_operator(policy, counter)
    reference = _spd_operator(lxd.Lazy(), [])
    b = jnp.linspace(1.0, 2.0, N)
    program = lxd.jit(_solves(op, k))
    _close(program(b), jax.jit(_solves(reference, k))(b))
    assert len(counter) <= 2  # the operator's function, over both traces
    (decision,) = program.decisions(b).values()
    if k == 1:
        assert decision.strategy == "Lazy"
        return
    assert decision.strategy == "Materialise"
    assert "4 solves of this operator" in decision.reasons[-1]
    # One build, before the rolled solves: the only (N, N) dot products are
    # outside every loop.
    dots = _dots(jax.make_jaxpr(program)(b).jaxpr)
    assert ((N, N), True) not in dots
    assert ((N, N), False) in dots
    report = lxd.explain(_solves(op, k), b)
    (row,) = report.rows
    assert row.decision.strategy == "Materialise"
    assert row.call_sites == k and len(row.sites) == k  # every solve, one line
    # The row reads the cost the decision read (not a dense product's estimate).
    assert row.mv_flops == lxd.policies.mv_cost(reference).flops
    loss = lambda b: jnp.sum(_solves(op, k)(b) ** 2)
    reference_loss = lambda b: jnp.sum(_solves(reference, k)(b) ** 2)
    _close(jax.grad(lxd.jit(loss))(b), jax.jit(jax.grad(reference_loss))(b))


def test_explain_counts_every_solve_of_one_operator():
    """k solves of one `Auto` operator share one trace of the solve and one
    decision: `lxd.explain` reports all k, at each one's line (it reported one
    solve, at the first line)."""
    op = _spd_operator(lxd.Auto(), [])
    solver = lxd.CG(rtol=1e-10, atol=1e-10)

    def program(b):
        x1 = lx.linear_solve(op, b, solver).value
        x2 = lx.linear_solve(op, x1, solver).value
        x3 = lx.linear_solve(op, x2, solver).value
        return x3

    (row,) = lxd.explain(program, jnp.ones(N)).rows
    assert row.call_sites == 3
    lines = {site.split(" ")[0] for site in row.sites}
    assert len(lines) == 3, row.sites
