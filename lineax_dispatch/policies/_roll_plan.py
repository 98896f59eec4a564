"""Planning a roll: where the k calls are, what the loop carries at each step, and
which steps share one branch (equal code up to literals)."""

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.extend.core as jex
import numpy as np


def _is_literal(v: Any) -> bool:
    return isinstance(v, jex.Literal)


def _defined(v: Any) -> bool:
    return not _is_literal(v) and not isinstance(v, jex.DropVar)


def _plain_aval(aval: Any) -> bool:
    return (
        hasattr(aval, "shape")
        and hasattr(aval, "dtype")
        and isinstance(aval.dtype, np.dtype)
    )


def _same_input(a: Any, b: Any) -> bool:
    if _is_literal(a) and _is_literal(b):
        return a.aval == b.aval and np.array_equal(np.asarray(a.val), np.asarray(b.val))
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
    - `tail`: how many of the equations after the last call the last step runs
        (they repeat the code between two calls, so that the last step shares
        their branch); the program's remaining equations run after the loop.
    - `last_next`: where `tail` is not 0, per varying input, the variable of those
        equations that a next call would read: after the loop it is the step's
        next input.
    """

    sites: tuple[int, ...]
    varying: tuple[int, ...]
    reads: tuple[tuple[Any, ...], ...]
    writes: tuple[tuple[Any, ...], ...]
    slot_avals: tuple[Any, ...]
    classes: tuple[int, ...]
    representatives: tuple[int, ...]
    tables: tuple[dict, ...]
    tail: int = 0
    last_next: tuple[Any, ...] = ()


def _stops(sites, tail: int) -> list[int]:
    """Per step, the end of its equations: the next call, or for the last step the
    call itself and `tail` equations after it."""
    k = len(sites)
    return [sites[j + 1] if j + 1 < k else sites[-1] + 1 + tail for j in range(k)]


def _layouts(jaxpr, sites, varying, tail=0, last_next=()):
    """Per step, the carried variables at its start and end. Positional (slot p
    holds "the p-th value live across this step", so that the steps of an unrolled
    loop read and write alike) when every step carries the same avals; else one
    slot per variable for the whole loop."""
    eqns = jaxpr.eqns
    k = len(sites)
    stops = _stops(sites, tail)
    step_of: dict[Any, int] = {}
    order: list[Any] = []
    for j, start in enumerate(sites):
        stop = stops[j]
        for eqn in eqns[start:stop]:
            for v in eqn.outvars:
                if _defined(v):
                    step_of[v] = j
                    order.append(v)
    last_use: dict[Any, float] = {}

    def use(v: Any, step: float) -> None:
        if _is_literal(v):
            return
        if v in step_of and step > step_of[v]:
            last_use[v] = max(last_use.get(v, -1), step)

    # Read after the loop from the carried last outputs and next inputs.
    after = {v for v in eqns[sites[-1]].outvars if _defined(v)} | set(last_next)
    for j, start in enumerate(sites):
        for index in range(start, stops[j]):
            eqn = eqns[index]
            if index == start:  # computed by the branch before
                for p in varying:
                    use(eqn.invars[p], j - 1)
            else:
                for v in eqn.invars:
                    use(v, j)
    for eqn in eqns[stops[-1] :]:
        for v in eqn.invars:
            if not _is_literal(v) and v not in after:
                use(v, k)
    for v in jaxpr.outvars:
        if not _is_literal(v) and v not in after:
            use(v, k)
    live = [
        tuple(v for v in order if step_of[v] <= j < last_use.get(v, -1))
        for j in range(k)
    ]
    if all(_plain_aval(v.aval) for v in order if v in last_use):
        signatures = {tuple(v.aval for v in layout) for layout in live}
        if len(signatures) == 1:
            width = len(live[0])
            reads = (tuple([None] * width),) + tuple(live[:-1])
            return reads, tuple(live), tuple(v.aval for v in live[0])
        slots = tuple(v for v in order if v in last_use)
        return (
            tuple(slots for _ in range(k)),
            tuple(slots for _ in range(k)),
            tuple(v.aval for v in slots),
        )
    return None


def _params_equal(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if x is y:
            continue
        try:
            if not bool(x == y):
                return False
        except Exception:
            return False
    return True


def _compare(jaxpr, plan_bits, r: int, j: int) -> dict | None:
    """The literals by which step `j` differs from step `r` (`{key: (value at r,
    value at j)}`), or `None` if their code differs otherwise."""
    eqns, sites, varying, reads, writes, inside, tail, last_next = plan_bits
    k = len(sites)
    stops = _stops(sites, tail)
    seg = lambda s: eqns[sites[s] + 1 : stops[s]]
    has_next = lambda s: s + 1 < k or tail > 0
    seg_r, seg_j = seg(r), seg(j)
    if len(seg_r) != len(seg_j) or has_next(r) != has_next(j):
        return None
    mapping: dict[Any, Any] = {}
    for a, b in zip(reads[j], reads[r]):
        if (a is None) != (b is None):
            return None
        if a is not None:
            mapping[a] = b
    for a, b in zip(eqns[sites[j]].outvars, eqns[sites[r]].outvars):
        mapping[a] = b
    literals: dict = {}

    def same(a: Any, b: Any, key: Any) -> bool:
        if _is_literal(a) or _is_literal(b):
            if not (_is_literal(a) and _is_literal(b)) or a.aval != b.aval:
                return False
            literals[key] = (b.val, a.val)
            return True
        if a in mapping:
            return mapping[a] is b
        return a is b and (_is_literal(a) or a not in inside)

    for i, (e_j, e_r) in enumerate(zip(seg_j, seg_r)):
        if (
            e_j.primitive is not e_r.primitive
            or len(e_j.invars) != len(e_r.invars)
            or len(e_j.outvars) != len(e_r.outvars)
            or not _params_equal(e_j.params, e_r.params)
        ):
            return None
        for q, (a, b) in enumerate(zip(e_j.invars, e_r.invars)):
            if not same(a, b, ("eqn", i, q)):
                return None
        for a, b in zip(e_j.outvars, e_r.outvars):
            if a.aval != b.aval:
                return None
            mapping[a] = b
    if has_next(j):
        nxt = lambda s, i, p: (
            eqns[sites[s + 1]].invars[p] if s + 1 < k else last_next[i]
        )
        for i, p in enumerate(varying):
            if not same(nxt(j, i, p), nxt(r, i, p), ("next", p)):
                return None
    # Step `j` runs `r`'s code under `r`'s names: a slot that holds one of `r`'s
    # own values (kept for after the loop) would be overwritten with `j`'s.
    own = {v for eqn in eqns[sites[r] : stops[r]] for v in eqn.outvars}
    for a, b in zip(writes[j], writes[r]):
        if not same(a, b, None) or (j != r and a is b and b in own):
            return None
    literals.pop(None, None)
    return literals


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
    if any([v.aval for v in c.invars] != [v.aval for v in first.invars] for c in calls):
        return None
    varying = tuple(
        p
        for p in range(len(first.invars))
        if not all(_same_input(c.invars[p], first.invars[p]) for c in calls[1:])
    )
    if not all(_plain_aval(first.invars[p].aval) for p in varying):
        return None
    if not all(_plain_aval(v.aval) for v in first.outvars):
        return None
    return sites, calls, varying


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
    group = call_group(jaxpr, sites)
    if group is None:
        return None
    sites, _, varying = group
    candidate = _tail_candidate(jaxpr, sites, varying)
    if candidate is not None:
        plan = _plan(jaxpr, sites, varying, *candidate)
        # Worth it only where the last step then shares a branch.
        if plan is not None and plan.classes.count(plan.classes[-1]) > 1:
            return plan
    return _plan(jaxpr, sites, varying)


def _tail_candidate(jaxpr, sites, varying) -> tuple[int, tuple] | None:
    """`(tail, last_next)` for a last step that may run as many equations after
    the last call as there are between the last two calls, or `None`: each varying
    input of the last call must be computed by the code before it, at a position
    of which the tail holds the counterpart."""
    eqns = jaxpr.eqns
    segment = eqns[sites[-2] + 1 : sites[-1]]
    start = sites[-1] + 1
    if not segment or start + len(segment) > len(eqns):
        return None
    where = {v: (i, o) for i, e in enumerate(segment) for o, v in enumerate(e.outvars)}
    last_next = []
    for p in varying:
        v = eqns[sites[-1]].invars[p]
        if _is_literal(v) or v not in where:
            return None
        i, o = where[v]
        outvars = eqns[start + i].outvars
        if o >= len(outvars) or not _defined(outvars[o]):
            return None
        last_next.append(outvars[o])
    return len(segment), tuple(last_next)


def _plan(jaxpr, sites, varying, tail=0, last_next=()) -> RollPlan | None:
    """`plan_roll`'s plan, the last step running `tail` equations after its call."""
    eqns = jaxpr.eqns
    layouts = _layouts(jaxpr, sites, varying, tail, last_next)
    if layouts is None:
        return None
    reads, writes, slot_avals = layouts
    stops = _stops(sites, tail)
    inside = {
        v
        for j, start in enumerate(sites)
        for eqn in eqns[start : stops[j]]
        for v in eqn.outvars
    }
    bits = (eqns, sites, varying, reads, writes, inside, tail, last_next)
    representatives: list[int] = []
    classes: list[int] = []
    found: list[dict[int, dict]] = []
    for j in range(len(sites)):
        for c, r in enumerate(representatives):
            literals = _compare(jaxpr, bits, r, j)
            if literals is not None:
                classes.append(c)
                found[c][j] = literals
                break
        else:
            classes.append(len(representatives))
            representatives.append(j)
            own = _compare(jaxpr, bits, j, j)
            if own is None:  # a tail that does not compute a next input alike
                return None
            found.append({j: own})
    tables = []
    for c, r in enumerate(representatives):
        varying_keys = {
            key
            for literals in found[c].values()
            for key, (mine, theirs) in literals.items()
            if not np.array_equal(np.asarray(mine), np.asarray(theirs))
        }
        table = {}
        for key in varying_keys:
            own = found[c][r][key][1]
            values = [
                found[c][j][key][1] if j in found[c] else own for j in range(len(sites))
            ]
            table[key] = np.stack([np.asarray(v) for v in values])
        tables.append(table)
    return RollPlan(
        tuple(sites),
        varying,
        reads,
        writes,
        slot_avals,
        tuple(classes),
        tuple(representatives),
        tuple(tables),
        tail,
        tuple(last_next),
    )
