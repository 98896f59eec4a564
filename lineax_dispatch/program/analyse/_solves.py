"""The solve records a traced program carries in its operators' pinned policies,
the `AutoSolver` choices it carries in its solvers' states, and what the records
tell of a repeated function of the user's that solves: whether rolling its calls
pays."""

import dataclasses
from typing import Any

import equinox.internal as eqxi
import jax.extend.core as jex
import jax.tree_util as jtu

from ..._compat import linear_solve_p
from ..._jaxpr import finds_below, HEAVY
from ...policies._lazy import Lazy
from ...policies._outline import Outline
from ...policies._pinned import _Unkeyed, carried_record, ChoiceRef
from ...policies._roll import Roll
from ...policies.calls._recorder import SolverChoice, SolveRecord
from ...policies.calls._sites import equation_site
from ...policies.decision._cost import mv_cost
from ...solvers.cg._layout_choice import LayoutRef
from .._session import Session
from ._groups import loop_trips


def _has_record(node: Any) -> bool:
    return carried_record(getattr(node, "policy", None)) is not None


def _static_args(eqn: Any) -> Any:
    """The static half of a `linear_solve` equation's arguments (operator, solver
    state, vector, options, solver), `None` for any other equation."""
    if eqn.primitive is not linear_solve_p or "treedef" not in eqn.params:
        return None
    try:
        return jtu.tree_unflatten(eqn.params["treedef"], eqn.params["static"])
    except Exception:  # a node of the user's that checks its leaves
        return None


def _records_of(eqn: Any) -> list[SolveRecord]:
    """The solve records a `linear_solve` equation's operator carries."""
    args = _static_args(eqn)
    if args is None:
        return []
    records: dict[int, SolveRecord] = {}
    for node in jtu.tree_leaves(args, is_leaf=_has_record):
        record = carried_record(getattr(node, "policy", None))
        if record is not None:
            records[id(record)] = record
    return list(records.values())


def _carried(jaxpr: Any) -> list[tuple[SolveRecord, Any]]:
    """Every `linear_solve` equation of a traced program (at any depth) whose
    operator carries a solve record, as `(record, top-level equation it is
    under)`, in program order; a sub-program called at k sites (the jit of
    `lx.linear_solve`) counts k times, and is read once."""
    records_in = finds_below(lambda eqn: (_records_of(eqn), True))

    out: list[tuple[SolveRecord, Any]] = []
    for eqn in jaxpr.eqns:
        found = list(_records_of(eqn))
        for sub in jex.jaxprs_in_params(eqn.params):
            found += [record for record, _ in records_in(sub)]
        out.extend((record, eqn) for record in found)
    return out


def carried_solves(jaxpr: Any) -> dict[int, SolveRecord]:
    """The records of the solves decided for `Auto` operators in a traced program,
    read from its `linear_solve` equations (the prepared operator is part of the
    solver's state there, its pinned policy carrying the record), each once, in
    program order. A solve whose trace a jit cache served (no solver `init` ran
    for this program) is found here all the same; its line is then that of the
    top-level equation it is under.

    **Arguments:**

    - `jaxpr`: the program's top level, a `jax.extend.core.Jaxpr`.

    **Returns:**

    A dict: the `id` of each record carried -> the record (a copy with the line
    of the equation where that differs).
    """
    found: dict[int, SolveRecord] = {}
    for record, outer in _carried(jaxpr):
        if id(record) in found:
            continue
        site = equation_site(outer)
        found[id(record)] = (
            record if site == record.site else dataclasses.replace(record, site=site)
        )
    return found


def solve_sites(jaxpr: Any, record: SolveRecord) -> list[tuple[str, int]]:
    """The user's lines of every solve in a traced program that applies
    `record`'s decision: k solves of one operator kind share one trace of the
    solve (and one decision), so one record stands for all of them.

    **Arguments:**

    - `jaxpr`: the program's top level, a `jax.extend.core.Jaxpr`.
    - `record`: a solve record of the program (or a copy of one).

    **Returns:**

    A list of `(file, line)`, in program order.
    """
    return [
        equation_site(outer)
        for carried, outer in _carried(jaxpr)
        if carried.decision is record.decision
    ]


def add_carried_solves(jaxpr: Any, active: Session) -> None:
    """Adds to `active.solves` the records carried by `jaxpr`'s solves that its
    trace did not make (their traces were reused from an earlier program).

    **Arguments:**

    - `jaxpr`: the program's top level, a `jax.extend.core.Jaxpr`.
    - `active`: the session it was traced in.
    """
    made = {id(record) for record in active.solves}
    for original, record in carried_solves(jaxpr).items():
        if original not in made:
            active.solves.append(record)


