"""`VmapBatch` and `Scan`: policies that differ in how many vectors they apply at
once. A single `mv` is inlined, as `Lazy`; `batch_mv` applies a stack."""

from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import lineax as lx
from jaxtyping import PyTree

from .._precision import batched_products
from ._dense import check_batch_size
from ._policy_interface import AbstractPolicy


class AbstractInlinePolicy(AbstractPolicy):
    """A policy that inlines a single `mv`, as `Lazy` under a plain `jax.jit`, and
    differs only in how it applies a stack of vectors (`batch_mv`)."""

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        return operator.raw_mv(vector)  # pyright: ignore[reportAttributeAccessIssue]


class VmapBatch(AbstractInlinePolicy):
    """Inlines a single `mv`; applies a stack of vectors with `jax.vmap` (all in
    lockstep) or, with `batch_size`, in chunks of that many through
    `jax.lax.map(..., batch_size=)`, bounding the memory of the intermediates.

    Stacks of vectors come from [`lineax_dispatch.batch_mv`][] and
    [`lineax_dispatch.batch_solve`][].

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.eye(3), policy=lxd.VmapBatch(batch_size=64))
        ys = lxd.batch_mv(op, jnp.ones((256, 3)))  # 64 vectors at a time
        ys = lxd.VmapBatch().batch_mv(op, jnp.ones((256, 3)))  # all in lockstep
        ```
    """

    batch_size: int | None = eqx.field(default=None, converter=check_batch_size)

    def batch_mv(
        self, operator: lx.AbstractLinearOperator, vectors: PyTree[Any]
    ) -> PyTree[Any]:
        """Applies `operator` to each vector of the stack `vectors` (leading axis).

        **Arguments:**

        - `operator`: an operator.
        - `vectors`: a PyTree of the operator's input structure with a leading
            batch axis on every leaf.

        **Returns:**

        The stacked outputs.
        """
        # The vectors go through `mv` together: its products at the precision one
        # `mv` has (`_precision`).
        with batched_products():
            if self.batch_size is None:
                return jax.vmap(operator.mv)(vectors)
            return lax.map(operator.mv, vectors, batch_size=self.batch_size)


class Scan(AbstractInlinePolicy):
    """Inlines a single `mv`; applies a stack of vectors one at a time with
    `jax.lax.map` (a scan): the least memory, and one compiled copy of `mv`.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.eye(3))
        ys = lxd.batch_mv(op, jnp.ones((256, 3)), policy=lxd.Scan())  # one at a time
        ```
    """

    def batch_mv(
        self, operator: lx.AbstractLinearOperator, vectors: PyTree[Any]
    ) -> PyTree[Any]:
        """Applies `operator` to each vector of `vectors` (leading axis), one at a
        time.

        **Arguments:**

        - `operator`: an operator.
        - `vectors`: a PyTree with a leading batch axis on every leaf.

        **Returns:**

        The stacked outputs.
        """
        return lax.map(operator.mv, vectors)


VmapBatch.__init__.__doc__ = """**Arguments:**

- `batch_size`: vectors per chunk, a positive int; `None` (the default) for all at
    once.
"""

Scan.__init__.__doc__ = """**Arguments:** None."""
