"""The inverses of a batch of square blocks, as block Jacobi applies them: by
JAX's factorisations, or by Gauss-Jordan elimination in one loop where a backend
expands the factorisations into programs that compile slowly (a TPU)."""

import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jaxtyping import Array, Inexact


def eliminates_in_a_loop() -> bool:
    """Whether `invert_blocks` takes Gauss-Jordan elimination in a loop: on a TPU,
    where XLA expands a batched Cholesky factorisation, its triangular solves and
    an LU factorisation into blocked programs that take seconds to compile (and
    has no LU factorisation in float64: `benchmarks/results/tpu/logs/
    block-inverse-probe.log`, 64 blocks of 64); one loop of rank-one updates
    compiles as one small body. XLA:CPU and GPUs call a library's
    factorisation, which compiles and runs faster than the loop."""
    return jax.default_backend() == "tpu"


def _definite_elimination(blocks: Inexact[Array, "k b b"]) -> Inexact[Array, "k b b"]:
    """The inverses of positive definite `blocks` by Gauss-Jordan elimination in
    place, without pivoting (the pivots of a positive definite matrix are the
    leading entries of its Schur complements: positive, the squares of
    Cholesky's). A block with a pivot that is not positive (indefinite or
    singular) gives NaN entries, as a Cholesky factorisation of it does."""
    size = blocks.shape[-1]
    index = jnp.arange(size)

    def step(j, carry):
        a, definite = carry
        on_j = index == j
        pivot = a[:, j, j][:, None]
        definite = definite & (jnp.real(pivot[:, 0]) > 0)
        inv_pivot = 1 / pivot
        row = a[:, j, :] * inv_pivot
        column = a[:, :, j]
        a = a - column[:, :, None] * row[:, None, :]
        row = jnp.where(on_j, inv_pivot, row)
        column = jnp.where(on_j, inv_pivot, -column * inv_pivot)
        a = jnp.where(on_j[:, None], row[:, None, :], a)
        return jnp.where(on_j, column[:, :, None], a), definite

    start = (blocks, jnp.ones(blocks.shape[0], bool))
    inverse, definite = lax.fori_loop(0, size, step, start)
    return jnp.where(definite[:, None, None], inverse, jnp.nan)


def _pivoted_elimination(blocks: Inexact[Array, "k b b"]) -> Inexact[Array, "k b b"]:
    """The inverses of `blocks` by Gauss-Jordan elimination of `[block | I]` with
    partial pivoting (each column's largest remaining entry swapped into the
    pivot row). A singular block gives non-finite entries."""
    count, size = blocks.shape[0], blocks.shape[-1]
    index = jnp.arange(size)
    eye = jnp.broadcast_to(jnp.eye(size, dtype=blocks.dtype), blocks.shape)
    augmented = jnp.concatenate([blocks, eye], axis=-1)

    def step(j, a):
        below = jnp.where(index >= j, jnp.abs(a[:, :, j]), -1)
        pivot = jnp.argmax(below, axis=1)
        pivot_row = a[jnp.arange(count), pivot]
        row_j = a[:, j, :]
        on_j, on_pivot = index == j, index[None, :] == pivot[:, None]
        a = jnp.where(on_pivot[:, :, None], row_j[:, None, :], a)
        a = jnp.where(on_j[:, None], pivot_row[:, None, :], a)
        row = pivot_row / pivot_row[:, j][:, None]
        a = a - a[:, :, j][:, :, None] * row[:, None, :]
        return jnp.where(on_j[:, None], row[:, None, :], a)

    return lax.fori_loop(0, size, step, augmented)[:, :, size:]


def invert_blocks(
    blocks: Inexact[Array, "k b b"], definite: bool, in_a_loop: bool | None = None
) -> Inexact[Array, "k b b"]:
    """The inverse of each of `blocks`.

    **Arguments:**

    - `blocks`: the blocks, a batch of square matrices.
    - `definite`: whether every block is positive definite (Cholesky, or
        elimination without pivoting), else any nonsingular block (LU, or
        elimination with partial pivoting).
    - `in_a_loop`: Gauss-Jordan elimination in a loop (`True`) or JAX's
        factorisations (`False`); `None` (the default) takes the backend's
        (`eliminates_in_a_loop`).

    **Returns:**

    The inverses, of `blocks`' shape and dtype; a singular block's (or, where
    `definite`, an indefinite one's) has non-finite or meaningless entries, for
    the caller to check.
    """
    if in_a_loop is None:
        in_a_loop = eliminates_in_a_loop()
    if in_a_loop:
        if definite:
            return _definite_elimination(blocks)
        return _pivoted_elimination(blocks)
    if definite:
        eye = jnp.broadcast_to(
            jnp.eye(blocks.shape[1], dtype=blocks.dtype), blocks.shape
        )
        factor = jnp.linalg.cholesky(blocks)
        return jax.vmap(lambda f, e: jsl.cho_solve((f, True), e))(factor, eye)
    return jnp.linalg.inv(blocks)