def _is_carrier(node: Any) -> bool:
    return isinstance(node, (eqxi.Static, _Unkeyed))


def _refs_in(node: Any, kind: type) -> list[Any]:
    """The references of type `kind` carried below `node`, static values
    included (a solver's state keeps them in an `eqxi.Static`)."""
    found: list[Any] = []
    for leaf in jtu.tree_leaves(node, is_leaf=_is_carrier):
        if isinstance(leaf, eqxi.Static):
            found += _refs_in(leaf.value, kind)
        elif isinstance(leaf, kind):
            found.append(leaf)
    return found


def _choices_of(eqn: Any) -> tuple[list[SolverChoice], bool]:
    args = _static_args(eqn)
    refs = [] if args is None else _refs_in(args, ChoiceRef)
    return [ref.choice for ref in refs if ref.choice is not None], True


def carried_layouts(jaxpr: Any) -> list[tuple[Any, float]]:
    """The layouts of CG solves decided with `layout="auto"` in a traced program
    (at any depth), each a `LayoutRef`, with how many times the solve runs per
    run of the program (the trips of the loops around it).

    **Arguments:**

    - `jaxpr`: the program's top level, a `jax.extend.core.Jaxpr`.

    **Returns:**

    A list of `(LayoutRef, runs)`.
    """

    def find(eqn: Any) -> tuple[list[Any], bool]:
        args = _static_args(eqn)
        return ([] if args is None else _refs_in(args, LayoutRef)), True

    return finds_below(find, loop_trips)(jaxpr)


def add_carried_solver_choices(jaxpr: Any, active: Session) -> None:
    """Adds to `active.solver_choices` the `AutoSolver` choices carried by
    `jaxpr`'s solves that its trace did not make (their traces were reused from
    an earlier program), each once, in program order.

    **Arguments:**

    - `jaxpr`: the program's top level, a `jax.extend.core.Jaxpr`.
    - `active`: the session it was traced in.
    """
    seen = {id(choice) for choice in active.solver_choices}
    for choice, _ in finds_below(_choices_of)(jaxpr):
        if id(choice) not in seen:
            seen.add(id(choice))
            active.solver_choices.append(choice)


def _heavy_work(eqn: Any) -> tuple[list[Any], bool]:
    """`eqn` where it is heavy work (`_jaxpr.HEAVY`); a solve's loop is not a
    sub-program of its equation."""
    return ([eqn] if eqn.primitive in HEAVY else []), True


def _solve_copy_seconds(eqn: Any) -> tuple[float, Any] | None:
    """Seconds to compile one more copy of the solve `eqn` (its copy of `mv`, by
    the cost model, and its loop), with the model read: known for a solve of an
    `Auto` operator that applies `mv` lazily (or outlined), not for one that
    builds a matrix (k solves then share one build, before a rolled loop)."""
    records = _records_of(eqn)
    if len(records) != 1:
        return None
    record = records[0]
    if not isinstance(record.decision.policy, (Lazy, Outline)):
        return None
    model = record.operator.policy.model()
    cost = mv_cost(record.operator)
    seconds = model.compile_per_dot * cost.dots + model.compile_per_op * cost.ops
    return seconds + model.solve_copy, (model, record.operator.policy.runs)


def rolling_pays(callee: Any, k: int) -> bool:
    """Whether `lxd.jit` should roll k calls of `callee`, a repeated function of
    the user's with heavy work: unless that work is solves of `Auto` operators
    alone, yes; else where the k - 1 copies of the solves rolling saves take
    longer to compile than the rolled loop (`roll_fixed`, `roll_site` a call) and
    its `runs` runs (`roll_step` a call), by more than the model's margin for
    `Roll`. A solve of a cheap `mv` compiles in a
    few milliseconds more per copy, which rolling k of them costs more than.

    **Arguments:**

    - `callee`: the repeated function's traced program, a `ClosedJaxpr`.
    - `k`: its number of top-level calls.

    **Returns:**

    A bool.
    """
    copy, read = 0.0, None
    for eqn, _ in finds_below(_heavy_work)(callee.jaxpr):
        found = _solve_copy_seconds(eqn) if eqn.primitive is linear_solve_p else None
        if found is None:
            return True
        seconds, read = found
        copy += seconds
    if read is None:
        return True
    model, runs = read
    rolled = model.roll_fixed + k * (model.roll_site + runs * model.roll_step)
    return (k - 1) * copy > model.margin(Roll) * rolled
