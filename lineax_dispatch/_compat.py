"""Every use of a private JAX, equinox or lineax name, in one place, so that an
upstream move breaks here (and in `tests/test_compat.py`) rather than anywhere."""

import inspect
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as _jex
import lineax as lx
from equinox._compile_utils import (
    hashable_combine as hashable_combine,
    hashable_partition as hashable_partition,
)
from jax._src import (
    config as _jax_config,
    core as _jax_core,
    source_info_util as _source_info,
    stages as _jax_stages,
)
from jax._src.callback import pure_callback_p as pure_callback_p
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax import lax as _jax_lax
from jax.interpreters import ad as _ad, batching as _batching, mlir as _mlir


# `hashable_partition(tree, filter_fn) -> (dynamic, (static, treedef))` splits a
# pytree's leaves (hashable static part); `hashable_combine` rebuilds the tree.


def _changed(what: str, package: str = "JAX") -> ImportError:
    """The error where `package` no longer has `what` this module reads."""
    return ImportError(
        f"lineax_dispatch: {what}; update `lineax_dispatch/_compat.py` for this "
        f"{package} version."
    )


# The default of `lineax.linear_solve`'s `state` ("no state: run `solver.init`"),
# read from its public signature rather than imported from
# `lineax._custom_types.sentinel`: lineax compares `state == sentinel`, so a
# wrapper must pass on this very object.
sentinel: Any = inspect.signature(lx.linear_solve).parameters["state"].default
if sentinel is inspect.Parameter.empty:  # pragma: no cover - lineax changed
    raise _changed("`lineax.linear_solve` has no default for `state`", "lineax")


def traced_consts(traced: Any) -> tuple:
    """The values a `jax.stages.Traced`'s function (`jax.jit(...).trace(...)`)
    closes over from the trace it was traced in (tracers of an enclosing trace),
    which JAX passes as the first inputs of its program; `()` where there are
    none."""
    consts = getattr(traced, "_consts", None)
    if consts is None:  # pragma: no cover - JAX changed
        raise _changed("`jax.stages.Traced` has no `_consts`")
    return tuple(consts)


def current_trace() -> Any:
    """The trace the current code runs under (JAX's evaluation trace eagerly)."""
    return _jax_core.trace_ctx.trace


def root_trace_ref() -> "weakref.ref | None":
    """A weak reference to the outermost trace of the current computation: the
    trace the current one was started from, followed up to the one started from
    eager evaluation. Every sub-trace of one `jax.jit` trace (loop bodies, nested
    jits, JVP and batching traces) has the same root: a `weakref.ref` to it, `None`
    outside any trace."""
    trace: Any = _jax_core.trace_ctx.trace
    if trace is None or isinstance(trace, _jax_core.EvalTrace):
        return None
    while True:
        parent = getattr(trace, "parent_trace", None)
        if parent is None or isinstance(parent, _jax_core.EvalTrace):
            return trace._weakref
        trace = parent


def weakly_typed(x: Any) -> Any:
    """`x` weakly typed, as a Python number's array is (its dtype kept): what
    `jax.jit` returns for an output traced weakly typed.

    **Arguments:**

    - `x`: an array or tracer.

    **Returns:**

    An array or tracer.
    """
    return _jax_lax._convert_element_type(x, x.dtype, weak_type=True)


def is_tracer(x: Any) -> bool:
    """Whether `x` is a tracer (of any trace)."""
    return isinstance(x, _jax_core.Tracer)


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


def with_jaxpr(traced: Any, closed: Any) -> Any:
    """The `jax.stages.Traced` `traced` with its program replaced by `closed` (the
    same inputs and outputs), to be lowered as `jax.jit` lowers `traced`, without
    tracing anything again; `None` where this JAX's `Traced` is not built as
    expected (then the caller traces `closed` again).

    **Arguments:**

    - `traced`: from `jax.jit(...).trace(...)`.
    - `closed`: a `ClosedJaxpr` with the avals of `traced.jaxpr`'s inputs and
        outputs.

    **Returns:**

    A `jax.stages.Traced`, or `None`.
    """
    try:
        params = dict(traced._params, jaxpr=closed)
        args = [
            traced._meta_tys_flat,
            params,
            traced._in_tree,
            traced.out_tree,
            traced._consts,
        ]
        if "_fun_sourceinfo" in type(traced).__slots__:  # jax >= 0.11
            args.append(traced._fun_sourceinfo)
        return _jax_stages.Traced(*args)
    except (AttributeError, TypeError):  # pragma: no cover - JAX changed
        return None


