"""Calls of an `Auto` operator decided `Lazy` under `lxd.jit` are spliced into the
traced program (their callees' equations, with fresh variables and the callees'
constants): one call run once is lowered as lineax's, with no call left."""

import jax
import jax.numpy as jnp
import numpy as np

import lineax_dispatch as lxd

from ..helpers.roll_programs import (
    _close,
    _operators,
    _transformed,
    _transformed_args,
    N,
)


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


def test_calls_put_inline_are_spliced_into_the_traced_program():
    """Calls put inline (an `Auto` site decided `Lazy`) are replaced by their
    callees' equations in the traced program itself, with fresh variables, outputs
    that forward an input, a dropped output and a call's output read after it:
    a valid jaxpr computing what the program computes, with no call left (the
    callee's constants become the program's)."""
    from lineax_dispatch.program.rewrite._inline import inlined_jaxpr

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


def test_calls_put_inline_after_a_rolled_group_are_spliced_too():
    """A program whose last rewrite rolls a group's sites, and which also calls an
    `Auto` operator once (decided `Lazy`): that call is put inline in the rolled
    program too, not left a call to lower and compile."""
    rolled = _operators(lxd.Roll())[0]
    a = jnp.asarray(np.arange(36.0).reshape(6, 6) / 36)
    single = lxd.FunctionLinearOperator(
        lambda x: a @ x + 0.5 * x,
        jax.ShapeDtypeStruct((N,), jnp.float64),
        policy=lxd.Auto(),
    )

    def f(x):
        for i in range(4):
            x = rolled.mv(x) * (1.0 + 0.1 * i)
        return jnp.sin(single.mv(x))

    x = jnp.linspace(0.1, 1.0, N)
    compiled = lxd.jit(f)
    (decision,) = compiled.decisions(x).values()
    assert decision.strategy == "Lazy"
    _close(compiled(x), jax.jit(f)(x))
    (entry,) = compiled._compiled.values()
    top = [e.primitive.name for e in entry.program.jaxprs["while"].jaxpr.eqns]
    assert "while" in top and "jit" not in top, top


def _marked_callees(jaxpr, found=None):
    """The callees of every `Auto` operator's marked call in `jaxpr`, any depth."""
    found = [] if found is None else found
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "jit" and str(eqn.params["name"]).startswith(
            "lineax_dispatch_mv_auto"
        ):
            found.append(eqn.params["jaxpr"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _marked_callees(sub, found)
    return found


# A module's array, as a user's function reads it (a global, not a closure cell:
# equinox makes the arrays of a closure's cells leaves of the function).
_MATRIX = jnp.asarray(np.eye(N) * 2.0 + 0.1, jnp.float64)


def test_arrays_the_function_closes_over_are_passed_to_calls_in_loops():
    """An operator made outside the program whose function reads a global matrix,
    applied in a loop body and decided `Lazy`: its call stays in the loop, and the
    matrix is passed to it (a constant of the program, as under `jax.jit`) rather
    than held by the callee, which XLA:CPU compiles far slower."""
    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    op = lxd.FunctionLinearOperator(lambda x: _MATRIX @ x, structure)

    def f(x):
        step = lambda i, v: op.mv(v) / jnp.linalg.norm(op.mv(v))
        return jax.lax.fori_loop(0, 3, step, x)

    x = jnp.linspace(0.1, 1.0, N)
    compiled = lxd.jit(f)
    _close(compiled(x), jax.jit(f)(x))
    assert [d.strategy for d in compiled.decisions(x).values()] == ["Lazy"]
    callees = _marked_callees(jax.make_jaxpr(compiled)(x).jaxpr)
    assert callees
    for callee in callees:
        assert not callee.consts
        assert [v.aval.shape for v in callee.jaxpr.invars] == [(N, N), (N,)]
    _close(jax.grad(lambda x: compiled(x).sum())(x), jax.grad(lambda x: f(x).sum())(x))
    xs = jnp.stack([x, 2.0 * x])
    _close(jax.vmap(compiled)(xs), jax.vmap(jax.jit(f))(xs))
