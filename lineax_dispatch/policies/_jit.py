"""`lxd.jit`: a `jax.jit` that counts call sites before it decides."""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jex
import jax.tree_util as jtu
import numpy as np

from ._auto import Auto
from ._decide import Decision
from ._lazy import Lazy
from ._registry import history, PASS_CONTEXT, Session, session


def _signature(args: tuple, kwargs: dict) -> Any:
    leaves, treedef = jtu.tree_flatten((args, kwargs))
    parts = []
    for leaf in leaves:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            parts.append(
                (
                    tuple(leaf.shape),
                    str(leaf.dtype),
                    bool(getattr(leaf, "weak_type", False)),
                )
            )
        elif isinstance(leaf, (bool, int, float, complex)):
            parts.append((type(leaf).__name__, np.shape(leaf)))
        else:
            try:
                hash(leaf)
                parts.append(leaf)
            except TypeError:
                parts.append(id(leaf))
    return treedef, tuple(parts)


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
        return self._prepare(args, kwargs)[2]

    def _static_values(self, args, kwargs) -> tuple:
        """The values of the static arguments (part of the signature)."""
        nums = self._jit_kwargs.get("static_argnums", ())
        names = self._jit_kwargs.get("static_argnames", ())
        nums = (nums,) if isinstance(nums, int) else tuple(nums)
        names = (names,) if isinstance(names, str) else tuple(names)
        values = [args[i] for i in nums if -len(args) <= i < len(args)]
        values += [(name, kwargs[name]) for name in names if name in kwargs]
        return tuple(values)

    def _prepare(self, args, kwargs):
        signature = (_signature(args, kwargs), self._static_values(args, kwargs))
        entry = self._compiled.get(signature)
        if entry is None:
            observed = Session(observing=True)
            observing = jax.jit(_entry(self._fun, observed), **self._jit_kwargs)
            context = ("observe", observed.token)
            with session(observed), PASS_CONTEXT(context):
                observing.trace(*args, **kwargs)
            decisions = decide_session(observed)
            if all(isinstance(d.policy, Lazy) for d in decisions.values()):
                # The observing trace is already the program: jax reuses it (under
                # the same pass context).
                entry = (observing, None, decisions, context)
            else:
                fixed = Session(observing=False, decisions=decisions)
                jitted = jax.jit(_entry(self._fun, fixed), **self._jit_kwargs)
                entry = (jitted, fixed, decisions, ("decide", fixed.token))
            self._compiled[signature] = entry
        return entry

    def _run(self, method: str, args, kwargs):
        jitted, fixed, _, context = self._prepare(args, kwargs)
        with PASS_CONTEXT(context):
            if fixed is None:
                return getattr(jitted, method)(*args, **kwargs)
            with session(fixed):
                return getattr(jitted, method)(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self._run("__call__", args, kwargs)

    def __repr__(self) -> str:
        return f"lxd.jit({self._fun!r})"

    def lower(self, *args, **kwargs):
        """As `jax.jit(...).lower`, with the decisions fixed.

        **Arguments:**

        - `*args`, `**kwargs`: as for a call.

        **Returns:**

        A `jax.stages.Lowered`; `.compile()` compiles it.
        """
        return self._run("lower", args, kwargs)


def jit(fun: Callable, **jit_kwargs: Any) -> Callable:
    """A compile-aware `jax.jit`.

    For each new signature of its arguments, the returned function first traces
    `fun` with every `Auto` operator applied inline, counting the call sites of
    each operator's `mv`; then decides per operator (see
    [`lineax_dispatch.Auto`][]); then, unless every decision is to inline (when the
    first trace is already the program), traces `fun` again with those decisions
    fixed. There a `Materialise` decision builds the matrix once for the whole
    program, whatever its number of call sites. Operators with a fixed policy are
    untouched, and the results are those of `jax.jit(fun)`.

    **Arguments:**

    - `fun`: the function to compile.
    - `**jit_kwargs`: passed to `jax.jit` (`static_argnums`, `donate_argnums`...).

    **Returns:**

    A callable with `fun`'s signature; `.lower(*args)` lowers it and
    `.decisions(*args)` returns the decisions made for those arguments.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure)  # policy=lxd.Auto()

        @lxd.jit
        def f(x):
            return op.mv(op.mv(x)) + op.mv(x)

        x = jnp.ones(64, jnp.float32)
        y = f(x)
        print([d.strategy for d in f.decisions(x).values()])
        ```
    """
    if not callable(fun):
        raise TypeError(
            f"`fun` of `lxd.jit` must be callable; got {type(fun).__name__}."
        )
    return _CompileAware(fun, jit_kwargs)
