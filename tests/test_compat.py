"""`lineax_dispatch/_compat.py` holds every private JAX, equinox and lineax name the
package uses. These tests exercise each one directly, so that an upstream release
that moves or changes one fails here, naming it, rather than somewhere deep in a
policy or solver test."""

import inspect
import weakref

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np

from lineax_dispatch import _compat, _jaxpr


def test_hashable_partition_combine():
    """`equinox._compile_utils.hashable_partition` / `hashable_combine`."""
    tree = {"a": jnp.arange(3.0), "b": (2, "x"), "c": np.float32(1.5)}
    dynamic, static = _compat.hashable_partition(tree, lambda x: isinstance(x, str))
    leaves, treedef = jtu.tree_flatten(tree)
    assert isinstance(dynamic, tuple) and len(dynamic) == len(leaves), (
        "equinox's hashable_partition changed: dynamic leaves are no longer a tuple "
        "with one entry per leaf"
    )
    static_leaves, static_treedef = static
    assert static_treedef == treedef
    assert [d is None for d in dynamic] == [s is not None for s in static_leaves]
    assert "x" in dynamic
    rebuilt = _compat.hashable_combine(dynamic, static)
    assert jtu.tree_structure(rebuilt) == treedef
    for x, y in zip(jtu.tree_leaves(rebuilt), leaves):
        assert x is y

    # Arrays out, the rest static: the static part is hashable and equal for equal
    # trees with different array values (what our marked calls key on).
    tree2 = dict(tree, a=jnp.ones(3))
    _, static1 = _compat.hashable_partition(tree, lambda x: isinstance(x, jax.Array))
    _, static2 = _compat.hashable_partition(tree2, lambda x: isinstance(x, jax.Array))
    assert hash(static1) == hash(static2) and static1 == static2


def test_linear_solve_sentinel():
    """The default of `lineax.linear_solve`'s `state`, which our `linear_solve`
    passes on: lineax must still read it as "no state given"."""
    default = inspect.signature(lx.linear_solve).parameters["state"].default
    assert default is _compat.sentinel
    assert default is not None and default is not inspect.Parameter.empty
    operator = lx.MatrixLinearOperator(jnp.array([[2.0, 0.0], [0.0, 4.0]]))
    vector = jnp.array([2.0, 4.0])
    solution = lx.linear_solve(operator, vector, lx.LU(), state=_compat.sentinel)
    np.testing.assert_allclose(solution.value, [1.0, 1.0])


def test_root_trace_ref():
    """`jax._src.core.trace_ctx`, `EvalTrace`, `parent_trace`, `_weakref`."""
    assert _compat.root_trace_ref() is None  # eager
    roots = []  # the traces themselves, held while we compare them

    def record(x):
        ref = _compat.root_trace_ref()
        assert isinstance(ref, weakref.ref) and ref() is not None
        roots.append(ref())
        return x

    def outer(x):
        record(x)
        x = jax.vmap(record)(x[None])[0]
        x = jax.jit(record)(x)
        return jax.lax.fori_loop(0, 2, lambda i, y: record(y), x)

    jax.jit(outer)(jnp.zeros(2))
    assert len(roots) == 4
    assert all(root is roots[0] for root in roots), (
        "jax's trace parents changed: sub-traces of one jit no longer share a root"
    )
    jax.jit(record)(jnp.ones(3))
    assert roots[-1] is not roots[0]


def _traced_here(x):
    return jnp.sin(x) * 2.0


def test_bind_equation_and_traceback_frames():
    """`jax._src.source_info_util` and `JaxprEqn.ctx`, as `eval_jaxpr` uses them."""
    x = jnp.arange(3.0)
    jaxpr = jax.make_jaxpr(_traced_here)(x)
    values = {id(v): a for v, a in zip(jaxpr.jaxpr.invars, [x])}
    frames = []
    for eqn in jaxpr.jaxpr.eqns:
        invals = [
            v.val if isinstance(v, jax.extend.core.Literal) else values[id(v)]
            for v in eqn.invars
        ]
        outs = _compat.bind_equation(eqn, invals)
        assert isinstance(outs, list) and len(outs) == len(eqn.outvars)
        values.update({id(v): o for v, o in zip(eqn.outvars, outs)})
        frames.append(_compat.traceback_frames(eqn))
    out = values[id(jaxpr.jaxpr.outvars[0])]
    np.testing.assert_allclose(out, _traced_here(x))

    # Every equation was traced on the line of `_traced_here` in this file.
    line = inspect.getsourcelines(_traced_here)[1] + 1
    for eqn_frames in frames:
        assert all(isinstance(f, str) and isinstance(n, int) for f, n in eqn_frames)
        assert (__file__, line) in eqn_frames, eqn_frames


def test_traced_consts():
    """What a jitted function closes over from the trace it is traced in: the first
    inputs of its program."""
    from lineax_dispatch._compat import traced_consts

    def outer(m):
        traced = jax.jit(lambda v: m @ v).trace(jnp.ones(2))
        (const,) = traced_consts(traced)
        assert const is m
        assert len(traced.jaxpr.jaxpr.invars) == 2
        assert traced_consts(jax.jit(lambda v: 2 * v).trace(jnp.ones(2))) == ()
        return m

    jax.make_jaxpr(outer)(jnp.eye(2))


