"""Roll: k call sites of one computation in a traced program become one loop body.

The program (a closed jaxpr) is cut at the k calls. The code before the first call
runs as it is (the prologue); then a `lax.scan` over the k steps calls the
computation once per step and runs the code between call j and call j+1 as branch
j of a `lax.switch` on the step number; the code after the last call finishes it
(the epilogue). The computation is compiled once, inside the loop body, at native
speed (no host callback).

What the loop carries: the call's varying inputs (those that are not the same
variable at every call) and the values defined inside the loop that are used at a
later step or after the loop. Everything defined before the loop (the operator's
arrays above all) is closed over, never carried or returned by a branch. The step
number is a counter in the scan's carry that nothing batched reaches, so it stays
unbatched under `vmap` (a `jnp.arange(k)` as the scan's input would be a table of
its own to slice at each step, which XLA compiled measurably slower).

Steps whose code is the same up to literal constants (a Python-unrolled loop
`x = op.mv(c_i * x)`) share one branch and read their literals from a table
indexed by the step, so such a program becomes a plain loop. The first step, which
reads no carried value, shares their branch where its code has a literal or a
value from before the loop in the place of a carried one (the slot starts with it:
`RollPlan.initial`); the last, which has no next call, where the code after its
call repeats the beginning of the branch and the rest only computes an unused next
input (`RollPlan.tail`).

The rewrite is an interpreter: it evaluates the jaxpr's equations with
`primitive.bind`, so `jax.jit`, `grad`, `jvp` and `vmap` of the rolled program see
ordinary JAX operations; the reverse pass of the scan is a scan too (rolled)."""

from collections.abc import Callable, Sequence
from typing import Any

import jax.extend.core as jex

from ..._compat import bind_equation
from ..analyse._roll_steps import is_literal


def eval_eqns(eqns: Sequence[Any], env: dict, literal: Callable | None = None) -> None:
    """Evaluates `eqns` in order, reading and writing `env` (Var -> value).
    `literal(i, q, value)`, if given, supplies the value of the literal input `q`
    of equation `i` (a step's literal read from a table)."""
    for i, eqn in enumerate(eqns):
        invals = [
            (v.val if literal is None else literal(i, q, v.val))
            if is_literal(v)
            else env[v]
            for q, v in enumerate(eqn.invars)
        ]
        outs = bind_equation(eqn, invals)
        for var, value in zip(eqn.outvars, outs):
            if not isinstance(var, jex.DropVar):
                env[var] = value


def prologue(closed: Any, inputs: Sequence[Any], stop: int) -> dict:
    """The environment after running the equations of `closed` before index
    `stop` on `inputs` (its constants and inputs bound first)."""
    jaxpr = closed.jaxpr
    env: dict = dict(zip(jaxpr.constvars, closed.consts))
    env.update(zip(jaxpr.invars, inputs))
    eval_eqns(jaxpr.eqns[:stop], env)
    return env
