"""The steps of a roll and when two of them can run the same code: what each step
carries in and out (`layouts`), and how step `j`'s code compares with step `r`'s
(`compare`: equal up to literals, which become a table indexed by the step)."""

import dataclasses
from typing import Any

import numpy as np

from ..._jaxpr import defined, heavy, is_literal


def same_value(a: Any, b: Any) -> bool:
    """Whether two literal values are the same bit for bit (`0.0` and `-0.0`
    differ, as do NaNs of other payloads; a NaN is the same as itself), of one
    dtype and shape."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def plain_aval(aval: Any) -> bool:
    return (
        hasattr(aval, "shape")
        and hasattr(aval, "dtype")
        and isinstance(aval.dtype, np.dtype)
    )


def stops(sites, tail: int | None) -> list[int]:
    """Per step, the end of its equations: the next call, or for the last step the
    call itself and `tail` equations after it (none for `None`)."""
    k, last = len(sites), sites[-1] + 1 + (tail or 0)
    return [sites[j + 1] if j + 1 < k else last for j in range(k)]


def _padded(live: list) -> tuple | None:
    """`layouts`'s positional `(reads, writes, slot_avals)` for the values `live`
    across each step, or `None` where a position holds values of two avals."""
    slot_avals = _positional(live)
    if slot_avals is None:
        return None
    width = len(slot_avals)
    padded = tuple(step + (None,) * (width - len(step)) for step in live)
    return ((None,) * width,) + padded[:-1], padded, slot_avals


def _positional(live: list) -> tuple | None:
    """The avals of slots where slot p holds the p-th value live across each step
    (in the order of definition; a step with fewer live values leaves the last
    slots holding nothing), or `None` where two values at one position differ in
    aval."""
    avals: list = []
    for layout in live:
        for p, v in enumerate(layout):
            if p == len(avals):
                avals.append(v.aval)
            elif avals[p] != v.aval:
                return None
    return tuple(avals)


def layouts(jaxpr, sites, varying, tail=None, last_next=(), early=False):
    """Per step, the carried variables at its start and end (`None`: the slot holds
    nothing), and their avals; or `None` where a carried value is not a plain
    array. Positional (slot p holds "the p-th value live across this step", so
    that the steps of an unrolled loop read and write alike, whatever number of
    values each step keeps: the four stages of a Runge-Kutta step share four
    branches) where each position holds values of one aval; else one slot per
    variable for the whole loop. The last step's `last_next` (its next inputs)
    are read after the loop from the loop's final inputs, not from a slot.
    With `early`, the positional layout starts with the values of before the loop
    that only the first steps read (`_early_values`); `None` where there are
    none or that layout does not hold."""
    eqns = jaxpr.eqns
    k = len(sites)
    ends = stops(sites, tail)
    step_of: dict[Any, int] = {}
    order: list[Any] = []
    for j, start in enumerate(sites):
        for eqn in eqns[start : ends[j]]:
            for v in eqn.outvars:
                if defined(v):
                    step_of[v] = j
                    order.append(v)
    last_use: dict[Any, float] = {}

    def use(v: Any, step: float) -> None:
        if is_literal(v):
            return
        if v in step_of and step > step_of[v]:
            last_use[v] = max(last_use.get(v, -1), step)

    # Read after the loop from the carried last outputs and next inputs.
    after = {v for v in eqns[sites[-1]].outvars if defined(v)} | set(last_next)
    for j, start in enumerate(sites):
        for index in range(start, ends[j]):
            eqn = eqns[index]
            if index == start:  # computed by the branch before
                for p in varying:
                    use(eqn.invars[p], j - 1)
            else:
                for v in eqn.invars:
                    use(v, j)
    for v in [v for eqn in eqns[ends[-1] :] for v in eqn.invars] + list(jaxpr.outvars):
        if not is_literal(v) and v not in after:
            use(v, k)
    live = [
        tuple(v for v in order if step_of[v] <= j < last_use.get(v, -1))
        for j in range(k)
    ]
    if not all(plain_aval(v.aval) for v in order if v in last_use):
        return None
    if early:
        found = _early_values(jaxpr, sites, varying, ends, step_of, order, last_use)
        if not found:
            return None
        live = [
            tuple(v for v, last in found if j < last) + layout
            for j, layout in enumerate(live)
        ]
    positional = _padded(live)
    if positional is not None or early:
        return positional
    slots = tuple(v for v in order if v in last_use)
    return (
        tuple(slots for _ in range(k)),
        tuple(slots for _ in range(k)),
        tuple(v.aval for v in slots),
    )


def _early_values(jaxpr, sites, varying, ends, step_of, order, last_use) -> list:
    """`(variable, last step)` for the values of before the loop that the code of
    the first steps reads and no later step, nor the code after the loop (RK4's
    start `x`, which its first time step reads where each later one reads the
    value its previous step computed), of the type of a value the loop carries:
    at the head of the positional layout, they give the first steps the layout
    of the later ones (`layouts`), so that these share branches."""
    eqns, k = jaxpr.eqns, len(sites)
    carried = {v.aval for v in order if v in last_use}
    last: dict[Any, int] = {}
    for j, start in enumerate(sites):
        # The call's inputs, computed by the step before; then the step's code.
        reads = [(eqns[start].invars[p], j - 1) for p in varying]
        reads += [(v, j) for eqn in eqns[start + 1 : ends[j]] for v in eqn.invars]
        for v, step in reads:
            if not is_literal(v) and defined(v) and v not in step_of:
                last[v] = max(last.get(v, -1), step)
    after = {
        v
        for v in [v for eqn in eqns[ends[-1] :] for v in eqn.invars] + jaxpr.outvars
        if not is_literal(v)
    }
    return [
        (v, step)
        for v, step in last.items()
        if 1 <= step < k - 1 and v not in after and v.aval in carried
    ]


def extra_safe(jaxpr, indices: range, consumers: dict, next_call: int) -> bool:
    """Whether the top-level equations at `indices` may run once more than the
    program runs them, their results unused: no effects, no heavy work (as
    `_jaxpr.heavy` counts it: a dot product, a solve, a loop, a factorisation, at
    any depth), and every result read only by those equations or by the call at
    index `next_call`."""
    own = set(indices) | {next_call}
    for index in indices:
        eqn = jaxpr.eqns[index]
        if eqn.effects or heavy(eqn):
            return False
        if any(r not in own for v in eqn.outvars for r in consumers.get(v, ())):
            return False
    return True


def consumers_of(jaxpr) -> dict:
    """`var -> readers`: the index of each top-level equation reading it, and
    `"out"` where it is an output of the program."""
    out: dict[Any, list] = {}
    for index, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not is_literal(v):
                out.setdefault(v, []).append(index)
    for v in jaxpr.outvars:
        if not is_literal(v):
            out.setdefault(v, []).append("out")
    return out


def params_equal(a: dict, b: dict) -> bool:
    """Whether two equations' parameters are equal (the same object, or equal as
    values: a `jit` call's function compares by identity)."""
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


