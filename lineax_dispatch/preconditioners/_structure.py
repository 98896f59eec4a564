"""The diagonal blocks of an operator, read from its structure where it has one
(held entries, a diagonal, sums, scalings, tags, compositions with a diagonal) and
through `mv` (`_probes`) for the rest. `plan` says how, without tracing anything;
`blocks_of` reads them."""

import equinox as eqx
import jax
import jax.flatten_util as jfu
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jax.sharding import PartitionSpec
from jaxtyping import Array, Inexact

from .._explicit_axes import explicit_sharding
from ._patterns import AbstractPattern
from ._probes import (
    identity_padding,
    padded_count,
    plain_mv,
    probe_blocks,
    Route,
    route,
)


_HELD = (lx.MatrixLinearOperator, lx.PyTreeLinearOperator)
_SCALED = (lx.MulLinearOperator, lx.DivLinearOperator, lx.NegLinearOperator)


class Part(eqx.Module):
    """One operand of the operator and how its blocks are read: `how` in words,
    `mvs` it applies (probes through `mv`), `route` where read through `mv`."""

    how: str = eqx.field(static=True)
    mvs: int = eqx.field(static=True)
    route: Route | None = eqx.field(static=True)


def _diagonal_like(operator: lx.AbstractLinearOperator) -> bool:
    """Whether the diagonal of `operator` is all there is to it."""
    return isinstance(
        operator, (lx.DiagonalLinearOperator, lx.IdentityLinearOperator)
    ) or (not isinstance(operator, _HELD) and lx.is_diagonal(operator))


def _operands(operator: lx.AbstractLinearOperator) -> tuple | None:
    """The operands whose blocks give `operator`'s, or `None` where they do not
    (a composition of operators neither of which is diagonal, or held)."""
    if isinstance(operator, lx.AddLinearOperator):
        return operator.operator1, operator.operator2
    if isinstance(operator, (*_SCALED, lx.TaggedLinearOperator)):
        return (operator.operator,)
    if isinstance(operator, lx.ComposedLinearOperator):
        first, second = operator.operator1, operator.operator2
        if _diagonal_like(first) or _diagonal_like(second):
            return first, second
    return None


def _held_product(operator: lx.AbstractLinearOperator) -> bool:
    """Whether `operator` is a composition of two operators that hold matrices."""
    return isinstance(operator, lx.ComposedLinearOperator) and all(
        isinstance(o, _HELD) for o in (operator.operator1, operator.operator2)
    )


def plan(
    operator: lx.AbstractLinearOperator,
    block_size: int,
    pattern: AbstractPattern | None,
    budget: int,
) -> list[Part]:
    """How the blocks of each operand of `operator` would be read, without
    tracing anything.

    **Arguments:**

    - `operator`: a square operator.
    - `block_size`: the size of the blocks (1: the diagonal).
    - `pattern`: the user's pattern, or `None`.
    - `budget`: bytes for reading through `mv`.

    **Returns:**

    A list of `Part`s, one per leaf operand.
    """
    name = type(operator).__name__
    if isinstance(operator, _HELD) or _diagonal_like(operator):
        how, mvs = "its entries", 0
        if isinstance(operator, lx.IdentityLinearOperator):
            how = "the identity"
        elif not isinstance(operator, (*_HELD, lx.DiagonalLinearOperator)):
            how, mvs = "one `mv` of ones (tagged diagonal)", 1
        return [Part(how=f"{name}: {how}", mvs=mvs, route=None)]
    if isinstance(operator, lx.TridiagonalLinearOperator):
        return [Part(how=f"{name}: its three bands", mvs=0, route=None)]
    operands = _operands(operator)
    if operands is not None:
        return [p for o in operands for p in plan(o, block_size, pattern, budget)]
    if _held_product(operator):
        return [
            Part(how=f"{name}: the rows and columns of its matrices", mvs=0, route=None)
        ]
    found = route(operator, block_size, pattern, budget)
    return [Part(how=f"{name}: {found.describe()}", mvs=found.probes, route=found)]


def dense_blocks(
    matrix: Inexact[Array, "n n"], block_size: int
) -> Inexact[Array, "k b b"]:
    """The diagonal blocks of a square `matrix` (see `probe_blocks`)."""
    n, b = matrix.shape[0], block_size
    if b == 1:  # elementwise: the rows keep a sharding of theirs
        eye = jnp.eye(n, dtype=matrix.dtype)
        return jnp.sum(matrix * eye, axis=1)[:, None, None]
    count = padded_count(n, b)
    if explicit_sharding(matrix) is not None:  # its reshape takes no Explicit axis
        matrix = jax.sharding.reshard(matrix, PartitionSpec())
    padded = jnp.pad(matrix, ((0, count * b - n), (0, count * b - n)))
    grid = padded.reshape(count, b, count, b)
    blocks = jnp.diagonal(grid, axis1=0, axis2=2)  # [r, t, k]
    return identity_padding(jnp.transpose(blocks, (2, 0, 1)), n)


