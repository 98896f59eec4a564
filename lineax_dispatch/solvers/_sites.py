"""Whether copies of an operator's `mv` cost XLA nothing more to compile than one."""

import lineax as lx

from ..operators import AbstractDispatchOperator
from ..policies import Lazy, mv_cost
from ..policies._marked import pinned_scope
from ..policies._pinned import applied_policy, scope_of


def compiles_once(operator: lx.AbstractLinearOperator) -> bool:
    """Whether every copy of `operator.mv` in a program compiles to the same one
    kernel: an `mv` of one operation (one matrix-vector product, one elementwise
    product) applied as traced. XLA:CPU compiles identical kernels once, so a
    solver may then write `mv` at several sites, as lineax's do, at no compile
    cost; its single application slot is what costs (the selects feeding it make
    kernels that differ from each other). Measured: one solve of a dense n=64
    operator by `lxd.CG` 1.03-1.11x plain lineax's compile time, by lineax's
    loop on the same operator 1.01x.

    Only this package's operators with the `Lazy` policy are asked: their `mv`'s
    trace (through its marked call, once per program whatever the number of sites)
    gives the count without running the user's code again. (A plain lineax
    operator keeps the one slot.)

    **Arguments:**

    - `operator`: the operator a solver is about to apply.

    **Returns:**

    `True` where copies of its `mv` compile as one.
    """
    if not isinstance(operator, AbstractDispatchOperator) or not isinstance(
        applied_policy(operator.policy), Lazy
    ):
        return False
    # Under the scope a solve's decision pinned (where it did): its trace of the
    # user's function serves.
    with pinned_scope(
        scope_of(operator.policy) if hasattr(operator, "policy") else None
    ):
        cost = mv_cost(operator, lower=False)
    return cost.dots + cost.ops <= 1
