"""batch_mv and batch_solve against vmapped lineax."""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd


# Every test here runs under lineax's strict dtype and rank promotion.
pytestmark = pytest.mark.usefixtures("strict_promotion")


N, B = 6, 5


def _spd():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((N, N))
    return jnp.asarray(m @ m.T / N + np.eye(N))


def _function_operator(a, policy=None):
    # These tests exercise Auto's batch decisions: ask for it (not the default).
    kwargs = {"policy": lxd.Auto() if policy is None else policy}
    return lxd.FunctionLinearOperator(
        eqx.Partial(lambda a, x: a @ x, a),
        jax.ShapeDtypeStruct((N,), jnp.float64),
        lx.positive_semidefinite_tag,
        closure_convert=False,
        **kwargs,
    )


_RHS = jnp.asarray(np.random.default_rng(1).standard_normal((B, N)))

_POLICIES = [
    None,
    lxd.Lazy(),
    lxd.Materialise(2),
    lxd.VmapBatch(),
    lxd.VmapBatch(batch_size=2),
    lxd.Scan(),
    lxd.Auto(),
]


@pytest.mark.parametrize("policy", _POLICIES)
def test_batch_mv(policy):
    a = _spd()
    op = _function_operator(a)
    out = jax.jit(lambda xs: lxd.batch_mv(op, xs, policy=policy))(_RHS)
    np.testing.assert_allclose(out, _RHS @ a.T, rtol=1e-12)


_SOLVERS = {
    "lu": lx.LU(),
    "cg": lxd.CG(rtol=1e-10, atol=1e-10),
    "gmres": lxd.GMRES(rtol=1e-10, atol=1e-10),
}


def _theirs(solver, a, bs):
    plain = lx.MatrixLinearOperator(a, lx.positive_semidefinite_tag)
    return jax.vmap(lambda b: lx.linear_solve(plain, b, solver).value)(bs)


@ft.cache
def _vmapped_lineax(name):
    """Vmapped plain lineax's solutions and the gradients of their squared norm with
    respect to the matrix and the right-hand sides: the same for every policy, so
    computed once per solver (in one compiled call)."""
    solver = _SOLVERS[name]
    loss = lambda a, bs: jnp.sum(_theirs(solver, a, bs) ** 2)

    @jax.jit
    def run(a, bs):
        return _theirs(solver, a, bs), jax.grad(loss, argnums=(0, 1))(a, bs)

    return run(_spd(), _RHS)


@pytest.mark.parametrize("policy", [None, lxd.Materialise(2), lxd.Scan()])
@pytest.mark.parametrize("name", list(_SOLVERS))
def test_batch_solve_matches_vmapped_lineax(name, policy):
    solver = _SOLVERS[name]
    a = _spd()
    op = _function_operator(a)

    def ours(a, bs):
        sol = lxd.batch_solve(_function_operator(a), bs, solver, policy=policy)
        return sol.value

    expected, g_theirs = _vmapped_lineax(name)
    np.testing.assert_allclose(jax.jit(ours)(a, _RHS), expected, rtol=1e-8)
    sol = lxd.batch_solve(op, _RHS, solver, batch_size=2, throw=False)
    assert sol.value.shape == (B, N)
    assert sol.result._value.shape == (B,)
    assert (sol.result._value == lx.RESULTS.successful._value).all()
    # Gradients with respect to the operator and the right-hand sides.
    loss_ours = lambda a, bs: jnp.sum(ours(a, bs) ** 2)
    g_ours = jax.jit(jax.grad(loss_ours, argnums=(0, 1)))(a, _RHS)
    for x, y in zip(g_ours, g_theirs):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-8)


def test_vmap_of_batch_solve_and_failures_per_rhs():
    a = _spd()
    stacks = jnp.stack([_RHS, 2 * _RHS])
    out = jax.vmap(lambda bs: lxd.batch_solve(_function_operator(a), bs).value)(stacks)
    np.testing.assert_allclose(out[1], 2 * out[0], rtol=1e-10)
    bad = _RHS.at[2, 0].set(jnp.nan)
    sol = lxd.batch_solve(
        _function_operator(a), bad, lxd.CG(rtol=1e-8, atol=1e-8), throw=False
    )
    codes = np.asarray(sol.result._value)
    assert codes[2] == lx.RESULTS.nonfinite_input._value
    assert (np.delete(codes, 2) == lx.RESULTS.successful._value).all()
    with pytest.raises(Exception, match="non-finite"):
        lxd.batch_solve(_function_operator(a), bad, lxd.CG(rtol=1e-8, atol=1e-8))


