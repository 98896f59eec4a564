"""The `Roll` policy: under `lxd.jit`, every call site of the operator's `mv`
becomes one loop body."""

from typing import Any

import lineax as lx
from jaxtyping import PyTree

from ._eager import compiled_mv
from ._policy_interface import AbstractPolicy
from .calls._marked import marked_mv


class Roll(AbstractPolicy):
    """Applies `mv` through one cached `jax.jit` of the operator's lineax `mv` (a
    marked call); under [`lineax_dispatch.jit`][], the k call sites of one operator
    kind in a program become ONE loop body: the computation is compiled once and
    runs at native speed, with no host callback.

    Under `lxd.jit` the program is cut at the k calls: the code before the first
    call runs as it is; a `lax.scan` over the k steps calls `mv` once per step and
    runs the code between call j and call j+1 as branch j of a `lax.switch`; the
    code after the last call finishes it. The operator's arrays (the same at every
    call) are closed over, never carried. Independent and dependent sites (each
    call fed the previous output) both roll; results are `jax.jit`'s, under `grad`,
    `jvp` and `vmap` too.

    Under a plain `jax.jit`, or eagerly, it behaves as `Lazy` (XLA inlines the
    marked call), except that the user's function is traced once per operator
    kind and signature rather than at every call site.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Roll())

        @lxd.jit
        def f(x):
            for i in range(8):  # 8 call sites, compiled as one loop body
                x = op.mv(x) / 64
            return x

        y = f(jnp.ones(64, jnp.float32))
        ```
    """

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        return marked_mv(operator, vector)

    def eager_mv(self, operator: lx.AbstractLinearOperator):
        return compiled_mv(operator)


Roll.__init__.__doc__ = """**Arguments:** None."""
