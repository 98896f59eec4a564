"""The micro-measurements of a machine's calibration (`_calibration`): seven
small programs timed on the default device."""

import os
import time

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def _compile_once(small: np.ndarray, tag: float):
    """The compile of a small loop with two matrix-vector products and a dozen
    element-wise operations, with the constant `tag` (unique to the call: no
    cache of XLA's or of JAX's answers)."""
    offset = np.float32(tag)

    def program(x):
        def body(carry):
            step, v = carry
            w = lax.tanh(small @ v) * offset + lax.sin(v)
            return step + 1, small.T @ (w * w) - 0.5 * v + lax.exp(-abs(v))

        return lax.while_loop(lambda c: c[0] < 10, body, (0, x))[1]

    return jax.jit(program).lower(np.ones(64, np.float32)).compile


def measure() -> dict[str, float]:
    """Times the seven micro-programs on the default device (the best of a few
    runs each; about two seconds in all on a 2-core CPU).

    **Returns:**

    Seconds: `compile_s` (XLA's compile of a small loop with two matrix-vector
    products and a dozen element-wise operations), `matmul_s` (a 512 x 512 matrix
    product at `Precision.HIGHEST`, as batched products run), `stream_s` (a product with a 4096 x 4096 `float32` matrix, 64 MiB),
    `cached_s` (32 products with a 256 x 256 matrix, in one loop), `step_s` (one
    step of a loop of products with a 64 x 64 matrix, whose bound XLA does not
    know), `loop_copy_s` (the compile time of one more copy of a small Krylov
    loop in a program: what each copy of a repeated solve costs beyond its `mv`)
    and `batched_dot_s` (the compile time of one more product of a matrix with a
    block of vectors at `Precision.HIGHEST`).
    """
    rng = np.random.default_rng(0)
    small = rng.standard_normal((64, 64)).astype(np.float32) / 8
    salt = float(int.from_bytes(os.urandom(3), "little"))

    compiles = [_compile_once(small, salt + i) for i in range(3)]
    compile_s = min(_best(c, 1) for c in compiles)
    loop_copy_s = _loop_copy(small, salt)
    batched_dot_s = _batched_dot(rng, salt)

    def run(fn, *args, repeats):
        args = jax.device_put(args)  # on the device once, not at every call
        compiled = jax.jit(fn).lower(*args).compile()
        return _best(lambda: compiled(*args), repeats)

    a = rng.standard_normal((512, 512)).astype(np.float32)
    # At the precision of the products a strategy batches (`_precision`): on an
    # accelerator float32's passes, slower than its default; XLA:CPU's is the same.
    highest = lax.Precision.HIGHEST
    matmul_s = run(lambda x, y: lax.dot(x, y, precision=highest), a, a, repeats=20)
    big = rng.standard_normal((4096, 4096)).astype(np.float32)
    stream_s = run(lambda m, v: m @ v, big, big[0], repeats=10)
    del big
    mid = rng.standard_normal((256, 256)).astype(np.float32) / 16

    def cached(m, v):
        return lax.fori_loop(0, 32, lambda _, x: m @ x + 0.5, v)

    cached_s = run(cached, mid, mid[0], repeats=10)

    def steps(m, v, count):
        # A bound known only at run time: a loop XLA runs step by step.
        def body(carry):
            i, x = carry
            return i + 1, m @ x + 0.5

        return lax.while_loop(lambda c: c[0] < count, body, (0, v))[1]

    step_s = run(steps, small, small[0], np.int32(1024), repeats=5) / 1024
    return dict(
        compile_s=compile_s,
        matmul_s=matmul_s,
        stream_s=stream_s,
        cached_s=cached_s,
        step_s=step_s,
        loop_copy_s=loop_copy_s,
        batched_dot_s=batched_dot_s,
    )


def _batched_dot(rng: np.random.Generator, salt: float) -> float:
    """Compile time of one more product of a 256 x 256 matrix with a block of 16
    vectors at `Precision.HIGHEST` (as a dense build or stacked sites batch an
    `mv`'s products): programs of one and of nine such products in a chain, each
    program with a constant of its own; an eighth of the difference of the two
    (each the best of two compiles)."""
    weights = rng.standard_normal((9, 256, 256)).astype(np.float32) / 16
    block = np.ones((256, 16), np.float32)
    highest = lax.Precision.HIGHEST

    def program_of(count: int, tag: float):
        def program(ws, x):
            for i in range(count):
                x = jnp.tanh(lax.dot(ws[i], x, precision=highest)) + np.float32(tag)
            return x

        return jax.jit(program).lower(weights, block).compile

    times = {}
    for count in (1, 9):
        tags = (salt + 100 * count, salt + 100 * count + 50)
        times[count] = min(_best(program_of(count, t), 1) for t in tags)
    return max(times[9] - times[1], 0.0) / 8


def _loop_copy(small: np.ndarray, salt: float) -> float:
    """Compile time of one more copy of an iterative solver's loop: programs of
    one and of four dependent `while` loops with a body as a Krylov step's (a
    product, two inner products, vector updates, a stopping test), each copy
    with a constant of its own; a third of the difference of the two (each the
    best of two compiles)."""

    def program_of(copies: int, tag: float):
        def program(x):
            for c in range(copies):
                offset = np.float32(tag + c)

                def body(carry):
                    i, v, r = carry
                    p = small @ v
                    alpha = jnp.vdot(r, r) / (jnp.vdot(p, v) + offset)
                    r = r - alpha * p
                    return i + 1, v + alpha * r, r

                def cond(carry):
                    i, _, r = carry
                    return (i < 10) & (jnp.vdot(r, r) > 1e-12)

                x = lax.while_loop(cond, body, (0, x, x))[1]
            return x

        return jax.jit(program).lower(np.ones(64, np.float32)).compile

    times = {}
    for copies in (1, 4):
        tags = (salt + 10 * copies, salt + 10 * copies + 5)
        times[copies] = min(_best(program_of(copies, t), 1) for t in tags)
    return max(times[4] - times[1], 0.0) / 3
