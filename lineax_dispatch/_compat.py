"""Every use of a private JAX or equinox name, in one place, so that an upstream
move breaks here (and in `tests/test_compat.py`) rather than anywhere."""

import weakref
from typing import Any

from jax._src import core as _jax_core, source_info_util as _source_info


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


def bind_equation(eqn: Any, invals: list) -> list:
    """Binds one jaxpr equation to `invals` as `jax.core.eval_jaxpr` does (its
    source information and context kept), returning its outputs as a list.

    **Arguments:**

    - `eqn`: a `jax.extend.core.JaxprEqn`.
    - `invals`: its input values.

    **Returns:**

    The list of output values.
    """
    params = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(params, tuple):  # older jax: (subfuns, params)
        subfuns, params = params
        invals = [*subfuns, *invals]
    name_stack = _source_info.current_name_stack() + eqn.source_info.name_stack
    with (
        _source_info.user_context(eqn.source_info.traceback, name_stack=name_stack),
        eqn.ctx.manager,
    ):
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def traceback_frames(eqn: Any) -> list[tuple[str, int]]:
    """The frames of the traceback recorded with a jaxpr equation, outermost first,
    as `(file name, line)`, without JAX's own frames.

    **Arguments:**

    - `eqn`: a `jax.extend.core.JaxprEqn`.

    **Returns:**

    A list of `(str, int)`.
    """
    traceback = eqn.source_info.traceback
    if traceback is None:
        return []
    frames = list(_source_info.user_frames(traceback))
    # `user_frames` yields the innermost first.
    return [(frame.file_name, frame.start_line) for frame in reversed(frames)]
