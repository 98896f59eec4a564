"""The program rewrite of `lxd.jit`: apply each group's action (see `_program.py`)
to the traced program: roll or stack its top-level call sites (`_roll.py`,
`_stack.py`), share one matrix between them (`_program_materialise.py`), or call
one out-of-line `mv` from every site (`_program_outline.py`)."""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.tree_util as jtu

from ..._compat import call_callee, weakly_typed
from ...policies.calls._marked import is_marked
from .._decide import Action
from ..analyse._groups import find_groups
from ..analyse._roll_plan import plan_roll
from ..analyse._roll_steps import is_literal
from ..analyse._stack_plan import plan_stack
from ._materialise import materialised_function
from ._outline import outline_group
from ._roll import rolled_function
from ._stack import stacked_function


def _apply(closed: Any, action: Action, sites: list[int], loop: str) -> Callable | None:
    """The program with `action` (materialise or roll: outlined groups are done
    first, by `rewrite_program`) applied to the calls at `sites`, or `None` where
    it cannot be (the calls' inputs or the code between them do not allow it)."""
    jaxpr = closed.jaxpr
    if action.kind == "materialise":
        return materialised_function(closed, sites, action.arrays, action.batch_size)
    if len(sites) < 2:
        return None
    if is_marked(jaxpr.eqns[sites[0]]):
        # An operator's independent sites run together (stacked: a linear map
        # batches well); dependent ones, and the user's functions, rolled.
        stack = plan_stack(jaxpr, sites)
        if stack is not None:
            return stacked_function(closed, stack)
    plan = plan_roll(jaxpr, sites)
    return None if plan is None else rolled_function(closed, plan, loop)


def rewrite_program(
    closed: Any, actions: dict[Any, Action], loop: str = "scan"
) -> Callable | jex.ClosedJaxpr | None:
    """`closed` with every group's action applied to its top-level call sites, as a
    function of its flat inputs returning its flat outputs; where the only change
    is calls put inline, the program itself with the callees' equations in place of
    the calls (a `ClosedJaxpr`: nothing to trace again); `None` if nothing was
    rewritten.

    **Arguments:**

    - `closed`: a `jax.extend.core.ClosedJaxpr`.
    - `actions`: from `plan_program`, keyed by `(equation name, id(callee))`.
    - `loop`: the loops that rolled calls become (see `rolled_function`):
        `"scan"` for a program that transformations may trace, `"while"` for one
        compiled as it is.

    **Returns:**

    A function, a `ClosedJaxpr`, or `None`.
    """
    run = _rewrite(closed, actions, loop)
    if callable(run):
        return keep_weak_types(run, [v.aval for v in closed.jaxpr.outvars])
    return run


def keep_weak_types(run: Callable, out_avals: Sequence[Any]) -> Callable:
    """`run` (a function returning a program's flat outputs) with each output the
    traced program had weakly typed weakly typed again: a loop's carry and a
    stacked call's outputs are strongly typed, where `jax.jit` returns a Python
    number's result weakly typed (and later promotion differs)."""
    weak = [getattr(a, "weak_type", False) for a in out_avals]
    if not any(weak):
        return run

    def kept(*args):
        outs = run(*args)
        return [weakly_typed(x) if w else x for x, w in zip(outs, weak)]

    return kept


