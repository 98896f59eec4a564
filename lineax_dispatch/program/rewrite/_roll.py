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

import jax
import jax.extend.core as jex
import jax.lax as lax
import jax.numpy as jnp

from ..._compat import bind_equation
from ..._explicit_axes import explicit_sharding
from ..analyse._hoist import Hoisted, split_invariant
from ..analyse._roll_plan import RollPlan
from ..analyse._roll_steps import is_literal
from ._interpret import eval_eqns, prologue
from ._roll_inputs import fresh_inputs


def _as_aval(value: Any, aval: Any) -> Any:
    """`value` with exactly `aval`'s dtype and no weak type, and its sharding where
    that is on an Explicit mesh axis (part of the type), so that a loop carry has
    one type whatever branch wrote it."""
    out = lax.convert_element_type(jnp.asarray(value), aval.dtype)
    sharding = explicit_sharding(aval)
    if sharding is not None and explicit_sharding(out) != sharding:
        out = jax.sharding.reshard(out, sharding)
    return out


def _at(table: jax.Array, j: jax.Array) -> jax.Array:
    """`table[j]` for a step number `j` known to be in range (no wrap-around of
    negative indices to compile)."""
    return lax.dynamic_index_in_dim(
        table, j, keepdims=False, allow_negative_indices=False
    )


def _table_literal(table: dict, key: Any, j: Any, value: Any, aval: Any) -> Any:
    """A literal of a branch's code at step `j`: from its table where the steps
    differ in it, else `value`."""
    if key not in table:
        return value
    return lax.convert_element_type(_at(table[key], j), aval.dtype)


def _zeros(aval: Any) -> jax.Array:
    return jnp.zeros(aval.shape, aval.dtype, out_sharding=explicit_sharding(aval))


def _start(start: Any, aval: Any, env: dict) -> jax.Array:
    """A slot's value before the loop (`RollPlan.initial`)."""
    if start is None:
        return _zeros(aval)
    kind, value = start
    value = env[value] if kind == "var" else value
    return _as_aval(jnp.broadcast_to(jnp.asarray(value), aval.shape), aval)


def _hoisted_env(hoisted: Hoisted, call: Any, outer: dict, varying) -> dict:
    """The callee's environment before the loop: its constants, its invariant
    inputs and what its invariant equations compute from them."""
    jaxpr = hoisted.callee.jaxpr
    env: dict = dict(zip(jaxpr.constvars, hoisted.callee.consts))
    for p, (inner, v) in enumerate(zip(jaxpr.invars, call.invars)):
        if p not in varying:
            env[inner] = v.val if is_literal(v) else outer[v]
    eval_eqns(hoisted.before, env)
    return env


def call_with(call: Any, env: dict, varying: Sequence[int], args: Sequence[Any]):
    """The outputs of the call equation `call` (a list) with its inputs at the
    positions `varying` given as `args`, the others read from `env` (or their
    literal): a varying input may be a literal at this call (a Python number
    passed to a jitted function) and another at the next."""
    full = [v.val if is_literal(v) else env[v] for v in call.invars]
    for p, value in zip(varying, args):
        full[p] = value
    return bind_equation(call, full)


def _step_call(hoisted: Hoisted, env: dict, varying, args) -> list:
    """One step's call with its invariant part already computed: the rest of the
    callee, inline; its outputs as a list."""
    jaxpr = hoisted.callee.jaxpr
    local = dict(env)
    local.update((jaxpr.invars[p], value) for p, value in zip(varying, args))
    eval_eqns(hoisted.inside, local)
    return [v.val if is_literal(v) else local[v] for v in jaxpr.outvars]


