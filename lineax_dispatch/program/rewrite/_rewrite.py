"""The program rewrite of `lxd.jit`: apply each group's action (see
`program/_decide.py`) to the traced program: roll or stack its top-level call
sites (`_roll_loop.py`, `_stack.py`), share one matrix between them
(`_shared_matrix.py`), call one out-of-line `mv` from every site (`_outline_sites.py`),
or put the calls inline. Each step gives a program (a `ClosedJaxpr`) again."""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex

from ..._compat import call_callee, weakly_typed
from ..._jaxpr import exact_specs
from ...policies.calls._marked import is_marked
from .._decide import Action
from ..analyse._groups import find_groups
from ..analyse._roll_plan import plan_roll
from ..analyse._stack_plan import plan_stack
from ._interpret import eval_eqns, read
from ._outline_sites import outline_group
from ._roll_loop import rolled_function
from ._shared_matrix import materialised_function
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
) -> jex.ClosedJaxpr:
    """`closed` with every group's action applied to its top-level call sites.

    **Arguments:**

    - `closed`: a `jax.extend.core.ClosedJaxpr`.
    - `actions`: from `plan_program`, keyed by `(equation name, id(callee))`.
    - `loop`: the loops that rolled calls become (see `rolled_function`):
        `"scan"` for a program that transformations may trace, `"while"` for one
        compiled as it is.

    **Returns:**

    A `ClosedJaxpr` with `closed`'s inputs and outputs (their avals, weak types
    and shardings included); `closed` itself where nothing was rewritten.
    """
    done: set = set()
    groups = find_groups(closed.jaxpr)
    for key, action in actions.items():
        if action.kind == "outline" and key in groups:
            # Every site, at any depth, through one out-of-line call; the
            # equations stay where they are (a group rolled below is another's).
            closed = outline_group(closed, groups[key].callee, action.arrays)
            done.add(key)
    while True:
        pending, inline = _pending(closed, actions, done)
        rewrite = None
        for key, sites in pending:
            done.add(key)
            rewrite = _apply(closed, actions[key], sites, loop)
            if rewrite is not None:
                break
        if rewrite is None:
            # The groups applied inline: last, together, in the program as it
            # then is (not worth a trace of the rewritten program of their own).
            return inlined_jaxpr(closed, inline) if inline else closed
        closed = traced_as(rewrite, closed)
        # Other groups may remain at the top level, and the calls to put inline:
        # look again in the rewritten program (groups whose sites were between
        # the calls are now in the loop). Each pass handles one group, so this
        # ends.


def _pending(
    closed: Any, actions: dict[Any, Action], done: set
) -> tuple[list[tuple[Any, list[int]]], list[int]]:
    """The groups of `closed`'s top level still to rewrite, largest first (their
    loops take the code of the others in), and the sites of those applied inline."""
    pending = [
        (key, group.sites)
        for key, group in find_groups(closed.jaxpr).items()
        if key in actions and key not in done and group.sites
    ]
    inline = sorted(s for k, g in pending if actions[k].kind == "inline" for s in g)
    pending = [item for item in pending if actions[item[0]].kind != "inline"]
    pending.sort(key=lambda item: len(item[1]), reverse=True)
    return pending, inline


def traced_as(run: Callable, closed: Any) -> jex.ClosedJaxpr:
    """`run`, a function of `closed`'s flat inputs returning its flat outputs,
    traced at `closed`'s input types (`_jaxpr.exact_specs`), with each output
    `closed` has weakly typed weakly typed again (see `keep_weak_types`): a
    program `jax.jit` can lower in place of `closed`.

    **Raises:**

    `RuntimeError` where the rewritten program's outputs differ from `closed`'s
    in shape or dtype (a bug of the rewrite).
    """
    specs = exact_specs(closed.in_avals)
    traced = jax.make_jaxpr(keep_weak_types(run, closed.out_avals))(*specs)
    got = [(a.shape, a.dtype) for a in traced.out_avals]
    if got != [(a.shape, a.dtype) for a in closed.out_avals]:
        raise RuntimeError(
            "lineax_dispatch: `lxd.jit`'s rewrite changed the program's outputs "
            f"from {closed.out_avals} to {traced.out_avals}; please report this."
        )
    return traced


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
    eqns: list = []

    def rule(index: int, eqn: Any, invars: list) -> list:
        if index in inline:
            return _splice(call_callee(eqn), invars, eqns, constvars, consts)
        changed = any(a is not b for a, b in zip(invars, eqn.invars))
        eqns.append(eqn.replace(invars=invars) if changed else eqn)
        return eqn.outvars

    # Evaluated on atoms: each outer variable stands for itself, but a call's
    # outputs, which stand for what its callee's equations computed.
    env = {v: v for v in [*jaxpr.constvars, *jaxpr.invars]}
    eval_eqns(jaxpr.eqns, env, _own_atom, rule)
    outvars = [read(env, v, _same) for v in jaxpr.outvars]
    spliced = jaxpr.replace(constvars=constvars, eqns=eqns, outvars=outvars)
    return jex.ClosedJaxpr(spliced, consts)


def _same(atom: Any) -> Any:
    return atom


def _own_atom(i: int, q: int, atom: Any) -> Any:
    return atom


def _splice(closed_callee, invars, eqns: list, constvars: list, consts: list):
    """Appends to `eqns` the equations of a callee called on the atoms `invars`,
    with fresh variables (its constants new constants of the program, appended to
    `constvars` and `consts`); returns the atoms standing for its outputs."""
    callee = closed_callee.jaxpr
    env = dict(zip(callee.invars, invars))
    for inner, value in zip(callee.constvars, closed_callee.consts):
        env[inner] = jex.Var(inner.aval)
        constvars.append(env[inner])
        consts.append(value)

    def fresh(i: int, eqn: Any, inner_invars: list) -> list:
        outvars = [
            jex.DropVar(v.aval) if isinstance(v, jex.DropVar) else jex.Var(v.aval)
            for v in eqn.outvars
        ]
        eqns.append(eqn.replace(invars=inner_invars, outvars=outvars))
        return outvars

    eval_eqns(callee.eqns, env, _own_atom, fresh)
    return [read(env, v, _same) for v in callee.outvars]