def _rewrite(
    closed: Any, actions: dict[Any, Action], loop: str
) -> Callable | jex.ClosedJaxpr | None:
    run: Callable | None = None
    in_avals = [v.aval for v in closed.jaxpr.invars]
    done: set = set()
    groups = find_groups(closed.jaxpr)
    for key, action in actions.items():
        if action.kind == "outline" and key in groups:
            # Every site, at any depth, through one out-of-line call; the
            # equations stay where they are (a group rolled below is another's).
            closed = outline_group(closed, groups[key].callee, action.arrays)
            run = jex.jaxpr_as_fun(closed)
            done.add(key)
    while True:
        pending = [
            (key, group.sites)
            for key, group in find_groups(closed.jaxpr).items()
            if key in actions and key not in done and group.sites
        ]
        # Largest groups first: their loops take the code of the others in. The
        # groups applied inline: last, together, in the program as it then is
        # (not worth a trace of the rewritten program of their own).
        inline = sorted(s for k, g in pending if actions[k].kind == "inline" for s in g)
        pending = [item for item in pending if actions[item[0]].kind != "inline"]
        pending.sort(key=lambda item: len(item[1]), reverse=True)
        rewrite = None
        for key, sites in pending:
            done.add(key)
            rewrite = _apply(closed, actions[key], sites, loop)
            if rewrite is not None:
                break
        if rewrite is None:
            if not inline:
                return run
            spliced = inlined_jaxpr(closed, inline)
            # The traced program itself, or after an earlier pass's rewrite
            # (`closed` then traced from it), a function evaluating it.
            return spliced if run is None else jex.jaxpr_as_fun(spliced)
        run = rewrite
        if all(key in done for key, _ in pending):
            return run  # no other group to look for
        # Other groups may remain at the top level: look again in the rewritten
        # program (groups whose sites were between the calls are now in the loop).
        # Each pass handles one group, so this ends.
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals]
        closed = jax.make_jaxpr(run)(*structs)


def inlined_jaxpr(closed: Any, sites: Sequence[int]) -> jex.ClosedJaxpr:
    """The program `closed` with the calls at `sites` (top-level indices) replaced
    by their callees' equations, spliced in with fresh variables (as `jax.jit(...,
    inline=True)` would have traced them); a callee's constants become constants
    of the program.

    **Arguments:**

    - `closed`: the program, a `ClosedJaxpr`.
    - `sites`: indices of calls at its top level.

    **Returns:**

    A `ClosedJaxpr` with `closed`'s inputs and outputs.
    """
    jaxpr = closed.jaxpr
    inline = set(sites)
    constvars, consts = list(jaxpr.constvars), list(closed.consts)
    # Outer variables standing for another atom: a call's outputs, read from
    # what its callee's equations computed.
    renamed: dict = {}

    def read(atom: Any) -> Any:
        return atom if is_literal(atom) else renamed.get(atom, atom)

    eqns = []
    for index, eqn in enumerate(jaxpr.eqns):
        if index not in inline:
            invars = [read(v) for v in eqn.invars]
            changed = any(a is not b for a, b in zip(invars, eqn.invars))
            eqns.append(eqn.replace(invars=invars) if changed else eqn)
            continue
        closed_callee = call_callee(eqn)
        callee = closed_callee.jaxpr
        env = {inner: read(outer) for inner, outer in zip(callee.invars, eqn.invars)}
        for inner, value in zip(callee.constvars, closed_callee.consts):
            env[inner] = jex.Var(inner.aval)
            constvars.append(env[inner])
            consts.append(value)
        for inner_eqn in callee.eqns:
            invars = [v if is_literal(v) else env[v] for v in inner_eqn.invars]
            outvars = []
            for var in inner_eqn.outvars:
                fresh = jex.DropVar(var.aval) if isinstance(var, jex.DropVar) else None
                if fresh is None:
                    fresh = env[var] = jex.Var(var.aval)
                outvars.append(fresh)
            eqns.append(inner_eqn.replace(invars=invars, outvars=outvars))
        for inner, outer in zip(callee.outvars, eqn.outvars):
            if not isinstance(outer, jex.DropVar):
                renamed[outer] = inner if is_literal(inner) else env[inner]
    outvars = [read(v) for v in jaxpr.outvars]
    spliced = jaxpr.replace(constvars=constvars, eqns=eqns, outvars=outvars)
    return jex.ClosedJaxpr(spliced, consts)


def rolled_entry(run: Callable, out_tree: Any) -> Callable:
    """`run` as a function of `lxd.jit`'s traced argument halves, returning the
    output PyTree."""

    def entry(*dynamic_args, **dynamic_kwargs):
        leaves = jtu.tree_leaves((dynamic_args, dynamic_kwargs))
        return jtu.tree_unflatten(out_tree, run(*leaves))

    return entry
