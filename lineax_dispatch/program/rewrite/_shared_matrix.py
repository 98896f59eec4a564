"""Materialise across a program: the k top-level call sites of an operator's `mv`
share ONE dense matrix, built just before the first of them (where the operator's
arrays are defined), and each site becomes a matrix-vector product."""

from collections.abc import Callable, Sequence
from typing import Any

import jax.extend.core as jex

from ..._compat import bind_equation
from ..._jaxpr import specs_of
from ..._precision import batched_products, traced_precision
from ...policies._dense import dense_mv, matrix_of
from ._interpret import eval_eqns, prologue, read, read_by


def _site_rule(sites: set[int], start: int, matrix: Any, arrays: int, specs) -> Any:
    """The interpreter's rule for the equations from index `start` on: each call at
    `sites` applied as `matrix` (its vector: the call's inputs after the first
    `arrays`), its outputs of the dtypes of `specs`; the others bound."""

    def rule(i: int, eqn: Any, invals: list) -> list | None:
        if start + i not in sites:
            return None
        outs = dense_mv(matrix, invals[arrays:], specs)
        return [
            value if isinstance(var, jex.DropVar) else value.astype(spec.dtype)
            for var, value, spec in zip(eqn.outvars, outs, specs)
        ]

    return rule


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
    start = min(sites)
    call = jaxpr.eqns[start]
    in_specs = specs_of(call.invars[arrays:])
    out_specs = specs_of(call.outvars)

    def run(*inputs):
        env = prologue(closed, inputs, start)
        fixed = [read(env, v) for v in call.invars[:arrays]]
        # The basis vectors go through the call together: its products at the
        # precision one call has (`_precision`).
        with batched_products():
            exact = traced_precision(call)
        mv = lambda vector: bind_equation(exact, [*fixed, *vector])
        # The matrix is built where the operator's arrays are defined: before the
        # first site.
        matrix = matrix_of(mv, in_specs, batch_size)
        rule = _site_rule(set(sites), start, matrix, arrays, out_specs)
        keep = read_by((), jaxpr.outvars)
        eval_eqns(jaxpr.eqns[start:], env, rule=rule, keep=keep)
        return [read(env, v) for v in jaxpr.outvars]

    return run
