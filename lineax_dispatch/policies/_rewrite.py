"""The program rewrite of `lxd.jit`: find the groups of marked calls in a traced
program and roll each (see `_roll.py`)."""

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from ._marked import MARKED_NAME
from ._roll import rolled_function
from ._roll_plan import plan_roll
from ._stack import plan_stack, stacked_function


def marked_groups(jaxpr: Any) -> list[list[int]]:
    """The top-level call sites of each marked computation in `jaxpr`, as lists of
    equation indices (groups of two or more, largest first).

    **Arguments:**

    - `jaxpr`: a `jax.extend.core.Jaxpr`.

    **Returns:**

    A list of lists of indices into `jaxpr.eqns`.
    """
    groups: dict[int, list[int]] = {}
    keep: dict[int, Any] = {}
    for index, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive.name != "jit" or eqn.params.get("name") != MARKED_NAME:
            continue
        callee = eqn.params["jaxpr"]
        keep[id(callee)] = callee
        groups.setdefault(id(callee), []).append(index)
    found = [sites for sites in groups.values() if len(sites) >= 2]
    return sorted(found, key=len, reverse=True)


def roll_program(closed: Any) -> Callable | None:
    """`closed` with every group of marked calls at its top level rolled, as a
    function of its flat inputs returning its flat outputs; `None` if there is
    nothing to roll.

    **Arguments:**

    - `closed`: a `jax.extend.core.ClosedJaxpr`.

    **Returns:**

    A function, or `None`.
    """
    run: Callable | None = None
    in_avals = [v.aval for v in closed.jaxpr.invars]
    while True:
        rewrite, others = None, 0
        for sites in marked_groups(closed.jaxpr):
            if rewrite is None:
                # Independent sites run together (stacked); any others, rolled.
                stack = plan_stack(closed.jaxpr, sites)
                if stack is not None:
                    rewrite = stacked_function(closed, stack)
                    continue
                plan = plan_roll(closed.jaxpr, sites)
                if plan is not None:
                    rewrite = rolled_function(closed, plan)
                    continue
            others += 1
        if rewrite is None:
            return run
        run = rewrite
        if not others:
            return run
        # Other groups may remain at the top level: look again in the rewritten
        # program (groups whose sites were between the calls are now in the loop).
        # Each pass moves one group's sites into a loop, so this ends.
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals]
        closed = jax.make_jaxpr(run)(*structs)


def rolled_entry(run: Callable, out_tree: Any) -> Callable:
    """`run` as a function of `lxd.jit`'s traced argument halves, returning the
    output PyTree."""

    def entry(*dynamic_args, **dynamic_kwargs):
        leaves = jtu.tree_leaves((dynamic_args, dynamic_kwargs))
        return jtu.tree_unflatten(out_tree, run(*leaves))

    return entry
