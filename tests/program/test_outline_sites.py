"""`lxd.jit` outlines an `Auto` operator's `mv` where rolling cannot reach (sites in
loop bodies): every site calls one separately compiled `mv`; the results are
`jax.jit`'s under jit, grad, jvp and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch import _compat


N = 6
_W = jnp.eye(N) + 0.1 * jnp.arange(N * N, dtype=jnp.float64).reshape(N, N) / N**2


def _operator(policy, counter):
    def fn(x):
        counter.append(1)
        return _W @ x + 0.5 * x

    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    return lxd.FunctionLinearOperator(fn, structure, policy=policy)


def _program(op):
    def f(x):
        def body(c, _):
            return op.mv(c) * 0.5, None

        y, _ = jax.lax.scan(body, x, None, length=3)
        z = jax.lax.fori_loop(0, 2, lambda i, c: op.mv(c) + i, y)
        return jax.lax.cond(z[0] > 0, lambda: op.mv(z), lambda: -z)

    return f


def _close(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12)


def _assert_one_outlined_callee(lowered, sites):
    """The operator's dot product is written once, out of line: on jax >= 0.11 in
    one function of the lowered module, called from each site with XLA's late-inline
    mark; on jax 0.10 in a host callback's executable, none in the program."""
    if _compat.XLA_OUTLINE is not None:
        text = lowered.as_text()
        assert text.count("stablehlo.dot_general") == 1
        assert text.count('inlineable = "xla_late"') == sites
    else:
        assert lowered.compile().as_text().count(" dot(") == 0


# Compiling a dot product made dear: one out-of-line copy beats three inline.
_OUTLINE_MODEL = lxd.CostModel(compile_per_dot=10.0, outline_clone=0.0)


@pytest.mark.parametrize("runs", [1])
def test_sites_in_loop_bodies_share_one_outlined_mv(runs):
    counter = []
    op = _operator(lxd.Auto(runs=runs, cost_model=_OUTLINE_MODEL), counter)
    reference = _program(_operator(lxd.Lazy(), []))
    f = _program(op)
    x = jnp.linspace(0.1, 1.0, N)
    compiled = lxd.jit(f)
    with jax.checking_leaks():
        _close(compiled(x), jax.jit(reference)(x))
    assert len(counter) == 1  # traced once, for all three sites
    (decision,) = compiled.decisions(x).values()
    assert decision.strategy == "Outline"
    _assert_one_outlined_callee(compiled.lower(x), sites=3)
    assert jax.jit(reference).lower(x).compile().as_text().count(" dot(") == 3
    loss = lambda x: jnp.sum(f(x) ** 2)
    reference_loss = lambda x: jnp.sum(reference(x) ** 2)
    _close(jax.grad(lxd.jit(loss))(x), jax.jit(jax.grad(reference_loss))(x))
    _close(lxd.jit(jax.grad(loss))(x), jax.jit(jax.grad(reference_loss))(x))
    _close(
        jax.jvp(lxd.jit(f), (x,), (jnp.cos(x),)),
        jax.jvp(jax.jit(reference), (x,), (jnp.cos(x),)),
    )
    xs = jnp.stack([x, -x, 2 * x])
    _close(jax.vmap(lxd.jit(f))(xs), jax.jit(jax.vmap(reference))(xs))


def test_default_model_keeps_cheap_loop_body_sites_inline():
    op = _operator(lxd.Auto(), [])
    compiled = lxd.jit(_program(op))
    x = jnp.linspace(0.1, 1.0, N)
    (decision,) = compiled.decisions(x).values()
    assert decision.strategy == "Lazy"
    assert compiled.lower(x).compile().as_text().count(" dot(") == 3


@pytest.mark.parametrize(
    "policy", [lxd.Outline(), lxd.Auto(runs=1, cost_model=_OUTLINE_MODEL)]
)
def test_outlined_functions_closing_over_traced_arrays(policy):
    """An operator whose function closes over a traced array (built inside the
    traced function with `closure_convert=False`): its outlined `mv` is handed that
    array, so that values and gradients with respect to it are lineax's, under
    `jax.jit`, `lxd.jit`, grad and vmap."""
    import lineax as lx

    x = jnp.linspace(0.1, 1.0, N)

    def loss(w, module, **policy):
        fn = lambda v: w @ v + 0.5 * v
        structure = jax.ShapeDtypeStruct((N,), jnp.float64)
        op = module.FunctionLinearOperator(
            fn, structure, closure_convert=False, **policy
        )
        y, _ = jax.lax.scan(lambda c, _: (op.mv(c) * 0.5, None), x, None, length=2)
        return jnp.sum(op.mv(y) ** 2)

    ours = lambda w: loss(w, lxd, policy=policy)
    theirs = lambda w: loss(w, lx)
    ws = jnp.stack([_W, 2 * _W])
    for jit in (jax.jit, lxd.jit):
        _close(jit(ours)(_W), jax.jit(theirs)(_W))
        _close(jit(jax.grad(ours))(_W), jax.jit(jax.grad(theirs))(_W))
        _close(jax.vmap(jit(ours))(ws), jax.jit(jax.vmap(theirs))(ws))
    if isinstance(policy, lxd.Auto):
        (decision,) = lxd.jit(ours).decisions(_W).values()
        assert decision.strategy == "Outline"


@pytest.mark.skipif(
    _compat.XLA_OUTLINE is None, reason="needs jax.Inline.XLA_LATE (jax >= 0.11)"
)
def test_auto_under_plain_jax_jit():
    """Under a plain `jax.jit` each site is decided alone: out of line where the
    cost model says a further site then compiles for less (a backend compiling the
    callee once, `outline_clone=0`), inline on the default XLA:CPU model; the
    results are lineax's under jit, grad and vmap either way."""
    reference = _program(_operator(lxd.Lazy(), []))
    x = jnp.linspace(0.1, 1.0, N)
    once = lxd.CostModel(outline_native=True, outline_clone=0.0, compile_per_dot=1.0)
    for model, outlined in ((once, True), (lxd.CostModel(), False)):
        counter = []
        f = _program(_operator(lxd.Auto(cost_model=model), counter))
        with jax.checking_leaks():
            _close(jax.jit(f)(x), jax.jit(reference)(x))
        assert len(counter) == 1
        text = jax.jit(f).lower(x).as_text()
        assert text.count('inlineable = "xla_late"') == (3 if outlined else 0)
        loss = lambda x, f=f: jnp.sum(f(x) ** 2)
        reference_loss = lambda x: jnp.sum(reference(x) ** 2)
        _close(jax.jit(jax.grad(loss))(x), jax.jit(jax.grad(reference_loss))(x))
        xs = jnp.stack([x, -x])
        _close(jax.jit(jax.vmap(f))(xs), jax.jit(jax.vmap(reference))(xs))
