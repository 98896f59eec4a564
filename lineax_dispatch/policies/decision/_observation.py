"""What Auto knows about an operator when it decides: the `Observation`."""

from typing import Any

import equinox as eqx
import jax.tree_util as jtu
import lineax as lx
import numpy as np

from ..._explicit_axes import parts_of
from .._dense import EXPLICIT_OPERATORS
from .._memory import (
    array_bytes,
    matrix_bytes,
    structure_size,
    structures_dtype,
)
from ..calls._keys import is_leaf_array
from ._cost import mv_cost, MvCost


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
    - `mv_effects`: whether `mv` has effects (a `jax.debug.print`, a callback,
        `eqx.error_if`), which must run where and as often as the program applies
        it: `Materialise` (a build on basis vectors) and `Outline` are then not
        allowed.
    - `mv_batchable`: whether `vmap` can batch `mv` (not where it calls
        `jax.pure_callback` without a `vmap_method`): a matrix build, and applying
        a block of vectors in lockstep, need it.
    - `out_parts`, `in_parts`: the devices the output and the input are split
        over (typed with Explicit mesh axes; see `_explicit_axes.parts_of`): a
        matrix is built with its rows split as the output, and the memory budget
        is one device's, counting one device's part.
    - `solve_tolerance`: the solve's relative tolerance (the smaller of its
        nonzero `rtol` and `atol`), where the call sites are a solve whose solver
        states one; `None` otherwise. A solve is materialised only where
        `dense_rounding` is below it (see `materialise_keeps_answer`).
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
    mv_effects: bool = False
    mv_batchable: bool = True
    out_parts: int = 1
    in_parts: int = 1
    solve_tolerance: float | None = None

    @property
    def dense_rounding(self) -> float:
        """`in_size * eps` of the dtype: the worst-case relative rounding of an
        inner product of `in_size` terms, that of each entry of a dense matrix's
        product with a vector."""
        return self.in_size * float(np.finfo(np.dtype(self.dtype)).eps)

    @property
    def materialise_keeps_answer(self) -> bool:
        """Whether a dense matrix's products can reach the solve's tolerance
        wherever the user's `mv` does: always, except for a solve whose tolerance
        is within `dense_rounding`. (A dense product's rounding is that of its
        inner products, whatever the user's `mv` computes; `J^T J` applied as two
        products rounds far less than its matrix does. A float32 CG solve of one
        at n = 256 to `rtol = atol = 1e-5` converged from the user's `mv` and
        stalled short of its tolerance from the matrix.)"""
        tolerance = self.solve_tolerance
        return tolerance is None or self.solves == 0 or tolerance > self.dense_rounding

    @property
    def matrix_bytes(self) -> int:
        """Bytes of the dense matrix: `in_size * out_size * itemsize`."""
        return matrix_bytes(self.out_size, self.in_size, self.itemsize)


def _arrays_bytes(operator: lx.AbstractLinearOperator) -> int:
    """Bytes of the arrays `operator` holds as leaves."""
    leaves = jtu.tree_leaves(operator, is_leaf=is_leaf_array)
    return sum(array_bytes(x) for x in leaves if is_leaf_array(x))


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
    cost: MvCost | None = None,
    out_structure: Any = None,
    solve_tolerance: float | None = None,
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
    - `cost`: the cost of one `mv` where it is already known (a
        `lineax_dispatch.policies.MvCost`: `lxd.jit` reads it from the traced
        program), instead of tracing `mv`.
    - `out_structure`: the operator's output structure where it is already known
        (`lxd.jit` reads it from the traced program), instead of asking the
        operator (which may trace its function for it).
    - `solve_tolerance`: the solve's tolerance, where the call sites are a solve
        (see the field of [`lineax_dispatch.Observation`][]).

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
    dtype = structures_dtype(in_structure, out_structure)
    explicit = isinstance(operator, EXPLICIT_OPERATORS)
    operator_bytes = _arrays_bytes(operator)
    if explicit or not with_cost:
        cost = None
    elif cost is None:
        cost = mv_cost(operator)
    if cost is not None:
        # Arrays closed over by a closure-converted function are constants of
        # its jaxpr, not leaves: count them as the operator's own.
        operator_bytes += cost.constant_bytes
    return Observation(
        kind=type(operator).__name__,
        in_size=structure_size(in_structure),
        out_size=structure_size(out_structure),
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
        mv_flops=0.0 if cost is None else cost.flops,
        mv_bytes=0.0 if cost is None else cost.bytes,
        mv_dots=0 if cost is None else cost.dots,
        mv_ops=0 if cost is None else cost.ops,
        operator_bytes=int(operator_bytes),
        mv_workspace=0 if cost is None else int(cost.workspace),
        explicit=explicit,
        cost_source="none" if cost is None else cost.source,
        mv_effects=cost is not None and cost.effects,
        mv_batchable=cost is None or cost.batchable,
        out_parts=parts_of(out_structure),
        in_parts=parts_of(in_structure),
        solve_tolerance=None if solve_tolerance is None else float(solve_tolerance),
    )
