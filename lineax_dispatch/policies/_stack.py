"""Stack: k independent call sites of one computation (no call's input depends on
another's output) become ONE call on the stacked inputs (the computation batched,
`_stack_layout`), so the computation is compiled once and its k products run
together as matrix-matrix products, as fast as XLA's inlined and merged ones."""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax.extend.core as jex
import jax.numpy as jnp

from .._compat import call_callee
from ._cost import batchable
from ._roll import eval_eqns, prologue
from ._roll_plan import call_group
from ._roll_steps import is_literal
from ._stack_layout import stacked_call


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


def stacked_function(closed: Any, plan: StackPlan) -> Callable:
    """The program `closed` with the calls of `plan` stacked into one, as a
    function of the jaxpr's inputs returning its outputs (a flat list).

    **Arguments:**

    - `closed`: the program (a `ClosedJaxpr`).
    - `plan`: from `plan_stack`.

    **Returns:**

    A function `(*inputs) -> list of outputs`.
    """
    jaxpr = closed.jaxpr
    eqns = jaxpr.eqns
    sites, varying = plan.sites, plan.varying
    calls = [eqns[i] for i in sites]
    call = calls[0]

    def read(env: dict, v: Any) -> Any:
        return v.val if is_literal(v) else env[v]

    def run(*inputs):
        env = prologue(closed, inputs, sites[0])
        eval_eqns([eqns[i] for i in plan.before], env)
        stacked = [
            jnp.stack([jnp.asarray(read(env, c.invars[p])) for c in calls])
            for p in varying
        ]
        values = [read(env, v) for v in call.invars]
        outs = stacked_call(call, values, varying, stacked)
        for j, c in enumerate(calls):
            for v, value in zip(c.outvars, outs):
                if not isinstance(v, jex.DropVar) and value is not None:
                    env[v] = value[j]
        eval_eqns([eqns[i] for i in plan.after], env)
        eval_eqns(eqns[sites[-1] + 1 :], env)
        return [read(env, v) for v in jaxpr.outvars]

    return run
