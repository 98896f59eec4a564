"""What `lxd.jit` reads from a traced program: the call sites of each repeated
computation (an `Auto` operator kind's `mv`, a `Roll` operator's, a `jax.jit`
function of the user's), how often each runs, and what to do with each group."""

import dataclasses
from types import MappingProxyType
from typing import Any

import jax.extend.core as jex
import jax.extend.core.primitives as prims

from ..._compat import call_callee
from ..._jaxpr import call_name, finds_below, heavy, scan_length
from ...policies.calls._marked import AUTO_NAME, is_marked
from ...policies.decision._records import Decision
from .._session import AutoRecord, Session
from ._roll_plan import call_group


# Expected trips of a `while` loop (a solver's, a fixed point's) whose count the
# program does not say.
NESTED_EXECUTIONS = 10.0


# A repeated `jax.jit` function of the user's is rolled when its body is at least
# this many equations (or holds heavy work, `_jaxpr.HEAVY`): smaller ones compile
# in less time than a loop saves.
MIN_CALLEE_EQUATIONS = 32


@dataclasses.dataclass
class Group:
    """The call sites of one computation (one callee) in a traced program.

    **Fields:**

    - `name`: the call's equation name (a marked call's, or the user's function's).
    - `callee`: the computation, a `ClosedJaxpr`.
    - `sites`: indices of its calls at the top level of the program.
    - `nested`: `(equation, executions per run)` of its calls inside loop bodies,
        branches and other calls.
    """

    name: str
    callee: Any
    sites: list[int] = dataclasses.field(default_factory=list)
    nested: list[tuple[Any, float]] = dataclasses.field(default_factory=list)

    @property
    def call_sites(self) -> int:
        return len(self.sites) + len(self.nested)

    @property
    def executions(self) -> float:
        return len(self.sites) + sum(n for _, n in self.nested)

    def equations(self, jaxpr: Any) -> list[Any]:
        return [jaxpr.eqns[i] for i in self.sites] + [e for e, _ in self.nested]


@dataclasses.dataclass
class AutoGroup:
    """An `Auto` operator kind's group with its decision, for `lxd.jit` and
    `lxd.explain`: the calls of its `mv`, or (`transformation`, what they compute
    instead, see `transformation`) calls of its name that a transformation of the
    program made."""

    record: AutoRecord
    group: Group
    decision: Decision
    sites: tuple[tuple[str, int], ...]
    transformation: str | None = None


def transformation(record: AutoRecord, callee: Any) -> str:
    """What calls of an `Auto` operator's marked call compute where their callee is
    not its `mv` (`record.applies` is false): a transformation of the program made
    them, read from how the callee's inputs and outputs compare with the `mv`'s.

    **Arguments:**

    - `record`: the operator kind's record (its plain `mv`s, `record.callees`).
    - `callee`: the calls' callee, a `ClosedJaxpr`.

    **Returns:**

    A phrase naming the transformation.
    """
    ins, outs = len(callee.in_avals), len(callee.out_avals)
    types = [(a.shape, a.dtype) for a in (*callee.in_avals, *callee.out_avals)]
    for plain in record.callees:
        plain_ins, plain_outs = len(plain.in_avals), len(plain.out_avals)
        if (ins, outs) == (plain_ins, plain_outs):
            avals = (*plain.in_avals, *plain.out_avals)
            if types == [(a.shape, a.dtype) for a in avals]:
                # (A linear `mv`'s transpose, or its primal as `jax.grad` splits
                # it, takes and gives what the `mv` does.)
                return "the primal or the transpose of a `jax.grad` or `jax.vjp`"
            return "batched, as `jax.vmap` traces it"
        if ins == plain_ins and outs > plain_outs:
            return "a primal with residuals, as `jax.grad` and `jax.linearize` trace it"
        if ins > plain_ins and outs == 2 * plain_outs:
            return "a JVP, as `jax.jvp` and `jax.jacfwd` trace it"
        if ins > plain_ins:
            return "a transpose, as the backward pass of `jax.grad` traces it"
    return "a transformation of it (`jax.vmap`, `jax.grad`, `jax.jvp`...)"


