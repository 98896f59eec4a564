"""What Auto knows about an operator when it decides: the `Observation`."""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx

from ._dense import EXPLICIT_OPERATORS
from ._guard import operator_dtype, promoted_dtype
from ._marked import current_scope, inline_mv, mv_parts
from ._registry import cost_cache, is_leaf_array, operator_key


class Observation(eqx.Module):
    """Everything [`lineax_dispatch.decide`][] uses, as plain Python numbers: what
    is known of an operator and of its use. [`lineax_dispatch.observe`][] builds
    one from an operator; build one by hand to ask what `Auto` would choose in
    another situation.

    !!! Example

        ```python
        o = lxd.Observation(kind="FunctionLinearOperator", in_size=1024,
                            out_size=1024, dtype="float32", itemsize=4,
                            memory_budget=2**30, call_sites=16, mv_flops=6.7e7,
                            mv_bytes=1.3e8, mv_dots=32)
        print(lxd.decide(o).strategy, o.matrix_bytes)
        ```

    **Arguments:** (each is also the attribute of that name)

    - `kind`: the operator's class name.
    - `in_size`, `out_size`: numbers of unknowns and of equations.
    - `dtype`: the name of the operator's dtype; `itemsize` its bytes per entry.
    - `memory_budget`: bytes Auto may spend on a materialised matrix (including
        the peak while building it).
    - `call_sites`: how many copies of `mv` the traced program holds.
    - `executions`: how many times `mv` is expected to run per run of the program
        (call sites outside loops count once; a solver's loop counts its expected
        iterations).
    - `batch`: how many vectors each application handles (1 for a single `mv`).
    - `solves`: how many of the call sites are solves (each of which would build
        its own matrix if materialised).
    - `runs`: how many times the compiled program is expected to run: compile time
        counts once, run time `runs` times.
    - `rollable`: whether the call sites can become one loop body (under
        [`lineax_dispatch.jit`][], two or more sites at the top level of the
        program), making `Roll` a candidate.
    - `stackable`: whether those sites are also independent of each other, so that
        `Roll` applies them as one batched call, reading the operator's arrays once
        for all of them.
    - `mv_flops`, `mv_bytes`: cost of one `mv` from XLA's `cost_analysis()` of the
        lowered function (or an estimate where the backend gives none).
    - `mv_dots`, `mv_ops`: how many dot products and other operations one `mv`
        lowers to: what its compilation costs.
    - `operator_bytes`: bytes of the operator's own arrays (what an outlined call
        hands over).
    - `mv_workspace`: bytes of the intermediates of one `mv` (the memory each
        vector of a batch, or each column of a matrix build, needs).
    - `explicit`: whether the operator already holds its entries (matrix,
        diagonal...), so that materialising changes nothing.
    - `cost_source`: where the costs came from (`"cost_analysis"`, `"estimate"`).
    """

    kind: str
    in_size: int
    out_size: int
    dtype: str
    itemsize: int
    memory_budget: int
    call_sites: int = 1
    executions: float = 1.0
    batch: int = 1
    solves: int = 0
    runs: float = 1.0
    rollable: bool = False
    stackable: bool = False
    mv_flops: float = 0.0
    mv_bytes: float = 0.0
    mv_dots: int = 0
    mv_ops: int = 0
    operator_bytes: int = 0
    mv_workspace: int = 0
    explicit: bool = False
    cost_source: str = "estimate"

    @property
    def matrix_bytes(self) -> int:
        """Bytes of the dense matrix: `in_size * out_size * itemsize`."""
        return self.in_size * self.out_size * self.itemsize


# Lowering a function prints its closed-over constants into the module; above this
# many bytes of constants the cost comes from the jaxpr alone.
_LOWER_CONSTANTS_LIMIT = 16 * 2**20


def _sub_jaxprs(eqn) -> list:
    out = []
    for value in eqn.params.values():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if hasattr(item, "jaxpr") and hasattr(item, "consts"):
                out.append(item.jaxpr)
            elif hasattr(item, "eqns"):
                out.append(item)
    return out


