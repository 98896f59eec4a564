"""The `Lazy` policy: lineax's own behaviour."""

from typing import Any

import lineax as lx
from jaxtyping import PyTree

from ._base import AbstractPolicy
from ._marked import current_scope, marked_mv


class Lazy(AbstractPolicy):
    """Inlines the operator's `mv` at every call site, exactly as lineax does.

    Cheapest at run time and for cheap operators; an expensive `mv` called from
    several places is traced and compiled again at each of them. Outside any trace
    (eager code) `mv` runs one compiled `mv`, compiled once per operator kind and
    signature and reused, rather than dispatching the function operation by
    operation; as with `jax.jit`, Python state the function reads is read when it
    is first compiled.

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
        if current_scope() is None:
            # Eager: the compiled `mv`, compiled once per operator kind and
            # signature (op-by-op dispatch of an expensive function is slow).
            return marked_mv(operator, vector)
        return operator.raw_mv(vector)  # pyright: ignore[reportAttributeAccessIssue]


Lazy.__init__.__doc__ = """**Arguments:** None."""
