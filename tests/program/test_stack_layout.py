"""The batched evaluation behind a stack (`policies/_stack_layout.py`): a zoo of
computations evaluated on batched inputs against `jax.vmap`; products of a weight
and the stacked vectors are plain matrix-matrix products with the weight in its own
layout; stacked programs under `lxd.jit` against `jax.jit` under jit, grad, jvp and
vmap."""

import equinox as eqx
import jax
import jax.extend.core.primitives as prims
import jax.numpy as jnp
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.program.rewrite._stack_layout import batched_eval


N, M, K = 5, 4, 3
_W = jax.random.normal(jax.random.key(1), (M, N), jnp.float64)
_V = jax.random.normal(jax.random.key(2), (N, M), jnp.float64)
_S = jnp.linspace(0.5, 1.5, M)
_T3 = jax.random.normal(jax.random.key(3), (M, N, 2), jnp.float64)
_WC = _W + 1j * jax.random.normal(jax.random.key(4), (M, N), jnp.float64)


@jax.jit
def _layer(x):
    return jnp.tanh(_W @ x)


@jax.custom_jvp
def _soft(x):
    return jnp.log1p(jnp.exp(x))


_soft.defjvp(lambda p, t: (_soft(p[0]), t[0] * jax.nn.sigmoid(p[0])))


def _scan_layers(x):
    def body(carry, w):
        return jnp.tanh(w @ carry), None

    return jax.lax.scan(body, x, jnp.stack([_W[:, :M], _W[:, 1:]]))[0]


# Each: (function of one vector or matrix, the unbatched input's shape, dtype).
ZOO = {
    "W @ x": (lambda x: _S * (_W @ x) + 1.0, (N,), jnp.float64),
    "x @ V": (lambda x: (x @ _V) * _S - x @ _V, (N,), jnp.float64),
    "W.T @ y": (lambda y: _W.T @ (y * _S), (M,), jnp.float64),
    "W @ X": (lambda x: _W @ x, (N, 2), jnp.float64),
    "X @ V": (lambda x: x @ _V, (2, N), jnp.float64),
    "x . x": (lambda x: jnp.dot(x, x) * x, (N,), jnp.float64),
    "x outer w": (lambda x: jnp.outer(_W[0], x), (N,), jnp.float64),
    "middle contraction": (lambda x: jnp.einsum("mnk,n->mk", _T3, x), (N,), None),
    "elementwise mix": (
        lambda x: jnp.where(x > 0, jnp.exp(-x), x**3) + jnp.clip(x, -0.5, 0.5),
        (N,),
        jnp.float64,
    ),
    "reduction": (lambda x: x / jnp.linalg.norm(x) + jnp.sum(x), (N,), jnp.float64),
    "nested jit": (lambda x: _layer(x) + _W @ x, (N,), jnp.float64),
    "custom jvp": (lambda x: _soft(_W @ x), (N,), jnp.float64),
    "scan": (_scan_layers, (M,), jnp.float64),
    "complex": (lambda x: _WC @ x + 1j * x[:M], (N,), jnp.complex128),
    "float32": (lambda x: _W.astype(jnp.float32) @ x, (N,), jnp.float32),
}


def _input(shape, dtype, k=K, seed=0):
    dtype = jnp.float64 if dtype is None else dtype
    x = jax.random.normal(jax.random.key(seed), (k, *shape), jnp.float64)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        x = x + 1j * jax.random.normal(jax.random.key(seed + 1), x.shape)
    return x.astype(dtype)


@pytest.mark.parametrize("bdim", ["first", "last"])
@pytest.mark.parametrize("name", list(ZOO))
def test_batched_eval_matches_vmap(name, bdim):
    fn, shape, dtype = ZOO[name]
    xs = _input(shape, dtype)
    closed = jax.make_jaxpr(fn)(xs[0])
    axis = 0 if bdim == "first" else len(shape)
    arg = jnp.moveaxis(xs, 0, axis)
    outs, dims = batched_eval(closed.jaxpr, closed.consts, [arg], [axis])
    (out,), (d,) = outs, dims
    expected = jax.vmap(fn)(xs)
    assert d is not None
    got = jnp.moveaxis(out, d, 0)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    tol = 1e-5 if dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def _products(closed):
    """The `dot_general` equations of a jaxpr, nested jits included."""
    found = []
    for eqn in closed.jaxpr.eqns:
        if eqn.primitive is prims.dot_general_p:
            found.append(eqn)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _products(jax.extend.core.ClosedJaxpr(sub, ()))
    return found


