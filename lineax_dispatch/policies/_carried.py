"""The solve records a traced program carries in its operators' pinned policies."""

import dataclasses
from typing import Any

import jax.extend.core as jex
import jax.tree_util as jtu

from ._pinned import carried_record
from ._registry import equation_site, Session, SolveRecord


def _has_record(node: Any) -> bool:
    return carried_record(getattr(node, "policy", None)) is not None


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
    seen: set[int] = set()

    def walk(sub: Any, top: Any) -> None:
        if id(sub) in seen:
            return
        seen.add(id(sub))
        for eqn in sub.eqns:
            outer = eqn if top is None else top
            if eqn.primitive.name == "linear_solve" and "treedef" in eqn.params:
                try:
                    args = jtu.tree_unflatten(
                        eqn.params["treedef"], eqn.params["static"]
                    )
                except Exception:  # a node of the user's that checks its leaves
                    args = ()
                for node in jtu.tree_leaves(args, is_leaf=_has_record):
                    record = carried_record(getattr(node, "policy", None))
                    if record is None or id(record) in found:
                        continue
                    site = equation_site(outer)
                    found[id(record)] = (
                        record
                        if site == record.site
                        else dataclasses.replace(record, site=site)
                    )
            for deeper in jex.jaxprs_in_params(eqn.params):
                walk(deeper, outer)

    walk(jaxpr, None)
    return found


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
