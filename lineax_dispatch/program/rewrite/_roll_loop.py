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

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.lax as lax
import jax.numpy as jnp

from ..._compat import bind_equation
from ..analyse._hoist import Hoisted, split_invariant
from ..analyse._roll_plan import RollPlan
from ..analyse._roll_steps import stops
from ._interpret import eval_eqns, prologue, read, read_by, write
from ._roll_carry import as_aval, at, set_slots, slot_start, table_literal, zeros
from ._roll_inputs import fresh_inputs


def _hoisted_env(hoisted: Hoisted, call: Any, outer: dict, varying) -> dict:
    """The callee's environment before the loop: its constants, its invariant
    inputs and what its invariant equations compute from them."""
    jaxpr = hoisted.callee.jaxpr
    env: dict = dict(zip(jaxpr.constvars, hoisted.callee.consts))
    for p, (inner, v) in enumerate(zip(jaxpr.invars, call.invars)):
        if p not in varying:
            env[inner] = read(outer, v)
    eval_eqns(hoisted.before, env, keep=read_by(hoisted.inside, jaxpr.outvars))
    return env


def call_with(call: Any, env: dict, varying: Sequence[int], args: Sequence[Any]):
    """The outputs of the call equation `call` (a list) with its inputs at the
    positions `varying` given as `args`, the others read from `env` (or their
    literal): a varying input may be a literal at this call (a Python number
    passed to a jitted function) and another at the next."""
    full = [read(env, v) for v in call.invars]
    for p, value in zip(varying, args):
        full[p] = value
    return bind_equation(call, full)


def _step_call(hoisted: Hoisted, env: dict, varying, args) -> list:
    """One step's call with its invariant part already computed: the rest of the
    callee, inline; its outputs as a list."""
    jaxpr = hoisted.callee.jaxpr
    local = dict(env)
    local.update((jaxpr.invars[p], value) for p, value in zip(varying, args))
    eval_eqns(hoisted.inside, local, keep=read_by((), jaxpr.outvars))
    return [read(local, v) for v in jaxpr.outvars]


def _eval_step_code(segment, indices, env: dict, table: dict, j, keep) -> None:
    """Evaluates the equations of a branch's code `segment` at `indices` (in
    order), at step `j`: the literals that differ between its steps read from the
    branch's `table`."""

    def literal(i: int, q: int, atom: Any) -> Any:
        return table_literal(table, ("eqn", indices[i], q), j, atom.val, atom.aval)

    eval_eqns([segment[i] for i in indices], env, literal, keep=keep)


@dataclasses.dataclass(frozen=True)
class _Roll:
    """What the rolled program reads of the traced one, worked out once.

    **Fields:**

    - `closed`, `plan`, `loop`: `rolled_function`'s arguments.
    - `calls`: the k call equations.
    - `segments`: per step, the code after its call that its branch runs.
    - `tail`: the index of the program's first equation after the loop.
    - `hoisted`: the callee's invariant part (`split_invariant`), or `None`.
    - `kept`: the positions of the last call's outputs read after the loop
        (carried, the others would be copied at every step for nothing).
    - `moved`, `skipped`, `fresh`: the inputs computed at the start of each step
        (`fresh_inputs`).
    - `carried`: the positions in `plan.varying` of the inputs carried.
    """

    closed: Any
    plan: RollPlan
    loop: str
    calls: list
    segments: list
    tail: int
    hoisted: Hoisted | None
    kept: list
    moved: tuple
    skipped: frozenset
    fresh: dict
    carried: list

    @property
    def shared(self) -> int:
        """The branch of the first step (and, where one is, the shared one)."""
        return self.plan.classes[0]


