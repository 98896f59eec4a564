"""Every operator kind x policy against plain lineax: mv, as_matrix, transpose,
structures, tags, solves; under jit, vmap and grad; float32, float64, complex."""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import pytest

import lineax_dispatch as lxd

from .helpers.leaks import leak_checked
from .helpers.zoo import build, KINDS, POLICIES, SOLVE_POLICIES, tolerance, vector


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


@ft.cache
def _reference_mvs(kind, dtype):
    """Plain lineax's `mv` of a vector and of a stack of two (vmapped); the same for
    every policy, so computed once."""
    plain = build(kind, dispatch=False, dtype=dtype)
    x = vector(plain)
    xs = jax.tree_util.tree_map(lambda leaf: jnp.stack([leaf, 2 * leaf]), x)
    return x, xs, plain.mv(x), jax.vmap(plain.mv)(xs)


@kinds
@policies
@real_dtypes
def test_mv_jit_vmap(kind, policy, dtype):
    ours, plain = _pair(kind, policy, dtype)
    assert isinstance(ours, type(plain))
    assert isinstance(ours, lxd.AbstractDispatchOperator)
    assert ours.policy == POLICIES[policy]
    x, xs, expected, expected_batched = _reference_mvs(kind, dtype)
    with jax.checking_leaks():
        assert _close(ours.mv(x), expected, dtype)
        assert _close(jax.jit(lambda v: ours.mv(v))(x), expected, dtype)
        batched = jax.vmap(ours.mv)(xs)
        assert _close(batched, expected_batched, dtype)


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


def _plain_solves(kind, dtype):
    """Plain lineax's solves as a function of the right-hand side, and that."""
    plain = build(kind, dispatch=False, dtype=dtype)
    return _solve_all(kind, plain, False, None, dtype), vector(plain.T, seed=2)


@ft.cache
def _reference_solves(kind, dtype):
    """Plain lineax's solutions; the same for every policy, so computed once."""
    solve, b = _plain_solves(kind, dtype)
    return b, jax.jit(solve)(b)


@kinds
@solve_policies
@real_dtypes
def test_linear_solve(kind, policy, dtype):
    ours = build(kind, dispatch=True, policy=POLICIES[policy], dtype=dtype)
    b, expected = _reference_solves(kind, dtype)
    got = leak_checked(
        lambda: jax.jit(_solve_all(kind, ours, True, policy, dtype))(b),
        lambda: jax.jit(_plain_solves(kind, dtype)[0])(b),
    )
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


def _grad_solver_names(kind):
    # Direct-solver gradients on a representative subset of kinds, to bound the
    # suite's time; the iterative solver on every kind.
    names = [_iterative(kind)]
    if kind in ("matrix", "function", "jacobian", "composed", "add"):
        names.insert(0, "LU")
    return names


def _stack(b):
    return jax.tree_util.tree_map(lambda leaf: jnp.stack([leaf, -leaf, 2 * leaf]), b)


def _grad_checks(kind, policy, dispatch):
    """For each solver of `_grad_solver_names`: the gradient of the solution's
    squared norm with respect to the operator's scale and the right-hand side, and
    (iterative solvers) that gradient with respect to the right-hand side vmapped
    over three right-hand sides; all in one compiled call."""
    b = vector(build(kind, dispatch=False).T, seed=3)

    @jax.jit
    def run(t, b, bs):
        out = {}
        for name in _grad_solver_names(kind):
            loss = ft.partial(_solve_loss, kind, name, policy, dispatch=dispatch)
            grads = jax.grad(loss, argnums=(0, 1))(t, b)
            batched = None
            if name != "LU":  # direct-solver gradients are not batched
                batched = jax.vmap(lambda rhs: jax.grad(loss, argnums=1)(t, rhs))(bs)
            out[name] = (grads, batched)
        return out

    return run(1.3, b, _stack(b))


@ft.cache
def _reference_grads(kind):
    """Plain lineax's gradients; the same for every policy, so computed once."""
    return _grad_checks(kind, None, False)


@kinds
@solve_policies
def test_vmap_and_grad_through_solve(kind, policy):
    """grad with respect to a parameter of the operator and to the right-hand side
    (an iterative solver, and LU on some kinds), and vmap of that over right-hand
    sides (iterative solver), through `lx.linear_solve`, against plain lineax."""
    expected = _reference_grads(kind)
    got = leak_checked(
        lambda: _grad_checks(kind, policy, True),
        lambda: _grad_checks(kind, None, False),
    )
    assert set(got) == set(expected) == set(_grad_solver_names(kind))
    for name, (grads, batched) in got.items():
        expected_grads, expected_batched = expected[name]
        assert _close(grads, expected_grads, jnp.float64), name
        if name != "LU":
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


def _sin_sum_of_mv(op, v):
    return sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree_util.tree_leaves(op.mv(v)))


def _mv_derivatives(op, x, y):
    """Eagerly: the gradient of `_sin_sum_of_mv` with respect to the vector, the
    linear transpose of `mv` at `y`, and the gradient's leaves with respect to the
    operator."""
    grad_x = jax.grad(_sin_sum_of_mv, argnums=1)(op, x)
    (ct,) = jax.linear_transpose(op.mv, x)(y)
    grads = eqx.filter_grad(lambda op: _sin_sum_of_mv(op, x))(op)
    return grad_x, ct, jax.tree_util.tree_leaves(grads)


@ft.cache
def _reference_mv_derivatives(kind):
    """Plain lineax's; the same for every policy, so computed once."""
    plain = build(kind, dispatch=False)
    x, y = vector(plain), vector(plain.T)
    return x, y, _mv_derivatives(plain, x, y)


@kinds
@policies
def test_grad_of_mv_and_linear_transpose(kind, policy):
    ours = build(kind, dispatch=True, policy=POLICIES[policy])
    x, y, expected = _reference_mv_derivatives(kind)
    grad_x, ct, grads = _mv_derivatives(ours, x, y)
    assert _close(grad_x, expected[0], jnp.float64)
    assert _close(ct, expected[1], jnp.float64)
    assert _close(grads, expected[2], jnp.float64)


@kinds
@pytest.mark.parametrize("batch_size", [None, 1, 2, 64])
def test_dense_matrix(kind, batch_size):
    """The matrix `Materialise` builds, in chunks that do and do not divide the
    size, equals lineax's `as_matrix`."""
    ours, plain = _pair(kind, "lazy")
    assert _close(lxd.dense_matrix(ours, batch_size), plain.as_matrix(), jnp.float64)
