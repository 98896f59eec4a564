"""Planning a roll: where the k calls are, what the loop carries at each step, and
which steps share one branch (equal code up to literals)."""

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..._jaxpr import defined, heavy, is_literal, LOOPS
from ._roll_steps import (
    compare,
    consumers_of,
    extra_safe,
    layouts,
    params_equal,
    plain_aval,
    same_value,
    Steps,
    stops,
)


def _same_input(a: Any, b: Any) -> bool:
    if is_literal(a) and is_literal(b):
        return a.aval == b.aval and same_value(a.val, b.val)
    return a is b


@dataclasses.dataclass(frozen=True)
class RollPlan:
    """How to roll the k calls of one computation in a top-level jaxpr.

    **Fields:**

    - `sites`: indices of the k call equations, in program order.
    - `varying`: positions of the call's inputs that differ between calls (the
        others are the same variable at every call: closed over).
    - `reads`, `writes`: per step, the variable each carried slot holds when the
        step starts (`None`: nothing yet) and when it ends.
    - `slot_avals`: the avals of the carried slots.
    - `classes`: per step, the index of the branch that runs it.
    - `representatives`: per branch, the step whose code it runs.
    - `tables`: per branch, `{literal key: values per step}` for the literals that
        differ between the steps it runs (keys `("eqn", i, q)` for input `q` of
        equation `i` of the segment, `("next", p)` for the next call's input `p`).
    - `tail`: `None` where the last step runs no branch code; else it shares the
        branch of other steps and runs, of the program, its call and the `tail`
        equations after it (which repeat the beginning of that branch's code; the
        rest of that code computes only next inputs, unused); the program's
        remaining equations run after the loop.
    - `last_next`: where `tail` is not `None`, per varying input, the variable of
        those equations that a next call would read (after the loop it is the
        step's next input), or `None` where the branch computes it with equations
        the tail does not repeat (then it is not needed).
    - `initial`: per slot, its value before the loop: `None` (zeros, never
        read), `("literal", value)` or `("var", variable)` where the first step
        shares a branch that reads the slot at a place where its own code has
        that literal or variable of the code before the loop.
    """

    sites: tuple[int, ...]
    varying: tuple[int, ...]
    reads: tuple[tuple[Any, ...], ...]
    writes: tuple[tuple[Any, ...], ...]
    slot_avals: tuple[Any, ...]
    classes: tuple[int, ...]
    representatives: tuple[int, ...]
    tables: tuple[dict, ...]
    tail: int | None = None
    last_next: tuple[Any, ...] = ()
    initial: tuple[Any, ...] = ()


def call_group(jaxpr: Any, sites: Sequence[int]) -> tuple | None:
    """`(sites, calls, varying)` for the calls at `sites` (sorted; their equations;
    the positions of their inputs that differ between calls), or `None` when there
    are fewer than two, or their avals differ, or a varying input or an output is
    not a plain array. Shared by rolling and stacking."""
    sites = tuple(sorted(sites))
    if len(sites) < 2:
        return None
    calls = [jaxpr.eqns[i] for i in sites]
    first = calls[0]
    avals = [v.aval for v in first.invars]
    if any([v.aval for v in c.invars] != avals for c in calls[1:]):
        return None
    differ: list[int] = []
    for p, v in enumerate(first.invars):
        # A variable: the same object at every call (an operator's arrays: the
        # many inputs of a marked call, compared by identity).
        if is_literal(v):
            same = all(_same_input(c.invars[p], v) for c in calls[1:])
        else:
            same = all(c.invars[p] is v for c in calls[1:])
        if not same:
            differ.append(p)
    varying = tuple(differ)
    if not all(plain_aval(first.invars[p].aval) for p in varying):
        return None
    if not all(plain_aval(v.aval) for v in first.outvars):
        return None
    return sites, calls, varying