def _walk(jaxpr, totals: dict) -> None:
    for eqn in jaxpr.eqns:
        subs = _sub_jaxprs(eqn)
        if subs:
            for sub in subs:
                _walk(sub, totals)
            continue
        out_avals = [v.aval for v in eqn.outvars]
        in_avals = [v.aval for v in eqn.invars if hasattr(v.aval, "shape")]
        nbytes = sum(
            math.prod(a.shape) * a.dtype.itemsize
            for a in in_avals + out_avals
            if hasattr(a, "dtype")
        )
        totals["bytes"] += nbytes
        totals["workspace"] += sum(
            math.prod(a.shape) * a.dtype.itemsize
            for a in out_avals
            if hasattr(a, "dtype")
        )
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), (lhs_batch, _) = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval
            contracted = math.prod(lhs.shape[d] for d in lhs_contract)
            out_size = math.prod(out_avals[0].shape)
            totals["flops"] += 2.0 * out_size * contracted
            totals["dots"] += 1
        else:
            totals["flops"] += float(sum(math.prod(a.shape) for a in out_avals))
            totals["ops"] += 1


def jaxpr_cost(closed: Any) -> dict[str, Any]:
    """Flops, bytes accessed, operation counts, workspace and constant bytes of a
    closed jaxpr, from its equations alone (dot products counted exactly, other
    operations by their output sizes); nothing is traced or lowered.

    **Arguments:**

    - `closed`: a `jax.extend.core.ClosedJaxpr`.

    **Returns:**

    A dict as `mv_cost` returns, with `source` `"jaxpr"`.
    """
    totals = {"flops": 0.0, "bytes": 0.0, "dots": 0, "ops": 0, "workspace": 0}
    _walk(closed.jaxpr, totals)
    constant_bytes = sum(
        getattr(c, "nbytes", 0) for c in closed.consts if hasattr(c, "shape")
    )
    return dict(totals, constant_bytes=int(constant_bytes), source="jaxpr")


def mv_cost(operator: lx.AbstractLinearOperator, key: Any = None) -> dict[str, Any]:
    """Flops, bytes accessed, operation counts and constant bytes of one `mv`;
    cached per operator kind in the current context.

    Flops and bytes come from XLA's `cost_analysis()` of the lowered (not
    compiled) function where the backend gives it and the function's constants
    are small; otherwise from the jaxpr (dot products counted exactly, other
    operations by their output sizes). Dot and operation counts always come from
    the jaxpr.

    **Returns:**

    A dict with `flops`, `bytes`, `dots`, `ops`, `constant_bytes`, `workspace`
    (bytes of every intermediate of one `mv`: what each vector of a batch needs)
    and `source`.
    """
    key = operator_key(operator) if key is None else key
    cache = cost_cache()
    if key in cache:
        return cache[key]
    # Traced through the marked call that applies it inline: a later call in the
    # same trace reuses this trace of the user's function. One trace gives the
    # jaxpr and the lowering.
    dynamic, static = mv_parts(operator)
    dynamic = jtu.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        dynamic,
        is_leaf=is_leaf_array,
    )
    try:
        traced = inline_mv.trace(
            (static, current_scope()), dynamic, operator.in_structure()
        )
        closed = traced.jaxpr
    except Exception:  # an operator whose mv cannot be traced alone
        in_size, out_size = operator.in_size(), operator.out_size()
        itemsize = jnp.dtype(operator_dtype(operator)).itemsize
        cost = {
            "flops": 2.0 * in_size * out_size,
            "bytes": float(in_size * out_size * itemsize),
            "dots": 1,
            "ops": 1,
            "constant_bytes": 0,
            "workspace": 2 * (in_size + out_size) * itemsize,
            "source": "estimate",
        }
        cache[key] = cost
        return cost
    cost = jaxpr_cost(closed)
    constant_bytes = cost["constant_bytes"]
    if constant_bytes <= _LOWER_CONSTANTS_LIMIT:
        try:
            analysis = traced.lower().cost_analysis() or {}
            if isinstance(analysis, list):  # older jax: one dict per computation
                analysis = analysis[0] if analysis else {}
        except Exception:  # a backend without cost analysis
            analysis = {}
        if "flops" in analysis:
            cost["flops"] = float(analysis["flops"])
            cost["bytes"] = float(analysis.get("bytes accessed", cost["bytes"]))
            cost["source"] = "cost_analysis"
    cache[key] = cost
    return cost


