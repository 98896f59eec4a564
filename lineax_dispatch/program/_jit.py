"""`lxd.jit`: a `jax.jit` that reads the traced program before it compiles it."""

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.extend.core as jex

from .._compat import (
    current_trace,
    is_tracer,
    traced_consts,
    with_jaxpr,
)
from ..policies.calls._session import (
    current_session,
    PASS_CONTEXT,
    retire_shared_context,
    Session,
    session,
    shared_context,
)
from ..policies.decision._records import Decision
from . import _compiled
from ._arguments import (
    Arguments,
    check_jit_kwargs,
    check_static_arguments,
    OutputBox,
    split_arguments,
    StaticSpec,
)
from ._compiled import _AsTraced, _Rewritten, Compiled
from ._decide import _decisions, plan_program, shared_solve_hints
from ._errors import new_jit_id, readable_errors, unpatched_jit
from .analyse._groups import foreign_marked_calls
from .analyse._solves import add_carried_solves
from .rewrite._rewrite import rewrite_program


# Frames of `lxd.jit`'s machinery, left out of the stack of a run-time error (as
# `equinox.filter_jit` leaves out its own).
_HIDDEN = (__file__, _compiled.__file__)


class _CompileAware:
    """The callable that `lxd.jit` returns."""

    def __init__(self, fun: Callable, jit_kwargs: dict[str, Any]):
        self._fun = fun
        self._jit_kwargs = jit_kwargs
        self._passed = check_jit_kwargs(jit_kwargs)
        check_static_arguments(fun, jit_kwargs)
        self._spec = StaticSpec(
            fun, jit_kwargs.get("static_argnums"), jit_kwargs.get("static_argnames")
        )
        self._compiled: dict[Any, Compiled] = {}
        functools.update_wrapper(self, fun)

    def decisions(self, *args, **kwargs) -> dict[Any, Decision]:
        """The decisions fixed for these arguments' signature (tracing if needed).

        **Arguments:**

        - `*args`, `**kwargs`: as for a call.

        **Returns:**

        A dict from each `Auto` operator kind met (its key) to the
        [`lineax_dispatch.Decision`][] made for its call sites (or, for an
        operator solved by a solver of this package, for its solve).
        """
        return self._prepare(self._split(args, kwargs)).decisions

    def _split(self, args, kwargs) -> Arguments:
        return split_arguments(self._spec, args, kwargs)

    def traceable(self, split: Arguments, box: OutputBox, active: Session) -> Callable:
        """`fun` as a function of the traced halves of its arguments (its trace
        noted as `active`'s own)."""
        fun = self._fun

        def traced(*dynamic_args, **dynamic_kwargs):
            active.top = current_trace()
            args, kwargs = split.rebuild(dynamic_args, dynamic_kwargs)
            return box.store(fun(*args, **kwargs))

        return traced

    def _trace(self, split: Arguments, hints: dict) -> tuple[Any, Session]:
        """One trace of `fun` in a session of its own (told `hints`, see
        `_shared_solves.py`): `((jitted, box, traced), session)`. Under the shared
        jit-cache context (see `_registry.shared_context`), or one of its own when
        told hints (its solves must be decided again, not taken from the trace
        before). A trace that reused another program's nested trace of an `Auto`
        operator (`foreign_marked_calls`) retires the shared context and is made
        again."""
        stages, active = self._trace_once(split, hints)
        if foreign_marked_calls(stages[-1].jaxpr.jaxpr, active):
            retire_shared_context()
            stages, active = self._trace_once(split, hints)
        return stages, active

    def _trace_once(self, split: Arguments, hints: dict) -> tuple[Any, Session]:
        active = Session(solve_hints=hints)
        box = OutputBox()
        jitted = unpatched_jit()(self.traceable(split, box, active), **self._passed)
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
        return (jitted, box, traced), active

    def analyse(self, split: Arguments) -> tuple[Any, Session, dict, list]:
        """Traces `fun` once for these arguments and reads the program: `(traced,
        session, actions, auto groups)` (see `plan_program`). Solves repeated with
        the same operator that are better decided together (one matrix build for
        all) are traced once more, told so: the only case of a second trace."""
        stages, active = self._trace(split, {})
        hints = shared_solve_hints(stages[-1].jaxpr.jaxpr, active)
        if hints:
            stages, active = self._trace(split, hints)
        actions, autos = plan_program(stages[-1].jaxpr, active)
        return stages, active, actions, autos

    def _prepare(self, split: Arguments) -> Compiled:
        entry = self._compiled.get(split.key)
        if entry is None:
            (jitted, box, traced), active, actions, autos = self.analyse(split)
            closed = traced.jaxpr
            run = rewrite_program(closed, actions, "while")
            # The traced (or rewritten) program is compiled as it is: the user's
            # function is not traced again.
            if isinstance(run, jex.ClosedJaxpr):
                spliced = with_jaxpr(traced, run)
                if spliced is None:  # pragma: no cover - JAX changed
                    run = jex.jaxpr_as_fun(run)
                else:
                    traced, run = spliced, None
            consts = traced_consts(traced)
            if run is None:
                program = _AsTraced(traced, self._passed)
            else:
                program = _Rewritten(
                    run, closed, actions, traced.out_tree, self._passed, consts
                )
            names = frozenset(active.by_name())
            entry = Compiled(program, box, _decisions(active, autos), names)
            # A program closing over another trace's values (its tracers) serves
            # that trace only: traced again for the next, as `jax.jit` does.
            if not any(is_tracer(c) for c in consts):
                self._compiled[split.key] = entry
        return entry

    def _run(self, method: str, args, kwargs):
        split = self._split(args, kwargs)
        entry = self._prepare(split)
        outer = current_session()
        if outer is not None:  # called in another `lxd.jit`'s trace
            outer.embedded.update(entry.names)
        call = getattr(entry.jitted, method)
        out = call(*split.dynamic_args, **split.dynamic_kwargs)
        if method != "__call__":
            return out
        # Waited for, as `equinox.filter_jit` does, so that a run-time error is
        # raised here (see `__call__`).
        jax.block_until_ready([x for x in jax.tree.leaves(out) if not is_tracer(x)])
        return entry.box.combine(out)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        # What `equinox.error_if` records, at trace time, as the start of the
        # program's stack: its run-time errors are raised as `equinox.filter_jit`
        # raises them, an `EquinoxRuntimeError` with their message.
        __equinox_jit_id__ = new_jit_id()
        try:
            with readable_errors(__equinox_jit_id__, _HIDDEN):
                return self._run("__call__", args, kwargs)
        except eqx.EquinoxRuntimeError as e:
            e.__traceback__ = None  # as `equinox.filter_jit`: no frames of ours
            raise

    def __repr__(self) -> str:
        return f"lxd.jit({self._fun!r})"

    def __get__(self, instance, owner=None):
        # As a method: bind `self` like a function would.
        if instance is None:
            return self
        return functools.partial(self, instance)

    def lower(self, *args, **kwargs):
        """As `jax.jit(...).lower`, with the decisions fixed.

        **Arguments:**

        - `*args`, `**kwargs`: as for a call.

        **Returns:**

        A `jax.stages.Lowered`; `.compile()` compiles it.
        """
        return self._run("lower", args, kwargs)