def plan_roll(jaxpr: Any, sites: Sequence[int]) -> RollPlan | None:
    """The plan for rolling the calls at `sites` of `jaxpr` (a top-level `Jaxpr`),
    or `None` when they cannot be rolled (fewer than two, different avals, or a
    value the loop would carry that is not a plain array).

    A loop between two calls (a solve's, or the program's own) that only one step
    runs stays out of the rolled loop: the calls are cut there, and the longest
    run of two or more between such loops is rolled (`None` where there is none;
    the other calls stay where they are). In a branch of its own that loop would
    compile as often as inline, nested in the rolled loop: on a TPU, `Auto`
    rolling the two `mv`s of `x <- x + A^{-1}(b - A x)` so made its first call
    slower than the program inline (`newton_residual` in
    `benchmarks/results/tpu/realistic-3-rounds.json`). A loop that every step
    runs (a solve in each Newton step) is one branch, compiled once.

    **Arguments:**

    - `jaxpr`: the program's `jax.extend.core.Jaxpr`.
    - `sites`: indices into `jaxpr.eqns` of the calls of one computation.

    **Returns:**

    A `RollPlan`, or `None`.
    """
    plan = _plan_all(jaxpr, sites)
    if plan is None:
        return None
    if len(plan.representatives) > 1:
        rotated = _rotated(jaxpr, plan)
        if rotated is not None:
            return rotated
    runs = _runs_between_loops(jaxpr, plan)
    if len(runs) == 1:
        return plan
    longest = max(runs, key=len)
    return plan_roll(jaxpr, longest) if len(longest) >= 2 else None


def _anchors(jaxpr: Any, sites: Sequence[int]) -> tuple[int, ...] | None:
    """The equations `d` before each call at `sites`, where the calls are equally
    far apart and the program ends `d` equations short of a step's length after
    the last call (its code after the last call is the beginning of a step's, its
    `d` equations before each call the end of a step's), and these equations
    are of one computation (one primitive, equal parameters: for a `jit` call,
    one function); else `None`."""
    gaps = {b - a for a, b in zip(sites, sites[1:])}
    if len(gaps) != 1:
        return None
    after = len(jaxpr.eqns) - sites[-1] - 1
    d = gaps.pop() - 1 - after
    if d < 1 or sites[0] < d:
        return None
    anchors = tuple(site - d for site in sites)
    first = jaxpr.eqns[anchors[0]]
    # One computation: the rolled loop runs the first's at every step.
    for a in anchors[1:]:
        eqn = jaxpr.eqns[a]
        if eqn.primitive is not first.primitive or not params_equal(
            eqn.params, first.params
        ):
            return None
    return anchors


def _rotated(jaxpr: Any, plan: RollPlan) -> RollPlan | None:
    """The loop of `plan`'s calls cut at the equations `d` before each of them
    (`_anchors`), where that is one branch and every step holds its call of
    `plan`'s; else `None`.

    `x <- x + A^-1 (b - A x)` twice, its solves rolled at the solves, runs a
    branch computing the next residual and another that does not (the last),
    a `lax.switch` in every step; cut at the `mv`s before the solves it is one
    branch (as the loop a user writes by hand: the residual's equations start
    it, the first step's reading `x = 0` from a slot). On a TPU the two-branch
    loop ran `newton_residual` slower than the program written out, the one
    branch as fast (`benchmarks/results/tpu/logs/newton-residual-steady*.log`)."""
    anchors = _anchors(jaxpr, plan.sites)
    if anchors is None:
        return None
    other = _plan_all(jaxpr, anchors)
    if other is None or len(other.representatives) != 1:
        return None
    ends = stops(other.sites, other.tail)
    if not all(a < s < e for a, s, e in zip(anchors, plan.sites, ends)):
        return None
    return other


def _runs_between_loops(jaxpr: Any, plan: RollPlan) -> list[tuple[int, ...]]:
    """`plan`'s sites cut after each step whose branch runs that step only and
    whose code holds a loop (`_jaxpr.LOOPS`, at any depth)."""
    ends = stops(plan.sites, plan.tail)
    runs: list[list[int]] = [[]]
    for j, site in enumerate(plan.sites):
        runs[-1].append(site)
        code = jaxpr.eqns[site + 1 : ends[j]]
        alone = plan.classes.count(plan.classes[j]) == 1
        if alone and j + 1 < len(plan.sites) and any(heavy(e, LOOPS) for e in code):
            runs.append([])
    return [tuple(run) for run in runs]