def _analyse(closed: Any, plan: RollPlan, loop: str) -> _Roll:
    """`rolled_function`'s reading of the program, once for every run."""
    eqns, sites = closed.jaxpr.eqns, plan.sites
    calls = [eqns[i] for i in sites]
    # The last step's code is the `plan.tail` equations after its call (none
    # unless they repeat the code between two calls).
    ends = stops(sites, plan.tail)
    tail = ends[-1]
    segments = [eqns[start + 1 : end] for start, end in zip(sites, ends)]
    # The last call's outputs leave the loop only where the code after it reads
    # them (carried, they would be copied at every step).
    later = read_by(eqns[tail:], closed.jaxpr.outvars)
    kept = [p for p, v in enumerate(calls[-1].outvars) if v in later]
    # Code that only computes the next call's inputs from values of before the
    # loop runs at the start of the step that reads them (`_roll_inputs.py`).
    first = plan.representatives[plan.classes[0]]
    moved, skipped, fresh = fresh_inputs(closed.jaxpr, plan, segments[first], later)
    carried = [q for q in range(len(plan.varying)) if q not in fresh]
    # The callee's code that reads only invariant inputs runs once, before the loop.
    hoisted = split_invariant(calls[0], plan.varying)
    return _Roll(
        closed,
        plan,
        loop,
        calls,
        segments,
        tail,
        hoisted,
        kept,
        moved,
        skipped,
        fresh,
        carried,
    )


@dataclasses.dataclass(frozen=True)
class _Before:
    """What a run of the rolled program computed before its loop.

    **Fields:**

    - `outer`: the program's values, closed over by the loop (never carried).
    - `invariant`: the callee's invariant part's values (`_hoisted_env`), or
        `None`.
    - `args0`: the first call's varying inputs.
    - `tables`: per branch, its literal tables as arrays.
    - `classes`: per step, its branch, as an array.
    """

    outer: dict
    invariant: dict | None
    args0: list
    tables: list
    classes: jax.Array


def _before(roll: _Roll, env: dict) -> tuple[_Before, tuple]:
    """What the loop reads from the prologue's environment `env`, and its first
    carry `(step, carried inputs, slots, kept outputs)`."""
    plan, call = roll.plan, roll.calls[0]
    outer = dict(env)
    invariant = None
    if roll.hoisted is not None:
        invariant = _hoisted_env(roll.hoisted, call, outer, set(plan.varying))
    args0 = [
        as_aval(read(env, call.invars[p]), call.invars[p].aval) for p in plan.varying
    ]
    starts = plan.initial or (None,) * len(plan.slot_avals)
    slots0 = [slot_start(x, aval, env) for x, aval in zip(starts, plan.slot_avals)]
    outs0 = [zeros(call.outvars[p].aval) for p in roll.kept]
    tables = [
        {key: jnp.asarray(value) for key, value in table.items()}
        for table in plan.tables
    ]
    before = _Before(outer, invariant, args0, tables, jnp.asarray(plan.classes))
    carry = (jnp.int32(0), [args0[q] for q in roll.carried], slots0, outs0)
    return before, carry


def _next_args(roll: _Roll, r: int, local: dict, table: dict, j, args) -> list:
    """The carried inputs of the call after step `r`'s (the last step's own where
    it has none), read from the branch's values `local` or, a literal, from its
    table."""
    if r + 1 == len(roll.calls):
        return [args[q] for q in roll.carried]
    nxt = roll.calls[r + 1]
    out = []
    for q, p in enumerate(roll.plan.varying):
        if q in roll.fresh:
            continue
        atom = nxt.invars[p]
        key = ("next", p)
        value = read(local, atom, lambda a: table_literal(table, key, j, a.val, a.aval))
        out.append(as_aval(value, atom.aval))
    return out


def _branch(roll: _Roll, before: _Before, c: int, j, args, slots, outs) -> tuple:
    """Branch `c`'s code at step `j` (the code after the call of its
    representative step), from the step's inputs `args`, the carried `slots` and
    the call's outputs `outs`: the next inputs carried and the new slots."""
    plan = roll.plan
    r = plan.representatives[c]
    segment = roll.segments[r]
    local = dict(before.outer)
    set_slots(local, plan.reads[r], slots)
    write(local, roll.calls[r].outvars, outs)
    keep = set(plan.writes[r])
    if r + 1 < len(roll.calls):
        keep |= read_by((), [roll.calls[r + 1].invars[p] for p in plan.varying])
    indices = range(len(segment))
    if roll.skipped and c == roll.shared:
        indices = [i for i in indices if i not in roll.skipped]
    _eval_step_code(segment, indices, local, before.tables[c], j, keep)
    new_slots = [
        as_aval(local[var], aval) if var in local else old
        for var, old, aval in zip(plan.writes[r], slots, plan.slot_avals)
    ]
    return _next_args(roll, r, local, before.tables[c], j, args), new_slots


