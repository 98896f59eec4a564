"""The rule of each policy that `lxd.jit` applies to a program, registered by
policy class (`RULES`), as `jax.experimental.checkify` registers one rule per
primitive: the policy's estimate (what `Auto` predicts it costs), how its plan
for a group's call sites is made, when the rewrite applies it, and how. The
decide stage picks a group's policy and makes an `Action` (the policy, its plan);
the rewrite (`_rewrite.py`) applies each action through its policy's rule.

- `Roll`: the top-level sites stacked into one batched call where they are
  independent (`_stack.py`) and stacking keeps their cost
  (`_precision.stacking_keeps_cost`), else rolled into one loop body
  (`_roll_loop.py`).
- `Materialise`: one matrix built before the first site, a matrix product at
  each (`_shared_matrix.py`).
- `Outline`: every site, at any depth, through one out-of-line `mv`
  (`_outline_sites.py`).
- `Lazy`: the top-level sites put inline (`_inline.py`)."""

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

from ..._compat import call_callee
from ..._precision import stacking_keeps_cost
from ...policies._lazy import Lazy
from ...policies._materialise import Materialise
from ...policies._outline import Outline
from ...policies._roll import Roll
from ...policies.calls._marked import is_marked
from ...policies.decision._formulas import ESTIMATES
from ..analyse._roll_plan import plan_roll, RollPlan
from ..analyse._stack_plan import plan_stack, StackPlan
from ._inline import inlined_jaxpr
from ._outline_sites import outline_group
from ._roll_loop import rolled_function
from ._shared_matrix import materialised_function
from ._stack import stacked_function


class Phase(enum.Enum):
    """When the rewrite applies a rule: `FIRST`, to every site at any depth before
    the others (the equations stay where they are); `EACH`, to one group's
    top-level sites per pass, largest group first (its loop takes the code of the
    others in); `LAST`, to all such groups' top-level sites together, in the
    program as it then is."""

    FIRST = 1
    EACH = 2
    LAST = 3


@dataclasses.dataclass(frozen=True)
class Rule:
    """How the rewrite applies one policy to a group's call sites.

    **Fields:**

    - `phase`: when (`Phase`).
    - `apply`: for `Phase.FIRST`, `(closed, callee, action) -> ClosedJaxpr`; for
        `Phase.EACH`, `(closed, sites, action, plan, loop) -> function of the
        program's flat inputs, or None` where it cannot apply; for `Phase.LAST`,
        `(closed, sites) -> ClosedJaxpr`.
    - `plan`: `(jaxpr, sites) -> plan` for the top-level calls at `sites` of a
        program's `jaxpr` (`None`: no plan for those sites, the rule does not
        apply), for a rule whose application depends on the code around them.
    - `any_depth`: whether it applies to sites in loop bodies, branches and other
        calls too (else a group without top-level sites gets no action).
    - `estimate`: the policy's estimate, `(Observation, CostModel) -> Estimate`,
        registered by policy class in `policies/decision/_formulas.py`
        (`ESTIMATES`), where `decide`, below the program, reads it.
    """

    phase: Phase
    apply: Callable[..., Any]
    plan: Callable[[Any, Sequence[int]], Any] | None = None
    any_depth: bool = False
    estimate: Callable[..., Any] | None = None


def rolled_plan(
    jaxpr: Any, sites: Sequence[int], stack: StackPlan | None
) -> StackPlan | RollPlan | None:
    """`Roll`'s plan for the calls at `sites` given their `stack` plan
    (`plan_stack`): an operator's independent sites stacked (a linear map batches
    well) where stacking keeps their cost on this backend (`stacking_keeps_cost`);
    dependent ones, the user's functions, and those, rolled (`plan_roll`), or
    stacked where they do not roll. `None` where neither applies."""
    if len(sites) < 2:
        return None
    if stack is None or not is_marked(jaxpr.eqns[sites[0]]):
        return plan_roll(jaxpr, sites)
    if stacking_keeps_cost(call_callee(jaxpr.eqns[sites[0]])):
        return stack
    return plan_roll(jaxpr, sites) or stack


