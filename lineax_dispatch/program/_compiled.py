"""What `lxd.jit` keeps per signature of its arguments (`Compiled`), and its
program (`Program`): the trace with its jaxpr rewritten, lowered and called as
`jax.jit` would."""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.extend.core as jex
import jax.tree_util as jtu

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
from .rewrite._rewrite import rewrite_program


class Compiled(NamedTuple):
    """What `lxd.jit` keeps per signature of its arguments: the program (a
    `Program`, lowered and called as a `jax.jit` would be), the output box, the
    decisions (per `Auto` operator kind) and the names of its marked calls.

    The program is lowered, compiled and called under the caller's jit-cache
    context, not the trace's own (`PASS_CONTEXT`): the decisions are fixed in the
    traced program by then, so the `jax.numpy` functions lineax calls when it
    lowers its solver reuse their traces from earlier programs."""

    program: "Program"
    box: OutputBox
    decisions: dict[Any, Decision]
    names: frozenset[str]


def _entry(closed: jex.ClosedJaxpr, consts: tuple, out_tree: Any) -> Callable:
    """The program `closed` as a function of `lxd.jit`'s traced argument halves,
    returning the output PyTree. `consts` are the values the function closes over
    from an enclosing trace: `jax.jit` puts those first in the program it traces
    there, and they are not arguments of the call."""
    run = jex.jaxpr_as_fun(closed)

    def entry(*dynamic_args, **dynamic_kwargs):
        leaves = jtu.tree_leaves((dynamic_args, dynamic_kwargs))
        return jtu.tree_unflatten(out_tree, run(*consts, *leaves))

    return entry


class Program:
    """The program of one signature, lowered and called as `jax.jit` would: the
    trace with its jaxpr replaced by the rewritten one, compiled (once) without
    tracing anything again. Its rolled calls are `lax.while_loop`s there (JAX
    lowers a `while` directly, a `scan` by tracing its `while` form again). Called
    under a trace (a transformation, an outer jit), it is the program rewritten
    with `lax.scan`s instead (a transformation may differentiate it in reverse
    mode, which needs a scan), rewritten at the first such call, as a function
    that the trace transforms.

    **Arguments:**

    - `traced`: the user's function's `jax.stages.Traced`.
    - `closed`: the traced program.
    - `actions`: the actions to rewrite it with (the rewrite is deterministic:
        the same groups, rewritten the same way, for either kind of loop).
    - `jit_kwargs`: the `jax.jit` arguments it is compiled with.
    """

    def __init__(
        self, traced: Any, closed: Any, actions: dict, jit_kwargs: dict[str, Any]
    ):
        rewritten = rewrite_program(closed, actions, "while")
        self.rewritten = rewritten is not closed
        self.jaxprs: dict[str, jex.ClosedJaxpr] = {"while": rewritten}
        self.consts = traced_consts(traced)
        if self.rewritten:
            spliced = with_jaxpr(traced, rewritten)
            if spliced is None:  # pragma: no cover - JAX changed
                raise ImportError(
                    "lineax_dispatch: `jax.stages.Traced` is not built as expected; "
                    "update `with_jaxpr` in `lineax_dispatch/_compat.py`."
                )
            traced = spliced
        self._traced = traced
        self._closed = closed
        self._actions = actions
        self._jit_kwargs = jit_kwargs
        self._compiled = None
        self._under_trace = None

    def jaxpr(self, loop: str) -> jex.ClosedJaxpr:
        """The program with its rolled calls as `loop`s (`"while"` or `"scan"`),
        rewritten at the first request."""
        closed = self.jaxprs.get(loop)
        if closed is None:
            closed = self.jaxprs["while"]
            if self.rewritten:
                closed = rewrite_program(self._closed, self._actions, loop)
            self.jaxprs[loop] = closed
        return closed

    def lower(self, *args, **kwargs):
        del args, kwargs  # the signature the trace was made for
        return self._traced.lower()

    def __call__(self, *args, **kwargs):
        if root_trace_ref() is not None:
            if self._under_trace is None:
                entry = _entry(self.jaxpr("scan"), self.consts, self._traced.out_tree)
                self._under_trace = unpatched_jit()(entry, **self._jit_kwargs)
            return self._under_trace(*args, **kwargs)
        if self._compiled is None:
            self._compiled = self._traced.lower().compile()
        return self._compiled(*args, **kwargs)


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
    traced = trace.traced
    program = Program(traced, traced.jaxpr, plan.actions, jit_kwargs)
    names = frozenset(trace.session.by_name())
    compiled = Compiled(program, trace.box, plan.decisions, names)
    return compiled, not any(is_tracer(c) for c in program.consts)
