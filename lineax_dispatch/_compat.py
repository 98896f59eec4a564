"""Every use of a private JAX or equinox name, in one place, so that an upstream
move breaks here (and in `tests/test_compat.py`) rather than anywhere."""

import weakref
from typing import Any

from jax._src import core as _jax_core


def root_trace_ref() -> "weakref.ref | None":
    """A weak reference to the outermost trace of the current computation: the
    trace the current one was started from, followed up to the one started from
    eager evaluation. Every sub-trace of one `jax.jit` trace (loop bodies, nested
    jits, JVP and batching traces) has the same root. `None` outside any trace.

    **Returns:**

    A `weakref.ref` to the trace, or `None`.
    """
    trace: Any = _jax_core.trace_ctx.trace
    if trace is None or isinstance(trace, _jax_core.EvalTrace):
        return None
    while True:
        parent = getattr(trace, "parent_trace", None)
        if parent is None or isinstance(parent, _jax_core.EvalTrace):
            return trace._weakref
        trace = parent
