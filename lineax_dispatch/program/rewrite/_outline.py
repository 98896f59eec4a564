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
from ..._jaxpr import specs_of
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
    eqns = []
    changed = False
    for eqn in jaxpr.eqns:
        if eqn.primitive is prims.jit_p and call_callee(eqn) is old:
            if new is None:
                eqn = outlined_call(eqn)
            else:
                eqn = eqn.replace(params={**eqn.params, "jaxpr": new})
            changed = True
        else:
            params = {k: _in_param(v, old, new) for k, v in eqn.params.items()}
            if any(params[k] is not v for k, v in eqn.params.items()):
                eqn = eqn.replace(params=params)
                changed = True
        eqns.append(eqn)
    return jaxpr.replace(eqns=eqns) if changed else jaxpr


def _in_param(value: Any, old: Any, new: Any) -> Any:
    if isinstance(value, jex.ClosedJaxpr):
        inner = _substitute(value.jaxpr, old, new)
        return value if inner is value.jaxpr else jex.ClosedJaxpr(inner, value.consts)
    if isinstance(value, jex.Jaxpr):
        return _substitute(value, old, new)
    if isinstance(value, tuple):
        items = tuple(_in_param(v, old, new) for v in value)
        return value if all(a is b for a, b in zip(items, value)) else items
    return value


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
