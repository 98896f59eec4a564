"""`batch_mv` and `batch_solve`: one operator, a stack of vectors."""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import Array, PyTree

from ..._precision import batched_products, default_precision
from ...operators import (
    AbstractDispatchOperator,
    materialise,
    MatrixLinearOperator,
    with_policy,
)
from ...operators._sharding import (
    batch_as_structure,
    sharded_structure,
    stack_sharding,
)
from ...operators._vector_structure import promotes_to
from ...policies import (
    AbstractPolicy,
    Auto,
    check_policy,
    dense_matrix,
    Lazy,
    Materialise,
    Scan,
    VmapBatch,
)
from ...policies._at_precision import at_precision
from ...policies._dense import check_batch_size
from ...policies._memory import policy_in_force
from .._auto_solver import AutoSolver
from .._prepare import _single_array, _tags, expected_iterations
from ._mesh_chunks import as_mesh, sharded, with_progress


def check_vectors(
    vectors: PyTree[Any],
    structure: PyTree[jax.ShapeDtypeStruct],
    what: str,
    promote: bool = False,
) -> int:
    """Checks that `vectors` is `structure` with a leading batch axis on every leaf
    (with `promote`, a dtype that promotes safely to the structure's also passes,
    as `mv` casts an integer vector).

    **Returns:**

    The batch size (0 for an empty batch, which `vmap` maps as it maps any).

    **Raises:**

    `ValueError` naming `vectors`, with what was expected and what was given.
    """
    leaves, treedef = jtu.tree_flatten(vectors)
    expected_leaves, expected_treedef = jtu.tree_flatten(structure)
    expected = jtu.tree_map(
        lambda s: f"[batch, {', '.join(map(str, s.shape))}] {s.dtype}", structure
    )
    got = jtu.tree_map(lambda x: f"{list(jnp.shape(x))} {jnp.result_type(x)}", vectors)
    message = (
        f"`vectors` must match the operator's {what} with a leading batch axis on "
        f"every leaf: expected {expected}, got {got}"
    )
    if treedef != expected_treedef:
        raise ValueError(message + " (a different PyTree structure).")
    sizes = set()
    for leaf, spec in zip(leaves, expected_leaves):
        shape = tuple(jnp.shape(leaf))
        if len(shape) != len(spec.shape) + 1 or shape[1:] != tuple(spec.shape):
            raise ValueError(message + ".")
        dtype = jnp.result_type(leaf)
        if dtype != jnp.dtype(spec.dtype) and not (
            promote and promotes_to(dtype, spec.dtype)
        ):
            raise ValueError(message + " (a different dtype).")
        sizes.add(shape[0])
    if len(sizes) > 1:
        raise ValueError(
            message + f" (leaves with different batch sizes {sorted(sizes)})."
        )
    return sizes.pop() if sizes else 0


def _resolve_policy(
    operator: lx.AbstractLinearOperator, policy: AbstractPolicy | None
) -> tuple[lx.AbstractLinearOperator, AbstractPolicy]:
    if policy is not None:
        operator = with_policy(operator, check_policy(policy))
    if isinstance(operator, AbstractDispatchOperator):
        return operator, operator.policy
    return operator, Lazy()


def _vmaps_explicit_axes(
    solver: lx.AbstractLinearSolver, operator: lx.AbstractLinearOperator
) -> bool:
    """Whether `vmap` can batch `solver`'s solves of `operator`: not where an
    Explicit mesh axis shards its vectors and the solver that runs (the one
    `AutoSolver` picks, the one `PolicySolver` or `Normal` wraps) says it cannot
    (`AbstractOneSiteSolver.vmaps_explicit_axes`)."""
    if sharded_structure(operator) is None:
        return True
    if isinstance(solver, AutoSolver):
        solver = solver.select(operator)
    inner = getattr(solver, "inner_solver", getattr(solver, "solver", None))
    if isinstance(inner, lx.AbstractLinearSolver):
        return _vmaps_explicit_axes(inner, operator)
    return getattr(solver, "vmaps_explicit_axes", True)


def _apply_stack(fn, vectors, strategy: AbstractPolicy):
    """`fn` on each vector of the stack, as `strategy` says: one at a time, or
    batched, its products then at the precision one vector's have
    (`_precision.batched_products`)."""
    if isinstance(strategy, Scan):
        return lax.map(fn, vectors)
    with batched_products():
        if isinstance(strategy, VmapBatch) and strategy.batch_size is not None:
            return lax.map(fn, vectors, batch_size=strategy.batch_size)
        return jax.vmap(fn)(vectors)


def _materialised(operator: lx.AbstractLinearOperator, batch_size: int | None):
    """The operator as a matrix operator (built once), where its structures allow."""
    if isinstance(operator, MatrixLinearOperator):
        return operator
    if _single_array(operator.in_structure()) and _single_array(
        operator.out_structure()
    ):
        matrix = dense_matrix(operator, batch_size)
        return MatrixLinearOperator(matrix, _tags(operator), policy=Lazy())
    return with_policy(materialise(operator), Lazy())


