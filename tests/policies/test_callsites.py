"""How many times the user's function is traced, and how many call sites of it end
up in the compiled program, under each policy."""

import jax
import jax.extend
import jax.numpy as jnp
import lineax as lx
import pytest

import lineax_dispatch as lxd
from lineax_dispatch import _compat


N = 6


def _counted_operator(policy, counter):
    matrix = jnp.arange(N * N, dtype=jnp.float32).reshape(N, N) / N**2 + jnp.eye(
        N, dtype=jnp.float32
    )

    def fn(x):
        counter.append(1)
        return matrix @ x

    # closure_convert=False: the Python function then runs at each trace of `mv`,
    # rather than once when the operator is built.
    op = lxd.FunctionLinearOperator(
        fn,
        jax.ShapeDtypeStruct((N,), jnp.float32),
        closure_convert=False,
        policy=policy,
    )
    op.out_structure()  # lineax caches one shape evaluation; take it out of the count
    counter.clear()
    return op, matrix


def _four_sites(op):
    def f(x):
        return op.mv(x) + op.mv(2 * x) + op.mv(jnp.sin(x)) + op.mv(x**2)

    return f


@pytest.mark.parametrize(
    "policy, at_compile, at_first_run",
    [
        # Lazy: traced once (one marked call, shared by the 4 call sites) and
        # compiled at each of them (XLA inlines it: see program/test_roll.py).
        (lxd.Lazy(), 1, 0),
        # Outline: traced once with the outer program (its marked callee, shared
        # by the 4 call sites, whose closed-over values become inputs); the single
        # outlined callee is compiled from that trace at the first run, without
        # running the function again.
        (lxd.Outline(), 1, 0),
    ],
)
def test_python_function_runs_per_policy(policy, at_compile, at_first_run):
    counter = []
    op, matrix = _counted_operator(policy, counter)
    f = _four_sites(op)
    x = jnp.linspace(0.0, 1.0, N, dtype=jnp.float32)
    compiled = jax.jit(f).trace(x).lower().compile()
    assert len(counter) == at_compile
    out = compiled(x)
    assert len(counter) == at_compile + at_first_run
    compiled(x)
    assert len(counter) == at_compile + at_first_run
    expected = matrix @ (x + 2 * x + jnp.sin(x) + x**2)
    assert jnp.allclose(out, expected, rtol=1e-5)


def _count_equations(jaxpr, predicate, stop=lambda eqn: False):
    """Equations of `jaxpr` satisfying `predicate`, at any depth, not looking into
    those satisfying `stop`."""
    count = 0
    for eqn in jaxpr.eqns:
        if predicate(eqn):
            count += 1
        if stop(eqn):
            continue
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            count += _count_equations(sub, predicate, stop)
    return count


def _is_outlined(eqn):
    """An out-of-line call: a host callback (`noinline`, jax 0.10) or a call
    marked `jax.Inline.XLA_LATE` (jax >= 0.11)."""
    return eqn.primitive.name == "noinline" or _compat.is_outlined_call(eqn)


@pytest.mark.parametrize("policy, sites", [(lxd.Lazy(), 4), (lxd.Outline(), 0)])
def test_sites_in_jaxpr(policy, sites):
    """The design's counting method: a uniquely named `jax.jit` around the user's
    function, counted in the traced program (recursing into sub-jaxprs, but not
    into out-of-line calls, whose callee is compiled once for all of them)."""
    matrix = jnp.eye(N, dtype=jnp.float32) * 2

    @jax.jit
    def unique_mv_marker(x):
        return matrix @ x

    op = lxd.FunctionLinearOperator(
        unique_mv_marker, jax.ShapeDtypeStruct((N,), jnp.float32), policy=policy
    )
    x = jnp.ones(N, jnp.float32)
    jaxpr = jax.jit(_four_sites(op)).trace(x).jaxpr.jaxpr
    is_marker = lambda e: "unique_mv_marker" in str(e.params.get("name", ""))
    assert _count_equations(jaxpr, is_marker, _is_outlined) == sites
    assert _count_equations(jaxpr, _is_outlined) == (4 if sites == 0 else 0)
    if sites == 0 and _compat.XLA_OUTLINE is not None:
        # One callee for the four calls.
        callees = set()
        _count_equations(
            jaxpr, lambda e: _is_outlined(e) and callees.add(id(e.params["jaxpr"]))
        )
        assert len(callees) == 1


