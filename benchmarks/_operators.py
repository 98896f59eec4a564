"""The dense-layer chain the benchmarks use as an expensive matrix-free operator.

`B x = s_L * (W_L @ (... s_1 * (W_1 @ x)))` with `L` dense `n x n` float32 layers
`W_i ~ N(0, 1/n)` and per-layer elementwise scales `s_i ~ U(0.5, 1.5)` (so that
XLA sees `L` separate matmuls), and its Gram map `x -> B^T (B x)` with the
transpose applied by hand (`W_1^T (s_1 * ... W_L^T (s_L * y))`, each `W^T y`
written `y @ W`: `w.T @ y` makes XLA:CPU copy the transposed matrix on every
call).

The functions take the arrays as arguments, so that a script can wrap a new
function object around them in an `eqx.Partial`: with `closure_convert=False` the
arrays are then the operator's arrays (jit arguments, not HLO constants) and the
new function makes the operator's static part new, so no cache of jax or equinox
carries over between measurements.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp


def random_layers(keys, n: int, layers: int) -> tuple[tuple, tuple]:
    """`(weights, scales)`: `W_i` drawn with `keys[i]`, `s_i` with
    `keys[layers + i]`."""
    weights = tuple(
        jax.random.normal(keys[i], (n, n), jnp.float32) / jnp.sqrt(n)
        for i in range(layers)
    )
    scales = tuple(
        jax.random.uniform(keys[layers + i], (n,), jnp.float32, 0.5, 1.5)
        for i in range(layers)
    )
    return weights, scales


def apply_chain(weights, scales, x):
    """`B x`."""
    for w, s in zip(weights, scales):
        x = s * (w @ x)
    return x


def apply_gram(weights, scales, x):
    """`B^T (B x)`."""
    x = apply_chain(weights, scales, x)
    for w, s in zip(reversed(weights), reversed(scales)):
        x = (s * x) @ w
    return x


def power_iteration(apply: Callable, x, iterations: int):
    """The Rayleigh quotient after `iterations` steps of power iteration from `x`
    (a jax scalar; it underestimates the top eigenvalue)."""
    lam = jnp.array(1.0, jnp.float32)
    for _ in range(iterations):
        x = x / jnp.linalg.norm(x)
        y = apply(x)
        lam = jnp.vdot(x, y)
        x = y
    return lam
