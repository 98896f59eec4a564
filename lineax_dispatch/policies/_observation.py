"""What Auto knows about an operator when it decides: the `Observation`."""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx

from ._base import RawMv
from ._dense import EXPLICIT_OPERATORS
from ._registry import cost_cache, is_leaf_array, operator_key


class Observation(eqx.Module):
    """Everything `decide` uses, as plain Python numbers.

    **Fields:**

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
    - `mv_flops`, `mv_bytes`: cost of one `mv` from XLA's `cost_analysis()` of the
        lowered function (or an estimate where the backend gives none).
    - `mv_dots`, `mv_ops`: how many dot products and other operations one `mv`
        lowers to: what its compilation costs.
    - `operator_bytes`: bytes of the operator's own arrays (what an outlined call
        hands over).
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
    mv_flops: float = 0.0
    mv_bytes: float = 0.0
    mv_dots: int = 0
    mv_ops: int = 0
    operator_bytes: int = 0
    explicit: bool = False
    cost_source: str = "estimate"

    @property
    def matrix_bytes(self) -> int:
        return self.in_size * self.out_size * self.itemsize


def _dtype_of(operator: lx.AbstractLinearOperator) -> Any:
    leaves = jtu.tree_leaves((operator.in_structure(), operator.out_structure()))
    return jnp.result_type(*[x.dtype for x in leaves]) if leaves else jnp.float32


def mv_cost(operator: lx.AbstractLinearOperator, key: Any = None) -> dict[str, Any]:
    """Flops, bytes accessed and operation counts of one `mv`, from the lowered
    (not compiled) function; cached per operator kind in the current context.

    **Returns:**

    A dict with `flops`, `bytes`, `dots`, `ops` and `source`.
    """
    key = operator_key(operator) if key is None else key
    cache = cost_cache()
    if key in cache:
        return cache[key]
    dynamic, static = eqx.partition(RawMv(operator), is_leaf_array)
    dynamic = jtu.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), dynamic)
    vector = operator.in_structure()

    def apply(dynamic, vector):
        return eqx.combine(dynamic, static)(vector)

    dtype = _dtype_of(operator)
    in_size, out_size = operator.in_size(), operator.out_size()
    fallback = {
        "flops": 2.0 * in_size * out_size,
        "bytes": float(in_size * out_size * jnp.dtype(dtype).itemsize),
        "dots": 1,
        "ops": 1,
        "source": "estimate",
    }
    try:
        lowered = jax.jit(apply).lower(dynamic, vector)
        text = lowered.as_text()
        analysis = lowered.cost_analysis() or {}
        if isinstance(analysis, list):  # older jax: one dict per computation
            analysis = analysis[0] if analysis else {}
        dots = text.count("stablehlo.dot")
        ops = sum(1 for line in text.splitlines() if "= stablehlo." in line)
        cost = {
            "flops": float(analysis.get("flops", fallback["flops"])),
            "bytes": float(analysis.get("bytes accessed", fallback["bytes"])),
            "dots": dots,
            "ops": ops,
            "source": "cost_analysis" if analysis else "estimate",
        }
    except Exception:  # a backend or operator that cannot be lowered alone
        cost = fallback
    cache[key] = cost
    return cost


def observe(
    operator: lx.AbstractLinearOperator,
    *,
    memory_budget: int,
    call_sites: int = 1,
    executions: float = 1.0,
    batch: int = 1,
    with_cost: bool = True,
    key: Any = None,
) -> Observation:
    """Builds the `Observation` of `operator`.

    **Arguments:**

    - `operator`: the operator.
    - `memory_budget`: bytes.
    - `call_sites`, `executions`, `batch`: as observed or expected.
    - `with_cost`: whether to lower `mv` for its cost (skipped when the decision
        cannot depend on it).
    - `key`: the operator's key for the cost cache (computed when `None`).

    **Returns:**

    An [`lineax_dispatch.Observation`][].
    """
    dtype = jnp.dtype(_dtype_of(operator))
    explicit = isinstance(operator, EXPLICIT_OPERATORS)
    operator_bytes = sum(
        math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
        for x in jtu.tree_leaves(eqx.filter(operator, is_leaf_array))
    )
    cost = mv_cost(operator, key) if (with_cost and not explicit) else None
    return Observation(
        kind=type(operator).__name__,
        in_size=operator.in_size(),
        out_size=operator.out_size(),
        dtype=dtype.name,
        itemsize=dtype.itemsize,
        memory_budget=int(memory_budget),
        call_sites=int(call_sites),
        executions=float(executions),
        batch=int(batch),
        mv_flops=0.0 if cost is None else cost["flops"],
        mv_bytes=0.0 if cost is None else cost["bytes"],
        mv_dots=0 if cost is None else cost["dots"],
        mv_ops=0 if cost is None else cost["ops"],
        operator_bytes=int(operator_bytes),
        explicit=explicit,
        cost_source="none" if cost is None else cost["source"],
    )
