"""`batch_solve` over a device mesh, and chunk by chunk with a progress bar."""

from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from ..._explicit_axes import explicit_sharding


def without_explicit_axes(x: Any) -> Any:
    """A concrete array sharded over a mesh with explicit axes, moved to the same
    devices and partition with automatic axes, so that it can be constrained to a
    sharding over a mesh with Auto axes (`with_sharding_constraint` refers to Auto
    axes only); any other array, or a tracer, as it is."""
    sharding = getattr(x, "sharding", None)
    if isinstance(x, jax.core.Tracer) or not isinstance(sharding, NamedSharding):
        return x
    mesh = sharding.mesh  # concrete: `x` is not traced
    if not isinstance(mesh, jax.sharding.Mesh) or all(
        t != jax.sharding.AxisType.Explicit for t in mesh.axis_types
    ):
        return x
    return jax.device_put(x, NamedSharding(_with_auto_axes(mesh), sharding.spec))


def _with_auto_axes(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
    """`mesh` with every axis Auto."""
    return jax.sharding.Mesh(
        mesh.devices,
        mesh.axis_names,
        axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names),
    )


def _types_shardings(vectors: Any) -> bool:
    """Whether shardings over a mesh's Explicit axes can be given as the types of
    arrays computed from `vectors`: eagerly (concrete arrays), or in a trace that
    knows a mesh (the one `jax.set_mesh` set, or one in the vectors' types)."""
    leaves = jtu.tree_leaves(vectors)
    if not any(isinstance(x, jax.core.Tracer) for x in leaves):
        return True
    if not jax.sharding.get_abstract_mesh().empty:
        return True
    return any(explicit_sharding(x) is not None for x in leaves)


def as_mesh(mesh: Any) -> jax.sharding.Mesh:
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh
    if isinstance(mesh, jax.Device):
        mesh = [mesh]
    try:
        devices = list(mesh)
    except TypeError:
        devices = []
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        raise ValueError(
            "`mesh` must be a `jax.sharding.Mesh` or a non-empty list of devices; "
            f"got {mesh!r}."
        )
    return jax.sharding.Mesh(
        np.array(devices), ("batch",), axis_types=(jax.sharding.AxisType.Auto,)
    )


def sharded(
    solve, operator, vectors, solver, batch, policy, options, throw, size, mesh
):
    """`batch_solve` with the right-hand sides sharded over `mesh`'s first axis;
    `solve` is the compiled batch solve.

    On an Auto axis the shardings are constraints for XLA
    (`jax.lax.with_sharding_constraint`); on an Explicit axis they are the arrays'
    types (`jax.sharding.reshard`), and the solution comes sharded over that axis
    where the mesh divides the batch (replicated otherwise: JAX cannot type a slice
    of a sharded axis to a length the mesh does not divide). Under a trace that
    knows no mesh (`jax.jit` outside `jax.set_mesh`, of unsharded arrays) an
    Explicit axis is used as an Auto one: such a program takes its devices from
    its constraints. The operator's arrays are replicated, but for those whose
    type an Explicit axis already shards (their sharding is part of the operator's
    structure).
    """
    mesh = as_mesh(mesh)
    axis = mesh.axis_names[0]
    explicit = mesh.axis_types[0] == AxisType.Explicit
    if explicit and not _types_shardings(vectors):
        mesh = _with_auto_axes(mesh)
        explicit = False
    shards = mesh.shape[axis]
    padded = -(-batch // shards) * shards
    sharding = NamedSharding(mesh, PartitionSpec(axis))
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x, sharding):
        if explicit:
            return jax.sharding.reshard(x, sharding)
        return lax.with_sharding_constraint(x, sharding)

    def pad(x):
        extra = jnp.broadcast_to(x[:1], (padded - batch,) + x.shape[1:])
        return place(jnp.concatenate([x, extra]), sharding)

    if not explicit:
        vectors = jtu.tree_map(without_explicit_axes, vectors)
    vectors = jtu.tree_map(pad, vectors)
    dynamic, static = eqx.partition(operator, eqx.is_array)
    dynamic = jtu.tree_map(
        lambda x: x if explicit_sharding(x) is not None else place(x, replicated),
        dynamic,
    )
    operator = eqx.combine(dynamic, static)
    sol = solve(operator, vectors, solver, policy, options, throw, size)

    def unpad(x):
        if padded == batch or not eqx.is_array(x) or x.shape[:1] != (padded,):
            return x
        x_sharding = explicit_sharding(x)
        if x_sharding is not None:
            x = jax.sharding.reshard(x, NamedSharding(x_sharding.mesh, PartitionSpec()))
        return x[:batch]

    return lx.Solution(
        value=jtu.tree_map(unpad, sol.value),
        result=jtu.tree_map(unpad, sol.result),
        stats=jtu.tree_map(unpad, sol.stats),
        state=sol.state,
    )


def with_progress(
    solve, operator, vectors, solver, batch, policy, options, throw, size, mesh
):
    """`batch_solve` chunk by chunk from Python, with a tqdm progress bar; `solve`
    is the compiled batch solve, reused by every chunk of the same shape."""
    if any(isinstance(x, jax.core.Tracer) for x in jtu.tree_leaves(vectors)):
        raise ValueError(
            "`progress=True` needs `batch_solve` to be called from Python, not under "
            "`jit`, `vmap` or `grad` (got traced `vectors`)."
        )
    from tqdm.auto import tqdm

    size = batch if size is None else size

    pieces = []
    with tqdm(total=batch, desc="batch_solve", unit="rhs") as bar:
        for start in range(0, batch, size):
            chunk = jtu.tree_map(lambda x: x[start : start + size], vectors)
            if mesh is None:
                piece = solve(operator, chunk, solver, policy, options, throw, None)
            else:
                count = min(size, batch - start)
                piece = sharded(
                    solve,
                    operator,
                    chunk,
                    solver,
                    count,
                    policy,
                    options,
                    throw,
                    None,
                    mesh,
                )
            pieces.append(piece)
            bar.update(min(size, batch - start))
    # Every chunk made the same solver state (`init` of the same operator): keep one.
    return lx.Solution(
        value=jtu.tree_map(lambda *xs: jnp.concatenate(xs), *[p.value for p in pieces]),
        result=jtu.tree_map(
            lambda *xs: jnp.concatenate(xs), *[p.result for p in pieces]
        ),
        stats=jtu.tree_map(
            lambda *xs: (
                jnp.concatenate(xs) if eqx.is_array(xs[0]) and xs[0].ndim else xs[0]
            ),
            *[p.stats for p in pieces],
        ),
        state=pieces[0].state,
    )
