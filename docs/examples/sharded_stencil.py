"""A matrix-free operator sharded over 8 devices, solved by CG.

The 2-D variable-coefficient diffusion operator `-div(c grad u) + sigma u` on an
`S x S` grid (zero Dirichlet boundary, five-point stencil), its grid rows split
over the devices of a mesh. Each device applies the stencil to its own rows with
`jax.shard_map`; the rows just above and below its block come from its neighbours
(a halo exchange, `lax.ppermute`), and a device at the edge of the grid receives
zeros, the boundary values. `lxd.CG` solves it with the vectors kept sharded as
the grid: the only collectives in its loop are the halo exchange and the inner
products' sums. The solution is checked against a dense solve of the same
operator on one device.

On a machine without 8 devices the CPU is split into 8 host devices (set before
JAX starts). Run: `python docs/examples/sharded_stencil.py`.
"""

import os


os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import lineax as lx  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import lineax_dispatch as lxd  # noqa: E402


jax.config.update("jax_enable_x64", True)

S, SIGMA = 64, 0.1
DEVICES = 8


def halos(block: jax.Array, count: int) -> tuple[jax.Array, jax.Array]:
    """The rows just above and below this device's block of grid rows: the last
    row of the device before, the first row of the device after; zeros (the
    boundary) at the edges of the grid."""
    down = [(i, i + 1) for i in range(count - 1)]
    up = [(i + 1, i) for i in range(count - 1)]
    above = jax.lax.ppermute(block[-1:], "x", perm=down)
    below = jax.lax.ppermute(block[:1], "x", perm=up)
    return above, below


def diffusion(c: jax.Array, u: jax.Array, above=None, below=None):
    """`-div(c grad u) + sigma u` on a block of rows, given the rows of `c` and `u`
    just outside it (`None`: the boundary, zeros). Each face's coefficient is the
    mean of `c` on its two sides, used by both: the operator is symmetric."""
    zeros = jnp.zeros_like(u[:1])
    u_ext = jnp.concatenate([zeros if above is None else above[1], u], axis=0)
    u_ext = jnp.concatenate([u_ext, zeros if below is None else below[1]], axis=0)
    c_ext = jnp.concatenate([zeros if above is None else above[0], c], axis=0)
    c_ext = jnp.concatenate([c_ext, zeros if below is None else below[0]], axis=0)
    vertical = 0.5 * (c_ext[1:] + c_ext[:-1])  # the faces between rows
    flux = vertical * (u_ext[1:] - u_ext[:-1])
    out = -(flux[1:] - flux[:-1])
    c_pad = jnp.pad(c, ((0, 0), (1, 1)))
    u_pad = jnp.pad(u, ((0, 0), (1, 1)))
    horizontal = 0.5 * (c_pad[:, 1:] + c_pad[:, :-1])  # the faces between columns
    flux = horizontal * (u_pad[:, 1:] - u_pad[:, :-1])
    return out - (flux[:, 1:] - flux[:, :-1]) + SIGMA * u


def sharded_operator(c: jax.Array, mesh) -> lxd.FunctionLinearOperator:
    """The operator on grids sharded by rows over `mesh`'s axis `"x"`."""
    count = mesh.shape["x"]

    def local(c_block, u_block):
        c_above, c_below = halos(c_block, count)
        u_above, u_below = halos(u_block, count)
        return diffusion(
            c_block, u_block, above=(c_above, u_above), below=(c_below, u_below)
        )

    apply = jax.shard_map(
        local, mesh=mesh, in_specs=(P("x", None), P("x", None)), out_specs=P("x", None)
    )
    sharding = NamedSharding(mesh, P("x", None))
    structure = jax.ShapeDtypeStruct((S, S), jnp.float64, sharding=sharding)
    return lxd.FunctionLinearOperator(
        lambda u: apply(c, u), structure, lx.positive_semidefinite_tag
    )


def main() -> None:
    assert len(jax.devices()) >= DEVICES, jax.devices()
    mesh = jax.make_mesh((DEVICES,), ("x",))  # Explicit axes: JAX's default
    rows = NamedSharding(mesh, P("x", None))
    grid = np.linspace(0.0, 1.0, S)
    c_np = 1.0 + 0.9 * np.sin(3 * np.pi * grid)[:, None] * np.cos(2 * np.pi * grid)
    b_np = np.random.default_rng(0).standard_normal((S, S))
    c = jax.device_put(jnp.asarray(c_np), rows)
    b = jax.device_put(jnp.asarray(b_np), rows)
    operator = sharded_operator(c, mesh)

    @jax.jit
    def solve(b):
        # `throw=False`: the result code is checked below. (`throw=True` raises
        # through a host callback that gathers the solution on one device.)
        solver = lxd.CG(rtol=1e-10, atol=1e-10)
        sol = lx.linear_solve(operator, b, solver, throw=False)
        return sol.value, sol.stats["num_steps"], sol.result == lx.RESULTS.successful

    with jax.set_mesh(mesh):
        u, steps, ok = solve(b)
        hlo = solve.lower(b).compile().as_text()
    assert bool(ok), "CG did not converge"
    print(
        f"solved on {DEVICES} devices in {int(steps)} CG steps; u is sharded as "
        f"{u.sharding.spec}"
    )
    permutes = hlo.count("collective-permute(") + hlo.count("collective-permute-start(")
    print(f"halo exchanges (collective-permutes) in the compiled program: {permutes}")
    # The same operator on one device, as a dense matrix: the reference.
    single = jax.vmap(lambda e: diffusion(jnp.asarray(c_np), e.reshape(S, S)).ravel())
    dense = np.asarray(single(jnp.eye(S * S))).T
    assert np.allclose(dense, dense.T), "the operator must be symmetric"
    reference = np.linalg.solve(dense, b_np.ravel()).reshape(S, S)
    error = np.linalg.norm(np.asarray(u) - reference) / np.linalg.norm(reference)
    print(f"relative difference from a dense solve on one device: {error:.1e}")
    assert error < 1e-8, error
    assert u.sharding.spec[0] == "x", u.sharding  # the solution stays sharded


if __name__ == "__main__":
    main()
