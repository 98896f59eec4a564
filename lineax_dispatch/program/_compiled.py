"""What `lxd.jit` keeps per signature of its arguments (`Compiled`), and its
program (`Program`): the trace with its jaxpr rewritten, lowered and called as
`jax.jit` would."""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.extend.core as jex
import jax.tree_util as jtu

from .._compat import (
    calls_back_to_host,
    is_tracer,
    root_trace_ref,
    traced_consts,
    with_jaxpr,
)
from ..policies.decision._records import Decision
from ._arguments import OutputBox
from ._call_convention import CallConvention
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
    mode, which needs a scan), as a function that the trace transforms. Each form
    is rewritten when first needed.

    **Arguments:**

    - `traced`: the user's function's `jax.stages.Traced`.
    - `actions`: the actions to rewrite its program with (the rewrite is
        deterministic: the same groups, rewritten the same way, for either kind of
        loop).
    - `jit_kwargs`: the `jax.jit` arguments it is compiled with.

    **Attributes:**

    - `jaxprs`: the forms rewritten so far, by kind of loop (`"while"`, `"scan"`).
    - `consts`: the values the function closes over from an enclosing trace.
    """

    def __init__(self, traced: Any, actions: dict, jit_kwargs: dict[str, Any]):
        self._traced = traced
        self._actions = actions
        self._jit_kwargs = jit_kwargs
        self.consts = traced_consts(traced)
        self.jaxprs: dict[str, jex.ClosedJaxpr] = {}
        self._compiled = None
        self._callbacks = True
        self._under_trace = None

    def jaxpr(self, loop: str) -> jex.ClosedJaxpr:
        """The program with its rolled calls as `loop`s (`"while"` or `"scan"`):
        the traced program itself where nothing is rewritten."""
        closed = self.jaxprs.get(loop)
        if closed is None:
            closed = rewrite_program(self._traced.jaxpr, self._actions, loop)
            self.jaxprs[loop] = closed
        return closed

    @property
    def rewritten(self) -> bool:
        """Whether the program as compiled differs from the trace."""
        return self.jaxpr("while") is not self._traced.jaxpr

    def _jitted(self, closed: jex.ClosedJaxpr) -> Any:
        entry = _entry(closed, self.consts, self._traced.out_tree)
        return unpatched_jit()(entry, **self._jit_kwargs)

    def lower(self, *args, **kwargs):
        if not self.rewritten:
            return self._traced.lower()
        spliced = with_jaxpr(self._traced, self.jaxpr("while"))
        if spliced is None:  # pragma: no cover - JAX changed: trace it again
            return self._jitted(self.jaxpr("while")).lower(*args, **kwargs)
        return spliced.lower()

    def __call__(self, *args, **kwargs):
        if root_trace_ref() is not None:
            if self._under_trace is None:
                self._under_trace = self._jitted(self.jaxpr("scan"))
            return self._under_trace(*args, **kwargs)
        if self._compiled is None:
            self._compiled = self.lower(*args, **kwargs).compile()
            self._callbacks = calls_back_to_host(self._compiled)
        return self._compiled(*args, **kwargs)

    @property
    def executable(self) -> Any:
        """The compiled program (a `jax.stages.Compiled`), or `None` before its
        first call."""
        return self._compiled

    @property
    def plain(self) -> bool:
        """Whether a call can go straight to the compiled program, as `jax.jit`'s
        does: compiled, and with no host callback in it (an `equinox.error_if`, an
        outlined call on jax < 0.11), so no run-time error for `lxd.jit` to wait
        for and raise as `equinox.filter_jit` does."""
        return self._compiled is not None and not self._callbacks


class Lowered:
    """What `lxd.jit(f).lower(...)` returns: `jax.jit`'s `jax.stages.Lowered` of
    the (rewritten) program, whose `compile()` gives an `Executable`. Its other
    attributes (`as_text`, `cost_analysis`...) are the `jax.stages.Lowered`'s.

    **Arguments:**

    - `lowered`: the program's `jax.stages.Lowered`.
    - `convention`: how the compiled program is called (a `CallConvention`).
    - `box`: the box of the program's output.
    """

    def __init__(self, lowered: Any, convention: CallConvention, box: OutputBox):
        self._lowered = lowered
        self._convention = convention
        self._box = box

    def compile(self, *args, **kwargs) -> "Executable":
        """As `jax.stages.Lowered.compile`; returns an `Executable`."""
        compiled = self._lowered.compile(*args, **kwargs)
        return Executable(compiled, self._convention, self._box)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lowered, name)


class Executable:
    """What `lxd.jit(f).lower(...).compile()` returns: called as `jax.jit`'s
    `jax.stages.Compiled` is (without the arguments `static_argnums` and
    `static_argnames` make static; see `CallConvention`), returning what a call of
    `lxd.jit(f)` returns. Its other attributes (`as_text`, `input_shardings`...)
    are the `jax.stages.Compiled`'s.

    **Arguments:**

    - `compiled`: the program's `jax.stages.Compiled`.
    - `convention`: how it is called.
    - `box`: the box of its output.
    """

    def __init__(self, compiled: Any, convention: CallConvention, box: OutputBox):
        self._compiled = compiled
        self._convention = convention
        self._box = box

    def __call__(self, *args, **kwargs):
        split = self._convention.split(args, kwargs)
        out = self._compiled(*split.dynamic_args, **split.dynamic_kwargs)
        return self._box.combine(out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


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
    program = Program(traced, plan.actions, jit_kwargs)
    names = frozenset(trace.session.by_name())
    compiled = Compiled(program, trace.box, plan.decisions, names)
    return compiled, not any(is_tracer(c) for c in program.consts)