# Per loop primitive, how many times its body runs per run of the loop.
_TRIPS = MappingProxyType(
    {
        prims.scan_p: lambda eqn: float(scan_length(eqn)),
        prims.while_p: lambda eqn: NESTED_EXECUTIONS,
    }
)


def loop_trips(eqn: Any) -> float:
    """How many times a sub-program of `eqn` runs per run of `eqn`."""
    trips = _TRIPS.get(eqn.primitive)
    return 1.0 if trips is None else trips(eqn)


def foreign_marked_calls(jaxpr: Any, active: Session) -> bool:
    """Whether `jaxpr` (at any depth) calls an `Auto` operator's marked call that
    `active` did not make and no `lxd.jit` program called in its trace holds: a
    nested trace (a jit of the user's, a loop body) that a jit cache kept from an
    earlier program, whose call sites this program cannot decide.

    **Arguments:**

    - `jaxpr`: a `jax.extend.core.Jaxpr`, the program's top level.
    - `active`: the trace's session.

    **Returns:**

    A bool.
    """
    known = set(active.by_name()) | active.embedded

    def foreign(eqn: Any) -> tuple[list[Any], bool]:
        name = call_name(eqn) if eqn.primitive is prims.jit_p else None
        if name is not None and name.startswith(AUTO_NAME) and name not in known:
            return [eqn], True
        return [], True

    return bool(finds_below(foreign)(jaxpr))


def find_groups(jaxpr: Any) -> dict[tuple[str, int], Group]:
    """Every `jit` call in `jaxpr` and below it, grouped by callee: `(name,
    id(callee)) -> Group`, in program order.

    **Arguments:**

    - `jaxpr`: a `jax.extend.core.Jaxpr`, the program's top level.

    **Returns:**

    A dict of `Group`s.
    """
    groups: dict[tuple[str, int], Group] = {}
    # Per sub-program, the `jit` calls at any depth in it, with how many times each
    # runs per run of it; an operator's `mv`'s body is not the program's.
    calls_in = finds_below(_calls, loop_trips)

    def group_of(eqn: Any) -> Group:
        callee = call_callee(eqn)
        key = (str(call_name(eqn)), id(callee))
        if key not in groups:
            groups[key] = Group(key[0], callee)
        return groups[key]

    for index, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive is prims.jit_p:
            group_of(eqn).sites.append(index)
            if is_marked(eqn):
                continue
        factor = loop_trips(eqn)
        for sub in jex.jaxprs_in_params(eqn.params):
            for nested, n in calls_in(sub):
                group_of(nested).nested.append((nested, factor * n))
    return groups


def _calls(eqn: Any) -> tuple[list[Any], bool]:
    """`eqn` where it is a `jit` call, and whether to look inside it (not in an
    operator's marked call)."""
    if eqn.primitive is prims.jit_p:
        return [eqn], not is_marked(eqn)
    return [], True


def _count(jaxpr: Any) -> int:
    """How many equations `jaxpr` has, at any depth."""
    return sum(
        1 + sum(_count(sub) for sub in jex.jaxprs_in_params(eqn.params))
        for eqn in jaxpr.eqns
    )


def substantial(callee: Any) -> bool:
    """Whether a user's function is worth rolling: heavy work (`_jaxpr.HEAVY`: a
    dot product, a linear solve (lineax's `linear_solve` is such a function), a
    loop, a factorisation) or at least `MIN_CALLEE_EQUATIONS` equations."""
    jaxpr = callee.jaxpr
    return (
        any(heavy(eqn) for eqn in jaxpr.eqns) or _count(jaxpr) >= MIN_CALLEE_EQUATIONS
    )


def same_arrays(jaxpr: Any, group: Group, arrays: int) -> bool:
    """Whether every top-level call of `group` applies the same operator arrays
    (its first `arrays` inputs), so that one matrix serves them all."""
    if len(group.sites) == 1:
        return True
    found = call_group(jaxpr, group.sites)
    return found is not None and all(p >= arrays for p in found[2])
