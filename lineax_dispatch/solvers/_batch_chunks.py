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
from jax.sharding import NamedSharding, PartitionSpec


def without_explicit_axes(x: Any) -> Any:
    """A concrete array sharded over a mesh with explicit axes, moved to the same
    devices and partition with automatic axes: lineax's structure check rejects
    vectors whose type carries an explicit sharding, and a sharding annotation is
    not a mismatch here."""
    sharding = getattr(x, "sharding", None)
    if isinstance(x, jax.core.Tracer) or not isinstance(sharding, NamedSharding):
        return x
    mesh = sharding.mesh  # concrete: `x` is not traced
    if not isinstance(mesh, jax.sharding.Mesh) or all(
        t != jax.sharding.AxisType.Explicit for t in mesh.axis_types
    ):
        return x
    auto = jax.sharding.Mesh(
        mesh.devices,
        mesh.axis_names,
        axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names),
    )
    return jax.device_put(x, NamedSharding(auto, sharding.spec))


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
    `solve` is the compiled batch solve."""
    mesh = as_mesh(mesh)
    axis = mesh.axis_names[0]
    shards = mesh.shape[axis]
    padded = -(-batch // shards) * shards
    sharding = NamedSharding(mesh, PartitionSpec(axis))
    replicated = NamedSharding(mesh, PartitionSpec())

    def pad(x):
        extra = jnp.broadcast_to(x[:1], (padded - batch,) + x.shape[1:])
        return lax.with_sharding_constraint(jnp.concatenate([x, extra]), sharding)

    vectors = jtu.tree_map(pad, vectors)
    dynamic, static = eqx.partition(operator, eqx.is_array)
    dynamic = jtu.tree_map(
        lambda x: lax.with_sharding_constraint(x, replicated), dynamic
    )
    operator = eqx.combine(dynamic, static)
    sol = solve(operator, vectors, solver, policy, options, throw, size)
    return jtu.tree_map(
        lambda x: x[:batch] if eqx.is_array(x) and x.shape[:1] == (padded,) else x,
        sol,
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
