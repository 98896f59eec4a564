"""Leak checks that tell our leaks from upstream ones.

On jax >= 0.11 a jaxpr carries the values of its constants (`ClosedJaxpr` and
`Jaxpr` are one class). `equinox.filter_closure_convert` (which lineax's
`FunctionLinearOperator` and `JacobianLinearOperator`, and lineax's transposes,
use) keeps that jaxpr in the operator's static part, so a closure-converted function
made under a trace holds that trace's tracers, and equinox's cache of
`filter_eval_shape` (keyed by static parts) keeps them alive after the trace:
`jax.checking_leaks()` reports a leak for lineax alone, with no code of ours
(`tests/test_compat.py::test_closure_converted_jaxprs_and_their_constants` shows
the cause on each JAX). Where the same program with plain lineax leaks so, the
program with ours cannot be checked by `jax.checking_leaks()`; everywhere else it
is.
"""

import contextlib
from collections.abc import Callable
from typing import Any

import jax


def run_plain(run: Callable[[], Any]) -> tuple[Any, bool]:
    """Runs `run` (a program using plain lineax only) under `jax.checking_leaks()`:
    `(its result, whether lineax alone leaked)`. Where it leaked, the result comes
    from running it again unchecked."""
    try:
        with jax.checking_leaks():
            return run(), False
    except Exception as error:  # jax raises a plain Exception
        if "Leaked" not in str(error):
            raise
    return run(), True


def leak_check(lineax_alone_leaks: bool) -> contextlib.AbstractContextManager:
    """`jax.checking_leaks()`, unless the same program with plain lineax leaks on
    this JAX (see the module's docstring): then no check.

    **Arguments:**

    - `lineax_alone_leaks`: from `run_plain` of the plain-lineax program.
    """
    return contextlib.nullcontext() if lineax_alone_leaks else jax.checking_leaks()