def _plan_all(jaxpr: Any, sites: Sequence[int]) -> RollPlan | None:
    """`plan_roll`'s plan for every call at `sites`, loops between them or not."""
    group = call_group(jaxpr, sites)
    if group is None:
        return None
    sites, _, varying = group
    consumers = consumers_of(jaxpr)
    candidate = _tail_candidate(jaxpr, sites, varying, consumers)
    if candidate is not None:
        plan = _plan(jaxpr, sites, varying, consumers, *candidate)
        # Worth it only where the last step then shares a branch.
        if plan is not None and plan.classes.count(plan.classes[-1]) > 1:
            return plan
    return _plan(jaxpr, sites, varying, consumers)


def _tail_candidate(jaxpr, sites, varying, consumers) -> tuple[int, tuple] | None:
    """`(tail, last_next)` for a last step that runs the first `tail` equations
    after its call, or `None`. They must repeat the code between the last two
    calls (checked by `compare`), or its beginning where the rest of that code
    computes only the next call's inputs (`extra_safe`); each varying input of the
    last call must be computed by the code before it."""
    eqns = jaxpr.eqns
    segment = range(sites[-2] + 1, sites[-1])
    start = sites[-1] + 1
    tail = min(len(segment), len(eqns) - start)
    while not extra_safe(jaxpr, segment[tail:], consumers, sites[-1]):
        if tail == 0:
            return None
        tail -= 1
    where = {
        v: (i, o)
        for i, index in enumerate(segment)
        for o, v in enumerate(eqns[index].outvars)
    }
    last_next: list[Any] = []
    for p in varying:
        v = eqns[sites[-1]].invars[p]
        if is_literal(v) or v not in where:
            return None
        i, o = where[v]
        if i >= tail:  # computed by the code the tail does not repeat
            last_next.append(None)
            continue
        outvars = eqns[start + i].outvars
        if o >= len(outvars) or not defined(outvars[o]):
            return None
        last_next.append(outvars[o])
    return tail, tuple(last_next)


def _steps(jaxpr, sites, varying, consumers, tail, last_next, early) -> tuple | None:
    """`(steps, slot_avals)`: what `compare` reads of the roll (`Steps`) and the
    avals of its carried slots (`layouts`, `early` or not); `None` where a carried
    value is not a plain array or there is no such layout."""
    found_layouts = layouts(jaxpr, sites, varying, tail, last_next, early)
    if found_layouts is None:
        return None
    reads, writes, slot_avals = found_layouts
    ends = stops(sites, tail)
    inside = frozenset(
        v
        for j, start in enumerate(sites)
        for eqn in jaxpr.eqns[start : ends[j]]
        for v in eqn.outvars
    )
    steps = Steps(
        jaxpr.eqns,
        sites,
        varying,
        reads,
        writes,
        inside,
        tail,
        last_next,
        consumers,
    )
    return steps, slot_avals


def _branches(jaxpr, steps: Steps) -> tuple | None:
    """`(classes, representatives, found)`: each step in the branch of the first
    earlier step whose code its own equals up to literals (else a branch of its
    own), and per branch `{step: compare's literals}`; `None` where a step does
    not compare equal with itself (a tail that does not compute a next input
    alike)."""
    representatives: list[int] = []
    classes: list[int] = []
    found: list[dict[int, dict]] = []
    for j in range(len(steps.sites)):
        for c, r in enumerate(representatives):
            literals = compare(jaxpr, steps, r, j)
            if literals is not None:
                classes.append(c)
                found[c][j] = literals
                break
        else:
            classes.append(len(representatives))
            representatives.append(j)
            own = compare(jaxpr, steps, j, j)
            if own is None:
                return None
            found.append({j: own})
    return classes, representatives, found


def _first_shared(jaxpr, steps: Steps, classes, representatives, found) -> tuple:
    """`_branches`'s `(classes, representatives, found)` and the slots' values
    before the loop (`RollPlan.initial`, `{slot: value}`), the first step, where
    it runs alone, in another branch where it can start the slots that branch
    reads with its own literals or variables from before the loop."""
    if classes.count(0) != 1 or len(representatives) < 2:
        return classes, representatives, found, {}
    for c in range(1, len(representatives)):
        start_values: dict = {}
        literals = compare(jaxpr, steps, representatives[c], 0, start_values)
        if literals is not None:
            classes = [c - 1] + [m - 1 for m in classes[1:]]
            representatives, found = representatives[1:], found[1:]
            found[c - 1][0] = literals
            return classes, representatives, found, start_values
    return classes, representatives, found, {}


