"""`lxd.jit` with `Auto`: one trace, decisions read from the traced program, the
program rewritten (rolled, or one matrix for the program, or left inline), and
`jax.jit`'s results under jit, grad, jvp and vmap on the zoo of test_roll.py
(roll_programs.py). How often solves and eager `mv` trace the user's code:
test_traces.py."""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lineax_dispatch as lxd

from .roll_programs import (
    _close,
    _operators,
    lazy_reference,
    N,
    NO_LEAK_CHECK,
    ROLL_MODEL,
    ZOO,
    ZOO_X,
)

# From test_roll.py itself: `test_explain_reads_the_program` finds `_loop`'s line
# there among the call sites.
from .test_roll import _loop, _sum


# Cost models under which each rewrite is the cheapest where it applies.
_MODELS = {
    "roll": ROLL_MODEL,
    "materialise": lxd.CostModel(
        compile_per_dot=10.0, outline_site=1e3, roll_fixed=1e3
    ),
}


def _scalar(f):
    return lambda x: sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(f(x)))


# Under the roll model Auto's rewrite is test_roll.py's, which runs every program of
# the zoo: here, the programs whose decision differs (Roll, or Lazy for sites in
# loop bodies); the materialise model's rewrite is Auto's own: every program.
_CASES = [(name, "materialise") for name in ZOO] + [
    (name, "roll")
    for name in ("dependent", "independent", "mixed", "pytree", "in-scan-and-cond")
]


def _transformed(f, jit):
    """grad, jvp and vmap of `jit(f)`, compiled together (each `lxd.jit` traces,
    decides and rewrites its program inside the outer trace)."""

    def run(x, tangent, xs):
        return (
            jax.grad(jit(_scalar(f)))(x),
            jax.jvp(jit(f), (x,), (tangent,)),
            jax.vmap(jit(f))(xs),
        )

    return run


def _transformed_args(x):
    return x, jnp.cos(x), jnp.stack([x, 2 * x, -x])


@ft.cache
def _transformed_lazy_reference(name):
    """`jax.jit` of `_transformed` of the zoo's program `name` on `Lazy` operators:
    the same for both cost models, so computed once."""
    lazy_ops = _operators(lxd.Lazy())
    lazy = lambda x: ZOO[name](lazy_ops, x)
    return jax.jit(_transformed(lazy, lambda f: f))(*_transformed_args(ZOO_X))


@pytest.mark.parametrize("name, model", _CASES)
def test_auto_programs_match_jax_jit(name, model):
    auto_ops = _operators(lxd.Auto(cost_model=_MODELS[model]))
    program = ZOO[name]
    auto = lambda x: program(auto_ops, x)
    x = ZOO_X
    compiled = lxd.jit(auto)
    if name in NO_LEAK_CHECK:
        out = compiled(x)
    else:
        with jax.checking_leaks():
            out = compiled(x)
    _close(out, lazy_reference(name))
    strategies = {d.strategy for d in compiled.decisions(x).values()}
    if name in ("dependent", "independent", "mixed"):
        assert strategies == {"Roll" if model == "roll" else "Materialise"}
    if name == "in-scan-and-cond":
        # Sites inside loop bodies and branches stay inline.
        assert strategies == {"Lazy"}
    # grad, jvp and vmap of `lxd.jit` programs, compiled together.
    _close(
        jax.jit(_transformed(auto, lxd.jit))(*_transformed_args(x)),
        _transformed_lazy_reference(name),
    )


@pytest.mark.parametrize("name", list(ZOO))
def test_transformations_inside_lxd_jit_match_jax_jit(name):
    """`lxd.jit` of grad, jvp and vmap of the zoo's programs, `Auto` deciding to
    materialise: a transformation's calls of an `Auto` operator's `mv` keep its
    name but compute something else (a primal with residuals, a transpose, a JVP),
    and are not decided for as its `mv` (materialising them gave wrong values)."""
    auto_ops = _operators(lxd.Auto(cost_model=_MODELS["materialise"]))
    auto = lambda x: ZOO[name](auto_ops, x)
    compiled = lxd.jit(_transformed(auto, lambda f: f))
    args = _transformed_args(ZOO_X)
    _close(compiled(*args), _transformed_lazy_reference(name))


def test_an_operator_at_many_sites_and_its_transpose():
    """A program with plain call sites of an `Auto` operator and transformed ones:
    the plain ones are decided for (and materialised), the others left as
    computed, the results those of `jax.jit`."""
    auto_ops = _operators(lxd.Auto(cost_model=_MODELS["materialise"]))
    op = auto_ops[0]
    loss = lambda z: jnp.sum(jnp.sin(op.mv(z)))

    def f(x):
        return op.mv(x) + op.mv(2 * x), jax.grad(loss)(x), jax.jvp(op.mv, (x,), (x,))

    compiled = lxd.jit(f)
    _close(compiled(ZOO_X), jax.jit(f)(ZOO_X))
    strategies = {d.strategy for d in compiled.decisions(ZOO_X).values()}
    assert strategies == {"Materialise"}


