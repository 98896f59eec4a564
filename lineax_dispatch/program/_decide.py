"""The decide stage of `lxd.jit`: each group of repeated calls in a traced program
(`analyse/`) mapped to an `Action` (a policy and its rule's plan,
`rewrite/_rules.py`), the decision for each `Auto` operator kind's call sites,
and the solves that are better decided together (one matrix build for k solves of one operator)."""

import dataclasses
from typing import Any

import jax
import jax.tree_util as jtu

from .._jaxpr import out_leaves
from ..policies._lazy import Lazy
from ..policies._materialise import Materialise
from ..policies._outline import Outline
from ..policies._roll import Roll
from ..policies.calls._keys import is_leaf_array
from ..policies.calls._marked import is_marked, MARKED_NAME
from ..policies.calls._recorder import SolveRecord
from ..policies.calls._sites import equation_site
from ..policies.decision._cost import jaxpr_cost
from ..policies.decision._model import CostModel
from ..policies.decision._observation import observe
from ..policies.decision._records import Decision
from ..policies.decision._rule import cheapest, decide
from ._session import AutoRecord, Session
from .analyse._groups import (
    AutoGroup,
    find_groups,
    Group,
    same_arrays,
    substantial,
    transformation,
)
from .analyse._solves import carried_layouts, rolling_pays
from .rewrite._rules import Action, roll_plans, rule_of, RULES


@dataclasses.dataclass
class Plan:
    """What the decide stage makes of a traced program: the `Action` for each group
    of repeated calls, keyed by `(name, id(callee))` (the policy applied and its
    rule's plan, `rewrite._rules`); the `AutoGroup` (record,
    group, decision, sites) of each `Auto` operator kind's call sites; and every
    decision of the trace, keyed by operator kind: its call sites', and its
    solves' (decided in the solver's `init`)."""

    actions: dict[Any, Action]
    autos: list[AutoGroup]
    decisions: dict[Any, Decision]
    contender: "Plan | None" = None
    run_seconds: float = 0.0


def _restrict(decision: Decision, allowed: set[type], model: CostModel) -> Decision:
    """`decision`, or the cheapest of its estimates among the `allowed` policy
    classes if it chose another (a strategy the rewrite cannot apply to these
    sites), departing from `Lazy` only beyond its margin (`CostModel.margin`)."""
    if type(decision.policy) in allowed:
        return decision
    candidates = (e for e in decision.estimates if type(e.policy) in allowed)
    best = cheapest(candidates, model)
    policy = Lazy() if best is None else best.policy
    note = (
        f"{decision.strategy} cannot be applied to these call sites here; "
        f"{type(policy).__name__} is the cheapest that can."
    )
    return decision.with_reason(note, policy, memory_needed=0)


