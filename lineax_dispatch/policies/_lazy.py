"""The `Lazy` policy: lineax's own behaviour."""

from typing import Any

import lineax as lx
from jaxtyping import PyTree

from ._base import AbstractPolicy


class Lazy(AbstractPolicy):
    """Inlines the operator's `mv` at every call site, exactly as lineax does.

    Cheapest at run time and for cheap operators; an expensive `mv` called from
    several places is traced and compiled again at each of them.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((3,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Lazy())
        f = jax.jit(lambda x: op.mv(x) + op.mv(2 * x))  # cumsum inlined twice
        y = f(jnp.ones(3, jnp.float32))
        ```
    """

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        return operator.raw_mv(vector)  # pyright: ignore[reportAttributeAccessIssue]


Lazy.__init__.__doc__ = """**Arguments:** None."""