def test_an_operator_at_many_sites_is_partitioned_once(monkeypatch):
    """An `Auto` operator applied at 16 sites of an `lxd.jit` program is split into
    its kind key and arrays once (at its first `mv`), not at every site; what that
    keeps holds the trace's tracers and is dropped when the trace ends."""
    from lineax_dispatch.policies import _auto
    from lineax_dispatch.policies.calls import _keys, _session

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
    assert any("test_roll.py" in site for site in row.sites)  # `_loop`'s line
    assert any("test_program.py" in site for site in row.sites)
    (row,) = lxd.explain(lambda x: _loop(op, x, 4), x).rows
    assert row.decision.strategy == "Roll"
    assert "Roll is cheapest" in row.decision.reasons[-1]


def test_one_site_run_once_is_lowered_as_lineax_s():
    """One call of an `Auto` operator, run once, decided `Lazy`: its equations are
    put in the program (no call left to lower and compile), under jit, grad, jvp
    and vmap."""
    op = _operators(lxd.Auto())[0]
    x = jnp.linspace(0.1, 1.0, N)
    f = lambda x: jnp.sin(op.mv(x))
    compiled = lxd.jit(f)
    (decision,) = compiled.decisions(x).values()
    assert decision.strategy == "Lazy"
    assert " call @" not in compiled.lower(x).as_text()
    _close(compiled(x), jax.jit(f)(x))
    with jax.checking_leaks():
        got = jax.jit(_transformed(f, lxd.jit))(*_transformed_args(x))
    _close(got, jax.jit(_transformed(f, jax.jit))(*_transformed_args(x)))


def test_nested_static_and_donated():
    op = _operators(lxd.Auto(cost_model=_MODELS["roll"]))[0]
    lazy = _operators(lxd.Lazy())[0]
    x = jnp.linspace(0.1, 1.0, N)
    inner = lxd.jit(lambda x: _loop(op, x, 4))
    outer = lxd.jit(lambda x: inner(x) + _sum(op, x, 3))
    expected = jax.jit(lambda x: _loop(lazy, x, 4) + _sum(lazy, x, 3))(x)
    _close(outer(x), expected)

    @lxd.jit(static_argnums=1, donate_argnums=0)
    def f(x, k):
        return _loop(op, x, k)

    for k in (2, 3):
        _close(f(jnp.ones(N), k), jax.jit(lambda x: _loop(lazy, x, k))(jnp.ones(N)))


def test_calls_put_inline_are_spliced_into_the_traced_program():
    """Calls put inline (an `Auto` site decided `Lazy`) are replaced by their
    callees' equations in the traced program itself, with fresh variables, outputs
    that forward an input, a dropped output and a call's output read after it:
    a valid jaxpr computing what the program computes, with no call left (the
    callee's constants become the program's)."""
    from lineax_dispatch.program.rewrite._rewrite import inlined_jaxpr

    shift = jnp.asarray(np.linspace(0.0, 1.0, 4))  # a constant of the callee

    @jax.jit
    def inner(a, x):
        return a @ x + shift, x, jnp.sin(x)

    def program(a, x):
        y, same, _ = inner(a, x)
        z, _, w = inner(a, y + same)
        return z * w, same

    a = jnp.asarray(np.arange(16.0).reshape(4, 4) / 16)
    x = jnp.linspace(0.1, 1.0, 4)
    closed = jax.make_jaxpr(program)(a, x)
    sites = [i for i, e in enumerate(closed.jaxpr.eqns) if e.primitive.name == "jit"]
    assert len(sites) == 2
    assert closed.jaxpr.eqns[sites[0]].params["jaxpr"].consts
    spliced = inlined_jaxpr(closed, sites)
    jax.extend.core.check_jaxpr(spliced.jaxpr)
    assert all(e.primitive.name != "jit" for e in spliced.jaxpr.eqns)
    got = jax.extend.core.jaxpr_as_fun(spliced)(a, x)
    for g, e in zip(got, program(a, x)):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_a_spliced_callee_with_constants_is_lowered_from_the_trace():
    """One `Auto` site decided `Lazy` whose callee closes over arrays (constants of
    its jaxpr): spliced into the traced program, its constants the program's, and
    compiled from the trace, it gives `jax.jit`'s result."""
    a = jnp.asarray(np.arange(64.0).reshape(8, 8) / 64)
    shift = jnp.linspace(0.0, 1.0, 8)
    structure = jax.ShapeDtypeStruct((8,), jnp.float64)
    op = lxd.FunctionLinearOperator(
        lambda x: a @ x + jnp.sin(shift) * x, structure, policy=lxd.Auto()
    )
    f = lambda x: jnp.tanh(op.mv(x))
    x = jnp.linspace(0.1, 1.0, 8)
    compiled = lxd.jit(f)
    (decision,) = compiled.decisions(x).values()
    assert decision.strategy == "Lazy"
    assert " call @" not in compiled.lower(x).as_text()
    _close(compiled(x), jax.jit(f)(x))