def decide_group(
    record: AutoRecord,
    group: Group,
    jaxpr: Any,
    arrays: int,
    transformation: str | None = None,
) -> tuple[Decision, Decision | None, dict[Any, Any]]:
    """The decision for an `Auto` operator kind's call sites in a program, its
    contender (`contender`), and the plans made to decide (`Roll`'s, by rule).

    **Arguments:**

    - `record`: the operator kind's record of the trace.
    - `group`: its call sites.
    - `jaxpr`: the program's top level.
    - `arrays`: how many of the callee's inputs are the operator's arrays
        (`operator_arrays`).
    - `transformation`: for calls of its name that a transformation of the
        program made (`analyse._groups.transformation`), what they compute: they
        are decided as that computation (its cost read from their callee), between
        `Lazy` and `Roll`, which apply to any repeated call (a matrix, or an
        out-of-line call of the operator, stands for its `mv` only).

    **Returns:**

    `(decision, contender, plans)`: [`lineax_dispatch.Decision`][]s, the
    contender `None` where there is none; `plans`, `{rule: plan}` (`Roll`'s rule
    and plan where it was considered), for the actions (`_action`).
    """
    operator = record.operator
    top_only = not group.nested
    policy = operator.policy
    rollable = top_only and len(group.sites) >= 2
    plans: dict[Any, Any] = {}
    stackable = False
    unstacked = False
    if rollable:
        stack, plans[RULES[Roll]] = roll_plans(jaxpr, group.sites)
        # An operator's independent sites that this backend rolls rather than
        # stacks (`stacking_keeps_cost`) are priced as the loop they become.
        marked = is_marked(jaxpr.eqns[group.sites[0]])
        unstacked = stack is not None and marked and plans[RULES[Roll]] is not stack
        stackable = stack is not None and not unstacked
        # None of either: a value between the calls a loop cannot carry.
        rollable = stackable or plans[RULES[Roll]] is not None
    observation = observe(
        operator,
        memory_budget=policy.budget(),
        call_sites=group.call_sites,
        executions=group.executions,
        runs=policy.runs,
        rollable=rollable,
        stackable=stackable,
        cost=jaxpr_cost(group.callee),
        out_structure=out_leaves(mv_callee(record, group)),
    )
    model = policy.model()
    decision = decide(observation, model)
    allowed: set[type] = {Lazy, Roll} if rollable else {Lazy}
    if transformation is None and top_only and same_arrays(jaxpr, group, arrays):
        allowed.add(Materialise)
    if transformation is None and not rollable and group.call_sites >= 2:
        # Where rolling cannot reach (sites in loop bodies, branches, other
        # calls, or between which a loop cannot carry a value): one out-of-line
        # `mv` for all of them.
        allowed.add(Outline)
    decision = _restrict(decision, allowed, model)
    if unstacked and isinstance(decision.policy, Roll):
        decision = decision.with_reason(
            f"{decision.reasons[-1]} The sites are independent but rolled into a "
            f"loop, not stacked: on {jax.default_backend()!r} the stacked call's "
            "products would run at float32's full precision in several passes, "
            "slow to compile for a large matrix; the loop keeps each mv as written."
        )
    if transformation is not None:
        decision = decision.with_reason(
            f"These calls are a transformation of its mv ({transformation}), "
            f"decided as that computation: {decision.strategy} (Lazy or Roll; a "
            "matrix or an out-of-line call stands for the mv itself only)."
        )
    return (*_with_contender(decision, rollable, model, policy), plans)


def contender(decision: Decision, rollable: bool, model: CostModel) -> Decision | None:
    """The other side of an uncertain choice between `Roll` and `Lazy`: `Lazy`
    where `decision` is `Roll`, and `Roll` where it is `Lazy` and `Roll` is allowed
    and estimated cheaper than `Lazy` by less than its margin (the model's
    measured error). `None` otherwise (`Materialise` and `Outline` are not
    raced).

    **Arguments:**

    - `decision`: the decision for a group of call sites.
    - `rollable`: whether `Roll` can apply to them.
    - `model`: the cost model it was decided with (its margins, `CostModel.margin`).

    **Returns:**

    A `Decision` of the other policy, or `None`.
    """
    found = {type(e.policy): e for e in decision.estimates}
    lazy, roll = found.get(Lazy), found.get(Roll)
    if not rollable or lazy is None or roll is None or roll.seconds is None:
        return None
    if type(decision.policy) not in (Lazy, Roll) or lazy.seconds is None:
        return None
    if lazy.run_seconds is None or roll.run_seconds is None:
        return None
    if isinstance(decision.policy, Roll):
        other = lazy.policy
    elif roll.seconds < lazy.seconds * model.margin(Roll):
        other = roll.policy
    else:
        return None
    return decision.with_reason(
        f"{type(other).__name__}: the other side of an uncertain choice, raced against "
        f"{decision.strategy}.",
        other,
        memory_needed=0,
    )


def _with_contender(
    decision: Decision, rollable: bool, model: CostModel, policy: Any
) -> tuple[Decision, Decision | None]:
    """`decision` and, where its policy races (`Auto.races`), its `contender`, with
    the race said in its reasons."""
    races = getattr(policy, "races", None)
    other = contender(decision, rollable, model) if races and races() else None
    if other is None:
        return decision, None
    decision = decision.with_reason(
        f"{decision.reasons[-1]} Raced against {other.strategy} at the first call "
        "outside a trace: both compiled side by side, the one of least compile "
        "plus estimated runs kept (measured, not estimated)."
    )
    return decision, other