def _seeded_first(jaxpr, steps: Steps, classes, representatives) -> tuple | None:
    """Where the first step still runs alone: `(steps, branches, initial)` with
    the first step reading, from the slots it starts without, the variables of
    before the loop that its code reads where another branch's step reads those
    slots, and the branches made again (`_branches`), where that gives fewer.

    The first step then represents the steps of that branch. `_first_shared`
    puts the first step in another step's branch instead, which the last step
    cannot represent where its tail stops short of the branch's code:
    `x <- x + A^-1 (b - A x)` twice from `x = 0`, rolled at its two `mv`s, is one
    branch this way and two otherwise (the first reads `x = 0`, the last
    computes no next residual). The rolled loop starts those slots with the
    variables (`RollPlan.initial`). Not where a later step, or the code after
    the loop, reads such a variable itself: in the branch's code it stands for
    the slot."""
    if classes.count(classes[0]) != 1 or len(representatives) < 2:
        return None
    for c in range(len(representatives)):
        start_values: dict = {}
        r = representatives[c]
        if r == 0 or compare(jaxpr, steps, r, 0, start_values, writes=False) is None:
            continue
        if not start_values or any(kind != "var" for kind, _ in start_values.values()):
            continue
        # In the branch's code the variable stands for the slot: no later step,
        # nor the code after the loop, may read it as itself.
        end = stops(steps.sites, steps.tail)[0]
        if any(
            reader == "out" or reader >= end
            for _, variable in start_values.values()
            for reader in steps.consumers.get(variable, ())
        ):
            continue
        first = list(steps.reads[0])
        for slot, (_, variable) in start_values.items():
            first[slot] = variable
        seeded = dataclasses.replace(steps, reads=(tuple(first), *steps.reads[1:]))
        branches = _branches(jaxpr, seeded)
        if branches is not None and len(branches[1]) < len(representatives):
            return seeded, branches, start_values
    return None


def _tables(found, representatives, k: int) -> tuple[dict, ...]:
    """Per branch, `{literal key: values per step}` for the literals that differ
    between the steps it runs (`RollPlan.tables`)."""
    tables = []
    for c, r in enumerate(representatives):
        varying_keys = {
            key
            for literals in found[c].values()
            for key, (mine, theirs) in literals.items()
            if not same_value(mine, theirs)
        }
        table = {}
        for key in varying_keys:
            own = found[c][r][key][1]
            # A step without this literal (the last, where its tail stops short
            # of the equation) runs it on the representative's value, unused.
            values = [found[c].get(j, {}).get(key, (own, own))[1] for j in range(k)]
            table[key] = np.stack([np.asarray(v) for v in values])
        tables.append(table)
    return tuple(tables)


def _plan(jaxpr, sites, varying, consumers, tail=None, last_next=()) -> RollPlan | None:
    """`plan_roll`'s plan, the last step running `tail` equations after its call
    (`consumers`: `consumers_of(jaxpr)`): of the layouts with and without the
    values of before the loop that only the first steps read (`layouts`'s
    `early`), the one of fewer branches (without, where they tie)."""
    best = None
    for early in (False, True):
        plan = _plan_of_layout(jaxpr, sites, varying, consumers, tail, last_next, early)
        if plan is not None and (
            best is None or len(plan.representatives) < len(best.representatives)
        ):
            best = plan
    return best


def _plan_of_layout(
    jaxpr, sites, varying, consumers, tail, last_next, early
) -> RollPlan | None:
    made = _steps(jaxpr, sites, varying, consumers, tail, last_next, early)
    if made is None:
        return None
    steps, slot_avals = made
    branches = _branches(jaxpr, steps)
    if branches is None:
        return None
    classes, representatives, found, initial = _first_shared(jaxpr, steps, *branches)
    seeded = _seeded_first(jaxpr, steps, classes, representatives)
    if seeded is not None:
        steps, (classes, representatives, found), initial = seeded
    return RollPlan(
        tuple(sites),
        varying,
        steps.reads,
        steps.writes,
        slot_avals,
        tuple(classes),
        tuple(representatives),
        _tables(found, representatives, len(sites)),
        tail,
        tuple(last_next),
        tuple(initial.get(p) for p in range(len(slot_avals))),
    )
