"""The `Materialise` policy: a dense matrix, then a matmul."""

from typing import Any

import lineax as lx
from jaxtyping import PyTree

from ._base import AbstractPolicy
from ._dense import check_batch_size, dense_matrix, dense_mv, EXPLICIT_OPERATORS


class Materialise(AbstractPolicy):
    """Builds the operator's dense matrix and applies it by matrix multiplication.

    The operator's `mv` is compiled once (inside the matrix build), at the cost of
    the matrix's memory and of the build itself. Operators that already hold their
    entries (matrix, PyTree, diagonal, tridiagonal, identity) are applied as they
    are.

    **Arguments:**

    - `batch_size`: how many columns to build together. `None` (the default) builds
        all columns at once with `vmap`; an integer builds them in chunks with
        `jax.lax.map(..., batch_size=batch_size)`, bounding the memory of the
        intermediates, and is often faster to compile for deep functions.

    !!! Example

        ```python
        op = lxd.FunctionLinearOperator(fn, structure, policy=lxd.Materialise(64))
        ```
    """

    batch_size: int | None = None

    def __check_init__(self):
        check_batch_size(self.batch_size)

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        if isinstance(operator, EXPLICIT_OPERATORS):
            return operator.raw_mv(vector)  # pyright: ignore[reportAttributeAccessIssue]
        matrix = dense_matrix(operator, self.batch_size)
        return dense_mv(matrix, vector, operator.out_structure())
