"""The trace stage of `lxd.jit`: the user's function traced to a program, in a
session of its own, once (twice only where solves are better decided together,
where a CG solve's layout changes counting the loops around it, or where the trace
reused another program's nested trace of an `Auto` operator)."""

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from .._compat import current_trace
from ..policies.calls._recorder import Hints
from ._arguments import Arguments, OutputBox
from ._decide import layout_hints, shared_solve_hints
from ._errors import unpatched_jit
from ._session import (
    PASS_CONTEXT,
    retire_shared_context,
    Session,
    session,
    shared_context,
)
from .analyse._groups import foreign_marked_calls
from .analyse._solves import add_carried_solver_choices, add_carried_solves


@dataclasses.dataclass
class Trace:
    """One trace of the user's function: the traced stage (`jax.stages.Traced`),
    the box its output's static leaves were kept in, and the session it was traced
    in (its records)."""

    traced: Any
    box: OutputBox
    session: Session


def _traceable(fun: Callable, split: Arguments, box: OutputBox, active: Session):
    """`fun` as a function of the traced halves of its arguments (its trace noted
    as `active`'s own)."""

    def traced(*dynamic_args, **dynamic_kwargs):
        active.top = current_trace()
        args, kwargs = split.rebuild(dynamic_args, dynamic_kwargs)
        return box.store(fun(*args, **kwargs))

    return traced


def _trace_once(
    fun: Callable, jit_kwargs: dict[str, Any], split: Arguments, hints: Hints
) -> Trace:
    """One trace of `fun` in a session of its own, told `hints` (see
    `shared_solve_hints` and `layout_hints`): under the shared jit-cache context
    (see `shared_context`), or one of its own when told hints (its solves must be
    decided again, not taken from the trace before)."""
    active = Session(hints=hints)
    box = OutputBox()
    jitted = unpatched_jit()(_traceable(fun, split, box, active), **jit_kwargs)
    context = ("lxd.jit", active.token) if hints else shared_context()
    try:
        with session(active), PASS_CONTEXT(context):
            traced = jitted.trace(*split.dynamic_args, **split.dynamic_kwargs)
    except BaseException:
        retire_shared_context()  # what the failed trace left cached is unknown
        raise
    if active.nested_records:
        retire_shared_context()
    add_carried_solves(traced.jaxpr.jaxpr, active)
    add_carried_solver_choices(traced.jaxpr.jaxpr, active)
    return Trace(traced, box, active)


def _trace_own(
    fun: Callable, jit_kwargs: dict[str, Any], split: Arguments, hints: Hints
) -> Trace:
    """`_trace_once`, made again where the trace reused another program's nested
    trace of an `Auto` operator (`foreign_marked_calls`): the shared context is
    retired first, so that the second trace is the program's own."""
    trace = _trace_once(fun, jit_kwargs, split, hints)
    if foreign_marked_calls(trace.traced.jaxpr.jaxpr, trace.session):
        retire_shared_context()
        trace = _trace_once(fun, jit_kwargs, split, hints)
    return trace


def trace_program(fun: Callable, jit_kwargs: dict[str, Any], split: Arguments) -> Trace:
    """Traces `fun` for these arguments. Solves repeated with the same operator
    that are better decided together (one matrix build for all), and CG solves
    whose layout changes counting the trips of the loops around them, are traced
    once more, told so.

    **Arguments:**

    - `fun`: the user's function.
    - `jit_kwargs`: the `jax.jit` arguments it is traced with.
    - `split`: its arguments, split into traced and static halves.

    **Returns:**

    A `Trace`.
    """
    start = time.perf_counter()
    trace = _trace_own(fun, jit_kwargs, split, Hints())
    jaxpr = trace.traced.jaxpr.jaxpr
    hints = Hints(
        solves=shared_solve_hints(jaxpr, trace.session),
        layouts=layout_hints(jaxpr, time.perf_counter() - start),
    )
    if hints:
        trace = _trace_own(fun, jit_kwargs, split, hints)
    return trace
