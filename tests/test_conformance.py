"""Every operator kind x policy against plain lineax: mv, as_matrix, transpose,
structures, tags, solves; under jit, vmap and grad; float32, float64, complex."""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import pytest

import lineax_dispatch as lxd

from .zoo import build, KINDS, POLICIES, SOLVE_POLICIES, tolerance, vector


PREDICATES = [
    lx.is_symmetric,
    lx.is_diagonal,
    lx.is_tridiagonal,
    lx.has_unit_diagonal,
    lx.is_lower_triangular,
    lx.is_upper_triangular,
    lx.is_positive_semidefinite,
    lx.is_negative_semidefinite,
]

kinds = pytest.mark.parametrize("kind", sorted(KINDS))
policies = pytest.mark.parametrize("policy", sorted(POLICIES))
solve_policies = pytest.mark.parametrize("policy", SOLVE_POLICIES)
real_dtypes = pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])


def _pair(kind, policy, dtype=jnp.float64, t=1.0):
    ours = build(kind, dispatch=True, policy=POLICIES[policy], t=t, dtype=dtype)
    plain = build(kind, dispatch=False, t=t, dtype=dtype)
    return ours, plain


def _close(a, b, dtype):
    tol = tolerance(dtype)
    ok = jax.tree_util.tree_map(
        lambda x, y: bool(jnp.allclose(x, y, rtol=tol, atol=tol)), a, b
    )
    return all(jax.tree_util.tree_leaves(ok))


@kinds
@policies
@real_dtypes
def test_mv_jit_vmap(kind, policy, dtype):
    ours, plain = _pair(kind, policy, dtype)
    assert isinstance(ours, type(plain))
    assert isinstance(ours, lxd.AbstractDispatchOperator)
    assert ours.policy == POLICIES[policy]
    x = vector(plain)
    expected = plain.mv(x)
    with jax.checking_leaks():
        assert _close(ours.mv(x), expected, dtype)
        assert _close(jax.jit(lambda v: ours.mv(v))(x), expected, dtype)
        xs = jax.tree_util.tree_map(lambda leaf: jnp.stack([leaf, 2 * leaf]), x)
        batched = jax.vmap(ours.mv)(xs)
        assert _close(batched, jax.vmap(plain.mv)(xs), dtype)


@kinds
@policies
def test_matrix_transpose_structure_tags(kind, policy):
    ours, plain = _pair(kind, policy)
    assert _close(ours.as_matrix(), plain.as_matrix(), jnp.float64)
    assert ours.in_structure() == plain.in_structure()
    assert ours.out_structure() == plain.out_structure()
    for predicate in PREDICATES:
        assert predicate(ours) == predicate(plain), predicate.__name__
    for transposed in (ours.T, ours.transpose()):
        assert isinstance(transposed, lxd.AbstractDispatchOperator)
        assert transposed.policy == POLICIES[policy]
        y = vector(plain.T)
        assert _close(transposed.mv(y), plain.T.mv(y), jnp.float64)
        assert _close(transposed.as_matrix(), plain.T.as_matrix(), jnp.float64)


def _solvers(kind, dtype):
    solvers = {
        "LU": lx.LU(),
        "QR": lx.QR(),
        "GMRES": lx.GMRES(rtol=1e-10, atol=1e-10, restart=10, max_steps=200)
        if dtype == jnp.float64
        else lx.GMRES(rtol=1e-6, atol=1e-6, restart=10, max_steps=200),
    }
    if KINDS[kind] is not None and not jnp.issubdtype(dtype, jnp.complexfloating):
        solvers["Cholesky"] = lx.Cholesky()
        solvers["CG"] = (
            lx.CG(rtol=1e-10, atol=1e-10)
            if dtype == jnp.float64
            else lx.CG(rtol=1e-6, atol=1e-6)
        )
    return solvers


def _solvable(kind, op, dispatch, policy, solver_name):
    """Tags the operator for CG/Cholesky, with the same library and policy."""
    if solver_name not in ("CG", "Cholesky"):
        return op
    tags = (lx.symmetric_tag, KINDS[kind])
    if dispatch:
        return lxd.TaggedLinearOperator(op, tags, policy=POLICIES[policy])
    return lx.TaggedLinearOperator(op, tags)


def _solver_names(kind, dtype):
    names = sorted(_solvers(kind, dtype))
    if dtype == jnp.float32:  # one direct and one iterative solver suffice here
        names = ["LU", "CG" if "CG" in names else "GMRES"]
    return names


def _solve_all(kind, op, dispatch, policy, dtype):
    """A function of the right-hand side: `op`'s solutions by every solver that
    applies, traced and compiled together."""
    names = _solver_names(kind, dtype)
    solvers = _solvers(kind, dtype)
    ops = {name: _solvable(kind, op, dispatch, policy, name) for name in names}
    return lambda v: {n: lx.linear_solve(ops[n], v, solvers[n]).value for n in names}


@ft.cache
def _reference_solves(kind, dtype):
    """Plain lineax's solutions; the same for every policy, so computed once."""
    plain = build(kind, dispatch=False, dtype=dtype)
    b = vector(plain.T, seed=2)
    return b, jax.jit(_solve_all(kind, plain, False, None, dtype))(b)


