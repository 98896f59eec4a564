"""The `Materialise` policy: a dense matrix, then a matmul."""

from typing import Any

import equinox as eqx
import lineax as lx
from jaxtyping import PyTree

from ._dense import (
    build_dense_matrix,
    check_batch_size,
    dense_matrix,
    dense_mv,
    EXPLICIT_OPERATORS,
)
from ._memory import check_dense_budget, optional_budget, resolve_budget
from ._policy_interface import AbstractPolicy
from .calls._per_object import cached_per_object, per_object_cache
from .calls._scope import current_scope


def _materialised_mv(
    operator: lx.AbstractLinearOperator, vector: PyTree[Any], batch_size: int | None
) -> PyTree[Any]:
    matrix = build_dense_matrix(operator, batch_size)
    return dense_mv(matrix, vector, operator.out_structure())


# Eager `mv`: the matrix of each operator applied, built once (compiled when
# chunked: see `dense_matrix`) and reused while the operator lives.
_EAGER_MATRICES = per_object_cache("lineax_dispatch_eager_matrices")


class Materialise(AbstractPolicy):
    """Builds the operator's dense matrix and applies it by matrix multiplication.

    The operator's `mv` is compiled once (inside the matrix build), at the cost of
    the matrix's memory and of the build itself. Operators that already hold their
    entries (matrix, PyTree, diagonal, tridiagonal, identity) are applied as they
    are.

    The matrix is built at each `mv` call site, and again at each execution inside
    a loop: under [`lineax_dispatch.jit`][], [`lineax_dispatch.Auto`][] builds it
    once per program instead, and [`lineax_dispatch.batch_solve`][] once per batch.
    Outside any trace (eager code) the matrix is built once per operator object
    (a chunked build compiled once per operator kind and signature) and reused by
    every later `mv` of that object while it lives; as with `jax.jit`, Python state
    the function reads is read when the matrix is built.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((100,), jnp.float32)
        policy = lxd.Materialise(batch_size=32, memory_budget="1GB")
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=policy)
        y = op.mv(jnp.ones(100, jnp.float32))
        ```
    """

    batch_size: int | None = eqx.field(default=None, converter=check_batch_size)
    memory_budget: int | None = eqx.field(default=None, converter=optional_budget)

    def budget(self) -> int:
        """The memory budget in bytes: `memory_budget` if one was given, else half of
        the free memory of the default device, read now.

        **Returns:**

        An int.
        """
        return resolve_budget(self.memory_budget)

    def check_memory(self, operator: lx.AbstractLinearOperator) -> None:
        """Raises a `ValueError` if materialising `operator` exceeds the budget.

        **Arguments:**

        - `operator`: the operator to materialise.

        **Returns:**

        Nothing.

        **Raises:**

        `ValueError` giving the bytes needed (the matrix and the build's peak) and
        the budget, when the first exceeds the second.
        """
        check_dense_budget(
            operator,
            self,
            what="`Materialise`",
            batch_size=self.batch_size,
            with_build=True,
        )

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        if isinstance(operator, EXPLICIT_OPERATORS):
            return operator.raw_mv(vector)  # pyright: ignore[reportAttributeAccessIssue]
        self.check_memory(operator)
        if current_scope() is None:
            matrix = cached_per_object(
                _EAGER_MATRICES,
                operator,
                lambda: dense_matrix(operator, self.batch_size),
                self.batch_size,
            )
            return dense_mv(matrix, vector, operator.out_structure())
        return _materialised_mv(operator, vector, self.batch_size)


Materialise.__init__.__doc__ = """**Arguments:**

- `batch_size`: how many columns to build together. `None` (the default) builds all
    columns at once with `vmap`; an integer builds them in chunks with
    `jax.lax.map(..., batch_size=batch_size)`, bounding the memory of the
    intermediates, and is often faster to compile for deep functions.
- `memory_budget`: bytes (or a string like `"2GB"`) the matrix and the build's peak
    may take on one device (a matrix whose rows an Explicit mesh axis shards
    counts its part on each); `None` (the default) allows half of the free memory.
    Over budget, `mv` raises a `ValueError` at trace time giving both numbers.
"""
