"""Stack: k independent call sites of one computation (no call's input depends on
another's output) become ONE call on the stacked inputs (the computation batched,
`_stack_layout`), so the computation is compiled once and its k products run
together as matrix-matrix products, as fast as XLA's inlined and merged ones."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from ..._precision import batched_products, traced_precision
from ..analyse._stack_plan import StackPlan
from ._interpret import eval_eqns, prologue, read, read_by, write
from ._stack_layout import stacked_call


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
    after = [eqns[i] for i in plan.after] + list(eqns[sites[-1] + 1 :])

    def run(*inputs):
        env = prologue(closed, inputs, sites[0])
        keep = read_by(calls + after, jaxpr.outvars)
        eval_eqns([eqns[i] for i in plan.before], env, keep=keep)
        stacked = [
            jnp.stack([jnp.asarray(read(env, c.invars[p])) for c in calls])
            for p in varying
        ]
        values = [read(env, v) for v in call.invars]
        # The k calls' products, now matrix-matrix ones, at the precision one call
        # has (`_precision`).
        with batched_products():
            outs = stacked_call(traced_precision(call), values, varying, stacked)
        for j, c in enumerate(calls):
            write(env, c.outvars, [None if x is None else x[j] for x in outs])
        eval_eqns(after, env, keep=read_by((), jaxpr.outvars))
        return [read(env, v) for v in jaxpr.outvars]

    return run