def batch_mv(
    operator: lx.AbstractLinearOperator,
    vectors: PyTree[Array],
    *,
    policy: AbstractPolicy | None = None,
) -> PyTree[Array]:
    """Applies `operator` to every vector of a stack.

    The strategy is the operator's policy (or `policy`): `VmapBatch` in lockstep or
    in chunks, `Scan` one at a time, `Materialise` one matrix-matrix product for the
    whole stack, `Lazy`/`Outline` a `vmap` of their `mv`; `Auto` chooses from the
    memory budget (workspace per vector x batch) and from the batch size against
    the operator's size.

    **Arguments:**

    - `operator`: a lineax operator.
    - `vectors`: a PyTree matching `operator.in_structure()` with a leading batch
        axis on every leaf.
    - `policy`: overrides the operator's policy for this call.

    **Returns:**

    The outputs, stacked along a leading batch axis.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.array([[2.0, 1.0], [1.0, 3.0]]))
        ys = lxd.batch_mv(op, jnp.ones((5, 2)))  # shape (5, 2)
        ys = lxd.batch_mv(op, jnp.ones((5, 2)), policy=lxd.VmapBatch(batch_size=2))
        ```
    """
    _check_operator(operator, "batch_mv")
    if policy is not None:
        policy = check_policy(policy)
    structure = operator.in_structure()
    check_vectors(vectors, structure, "input structure", promote=True)
    # Cast as `mv` casts one vector (an integer one to the operator's dtype).
    vectors = jtu.tree_map(lambda x, s: jnp.asarray(x, s.dtype), vectors, structure)
    return _batch_mv_jit(operator, vectors, policy)


def _batch_mv_impl(operator, vectors, policy):
    batch = check_vectors(vectors, operator.in_structure(), "input structure")
    operator, strategy = _resolve_policy(operator, policy)
    with policy_in_force(strategy):
        if isinstance(strategy, Auto):
            strategy = strategy.decision(operator, batch=batch).policy
        if isinstance(strategy, Materialise):
            operator = _materialised(operator, strategy.batch_size)
            strategy = VmapBatch()
        return _apply_stack(operator.mv, vectors, strategy)


# Compiled once per signature and reused by eager calls (inlined under a trace).
_batch_mv_jit = eqx.filter_jit(_batch_mv_impl)


def batch_solve(
    operator: lx.AbstractLinearOperator,
    vectors: PyTree[Array],
    solver: lx.AbstractLinearSolver = lx.AutoLinearSolver(well_posed=True),
    *,
    policy: AbstractPolicy | None = None,
    options: dict[str, Any] | None = None,
    throw: bool = True,
    batch_size: int | None = None,
    # jax exports `Device` by plain assignment (`Device = _xc.Device`), which
    # pyright does not read as a type.
    mesh: jax.sharding.Mesh | Sequence[jax.Device] | None = None,  # pyright: ignore[reportInvalidTypeForm]
    progress: bool = False,
) -> lx.Solution:
    """Solves `operator x = b` for every right-hand side `b` of a stack.

    The solver's `init` runs once, so a direct solver factors once and back-solves
    every right-hand side. The right-hand sides are then solved in lockstep
    (`vmap`), in chunks of `batch_size` (`jax.lax.map(..., batch_size=)`) or one at a
    time, as `batch_size` or the operator's policy says; with `Auto` the decision
    counts the whole batch: when there are at least as many right-hand sides as
    unknowns and the matrix fits the memory budget, the operator is materialised
    once. On vectors sharded over an Explicit mesh axis, `GMRES` (or a solver that
    runs it) solves one right-hand side at a time, whatever `batch_size` says:
    JAX cannot batch its loop there (see "Across devices and machines").

    **Arguments:**

    - `operator`: a lineax operator.
    - `vectors`: a PyTree matching `operator.out_structure()` with a leading batch
        axis on every leaf.
    - `solver`: any lineax solver. Defaults to `lx.AutoLinearSolver(well_posed=True)`.
    - `policy`: overrides the operator's policy for this solve.
    - `options`: the solver's options, shared by every right-hand side.
    - `throw`: raise if any solve fails (`True`), or report per right-hand side in
        `Solution.result`.
    - `batch_size`: solve this many right-hand sides at a time; `None` lets the
        policy decide (all at once unless the memory budget says otherwise).
    - `mesh`: a `jax.sharding.Mesh` (its first axis is used) or a list of devices:
        the right-hand sides are sharded over it along the batch axis (padded to a
        multiple of its size), the operator replicated. Results equal the
        unsharded ones. On an Explicit axis (`jax.make_mesh`'s default) the
        solution's type is sharded over it where the mesh divides the batch,
        replicated otherwise.
    - `progress`: show a progress bar (tqdm) over chunks of `batch_size` right-hand
        sides. Only when called from Python, not under `jit`/`vmap`/`grad` (each
        chunk is then a separate jitted call).

    **Returns:**

    A [`lineax.Solution`][] whose `value`, `result` and `stats` have a leading
    batch axis.

    !!! Example

        ```python
        matrix = jnp.array([[2.0, 1.0], [1.0, 3.0]])
        op = lxd.MatrixLinearOperator(matrix, lx.positive_semidefinite_tag)
        bs = jnp.ones((8, 2))  # 8 right-hand sides
        sol = lxd.batch_solve(op, bs, lx.LU())  # factors once; sol.value: (8, 2)
        sol = lxd.batch_solve(op, bs, lxd.CG(rtol=1e-6, atol=1e-6), batch_size=4)
        ```
    """
    _check_operator(operator, "batch_solve")
    if not isinstance(solver, lx.AbstractLinearSolver):
        raise TypeError(
            "`solver` of `lxd.batch_solve` must be a lineax AbstractLinearSolver "
            f"(e.g. `lx.LU()`, `lxd.CG(rtol, atol)`); got {solver!r} of type "
            f"{type(solver).__name__}."
        )
    if policy is not None:
        policy = check_policy(policy)
    if options is not None and not isinstance(options, dict):
        raise TypeError(
            f"`options` of `lxd.batch_solve` must be a dict or None; got "
            f"{type(options).__name__}."
        )
    batch_size = check_batch_size(batch_size)
    batch = check_vectors(vectors, operator.out_structure(), "output structure")
    if batch == 0:
        raise ValueError(
            "`vectors` of `lxd.batch_solve` is an empty batch (a leading axis of "
            "size 0): there is no right-hand side to solve for (lineax's solve "
            "under `jax.vmap` fails on it too)."
        )
    options = {} if options is None else options
    if mesh is not None:
        mesh = as_mesh(mesh)
    if progress or mesh is not None:
        path = with_progress if progress else sharded
        return path(
            _batch_solve_jit,
            operator,
            vectors,
            solver,
            batch,
            policy,
            options,
            throw,
            batch_size,
            mesh,
        )
    return _batch_solve_jit(
        operator, vectors, solver, policy, options, throw, batch_size
    )


