"""A policy's `mv` with its products at a stated precision, for the batched solves
that lineax traces only when the program is lowered."""

from typing import Any

import equinox as eqx
import jax
import jax.extend.core as jex
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import PyTree

from .._precision import with_precision
from ._policy_interface import AbstractPolicy, with_top_policy


class _AtPrecision(AbstractPolicy):
    """The library's own policy for an operator that a batch of solves applies:
    `policy`'s `mv`, each of its products that has no precision of its own given
    `precision` (`_precision`).

    A batch of solves is one `vmap` of lineax's `linear_solve`, whose solver (and
    so every `mv`) is traced when the program is lowered, after any context that
    the batch set has ended; this policy carries the precision to that trace.
    """

    policy: AbstractPolicy
    precision: Any = eqx.field(static=True)

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        inner = with_top_policy(operator, self.policy)
        dynamic, static = eqx.partition((inner, vector), eqx.is_array)

        def apply(dynamic):
            op, v = eqx.combine(dynamic, static)
            return op.mv(v)

        leaves = jtu.tree_leaves(dynamic)
        closed, out = jax.make_jaxpr(apply, return_shape=True)(dynamic)
        closed = with_precision(closed, self.precision)
        flat = jex.jaxpr_as_fun(closed)(*leaves)
        return jtu.tree_unflatten(jtu.tree_structure(out), flat)


def at_precision(operator: Any, precision: Any) -> Any:
    """`operator` (an operator of lineax-dispatch) applying its policy's `mv` with
    the products of no precision of their own at `precision`; `operator` itself
    where `precision` is `None`.

    **Arguments:**

    - `operator`: an operator of lineax-dispatch.
    - `precision`: a canonical precision (`_precision.default_precision()`), or
        `None`.

    **Returns:**

    The operator, its top policy wrapped.
    """
    if precision is None:
        return operator
    return with_top_policy(operator, _AtPrecision(operator.policy, precision))