def _step_inputs(roll: _Roll, before: _Before, j, carried_args) -> list:
    """Step `j`'s inputs: the carried ones, and the fresh ones computed here with
    the previous step's literals (the first step's from before the loop)."""
    args = dict(zip(roll.carried, carried_args))
    if roll.fresh:
        prev = jnp.maximum(j - 1, 0)
        segment = roll.segments[roll.plan.representatives[roll.shared]]
        local = dict(before.outer)
        table = before.tables[roll.shared]
        fresh = roll.fresh
        _eval_step_code(segment, roll.moved, local, table, prev, set(fresh.values()))
        varying, call = roll.plan.varying, roll.calls[0]
        for q, var in fresh.items():
            aval = call.invars[varying[q]].aval
            args[q] = jnp.where(j == 0, before.args0[q], as_aval(local[var], aval))
    return [args[q] for q in range(len(roll.plan.varying))]


def _body(roll: _Roll, before: _Before, carry: tuple, _: Any = None) -> tuple:
    """One step of the loop: the call, then its branch's code."""
    j, carried_args, slots, _ = carry
    args = _step_inputs(roll, before, j, carried_args)
    # The one call site of the computation.
    call, varying = roll.calls[0], roll.plan.varying
    if roll.hoisted is None:
        values = call_with(call, before.outer, varying, args)
    else:
        assert before.invariant is not None
        values = _step_call(roll.hoisted, before.invariant, varying, args)
    outs = [
        as_aval(value, v.aval) if not isinstance(v, jex.DropVar) else zeros(v.aval)
        for v, value in zip(call.outvars, values)
    ]
    branches = [
        functools.partial(_branch, roll, before, c)
        for c in range(len(roll.plan.representatives))
    ]
    if len(branches) == 1:
        new_args, new_slots = branches[0](j, args, slots, outs)
    else:
        new_args, new_slots = lax.switch(
            at(before.classes, j), branches, j, args, slots, outs
        )
    return (j + 1, new_args, new_slots, [outs[p] for p in roll.kept]), None


def _loop(roll: _Roll, before: _Before, carry: tuple) -> tuple:
    """The loop's last carry: a `lax.scan` over the k steps, or (`loop="while"`)
    a `lax.while_loop` on the step counter."""
    body = functools.partial(_body, roll, before)
    k = len(roll.calls)
    if roll.loop == "while":
        return lax.while_loop(lambda c: c[0] < k, lambda c: body(c)[0], carry)
    last, _ = lax.scan(body, carry, None, length=k)
    return last


def _epilogue(roll: _Roll, before: _Before, last: tuple) -> list:
    """The program's outputs: its code after the loop run on the loop's last
    carry."""
    _, last_args, slots, outs = last
    plan, jaxpr = roll.plan, roll.closed.jaxpr
    args = dict(zip(roll.carried, last_args))
    env = dict(before.outer)
    set_slots(env, plan.writes[-1], slots)
    env.update(zip([roll.calls[-1].outvars[p] for p in roll.kept], outs))
    # The last step's next inputs, where the program reads them after it.
    env.update((v, args[q]) for q, v in enumerate(plan.last_next) if v is not None)
    eval_eqns(jaxpr.eqns[roll.tail :], env, keep=read_by((), jaxpr.outvars))
    return [read(env, v) for v in jaxpr.outvars]


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
    roll = _analyse(closed, plan, loop)

    def run(*inputs):
        env = prologue(closed, inputs, plan.sites[0])
        before, carry = _before(roll, env)
        return _epilogue(roll, before, _loop(roll, before, carry))

    return run
