"""The `Outline` policy: one compiled callee shared by every call site."""

from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import lineax as lx
from equinox._compile_utils import hashable_combine, hashable_partition
from jaxtyping import PyTree

from ._base import AbstractPolicy, RawMv


class _AbstractMv(eqx.Module):
    """Shape-only evaluation of an outlined `mv`.

    `noinline`'s default abstract function is a new closure at each call, so its
    shape cache would miss at every call site and trace the user's function again.
    This one compares equal for equal operators: the function is traced once for
    shapes, then the cache answers for the other call sites.
    """

    static: Any = eqx.field(static=True)

    def __call__(self, dynamic: PyTree[Any], vector: PyTree[Any]) -> PyTree[Any]:
        return hashable_combine(dynamic, self.static)(vector)


class Outline(AbstractPolicy):
    """Keeps the operator's `mv` out of line: it is compiled once, separately, and
    every call site calls that one executable.

    Built on `equinox.internal.noinline`, so `jit`, `vmap`, `grad` and linear
    transposition all work through it. The cost is paid at run time: each call is a
    host callback into the separately compiled executable (tens to hundreds of
    microseconds on CPU, a device-host round trip on an accelerator). It wins for an
    expensive-to-compile `mv` called from several places and run a few times.

    Operators nested inside an outlined operator are applied inline within the
    outlined callee (the outermost non-`Lazy` policy decides for the whole
    expression).

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Outline())
        f = jax.jit(lambda x: op.mv(x) + op.mv(2 * x))  # one callee, two calls
        y = f(jnp.ones(64, jnp.float32))
        ```
    """

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        raw = RawMv(operator)
        # The same split `noinline` makes of `raw` itself.
        _, static = hashable_partition(raw, eqx.is_array)
        return eqxi.noinline(raw, _AbstractMv(static))(vector)


Outline.__init__.__doc__ = """**Arguments:** None."""
