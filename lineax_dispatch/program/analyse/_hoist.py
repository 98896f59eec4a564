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

import jax.extend.core as jex

from ..._compat import call_callee


# Work worth moving out of the loop: a dot product, a linear solve, a loop, a
# factorisation. (Cheap invariant code stays where it is: moving it would only
# keep its results alive across the loop.)
_HEAVY = frozenset(
    {
        "dot_general",
        "conv_general_dilated",
        "linear_solve",
        "while",
        "scan",
        "cholesky",
        "lu",
        "qr",
        "eigh",
        "svd",
        "triangular_solve",
        "fft",
    }
)


def heavy(eqn: Any) -> bool:
    """Whether `eqn` is, or holds at any depth, work of `_HEAVY`."""
    if eqn.primitive.name in _HEAVY:
        return True
    return any(heavy(e) for sub in jex.jaxprs_in_params(eqn.params) for e in sub.eqns)


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
    worth moving (no dot product or other heavy work in it), the call is not a
    `jit`, or its callee has effects (an effect runs at every step, as traced).

    **Arguments:**

    - `call`: the call's equation.
    - `varying`: the positions of its inputs that differ between call sites.

    **Returns:**

    A `Hoisted`, or `None`.
    """
    if call.primitive.name != "jit":
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
        reads_known = all(isinstance(v, jex.Literal) or v in known for v in eqn.invars)
        if reads_known and not eqn.effects:
            before.append(eqn)
            known.update(eqn.outvars)
        else:
            inside.append(eqn)
    if not any(heavy(eqn) for eqn in before):
        return None
    return Hoisted(callee, tuple(before), tuple(inside))
