"""Stack: k independent call sites of one computation (no call's input depends on
another's output) become ONE call on the stacked inputs (the computation batched,
`_stack_layout`), so the computation is compiled once and its k products run
together as matrix-matrix products, as fast as XLA's inlined and merged ones."""

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..._compat import call_callee
from ..._jaxpr import is_literal
from ...policies.decision._cost import batchable
from ._roll_plan import call_group


@dataclasses.dataclass(frozen=True)
class StackPlan:
    """How to stack the k calls of one computation.

    **Fields:**

    - `sites`: indices of the k call equations, in program order.
    - `varying`: positions of the call's inputs that differ between calls.
    - `before`, `after`: indices of the equations between the first and the last
        call that do not (`before`) and that do (`after`) depend on a call's
        output; the first run before the stacked call, the second after it.
    """

    sites: tuple[int, ...]
    varying: tuple[int, ...]
    before: tuple[int, ...]
    after: tuple[int, ...]


def plan_stack(jaxpr: Any, sites: Sequence[int]) -> StackPlan | None:
    """The plan for stacking the calls at `sites`, or `None` when a call's input
    depends on another call's output, when the calls or the code between them
    have effects (whose order stacking would change, and which `vmap` may not
    batch: an ordered callback), when `vmap` cannot batch the computation (a
    `jax.pure_callback` without a `vmap_method`), or when the calls differ in
    avals.

    **Arguments:**

    - `jaxpr`: the program's `jax.extend.core.Jaxpr`.
    - `sites`: indices into `jaxpr.eqns` of the calls of one computation.

    **Returns:**

    A `StackPlan`, or `None`.
    """
    group = call_group(jaxpr, sites)
    if group is None or not group[2] or group[1][0].effects:
        return None
    if not batchable(call_callee(group[1][0]).jaxpr):
        return None
    sites, _, varying = group
    eqns = jaxpr.eqns
    site_set = set(sites)
    tainted: set = set()
    before, after = [], []
    for index in range(sites[0], sites[-1] + 1):
        eqn = eqns[index]
        reads_output = any(not is_literal(v) and v in tainted for v in eqn.invars)
        if index in site_set:
            if any(
                not is_literal(eqn.invars[p]) and eqn.invars[p] in tainted
                for p in varying
            ):
                return None
            tainted.update(eqn.outvars)
            continue
        if eqn.effects:
            return None
        if reads_output:
            tainted.update(eqn.outvars)
            after.append(index)
        else:
            before.append(index)
    return StackPlan(tuple(sites), varying, tuple(before), tuple(after))
