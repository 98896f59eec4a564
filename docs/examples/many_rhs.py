"""Many right-hand sides with `lxd.batch_solve`.

An implicit heat-equation step `(I - dt Δ) x = b` on a 1-D grid of 256 points,
written matrix-free, solved for 512 right-hand sides (say, 512 initial
conditions). `batch_solve` runs the solver's `init` once and solves every
right-hand side: a direct solver (here Cholesky) materialises and factorises the
operator once; an iterative solver takes the right-hand sides through its loop in
lockstep, or in chunks of `batch_size` to bound memory, and `Auto` decides how its
`mv` is applied to the whole batch (with at least as many right-hand sides as
unknowns and the matrix within the budget, it materialises once).
Run: `python docs/examples/many_rhs.py`.
"""

import time

import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd


jax.config.update("jax_enable_x64", True)

N, BATCH, DT = 256, 512, 1e-4


def heat_step(x: jax.Array) -> jax.Array:
    """`(I - dt Δ) x` with zero boundary values, grid spacing 1 / (N + 1)."""
    padded = jnp.pad(x, 1)
    laplacian = (padded[:-2] - 2 * x + padded[2:]) * (N + 1) ** 2
    return x - DT * laplacian


def main():
    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    tags = frozenset({lx.symmetric_tag, lx.positive_semidefinite_tag})
    operator = lxd.FunctionLinearOperator(heat_step, structure, tags, policy=lxd.Auto())
    bs = jax.random.normal(jax.random.key(0), (BATCH, N))
    decision = operator.policy.decision(operator, batch=BATCH)
    print(f"Auto for a batch of {BATCH}: {decision.strategy}: {decision.reasons[-1]}")

    def time_it(fn):
        fn = jax.jit(fn)
        jax.block_until_ready(fn(bs))
        start = time.perf_counter()
        out = jax.block_until_ready(fn(bs))
        return out, time.perf_counter() - start

    direct, t_direct = time_it(
        lambda bs: lxd.batch_solve(operator, bs, lx.Cholesky()).value
    )
    cg = lxd.CG(rtol=1e-10, atol=1e-10)
    iterative, t_cg = time_it(lambda bs: lxd.batch_solve(operator, bs, cg).value)
    chunked, t_chunked = time_it(
        lambda bs: lxd.batch_solve(operator, bs, cg, batch_size=64).value
    )
    loop = jax.jit(lambda b: lx.linear_solve(operator, b, lx.Cholesky()).value)
    jax.block_until_ready(loop(bs[0]))
    start = time.perf_counter()
    looped = jnp.stack([loop(b) for b in bs[:32]])
    t_loop = (time.perf_counter() - start) * BATCH / 32

    for name, x in [("CG", iterative), ("CG, 64 at a time", chunked)]:
        assert jnp.allclose(x, direct, rtol=1e-7, atol=1e-9), name
    assert jnp.allclose(looped, direct[:32], rtol=1e-9, atol=1e-12)
    residual = jnp.max(jnp.abs(jax.vmap(heat_step)(direct) - bs))
    print(f"{BATCH} right-hand sides, {N} unknowns, max residual {float(residual):.1e}")
    print(f"  batch_solve, Cholesky (one factorisation): {t_direct * 1e3:8.2f} ms")
    print(f"  batch_solve, CG in lockstep:               {t_cg * 1e3:8.2f} ms")
    print(f"  batch_solve, CG 64 at a time:              {t_chunked * 1e3:8.2f} ms")
    print(f"  a Python loop of lx.linear_solve (est.):   {t_loop * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
