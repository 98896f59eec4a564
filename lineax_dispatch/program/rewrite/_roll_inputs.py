"""Rolled inputs computed where they are used: the code between two calls that only
computes the next call's input from values of before the loop (and the step's
literals), such as the `x + i` of `sum(f(x + i) for i in range(k))`, runs at the
start of the step that reads it rather than at the end of the step before.

Its value is then not carried from one step to the next, and XLA fuses it into the
computation it feeds instead of compiling a kernel of its own for it at the end of
the step, which compiles faster."""

from collections.abc import Sequence
from typing import Any

from ..._jaxpr import defined, is_literal
from ..analyse._roll_plan import RollPlan


def fresh_inputs(
    jaxpr: Any, plan: RollPlan, segment: Sequence[Any], later: set
) -> tuple[tuple[int, ...], frozenset[int], dict[int, Any]]:
    """The inputs of a rolled program's calls to compute at the start of each step
    (see `step_start_inputs`), where every step but the last runs one branch.

    **Arguments:**

    - `jaxpr`: the program's top-level `Jaxpr`.
    - `plan`: its `RollPlan`.
    - `segment`: the code of the branch the steps share.
    - `later`: the variables the program reads after the loop.

    **Returns:**

    `step_start_inputs`'s `(moved, skipped, fresh)`; `((), frozenset(), {})` where
    the steps do not share one branch or no input qualifies.
    """
    shared = plan.classes[0]
    first = plan.representatives[shared]
    k = len(plan.sites)
    if not all(c == shared for c in plan.classes[:-1]) or first + 1 >= k:
        return (), frozenset(), {}
    eqns = jaxpr.eqns
    before = set(jaxpr.invars) | set(jaxpr.constvars)
    before.update(v for e in eqns[: plan.sites[0]] for v in e.outvars)
    # A value of before the loop that the steps read from a slot (`layouts`) is
    # another value at each step.
    before.difference_update(v for slots in plan.reads for v in slots)
    keep = later | {v for v in plan.writes[first] if v is not None}
    next_call = eqns[plan.sites[first + 1]]
    # An input the last step's tail computes for the code after the loop stays
    # carried (the loop's last carry holds it).
    keep.update(
        next_call.invars[p]
        for p, after in zip(plan.varying, plan.last_next)
        if after is not None
    )
    moved, skipped, fresh = step_start_inputs(
        segment, next_call, plan.varying, before, keep
    )
    return (moved, skipped, fresh) if fresh else ((), frozenset(), {})


def step_start_inputs(
    segment: Sequence[Any],
    next_call: Any,
    varying: Sequence[int],
    before: set,
    keep: set,
) -> tuple[tuple[int, ...], frozenset[int], dict[int, Any]]:
    """Which of a step's equations compute only the next call's inputs.

    **Arguments:**

    - `segment`: the equations between a call and the next (one branch's code).
    - `next_call`: the next call's equation.
    - `varying`: the positions of the call's inputs that differ between calls.
    - `before`: the variables defined before the loop (closed over by it).
    - `keep`: variables that must stay where they are (carried slots, values read
        after the loop).

    **Returns:**

    `(moved, skipped, fresh)`: the indices into `segment` of the equations to run
    at the start of the next step instead (in order); those the step itself no
    longer runs (the moved ones, and any whose values nothing then reads); and
    `{q: variable}` for each varying input (by its index `q` in `varying`) that
    the moved ones compute.
    """
    chosen = _from_before(segment, before)
    _drop_kept(segment, chosen, keep)
    made = {v for i in chosen for v in segment[i].outvars if defined(v)}
    fresh = {
        q: next_call.invars[p]
        for q, p in enumerate(varying)
        if not is_literal(next_call.invars[p]) and next_call.invars[p] in made
    }
    return _needed(segment, chosen, fresh), frozenset(chosen), fresh


def _from_before(segment: Sequence[Any], before: set) -> set[int]:
    """The indices of the equations of `segment` free of effects that compute
    from `before`, literals and each other."""
    chosen: set[int] = set()
    made: set = set()
    for i, eqn in enumerate(segment):
        if eqn.effects:
            continue
        if all(is_literal(v) or v in before or v in made for v in eqn.invars):
            chosen.add(i)
            made.update(v for v in eqn.outvars if defined(v))
    return chosen


def _drop_kept(segment: Sequence[Any], chosen: set[int], keep: set) -> None:
    """Removes from `chosen` those whose values stay (`keep`) or something else
    reads, and with each removed one the chosen ones feeding it and those it feeds
    (a worklist)."""
    producer = {v: i for i in chosen for v in segment[i].outvars if defined(v)}
    readers: dict[int, list[int]] = {}
    for i, eqn in enumerate(segment):
        for v in eqn.invars:
            if not is_literal(v) and v in producer:
                readers.setdefault(producer[v], []).append(i)
    dropped = [i for i in range(len(segment)) if i not in chosen]
    dropped += [i for i in chosen if any(v in keep for v in segment[i].outvars)]
    while dropped:
        i = dropped.pop()
        chosen.discard(i)
        feeding = [
            producer[v]
            for v in segment[i].invars
            if not is_literal(v) and v in producer
        ]
        dropped += [m for m in feeding + readers.get(i, []) if m in chosen]


def _needed(segment: Sequence[Any], chosen: set[int], fresh: dict) -> tuple:
    """The indices (in order) of the `chosen` equations that the `fresh` inputs
    need."""
    needed = set(fresh.values())
    moved: list[int] = []
    for i in sorted(chosen, reverse=True):
        if any(v in needed for v in segment[i].outvars):
            moved.append(i)
            needed.update(v for v in segment[i].invars if not is_literal(v))
    return tuple(sorted(moved))
