"""Materialise across a program: the k top-level call sites of an operator's `mv`
share ONE dense matrix, built just before the first of them (where the operator's
arrays are defined), and each site becomes a matrix-vector product."""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.flatten_util as jfu
import jax.lax as lax
import jax.numpy as jnp

from ..._compat import bind_equation
from ...policies._dense import _flat_spec, dense_mv
from ._interpret import eval_eqns, prologue


def _specs(avals: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]


def materialised_function(
    closed: Any, sites: Sequence[int], arrays: int, batch_size: int | None
) -> Callable:
    """The program `closed` with the marked calls at `sites` applied through one
    matrix, as a function of the jaxpr's inputs returning its outputs (a flat
    list).

    **Arguments:**

    - `closed`: the program, a `ClosedJaxpr`.
    - `sites`: indices of the calls (of one computation, with the same operator
        arrays) at its top level.
    - `arrays`: how many of the call's inputs are the operator's arrays; the
        others are the vector's leaves.
    - `batch_size`: columns built together (`None`: all at once).

    **Returns:**

    A function `(*inputs) -> list of outputs`.
    """
    jaxpr = closed.jaxpr
    eqns = jaxpr.eqns
    sites = sorted(sites)
    call = eqns[sites[0]]
    in_specs = _specs([v.aval for v in call.invars[arrays:]])
    out_specs = _specs([v.aval for v in call.outvars])
    flat_in, unravel_in = _flat_spec(in_specs)
    size = flat_in.size
    site_set = set(sites)

    def read(env: dict, v: Any) -> Any:
        return v.val if isinstance(v, jex.Literal) else env[v]

    def run(*inputs):
        env = prologue(closed, inputs, sites[0])
        fixed = [read(env, v) for v in call.invars[:arrays]]

        def column(index):
            # The basis vector is made inside the chunk: no identity in memory.
            basis = (jnp.arange(size) == index).astype(flat_in.dtype)
            outs = bind_equation(call, [*fixed, *unravel_in(basis)])
            return jfu.ravel_pytree(outs)[0]

        indices = jnp.arange(size)
        if batch_size is None or batch_size >= size:
            columns = jax.vmap(column)(indices)
        else:
            columns = lax.map(column, indices, batch_size=batch_size)
        matrix = columns.T
        for index in range(sites[0], len(eqns)):
            eqn = eqns[index]
            if index not in site_set:
                eval_eqns([eqn], env)
                continue
            vector = [read(env, v) for v in eqn.invars[arrays:]]
            outs = dense_mv(matrix, vector, out_specs)
            for var, value, spec in zip(eqn.outvars, outs, out_specs):
                if not isinstance(var, jex.DropVar):
                    env[var] = value.astype(spec.dtype)
        return [read(env, v) for v in jaxpr.outvars]

    return run
