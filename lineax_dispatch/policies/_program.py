"""What `lxd.jit` reads from a traced program: the call sites of each repeated
computation (an `Auto` operator kind's `mv`, a `Roll` operator's, a `jax.jit`
function of the user's), how often each runs, and what to do with each group."""

import dataclasses
from typing import Any

import jax
import jax.extend.core as jex
import jax.tree_util as jtu

from .._compat import call_callee, call_name, scan_length
from ._cost import jaxpr_cost
from ._decide import cheapest, decide
from ._decision import Decision
from ._lazy import Lazy
from ._marked import AUTO_NAME, is_marked, MARKED_NAME
from ._materialise import Materialise
from ._observation import observe
from ._outline import Outline
from ._registry import AutoRecord, equation_site, Session
from ._roll_plan import call_group, plan_roll
from ._roll_policy import Roll
from ._stack import plan_stack


# Expected trips of a `while` loop (a solver's, a fixed point's) whose count the
# program does not say.
NESTED_EXECUTIONS = 10.0

# A repeated `jax.jit` function of the user's is rolled when its body is at least
# this many equations (or holds a dot product): smaller ones compile in less time
# than a loop saves.
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
class Action:
    """What the rewrite does with a group's sites: `"roll"` its top-level sites (one
    loop body, or one stacked call where they are independent), `"materialise"`
    them (one matrix built before the first, a matrix product at each),
    `"outline"` every site, at any depth (one out-of-line `mv`), or `"inline"` its
    top-level sites (the callee's equations put in the program, as lineax's: no
    call to lower and compile); with the build's chunk of columns and the number
    of the call's inputs that are the operator's arrays (the rest are the vector's
    leaves)."""

    kind: str
    batch_size: int | None = None
    arrays: int = 0


@dataclasses.dataclass
class AutoGroup:
    """An `Auto` operator kind's group with its decision, for `lxd.jit` and
    `lxd.explain`."""

    record: AutoRecord
    group: Group
    decision: Decision
    sites: tuple[tuple[str, int], ...]


def _factor(eqn: Any) -> float:
    """How many times a sub-program of `eqn` runs per run of `eqn`."""
    name = eqn.primitive.name
    if name == "scan":
        return float(scan_length(eqn))
    if name == "while":
        return NESTED_EXECUTIONS
    return 1.0


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
    seen: set[int] = set()

    def walk(sub: Any) -> bool:
        if id(sub) in seen:
            return False
        seen.add(id(sub))
        for eqn in sub.eqns:
            name = call_name(eqn) if eqn.primitive.name == "jit" else None
            if name is not None and name.startswith(AUTO_NAME) and name not in known:
                return True
            if any(walk(deeper) for deeper in jex.jaxprs_in_params(eqn.params)):
                return True
        return False

    return walk(jaxpr)


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
    # runs per run of it: a callee called at k sites is read once, not k times.
    inside: dict[int, list[tuple[Any, float]]] = {}

    def calls_in(sub: Any) -> list[tuple[Any, float]]:
        found = inside.get(id(sub))
        if found is None:
            found = []
            for eqn in sub.eqns:
                if eqn.primitive.name == "jit":
                    found.append((eqn, 1.0))
                    if is_marked(eqn):
                        continue  # an operator's `mv`: its body is not the program's
                factor = _factor(eqn)
                for deeper in jex.jaxprs_in_params(eqn.params):
                    found += [(e, factor * n) for e, n in calls_in(deeper)]
            inside[id(sub)] = found
        return found

    def group_of(eqn: Any) -> Group:
        callee = call_callee(eqn)
        key = (str(call_name(eqn)), id(callee))
        if key not in groups:
            groups[key] = Group(key[0], callee)
        return groups[key]

    for index, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive.name == "jit":
            group_of(eqn).sites.append(index)
            if is_marked(eqn):
                continue
        factor = _factor(eqn)
        for sub in jex.jaxprs_in_params(eqn.params):
            for nested, n in calls_in(sub):
                group_of(nested).nested.append((nested, factor * n))
    return groups


# Primitives that count as substantial work wherever they appear: a dot product,
# and lineax's linear solve (whose solver's loop is not a sub-jaxpr of it).
_HEAVY = ("dot_general", "linear_solve")


def _size(jaxpr: Any) -> tuple[int, bool]:
    count, dots = 0, False
    for eqn in jaxpr.eqns:
        count += 1
        dots = dots or eqn.primitive.name in _HEAVY
        for sub in jex.jaxprs_in_params(eqn.params):
            c, d = _size(sub)
            count, dots = count + c, dots or d
    return count, dots


def substantial(callee: Any) -> bool:
    """Whether a user's function is worth rolling: a dot product or a linear solve
    (lineax's `linear_solve` is such a function), or at least
    `MIN_CALLEE_EQUATIONS` equations."""
    count, dots = _size(callee.jaxpr)
    return dots or count >= MIN_CALLEE_EQUATIONS


