"""The cost of one `mv`: `MvCost`, from XLA's cost analysis or from the jaxpr."""

import collections
import contextvars
import dataclasses
import math
from typing import Any

import equinox as eqx
import jax
import jax.extend.core as jex
import jax.extend.core.primitives as prims
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx

from ..._compat import live_equations, pure_callback_p
from .._memory import array_bytes, itemsize, matrix_bytes, vector_bytes
from ..calls._keys import is_leaf_array
from ..calls._marked import inline_mv, mv_parts
from ..calls._scope import current_scope


class MvCost(eqx.Module):
    """The cost of one `mv`, as `lineax_dispatch.policies.mv_cost` gives it.

    **Arguments:** (each is also the attribute of that name)

    - `flops`: floating-point operations.
    - `bytes`: bytes accessed.
    - `dots`: dot products the function lowers to.
    - `ops`: other operations it lowers to.
    - `constant_bytes`: bytes of the arrays its jaxpr closes over.
    - `workspace`: bytes of every intermediate (what each vector of a batch needs).
    - `source`: where `flops` and `bytes` came from: `"cost_analysis"`, `"jaxpr"`
        or `"estimate"`.
    - `effects`: whether the `mv` has effects (a `jax.debug.print`, a callback,
        `eqx.error_if`): they must run where and as often as the program applies
        it.
    - `batchable`: whether `vmap` can batch the `mv` (not where it calls
        `jax.pure_callback` without a `vmap_method`).
    """

    flops: float
    bytes: float
    dots: int
    ops: int
    constant_bytes: int
    workspace: int
    source: str
    effects: bool = False
    batchable: bool = True


def batchable(jaxpr: Any) -> bool:
    """Whether `vmap` can batch `jaxpr`: no `jax.pure_callback` in it (at any
    depth) without a `vmap_method` (valid under `jax.jit`, refused by `vmap`).

    **Arguments:**

    - `jaxpr`: a `jax.extend.core.Jaxpr`.

    **Returns:**

    A bool.
    """
    for eqn in jaxpr.eqns:
        if (
            eqn.primitive is pure_callback_p
            and eqn.params.get("vmap_method", "unknown") is None
        ):
            return False
        if not all(batchable(sub) for sub in jex.jaxprs_in_params(eqn.params)):
            return False
    return True


@dataclasses.dataclass
class _Totals:
    """What `_walk` adds up over a jaxpr's equations."""

    flops: float = 0.0
    bytes: float = 0.0
    dots: int = 0
    ops: int = 0
    workspace: int = 0


# Lowering a function prints its closed-over constants into the module; above this
# many bytes of constants the cost comes from the jaxpr alone.
_LOWER_CONSTANTS_LIMIT = 16 * 2**20


# How `_walk` counts flops as XLA's cost analysis of the lowered function does
# (checked against it on jax 0.10.2 and 0.12, tests/policies/test_records.py): 2 m n k per
# dot product, one per element for the elementwise arithmetic below, none for the
# transcendentals (XLA counts those apart) and for moving data, n - 1 per
# reduction of n elements, the square-and-multiply products of `x**k`, and the
# operations `_EXPANDED` primitives lower to; every operand and result accessed
# once, a broadcast scalar operand as one array more. A function made of these
# alone (at any depth of nested calls; on complex values, of
# `_COUNTED_ON_COMPLEX` alone), computing nothing from the arrays it closes over
# alone (`_folds_constants`: XLA folds that), is not lowered for its cost: lowering
# and analysing a function costs more than the rest of a decision.
def _primitives(*names: str) -> frozenset:
    """The primitives `jax.extend.core.primitives.<name>_p` that this JAX has (a
    primitive new in a later JAX is left out on an older one)."""
    found = (getattr(prims, f"{name}_p", None) for name in names)
    return frozenset(p for p in found if p is not None)


_ELEMENTWISE = _primitives(
    "add", "add_jaxvals", "sub", "mul", "neg", "div", "max", "min", "abs", "sign",
    "select_n", "gt", "lt", "ge", "le", "eq", "ne", "and", "or", "not",
    "convert_element_type", "square", "floor", "ceil", "round", "clamp", "rem",
    "stop_gradient",
)  # fmt: skip


