"""Loop-invariant code of a rolled call: the part of the callee that reads only the
inputs that are the same at every call site (an operator's arrays, say) runs once,
before the loop, instead of once per step.

This is what XLA's common-subexpression elimination does for the k inline copies
under `jax.jit` (k solves of one materialised operator build its matrix once), and
what a loop body would otherwise lose: the k steps of a rolled loop each run the
whole callee. XLA's own loop-invariant code motion does not move such code out of
the loop on CPU (16 solves of one materialised operator, rolled, built the matrix
16 times)."""

import dataclasses
from typing import Any

import jax.extend.core.primitives as prims

from ..._compat import call_callee
from ..._jaxpr import heavy, is_literal


@dataclasses.dataclass(frozen=True)
class Hoisted:
    """A rolled call's callee split in two.

    **Fields:**

    - `callee`: the callee, a `ClosedJaxpr`.
    - `before`: its equations that read only invariant inputs (run once, before
        the loop).
    - `inside`: the others, in order (run at each step).
    """

    callee: Any
    before: tuple[Any, ...]
    inside: tuple[Any, ...]


def split_invariant(call: Any, varying: tuple[int, ...]) -> Hoisted | None:
    """The invariant part of a rolled `jit` call, or `None` when there is none
    worth moving (no dot product or other heavy work in it: `_jaxpr.HEAVY`), the
    call is not a `jit`, or its callee has effects (an effect runs at every step,
    as traced).

    **Arguments:**

    - `call`: the call's equation.
    - `varying`: the positions of its inputs that differ between call sites.

    **Returns:**

    A `Hoisted`, or `None`.
    """
    if call.primitive is not prims.jit_p:
        return None
    callee = call_callee(call)
    if callee.effects:
        return None
    jaxpr = callee.jaxpr
    varying_vars = {jaxpr.invars[p] for p in varying}
    known = {v for v in jaxpr.invars if v not in varying_vars}
    known.update(jaxpr.constvars)
    before, inside = [], []
    for eqn in jaxpr.eqns:
        reads_known = all(is_literal(v) or v in known for v in eqn.invars)
        if reads_known and not eqn.effects:
            before.append(eqn)
            known.update(eqn.outvars)
        else:
            inside.append(eqn)
    if not any(heavy(eqn) for eqn in before):
        return None
    return Hoisted(callee, tuple(before), tuple(inside))
