"""Sizes and bytes: the dtype and itemsize of an operator's dense matrix, the
bytes of arrays, of the matrix and of building it. Every budget check and cost
estimate reads them here."""

import math
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import PyTree


def promoted_dtype(*dtypes: Any) -> Any:
    """The promotion of `dtypes` under JAX's standard rules, whatever
    `jax_numpy_dtype_promotion` says (an operator whose input and output dtypes
    differ is legal under strict promotion too); `float32` for none."""
    if not dtypes:
        return jnp.dtype(jnp.float32)
    first = jnp.dtype(dtypes[0])
    if all(jnp.dtype(d) == first for d in dtypes[1:]):
        # One dtype: its canonical form, as `result_type` gives it (without
        # entering the configuration's context, which costs more than the rest).
        return jnp.dtype(jax.dtypes.canonicalize_dtype(first))
    with jax.numpy_dtype_promotion("standard"):
        return jnp.dtype(jnp.result_type(*dtypes))


def structures_dtype(*structures: PyTree[Any]) -> Any:
    """The promotion of the dtypes of every leaf of `structures`."""
    return promoted_dtype(*[x.dtype for x in jtu.tree_leaves(structures)])


def operator_dtype(operator: lx.AbstractLinearOperator) -> Any:
    """The dtype of the dense matrix of `operator`: the promotion of the dtypes of
    its input and output structures."""
    return structures_dtype(operator.in_structure(), operator.out_structure())


def itemsize(operator: lx.AbstractLinearOperator) -> int:
    """Bytes per entry of the dense matrix of `operator`."""
    return operator_dtype(operator).itemsize


def structure_size(structure: PyTree[Any]) -> int:
    """Entries of every leaf of `structure` (arrays or `jax.ShapeDtypeStruct`s)."""
    return sum(math.prod(x.shape) for x in jtu.tree_leaves(structure))


def array_bytes(x: Any) -> int:
    """Bytes of an array, `jax.ShapeDtypeStruct` or abstract value; 0 for one
    without a dtype (such as a token)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return 0
    size = dtype.itemsize if hasattr(dtype, "itemsize") else jnp.dtype(dtype).itemsize
    return math.prod(x.shape) * size


def vector_bytes(size: int, itemsize: int) -> int:
    """Bytes of `size` entries of `itemsize` bytes each: a flat vector, or several
    laid end to end (an input and an output, the bands of a matrix)."""
    return size * itemsize


def matrix_bytes(out_size: int, in_size: int, itemsize: int) -> int:
    """Bytes of a dense `out_size x in_size` matrix of `itemsize`-byte entries."""
    return out_size * in_size * itemsize


def build_bytes(out_size: int, in_size: int, itemsize: int, chunk: int) -> int:
    """Bytes of a dense matrix plus the peak of building it `chunk` columns at a
    time: each chunk's basis and output columns."""
    return itemsize * (out_size * in_size + chunk * (in_size + out_size))


def dense_bytes(operator: lx.AbstractLinearOperator) -> int:
    """Bytes of the dense matrix of `operator`."""
    return matrix_bytes(operator.out_size(), operator.in_size(), itemsize(operator))


def operator_build_bytes(
    operator: lx.AbstractLinearOperator, batch_size: int | None
) -> int:
    """Bytes of a materialised matrix of `operator` plus the peak of building it
    `batch_size` columns at a time (all columns when `None`)."""
    n_in, n_out = operator.in_size(), operator.out_size()
    chunk = n_in if batch_size is None else min(batch_size, n_in)
    return build_bytes(n_out, n_in, itemsize(operator), chunk)


def diagonal_build_bytes(out_size: int, in_size: int, itemsize: int, chunk: int) -> int:
    """Bytes of building the diagonal of an `out_size x in_size` matrix-free
    operator `chunk` basis vectors at a time: each chunk's basis vectors and their
    images, and the diagonal (counted twice: the chunks' pieces and their join)."""
    return itemsize * (chunk * (in_size + out_size) + 2 * min(out_size, in_size))


def diagonal_chunk(out_size: int, in_size: int, itemsize: int, budget: int) -> int:
    """The most basis vectors that building the diagonal may take together within
    `budget` bytes (see `diagonal_build_bytes`), at most `in_size`; 0 where not even
    one fits."""
    free = budget // itemsize - 2 * min(out_size, in_size)
    return max(0, min(in_size, free // max(in_size + 2 * out_size, 1)))