_MOVES = _primitives(
    "reshape", "slice", "pad", "broadcast_in_dim", "concatenate", "transpose",
    "squeeze", "rev", "copy", "dynamic_slice", "dynamic_update_slice",
)  # fmt: skip


_TRANSCENDENTAL = _primitives(
    "tanh", "exp", "exp2", "log", "log1p", "expm1", "sqrt", "rsqrt", "cbrt", "sin",
    "cos", "tan", "erf", "atan2", "pow",
)  # fmt: skip


_NO_FLOPS = _MOVES | _TRANSCENDENTAL


_REDUCTIONS = _primitives("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")


# Calls whose body is counted in place (`closed_call` is gone from jax 0.12's
# list).
_CALLS = _primitives("jit", "closed_call")


# Primitives lowered to several operations (`logistic` to `1 / (1 + exp(-x))`; jax
# >= 0.11's `one_minus_square`, tanh's derivative): their flops per element and
# arrays accessed beyond an operand and a result.
_EXPANDED = {
    p: counts
    for name, counts in (("logistic", (3.0, 9)), ("one_minus_square", (3.0, 8)))
    for p in _primitives(name)
}


_COUNTED_AS_XLA = (
    _ELEMENTWISE
    | _NO_FLOPS
    | _REDUCTIONS
    | _CALLS
    | frozenset(_EXPANDED)
    | {prims.dot_general_p, prims.integer_pow_p}
)


# Of these, the ones counted so on complex values too.
_COUNTED_ON_COMPLEX = (
    _primitives("dot_general", "add", "add_jaxvals", "sub", "mul", "neg")
    | _MOVES
    | _CALLS
)


def _walk(jaxpr, totals: _Totals) -> None:
    for eqn in jaxpr.eqns:
        subs = list(jex.jaxprs_in_params(eqn.params))
        if subs:
            for sub in subs:
                _walk(sub, totals)
            continue
        out_avals = [v.aval for v in eqn.outvars]
        in_avals = [v.aval for v in eqn.invars if hasattr(v.aval, "shape")]
        totals.bytes += sum(array_bytes(a) for a in in_avals + out_avals)
        totals.workspace += sum(array_bytes(a) for a in out_avals)
        primitive = eqn.primitive
        out_size = sum(math.prod(a.shape) for a in out_avals)
        if primitive is prims.dot_general_p:
            (lhs_contract, _), (lhs_batch, _) = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval
            contracted = math.prod(lhs.shape[d] for d in lhs_contract)
            totals.flops += 2.0 * out_size * contracted
            totals.dots += 1
            continue
        totals.ops += 1
        if primitive in _NO_FLOPS:
            continue
        if primitive in _REDUCTIONS:
            in_size = sum(math.prod(a.shape) for a in in_avals)
            totals.flops += float(max(in_size - out_size, 0))
        elif primitive is prims.integer_pow_p:
            k = abs(int(eqn.params["y"]))
            multiplies = max(k.bit_length() + bin(k).count("1") - 2, 1)
            totals.flops += float(out_size * multiplies)
            # Lowered to that many products, each reading two arrays and writing
            # one.
            out_bytes = sum(array_bytes(a) for a in out_avals)
            totals.bytes += (3 * multiplies - 2) * out_bytes
        elif primitive in _EXPANDED:
            flops, arrays = _EXPANDED[primitive]
            totals.flops += flops * out_size
            totals.bytes += arrays * sum(array_bytes(a) for a in out_avals)
        else:
            totals.flops += float(out_size)
            # A scalar operand of an array operation is broadcast first: one array
            # more written and read.
            if out_size > 1:
                scalars = sum(1 for a in in_avals if not a.shape)
                totals.bytes += scalars * sum(array_bytes(a) for a in out_avals)