def test_outputs_are_those_of_jax_jit():
    """Python and NumPy numbers in the output come back as `jax.jit` returns them
    (arrays, weakly typed where Python numbers; also under `vmap`); other non-array
    leaves, which `jax.jit` rejects, come back as they are."""
    numbers = lambda x: (2 * x, 3, 2.5, True, None, np.float32(2), {"k": 1j})
    x = jnp.ones(2)
    ours, theirs = lxd.jit(numbers)(x), jax.jit(numbers)(x)
    flat, tree = jax.tree_util.tree_flatten(ours)
    expected, expected_tree = jax.tree_util.tree_flatten(theirs)
    assert tree == expected_tree
    for a, b in zip(flat, expected):
        assert isinstance(a, jax.Array)
        assert (a.dtype, a.weak_type) == (b.dtype, b.weak_type)
        np.testing.assert_array_equal(a, b)
    pair = lambda x: (x, 3)
    batched = jax.vmap(lxd.jit(pair))(jnp.ones(2))[1]
    assert batched.shape == (2,) and batched.weak_type
    assert lxd.jit(lambda x: (x, "name"))(x)[1] == "name"


def test_number_arguments_equal_only_as_numbers_trace_apart():
    """Python numbers are static arguments (as in `equinox.filter_jit`), and the
    cache tells apart those Python's `==` takes as one: `True`, `1`, `1.0` and
    `1+0j`, and `0.0` and `-0.0`, each give `jax.jit`'s result, not that of the
    first traced."""
    f = lambda x, s: (jnp.asarray(s), 1.0 / (x * s))
    ours, x = lxd.jit(f), jnp.ones(2)
    for s in (True, 1, 1.0, 1 + 0j, 0.0, -0.0, np.float32(0.0), np.float32(-0.0)):
        got, expected = ours(x, s), jax.jit(f)(x, s)
        for a, b in zip(got, expected):
            assert (a.dtype, a.weak_type) == (b.dtype, b.weak_type), s
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), s
    # As keyword and static arguments too.
    g = lxd.jit(lambda x, *, s: x * s)
    assert np.signbit(g(x, s=0.0)).tolist() == [False, False]
    assert np.signbit(g(x, s=-0.0)).tolist() == [True, True]
    h = lxd.jit(lambda x, s: x * s, static_argnums=1)
    assert h(x, 1).dtype == x.dtype and jnp.iscomplexobj(h(x, 1 + 0j))


def test_functions_closing_over_an_enclosing_trace():
    """An `lxd.jit` function called inside another trace (`jax.jit`, `grad`,
    `vmap`) and closing over its values (tracers, which `jax.jit` passes as its
    program's first inputs) gives `jax.jit`'s results, with nothing rewritten and
    with rolled sites; one `lxd.jit` function called in two traces traces for
    each (it crashed: the program's inputs did not match the call's)."""
    x = jnp.arange(4.0)
    op = lxd.MatrixLinearOperator(0.5 * jnp.eye(4), policy=lxd.Roll())
    bodies = (
        lambda y: lambda v: jnp.sin(v) * y,
        lambda y: lambda v: op.mv(op.mv(v) * y),
    )
    for body in bodies:
        for jit in (jax.jit, lxd.jit):
            outer = lambda y, x, jit=jit: jit(body(y))(x)
            got = (
                jax.jit(outer)(2.0, x),
                jax.grad(lambda y: jnp.sum(outer(y, x)))(2.0),
                jax.vmap(outer, in_axes=(0, None))(jnp.arange(1.0, 3.0), x),
            )
            if jit is jax.jit:
                expected = got
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    held = {}
    shared = lxd.jit(lambda v: v * held["y"])
    # (The dict is emptied before each trace ends: it holds no tracer after it.)
    first = lambda y: (held.update(y=y), shared(x), held.clear())[1]
    second = lambda y: (held.update(y=y), shared(x) + 0, held.clear())[1]
    with jax.checking_leaks():
        np.testing.assert_allclose(jax.jit(first)(2.0), 2 * x)
        np.testing.assert_allclose(jax.jit(second)(3.0), 3 * x)


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


def test_a_numpy_array_changed_in_place_is_a_new_static_argument():
    """A NumPy array in a static argument is keyed by its contents: changed in
    place after a call, the next call traces with the new contents."""
    f = lxd.jit(lambda x, w: x * w, static_argnums=1)
    w, x = np.ones(3), jnp.ones(3)
    np.testing.assert_array_equal(f(x, w), np.ones(3))
    w[:] = 5.0
    np.testing.assert_array_equal(f(x, w), 5 * np.ones(3))
