"""The `Outline` policy: one compiled callee shared by every call site."""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.extend.core as jex
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import PyTree

from .._compat import (
    define_call_primitive,
    is_symbolic_zero,
    is_undefined_primal,
    symbolic_zero,
    traced_consts,
)
from .._explicit_axes import explicit_sharding
from .._precision import default_precision, traced_precision
from ._eager import compiled_mv
from ._policy_interface import AbstractPolicy, RawMv
from .calls._keys import ByIdentity
from .calls._marked import inline_mv, marked_mv, mv_parts, outline_mv
from .calls._per_object import cached_per_object, per_object_cache
from .calls._scope import current_scope


class JaxprMv(eqx.Module):
    """A marked call's callee (a `ClosedJaxpr`) as a function of the vector's
    leaves, its other inputs held: the values its function closes over, then the
    operator's arrays (as `RawMv` holds its operator). The callee is static: one
    out-of-line callee per traced `mv` (per operator kind and trace)."""

    arrays: tuple
    callee: Any = eqx.field(static=True)

    def __call__(self, vector: tuple) -> tuple:
        return tuple(jex.jaxpr_as_fun(self.callee)(*self.arrays, *vector))


class _AbstractMv(eqx.Module):
    """Shape-only evaluation of an outlined `mv`: the operator's output structure,
    without running its function (which `noinline` would otherwise trace once per
    callee just for shapes).

    `noinline` also evaluates this under its transformations (JVP, transpose,
    vmap) for the shapes of the transformed call (where it is transformed itself,
    as `lxd.jit`'s program-wide outline does; `outlined_call` transforms its own
    call), so the zeros it returns are
    scaled by a form linear in the vector and in the operator's arrays separately
    (as `mv` is): a tangent or cotangent through either is then an array, not a
    symbolic zero that would drop the transformed output.
    """

    leaves: tuple = eqx.field(static=True)
    treedef: Any = eqx.field(static=True)

    def __init__(self, structure: PyTree[jax.ShapeDtypeStruct]):
        leaves, self.treedef = jtu.tree_flatten(structure)
        self.leaves = tuple(leaves)

    def __call__(self, dynamic: PyTree[Any], vector: PyTree[Any]) -> PyTree[Any]:
        def total(tree):
            parts = [
                jnp.sum(x) for x in jtu.tree_leaves(tree) if eqx.is_inexact_array(x)
            ]
            return sum(parts[1:], parts[0]) if parts else None

        factors = [f for f in (total(vector), total(dynamic)) if f is not None]

        def zeros(s):
            out = jnp.zeros(s.shape, s.dtype)
            for factor in factors:
                if not jnp.issubdtype(s.dtype, jnp.complexfloating):
                    factor = jnp.real(factor)
                out = out * factor.astype(s.dtype)
            return out

        return jtu.tree_unflatten(self.treedef, [zeros(s) for s in self.leaves])


# The out-of-line call on jax 0.10 (`outlined_call`): a primitive of this package,
# one per call site, lowered to a host callback (`equinox.internal.noinline`) of its
# callee. Its own rules differentiate, transpose and batch it, each into one call of
# a callee derived once from the first (its JVP, transpose or `vmap`): `noinline`'s
# rules are never used, so the transpose of a transposed call (a least-squares
# solve's reverse pass) is a call like any other; `noinline` transposing its own
# transposed call crashed (equinox 0.13, jax 0.10.2). The callee is held by
# identity (`ByIdentity`), out of sight of passes that recurse into sub-jaxprs, as
# `noinline` holds it, and the primitive is named as `noinline` is: a program's
# out-of-line calls on jax 0.10 read as before.

# The callees derived from each callee, dropped with it: `{(id, (rule, key)): ...}`.
_DERIVED = per_object_cache("lineax_dispatch_outlined_derived")


def _derived(callee: Any, rule: str, key: Any, fn: Callable, avals: Sequence) -> Any:
    """The closed jaxpr of `fn` (a derived function of `callee`) traced at `avals`,
    once per `callee`, `rule` and `key`, so every call site shares it."""

    def trace():
        specs = [
            jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals
        ]
        return jax.make_jaxpr(lambda *args: list(fn(*args)))(*specs)

    return cached_per_object(_DERIVED, callee, trace, extra=(rule, key))


def _merge(mask: Sequence[bool], given: Sequence, other: Sequence) -> list:
    """`given` where `mask` holds and `other` elsewhere, in order."""
    given_iter, other_iter = iter(given), iter(other)
    return [next(given_iter) if m else next(other_iter) for m in mask]


def _inexact(aval: Any) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


def _outlined_impl(*args: Any, callee: ByIdentity) -> list:
    # One host callback of `callee` (the same executable for every call of it).
    closed = callee.value
    structure = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.out_avals)
    mv = JaxprMv(tuple(args), closed)
    return list(eqxi.noinline(mv, _AbstractMv(structure))(()))