def _counted_as_xla(jaxpr: Any) -> bool:
    """Whether `_walk`'s count of `jaxpr` is XLA's (see `_COUNTED_AS_XLA`): every
    equation, in nested calls too, of a primitive counted so (on complex values,
    one of `_COUNTED_ON_COMPLEX`)."""
    for eqn in jaxpr.eqns:
        primitive = eqn.primitive
        if primitive not in _COUNTED_AS_XLA:
            return False
        avals = [v.aval for v in (*eqn.invars, *eqn.outvars)]
        if not all(hasattr(a, "dtype") for a in avals):
            return False
        complex_ = any(jnp.issubdtype(a.dtype, jnp.complexfloating) for a in avals)
        if complex_ and primitive not in _COUNTED_ON_COMPLEX:
            return False
        if not all(_counted_as_xla(sub) for sub in jex.jaxprs_in_params(eqn.params)):
            return False
    return True


def _folds_constants(jaxpr: Any, constant: set) -> bool:
    """Whether an equation of `jaxpr` (in nested calls too) computes from constants
    alone: from the variables in `constant` (the arrays it closes over), with
    literals or not. XLA folds such a computation (or does not count it), where
    `_walk` would count it at every `mv`."""
    for eqn in jaxpr.eqns:
        known = [isinstance(v, jex.Literal) or v in constant for v in eqn.invars]
        # (An equation of literals alone makes a scalar: not worth a lowering.)
        if all(known) and any(v in constant for v in eqn.invars):
            return True
        if eqn.primitive in _CALLS:
            for sub in jex.jaxprs_in_params(eqn.params):
                inner = {s for s, v in zip(sub.invars, eqn.invars) if v in constant}
                if _folds_constants(sub, inner | set(sub.constvars)):
                    return True
    return False


def jaxpr_cost(closed: Any) -> MvCost:
    """Flops, bytes accessed, operation counts, workspace and constant bytes of a
    closed jaxpr, from its equations alone (dot products counted exactly, other
    operations by their output sizes); nothing is traced or lowered.

    **Arguments:**

    - `closed`: a `jax.extend.core.ClosedJaxpr`.

    **Returns:**

    A `lineax_dispatch.policies.MvCost` with `source` `"jaxpr"`.
    """
    totals = _Totals()
    _walk(closed.jaxpr, totals)
    constant_bytes = sum(array_bytes(c) for c in closed.consts if hasattr(c, "shape"))
    return MvCost(
        flops=totals.flops,
        bytes=totals.bytes,
        dots=totals.dots,
        ops=totals.ops,
        constant_bytes=int(constant_bytes),
        workspace=totals.workspace,
        source="jaxpr",
        effects=bool(closed.effects),
        batchable=batchable(closed.jaxpr),
    )


def _estimate(operator: lx.AbstractLinearOperator) -> MvCost:
    """The cost of a dense matrix-vector product, for an operator whose `mv` cannot
    be traced alone."""
    in_size, out_size = operator.in_size(), operator.out_size()
    size = itemsize(operator)
    return MvCost(
        flops=2.0 * in_size * out_size,
        bytes=float(matrix_bytes(out_size, in_size, size)),
        dots=1,
        ops=1,
        constant_bytes=0,
        workspace=2 * vector_bytes(in_size + out_size, size),
        source="estimate",
    )


