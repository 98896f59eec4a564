"""Gradients through an `Outline` operator whose solve transposes its `mv` (least
squares, SVD, the normal equations): the reverse pass transposes the outlined call
of the transposed `mv` again. On jax 0.10 (where `Outline` is a host callback) that
second transpose crashed inside `equinox.internal.noinline`; the gradients are
those of plain lineax and of `Lazy`, with respect to the operator's matrix (closed
over by a function or held by a matrix operator) and to the right-hand side."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.policies._outline import outlined_call


M, N = 7, 4  # tall: least squares
_A = jnp.asarray(
    np.random.default_rng(0).normal(size=(M, N)) + 2.0 * np.eye(M, N), jnp.float64
)
_B = jnp.linspace(-1.0, 1.0, M, dtype=jnp.float64)
_W = jnp.cos(jnp.arange(N, dtype=jnp.float64))

_TOL = dict(rtol=1e-12, atol=1e-12)
_SOLVERS = {
    "SVD": lx.SVD(),
    "QR": lx.QR(),
    "LSMR": lxd.LSMR(**_TOL),
    "Normal": lxd.Normal(lxd.CG(**_TOL)),
    "AutoSolver": lxd.AutoSolver(well_posed=False),
}


def _operator(kind, library, matrix, policy=None):
    """`matrix` as an operator: a function closing over it or a matrix operator,
    of plain lineax (`library` `lx`) or of lineax-dispatch under `policy`."""
    if library is lx:
        if kind == "function":
            structure = jax.ShapeDtypeStruct((N,), matrix.dtype)
            return lx.FunctionLinearOperator(lambda x: matrix @ x, structure)
        return lx.MatrixLinearOperator(matrix)
    if kind == "function":
        structure = jax.ShapeDtypeStruct((N,), matrix.dtype)
        return lxd.FunctionLinearOperator(
            lambda x: matrix @ x, structure, policy=policy
        )
    return lxd.MatrixLinearOperator(matrix, policy=policy)


def _loss(kind, solver, library, policy=None):
    def loss(matrix, b):
        op = _operator(kind, library, matrix, policy)
        x = lx.linear_solve(op, b, solver).value
        return jnp.vdot(_W, x) + 0.5 * jnp.sum(jnp.sin(x) ** 2)

    return loss


def _close(a, b, rtol=1e-8):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=rtol, atol=1e-10)


@pytest.mark.parametrize("kind", ["function", "matrix"])
@pytest.mark.parametrize("name", list(_SOLVERS))
def test_grad_through_outline_solve(name, kind):
    solver = _SOLVERS[name]
    grad = lambda loss: jax.jit(jax.grad(loss, argnums=(0, 1)))(_A, _B)
    reference = grad(_loss(kind, solver, lx))
    _close(grad(_loss(kind, solver, lxd, lxd.Outline())), reference)
    _close(grad(_loss(kind, solver, lxd, lxd.Lazy())), reference)


def test_grad_through_outline_solve_eagerly():
    """`jax.grad` outside `jax.jit`: the reverse pass is traced all the same."""
    solver = _SOLVERS["SVD"]
    reference = jax.grad(_loss("function", solver, lx), argnums=(0, 1))(_A, _B)
    ours = jax.grad(_loss("function", solver, lxd, lxd.Outline()), argnums=(0, 1))
    _close(ours(_A, _B), reference)


def test_vmapped_grad_through_outline_solve():
    """The outlined calls of the gradient (the transposed `mv` among them)
    batched."""
    solver = _SOLVERS["QR"]
    bs = jnp.stack([_B, jnp.sin(_B), _B**2])

    def grads(loss):
        return jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, 0)))(
            _A, bs
        )

    reference = grads(_loss("function", solver, lx))
    _close(grads(_loss("function", solver, lxd, lxd.Outline())), reference)


def test_second_order_through_outline_solve():
    """Forward over reverse: the JVP of the reverse pass's outlined calls."""
    solver = _SOLVERS["SVD"]

    def hvp(loss):
        g = jax.grad(loss, argnums=(0, 1))
        tangents = (jnp.sin(_A), jnp.cos(_B))
        return jax.jit(lambda *p: jax.jvp(g, p, tangents))(_A, _B)

    reference = hvp(_loss("function", solver, lx))
    _close(hvp(_loss("function", solver, lxd, lxd.Outline())), reference)


def test_transposes_of_an_outlined_mv():
    """The transpose of the outlined `mv`, and the transpose of that, under
    `jax.jit`, with their gradients with respect to the closed-over matrix."""
    x = jnp.linspace(0.5, 1.5, N, dtype=jnp.float64)
    y = jnp.linspace(-1.0, 1.0, M, dtype=jnp.float64)

    def value(library, policy=None):
        def f(matrix):
            op = _operator("function", library, matrix, policy)
            once = op.transpose().mv(y)
            twice = op.transpose().transpose().mv(x)
            (back,) = jax.linear_transpose(op.transpose().mv, y)(once)
            return jnp.sum(once**2) + jnp.sum(jnp.sin(twice)) + jnp.sum(back**3)

        return jax.jit(jax.value_and_grad(f))(_A)

    reference = value(lx)
    _close(value(lxd, lxd.Outline()), reference)


def test_outlined_call_transforms():
    """The out-of-line call itself (what `Outline` uses on jax 0.10; exercised on
    every JAX): a callee nonlinear in a matrix, linear in a vector, indexed by an
    integer array, and with an output of the matrix alone. Its gradients, batched
    gradients, repeated transposes and Hessian are those of the callee inline."""
    matrix = jnp.arange(12.0, dtype=jnp.float64).reshape(4, 3) / 10
    rows = jnp.array([3, 0, 2, 1])
    x = jnp.linspace(0.5, 1.5, 3, dtype=jnp.float64)

    def f(a, i, v):
        return jnp.sin(a)[i] @ v, jnp.sum(a**2)

    callee = jax.make_jaxpr(f)(matrix, rows, x)
    outlined = lambda a, i, v: outlined_call(callee, (a, i, v))

    def results(h):
        loss = lambda a, v: jnp.sum(h(a, rows, v)[0] ** 2) + h(a, rows, v)[1]
        mv = lambda v: h(matrix, rows, v)[0]
        transpose = lambda c: jax.linear_transpose(mv, x)(c)[0]
        return jax.jit(
            lambda a, v: (
                jax.grad(loss, argnums=(0, 1))(a, v),
                jax.vmap(jax.grad(loss, argnums=1), in_axes=(None, 0))(
                    a, jnp.stack([v, 2 * v])
                ),
                jax.linear_transpose(transpose, jnp.ones(4))(v),
                jax.hessian(loss, argnums=1)(a, v),
            )
        )(matrix, x)

    _close(results(outlined), results(f))
