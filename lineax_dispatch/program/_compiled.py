"""What `lxd.jit` keeps per signature of its arguments (`Compiled`), and the two
forms of its program: the trace itself where nothing was rewritten (`_AsTraced`),
or the rewritten program (`_Rewritten`), lowered and called as `jax.jit` would."""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.extend.core as jex

from .._compat import (
    is_tracer,
    root_trace_ref,
    traced_consts,
    with_jaxpr,
)
from ..policies.decision._records import Decision
from ._arguments import OutputBox
from ._decide import Plan
from ._errors import unpatched_jit
from ._trace import Trace
from .rewrite._rewrite import rewrite_program, rolled_entry


class Compiled(NamedTuple):
    """What `lxd.jit` keeps per signature of its arguments: the program (the trace
    as it is, `_AsTraced`, or rewritten, `_Rewritten`: each lowered and called as
    a `jax.jit` would be), the output box, the decisions (per `Auto` operator
    kind) and the names of its marked calls.

    The program is lowered, compiled and called under the caller's jit-cache
    context, not the trace's own (`PASS_CONTEXT`): the decisions are fixed in the
    traced program by then, so the `jax.numpy` functions lineax calls when it
    lowers its solver reuse their traces from earlier programs."""

    program: Any
    box: OutputBox
    decisions: dict[Any, Decision]
    names: frozenset[str]


def _with_consts(run: Callable, consts: tuple) -> Callable:
    """`run` (a function of the traced program's inputs) with its first inputs,
    the values the function closes over from an enclosing trace, given: `jax.jit`
    puts those first in the program it traces there, and they are not arguments
    of the call."""
    return functools.partial(run, *consts) if consts else run


class _AsTraced:
    """A program with nothing to rewrite: the trace itself, lowered and compiled
    (once) as `jax.jit` would, without evaluating its jaxpr again."""

    def __init__(self, traced: Any, jit_kwargs: dict[str, Any]):
        self._traced = traced
        self._jit_kwargs = jit_kwargs
        self._compiled = None
        self._jitted = None

    def lower(self, *args, **kwargs):
        del args, kwargs  # the signature the trace was made for
        return self._traced.lower()

    def __call__(self, *args, **kwargs):
        if root_trace_ref() is not None:
            # Called under a trace (a transformation, an outer jit): the program
            # as a function of its arguments, which the trace then transforms.
            if self._jitted is None:
                run = _with_consts(
                    jex.jaxpr_as_fun(self._traced.jaxpr), traced_consts(self._traced)
                )
                entry = rolled_entry(run, self._traced.out_tree)
                self._jitted = unpatched_jit()(entry, **self._jit_kwargs)
            return self._jitted(*args, **kwargs)
        if self._compiled is None:
            self._compiled = self._traced.lower().compile()
        return self._compiled(*args, **kwargs)


class _Rewritten:
    """A rewritten program: its rolled calls as `lax.while_loop`s where it is
    lowered or called as it is (JAX lowers a `while` directly, a `scan` by tracing
    its `while` form again), as `lax.scan`s where it is called under a trace (a
    transformation may differentiate it in reverse mode, which needs a scan),
    that version rewritten from the traced program at the first such call.

    **Arguments:**

    - `run`: the program rewritten with `"while"` loops (a function of its flat
        inputs).
    - `closed`, `actions`: the traced program and the actions it was rewritten
        with (the rewrite is deterministic: the same groups, as a function).
    - `out_tree`, `jit_kwargs`: the output structure and `jax.jit`'s arguments.
    - `consts`: the values the function closes over from an enclosing trace (the
        program's first inputs; see `_with_consts`).
    """

    def __init__(
        self,
        run: Callable,
        closed: Any,
        actions: dict,
        out_tree: Any,
        jit_kwargs: dict[str, Any],
        consts: tuple = (),
    ):
        self._consts = consts
        self._runs: dict[str, Any] = {"while": run}
        self._closed = closed
        self._actions = actions
        self._out_tree = out_tree
        self._jit_kwargs = jit_kwargs
        self._jitted: dict[str, Any] = {}

    def _program(self, loop: str) -> Any:
        jitted = self._jitted.get(loop)
        if jitted is None:
            run = self._runs.get(loop)
            if run is None:
                run = rewrite_program(self._closed, self._actions, loop)
                if isinstance(run, jex.ClosedJaxpr):  # calls put inline only
                    run = jex.jaxpr_as_fun(run)
                if not callable(run):  # pragma: no cover - deterministic rewrite
                    raise RuntimeError("the program's rewrites differ.")
            entry = rolled_entry(_with_consts(run, self._consts), self._out_tree)
            jitted = self._jitted[loop] = unpatched_jit()(entry, **self._jit_kwargs)
        return jitted

    def lower(self, *args, **kwargs):
        return self._program("while").lower(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        loop = "while" if root_trace_ref() is None else "scan"
        return self._program(loop)(*args, **kwargs)


def compile_program(
    trace: Trace, plan: Plan, jit_kwargs: dict[str, Any]
) -> tuple[Compiled, bool]:
    """The traced program rewritten with `plan`'s actions, as it is lowered and
    called: the traced (or rewritten) program is compiled as it is, and the user's
    function is not traced again.

    **Arguments:**

    - `trace`: the program's trace.
    - `plan`: the decide stage's plan for it.
    - `jit_kwargs`: the `jax.jit` arguments it is compiled with.

    **Returns:**

    `(compiled, reusable)`: `reusable` is false where the program closes over
    another trace's values (its tracers) and so serves that trace only: it is
    traced again for the next, as `jax.jit` does.
    """
    traced, closed = trace.traced, trace.traced.jaxpr
    run = rewrite_program(closed, plan.actions, "while")
    if isinstance(run, jex.ClosedJaxpr):  # calls put inline, or nothing rewritten
        spliced = with_jaxpr(traced, run)
        if spliced is None:  # pragma: no cover - JAX changed
            run = jex.jaxpr_as_fun(run)
        else:
            traced, run = spliced, None
    consts = traced_consts(traced)
    if run is None:
        program: Any = _AsTraced(traced, jit_kwargs)
    else:
        program = _Rewritten(
            run, closed, plan.actions, traced.out_tree, jit_kwargs, consts
        )
    names = frozenset(trace.session.by_name())
    compiled = Compiled(program, trace.box, plan.decisions, names)
    return compiled, not any(is_tracer(c) for c in consts)
