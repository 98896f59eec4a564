"""The `Lazy` policy: lineax's own behaviour."""

from typing import Any

import lineax as lx
from jaxtyping import PyTree

from ._eager import compiled_mv
from ._policy_interface import AbstractPolicy
from .calls._marked import inline_mv, marked_mv


class Lazy(AbstractPolicy):
    """Inlines the operator's `mv` at every call site, as lineax does.

    Cheapest at run time and for cheap operators; an expensive `mv` called from
    several places is compiled again at each of them. It is applied through a
    cached `jax.jit` of the operator's lineax `mv`, which XLA inlines at each call
    site: the compiled program is lineax's, but the user's function is traced once
    per operator kind and signature in a trace rather than at every call site.
    Outside any trace (eager code) `mv` runs that compiled `mv`, compiled once per
    operator kind and signature and reused, rather than dispatching the function
    operation by operation; as with `jax.jit`, Python state the function reads is
    read when it is first compiled.

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
        # Eagerly, the compiled `mv` (op-by-op dispatch of an expensive function is
        # slow); under a trace, one marked call per site, which XLA inlines.
        return marked_mv(operator, vector, inline_mv)

    def eager_mv(self, operator: lx.AbstractLinearOperator):
        return compiled_mv(operator, inline_mv)


Lazy.__init__.__doc__ = """**Arguments:** None."""
