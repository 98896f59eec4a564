"""The problems of `benchmarks.preconditioners`.

- `diffusion`: `-div(a grad u)` on an `s x s` grid, cell-centred finite volumes,
  Dirichlet, face coefficients the harmonic means of the cells', `a = span **
  (0.5 + 0.5 sin(3 pi x) cos(2 pi y))` (spanning `span`, 1e3 by default):
  matrix-free, symmetric positive definite, a 5-point stencil.
- `blocks`: a dense symmetric positive definite matrix dominated by its diagonal
  blocks: blocks `Q_k diag(lambda) Q_k^T` with `lambda` spanning 1 to 100 (a
  random `Q_k` each), plus a weak dense coupling `c G G^T / n`.
- the programs: a solve whose preconditioner is built inside the program, so that
  a time includes the build.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd


PSD = lx.positive_semidefinite_tag
FIVE_POINT = ((1, 0), (-1, 0), (0, 1), (0, -1))
# A hand-built diagonal by `jax.vmap` over all basis vectors holds n^2 entries: past
# this many bytes it is timed on slices of the basis and the rest extrapolated.
HAND_BYTES = 2 * 2**30
HAND_SLICE = 2048


def face_coefficients(s: int, span: float, dtype) -> tuple[jax.Array, jax.Array]:
    """The face coefficients of the diffusion problem on an `s x s` grid."""
    x = (jnp.arange(s, dtype=dtype) + 0.5) / s
    f = 0.5 + 0.5 * jnp.sin(3 * jnp.pi * x)[:, None] * jnp.cos(2 * jnp.pi * x)[None, :]
    a = jnp.asarray(span, dtype) ** f
    pa = jnp.pad(a, 1, mode="edge")
    hx = 2 * pa[1:, 1:-1] * pa[:-1, 1:-1] / (pa[1:, 1:-1] + pa[:-1, 1:-1])
    hy = 2 * pa[1:-1, 1:] * pa[1:-1, :-1] / (pa[1:-1, 1:] + pa[1:-1, :-1])
    return hx, hy


def diffusion_mv(coefficients, u):
    """`-div(a grad u)` of the flattened grid function `u`."""
    hx, hy = coefficients
    s = hy.shape[0]
    p = jnp.pad(u.reshape(s, s), 1)
    fx = hx * (p[1:, 1:-1] - p[:-1, 1:-1])
    fy = hy * (p[1:-1, 1:] - p[1:-1, :-1])
    return (-(fx[1:] - fx[:-1]) - (fy[:, 1:] - fy[:, :-1])).reshape(-1)


def diffusion_operator(coefficients, plain: bool = False):
    """The diffusion operator, ours (policy `Lazy`) or plain lineax's."""
    s = coefficients[1].shape[0]
    structure = jax.ShapeDtypeStruct((s * s,), coefficients[0].dtype)
    fn = eqx.Partial(diffusion_mv, coefficients)
    if plain:
        return lx.FunctionLinearOperator(fn, structure, PSD, closure_convert=False)
    return lxd.FunctionLinearOperator(
        fn, structure, PSD, closure_convert=False, policy=lxd.Lazy()
    )


def stencil(s: int) -> lxd.Stencil:
    """The diffusion operator's pattern."""
    return lxd.Stencil((s, s), FIVE_POINT)


def block_matrix(n: int, size: int, coupling: float, dtype, seed: int = 0):
    """The `blocks` problem's matrix."""
    count = n // size
    keys = jax.random.split(jax.random.key(seed), 3)
    q, _ = jnp.linalg.qr(jax.random.normal(keys[0], (count, size, size), dtype))
    lam = jnp.logspace(0.0, 2.0, size, dtype=dtype)
    lam = lam * jax.random.uniform(keys[1], (count, 1), dtype, 0.5, 2.0)
    blocks = jnp.einsum("kij,kj,klj->kil", q, lam, q)
    dense = jax.scipy.linalg.block_diag(*blocks)
    g = jax.random.normal(keys[2], (n, n), dtype)
    return dense + coupling * (g @ g.T) / n


def hand_jacobi(op: lx.AbstractLinearOperator) -> lx.AbstractLinearOperator:
    """lineax's preconditioner as a user builds it without this package: the
    diagonal from `jax.vmap` of `mv` over every basis vector."""
    n = op.in_size()
    eye = jnp.eye(n, dtype=op.in_structure().dtype)
    d = jax.vmap(lambda e: jnp.vdot(e, op.mv(e)))(eye)
    return lx.TaggedLinearOperator(lx.DiagonalLinearOperator(1 / d), PSD)


def hand_slice_seconds(coefficients, start: int, count: int) -> float:
    """Seconds for `count` diagonal entries by `jax.vmap` over basis vectors from
    `start` (the hand build past `HAND_BYTES`, one slice), compiled once."""
    op = diffusion_operator(coefficients, plain=True)
    n = op.in_size()
    dtype = op.in_structure().dtype

    @jax.jit
    def entries(first):
        index = first + jnp.arange(count)
        eye = (index[:, None] == jnp.arange(n)[None, :]).astype(dtype)
        return jax.vmap(lambda e: jnp.vdot(e, op.mv(e)))(eye)

    entries(start).block_until_ready()  # compile
    import time

    t0 = time.perf_counter()
    entries(start + count).block_until_ready()
    return time.perf_counter() - t0


def hand_estimate(coefficients) -> dict:
    """The hand build where its `n^2` entries exceed `HAND_BYTES`: one slice of
    `HAND_SLICE` basis vectors timed, scaled to all `n`."""
    s = coefficients[1].shape[0]
    n = s * s
    per_slice = hand_slice_seconds(coefficients, 0, HAND_SLICE)
    return dict(
        estimated=True,
        dense_bytes=n * n * coefficients[0].dtype.itemsize,
        slice_vectors=HAND_SLICE,
        slice_s=per_slice,
        build_s=per_slice * math.ceil(n / HAND_SLICE),
    )
