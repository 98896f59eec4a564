"""`lxd.jit` with `Auto`: one trace, decisions read from the traced program, the
program rewritten (rolled, or one matrix for the program, or left inline), and
`jax.jit`'s results under jit, grad, jvp and vmap on the zoo of test_roll.py."""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
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


def test_an_operator_at_many_sites_is_partitioned_once(monkeypatch):
    """An `Auto` operator applied at 16 sites of an `lxd.jit` program is split into
    its kind key and arrays once (at its first `mv`), not at every site; what that
    keeps holds the trace's tracers and is dropped when the trace ends."""
    from lineax_dispatch.policies import _auto, _registry

    keys = []
    operator_key = _registry.operator_key
    counted = lambda op: keys.append(1) or operator_key(op)
    for module in (_registry, _auto):
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


def _counted(policy, counter, n=8):
    a = jnp.asarray(np.eye(n) * 3 + 0.1)

    def fn(x):
        counter.append(1)
        return a @ x

    structure = jax.ShapeDtypeStruct((n,), jnp.float64)
    op = lxd.FunctionLinearOperator(
        fn,
        structure,
        lx.positive_semidefinite_tag,
        closure_convert=False,
        policy=policy,
    )
    counter.clear()  # lineax's shape evaluation at construction
    return op, a


@pytest.mark.parametrize("jit", [jax.jit, lxd.jit], ids=["jax.jit", "lxd.jit"])
def test_solves_under_auto_trace_the_function_at_most_twice(jit):
    """lineax traces a solve's operator twice (its primitive's abstract evaluation
    and its lowering); under Auto every mv of lineax's solvers shares those. Our
    solvers take the cost of one mv for their decision in `init`, and the
    primitive's abstract evaluation then shares that trace: twice too, at the
    first solve and at the next."""
    solvers = {
        "lx.CG": lx.CG(1e-10, 1e-10),
        "lx.GMRES": lx.GMRES(1e-10, 1e-10),
        "lx.BiCGStab": lx.BiCGStab(1e-10, 1e-10),
        # Ours decide in `prepare`, one code path for all: a square and a
        # least-squares solver.
        "lxd.CG": lxd.CG(1e-10, 1e-10),
        "lxd.LSMR": lxd.LSMR(1e-10, 1e-10),
    }
    b = jnp.arange(1.0, 9.0)
    for name, solver in solvers.items():
        counter = []
        op, a = _counted(lxd.Auto(), counter)
        f = jit(lambda b: lx.linear_solve(op, b, solver).value)
        np.testing.assert_allclose(f(b), np.linalg.solve(a, b), rtol=1e-8)
        assert len(counter) <= 2, name
        counter.clear()
        # Lowering traces all there is to trace (no need to compile it too).
        jit(lambda b: lx.linear_solve(op, 2 * b, solver).value).lower(b)
        assert len(counter) <= 2, name


@pytest.mark.parametrize("policy", [lxd.Auto(), lxd.Lazy(), lxd.Roll()])
def test_eager_mv_traces_once_for_three_calls(policy):
    counter = []
    op, a = _counted(policy, counter)
    for scale in (1.0, 2.0, 3.0):
        v = jnp.arange(8.0) * scale
        np.testing.assert_allclose(op.mv(v), a @ v, rtol=1e-12)
    assert len(counter) == 1


@pytest.mark.parametrize("batch_size", [None, 3])
def test_eager_materialise_builds_once_per_operator(batch_size):
    """Eagerly, a Materialise operator builds its matrix at its first `mv` and
    reuses it (its function never runs again); another operator object builds its
    own."""
    runs = []
    a = jnp.asarray(np.eye(8) * 3 + 0.1)

    def fn(x):
        jax.debug.callback(lambda: runs.append(1))
        return a @ x

    def make():
        structure = jax.ShapeDtypeStruct((8,), jnp.float64)
        policy = lxd.Materialise(batch_size=batch_size)
        return lxd.FunctionLinearOperator(fn, structure, policy=policy)

    op = make()
    for scale in (1.0, 2.0, 3.0):
        v = jnp.arange(8.0) * scale
        np.testing.assert_allclose(op.mv(v), a @ v, rtol=1e-12)
        if scale == 1.0:
            built = len(runs)
            assert built > 0
    assert len(runs) == built
    other = make()
    np.testing.assert_allclose(other.mv(jnp.ones(8)), a @ jnp.ones(8), rtol=1e-12)
    assert len(runs) == 2 * built


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


