"""The program rewrite of `lxd.jit`: apply each group's action (see
`program/_decide.py`) to the traced program through its policy's rule
(`_rules.py`): `Outline`'s first, at every depth; then `Roll`'s and
`Materialise`'s, one group per pass, largest first; then `Lazy`'s, all groups
inline together. Each step gives a program (a `ClosedJaxpr`) again."""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex

from ..._compat import weakly_typed
from ..._jaxpr import exact_specs
from ..analyse._groups import find_groups
from ._rules import Action, Phase


def rewrite_program(
    closed: Any, actions: dict[Any, Action], loop: str = "scan"
) -> jex.ClosedJaxpr:
    """`closed` with every group's action applied to its call sites.

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
        rule = action.rule
        if rule.phase is Phase.FIRST and key in groups:
            # Every site, at any depth; the equations stay where they are (a
            # group rolled below is another's).
            closed = rule.apply(closed, groups[key].callee, action)
            done.add(key)
    while True:
        pending, last = _pending(closed, actions, done)
        rewrite = None
        for key, sites in pending:
            done.add(key)
            action = actions[key]
            plan = action.plan_in(closed.jaxpr, sites)
            rewrite = action.rule.apply(closed, sites, action, plan, loop)
            if rewrite is not None:
                break
        if rewrite is None:
            # The groups applied last, together, in the program as it then is
            # (not worth a trace of the rewritten program of their own).
            return _apply_last(closed, actions, last)
        closed = traced_as(rewrite, closed)
        # Other groups may remain at the top level, and the calls to put inline:
        # look again in the rewritten program (groups whose sites were between
        # the calls are now in the loop). Each pass handles one group, so this
        # ends.


def _pending(
    closed: Any, actions: dict[Any, Action], done: set
) -> tuple[list[tuple[Any, list[int]]], list[tuple[Any, list[int]]]]:
    """The groups of `closed`'s top level still to rewrite one per pass, largest
    first (their loops take the code of the others in), and those applied last."""
    pending = [
        (key, group.sites)
        for key, group in find_groups(closed.jaxpr).items()
        if key in actions and key not in done and group.sites
    ]
    last = [item for item in pending if actions[item[0]].rule.phase is Phase.LAST]
    pending = [item for item in pending if actions[item[0]].rule.phase is Phase.EACH]
    pending.sort(key=lambda item: len(item[1]), reverse=True)
    return pending, last


def _apply_last(closed: Any, actions: dict[Any, Action], last: list) -> Any:
    """`closed` with the groups applied last, the sites of those of one rule
    together (all `Lazy`'s: one inlining of the program)."""
    by_rule: dict[Any, list[int]] = {}
    for key, sites in last:
        by_rule.setdefault(actions[key].rule, []).extend(sites)
    for rule, sites in by_rule.items():
        closed = rule.apply(closed, sorted(sites))
    return closed


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
