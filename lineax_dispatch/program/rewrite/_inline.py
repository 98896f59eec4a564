"""Inline: the calls of a group applied inline put their callees' equations in the
program, as `jax.jit(..., inline=True)` would have traced them (lineax's way: no
call to lower and compile)."""

from collections.abc import Sequence
from typing import Any

import jax.extend.core as jex

from ..._compat import call_callee
from ._interpret import eval_eqns, read


def inlined_jaxpr(closed: Any, sites: Sequence[int]) -> jex.ClosedJaxpr:
    """The program `closed` with the calls at `sites` (top-level indices) replaced
    by their callees' equations, spliced in with fresh variables (as `jax.jit(...,
    inline=True)` would have traced them); a callee's constants become constants
    of the program.

    **Arguments:**

    - `closed`: the program, a `ClosedJaxpr`.
    - `sites`: indices of calls at its top level.

    **Returns:**

    A `ClosedJaxpr` with `closed`'s inputs and outputs.
    """
    jaxpr = closed.jaxpr
    inline = set(sites)
    constvars, consts = list(jaxpr.constvars), list(closed.consts)
    eqns: list = []

    def rule(index: int, eqn: Any, invars: list) -> list:
        if index in inline:
            return _splice(call_callee(eqn), invars, eqns, constvars, consts)
        changed = any(a is not b for a, b in zip(invars, eqn.invars))
        eqns.append(eqn.replace(invars=invars) if changed else eqn)
        return eqn.outvars

    # Evaluated on atoms: each outer variable stands for itself, but a call's
    # outputs, which stand for what its callee's equations computed.
    env = {v: v for v in [*jaxpr.constvars, *jaxpr.invars]}
    eval_eqns(jaxpr.eqns, env, _own_atom, rule)
    outvars = [read(env, v, _same) for v in jaxpr.outvars]
    spliced = jaxpr.replace(constvars=constvars, eqns=eqns, outvars=outvars)
    return jex.ClosedJaxpr(spliced, consts)


def _same(atom: Any) -> Any:
    return atom


def _own_atom(i: int, q: int, atom: Any) -> Any:
    return atom


def _splice(closed_callee, invars, eqns: list, constvars: list, consts: list):
    """Appends to `eqns` the equations of a callee called on the atoms `invars`,
    with fresh variables (its constants new constants of the program, appended to
    `constvars` and `consts`); returns the atoms standing for its outputs."""
    callee = closed_callee.jaxpr
    env = dict(zip(callee.invars, invars))
    for inner, value in zip(callee.constvars, closed_callee.consts):
        env[inner] = jex.Var(inner.aval)
        constvars.append(env[inner])
        consts.append(value)

    def fresh(i: int, eqn: Any, inner_invars: list) -> list:
        outvars = [
            jex.DropVar(v.aval) if isinstance(v, jex.DropVar) else jex.Var(v.aval)
            for v in eqn.outvars
        ]
        eqns.append(eqn.replace(invars=inner_invars, outvars=outvars))
        return outvars

    eval_eqns(callee.eqns, env, _own_atom, fresh)
    return [read(env, v, _same) for v in callee.outvars]