@pytest.mark.parametrize(
    "name, weight_left",
    # (`W.T @ y` is traced as a transpose of the weight, then a product with it
    # contracted on its last axis.)
    [("W @ x", True), ("x @ V", False), ("W.T @ y", True)],
)
def test_products_keep_the_weight_in_its_layout(name, weight_left):
    # `jax.vmap` contracts the stacked vectors on their last axis with the weight
    # on its last axis (`X[k, n] . W[m, n]`, a slow kernel on XLA:CPU at small k,
    # a transposed copy of the weight at large n); here each product is
    # `W[m, n] . X[n, k]` or `X[k, n] . W[n, m]`, the weight as it is.
    fn, shape, dtype = ZOO[name]
    xs = _input(shape, dtype)
    inner = jax.make_jaxpr(fn)(xs[0])
    batched = jax.make_jaxpr(
        lambda x: batched_eval(inner.jaxpr, inner.consts, [x], [0])[0]
    )(xs)
    products = _products(batched)
    assert products
    for eqn in products:
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs, rhs = (v.aval for v in eqn.invars)
        assert not lb and not rb
        assert tuple(lc) == tuple(range(lhs.ndim - len(lc), lhs.ndim))
        assert tuple(rc) == tuple(range(len(rc)))
        weight = lhs if weight_left else rhs
        assert weight.ndim == 2 and K not in weight.shape

    # No transpose of the weight is added: every other `transpose` is of a
    # k-sized array.
    def transposes(closed):
        return [
            eqn.invars[0].aval.shape
            for eqn in closed.jaxpr.eqns
            if eqn.primitive is prims.transpose_p
        ]

    added = transposes(batched)
    for shape in transposes(inner):
        added.remove(shape)
    assert all(K in shape for shape in added)


def _operator(mv, n, dtype, policy):
    return lxd.FunctionLinearOperator(
        eqx.Partial(mv),
        jax.ShapeDtypeStruct((n,), dtype),
        closure_convert=False,
        policy=policy,
    )


_OPERATORS = {
    "W @ x chain": (lambda x: jnp.tanh(_V @ (_S * (_W @ x))), N, jnp.float64),
    "x @ V": (lambda x: (x @ _V) @ _W, N, jnp.float64),
    "complex": (lambda x: _WC.conj().T @ (_WC @ x), N, jnp.complex128),
}


def _independent(op, xs):
    return sum(op.mv(xs[i] * (1.0 + i)) for i in range(xs.shape[0]))


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("name", list(_OPERATORS))
def test_stacked_programs_match_jax_jit(name, k):
    mv, n, dtype = _OPERATORS[name]
    xs = _input((n,), dtype, k=k, seed=7)
    stacked = _operator(mv, n, dtype, lxd.Roll())
    lazy = _operator(mv, n, dtype, lxd.Lazy())
    f = lambda xs: _independent(stacked, xs)
    g = lambda xs: _independent(lazy, xs)
    # One product per weight: the k sites are one stacked call.
    text = lxd.jit(f).lower(xs).as_text()
    weights = 2
    assert text.count("dot_general") == weights
    scalar = lambda h: lambda xs: jnp.sum(jnp.abs(h(xs)) ** 2)
    tangent = jnp.cos(xs.real).astype(dtype)
    many = jnp.stack([xs, 2 * xs])
    with jax.checking_leaks():
        got = (
            lxd.jit(f)(xs),
            jax.grad(lxd.jit(scalar(f)))(xs),
            lxd.jit(jax.grad(scalar(f)))(xs),
            jax.jvp(lxd.jit(f), (xs,), (tangent,)),
            jax.vmap(lxd.jit(f))(many),
        )
    expected = (
        jax.jit(g)(xs),
        jax.grad(jax.jit(scalar(g)))(xs),
        jax.jit(jax.grad(scalar(g)))(xs),
        jax.jvp(jax.jit(g), (xs,), (tangent,)),
        jax.vmap(jax.jit(g))(many),
    )
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