@pytest.mark.parametrize(
    "solver", [lxd.CG(1e-10, 1e-10), lxd.LSMR(1e-10, 1e-10)], ids=["CG", "LSMR"]
)
def test_solver_loops_trace_the_user_s_code_for_each_program(solver):
    """Our solvers build their loops under JAX's default jit-cache context (their
    `jax.numpy` calls reuse earlier traces) and apply the operator under the
    program's own: a jitted function of the user's inside a (plain lineax)
    operator, which may apply `Auto` operators, is traced for every `lxd.jit`
    program, as the program's other code is, never taken from another's trace."""
    traces, counter = [], []
    inner, a = _counted(lxd.Auto(), counter)

    @jax.jit
    def fn(x):
        traces.append(1)
        return inner.mv(x) + x

    structure = jax.ShapeDtypeStruct((8,), jnp.float64)
    tag = lx.positive_semidefinite_tag
    outer = lx.FunctionLinearOperator(fn, structure, tag, closure_convert=False)
    b = jnp.arange(1.0, 9.0)
    expected = np.linalg.solve(a + np.eye(8), b)
    for _ in range(2):
        traces.clear()
        f = lxd.jit(lambda b: lx.linear_solve(outer, b, solver).value)
        np.testing.assert_allclose(f(b), expected, rtol=1e-8)
        assert traces


@pytest.mark.parametrize(
    "solver", [lxd.CG(1e-10, 1e-10), lxd.GMRES(1e-10, 1e-10)], ids=["CG", "GMRES"]
)
def test_solver_set_up_runs_as_own_code(solver, monkeypatch):
    """In the program's trace, a solve's set-up around the loop (the flat system,
    the starting point, the scale of the right-hand side) is this package's code:
    built under JAX's default jit-cache context, so its `jax.numpy` calls reuse
    their traces from earlier programs, while the operator's `mv` (the user's
    code) runs under the program's own context. The program is then lowered
    under the caller's context."""
    from lineax_dispatch.policies._registry import PASS_CONTEXT
    from lineax_dispatch.solvers import _base

    set_up, user = [], []
    original = _base.plain_system

    def plain_system(*args, **kwargs):
        set_up.append(PASS_CONTEXT.value)
        return original(*args, **kwargs)

    monkeypatch.setattr(_base, "plain_system", plain_system)
    a = jnp.asarray(np.eye(8) * 3 + 0.1)

    def fn(x):
        user.append(PASS_CONTEXT.value)
        return a @ x

    structure = jax.ShapeDtypeStruct((8,), jnp.float64)
    op = lx.FunctionLinearOperator(
        fn, structure, lx.positive_semidefinite_tag, closure_convert=False
    )
    user.clear()  # lineax's shape evaluation at construction, outside any program
    b = jnp.arange(1.0, 9.0)
    f = lxd.jit(lambda b: lx.linear_solve(op, b, solver).value)
    f.decisions(b)  # the program's one trace
    assert set_up and all(value is None for value in set_up)
    assert user and all(value is not None for value in user)
    # Lowered under the caller's context (the decisions are fixed by then):
    # lineax traces its solver again, and everything in it reuses earlier traces.
    user.clear()
    f.lower(b)
    assert user and all(value is None for value in user)
    np.testing.assert_allclose(f(b), np.linalg.solve(np.asarray(a), b), rtol=1e-8)


def test_calls_put_inline_are_spliced_into_the_traced_program():
    """Calls put inline (an `Auto` site decided `Lazy`) are replaced by their
    callees' equations in the traced program itself, with fresh variables, outputs
    that forward an input, a dropped output and a call's output read after it:
    a valid jaxpr computing what the program computes, with no call left (the
    callee's constants become the program's)."""
    from lineax_dispatch.policies._rewrite import inlined_jaxpr

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
