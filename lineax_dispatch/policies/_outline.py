"""The `Outline` policy: one compiled callee shared by every call site."""

from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.extend.core as jex
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import PyTree

from .._compat import traced_consts
from ._base import AbstractPolicy, RawMv
from ._marked import current_scope, inline_mv, marked_mv, mv_parts, outline_mv


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
    vmap) for the shapes of the transformed call, so the zeros it returns are
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
    - jax 0.10: built on `equinox.internal.noinline`, so `jit`, `vmap`, `grad` and
        linear transposition all work through it. The cost is paid at run time:
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

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
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
        mv = JaxprMv(arrays, traced.jaxpr)
        out_leaves, out_treedef = jtu.tree_flatten(traced.out_info)
        structure = tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in out_leaves)
        leaves = eqxi.noinline(mv, _AbstractMv(structure))(
            tuple(jtu.tree_leaves(vector))
        )
        return jtu.tree_unflatten(out_treedef, list(leaves))


Outline.__init__.__doc__ = """**Arguments:** None."""
