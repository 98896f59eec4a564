"""What `Auto` decides under `lxd.jit`, read from the traced program: one trace
and one partition of an operator for many sites, decisions that depend on the
program alone, `lxd.explain`'s reading of the program, and the sites a rewrite must
leave alone (an `mv` with effects, one `vmap` cannot batch, sites a loop cannot
roll). How often solves and eager `mv` trace the user's code: test_traces.py."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import lineax_dispatch as lxd

from ..helpers.roll_programs import (
    _close,
    _loop,
    _MODELS,
    _operators,
    N,
    ROLL_MODEL,
)


def test_an_operator_at_many_sites_is_partitioned_once(monkeypatch):
    """An `Auto` operator applied at 16 sites of an `lxd.jit` program is split into
    its kind key and arrays once (at its first `mv`), not at every site; what that
    keeps holds the trace's tracers and is dropped when the trace ends."""
    from lineax_dispatch.policies import _auto
    from lineax_dispatch.policies.calls import _keys
    from lineax_dispatch.program import _session

    keys = []
    operator_key = _keys.operator_key
    counted = lambda op: keys.append(1) or operator_key(op)
    for module in (_session, _auto):
        monkeypatch.setattr(module, "operator_key", counted, raising=False)
    op = _operators(lxd.Auto(cost_model=ROLL_MODEL))[0]
    x = jnp.linspace(0.1, 1.0, N)
    compiled = lxd.jit(lambda op, x: _loop(op, x, 16))
    with jax.checking_leaks():
        out = compiled(op, x)
    assert len(keys) == 1
    _close(out, eqx.filter_jit(lambda op, x: _loop(op, x, 16))(op, x))


def test_default_auto_traces_once():
    """Under `lxd.jit` and the default Auto, 16 sites trace the function once
    (test_roll.py checks 1, 4 and 16 sites with Auto deciding to roll)."""
    counter = []
    op = _operators(lxd.Auto(), counter)[0]
    lxd.jit(lambda x: _loop(op, x, 16))(jnp.linspace(0.1, 1.0, N))
    assert len(counter) == 1


def test_no_decision_depends_on_earlier_calls():
    """Decisions depend on the program, the operator, the budget and the cost
    model only: not on what was compiled or explained before."""
    op = _operators(lxd.Auto())[0]
    x = jnp.linspace(0.1, 1.0, N)
    one = lambda x: op.mv(x)
    many = lambda x: _loop(op, x, 16)

    def observe():
        return (
            lxd.jit(one).decisions(x),
            op.policy.decision(op),
            lxd.explain(op).rows[0].decision,
            jax.jit(one).lower(x).as_text(),
        )

    before = observe()
    lxd.jit(many)(x)
    lxd.explain(many, x)
    after = observe()
    assert before == after


def test_explain_reads_the_program():
    op = _operators(lxd.Auto(cost_model=_MODELS["roll"]))[0]
    x = jnp.linspace(0.1, 1.0, N)

    def f(x):
        y = _loop(op, x, 4)
        return jax.lax.fori_loop(0, 3, lambda i, v: op.mv(v), y)

    (row,) = lxd.explain(f, x).rows
    # Four top-level sites and one in a loop body of three trips.
    assert row.call_sites == 5 and row.executions == 7
    # Sites in a loop body cannot be rolled with the others: inline.
    assert row.decision.strategy == "Lazy"
    assert any("roll_programs.py" in site for site in row.sites)  # `_loop`'s line
    assert any("test_auto_decisions.py" in site for site in row.sites)
    (row,) = lxd.explain(lambda x: _loop(op, x, 4), x).rows
    assert row.decision.strategy == "Roll"
    assert "Roll is cheapest" in row.decision.reasons[-1]


def _layers(n=8, count=6):
    keys = jax.random.split(jax.random.key(2), count)
    return [jax.random.normal(k, (n, n)) / 3 for k in keys]


def test_auto_keeps_the_effects_of_an_mv():
    """An `Auto` operator whose `mv` has an (ordered) effect is neither
    materialised (its effect ran on the basis vectors) nor outlined (out of
    order): the effects run as under `jax.jit`, with the same values."""
    weights = _layers()
    seen = []

    def fn(v):
        jax.debug.callback(lambda s: seen.append(float(s)), jnp.sum(v), ordered=True)
        for w in weights:
            v = w.T @ (w @ v) * 0.3
        return v

    structure = jax.ShapeDtypeStruct((8,), jnp.float64)
    op = lxd.FunctionLinearOperator(fn, structure, policy=lxd.Auto(runs=1))
    top = lambda x: op.mv(op.mv(x) + 1) + op.mv(2 * x)
    nested = lambda x: jax.lax.fori_loop(0, 2, lambda i, v: op.mv(v), op.mv(x))
    x = jnp.linspace(0.5, 1.0, 8)
    for f in (top, nested):
        runs = []
        for jit in (jax.jit, lxd.jit):
            seen.clear()
            out = jax.block_until_ready(jit(f)(x))
            jax.effects_barrier()
            runs.append((out, list(seen)))
        (expected, expected_seen), (got, got_seen) = runs
        np.testing.assert_allclose(got, expected, rtol=1e-12)
        np.testing.assert_allclose(got_seen, expected_seen, rtol=1e-12)
        strategies = {d.strategy for d in lxd.jit(f).decisions(x).values()}
        assert not strategies & {"Materialise", "Outline"}