def roll_plans(jaxpr: Any, sites: Sequence[int]) -> tuple[StackPlan | None, Any]:
    """The calls at `sites` (two or more top-level calls of one computation)
    planned for `Roll` at the decide stage: `(their stack plan, Roll's plan)`."""
    stack = plan_stack(jaxpr, sites)
    return stack, rolled_plan(jaxpr, sites, stack)


def _roll_plan(jaxpr: Any, sites: Sequence[int]) -> StackPlan | RollPlan | None:
    marked = len(sites) >= 2 and is_marked(jaxpr.eqns[sites[0]])
    return rolled_plan(jaxpr, sites, plan_stack(jaxpr, sites) if marked else None)


def _roll(closed: Any, sites: Sequence[int], action: "Action", plan: Any, loop: str):
    if plan is None:
        return None
    if isinstance(plan, StackPlan):
        return stacked_function(closed, plan)
    return rolled_function(closed, plan, loop)


def _materialise(closed: Any, sites, action: "Action", plan: Any, loop: str):
    batch_size = action.policy.batch_size
    return materialised_function(closed, sites, action.arrays, batch_size)


def _outline(closed: Any, callee: Any, action: "Action") -> Any:
    return outline_group(closed, callee, action.arrays)


RULES: dict[type, Rule] = {
    Roll: Rule(Phase.EACH, _roll, plan=_roll_plan, estimate=ESTIMATES[Roll]),
    Materialise: Rule(Phase.EACH, _materialise, estimate=ESTIMATES[Materialise]),
    Outline: Rule(Phase.FIRST, _outline, any_depth=True, estimate=ESTIMATES[Outline]),
    Lazy: Rule(Phase.LAST, inlined_jaxpr, estimate=ESTIMATES[Lazy]),
}


def rule_of(policy: Any) -> Rule:
    """The rule registered for `policy`'s class or its nearest base class; `Lazy`'s
    (the sites put inline) for a policy with none."""
    for cls in type(policy).__mro__:
        if cls in RULES:
            return RULES[cls]
    return RULES[Lazy]


_UNMADE = object()  # an `Action`'s plan not made yet


@dataclasses.dataclass
class Action:
    """What the rewrite does with a group's call sites: apply `policy` through its
    rule (`rule_of`), with its rule's plan for them.

    **Fields:**

    - `policy`: the policy applied (`Roll()` for a `Roll` operator's sites and the
        user's repeated functions).
    - `planned_on`: the program (a `jax.extend.core.Jaxpr`) the group was found
        in; in a program an earlier rewrite changed, the plan is made for the
        sites where they then are (`plan_in`).
    - `arrays`: how many of the call's inputs are the operator's arrays (the rest
        are the vector's leaves).
    - `plan`: its rule's plan for the group's top-level sites in `planned_on`
        (`None` where the rule makes none, or where it does not apply there), made
        at the decide stage where deciding needs it (`Roll`'s, for `Auto`), else
        when the rewrite first asks for it (and kept for the other kind of loop).
    """

    policy: Any
    planned_on: Any = None
    arrays: int = 0
    plan: Any = _UNMADE

    @property
    def rule(self) -> Rule:
        return rule_of(self.policy)

    def plan_in(self, jaxpr: Any, sites: Sequence[int]) -> Any:
        """The plan for the calls at `sites` of `jaxpr`: the one carried where
        `jaxpr` is the program it is for, else made for `jaxpr`."""
        if jaxpr is self.planned_on and self.plan is not _UNMADE:
            return self.plan
        make = self.rule.plan
        plan = None if make is None else make(jaxpr, sites)
        if jaxpr is self.planned_on:
            self.plan = plan
        return plan
