"""Repeated solves of one operator: the k top-level solves of a program that apply
the same operator arrays can share one matrix build.

A solver decides for its `Auto` operator in its `init`, for one solve: it cannot
see that the program solves the same operator k times. `lxd.jit` can. When the
traced program holds k >= 2 calls of one solve (one callee, called from one line
of the user's code, with the same operator arrays at every call) and the decision
for k solves sharing a build (`executions` k times one solve's) is to materialise
where the one-solve decision was not, `lxd.jit` traces the program once more with
that count as a hint for the solves at that line (`solve_hint`): their `init`
then materialises, and the rolled solves build the matrix once, before their
loop (`_hoist.py`). The same XLA does for the k inline copies under `jax.jit`,
which it merges into one build.
"""

from typing import Any

import jax
import jax.tree_util as jtu

from ._materialise import Materialise
from ._program import find_groups, Group, same_arrays
from ._registry import (
    current_session,
    equation_site,
    is_leaf_array,
    Session,
    SolveRecord,
    user_site,
)


def _operator_arrays(operator: Any) -> list[jax.ShapeDtypeStruct]:
    return [
        x
        for x in jtu.tree_leaves(operator, is_leaf=is_leaf_array)
        if isinstance(x, jax.ShapeDtypeStruct)
    ]


def _repeats(jaxpr: Any, groups: list[Group], record: SolveRecord) -> int:
    """How many top-level calls of one computation (one of `groups`, the program's),
    all with this solve's operator arrays, were made from the line of `record`'s
    solve (1 if none is repeated)."""
    arrays = _operator_arrays(record.operator)
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
            key=record.key,
        )
        if isinstance(shared.policy, Materialise):
            hints[(record.site, record.key)] = k
    return hints


def solve_hint(key: Any) -> int:
    """How many solves of the operator kind `key` at the current user line share
    one build, as `lxd.jit` found in a first trace of the program (1 if none).

    **Arguments:**

    - `key`: the operator's kind key.

    **Returns:**

    A positive int.
    """
    active = current_session()
    if active is None or not active.solve_hints:
        return 1
    return active.solve_hints.get((user_site(), key), 1)