def test_an_mv_that_vmap_cannot_batch_is_not_stacked_nor_materialised():
    """An `mv` calling `jax.pure_callback` without a `vmap_method` (valid under
    `jax.jit`, refused by `vmap`): its independent sites are rolled, not stacked
    (a `vmap`), and `Auto` does not build its matrix."""
    weights = [np.asarray(w) for w in _layers()]

    def host(u):
        for w in weights:
            u = w.T @ (w @ u) * 0.3
        return u

    def fn(v):
        return jax.pure_callback(host, jax.ShapeDtypeStruct(v.shape, v.dtype), v)

    structure = jax.ShapeDtypeStruct((8,), jnp.float64)
    x = jnp.linspace(0.5, 1.0, 8)
    f_of = lambda op: lambda x: (op.mv(x), op.mv(x + 1), op.mv(2 * x))
    expected = jax.jit(f_of(lxd.FunctionLinearOperator(fn, structure)))(x)
    for policy in (lxd.Roll(), lxd.Auto(cost_model=_MODELS["materialise"])):
        op = lxd.FunctionLinearOperator(fn, structure, policy=policy)
        compiled = lxd.jit(f_of(op))
        _close(compiled(x), expected)
        strategies = {d.strategy for d in compiled.decisions(x).values()}
        assert "Materialise" not in strategies


def test_sites_a_loop_cannot_roll_are_not_decided_rolled():
    """Call sites between which the program carries a value a loop cannot (a PRNG
    key) are not reported or decided as `Roll` (the rewrite could not roll them:
    they ran inline, where `Auto` had estimated a loop); rolling being out of
    reach, an out-of-line `mv` is among the choices, and the results are
    `jax.jit`'s."""
    weights = _layers(16, 10)

    def fn(v):
        for w in weights:
            v = w.T @ (w @ v) * 0.1
        return v

    structure = jax.ShapeDtypeStruct((16,), jnp.float64)

    def program(op):
        def f(x, key):
            for _ in range(6):
                key, sub = jax.random.split(key)
                x = op.mv(x) + jax.random.normal(sub, (16,))
            return x

        return f

    x, key = jnp.ones(16), jax.random.key(0)
    expected = jax.jit(program(lxd.FunctionLinearOperator(fn, structure)))(x, key)
    for model in (
        ROLL_MODEL,
        lxd.CostModel(outline_site=0.0, outline_clone=0.0, roll_fixed=1e3),
    ):
        auto = lxd.Auto(memory_budget=100, cost_model=model)
        compiled = lxd.jit(
            program(lxd.FunctionLinearOperator(fn, structure, policy=auto))
        )
        _close(compiled(x, key), expected)
        strategies = {d.strategy for d in compiled.decisions(x, key).values()}
        assert "Roll" not in strategies
    assert strategies == {"Outline"}


def test_independent_sites_roll_instead_of_stacking_on_a_tpu(monkeypatch):
    """Independent sites of a `Roll` operator are stacked into one batched call,
    whose products run at full precision (`_precision.batched_products`). On a
    TPU that precision is several passes, slow to compile for a large matrix, so
    there they are rolled into a loop, each `mv` the user's own product, and the
    decision says so; a default precision the user set is kept by the stack, which
    then stays. Either way the results are `jax.jit`'s."""
    from lineax_dispatch import _precision

    weights = _layers(16, 3)

    def fn(v):
        for w in weights:
            v = jnp.tanh(w @ v)
        return v

    structure = jax.ShapeDtypeStruct((16,), jnp.float32)
    x = jnp.linspace(0.5, 1.0, 16, dtype=jnp.float32)
    f_of = lambda op: lambda x: (op.mv(x), op.mv(x + 1), op.mv(2 * x))
    expected = jax.jit(f_of(lxd.FunctionLinearOperator(fn, structure)))(x)

    def lowered(policy):
        compiled = lxd.jit(
            f_of(lxd.FunctionLinearOperator(fn, structure, policy=policy))
        )
        _close(compiled(x), expected)
        text = compiled.lower(x).as_text()
        reasons = " ".join(r for d in compiled.decisions(x).values() for r in d.reasons)
        return "stablehlo.while" in text, "HIGHEST" in text, reasons

    assert lowered(lxd.Roll()) == (False, True, "")
    monkeypatch.setattr(_precision.jax, "default_backend", lambda: "tpu")
    assert lowered(lxd.Roll())[:2] == (True, False)
    auto = lxd.Auto(cost_model=ROLL_MODEL, race=False)
    rolled, highest, reasons = lowered(auto)
    assert (rolled, highest) == (True, False)
    assert "rolled into a loop, not stacked: on 'tpu'" in reasons
    with jax.default_matmul_precision("float32"):
        assert lowered(lxd.Roll())[0] is False