def mv_cost(operator: lx.AbstractLinearOperator) -> MvCost:
    """Flops, bytes accessed, operation counts and constant bytes of one `mv`;
    cached per operator kind in the current context. The kind is that of the
    plain lineax `mv` (`mv_parts`), whatever the operator's own policy: the cost
    traced is that `mv`'s, so an `Auto` operator and the same operator with its
    decided policy (CG's layout choice reads the one its loop applies) share one
    entry, and `mv` is traced for its cost once.

    Flops and bytes come from the jaxpr (its live equations, as JAX lowers them),
    counted as XLA's cost analysis counts them, where every primitive in it is one
    whose count is known (dot products, elementwise arithmetic, transcendentals,
    data movement, reductions, nested calls of these) and nothing in it is
    computed from the arrays it closes over alone (which XLA folds): a stencil, a
    small network, a JVP or VJP of one, a closed-over matrix applied as it is.
    Otherwise from XLA's `cost_analysis()` of the lowered (not compiled) function
    where the backend gives it and the function's constants are small, else from
    the jaxpr (other operations by their output sizes). Dot and operation counts always come from
    the jaxpr.

    **Arguments:**

    - `operator`: the operator.

    **Returns:**

    A `lineax_dispatch.policies.MvCost`: `flops`, `bytes`, `dots`, `ops`,
    `constant_bytes`, `workspace` (bytes of every intermediate of one `mv`: what
    each vector of a batch needs) and `source`.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure)
        cost = lxd.policies.mv_cost(op)
        print(cost.flops, cost.source)
        ```
    """
    dynamic, static = _abstract_mv_parts(operator)
    key = _kind(dynamic, static)
    cache = cost_cache()
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    # Traced through the marked call that applies it inline: a later call in the
    # same trace reuses this trace of the user's function. One trace gives the
    # jaxpr and the lowering.
    try:
        traced = inline_mv.trace(
            (static, current_scope()), dynamic, operator.in_structure()
        )
        closed = traced.jaxpr
    except Exception:  # an operator whose mv cannot be traced alone
        cost = _estimate(operator)
        _keep(cache, key, cost)
        return cost
    live = live_equations(closed.jaxpr)
    cost = jaxpr_cost(closed.replace(jaxpr=live))
    exact = _counted_as_xla(live) and not _folds_constants(live, live.constvars)
    if not exact and cost.constant_bytes <= _LOWER_CONSTANTS_LIMIT:
        try:
            analysis = traced.lower().cost_analysis() or {}
            if isinstance(analysis, list):  # older jax: one dict per computation
                analysis = analysis[0] if analysis else {}
        except Exception:  # a backend without cost analysis
            analysis = {}
        if "flops" in analysis:
            cost = dataclasses.replace(
                cost,
                flops=float(analysis["flops"]),
                bytes=float(analysis.get("bytes accessed", cost.bytes)),
                source="cost_analysis",
            )
    _keep(cache, key, cost)
    return cost


def _abstract_mv_parts(operator: lx.AbstractLinearOperator) -> tuple[Any, Any]:
    """`mv_parts(operator)` with its arrays as `jax.ShapeDtypeStruct`s; the same
    for an operator a record keeps (`abstract_operator`: its arrays already
    `jax.ShapeDtypeStruct`s) as for the operator it was made from."""
    dynamic, static = mv_parts(operator, is_leaf_array)
    dynamic = jtu.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        dynamic,
        is_leaf=is_leaf_array,
    )
    return dynamic, static


def _kind(dynamic: Any, static: Any) -> tuple:
    """The key of `mv_cost`'s cache: the static half of the plain `mv` and the
    shapes and dtypes of its arrays."""
    return static, tuple((x.shape, str(x.dtype)) for x in jtu.tree_leaves(dynamic))


def cost_key(operator: lx.AbstractLinearOperator) -> tuple:
    """The key under which `mv_cost` caches the cost of `operator`'s `mv`: equal
    for operators whose plain lineax `mv` is the same, whatever their own
    policies."""
    return _kind(*_abstract_mv_parts(operator))


# Operator kinds whose cost each context keeps (the least recently used beyond
# it are dropped, and measured again if met again): a program of fresh operator
# functions, made again and again, is a new kind each time.
COSTS_KEPT = 256


# Per-context cache of cost analyses: kind of `mv` -> cost, least recently used
# first. A context variable: `Auto.mv` is called by lineax with no argument to
# carry a cache.
_COSTS: contextvars.ContextVar[collections.OrderedDict | None] = contextvars.ContextVar(
    "lineax_dispatch_costs", default=None
)


def cost_cache() -> collections.OrderedDict:
    """This context's cache of `mv_cost`s, by the kind of the plain lineax `mv`."""
    value = _COSTS.get()
    if value is None:
        value = collections.OrderedDict()
        _COSTS.set(value)
    return value


def _keep(cache: collections.OrderedDict, key: Any, cost: MvCost) -> None:
    """`cost` stored under `key`, the least recently used beyond `COSTS_KEPT`
    dropped."""
    cache[key] = cost
    while len(cache) > COSTS_KEPT:
        cache.popitem(last=False)