def mv_callee(record: AutoRecord, group: Group) -> Any:
    """The callee of the operator's `mv` for `group`: its own, or where a
    transformation made its calls, the `mv` the record traced (whose outputs are
    the operator's output structure; the transformed callee's are not)."""
    if record.applies(group.callee) or not record.callees:
        return group.callee
    return record.callees[0]


def operator_arrays(record: AutoRecord, group: Group) -> int:
    """How many of the inputs of `group`'s callee are the operator's arrays (the
    first ones; the others are the leaves of the vector)."""
    vector_leaves = len(jtu.tree_leaves(record.operator.in_structure()))
    return len(group.callee.jaxpr.invars) - vector_leaves


def plan_program(closed: Any, active: Session) -> Plan:
    """Decides for a traced program: the action for each group of repeated calls
    (by equation name and callee), and the decision for each `Auto` operator kind.

    **Arguments:**

    - `closed`: the traced program, a `ClosedJaxpr`.
    - `active`: the session it was traced in.

    **Returns:**

    A `Plan`.
    """
    jaxpr = closed.jaxpr
    records = active.by_name()
    actions: dict[Any, Action] = {}
    autos: list[AutoGroup] = []
    contenders: dict[Any, AutoGroup] = {}
    made_for: dict[Any, dict[Any, Any]] = {}
    auto_keys: list[Any] = []
    for key, group in find_groups(jaxpr).items():
        record = records.get(group.name)
        if record is not None:
            # A call of the operator's name under a transformation (batched, its
            # JVP, primal with residuals, transpose) is not its `mv`, but a
            # repeated computation decided as what it is.
            how = None
            if not record.applies(group.callee):
                how = transformation(record, group.callee)
            arrays = operator_arrays(record, group)
            decision, other, made = decide_group(record, group, jaxpr, arrays, how)
            sites = tuple(equation_site(e) for e in group.equations(jaxpr))
            autos.append(AutoGroup(record, group, decision, sites, how))
            auto_keys.append(key)
            if other is not None:
                contenders[key] = AutoGroup(record, group, other, sites, how)
                made_for[key] = made
            action = _action(decision.policy, group, jaxpr, arrays, made)
            if action is not None:
                actions[key] = action
        elif len(group.sites) < 2:
            continue
        elif group.name == MARKED_NAME:
            actions[key] = Action(Roll(), jaxpr)  # a `Roll` operator's
        elif not group.name.startswith(MARKED_NAME) and substantial(group.callee):
            # A repeated function of the user's. (Other marked calls are applied
            # inline: `Lazy` operators', or another `lxd.jit`'s.) Solves of cheap
            # `mv`s are cheaper to compile again than to roll.
            if rolling_pays(group.callee, len(group.sites)):
                actions[key] = Action(Roll(), jaxpr)
    plan = Plan(actions, autos, _decisions(autos, active))
    if not contenders:
        return plan
    decided = dict(zip(auto_keys, autos))
    other_actions = dict(actions)
    for key, a in contenders.items():
        action = _action(a.decision.policy, a.group, jaxpr, 0, made_for[key])
        other_actions.pop(key, None)
        if action is not None:
            other_actions[key] = action
    other_autos = [contenders.get(k, a) for k, a in decided.items()]
    other_runs = sum(_run_seconds(a) for a in contenders.values())
    other = Plan(
        other_actions, other_autos, _decisions(other_autos, active), None, other_runs
    )
    run_seconds = sum(_run_seconds(decided[k]) for k in contenders)
    return dataclasses.replace(plan, contender=other, run_seconds=run_seconds)


def _run_seconds(a: AutoGroup) -> float:
    """The estimated seconds of `runs` runs of `a`'s call sites with its decision."""
    runs = a.record.operator.policy.runs
    for e in a.decision.estimates:
        if type(e.policy) is type(a.decision.policy) and e.run_seconds is not None:
            return runs * e.run_seconds
    return 0.0