# How `jax.jit(f, inline=...)` is asked to keep a nested call's equations in the
# calling program (`JAX_INLINE`), and whether and how it can be asked to keep the
# call out of line and compiled once by XLA (`XLA_OUTLINE`). jax >= 0.11 has
# `jax.Inline`: `inline=True` there no longer means "inline while tracing" (the
# call stays a `jit` equation), `Inline.JAX_EARLY` does; `Inline.XLA_LATE` keeps
# the call in the lowered module, marked for XLA to inline only late, after it
# has compiled the callee once (a call site then costs little to compile and runs
# at native speed). On older jax, `inline=True` inlines while tracing and there is
# no out-of-line mark (`XLA_OUTLINE` is `None`: `Outline` uses a host callback).
_INLINE_ENUM: Any = getattr(jax, "Inline", None)
JAX_INLINE: Any = True if _INLINE_ENUM is None else _INLINE_ENUM.JAX_EARLY
XLA_OUTLINE: Any = None if _INLINE_ENUM is None else _INLINE_ENUM.XLA_LATE


def is_outlined_call(eqn: Any) -> bool:
    """Whether a `jit` equation's call is marked to stay out of line
    (`XLA_OUTLINE`); always `False` on a JAX without such a mark.

    **Arguments:**

    - `eqn`: a `jax.extend.core.JaxprEqn`.

    **Returns:**

    A bool.
    """
    return XLA_OUTLINE is not None and eqn.params.get("inline") is XLA_OUTLINE


def outlined_call(eqn: Any) -> Any:
    """The `jit` equation `eqn` with its call marked to stay out of line
    (`XLA_OUTLINE`, which must exist on this JAX).

    **Arguments:**

    - `eqn`: a `jit` equation.

    **Returns:**

    A `jax.extend.core.JaxprEqn`.
    """
    if XLA_OUTLINE is None:  # pragma: no cover - guarded by the callers
        raise RuntimeError("this JAX has no `jax.Inline.XLA_LATE`.")
    if "inline" not in eqn.params:  # pragma: no cover - JAX changed
        raise _changed("a `jit` equation has no `inline` parameter")
    return eqn.replace(params={**eqn.params, "inline": XLA_OUTLINE})


def scan_counts(eqn: Any) -> tuple[int, int]:
    """`(constants, carried values)`: how many of a `scan` equation's inputs are the
    loop's constants and how many its carry (the rest are the scanned-over inputs).
    jax 0.10 states both as parameters (`num_consts`, `num_carry`); jax >= 0.11
    groups the inputs in a flat tree (`ft_in`: constants, carry, scanned).

    **Arguments:**

    - `eqn`: a `scan` equation.

    **Returns:**

    A pair of ints.
    """
    params = eqn.params
    if "num_consts" in params and "num_carry" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    ft_in = params.get("ft_in")
    if ft_in is None:  # pragma: no cover - JAX changed
        raise _changed(
            "a `scan` equation has neither `num_consts` / `num_carry` nor `ft_in`"
        )
    consts, carry, _ = ft_in.update(list(range(len(eqn.invars)))).unpack()
    return len(list(consts)), len(list(carry))


def call_callee(eqn: Any) -> Any:
    """The callee of a `jit` equation, as a closed jaxpr (`.jaxpr`, `.consts`): a
    `ClosedJaxpr` on jax 0.10, a `Jaxpr` carrying its constants on jax >= 0.11
    (where the two are one class and `.jaxpr` is the jaxpr itself).

    **Arguments:**

    - `eqn`: a `jit` equation.

    **Returns:**

    The callee; the same object for every call of one traced function.
    """
    return eqn.params["jaxpr"]


