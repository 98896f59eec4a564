"""A curve fit with optimistix's GaussNewton and a lineax-dispatch linear solver.

Fit a damped oscillation `a exp(-b t) cos(c t + d) + e` to 400 noisy samples. Each
Gauss-Newton step solves a 400 x 5 least-squares problem with the Jacobian of the
residuals. `lxd.AutoSolver(well_posed=False)` factorises it (SVD) when that is
cheaper, as here; `lxd.PolicySolver(lxd.Normal(lxd.CG(...)), lxd.Auto())` solves
the normal equations matrix-free with one Jacobian and one transposed-Jacobian
product in the compiled loop. Both give optimistix's answer, its derivatives with
respect to the data (through the implicit adjoint, which solves with the same
linear solver) and batch over several data sets with `vmap`.
Run: `python docs/examples/curve_fit.py`.
"""

import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx

import lineax_dispatch as lxd


jax.config.update("jax_enable_x64", True)

TRUE = jnp.array([2.0, 0.3, 3.0, 0.5, 0.1])
START = jnp.array([1.0, 0.1, 2.8, 0.0, 0.0])


def model(p: jax.Array, t: jax.Array) -> jax.Array:
    return p[0] * jnp.exp(-p[1] * t) * jnp.cos(p[2] * t + p[3]) + p[4]


def residuals(p: jax.Array, data: tuple[jax.Array, jax.Array]) -> jax.Array:
    t, y = data
    return model(p, t) - y


def fit(y: jax.Array, t: jax.Array, linear_solver: lx.AbstractLinearSolver | None):
    kwargs = {} if linear_solver is None else dict(linear_solver=linear_solver)
    solver = optx.GaussNewton(rtol=1e-10, atol=1e-10, **kwargs)
    return optx.least_squares(residuals, solver, START, (t, y), max_steps=100).value


def main():
    t = jnp.linspace(0.0, 10.0, 400)
    noise = 0.02 * jax.random.normal(jax.random.key(0), t.shape)
    y = model(TRUE, t) + noise
    ys = y + 0.01 * jax.random.normal(jax.random.key(1), (8, t.size))
    # optimistix's default linear solver (QR): its fit, derivatives and batch.
    reference = jax.jit(lambda y: fit(y, t, None))(y)
    expected = jax.jit(jax.jacrev(lambda y: fit(y, t, None)))(y)
    expected_batch = jax.jit(jax.vmap(lambda y: fit(y, t, None)))(ys)
    solvers = {
        "AutoSolver": lxd.AutoSolver(rtol=1e-12, atol=1e-12, well_posed=False),
        "Normal(CG), Auto": lxd.PolicySolver(
            lxd.Normal(lxd.CG(rtol=1e-12, atol=1e-12)), lxd.Auto()
        ),
    }
    jacobian = lxd.JacobianLinearOperator(residuals, START, (t, y))
    chosen, reasons = solvers["AutoSolver"].choose(jacobian)
    print(f"AutoSolver chooses {type(chosen).__name__}: {reasons[-1]}")
    for name, linear_solver in solvers.items():
        p = jax.jit(lambda y: fit(y, t, linear_solver))(y)
        error = float(jnp.max(jnp.abs(p - reference)))
        print(f"{name:>17}: parameters {p.round(4)} (vs optimistix {error:.1e})")
        assert error < 1e-7

        # Sensitivity of the fitted parameters to each sample, and many data sets.
        sensitivity = jax.jit(jax.jacrev(lambda y: fit(y, t, linear_solver)))(y)
        assert jnp.allclose(sensitivity, expected, rtol=1e-5, atol=1e-9)
        batch = jax.jit(jax.vmap(lambda y: fit(y, t, linear_solver)))(ys)
        assert jnp.allclose(batch, expected_batch, atol=1e-7)
        print(
            f"{'':>17}  d p / d y: {sensitivity.shape}, 8 data sets fitted: "
            f"amplitude {batch[:, 0].min():.3f}..{batch[:, 0].max():.3f}"
        )


if __name__ == "__main__":
    main()
