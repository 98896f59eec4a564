"""`lxd.jit`: a `jax.jit` that reads the traced program before it compiles it.

Per signature of its arguments, the stages run in order: trace (`_trace`), analyse
and decide (`analyse/`, `_decide`), rewrite and wrap for compilation (`rewrite/`,
`_compiled`)."""

import functools
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from .._compat import executable_call, is_tracer, root_trace_ref
from ..policies.decision._records import Decision
from . import _compiled, _trace
from ._arguments import (
    Arguments,
    check_jit_kwargs,
    check_static_arguments,
    LastCall,
    missed,
    split_arguments,
    StaticSpec,
)
from ._call_convention import CallConvention
from ._compiled import compile_program, Compiled, Lowered
from ._decide import plan_program
from ._errors import new_jit_id, readable_errors
from ._session import current_session
from ._trace import trace_program


# Frames of `lxd.jit`'s machinery, left out of the stack of a run-time error (as
# `equinox.filter_jit` leaves out its own).
_HIDDEN = (__file__, _compiled.__file__, _trace.__file__)


class CompileAware:
    """The callable that `lxd.jit` returns.

    Its own state is in slots, not in its `__dict__`: that holds the function's
    attributes, copied as `jax.jit` copies them, and JAX's transformations (and
    `functools.wraps`) copy a function's `__dict__` into their wrappers, so a
    wrapper of a jitted function carries attributes named as the jitted
    function's state (`jax.vmap(jax.jit(f))._fun` is `f`)."""

    __slots__ = (
        "_fun",
        "_jit_kwargs",
        "_passed",
        "_spec",
        "_compiled",
        "_last",
        "__dict__",
        "__weakref__",
    )

    def __init__(self, fun: Callable, jit_kwargs: dict[str, Any]):
        self._fun = fun
        self._jit_kwargs = jit_kwargs
        self._passed = check_jit_kwargs(jit_kwargs)
        check_static_arguments(fun, jit_kwargs)
        self._spec = StaticSpec(
            fun, jit_kwargs.get("static_argnums"), jit_kwargs.get("static_argnames")
        )
        self._compiled: dict[Any, Compiled] = {}
        # The last compiled program called, for calls that match its arguments.
        self._last: LastCall | None = None
        functools.update_wrapper(self, fun, updated=())
        own = CompileAware.__slots__
        self.__dict__.update(
            (k, v) for k, v in getattr(fun, "__dict__", {}).items() if k not in own
        )

    @property
    def fun(self) -> Callable:
        """The user's function."""
        return self._fun

    @property
    def jit_kwargs(self) -> dict[str, Any]:
        """The `jax.jit` arguments its program is traced and compiled with."""
        return self._passed

    def decisions(self, *args, **kwargs) -> dict[Any, Decision]:
        """The decisions fixed for these arguments' signature (tracing if needed).

        **Arguments:**

        - `*args`, `**kwargs`: as for a call.

        **Returns:**

        A dict from each `Auto` operator kind met (its key) to the
        [`lineax_dispatch.Decision`][] made for its call sites (or, for an
        operator solved by a solver of this package, for its solve).
        """
        return self.compiled(self.split(args, kwargs)).decisions

    def stage_seconds(self, *args, **kwargs) -> dict[str, float]:
        """The seconds `lxd.jit`'s own stages took for these arguments' signature
        (tracing if needed): what deciding costs before XLA compiles.

        **Arguments:**

        - `*args`, `**kwargs`: as for a call.

        **Returns:**

        A dict: `"trace"` (the user's function traced to a program, the decisions
        made inside the trace included: an operator's solves, `lxd.AutoSolver`'s
        choice), `"decide"` (the program's analysis and the decisions for its
        groups of calls) and `"rewrite"` (the program rewritten with them, at
        its lowering, 0 before it; where nothing is to be rewritten, the look
        for what is; both programs' rewrites where two were raced).
        """
        return dict(self.compiled(self.split(args, kwargs)).program.stage_seconds)

    def split(self, args: tuple, kwargs: dict) -> Arguments:
        """The arguments of a call, split into traced and static halves."""
        return split_arguments(self._spec, args, kwargs)

    def compiled(self, split: Arguments) -> Compiled:
        """What is kept for these arguments' signature: traced, decided, rewritten
        and wrapped for compilation at its first call."""
        entry = self._compiled.get(split.key)
        if entry is None:
            start = time.perf_counter()
            trace = trace_program(self._fun, self._passed, split)
            traced = time.perf_counter()
            plan = plan_program(trace.traced.jaxpr, trace.session)
            seconds = dict(trace=traced - start, decide=time.perf_counter() - traced)
            entry, reusable = compile_program(trace, plan, self._passed, seconds)
            if reusable:
                self._compiled[split.key] = entry
        return entry

    def _run(self, method: str, split: Arguments, entry: Compiled | None = None):
        entry = self.compiled(split) if entry is None else entry
        outer = current_session()
        if outer is not None:  # called in another `lxd.jit`'s trace
            outer.embedded.update(entry.names)
        call = getattr(entry.program, method)
        out = call(*split.dynamic_args, **split.dynamic_kwargs)
        if method != "__call__":
            return out
        # Waited for, as `equinox.filter_jit` does, so that a run-time error is
        # raised here (see `__call__`).
        jax.block_until_ready([x for x in jax.tree.leaves(out) if not is_tracer(x)])
        return entry.box.combine(out)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        last = self._last
        outside = root_trace_ref() is None and current_session() is None
        if last is not None and not kwargs and outside:
            # Arguments of the last call's signature: straight to its program's
            # own call, as `jax.jit`'s fast path (see `LastCall`).
            out = last(args)
            if not missed(out):
                return out
        split = self.split(args, kwargs)
        entry = self._compiled.get(split.key)
        if entry is not None and entry.program.plain and outside:
            # Compiled, with no host callback: no run-time error to wait for.
            out = entry.program(*split.dynamic_args, **split.dynamic_kwargs)
            self._keep_last(args, kwargs, entry)
            return entry.box.combine(out)
        # What `equinox.error_if` records, at trace time, as the start of the
        # program's stack: its run-time errors are raised as `equinox.filter_jit`
        # raises them, an `EquinoxRuntimeError` with their message.
        __equinox_jit_id__ = new_jit_id()
        try:
            with readable_errors(__equinox_jit_id__, _HIDDEN):
                return self._run("__call__", split)
        except eqx.EquinoxRuntimeError as e:
            e.__traceback__ = None  # as `equinox.filter_jit`: no frames of ours
            raise

    def _keep_last(self, args: tuple, kwargs: dict, entry: Compiled) -> None:
        """Keeps `entry`'s program for the next call with these arguments'
        signature where they are positional, none static whole (`LastCall`)."""
        if kwargs or self._spec.any_static:
            return
        call = executable_call(entry.program.executable)
        self._last = LastCall.of(args, call, entry.box)

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

        A `jax.stages.Lowered` of the program (wrapped: the attributes are
        its); `.compile()` compiles it to a function called as `jax.jit`'s
        compiled function is (without the arguments `static_argnums` and
        `static_argnames` make static; the other static leaves, Python numbers
        among them, as lowered), returning what a call returns.
        """
        split = self.split(args, kwargs)
        entry = self.compiled(split)
        lowered = self._run("lower", split, entry)
        convention = CallConvention(self._spec, args, kwargs, split)
        return Lowered(lowered, convention, entry.box)


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
    operator with the same arrays, from one line, are decided together, where an
    `lxd.CG` solve's layout changes counting the trips of the loops around it,
    or where the trace reused another program's nested trace of an `Auto`
    operator. The
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
    `.decisions(*args)` returns the decisions made for those arguments. A program
    with host callbacks (an `equinox.error_if`, lineax's `throw=True`) is waited
    for, and its run-time errors raised as `equinox.filter_jit` raises them; one
    without is called as `jax.jit` calls it, its output not waited for.

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
    return CompileAware(fun, jit_kwargs)