def define_call_primitive(
    name: str,
    *,
    impl: Any,
    abstract_eval: Any,
    jvp: Any,
    transpose: Any,
    batch: Any,
) -> Any:
    """A new primitive of several results, its rules registered with JAX: `impl`
    evaluates it (and, traced, is what it lowers to), `abstract_eval` gives its
    outputs' avals, `jvp(primals, tangents, **params)` returns `(outputs,
    tangents)`, `transpose(cotangents, *inputs, **params)` the inputs' cotangents
    (see `is_undefined_primal`), and `batch(inputs, dims, **params)` `(outputs,
    dims)` (a dim is `None` where an input is not batched).

    **Arguments:**

    - `name`: the primitive's name, as its equations show it.
    - `impl`, `abstract_eval`, `jvp`, `transpose`, `batch`: its rules.

    **Returns:**

    A `jax.extend.core.Primitive`.
    """
    primitive = _jex.Primitive(name)
    primitive.multiple_results = True
    primitive.def_impl(impl)
    primitive.def_abstract_eval(abstract_eval)
    _ad.primitive_jvps[primitive] = jvp
    _ad.primitive_transposes[primitive] = transpose
    _batching.primitive_batchers[primitive] = batch
    _mlir.register_lowering(primitive, _mlir.lower_fun(impl, multiple_results=True))
    return primitive


def is_undefined_primal(x: Any) -> bool:
    """Whether a transpose rule's input `x` is one to transpose with respect to (an
    `UndefinedPrimal`, whose `.aval` is its type), not a known value."""
    return isinstance(x, _ad.UndefinedPrimal)


def is_symbolic_zero(x: Any) -> bool:
    """Whether a tangent or cotangent is JAX's symbolic zero."""
    return isinstance(x, _ad.Zero)


def symbolic_zero(aval: Any) -> Any:
    """JAX's symbolic zero tangent (or cotangent) of a value of type `aval`."""
    return _ad.Zero(aval.to_tangent_aval())


def live_equations(jaxpr: Any) -> Any:
    """`jaxpr` without the equations none of its outputs depend on (and that have
    no effects), as JAX drops them when it lowers a function: a JVP's primal
    computation whose output is unused, say. Every input is kept.

    **Arguments:**

    - `jaxpr`: a `jax.extend.core.Jaxpr`.

    **Returns:**

    The pruned `Jaxpr`.
    """
    pruned, _ = _pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)
    return pruned


# lineax's primitive of `lineax.linear_solve` (its equations are named
# `linear_solve`), from `lineax.internal`; not `jax.extend.core.primitives.
# linear_solve_p`, which is JAX's `custom_linear_solve`, another primitive.
linear_solve_p: Any = lx.internal.linear_solve_p


def executable_call(compiled: Any) -> Callable:
    """What a called `jax.stages.Compiled` dispatches through: its C++ call
    (`_call`, made at its first call; `Compiled.__call__`, a Python method, adds
    0.3-0.6 us a call), else the `Compiled` itself."""
    call = getattr(compiled, "_call", None)
    return compiled if call is None else call


_DEFAULT_DEVICE: Any = getattr(_jax_config, "default_device", None)


def array_placement(x: Any) -> Any:
    """Where an array argument's program runs, as `jax.jit` keys its programs by
    it: for a `jax.Array` committed to its devices, `(sharding, layout)` (its
    program is compiled for them: another device, sharding or layout needs
    another program); for any other (an uncommitted `jax.Array`, which `jax.jit`
    moves to the default device, a NumPy array, a tracer), the default device
    set by `jax.default_device` (`None` where none is set). Reads ArrayImpl's
    `_committed` and `_pjrt_layout` (cheaper than the public `committed` and
    `format.layout`, which build a `Format` at each read)."""
    if not getattr(x, "_committed", False):
        if _DEFAULT_DEVICE is None:  # pragma: no cover - JAX changed
            return jax.config.jax_default_device  # pyright: ignore[reportAttributeAccessIssue]
        return _DEFAULT_DEVICE.value
    try:
        layout = x._pjrt_layout
    except Exception:  # deleted, or a backend without layouts
        layout = None
    return (x.sharding, layout)


def calls_back_to_host(compiled: Any) -> bool:
    """Whether a `jax.stages.Compiled` program calls back to the host (an
    `equinox.error_if`, a `jax.pure_callback`) or has effects: then JAX calls it
    from Python, and a call may raise a run-time error. Read from its executable's
    call (`ExecuteReplicated`, as `create_cpp_call` reads it); true where that is
    not found."""
    call = getattr(getattr(compiled, "_executable", None), "unsafe_call", None)
    return any(
        getattr(call, name, True)
        for name in ("has_host_callbacks", "has_unordered_effects", "ordered_effects")
    )
