"""How often the user's code is traced, and under which jit-cache context: solves
of `Auto` operators (lineax's solvers and ours) under `jax.jit` and `lxd.jit`,
eager `mv` and eager `Materialise`, and our solvers' set-up and loops (this
package's code, reusing earlier traces) against the operator's `mv` (the user's,
traced for each program)."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd


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


@pytest.mark.parametrize(
    "solver", [lxd.CG(1e-10, 1e-10), lxd.LSMR(1e-10, 1e-10)], ids=["CG", "LSMR"]
)
def test_solver_loops_trace_the_user_s_code_for_each_program(solver):
    """Our solvers build their loops under JAX's default jit-cache context (their
    `jax.numpy` calls reuse earlier traces) and apply the operator under the
    program's own. A jitted function of the user's that applies an `Auto`
    operator, inside a (plain lineax) operator and called in the program itself,
    is never taken from another program's trace: each program decides its own
    call sites of the `Auto` operator."""
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
    expected = np.linalg.solve(a + np.eye(8), b) + (a + np.eye(8)) @ np.asarray(b)
    for _ in range(2):
        traces.clear()
        f = lxd.jit(lambda b: lx.linear_solve(outer, b, solver).value + fn(b))
        np.testing.assert_allclose(f(b), expected, rtol=1e-8)
        assert traces
        assert len(f.decisions(b)) == 1  # the call site of `inner` in `fn(b)`


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
    from lineax_dispatch.program._session import PASS_CONTEXT
    from lineax_dispatch.solvers.skeleton import _one_site_solver as _base

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


class _Config:
    """A user's object in an operator's static part: `__eq__` without `__hash__`
    (so unhashable)."""

    def __init__(self, c):
        self.c = c

    def __eq__(self, other):
        return isinstance(other, _Config) and self.c == other.c


@pytest.mark.parametrize("policy", [lxd.Lazy(), lxd.Auto(), lxd.Roll()])
def test_an_unhashable_static_part_is_keyed_by_identity(policy):
    """An operator whose static part holds an unhashable object (lineax accepts
    one) applies eagerly, under `jax.jit` and under `lxd.jit`, as lineax's."""
    x0, v = jnp.arange(3.0), jnp.ones(3)
    fn = lambda x, args: jnp.sin(x) * args.c
    ours = [
        lxd.JacobianLinearOperator(fn, x0, _Config(c), policy=policy) for c in (2, 3)
    ]
    theirs = [lx.JacobianLinearOperator(fn, x0, _Config(c)) for c in (2, 3)]
    run = lambda ops: [op.mv(v) for op in ops]
    expected = run(theirs)
    for got in (run(ours), jax.jit(lambda: run(ours))(), lxd.jit(lambda: run(ours))()):
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("policy", [lxd.Lazy(), lxd.Auto(), lxd.Roll()])
def test_operators_of_static_parts_equal_only_as_numbers_share_no_callee(policy):
    """Two operators whose static parts are equal as Python numbers but not of one
    type or the same bits (`1` and `1+0j`; `0.0` and `-0.0`) are two kinds, each
    with its own compiled `mv`, eagerly and under a jit, as lineax (which caches
    nothing) traces each afresh."""
    x0, v = jnp.array([1.0, 2.0]), jnp.ones(2)
    scale = lambda x, a: x * a
    sign = lambda x, a: x * jnp.copysign(1.0, a)
    for fn, first, second in [(scale, 1, 1 + 0j), (sign, 0.0, -0.0)]:
        pair = (first, second)
        ours = [lxd.JacobianLinearOperator(fn, x0, a, policy=policy) for a in pair]
        theirs = [lx.JacobianLinearOperator(fn, x0, a) for a in pair]
        eager = lambda ops: [op.mv(v) for op in ops]
        jitted = lambda ops: jax.jit(lambda v: [op.mv(v) for op in ops])(v)
        for run in (eager, jitted):
            for a, b in zip(run(ours), run(theirs)):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b)


