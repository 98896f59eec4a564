"""The program rewrite of `lxd.jit`: find the groups of marked calls in a traced
program and roll each (see `_roll.py`)."""

from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jex
import jax.tree_util as jtu

from ._marked import MARKED_NAME
from ._roll import rolled_function
from ._roll_plan import plan_roll
from ._stack import plan_stack, stacked_function


# A repeated `jax.jit` function of the user's is rolled when its body is at least
# this many equations (or holds a dot product): smaller ones compile in less time
# than a loop saves.
MIN_CALLEE_EQUATIONS = 32


def _size(jaxpr: Any) -> tuple[int, bool]:
    count, dots = 0, False
    for eqn in jaxpr.eqns:
        count += 1
        dots = dots or eqn.primitive.name == "dot_general"
        for sub in jex.jaxprs_in_params(eqn.params):
            c, d = _size(sub)
            count, dots = count + c, dots or d
    return count, dots


def _substantial(callee: Any) -> bool:
    count, dots = _size(callee.jaxpr)
    return dots or count >= MIN_CALLEE_EQUATIONS


def marked_groups(jaxpr: Any) -> list[tuple[bool, list[int]]]:
    """The top-level call sites of each repeated computation in `jaxpr`: the marked
    calls of operators' `mv`s, and the user's `jax.jit` functions called at several
    sites with a substantial body; as `(marked, equation indices)`, two or more
    sites each, largest groups first.

    **Arguments:**

    - `jaxpr`: a `jax.extend.core.Jaxpr`.

    **Returns:**

    A list of `(bool, list of indices into jaxpr.eqns)`.
    """
    groups: dict[int, list[int]] = {}
    marked: dict[int, bool] = {}
    callees: dict[int, Any] = {}
    for index, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive.name != "jit":
            continue
        callee = eqn.params["jaxpr"]
        callees[id(callee)] = callee
        marked[id(callee)] = eqn.params.get("name") == MARKED_NAME
        groups.setdefault(id(callee), []).append(index)
    found = [
        (marked[key], sites)
        for key, sites in groups.items()
        if len(sites) >= 2 and (marked[key] or _substantial(callees[key]))
    ]
    return sorted(found, key=lambda group: len(group[1]), reverse=True)


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
        for is_marked, sites in marked_groups(closed.jaxpr):
            if rewrite is None:
                # An operator's independent sites run together (stacked: a linear
                # map batches well); any others, and the user's functions, rolled.
                stack = plan_stack(closed.jaxpr, sites) if is_marked else None
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