def jit(fun: Callable | None = None, **jit_kwargs: Any) -> Callable:
    """A compile-aware `jax.jit`.

    For each new signature of its arguments, the returned function traces `fun`
    once to a program (a jaxpr; one exception below) and reads it: every group of
    calls of one computation (the `mv` of an operator kind with an
    [`lineax_dispatch.Auto`][] or [`lineax_dispatch.Roll`][] policy, a `jax.jit`
    function of the user's with a substantial body), its call sites counted
    exactly, with the executions of enclosing loops. For each `Auto` group it
    decides from the program (the cost of one `mv` read from the traced callee),
    minimising compile time plus `runs` times the run time, and rewrites it:

    - `Lazy`: the calls stay as they are (XLA inlines them, as lineax's do);
    - `Roll`: the call sites become one computation: stacked into one `vmap`ped
        call where they are independent of each other, else rolled into one
        `lax.scan` body (the code between calls run as the branches of a
        `lax.switch`, steps equal up to literals sharing one);
    - `Materialise`: one matrix built before the first site, a matrix product at
        each;
    - `Outline` (where rolling cannot reach: sites inside loop bodies, branches or
        other calls): every site calls one separately compiled `mv`.

    `Roll` operators and the user's repeated functions are rolled; what a rolled
    call reads that is the same at every site (an operator's arrays) is computed
    once, before the loop. `fun` is traced twice only where k solves of one `Auto`
    operator with the same arrays, from one line, are decided together, or where
    the trace reused another program's nested trace of an `Auto` operator. The
    rewritten program is compiled with `jax.jit`; the results are those of
    `jax.jit(fun)`. Operators with other fixed policies are untouched.

    **Arguments:**

    - `fun`: the function to compile. Its arguments are read as
        `equinox.filter_jit` reads them: arrays are traced, everything else
        (operators' functions, Python numbers, strings...) is static, so an
        operator can be passed as an argument. `None` returns a decorator:
        `@lxd.jit(static_argnums=1)`.
    - `**jit_kwargs`: `jax.jit`'s keyword arguments. `static_argnums` and
        `static_argnames` make those arguments static whole (their arrays become
        constants of the program); the others (`donate_argnums`...) are passed to
        `jax.jit`.

    **Returns:**

    A callable with `fun`'s signature, returning what `jax.jit(fun)` returns
    (Python and NumPy numbers in the output as arrays; leaves `jax.jit` rejects,
    such as strings, as they are); `.lower(*args)` lowers it and
    `.decisions(*args)` returns the decisions made for those arguments.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Auto())

        @lxd.jit
        def f(x):
            return op.mv(op.mv(x)) + op.mv(x)

        x = jnp.ones(64, jnp.float32)
        y = f(x)
        print([d.strategy for d in f.decisions(x).values()])
        ```
    """
    if fun is None:
        return functools.partial(jit, **jit_kwargs)
    if not callable(fun):
        raise TypeError(
            f"`fun` of `lxd.jit` must be callable; got {type(fun).__name__}."
        )
    return _CompileAware(fun, jit_kwargs)
