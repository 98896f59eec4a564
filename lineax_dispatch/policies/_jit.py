"""`lxd.jit`: a `jax.jit` that counts call sites before it decides."""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jex

from ._arguments import Arguments, check_jit_kwargs, OutputBox, split_arguments
from ._auto import Auto
from ._decide import Decision
from ._lazy import Lazy
from ._registry import history, PASS_CONTEXT, Session, session
from ._rewrite import roll_program, rolled_entry


def _entry(fun: Callable, active: Session) -> Callable:
    """`fun`, as a new function object (so that jax traces it afresh) that notes
    the trace it is traced in and drops matrices of any earlier trace."""

    @functools.wraps(fun)
    def traced(*args, **kwargs):
        active.top_trace = jex.get_opaque_trace_state()
        active.matrices.clear()
        try:
            return fun(*args, **kwargs)
        finally:
            # Matrices are tracers of this trace: none may outlive it.
            active.matrices.clear()
            active.top_trace = None

    return traced


def decide_session(observed: Session) -> dict[Any, Decision]:
    """Decisions for every operator kind observed, with its own Auto policy."""
    decisions = {}
    for key, record in observed.records.items():
        policy = getattr(record.operator, "policy", None)
        if not isinstance(policy, Auto):
            continue
        decisions[key] = policy.decision(
            record.operator,
            call_sites=record.call_sites,
            executions=record.executions,
            solves=record.solves,
            key=key,
        )
        history()[key] = record
    return decisions


class _CompileAware:
    """The callable that `lxd.jit` returns."""

    def __init__(self, fun: Callable, jit_kwargs: dict[str, Any]):
        self._fun = fun
        self._jit_kwargs = jit_kwargs
        self._passed = check_jit_kwargs(jit_kwargs)
        self._compiled: dict[Any, tuple] = {}
        functools.update_wrapper(self, fun)

    def decisions(self, *args, **kwargs) -> dict[Any, Decision]:
        """The decisions fixed for these arguments' signature (tracing if needed).

        **Arguments:**

        - `*args`, `**kwargs`: as for a call.

        **Returns:**

        A dict from each `Auto` operator's kind key to its
        [`lineax_dispatch.Decision`][].
        """
        return self._prepare(self._split(args, kwargs))[2]

    def _split(self, args, kwargs) -> Arguments:
        return split_arguments(
            self._fun,
            args,
            kwargs,
            self._jit_kwargs.get("static_argnums"),
            self._jit_kwargs.get("static_argnames"),
        )

    def traceable(self, split: Arguments, box: OutputBox) -> Callable:
        """`fun` as a function of the traced halves of its arguments."""
        fun = self._fun

        def traced(*dynamic_args, **dynamic_kwargs):
            args, kwargs = split.rebuild(dynamic_args, dynamic_kwargs)
            return box.store(fun(*args, **kwargs))

        return traced

    def _prepare(self, split: Arguments):
        entry = self._compiled.get(split.key)
        if entry is None:
            observed = Session(observing=True)
            box = OutputBox()
            observing = jax.jit(
                _entry(self.traceable(split, box), observed), **self._passed
            )
            context = ("observe", observed.token)
            with session(observed), PASS_CONTEXT(context):
                traced = observing.trace(*split.dynamic_args, **split.dynamic_kwargs)
            decisions = decide_session(observed)
            if all(isinstance(d.policy, Lazy) for d in decisions.values()):
                # The observing trace is already the program: jax reuses it (under
                # the same pass context).
                program = traced
                entry = (observing, None, decisions, context, box)
            else:
                fixed = Session(observing=False, decisions=decisions)
                box = OutputBox()
                jitted = jax.jit(
                    _entry(self.traceable(split, box), fixed), **self._passed
                )
                context = ("decide", fixed.token)
                with session(fixed), PASS_CONTEXT(context):
                    program = jitted.trace(*split.dynamic_args, **split.dynamic_kwargs)
                entry = (jitted, fixed, decisions, context, box)
            run = roll_program(program.jaxpr)
            if run is not None:
                # The rewritten program replaces the traced one: the user's
                # function is not traced again.
                rolled = jax.jit(rolled_entry(run, program.out_tree), **self._passed)
                entry = (rolled, None, decisions, context, box)
            self._compiled[split.key] = entry
        return entry

    def _run(self, method: str, args, kwargs):
        split = self._split(args, kwargs)
        jitted, fixed, _, context, box = self._prepare(split)
        call = getattr(jitted, method)
        with PASS_CONTEXT(context):
            if fixed is None:
                out = call(*split.dynamic_args, **split.dynamic_kwargs)
            else:
                with session(fixed):
                    out = call(*split.dynamic_args, **split.dynamic_kwargs)
        return box.combine(out) if method == "__call__" else out

    def __call__(self, *args, **kwargs):
        return self._run("__call__", args, kwargs)

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

    For each new signature of its arguments, the returned function first traces
    `fun` with every `Auto` operator applied inline, counting the call sites of
    each operator's `mv`; then decides per operator (see
    [`lineax_dispatch.Auto`][]); then, unless every decision is to inline (when the
    first trace is already the program), traces `fun` again with those decisions
    fixed. There a `Materialise` decision builds the matrix once for the whole
    program, whatever its number of call sites. Operators with a fixed policy are
    untouched, and the results are those of `jax.jit(fun)`.

    Then the traced program is rewritten: the call sites of each
    [`lineax_dispatch.Roll`][] operator, and of each `jax.jit` function of the
    user's with a substantial body called at several sites, become one
    computation: stacked into one `vmap`ped call where an operator's sites are
    independent of each other, else rolled into one `lax.scan` body (the code
    between calls run as the branches of a `lax.switch`, steps equal up to
    literals sharing one). The rewrite replaces the traced program, so the user's
    function is not traced again.

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

    A callable with `fun`'s signature; `.lower(*args)` lowers it and
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
