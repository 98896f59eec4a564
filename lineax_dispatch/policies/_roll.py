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
number is the scan's own input, so it stays unbatched under `vmap`.

The rewrite is an interpreter: it evaluates the jaxpr's equations with
`primitive.bind`, so `jax.jit`, `grad`, `jvp` and `vmap` of the rolled program see
ordinary JAX operations; the reverse pass of the scan is a scan too (rolled).
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax.extend.core as jex
import jax.lax as lax
import jax.numpy as jnp
import numpy as np

from .._compat import bind_equation


def _is_literal(v: Any) -> bool:
    return isinstance(v, jex.Literal)


def eval_eqns(eqns: Sequence[Any], env: dict) -> None:
    """Evaluates `eqns` in order, reading and writing `env` (Var -> value)."""
    for eqn in eqns:
        invals = [v.val if _is_literal(v) else env[v] for v in eqn.invars]
        outs = bind_equation(eqn, invals)
        for var, value in zip(eqn.outvars, outs):
            if not isinstance(var, jex.DropVar):
                env[var] = value


def _plain_aval(aval: Any) -> bool:
    return (
        hasattr(aval, "shape")
        and hasattr(aval, "dtype")
        and isinstance(aval.dtype, np.dtype)
    )


def _as_aval(value: Any, aval: Any) -> Any:
    """`value` with exactly `aval`'s dtype and no weak type, so that a loop carry
    has one type whatever branch wrote it."""
    return lax.convert_element_type(jnp.asarray(value), aval.dtype)


@dataclasses.dataclass(frozen=True)
class RollPlan:
    """Where the k calls of one group are in a top-level jaxpr, and what the loop
    carries.

    **Fields:**

    - `sites`: indices of the k call equations, in program order.
    - `varying`: positions of the call's inputs that differ between calls.
    - `slots`: variables defined inside the loop and read at a later step or after
        it.
    """

    sites: tuple[int, ...]
    varying: tuple[int, ...]
    slots: tuple[Any, ...]


def _same_input(a: Any, b: Any) -> bool:
    if _is_literal(a) and _is_literal(b):
        return a.aval == b.aval and np.array_equal(np.asarray(a.val), np.asarray(b.val))
    return a is b


def plan_roll(jaxpr: Any, sites: Sequence[int]) -> RollPlan | None:
    """The plan for rolling the calls at `sites` of `jaxpr` (a top-level `Jaxpr`),
    or `None` when they cannot be rolled (fewer than two, different avals, or a
    value the loop would carry that is not a plain array).

    **Arguments:**

    - `jaxpr`: the program's `jax.extend.core.Jaxpr`.
    - `sites`: indices into `jaxpr.eqns` of the calls of one computation.

    **Returns:**

    A `RollPlan`, or `None`.
    """
    sites = tuple(sorted(sites))
    if len(sites) < 2:
        return None
    eqns = jaxpr.eqns
    calls = [eqns[i] for i in sites]
    first = calls[0]
    for eqn in calls[1:]:
        if [v.aval for v in eqn.invars] != [v.aval for v in first.invars]:
            return None
    varying = tuple(
        p
        for p in range(len(first.invars))
        if not all(_same_input(c.invars[p], first.invars[p]) for c in calls[1:])
    )
    # Which step defines each variable: the call of step j and the segment after it.
    step_of: dict[Any, int] = {}
    for j, start in enumerate(sites):
        stop = sites[j + 1] if j + 1 < len(sites) else start + 1
        for eqn in eqns[start:stop]:
            for v in eqn.outvars:
                if not isinstance(v, jex.DropVar):
                    step_of[v] = j
    slots: list[Any] = []
    seen: set = set()

    def note_use(v: Any, step: float) -> None:
        if _is_literal(v) or v not in step_of or v in seen:
            return
        if step_of[v] != step:
            seen.add(v)
            slots.append(v)

    for j, start in enumerate(sites):
        stop = sites[j + 1] if j + 1 < len(sites) else start + 1
        for index in range(start, stop):
            eqn = eqns[index]
            # A call's varying inputs are read by the branch before it.
            use_step = j - 1 if index == start else j
            positions = varying if index == start else range(len(eqn.invars))
            for p in positions:
                note_use(eqn.invars[p], use_step)
    for eqn in eqns[sites[-1] + 1 :]:
        for v in eqn.invars:
            note_use(v, float("inf"))
    for v in jaxpr.outvars:
        note_use(v, float("inf"))
    if not all(_plain_aval(v.aval) for v in slots):
        return None
    if not all(_plain_aval(first.invars[p].aval) for p in varying):
        return None
    return RollPlan(sites, varying, tuple(slots))


def rolled_function(closed: Any, plan: RollPlan) -> Callable:
    """The program `closed` (a `ClosedJaxpr`) with the calls of `plan` rolled, as a
    function of the jaxpr's inputs returning its outputs (a flat list).

    **Arguments:**

    - `closed`: the program.
    - `plan`: from `plan_roll`.

    **Returns:**

    A function `(*inputs) -> list of outputs`.
    """
    jaxpr, consts = closed.jaxpr, closed.consts
    eqns = jaxpr.eqns
    sites, varying, slots = plan.sites, plan.varying, plan.slots
    calls = [eqns[i] for i in sites]
    call = calls[0]
    k = len(sites)
    segments = [
        eqns[sites[j] + 1 : sites[j + 1]] if j + 1 < k else [] for j in range(k)
    ]

    def read(env: dict, v: Any) -> Any:
        return v.val if _is_literal(v) else env[v]

    def run(*inputs):
        env: dict = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, inputs))
        eval_eqns(eqns[: sites[0]], env)
        outer = dict(env)  # closed over by the loop: never carried
        args0 = [
            _as_aval(read(env, call.invars[p]), call.invars[p].aval) for p in varying
        ]
        slots0 = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in slots]

        def branch(j: int) -> Callable:
            def go(state):
                args, slot_values, outs = state
                local = dict(outer)
                local.update(zip(slots, slot_values))
                for var, value in zip(calls[j].outvars, outs):
                    if not isinstance(var, jex.DropVar):
                        local[var] = value
                eval_eqns(segments[j], local)
                if j + 1 < k:
                    nxt = calls[j + 1]
                    args = [
                        _as_aval(read(local, nxt.invars[p]), nxt.invars[p].aval)
                        for p in varying
                    ]
                new_slots = [
                    _as_aval(local[v], v.aval) if v in local else old
                    for v, old in zip(slots, slot_values)
                ]
                return list(args), new_slots

            return go

        branches = [branch(j) for j in range(k)]

        def body(carry, j):
            args, slot_values = carry
            full = [read(outer, v) for v in call.invars]
            for p, value in zip(varying, args):
                full[p] = value
            local = {}
            for var, value in zip(call.invars, full):
                if not _is_literal(var):
                    local[var] = value
            # The one call site of the computation.
            out_env: dict = dict(local)
            eval_eqns([call], out_env)
            outs = [
                out_env[v] if not isinstance(v, jex.DropVar) else None
                for v in call.outvars
            ]
            outs = [
                o if o is not None else jnp.zeros(v.aval.shape, v.aval.dtype)
                for o, v in zip(outs, call.outvars)
            ]
            new = lax.switch(j, branches, (list(args), list(slot_values), outs))
            return (new[0], new[1]), None

        (args, slot_values), _ = lax.scan(body, (args0, slots0), jnp.arange(k))
        env = dict(outer)
        env.update(zip(slots, slot_values))
        eval_eqns(eqns[sites[-1] + 1 :], env)
        return [read(env, v) for v in jaxpr.outvars]

    return run