def test_materialise_traces_inside_matrix_build():
    counter = []
    op, matrix = _counted_operator(lxd.Materialise(batch_size=2), counter)
    x = jnp.linspace(0.0, 1.0, N, dtype=jnp.float32)
    out = jax.jit(lambda v: op.mv(v))(x)
    # One trace, inside the `lax.map` body that builds the matrix.
    assert len(counter) == 1
    assert jnp.allclose(out, matrix @ x, rtol=1e-5)


def test_outermost_policy_decides():
    """Inside an outlined sum, the materialising child is applied inline (its own
    policy is skipped), so the child's function is traced for the callee only."""
    counter = []
    child, matrix = _counted_operator(lxd.Materialise(), counter)
    total = lxd.AddLinearOperator(
        child, lxd.IdentityLinearOperator(child.in_structure()), policy=lxd.Outline()
    )
    x = jnp.linspace(0.0, 1.0, N, dtype=jnp.float32)
    out = jax.jit(_four_sites(total))(x)
    assert len(counter) == 1  # the callee's compile (shapes need no trace)
    y = x + 2 * x + jnp.sin(x) + x**2
    assert jnp.allclose(out, matrix @ y + y, rtol=1e-5)


def test_outline_with_lineax_solver_runs_the_function_once_per_trace_of_the_callee():
    counter = []
    op, matrix = _counted_operator(lxd.Outline(), counter)
    b = jnp.ones(N, jnp.float32)
    solver = lx.GMRES(rtol=1e-6, atol=1e-6)
    x = jax.jit(lambda v: lx.linear_solve(op, v, solver).value)(b)
    assert jnp.allclose(matrix @ x, b, atol=1e-4)
    # lineax's GMRES writes `mv` at two places; both call the one outlined callee.
    assert len(counter) <= 2


def _eqn_names(jaxpr) -> list[str]:
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names += _eqn_names(sub)
    return names


@pytest.mark.parametrize("policy", [lxd.Lazy(), lxd.Auto()], ids=["Lazy", "Auto"])
def test_under_jax_jit_the_program_is_lineax_s(policy):
    """Under a plain `jax.jit`, an operator applied inline is traced once for its
    four sites, and the traced program is lineax's equation for equation (no call
    equation to lower and compile)."""
    counter = []
    op, matrix = _counted_operator(policy, counter)
    x = jnp.linspace(0.1, 1.0, N, dtype=jnp.float32)
    ours = jax.jit(_four_sites(op)).trace(x).jaxpr.jaxpr
    assert len(counter) == 1
    theirs = lx.FunctionLinearOperator(
        lambda v: matrix @ v, jax.ShapeDtypeStruct((N,), jnp.float32)
    )
    reference = jax.jit(_four_sites(theirs)).trace(x).jaxpr.jaxpr
    assert "jit" not in _eqn_names(ours)
    assert _eqn_names(ours) == _eqn_names(reference)


def test_a_new_operator_kind_is_traced_without_comparing_earlier_kinds(monkeypatch):
    """Each operator kind's marked call is a `jax.jit` of its own: tracing a program
    after many other kinds were applied compares no kind's key with another's
    (with one `jax.jit` taking the key as a static argument, jax's cache of
    argument shardings held every kind under one hash, and each trace compared
    its key with all of them)."""
    from lineax_dispatch.policies.calls import _keys as _marked

    compared = []
    equal = _marked.HashedKey.__eq__
    counted = lambda self, other: compared.append(1) or equal(self, other)
    monkeypatch.setattr(_marked.HashedKey, "__eq__", counted)
    x = jnp.linspace(0.1, 1.0, N, dtype=jnp.float32)
    kept = []
    for scale in range(1, 41):
        # A new function per operator: a new kind (kept alive, as its cache is).
        matrix = scale * jnp.eye(N, dtype=jnp.float32)
        fn = lambda v, matrix=matrix: matrix @ v
        structure = jax.ShapeDtypeStruct((N,), jnp.float32)
        op = lxd.FunctionLinearOperator(fn, structure, policy=lxd.Lazy())
        kept.append(op)
        jax.jit(lambda v, op=op: op.mv(v) + op.mv(2 * v)).trace(x)
    # Equal keys may be compared (a kind's second site finds its first's jit);
    # before, the 40 traces compared keys about 800 times.
    assert len(compared) <= 2 * len(kept)