@dataclasses.dataclass(frozen=True)
class Steps:
    """What `compare` reads: the program's equations, the calls' `sites` and
    `varying` inputs, the `layouts`, the variables defined inside the loop, the
    last step's `tail` (`None`: it runs no branch code; else how many equations
    after its call it runs) and `last_next` (`None` where its next input is
    computed by branch equations the tail does not repeat) and `consumers_of`."""

    eqns: Any
    sites: tuple
    varying: tuple
    reads: tuple
    writes: tuple
    inside: frozenset
    tail: int | None
    last_next: tuple
    consumers: dict

    def segment(self, t: int) -> Any:
        """The equations of step `t` after its call."""
        return self.eqns[self.sites[t] + 1 : stops(self.sites, self.tail)[t]]

    def has_next(self, t: int) -> bool:
        """Whether step `t` computes a next call's inputs."""
        return t + 1 < len(self.sites) or self.tail is not None


@dataclasses.dataclass
class _Match:
    """The correspondence `compare` builds between step `j`'s atoms and step `r`'s.

    **Fields:**

    - `inside`: the variables defined inside the loop.
    - `mapping`: `j`'s variable -> `r`'s, for those defined so far.
    - `unset`: `r`'s slot variables that `j` starts without -> their slot.
    - `starts`: slot -> its value before the loop (`compare`'s `init`).
    - `literals`: key -> `(value at r, value at j)`.
    """

    inside: frozenset
    mapping: dict
    unset: dict
    starts: dict
    literals: dict = dataclasses.field(default_factory=dict)

    def start_value(self, a: Any, b: Any) -> bool:
        """Whether `j`'s `a` can start the slot of `r`'s unset `b` (recorded)."""
        if is_literal(a) and a.aval.dtype == b.aval.dtype:
            value = ("literal", np.asarray(a.val))
        elif (
            defined(a)
            and a not in self.inside
            and a not in self.mapping
            and a.aval == b.aval
        ):
            value = ("var", a)
        else:
            return False
        old = self.starts.get(self.unset[b])
        if old is not None and not (
            old[0] == value[0]
            and (
                old[1] is value[1]
                or (value[0] == "literal" and same_value(old[1], value[1]))
            )
        ):
            return False
        self.starts[self.unset[b]] = value
        return True

    def same(self, a: Any, b: Any, key: Any) -> bool:
        """Whether `j`'s atom `a` stands where `r` has `b` (a literal that differs
        recorded under `key`)."""
        if not is_literal(b) and b in self.unset:
            return self.start_value(a, b)
        if is_literal(a) or is_literal(b):
            if not (is_literal(a) and is_literal(b)) or a.aval != b.aval:
                return False
            self.literals[key] = (b.val, a.val)
            return True
        if a in self.mapping:
            return self.mapping[a] is b
        return a is b and a not in self.inside