def test_auto_materialises_for_many_right_hand_sides():
    op = _function_operator(_spd())
    few = op.policy.decision(op, batch=2)
    many = op.policy.decision(op, batch=N)
    assert few.strategy == "VmapBatch"
    assert many.strategy == "Materialise"


@pytest.mark.parametrize(
    "vectors,match",
    [
        ((jnp.ones((3, N)), jnp.ones((3, N))), "PyTree structure"),
        (jnp.ones((0, N)), "empty batch"),
        (jnp.ones((3, N + 1)), "expected"),
        (jnp.ones(N), "expected"),
        (jnp.ones((3, N), jnp.float32), "dtype"),
    ],
)
def test_bad_vectors(vectors, match):
    op = _function_operator(_spd())
    with pytest.raises(ValueError, match=f"`vectors`.*{match}"):
        lxd.batch_solve(op, vectors)
    if match == "dtype":
        # `mv` casts a vector of a dtype that promotes safely; so does `batch_mv`.
        expected = jnp.stack([op.mv(v) for v in vectors])
        np.testing.assert_allclose(lxd.batch_mv(op, vectors), expected, rtol=1e-6)
        return
    if match == "empty batch":
        # As `jax.vmap(op.mv)`: an empty stack of outputs.
        out = lxd.batch_mv(op, vectors)
        assert out.shape == jax.vmap(op.mv)(vectors).shape == (0, N)
        return
    with pytest.raises(ValueError, match="`vectors`"):
        lxd.batch_mv(op, vectors)


def test_leaves_with_different_batch_sizes():
    structure = {
        "a": jax.ShapeDtypeStruct((2,), jnp.float64),
        "b": jax.ShapeDtypeStruct((3,), jnp.float64),
    }
    op = lxd.IdentityLinearOperator(structure)
    vectors = {"a": jnp.ones((4, 2)), "b": jnp.ones((5, 3))}
    with pytest.raises(ValueError, match="different batch sizes"):
        lxd.batch_mv(op, vectors)


def test_progress_bar_chunks_from_python(capsys):
    a = _spd()
    op = _function_operator(a)
    plain = lxd.batch_solve(op, _RHS, lx.LU())
    shown = lxd.batch_solve(op, _RHS, lx.LU(), progress=True, batch_size=2)
    np.testing.assert_allclose(shown.value, plain.value, rtol=1e-12)
    assert shown.result._value.shape == (B,)
    assert "batch_solve" in capsys.readouterr().err
    with pytest.raises(ValueError, match="progress"):
        jax.jit(lambda bs: lxd.batch_solve(op, bs, progress=True).value)(_RHS)


def _shift_down(v):
    return jnp.concatenate([jnp.zeros(1, v.dtype), v[:-1]])


@pytest.mark.parametrize(
    "fn, tags, solver",
    [
        (lambda v: jnp.arange(1.0, 6.0) * v, lx.diagonal_tag, lx.Diagonal()),
        (
            lambda v: 3 * v - _shift_down(v) - jnp.flip(_shift_down(jnp.flip(v))),
            lx.tridiagonal_tag,
            lx.Tridiagonal(),
        ),
        (
            lambda v: v + _shift_down(v),
            (lx.lower_triangular_tag, lx.unit_diagonal_tag),
            lx.Triangular(),
        ),
    ],
)
@pytest.mark.parametrize("policy", [lxd.Materialise(), lxd.Auto()])
def test_a_materialised_operator_keeps_its_tags(fn, tags, solver, policy):
    """Materialised for many right-hand sides, a function operator keeps its
    tags (diagonal, tridiagonal, unit diagonal...), which lineax's structured
    solvers require."""
    structure = jax.ShapeDtypeStruct((5,), jnp.float64)
    vectors = jax.random.normal(jax.random.key(0), (8, 5))
    plain = lx.FunctionLinearOperator(fn, structure, tags)
    expected = jax.vmap(lambda b: lx.linear_solve(plain, b, solver).value)(vectors)
    op = lxd.FunctionLinearOperator(fn, structure, tags, policy=policy)
    got = lxd.batch_solve(op, vectors, solver).value
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