def test_closure_converted_jaxprs_and_their_constants():
    """Why lineax alone leaks tracers on jax >= 0.11 (see `tests/helpers/leaks.py`):
    there a jaxpr is its own closed form and carries its constants' values, so the
    jaxpr `equinox.filter_closure_convert` keeps in its static part holds the
    tracers it closed over; on jax 0.10 the static jaxpr is open and holds none.
    Should either change, the leak exemptions of `tests/helpers/leaks.py` are to be
    looked at again."""
    import equinox as eqx

    seen = []

    def outer(m):
        converted = eqx.filter_closure_convert(lambda v: m @ v, jnp.ones(2))
        seen.append(any(_compat.is_tracer(c) for c in converted.consts))
        held = list(getattr(converted.jaxpr, "consts", ()))
        seen.append(any(_compat.is_tracer(c) for c in held))
        return converted(jnp.ones(2))

    jax.make_jaxpr(outer)(jnp.eye(2))
    merged = jax.extend.core.ClosedJaxpr is jax.extend.core.Jaxpr
    assert seen == [True, merged], (merged, seen)


def test_equation_parameters():
    """`scan_counts`, `scan_length`, `call_callee`, `call_name`: the parameters of
    `scan` and `jit` equations, whichever form this JAX gives them."""
    m = jnp.arange(3.0)

    def f(x):
        (c, d), ys = jax.lax.scan(
            lambda c, x: ((c[0] + x * m, c[1] * 2.0), c[0] * x), (x, x[0, 0]), x
        )
        named = jax.jit(lambda y: y * m)
        return c, d, ys, named(x), named(2 * x)

    jaxpr = jax.make_jaxpr(f)(jnp.ones((3, 3))).jaxpr
    (scan,) = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    consts, carried = _compat.scan_counts(scan)
    assert carried == 2 and consts == len(scan.invars) - 3
    assert _jaxpr.scan_length(scan) == 3
    calls = [e for e in jaxpr.eqns if e.primitive.name == "jit"]
    assert len(calls) == 2 and all(_jaxpr.call_name(e) == "<lambda>" for e in calls)
    assert _jaxpr.call_name(scan) is None
    callee = _compat.call_callee(calls[0])
    assert callee is _compat.call_callee(calls[1])  # one trace for both calls
    assert hasattr(callee, "jaxpr") and hasattr(callee, "consts")
    assert [v.aval.shape for v in callee.jaxpr.outvars] == [(3, 3)]


def test_inline_marks():
    """`JAX_INLINE` puts a nested call's equations in the caller; `XLA_OUTLINE`
    (jax >= 0.11 only) keeps one call equation, lowered as a call of one function
    marked for XLA to inline late."""
    inner = lambda y: jnp.sin(y) * 2.0
    inlined = jax.make_jaxpr(lambda x: jax.jit(inner, inline=_compat.JAX_INLINE)(x))
    assert [e.primitive.name for e in inlined(1.0).eqns] == ["sin", "mul"]
    assert _compat.XLA_OUTLINE is None or hasattr(jax, "Inline")
    if _compat.XLA_OUTLINE is None:
        assert not hasattr(jax, "Inline")
        return
    outlined = jax.jit(inner, inline=_compat.XLA_OUTLINE)
    program = lambda x: outlined(x) + outlined(2 * x)
    (first, second) = [
        e for e in jax.make_jaxpr(program)(1.0).eqns if e.primitive.name == "jit"
    ]
    assert _compat.is_outlined_call(first) and _compat.is_outlined_call(second)
    plain = [e for e in jax.make_jaxpr(lambda x: jax.jit(inner)(x))(1.0).eqns]
    assert not _compat.is_outlined_call(plain[0])
    assert _compat.is_outlined_call(_compat.outlined_call(plain[0]))
    text = jax.jit(program).lower(1.0).as_text()
    assert text.count('inlineable = "xla_late"') == 2
    assert text.count("stablehlo.sine") == 1


def test_with_jaxpr():
    """`with_jaxpr`: a `jax.stages.Traced` with its program replaced, lowered and
    run without tracing again."""
    traced = jax.jit(lambda x: x * 2.0).trace(jnp.ones(3))
    other = jax.make_jaxpr(lambda x: x * 3.0)(jnp.ones(3))
    replaced = _compat.with_jaxpr(traced, other)
    assert replaced is not None, "jax.stages.Traced changed: update _compat.with_jaxpr"
    np.testing.assert_allclose(replaced.lower().compile()(jnp.ones(3)), 3.0)


def test_live_equations():
    """`partial_eval.dce_jaxpr`: the equations no output depends on are dropped, the
    inputs kept."""

    def f(x, y):
        unused = jnp.sin(y) * 3.0
        del unused
        return 2.0 * x

    closed = jax.make_jaxpr(f)(jnp.ones(3), jnp.ones(3))
    pruned = _compat.live_equations(closed.jaxpr)
    assert [e.primitive.name for e in pruned.eqns] == ["mul"]
    assert len(pruned.invars) == 2
    out = jax.core.eval_jaxpr(pruned, closed.consts, jnp.ones(3), jnp.ones(3))
    np.testing.assert_allclose(out[0], 2.0 * jnp.ones(3))


def test_executable_call():
    """`jax.stages.Compiled._call`: the C++ call a `Compiled` makes at its first
    call, which `lxd.jit` calls directly for a repeated signature."""
    compiled = jax.jit(lambda x: (2 * x, jnp.sum(x))).lower(jnp.ones(3)).compile()
    x = jnp.arange(3.0)
    first = compiled(x)
    call = _compat.executable_call(compiled)
    assert call is not compiled, (
        "jax.stages.Compiled no longer keeps its C++ call in `_call` once called"
    )
    again = call(x)
    assert jtu.tree_structure(again) == jtu.tree_structure(first)
    for a, b in zip(jtu.tree_leaves(again), jtu.tree_leaves(first)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