_DEFAULT_POLICY_SOLVERS = {
    "CG": (lxd.CG(1e-10, 1e-10), True),
    # Three `mv` sites, one traced call of an operator of ours.
    "CG-inline": (lxd.CG(1e-10, 1e-10, layout="inline"), True),
    "MINRES": (lxd.MINRES(1e-10, 1e-10), True),
    "GMRES": (lxd.GMRES(1e-10, 1e-10), False),
    "BiCGStab": (lxd.BiCGStab(1e-10, 1e-10), False),
    "LSMR": (lxd.LSMR(1e-10, 1e-10), False),
    "Normal-CG": (lxd.Normal(lxd.CG(1e-10, 1e-10)), False),
    "Normal-GMRES": (lxd.Normal(lxd.GMRES(1e-10, 1e-10)), False),
    "AutoSolver": (lxd.AutoSolver(), False),
}


@pytest.mark.parametrize("closure_convert", [True, False], ids=["converted", "plain"])
@pytest.mark.parametrize("jit", [jax.jit, lxd.jit], ids=["jax.jit", "lxd.jit"])
@pytest.mark.parametrize("name", list(_DEFAULT_POLICY_SOLVERS))
def test_each_solver_traces_the_function_at_most_twice_per_solve(
    name, jit, closure_convert
):
    """With the default policy, a jitted solve by each solver of ours traces the
    user's function at most twice after the operator's construction (lineax's
    primitive: its abstract evaluation and its lowering): the output structure is
    known from construction, and the conjugate that `Normal` and LSMR transpose
    is traced as the user's code, where the solve's `mv` finds it."""
    solver, needs_tag = _DEFAULT_POLICY_SOLVERS[name]
    n, counter = 12, []
    a = np.eye(n) * 4 + 0.3 * np.random.default_rng(0).standard_normal((n, n))
    a = jnp.asarray(a @ a.T if needs_tag else a)

    def fn(x):
        counter.append(1)
        return a @ x

    tags = (lx.positive_semidefinite_tag,) if needs_tag else ()
    structure = jax.ShapeDtypeStruct((n,), jnp.float64)
    op = lxd.FunctionLinearOperator(fn, structure, tags, closure_convert)
    counter.clear()
    b = jnp.arange(1.0, n + 1.0)
    f = jit(lambda b: lx.linear_solve(op, b, solver).value)
    f.lower(b)
    assert len(counter) <= 2
    np.testing.assert_allclose(f(b), np.linalg.solve(np.asarray(a), b), rtol=1e-6)


def test_function_and_jacobian_operators_know_their_output_structure():
    """`out_structure()` is kept from construction (lineax's evaluates the function
    abstractly at each call); it agrees with lineax's, weak types stripped, for
    a PyTree output, and for the transpose (a function of a traced transpose)."""
    counter = []

    def fn(x):
        counter.append(1)
        return {"a": 2.0 * x[:2], "b": jnp.sum(x)}

    structure = jax.ShapeDtypeStruct((3,), jnp.float32)
    for closure_convert in (True, False):
        ours = lxd.FunctionLinearOperator(fn, structure, (), closure_convert)
        theirs = lx.FunctionLinearOperator(fn, structure, (), closure_convert)
        counter.clear()
        assert ours.out_structure() == theirs.out_structure()
        assert ours.T.out_structure() == theirs.T.out_structure()
        assert ours.T.in_structure() == theirs.T.in_structure()
        counter.clear()
        for _ in range(3):
            ours.out_structure()
        assert not counter

    def residual(x, args):
        counter.append(1)
        return (jnp.sin(x) * args, x[0])

    x0 = jnp.arange(3.0, dtype=jnp.float32)
    ours = lxd.JacobianLinearOperator(residual, x0, 2.0)
    theirs = lx.JacobianLinearOperator(residual, x0, 2.0)
    counter.clear()
    assert ours.out_structure() == theirs.out_structure()
    counter.clear()
    ours.out_structure()
    assert not counter
    np.testing.assert_allclose(
        ours.mv(jnp.ones(3, jnp.float32))[0], theirs.mv(jnp.ones(3, jnp.float32))[0]
    )