def _batch_solve_impl(operator, vectors, solver, policy, options, throw, batch_size):
    batch = check_vectors(vectors, operator.out_structure(), "output structure")
    vectors = batch_as_structure(vectors, operator.out_structure())
    operator, in_force = _resolve_policy(operator, policy)
    # The policy in force keeps guarding dense matrices (a direct solver's
    # `as_matrix`) after the operator is given an inline policy below.
    with policy_in_force(in_force):
        strategy = in_force
        if isinstance(strategy, Auto):
            executions = expected_iterations(
                getattr(solver, "max_steps", None), operator.in_size()
            )
            strategy = strategy.decision(
                operator, executions=executions, batch=batch
            ).policy
        if isinstance(strategy, Materialise):
            operator = _materialised(operator, strategy.batch_size)
            strategy = VmapBatch()
        elif isinstance(strategy, (VmapBatch, Scan)) and isinstance(
            operator, AbstractDispatchOperator
        ):
            # Each right-hand side applies the operator inline.
            operator = with_policy(operator, Lazy())
        if batch_size is not None:
            strategy = VmapBatch(batch_size=batch_size)
        if not _vmaps_explicit_axes(solver, operator):
            strategy = Scan()  # one after another
        if not isinstance(strategy, Scan):
            # Batched, the operator's products become matrix-matrix ones: at the
            # precision of one `mv` (`_precision`), carried into lineax's solve,
            # which is traced when the program is lowered.
            with batched_products():
                precision = default_precision()
            if not isinstance(operator, AbstractDispatchOperator):
                operator = with_policy(operator, Lazy())
            operator = at_precision(operator, precision)
        dynamic, static = eqx.partition(operator, eqx.is_array)
        stopped = eqx.combine(lax.stop_gradient(dynamic), static)
        state = solver.init(stopped, options)
        # What each solve closes over passes through `auto_axes` as arguments.
        closed, closed_static = eqx.partition((operator, state, options), eqx.is_array)

        def solve_stack(closed, vectors):
            operator, state, options = eqx.combine(closed, closed_static)

            def solve_one(vector):
                sol = lx.linear_solve(
                    operator, vector, solver, options=options, state=state, throw=throw
                )
                return sol.value, sol.result, sol.stats

            return _apply_stack(solve_one, vectors, strategy)

        out_sharding = stack_sharding(operator, vectors)
        run = solve_stack
        if out_sharding is not None:
            run = jax.sharding.auto_axes(solve_stack, out_sharding=out_sharding)
        value, result, stats = run(closed, vectors)  # pyright: ignore[reportCallIssue]
    return lx.Solution(value=value, result=result, stats=stats, state=state)


# Compiled once per signature (operator kind, shapes, solver, policy, options) and
# reused by eager calls; under a trace it is inlined.
_batch_solve_jit = eqx.filter_jit(_batch_solve_impl)


def _check_operator(operator: Any, where: str) -> None:
    if not isinstance(operator, lx.AbstractLinearOperator):
        raise TypeError(
            f"`operator` of `lxd.{where}` must be a lineax AbstractLinearOperator "
            f"(e.g. `lxd.MatrixLinearOperator(matrix)`); got {type(operator).__name__}."
        )
