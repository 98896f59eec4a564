"""Leak checks that tell our leaks from upstream ones.

On jax >= 0.11 a jaxpr carries the values of its constants (`ClosedJaxpr` and
`Jaxpr` are one class). `equinox.filter_closure_convert` (which lineax's
`FunctionLinearOperator` and `JacobianLinearOperator`, and lineax's transposes,
use) keeps that jaxpr in the operator's static part, so a closure-converted function
made under a trace holds that trace's tracers, and equinox's cache of
`filter_eval_shape` (keyed by static parts) keeps them alive after the trace:
`jax.checking_leaks()` reports a leak for lineax alone, with no code of ours
(`tests/test_compat.py::test_closure_converted_jaxprs_and_their_constants` shows
the cause on each JAX). `leak_checked` runs a program of ours under
`jax.checking_leaks()`; only where it leaks does it run the same program with
lineax alone, checked the same way, and only where that leaks too is ours let
through (run again unchecked). Everywhere else a leak fails the test.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax


def _is_leak_report(error: BaseException) -> bool:
    """Whether `error` is `jax.checking_leaks()`'s report of a leak (or jax 0.10's
    report failing while it describes one: an error inside `leaked_tracer_error`)."""
    if "Leaked" in str(error):
        return True
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "leaked_tracer_error":
            return True
        tb = tb.tb_next
    return False


@contextlib.contextmanager
def _checking_leaks() -> Iterator[None]:
    """`jax.checking_leaks()`, with JAX's traceback filtering off: filtered (as
    under pytest), a report that fails while it describes a leak loses the frame
    that `_is_leak_report` reads."""
    mode = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")
    try:
        with jax.checking_leaks():
            yield
    finally:
        jax.config.update("jax_traceback_filtering", mode)


def _leaks(run: Callable[[], Any]) -> bool:
    try:
        with _checking_leaks():
            run()
    except Exception as error:  # jax raises a plain Exception
        if _is_leak_report(error):
            return True
        raise
    return False


def leak_checked(run: Callable[[], Any], lineax_alone: Callable[[], Any]) -> Any:
    """`run()` under `jax.checking_leaks()`; where it leaks, accepted only if
    `lineax_alone()` (the same program with plain lineax only) leaks too on this
    JAX (see the module's docstring), and then run again unchecked.

    **Arguments:**

    - `run`: the program with lineax-dispatch.
    - `lineax_alone`: the same program with plain lineax.

    **Returns:**

    What `run` returns.
    """
    try:
        with _checking_leaks():
            return run()
    except Exception as error:
        if not _is_leak_report(error) or not _leaks(lineax_alone):
            raise
    return run()
