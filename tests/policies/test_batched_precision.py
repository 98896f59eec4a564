"""Products a strategy creates keep the precision of one `mv`.

One `mv` of the user's function computes its products as matrix-vector products;
a dense build, a batch of vectors, stacked call sites or a batch of solves turn
them into matrix-matrix products, which an accelerator runs at JAX's default
precision in bfloat16 passes (a TPU) or TF32 (a GPU). These tests read the
lowered programs (the precision of every product) on the CPU: every product a
strategy batches is `HIGHEST` where the user set nothing, a default precision the
user set (`jax.default_matmul_precision`) or a precision the function gives a
product itself is kept, and one unbatched `mv` is lineax's program, untouched.
"""

import re

import jax
import jax.extend.core as jex
import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
import pytest

import lineax_dispatch as lxd


N = 6
_PRECISION = re.compile(r"dot_general.*precision = \[(\w+), (\w+)\]")


def _weights():
    keys = jax.random.split(jax.random.key(0), 3)
    f32 = jnp.float32
    return [
        jnp.eye(N, dtype=f32) + 0.1 * jax.random.normal(k, (N, N), f32) for k in keys
    ]


def _operator(policy, precision=None):
    weights = _weights()

    def chain(x):
        for w in weights:
            x = jnp.matmul(w, x, precision=precision)
        return x

    structure = jax.ShapeDtypeStruct((N,), jnp.float32)
    return lxd.FunctionLinearOperator(chain, structure, policy=policy)


def _spd_operator(policy):
    weights = _weights()

    def normal(x):
        y = x
        for w in weights:
            y = w @ y
        for w in reversed(weights):
            y = w.T @ y
        return y + x

    structure = jax.ShapeDtypeStruct((N,), jnp.float32)
    tag = lx.positive_semidefinite_tag
    return lxd.FunctionLinearOperator(normal, structure, tag, policy=policy)


def _lowered(lowered) -> set[str]:
    """The precisions of the products in a lowered program's text."""
    found = _PRECISION.findall(lowered.as_text())
    assert found, "the program has no product"
    return {p for pair in found for p in pair}


def _traced(closed) -> set[str]:
    """The precisions of the products of a traced program at any depth, outlined
    callees included."""
    found = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                found.add(str(eqn.params["precision"]))
            for sub in jex.jaxprs_in_params(eqn.params):
                walk(sub)
            callee = getattr(eqn.params.get("callee"), "value", None)
            if isinstance(callee, jex.ClosedJaxpr):
                walk(callee.jaxpr)

    walk(closed.jaxpr)
    assert found, "the program has no product"
    return found


_HIGHEST = {"HIGHEST"}
_POLICIES = [
    lxd.Lazy(),
    lxd.VmapBatch(),
    lxd.VmapBatch(batch_size=2),
    lxd.Materialise(),
    lxd.Materialise(batch_size=2),
    lxd.Auto(),
]


@pytest.mark.parametrize("policy", _POLICIES, ids=repr)
def test_dense_builds_are_float32(policy):
    op = _operator(policy)
    assert _lowered(jax.jit(lambda: lxd.dense_matrix(op)).lower()) == _HIGHEST
    materialised = jax.jit(lambda: lx.materialise(op).as_matrix())
    assert _lowered(materialised.lower()) == _HIGHEST
    assert _lowered(jax.jit(lambda: lx.diagonal(op)).lower()) == _HIGHEST


@pytest.mark.parametrize("policy", _POLICIES, ids=repr)
def test_batch_mv_is_float32(policy):
    op = _operator(policy)
    vectors = jnp.ones((4, N), jnp.float32)
    lowered = jax.jit(lambda v: lxd.batch_mv(op, v)).lower(vectors)
    assert _lowered(lowered) == _HIGHEST


def test_outlined_batch_mv_is_float32():
    op = _operator(lxd.Outline())
    vectors = jnp.ones((4, N), jnp.float32)
    assert _traced(jax.make_jaxpr(lambda v: lxd.batch_mv(op, v))(vectors)) == {
        str((lax.Precision.HIGHEST, lax.Precision.HIGHEST))
    }
    # A vmap of the user's own keeps lineax's products (as `jax.vmap(lx_op.mv)`).
    assert _traced(jax.make_jaxpr(jax.vmap(op.mv))(vectors)) == {"None"}


@pytest.mark.parametrize("solver", [lxd.CG(1e-5, 1e-5), lx.CG(1e-5, 1e-5)], ids=repr)
@pytest.mark.parametrize("policy", [lxd.Lazy(), lxd.VmapBatch(batch_size=2)], ids=repr)
def test_batch_solve_is_float32(solver, policy):
    op = _spd_operator(policy)
    vectors = jnp.ones((4, N), jnp.float32)
    solve = jax.jit(lambda v: lxd.batch_solve(op, v, solver).value)
    # The solver's own reductions are `HIGHEST` already; the operator's products
    # become matrix-matrix ones under the batch.
    assert _lowered(solve.lower(vectors)) == _HIGHEST


@pytest.mark.parametrize(
    "policy", [lxd.Roll(), lxd.Materialise(), lxd.Auto()], ids=repr
)
def test_lxd_jit_stacked_and_materialised_sites_are_float32(policy):
    op = _operator(policy)

    def four_sites(op, xs):
        return [op.mv(xs[i]) for i in range(4)]

    lowered = lxd.jit(four_sites).lower(op, jnp.ones((4, N), jnp.float32))
    assert _lowered(lowered) == _HIGHEST


@pytest.mark.parametrize("policy", [lxd.Lazy(), lxd.Auto(), lxd.VmapBatch()], ids=repr)
def test_one_mv_is_lineax_program(policy):
    op = _operator(policy)
    plain = lx.FunctionLinearOperator(op.fn, op.in_structure())
    x = jnp.ones(N, jnp.float32)
    ours = _lowered(jax.jit(lambda v: op.mv(v)).lower(x))
    assert ours == _lowered(jax.jit(lambda v: plain.mv(v)).lower(x)) == {"DEFAULT"}


def test_users_default_precision_is_kept():
    op = _operator(lxd.Materialise())
    vectors = jnp.ones((4, N), jnp.float32)
    with jax.default_matmul_precision("bfloat16"):
        assert _lowered(jax.jit(lambda: lxd.dense_matrix(op)).lower()) == {"DEFAULT"}
        batched = jax.jit(lambda v: lxd.batch_mv(op, v, policy=lxd.VmapBatch()))
        assert _lowered(batched.lower(vectors)) == {"DEFAULT"}


def test_functions_own_precision_is_kept():
    op = _operator(lxd.Materialise(), precision=lax.Precision.HIGH)
    # The build's products are the function's (HIGH); the matrix's own product
    # with the vector is the strategy's (HIGHEST).
    assert _lowered(jax.jit(lambda: lxd.dense_matrix(op)).lower()) == {"HIGH"}
    lowered = jax.jit(lambda v: op.mv(v)).lower(jnp.ones(N, jnp.float32))
    assert _lowered(lowered) == {"HIGH", "HIGHEST"}