@kinds
@solve_policies
@real_dtypes
def test_linear_solve(kind, policy, dtype):
    ours = build(kind, dispatch=True, policy=POLICIES[policy], dtype=dtype)
    b, expected = _reference_solves(kind, dtype)
    with jax.checking_leaks():
        got = jax.jit(_solve_all(kind, ours, True, policy, dtype))(b)
    assert set(got) == set(expected)
    for name in got:
        assert _close(got[name], expected[name], dtype), name


def _solve_loss(kind, name, policy, t, rhs, dispatch):
    op = build(kind, dispatch=dispatch, policy=POLICIES.get(policy), t=t)
    op = _solvable(kind, op, dispatch, policy, name)
    x = lx.linear_solve(op, rhs, _solvers(kind, jnp.float64)[name]).value
    return sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(x))


def _iterative(kind):
    return "CG" if KINDS[kind] is not None else "GMRES"


def _stack(b):
    return jax.tree_util.tree_map(lambda leaf: jnp.stack([leaf, -leaf, 2 * leaf]), b)


@ft.cache
def _reference_grads(kind, name):
    b = vector(build(kind, dispatch=False).T, seed=3)
    loss = ft.partial(_solve_loss, kind, name, None)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(1.3, b, False)
    if name == "LU":  # direct-solver gradients are not batched below
        return b, grads, None
    batched = jax.jit(jax.vmap(lambda rhs: jax.grad(loss, argnums=1)(1.3, rhs, False)))(
        _stack(b)
    )
    return b, grads, batched


@kinds
@solve_policies
def test_vmap_and_grad_through_solve(kind, policy):
    """grad with respect to a parameter of the operator and to the right-hand side
    (an iterative solver, and LU on some kinds), and vmap of that over right-hand sides (iterative
    solver), through `lx.linear_solve`, against plain lineax."""
    # Direct-solver gradients on a representative subset of kinds, to bound the
    # suite's time; the iterative solver on every kind.
    names = [_iterative(kind)]
    if kind in ("matrix", "function", "jacobian", "composed", "add"):
        names.insert(0, "LU")
    for name in names:
        b, expected, expected_batched = _reference_grads(kind, name)
        loss = ft.partial(_solve_loss, kind, name, policy)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
        with jax.checking_leaks():
            got = grad(1.3, b, True)
        assert _close(got, expected, jnp.float64), name
        if name != "LU":
            batched = jax.jit(
                jax.vmap(lambda rhs: jax.grad(loss, argnums=1)(1.3, rhs, True))
            )(_stack(b))
            assert _close(batched, expected_batched, jnp.float64), name


@pytest.mark.parametrize("kind", ["matrix-nonsymmetric", "function", "jacobian", "add"])
@solve_policies
def test_complex(kind, policy):
    dtype = jnp.complex128
    ours, plain = _pair(kind, policy, dtype)
    x = vector(plain)
    assert _close(jax.jit(lambda v: ours.mv(v))(x), plain.mv(x), dtype)
    assert _close(ours.T.mv(x), plain.T.mv(x), dtype)
    conj = lxd.conj(ours)
    assert conj.policy == POLICIES[policy]
    assert _close(conj.mv(x), lx.conj(plain).mv(x), dtype)
    b, expected = _reference_solves(kind, dtype)
    got = jax.jit(_solve_all(kind, ours, True, policy, dtype))(b)
    assert set(got) == set(expected) == set(_solvers(kind, dtype))
    for name in got:
        assert _close(got[name], expected[name], dtype), name


@kinds
@policies
def test_grad_of_mv_and_linear_transpose(kind, policy):
    ours, plain = _pair(kind, policy)
    x = vector(plain)

    def f(op, v):
        return sum(
            jnp.sum(jnp.sin(leaf)) for leaf in jax.tree_util.tree_leaves(op.mv(v))
        )

    assert _close(
        jax.grad(f, argnums=1)(ours, x), jax.grad(f, argnums=1)(plain, x), jnp.float64
    )
    y = vector(plain.T)
    (ct,) = jax.linear_transpose(ours.mv, x)(y)
    (ct_plain,) = jax.linear_transpose(plain.mv, x)(y)
    assert _close(ct, ct_plain, jnp.float64)
    grads = eqx.filter_grad(lambda op: f(op, x))(ours)
    grads_plain = eqx.filter_grad(lambda op: f(op, x))(plain)
    assert _close(
        jax.tree_util.tree_leaves(grads),
        jax.tree_util.tree_leaves(grads_plain),
        jnp.float64,
    )


@kinds
@pytest.mark.parametrize("batch_size", [None, 1, 2, 64])
def test_dense_matrix(kind, batch_size):
    """The matrix `Materialise` builds, in chunks that do and do not divide the
    size, equals lineax's `as_matrix`."""
    ours, plain = _pair(kind, "lazy")
    assert _close(lxd.dense_matrix(ours, batch_size), plain.as_matrix(), jnp.float64)
