"""The 2-D Bratu problem with optimistix's Newton and a matrix-free Jacobian.

Solve  -Δu - λ exp(u) = 0  on the unit square with u = 0 on the boundary, on an
N x N grid of interior points (five-point Laplacian). optimistix's `Newton` builds
the Jacobian `-Δ - λ diag(exp(u))` as a matrix-free linear operator at every step;
its default linear solver materialises it (N^4 entries) and factorises it.

With `lxd.AutoSolver` as the `linear_solver`, lineax-dispatch decides per grid from
the Jacobian's size, the memory budget and the cost of one `mv`: a dense
factorisation while that is cheap, a matrix-free CG (the Jacobian is symmetric
positive definite on the lower branch, which the `tags` tell it) once the grid
grows. Run: `python docs/examples/bratu.py`.
"""

import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx

import lineax_dispatch as lxd


jax.config.update("jax_enable_x64", True)

LAMBDA = 5.0  # below the fold at about 6.81: the lower branch is stable.
TAGS = frozenset({lx.symmetric_tag, lx.positive_semidefinite_tag})


def residual(u: jax.Array, lam: jax.Array) -> jax.Array:
    """`-Δu - λ exp(u)` on the interior of the N x N grid (u flattened)."""
    n = round(u.size**0.5)
    h2 = 1.0 / (n + 1) ** 2
    grid = jnp.pad(u.reshape(n, n), 1)
    laplacian = (
        grid[:-2, 1:-1]
        + grid[2:, 1:-1]
        + grid[1:-1, :-2]
        + grid[1:-1, 2:]
        - 4 * grid[1:-1, 1:-1]
    ) / h2
    return (-laplacian - lam * jnp.exp(grid[1:-1, 1:-1])).reshape(-1)


def solve(n: int, linear_solver: lx.AbstractLinearSolver, lam=LAMBDA):
    """Newton's method for the Bratu problem on an `n` x `n` grid."""
    solver = optx.Newton(rtol=1e-8, atol=1e-8, linear_solver=linear_solver)
    u0 = jnp.zeros(n * n)
    return optx.root_find(residual, solver, u0, lam, tags=TAGS, max_steps=20)


def main():
    for n in (8, 48):
        linear_solver = lxd.AutoSolver(rtol=1e-10, atol=1e-10)
        operator = lxd.JacobianLinearOperator(
            residual, jnp.zeros(n * n), LAMBDA, tags=TAGS
        )
        chosen, reasons = linear_solver.choose(operator)
        sol = jax.jit(lambda lam: solve(n, linear_solver, lam))(LAMBDA)
        reference = jax.jit(lambda lam: solve(n, lx.AutoLinearSolver(None), lam))(
            LAMBDA
        )
        error = jnp.max(jnp.abs(sol.value - reference.value))
        print(f"N = {n:3d}: {n * n} unknowns -> {type(chosen).__name__}")
        for reason in reasons:
            print(f"    {reason}")
        print(
            f"    max u = {float(sol.value.max()):.6f}, Newton steps "
            f"{int(sol.stats['num_steps'])}, |u - u_optimistix| = {float(error):.1e}"
        )
        assert sol.result == optx.RESULTS.successful
        assert error < 1e-6

    # Gradients flow through the solve (optimistix's implicit adjoint, whose
    # linear solves also go through `AutoSolver`): d max(u) / d λ.
    n = 8
    linear_solver = lxd.AutoSolver(rtol=1e-10, atol=1e-10)
    max_u = jax.jit(lambda lam: solve(n, linear_solver, lam).value.max())
    grad = jax.jit(jax.grad(max_u))(LAMBDA)
    step = 1e-4
    finite = (max_u(LAMBDA + step) - max_u(LAMBDA - step)) / (2 * step)
    print(
        f"d max(u) / d lambda = {float(grad):.5f} (finite difference {float(finite):.5f})"
    )
    assert abs(grad - finite) < 1e-3 * abs(finite)


if __name__ == "__main__":
    main()