def _outlined_abstract(*avals: Any, callee: ByIdentity) -> list:
    del avals
    return list(callee.value.out_avals)


def _outlined_jvp(primals: Sequence, tangents: Sequence, *, callee: ByIdentity):
    closed = callee.value
    outs = outlined_p.bind(*primals, callee=callee)
    given = tuple(
        not is_symbolic_zero(t) and _inexact(a)
        for t, a in zip(tangents, closed.in_avals)
    )
    kept = tuple(_inexact(a) for a in closed.out_avals)
    zeros = [symbolic_zero(a) for a in closed.out_avals]
    if not any(given) or not any(kept):
        return outs, zeros

    def jvp(*flat):
        args, dargs = flat[: len(given)], flat[len(given) :]

        def f(*varied):
            full = _merge(given, varied, [a for a, g in zip(args, given) if not g])
            out = jex.jaxpr_as_fun(closed)(*full)
            return [o for o, k in zip(out, kept) if k]

        varied = [a for a, g in zip(args, given) if g]
        return jax.jvp(f, varied, list(dargs))[1]

    avals = [*closed.in_avals, *(a for a, g in zip(closed.in_avals, given) if g)]
    derived = _derived(closed, "jvp", given, jvp, avals)
    dargs = [t for t, g in zip(tangents, given) if g]
    douts = outlined_p.bind(*primals, *dargs, callee=ByIdentity(derived))
    return outs, _merge(kept, douts, [z for z, k in zip(zeros, kept) if not k])


def _outlined_transpose(cts: Sequence, *args: Any, callee: ByIdentity) -> list:
    # Linear in the undefined inputs: their cotangents are one call of the
    # transposed callee, linear in `cts` in turn (and transposed alike).
    closed = callee.value
    undefined = tuple(is_undefined_primal(x) for x in args)
    given = tuple(
        not is_symbolic_zero(c) and _inexact(a) for c, a in zip(cts, closed.out_avals)
    )
    zeros = [symbolic_zero(x.aval) if u else None for x, u in zip(args, undefined)]
    if not any(given) or not any(undefined):
        return zeros
    defined = [x for x, u in zip(args, undefined) if not u]
    linear = [a for a, u in zip(closed.in_avals, undefined) if u]

    def transpose(*flat):
        known, ct = flat[: len(defined)], flat[len(defined) :]

        def f(*varied):
            out = jex.jaxpr_as_fun(closed)(*_merge(undefined, varied, known))
            return [o for o, g in zip(out, given) if g]

        specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in linear]
        return jax.linear_transpose(f, *specs)(list(ct))

    avals = [
        *(a for a, u in zip(closed.in_avals, undefined) if not u),
        *(a for a, g in zip(closed.out_avals, given) if g),
    ]
    derived = _derived(closed, "transpose", (undefined, given), transpose, avals)
    ct = [c for c, g in zip(cts, given) if g]
    outs = outlined_p.bind(*defined, *ct, callee=ByIdentity(derived))
    return _merge(undefined, outs, [None] * len(defined))


def _outlined_batch(args: Sequence, dims: Sequence, *, callee: ByIdentity):
    # The batched callee's products take the precision a trace of the batch would
    # give them now (`_precision`: float32's under a strategy's batch).
    closed = traced_precision(callee.value)
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    args = [x if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims)]
    axes = tuple(None if d is None else 0 for d in dims)
    batched = jax.vmap(jex.jaxpr_as_fun(closed), in_axes=axes, axis_size=size)
    avals = [
        a if d is None else a.update(shape=(size, *a.shape))
        for a, d in zip(closed.in_avals, axes)
    ]
    key = (axes, size, str(default_precision()))
    derived = _derived(callee.value, "vmap", key, batched, avals)
    outs = outlined_p.bind(*args, callee=ByIdentity(derived))
    return outs, [0] * len(outs)


outlined_p = define_call_primitive(
    "noinline",
    impl=_outlined_impl,
    abstract_eval=_outlined_abstract,
    jvp=_outlined_jvp,
    transpose=_outlined_transpose,
    batch=_outlined_batch,
)


def outlined_call(callee: Any, args: Sequence) -> list:
    """`callee` applied to `args` through one out-of-line call (a host callback of
    `callee`, compiled once for every call of it); its JVP, transpose and `vmap`
    are out-of-line calls too.

    **Arguments:**

    - `callee`: a `ClosedJaxpr`.
    - `args`: its inputs, arrays.

    **Returns:**

    The list of its outputs.

    **Raises:**

    `ValueError` where the default backend cannot run a host callback's executable
    while the program runs (`outline_runs_here`).
    """
    check_outline_runs()
    return outlined_p.bind(*args, callee=ByIdentity(callee))


