"""The lineax-dispatch showcase that `make demo` runs.

An expensive matrix-free operator (a chain of dense layers) is applied from eight
places in one jitted program and used in a GMRES solve, with plain lineax and with
each lineax-dispatch policy. Prints compile and run times, and checks every answer
against plain lineax.
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import lineax as lx  # noqa: E402

import lineax_dispatch as lxd  # noqa: E402


N, LAYERS, SITES = 256, 16, 8


def make_operator(library, policy):
    keys = jax.random.split(jax.random.key(0), LAYERS)
    weights = [
        jnp.eye(N) + 0.3 * jax.random.normal(k, (N, N)) / jnp.sqrt(N) for k in keys
    ]

    def chain(x):
        for w in weights:
            x = w @ x
        return x

    structure = jax.ShapeDtypeStruct((N,), jnp.float32)
    if library is lx:
        return lx.FunctionLinearOperator(chain, structure)
    return lxd.FunctionLinearOperator(chain, structure, policy=policy)


def timed(fn, *args):
    start = time.perf_counter()
    compiled = jax.jit(fn).trace(*args).lower().compile()
    out = jax.block_until_ready(compiled(*args))
    compile_time = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    return out, compile_time, time.perf_counter() - start


def main():
    xs = jax.random.normal(jax.random.key(1), (SITES, N))
    variants = [
        ("plain lineax", lx, None),
        ("lxd Lazy()", lxd, lxd.Lazy()),
        ("lxd Outline()", lxd, lxd.Outline()),
        ("lxd Materialise(64)", lxd, lxd.Materialise(batch_size=64)),
    ]
    print(f"operator: chain of {LAYERS} dense {N}x{N} layers; {SITES} call sites\n")
    header = f"{'variant':<22}{'mv compile':>12}{'mv run':>10}{'GMRES compile':>15}{'GMRES run':>11}"
    print(header)
    print("-" * len(header))
    reference = None
    for name, library, policy in variants:
        op = make_operator(library, policy)

        def many_sites(xs):
            return sum(op.mv(xs[i]) for i in range(SITES))

        def solve(b):
            solver = lx.GMRES(rtol=1e-5, atol=1e-5)
            return lx.linear_solve(op, b, solver).value

        y, c1, r1 = timed(many_sites, xs)
        x, c2, r2 = timed(solve, xs[0])
        if reference is None:
            reference = (y, x)
        assert jnp.allclose(y, reference[0], rtol=1e-3, atol=1e-3), name
        assert jnp.allclose(x, reference[1], rtol=1e-3, atol=1e-3), name
        print(f"{name:<22}{c1:>11.2f}s{r1 * 1e3:>8.1f}ms{c2:>14.2f}s{r2 * 1e3:>9.1f}ms")
    print("\nEvery variant agrees with plain lineax. Compile times include the first")
    print("call (Outline compiles its callee then). Benchmarks: benchmarks/callsites.py")


if __name__ == "__main__":
    main()
