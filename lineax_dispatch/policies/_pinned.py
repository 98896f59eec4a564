"""A decided policy pinned to the trace a solve was bound in."""

from typing import Any

import equinox as eqx
import lineax as lx
from jaxtyping import PyTree

from ._base import AbstractPolicy
from ._marked import pinned_scope, TraceScope


class _Pinned(AbstractPolicy):
    """Applies `policy` as part of the trace `scope`.

    What a solver's `init` gives a decided `Auto` operator: lineax's `linear_solve`
    primitive evaluates and lowers its solver in traces of their own, and pinned to
    the trace the solve was bound in, the operator's `mv` there reuses the marked
    callee traced for the decision instead of tracing the user's function again.
    """

    policy: AbstractPolicy
    scope: TraceScope | None = eqx.field(static=True)

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        with pinned_scope(self.scope):
            return self.policy.mv(operator, vector)


def pinned(policy: AbstractPolicy, scope: TraceScope) -> AbstractPolicy:
    """`policy`, applied as part of the trace `scope` (see `_Pinned`).

    **Arguments:**

    - `policy`: a decided policy.
    - `scope`: the trace (from `current_scope()`).

    **Returns:**

    A policy.
    """
    return _Pinned(policy, scope)