def check_outline_runs() -> None:
    """A trace-time error where the default backend cannot run an outlined call
    (`outline_runs_here`), naming the backend and what runs there.

    **Returns:**

    Nothing.

    **Raises:**

    `ValueError`.
    """
    if not outline_runs_here():
        where = (
            f"on {jax.default_backend()!r} the callback waits for the device the "
            "program holds"
            if jax.default_backend() != "cpu"
            else f"across {jax.process_count()} processes the callback waits for "
            "the other processes' devices"
        )
        raise ValueError(
            f"`Outline()` on jax {jax.__version__} applies `mv` out of line through "
            "a host callback, which runs only on the CPU backend of one process: "
            f"{where}, and the program never ends. Use `Lazy()`, or `Roll()` under "
            "`lxd.jit` (one compiled copy of `mv` for every call site)."
        )


def outline_runs_here() -> bool:
    """Whether an outlined call can run on the default backend: natively
    (`jax.Inline.XLA_LATE`, jax >= 0.11), or as a host callback on XLA:CPU in one
    process (across `jax.distributed` processes the callback's executable waits
    for the other processes).

    **Returns:**

    A bool.
    """
    if outline_mv is not None:
        return True
    return jax.default_backend() == "cpu" and jax.process_count() == 1


class Outline(AbstractPolicy):
    """Keeps the operator's `mv` out of line: it is compiled once, separately, and
    every call site calls that one executable.

    How depends on the JAX:

    - jax >= 0.11: each call site is a call of one `jax.jit` of the operator's
        `mv` made with `inline=jax.Inline.XLA_LATE`, which XLA compiles once and
        keeps out of line. A call site costs little to compile and the call runs
        at native speed (no host round trip, the operator's arrays passed as
        arguments), so it suits any `mv` that is expensive to compile, however
        often it runs. `jit`, `vmap`, `grad` and linear transposition act on the
        call as on any `jax.jit` call.
    - jax 0.10: each call site is one call of this package's out-of-line call,
        which runs its callee as a host callback (`equinox.internal.noinline`).
        `jit`, `vmap`, `grad` and linear transposition all work through it, each
        making one call of a callee derived from the first (its JVP, transpose or
        batched form), shared by every site, and transformed alike in turn (the
        transpose of a transpose included). The cost is paid at run time:
        each call is a host callback into the separately compiled executable
        (tens to hundreds of microseconds on CPU, a device-host round trip on an
        accelerator). It wins for an expensive-to-compile `mv` called from
        several places and run a few times.

    The callee is shared by every call site of one `jax.jit` trace (loop bodies and
    transformations included); a new trace (another `jax.jit`, or a retrace)
    compiles its own, so a function that reads Python
    state sees it as `Lazy` would. Outside any trace, `mv` runs as one compiled
    `mv` (jax >= 0.11) or inline (jax 0.10).

    Operators nested inside an outlined operator are applied inline within the
    outlined callee (the outermost non-`Lazy` policy decides for the whole
    expression).

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Outline())
        f = jax.jit(lambda x: op.mv(x) + op.mv(2 * x))  # one callee, two calls
        y = f(jnp.ones(64, jnp.float32))
        ```
    """

    def eager_mv(self, operator: lx.AbstractLinearOperator):
        # As `mv` outside any trace (below): on jax 0.10 the function runs inline.
        return None if outline_mv is None else compiled_mv(operator, outline_mv)

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        _check_unsharded(vector)
        if outline_mv is not None:
            # Marked for XLA to compile once and keep out of line.
            return marked_mv(operator, vector, outline_mv)
        scope = current_scope()
        if scope is None:
            # Eager: nothing is compiled for a later call to share; run inline.
            return RawMv(operator)(vector)
        # The operator's `mv` as traced once per kind in this trace (the marked
        # callee): JAX has converted what its function closes over from the trace
        # (the tracers a function built with `closure_convert=False` may hold)
        # into inputs, which the out-of-line call is then given with the
        # operator's arrays, so that transformations reach them.
        dynamic, key = mv_parts(operator)
        traced = inline_mv.trace((key, scope), dynamic, vector)
        arrays = (*traced_consts(traced), *jtu.tree_leaves(dynamic))
        leaves = outlined_call(traced.jaxpr, (*arrays, *jtu.tree_leaves(vector)))
        return jtu.tree_unflatten(jtu.tree_structure(traced.out_info), leaves)


Outline.__init__.__doc__ = """**Arguments:** None."""


def _check_unsharded(vector: PyTree[Any]) -> None:
    """A trace-time error for a vector sharded over an Explicit mesh axis: an
    out-of-line `mv` cannot take it (on jax < 0.11 a host callback takes its vectors
    on one device; on jax 0.12.0.1 XLA's partitioner leaves an `XLA_LATE` callee
    unpartitioned, and the program fails when it runs)."""
    for leaf in jtu.tree_leaves(vector):
        sharding = explicit_sharding(leaf)
        if sharding is not None:
            raise ValueError(
                "`Outline()` applies `mv` out of line, which cannot take a vector "
                "sharded over an Explicit mesh axis; the `vector` given is sharded "
                f"{sharding.spec}. Use `Lazy()` or `Roll()`, or Auto mesh axes."
            )