def rolled_function(closed: Any, plan: RollPlan, loop: str = "scan") -> Callable:
    """The program `closed` (a `ClosedJaxpr`) with the calls of `plan` rolled, as a
    function of the jaxpr's inputs returning its outputs (a flat list).

    **Arguments:**

    - `closed`: the program.
    - `plan`: from `plan_roll`.
    - `loop`: `"scan"`, a `lax.scan` (reverse-mode differentiable: its transpose
        is a scan too), or `"while"`, the same body in a `lax.while_loop` on the
        step counter, which JAX lowers directly (a scan is lowered by tracing its
        `while` form), for a program compiled as it is.

    **Returns:**

    A function `(*inputs) -> list of outputs`.
    """
    jaxpr = closed.jaxpr
    eqns = jaxpr.eqns
    sites, varying = plan.sites, plan.varying
    k = len(sites)
    calls = [eqns[i] for i in sites]
    call = calls[0]
    # The last step's code is the `plan.tail` equations after its call (none
    # unless they repeat the code between two calls).
    tail = sites[-1] + 1 + (plan.tail or 0)
    segments = [
        eqns[sites[j] + 1 : sites[j + 1] if j + 1 < k else tail] for j in range(k)
    ]

    # The callee's code that reads only invariant inputs runs once, before the loop.
    hoisted = split_invariant(call, varying)
    # The last call's outputs leave the loop only where the code after it reads
    # them (carried, they would be copied at every step).
    later = {v for e in eqns[tail:] for v in e.invars if not is_literal(v)}
    later.update(v for v in jaxpr.outvars if not is_literal(v))
    out_vars = [v for v in calls[-1].outvars if v in later]
    kept = [p for p, v in enumerate(calls[-1].outvars) if v in later]
    # Code that only computes the next call's inputs from values of before the
    # loop runs at the start of the step that reads them (`_roll_inputs.py`).
    shared = plan.classes[0]
    first = plan.representatives[shared]
    moved, skipped, fresh = fresh_inputs(jaxpr, plan, segments[first], later)
    carried = [q for q in range(len(varying)) if q not in fresh]

    def read(env: dict, v: Any) -> Any:
        return v.val if is_literal(v) else env[v]

    def run(*inputs):
        env = prologue(closed, inputs, sites[0])
        outer = dict(env)  # closed over by the loop: never carried
        if hoisted is not None:
            invariant = _hoisted_env(hoisted, call, outer, set(varying))
        args0 = [
            _as_aval(read(env, call.invars[p]), call.invars[p].aval) for p in varying
        ]
        starts = plan.initial or (None,) * len(plan.slot_avals)
        slots0 = [_start(x, aval, env) for x, aval in zip(starts, plan.slot_avals)]
        outs0 = [_zeros(call.outvars[p].aval) for p in kept]
        tables = [
            {key: jnp.asarray(value) for key, value in table.items()}
            for table in plan.tables
        ]

        def branch(c: int) -> Callable:
            r = plan.representatives[c]
            table = tables[c]
            segment = segments[r]

            def literal_at(j, key, value, aval):
                return _table_literal(table, key, j, value, aval)

            def go(j, args, slots, outs):
                local = dict(outer)
                for var, value in zip(plan.reads[r], slots):
                    if var is not None:
                        local[var] = value
                for var, value in zip(calls[r].outvars, outs):
                    if not isinstance(var, jex.DropVar):
                        local[var] = value

                def literal(i, q, value):
                    return literal_at(
                        j, ("eqn", i, q), value, segment[i].invars[q].aval
                    )

                if skipped and c == shared:
                    run = [i for i in range(len(segment)) if i not in skipped]
                    eval_eqns(
                        [segment[i] for i in run],
                        local,
                        lambda i, q, v: literal(run[i], q, v),
                    )
                else:
                    eval_eqns(segment, local, literal)
                if r + 1 < k:
                    nxt = calls[r + 1]
                    args = [
                        _as_aval(
                            literal_at(
                                j, ("next", p), nxt.invars[p].val, nxt.invars[p].aval
                            )
                            if is_literal(nxt.invars[p])
                            else local[nxt.invars[p]],
                            nxt.invars[p].aval,
                        )
                        for q, p in enumerate(varying)
                        if q not in fresh
                    ]
                else:  # the last step: no next call
                    args = [args[q] for q in carried]
                new_slots = [
                    _as_aval(local[var], aval) if var in local else old
                    for var, old, aval in zip(plan.writes[r], slots, plan.slot_avals)
                ]
                return list(args), new_slots

            return go

        branches = [branch(c) for c in range(len(plan.representatives))]
        classes = jnp.asarray(plan.classes)

        def step_inputs(j, carried_args):
            """This step's inputs: the carried ones, and the fresh ones computed
            here with the previous step's literals (the first step's from before
            the loop)."""
            args = dict(zip(carried, carried_args))
            if fresh:
                prev = jnp.maximum(j - 1, 0)
                segment = segments[first]
                local = dict(outer)

                def literal(i, q, value):
                    aval = segment[moved[i]].invars[q].aval
                    key = ("eqn", moved[i], q)
                    return _table_literal(tables[shared], key, prev, value, aval)

                eval_eqns([segment[i] for i in moved], local, literal)
                for q, var in fresh.items():
                    aval = call.invars[varying[q]].aval
                    args[q] = jnp.where(j == 0, args0[q], _as_aval(local[var], aval))
            return [args[q] for q in range(len(varying))]

        def body(carry, _):
            j, carried_args, slots, _ = carry
            args = step_inputs(j, carried_args)
            # The one call site of the computation.
            if hoisted is None:
                values = call_with(call, outer, varying, args)
            else:
                values = _step_call(hoisted, invariant, varying, args)
            outs = [
                _as_aval(value, v.aval)
                if not isinstance(v, jex.DropVar)
                else _zeros(v.aval)
                for v, value in zip(call.outvars, values)
            ]
            if len(branches) == 1:
                new_args, new_slots = branches[0](j, args, slots, outs)
            else:
                new_args, new_slots = lax.switch(
                    _at(classes, j), branches, j, args, slots, outs
                )
            return (j + 1, new_args, new_slots, [outs[p] for p in kept]), None

        carry = (jnp.int32(0), [args0[q] for q in carried], slots0, outs0)
        if loop == "while":
            _, last, slots, outs = lax.while_loop(
                lambda c: c[0] < k, lambda c: body(c, None)[0], carry
            )
        else:
            (_, last, slots, outs), _ = lax.scan(body, carry, None, length=k)
        args = dict(zip(carried, last))
        env = dict(outer)
        env.update((v, x) for v, x in zip(plan.writes[-1], slots) if v is not None)
        env.update(zip(out_vars, outs))
        # The last step's next inputs, where the program reads them after it.
        env.update((v, args[q]) for q, v in enumerate(plan.last_next) if v is not None)
        eval_eqns(eqns[tail:], env)
        return [read(env, v) for v in jaxpr.outvars]

    return run
