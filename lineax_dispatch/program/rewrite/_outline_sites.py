"""Outline across a program: the call sites of an operator's `mv` that rolling cannot
reach (in loop bodies, branches, other calls) call ONE separately compiled `mv`, as
the `Outline` policy does, however deep they are: on jax >= 0.11 each site's call
is marked for XLA to compile its callee once and keep it out of line
(`jax.Inline.XLA_LATE`); on jax 0.10 its callee becomes a host callback
(`equinox.internal.noinline`). Each site's equation keeps its inputs and
outputs."""

from typing import Any

import equinox.internal as eqxi
import jax
import jax.extend.core as jex
import jax.extend.core.primitives as prims

from ..._compat import call_callee, outlined_call, XLA_OUTLINE
from ..._jaxpr import map_equations, specs_of
from ...policies._outline import _AbstractMv, check_outline_runs, JaxprMv


def outlined_callee(callee: Any, arrays: int) -> Any:
    """A callee doing what `callee` does through one out-of-line call.

    **Arguments:**

    - `callee`: a marked call's callee, a `ClosedJaxpr` of the operator's arrays
        and the vector's leaves.
    - `arrays`: how many of its inputs are the operator's arrays.

    **Returns:**

    A `ClosedJaxpr` with the same inputs and outputs.
    """
    check_outline_runs()
    structure = tuple(specs_of(callee.jaxpr.outvars))
    abstract = _AbstractMv(structure)

    def outlined(*flat):
        mv = JaxprMv(tuple(flat[:arrays]), callee)
        return list(eqxi.noinline(mv, abstract)(tuple(flat[arrays:])))

    return jax.make_jaxpr(outlined)(*specs_of(callee.jaxpr.invars))


def _substitute(jaxpr: Any, old: Any, new: Any) -> Any:
    """`jaxpr` with every `jit` call of `old` (at any depth) calling `new`, or, for
    `new` `None`, marked to stay out of line (`outlined_call`)."""

    def calling_new(eqn: Any) -> Any:
        if eqn.primitive is not prims.jit_p or call_callee(eqn) is not old:
            return None
        if new is None:
            return outlined_call(eqn)
        return eqn.replace(params={**eqn.params, "jaxpr": new})

    return map_equations(jaxpr, calling_new)


def outline_group(closed: Any, callee: Any, arrays: int) -> Any:
    """`closed` (a `ClosedJaxpr`) with every call of `callee`, at any depth, made
    through one out-of-line call.

    **Arguments:**

    - `closed`: the program.
    - `callee`: the calls' callee (the group's).
    - `arrays`: how many of its inputs are the operator's arrays.

    **Returns:**

    The rewritten program, a `ClosedJaxpr`.
    """
    new = None if XLA_OUTLINE is not None else outlined_callee(callee, arrays)
    return jex.ClosedJaxpr(_substitute(closed.jaxpr, callee, new), closed.consts)