def vector_blocks(
    diagonal: Inexact[Array, " n"], block_size: int
) -> Inexact[Array, "k b b"]:
    """The diagonal blocks of the diagonal matrix of `diagonal`."""
    pieces = by_blocks(diagonal, block_size)
    return pieces[:, :, None] * jnp.eye(block_size, dtype=diagonal.dtype)


def by_blocks(vector: Array, block_size: int) -> Array:
    """`vector` padded with ones and split into consecutive pieces of
    `block_size`."""
    n = vector.shape[0]
    count = padded_count(n, block_size)
    padded = jnp.pad(vector, (0, count * block_size - n), constant_values=1)
    return padded.reshape(count, block_size)


def _flat_diagonal(operator: lx.AbstractLinearOperator) -> Inexact[Array, " n"]:
    if isinstance(operator, lx.IdentityLinearOperator):
        leaves = jtu.tree_leaves(operator.in_structure())
        dtype = jnp.result_type(*[x.dtype for x in leaves])
        return jnp.ones(operator.in_size(), dtype)
    if isinstance(operator, lx.DiagonalLinearOperator):
        return jfu.ravel_pytree(operator.diagonal)[0]
    ones = jtu.tree_map(lambda s: jnp.ones(s.shape, s.dtype), operator.in_structure())
    return jfu.ravel_pytree(plain_mv(operator)(ones))[0]  # tagged diagonal


def _tridiagonal_blocks(operator, block_size: int) -> Inexact[Array, "k b b"]:
    diagonal, lower, upper = lx.tridiagonal(operator)
    n, b = diagonal.shape[0], block_size
    blocks = vector_blocks(diagonal, b)
    if b == 1:
        return blocks
    count = padded_count(n, b)

    def by_block(band):  # band[i] at [k, r] for i = k * b + r
        return jnp.pad(band, (0, count * b - n + 1)).reshape(count, b)

    # A[i + 1, i] = lower[i] and A[i, i + 1] = upper[i] where both lie in a block.
    below = by_block(lower)[:, None, :] * jnp.eye(b, k=-1, dtype=blocks.dtype)
    above = by_block(upper)[:, :, None] * jnp.eye(b, k=1, dtype=blocks.dtype)
    return identity_padding(blocks + below + above, n)


def _product_blocks(operator, block_size: int) -> Inexact[Array, "k b b"]:
    first = operator.operator1.as_matrix()
    second = operator.operator2.as_matrix()
    n, b = first.shape[0], block_size
    count = padded_count(n, b)
    rows = jnp.pad(first, ((0, count * b - n), (0, 0))).reshape(count, b, n)
    cols = jnp.pad(second, ((0, 0), (0, count * b - n))).reshape(n, count, b)
    blocks = jnp.einsum("krj,jkt->krt", rows, cols, precision=lax.Precision.HIGHEST)
    return identity_padding(blocks, n)


def _scale(operator, blocks: Array) -> Array:
    if isinstance(operator, lx.NegLinearOperator):
        return -blocks
    with jax.numpy_dtype_promotion("standard"):
        if isinstance(operator, lx.MulLinearOperator):
            return (blocks * operator.scalar).astype(blocks.dtype)
        return (blocks / operator.scalar).astype(blocks.dtype)


def blocks_of(
    operator: lx.AbstractLinearOperator,
    block_size: int,
    budget: int,
    pattern: AbstractPattern | None,
) -> Inexact[Array, "k b b"]:
    """The diagonal blocks of `operator`, as `plan` says (the arguments as for
    `plan`), those past the last unknown the identity's."""
    b = block_size
    if isinstance(operator, _HELD):
        return dense_blocks(operator.as_matrix(), b)
    if _diagonal_like(operator):
        return vector_blocks(_flat_diagonal(operator), b)
    if isinstance(operator, lx.TridiagonalLinearOperator):
        return _tridiagonal_blocks(operator, b)
    operands = _operands(operator)
    again = lambda o: blocks_of(o, b, budget, pattern)
    if isinstance(operator, lx.AddLinearOperator):
        first, second = again(operator.operator1), again(operator.operator2)
        with jax.numpy_dtype_promotion("standard"):
            return first + second
    if isinstance(operator, _SCALED):
        return _scale(operator, again(operator.operator))
    if isinstance(operator, lx.TaggedLinearOperator):
        return again(operator.operator)
    if operands is not None:  # a composition with a diagonal
        first, second = operands
        with jax.numpy_dtype_promotion("standard"):
            if _diagonal_like(first):
                rows = by_blocks(_flat_diagonal(first), b)
                return rows[:, :, None] * again(second)
            return again(first) * by_blocks(_flat_diagonal(second), b)[:, None, :]
    if _held_product(operator):
        return _product_blocks(operator, b)
    return probe_blocks(operator, b, route(operator, b, pattern, budget))
