"""The trace scope: which trace a decided policy is pinned to, so that a marked
call made in that trace is told apart from one made in another."""

import contextlib
import contextvars
from collections.abc import Iterator

from ..._compat import root_trace_ref
from ._keys import HashedKey


class TraceScope(HashedKey):
    """The outermost trace a call is traced in (the `jax.jit` trace whose loop
    bodies, nested jits, JVP and batching traces hold the call), as a hashable key:
    by identity, through a weak reference (its value), so a finished trace is not
    kept alive.

    A compiled callee is cached by its static part, functions included; a function
    may read Python state that changes between traces (a global, a closed-over
    list), so sharing one callee between traces could return results computed from
    old state where lineax, tracing afresh, sees the new. Keyed by the trace, every
    call site of one trace shares one callee and a new trace compiles its own.
    """


# The scope a solve's operator is pinned to (see `pinned_scope`). A context
# variable: lineax's solve calls `mv` in traces of its own, with no argument to carry it.
_PINNED: contextvars.ContextVar[TraceScope | None] = contextvars.ContextVar(
    "lineax_dispatch_pinned_scope", default=None
)


def current_scope() -> TraceScope | None:
    """The scope of the current trace (or the one pinned by `pinned_scope`), or
    `None` outside any trace (eager)."""
    root = root_trace_ref()
    if root is None:
        return None
    pinned = _PINNED.get()
    return TraceScope(root) if pinned is None else pinned


@contextlib.contextmanager
def pinned_scope(scope: TraceScope | None) -> Iterator[None]:
    """Within this context, traces count as part of the trace `scope`.

    A solve bound in one trace is abstractly evaluated and lowered in traces of
    their own (lineax's `linear_solve` primitive traces its solver there); they are
    parts of the same program, so its operator's marked callee, traced for the
    solve's decision, is shared with them rather than traced again.

    **Arguments:**

    - `scope`: the trace to count as (`None`: no change).
    """
    if scope is None:
        yield
        return
    token = _PINNED.set(scope)
    try:
        yield
    finally:
        _PINNED.reset(token)