def _size(structure: Any) -> int:
    return sum(math.prod(x.shape) for x in jtu.tree_leaves(structure))


def observe(
    operator: lx.AbstractLinearOperator,
    *,
    memory_budget: int,
    call_sites: int = 1,
    executions: float = 1.0,
    batch: int = 1,
    solves: int = 0,
    runs: float = 1.0,
    rollable: bool = False,
    stackable: bool = False,
    with_cost: bool = True,
    key: Any = None,
    cost: dict[str, Any] | None = None,
    out_structure: Any = None,
) -> Observation:
    """Builds the [`lineax_dispatch.Observation`][] of `operator`: its sizes, dtype
    and arrays, and the cost of one `mv` (from XLA's cost analysis of the lowered,
    not compiled, function, cached per operator kind), with the use given.

    **Arguments:**

    - `operator`: the operator.
    - `memory_budget`: bytes.
    - `call_sites`, `executions`, `batch`, `solves`, `runs`, `rollable`,
        `stackable`: as observed or expected (see the fields of [`lineax_dispatch.Observation`][]).
    - `with_cost`: whether to lower `mv` for its cost (skipped when the decision
        cannot depend on it).
    - `key`: the operator's key for the cost cache (computed when `None`).
    - `cost`: the cost of one `mv` where it is already known (as `mv_cost` gives
        it: `lxd.jit` reads it from the traced program), instead of tracing `mv`.
    - `out_structure`: the operator's output structure where it is already known
        (`lxd.jit` reads it from the traced program), instead of asking the
        operator (which may trace its function for it).

    **Returns:**

    An [`lineax_dispatch.Observation`][].

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure)
        o = lxd.observe(op, memory_budget=2**30, call_sites=4)
        print(o.mv_flops, o.matrix_bytes)
        ```
    """
    in_structure = operator.in_structure()
    if out_structure is None:
        out_structure = operator.out_structure()
    leaves = jtu.tree_leaves((in_structure, out_structure))
    dtype = jnp.dtype(promoted_dtype(*[x.dtype for x in leaves]))
    explicit = isinstance(operator, EXPLICIT_OPERATORS)
    operator_bytes = sum(
        math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
        for x in jtu.tree_leaves(eqx.filter(operator, is_leaf_array))
    )
    if explicit or not with_cost:
        cost = None
    elif cost is None:
        cost = mv_cost(operator, key)
    if cost is not None:
        # Arrays closed over by a closure-converted function are constants of
        # its jaxpr, not leaves: count them as the operator's own.
        operator_bytes += cost["constant_bytes"]
    return Observation(
        kind=type(operator).__name__,
        in_size=_size(in_structure),
        out_size=_size(out_structure),
        dtype=dtype.name,
        itemsize=dtype.itemsize,
        memory_budget=int(memory_budget),
        call_sites=int(call_sites),
        executions=float(executions),
        batch=int(batch),
        solves=int(solves),
        runs=float(runs),
        rollable=bool(rollable),
        stackable=bool(stackable and rollable),
        mv_flops=0.0 if cost is None else cost["flops"],
        mv_bytes=0.0 if cost is None else cost["bytes"],
        mv_dots=0 if cost is None else cost["dots"],
        mv_ops=0 if cost is None else cost["ops"],
        operator_bytes=int(operator_bytes),
        mv_workspace=0 if cost is None else int(cost["workspace"]),
        explicit=explicit,
        cost_source="none" if cost is None else cost["source"],
    )