def _action(
    policy: Any, group: Group, jaxpr: Any, arrays: int, made: dict[Any, Any]
) -> Action | None:
    """The action that applies `policy` to `group`'s call sites of `jaxpr`, with its
    rule's plan: the one `made` when deciding (`decide_group`), else made when the
    rewrite first asks for it. `None` for a rule of top-level sites where the
    group has none."""
    rule = rule_of(policy)
    if not group.sites and not rule.any_depth:
        return None
    if rule in made:
        return Action(policy, jaxpr, arrays, made[rule])
    return Action(policy, jaxpr, arrays)


def _decisions(autos: list[AutoGroup], active: Session) -> dict[Any, Decision]:
    """Every decision of the trace, keyed by operator kind: its solves', and its
    call sites' (an operator kind met only in a transformation's calls: the
    decision of its group of most call sites)."""
    decisions = {solve.key: solve.decision for solve in active.solves}
    decisions.update((a.record.key, a.decision) for a in autos if not a.transformation)
    transformed = [a for a in autos if a.transformation]
    for a in sorted(transformed, key=lambda a: -a.group.call_sites):
        decisions.setdefault(a.record.key, a.decision)
    return decisions


def _array_leaves(operator: Any) -> list[jax.ShapeDtypeStruct]:
    return [
        x
        for x in jtu.tree_leaves(operator, is_leaf=is_leaf_array)
        if isinstance(x, jax.ShapeDtypeStruct)
    ]


def _repeats(jaxpr: Any, groups: list[Group], record: SolveRecord) -> int:
    """How many top-level calls of one computation (one of `groups`, the program's),
    all with this solve's operator arrays, were made from the line of `record`'s
    solve (1 if none is repeated)."""
    arrays = _array_leaves(record.operator)
    for group in groups:
        if len(group.sites) < 2 or group.nested:
            continue
        if equation_site(jaxpr.eqns[group.sites[0]]) != record.site:
            continue
        invars = group.callee.jaxpr.invars
        if len(invars) < len(arrays) or any(
            v.aval.shape != a.shape or v.aval.dtype != a.dtype
            for v, a in zip(invars, arrays)
        ):
            continue
        if same_arrays(jaxpr, group, len(arrays)):
            return len(group.sites)
    return 1


def shared_solve_hints(jaxpr: Any, active: Session) -> dict[tuple, int]:
    """The solves of a traced program that should be decided again as k solves
    sharing one build: `(user site, operator key) -> k`, for those whose decision
    then changes to `Materialise`.

    **Arguments:**

    - `jaxpr`: the program's top level, a `jax.extend.core.Jaxpr`.
    - `active`: the session it was traced in (its solves' records).

    **Returns:**

    A dict, empty when no solve's decision changes.
    """
    hints: dict[tuple, int] = {}
    groups = list(find_groups(jaxpr).values()) if active.solves else []
    for record in active.solves:
        if isinstance(record.decision.policy, Materialise):
            continue
        k = _repeats(jaxpr, groups, record)
        if k < 2:
            continue
        policy = record.operator.policy
        shared = policy.decision(
            record.operator,
            executions=record.executions * k,
            solves=1,
            solve_tolerance=record.tolerance,
        )
        if isinstance(shared.policy, Materialise):
            hints[(record.site, record.key)] = k
    return hints


def layout_hints(jaxpr: Any, retrace_s: float) -> dict[tuple, float]:
    """The CG solves of a traced program (with `layout="auto"`) that should be
    decided again for the trips of the loops around them: `(user line, operator
    key) -> runs per run of the program` (`Hints.layouts`), for those that kept one site
    and would take the inline layout counting those runs, by more than a second
    trace of the program costs.

    **Arguments:**

    - `jaxpr`: the program's top level, a `jax.extend.core.Jaxpr`.
    - `retrace_s`: seconds the first trace took (what a second costs).

    **Returns:**

    A dict, empty when no solve's layout changes.
    """
    hints: dict[tuple, float] = {}
    for ref, runs in carried_layouts(jaxpr):
        if ref.site is None or ref.layout != "one_site" or runs <= 1:
            continue
        if ref.saved * runs - ref.compile_s > retrace_s:
            hints[ref.site] = runs
    return hints