def _comparable(jaxpr, s: Steps, r: int, j: int) -> bool:
    """Whether step `j`'s code has the length of `r`'s and computes next inputs
    where `r`'s does; or, the last step, a prefix of it, the rest computing only
    the next call's inputs (`extra_safe`)."""
    k = len(s.sites)
    seg_r, seg_j = s.segment(r), s.segment(j)
    partial = s.tail is not None and j == k - 1 and r + 1 < k
    if partial and len(seg_j) < len(seg_r):
        end = stops(s.sites, s.tail)[r]
        extra = range(s.sites[r] + 1 + len(seg_j), end)
        return extra_safe(jaxpr, extra, s.consumers, s.sites[r + 1])
    return len(seg_r) == len(seg_j) and s.has_next(r) == s.has_next(j)


def _start_match(s: Steps, r: int, j: int, init: dict | None) -> _Match | None:
    """The correspondence at the start of the steps: their carried slots and
    their calls' outputs; `None` where one reads a slot the other does not (but
    for the slots `j` starts without, given `init`)."""
    match = _Match(s.inside, {}, {}, {} if init is None else init)
    for p, (a, b) in enumerate(zip(s.reads[j], s.reads[r])):
        if a is None and b is not None and init is not None:
            match.unset[b] = p
        elif (a is None) != (b is None):
            return None
        elif a is not None:
            match.mapping[a] = b
    for a, b in zip(s.eqns[s.sites[j]].outvars, s.eqns[s.sites[r]].outvars):
        match.mapping[a] = b
    return match


def _same_code(match: _Match, seg_j: Any, seg_r: Any) -> bool:
    """Whether the equations `seg_j` are `seg_r` up to literals (and the slots
    `j` starts without), equation by equation; `match` extended with them."""
    for i, (e_j, e_r) in enumerate(zip(seg_j, seg_r)):
        if (
            e_j.primitive is not e_r.primitive
            or len(e_j.invars) != len(e_r.invars)
            or len(e_j.outvars) != len(e_r.outvars)
            or not params_equal(e_j.params, e_r.params)
        ):
            return False
        for q, (a, b) in enumerate(zip(e_j.invars, e_r.invars)):
            if not match.same(a, b, ("eqn", i, q)):
                return False
        for a, b in zip(e_j.outvars, e_r.outvars):
            if a.aval != b.aval:
                return False
            match.mapping[a] = b
    return True


def _same_next(match: _Match, s: Steps, r: int, j: int) -> bool:
    """Whether the next call's varying inputs after step `j` are those after `r`
    (the last step's: `last_next`)."""
    k, eqns, sites = len(s.sites), s.eqns, s.sites
    for i, p in enumerate(s.varying):
        mine = eqns[sites[j + 1]].invars[p] if j + 1 < k else s.last_next[i]
        theirs = eqns[sites[r + 1]].invars[p] if r + 1 < k else s.last_next[i]
        if mine is None:  # computed by `r`'s equations the tail lacks
            continue
        if theirs is None or not match.same(mine, theirs, ("next", p)):
            return False
    return True


def _same_writes(match: _Match, s: Steps, r: int, j: int) -> bool:
    """Whether step `j` leaves in its slots what `r` leaves in its own."""
    # Step `j` runs `r`'s code under `r`'s names: a slot that holds one of `r`'s
    # own values (kept for after the loop) would be overwritten with `j`'s.
    end = stops(s.sites, s.tail)[r]
    own = {v for eqn in s.eqns[s.sites[r] : end] for v in eqn.outvars}
    for a, b in zip(s.writes[j], s.writes[r]):
        if a is None:  # `j` keeps nothing there: no step reads it before a write
            continue
        if not match.same(a, b, None) or (j != r and a is b and b in own):
            return False
    return True


def compare(
    jaxpr, s: Steps, r: int, j: int, init: dict | None = None, writes: bool = True
) -> dict | None:
    """The literals by which step `j` differs from step `r` (`{key: (value at r,
    value at j)}`), or `None` if their code differs otherwise.

    With `init` (a dict, filled in), step `j` (the first) may start without values
    that `r` reads from its carried slots, where `j`'s code has a literal or a
    variable from before the loop instead: `init[slot] = ("literal", value)` or
    `("var", variable)`, the slot's value before the loop. The last step's code
    may be a prefix of `r`'s, the rest computing only the next call's inputs
    (`extra_safe`). Without `writes`, what the steps leave in their slots is not
    compared (for `init` alone)."""
    if not _comparable(jaxpr, s, r, j):
        return None
    match = _start_match(s, r, j, init)
    if match is None or not _same_code(match, s.segment(j), s.segment(r)):
        return None
    if s.has_next(j) and not _same_next(match, s, r, j):
        return None
    if writes and not _same_writes(match, s, r, j):
        return None
    match.literals.pop(None, None)
    return match.literals