def same_arrays(jaxpr: Any, group: Group, arrays: int) -> bool:
    """Whether every top-level call of `group` applies the same operator arrays
    (its first `arrays` inputs), so that one matrix serves them all."""
    if len(group.sites) == 1:
        return True
    found = call_group(jaxpr, group.sites)
    return found is not None and all(p >= arrays for p in found[2])


def _restrict(decision: Decision, allowed: set[str]) -> Decision:
    """`decision`, or the cheapest of its estimates among `allowed` strategies if it
    chose another (a strategy the rewrite cannot apply to these sites)."""
    if decision.strategy in allowed:
        return decision
    best = cheapest(e for e in decision.estimates if e.strategy in allowed)
    policy = Lazy() if best is None else best.policy
    note = (
        f"{decision.strategy} cannot be applied to these call sites here; "
        f"{type(policy).__name__} is the cheapest that can."
    )
    return decision.with_reason(note, policy, memory_needed=0)


def decide_group(record: AutoRecord, group: Group, jaxpr: Any, arrays: int) -> Decision:
    """The decision for an `Auto` operator kind's call sites in a program.

    **Arguments:**

    - `record`: the operator kind's record of the trace.
    - `group`: its call sites.
    - `jaxpr`: the program's top level.
    - `arrays`: how many of the callee's inputs are the operator's arrays
        (`operator_arrays`).

    **Returns:**

    A [`lineax_dispatch.Decision`][].
    """
    operator = record.operator
    top_only = not group.nested
    policy = operator.policy
    rollable = top_only and len(group.sites) >= 2
    stackable = rollable and plan_stack(jaxpr, group.sites) is not None
    if rollable and not stackable and plan_roll(jaxpr, group.sites) is None:
        rollable = False  # a value between the calls a loop cannot carry
    observation = observe(
        operator,
        memory_budget=policy.budget(),
        call_sites=group.call_sites,
        executions=group.executions,
        runs=policy.runs,
        rollable=rollable,
        stackable=stackable,
        cost=jaxpr_cost(group.callee),
        out_structure=out_leaves(group.callee),
    )
    decision = decide(observation, policy.model())
    allowed = {"Lazy"}
    if rollable:
        allowed.add("Roll")
    if top_only and same_arrays(jaxpr, group, arrays):
        allowed.add("Materialise")
    if not rollable and group.call_sites >= 2:
        # Where rolling cannot reach (sites in loop bodies, branches, other
        # calls, or between which a loop cannot carry a value): one out-of-line
        # `mv` for all of them.
        allowed.add("Outline")
    return _restrict(decision, allowed)


def out_leaves(callee: Any) -> list[jax.ShapeDtypeStruct]:
    """The leaves of an operator's output structure, read from its traced `mv`
    (asking the operator may trace its function again)."""
    return [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in callee.jaxpr.outvars
    ]


def operator_arrays(record: AutoRecord, group: Group) -> int:
    """How many of the inputs of `group`'s callee are the operator's arrays (the
    first ones; the others are the leaves of the vector)."""
    vector_leaves = len(jtu.tree_leaves(record.operator.in_structure()))
    return len(group.callee.jaxpr.invars) - vector_leaves


def plan_program(
    closed: Any, active: Session
) -> tuple[dict[str, Action], list[AutoGroup]]:
    """Reads a traced program: the action for each group of repeated calls (by
    equation name and callee), and the decision for each `Auto` operator kind.

    **Arguments:**

    - `closed`: the traced program, a `ClosedJaxpr`.
    - `active`: the session it was traced in.

    **Returns:**

    `(actions, auto_groups)`: actions keyed by `(name, id(callee))`.
    """
    jaxpr = closed.jaxpr
    records = active.by_name()
    actions: dict[Any, Action] = {}
    autos: list[AutoGroup] = []
    for key, group in find_groups(jaxpr).items():
        record = records.get(group.name)
        # A call of the operator's name under a transformation (its JVP, primal
        # with residuals, transpose): not its `mv`, but a repeated computation
        # like any other.
        transformed = record is not None and not record.applies(group.callee)
        if transformed:
            record = None
        if record is not None:
            arrays = operator_arrays(record, group)
            decision = decide_group(record, group, jaxpr, arrays)
            sites = tuple(equation_site(e) for e in group.equations(jaxpr))
            autos.append(AutoGroup(record, group, decision, sites))
            policy = decision.policy
            if isinstance(policy, Roll):
                actions[key] = Action("roll")
            elif isinstance(policy, Materialise):
                actions[key] = Action("materialise", policy.batch_size, arrays)
            elif isinstance(policy, Outline):
                actions[key] = Action("outline", arrays=arrays)
            elif group.sites:
                actions[key] = Action("inline")
        elif len(group.sites) < 2:
            continue
        elif group.name == MARKED_NAME:
            actions[key] = Action("roll")  # a `Roll` operator's sites
        elif (transformed or not group.name.startswith(MARKED_NAME)) and substantial(
            group.callee
        ):
            # A repeated function of the user's, or a transformed `mv` of an
            # `Auto` operator. (Other marked calls are applied inline: `Lazy`
            # operators', or another `lxd.jit`'s.)
            actions[key] = Action("roll")
    return actions, autos
