"""`_block_inverse.invert_blocks`, both ways (JAX's factorisations, and
Gauss-Jordan elimination in a loop, the TPU's): the inverses against NumPy's in
float32, float64 and complex128, definite and general blocks; a singular or
(for the definite way) indefinite block gives non-finite entries, which block
Jacobi marks unusable (NaN there with `throw=False`); the loop's way in a whole
block Jacobi build; the backend's choice."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.preconditioners import _block_inverse


def _blocks(dtype, definite: bool, count: int = 5, size: int = 6):
    rng = np.random.default_rng(3)
    m = rng.standard_normal((count, size, size))
    if np.issubdtype(dtype, np.complexfloating):
        m = m + 1j * rng.standard_normal((count, size, size))
    if definite:
        # Hermitian positive definite, conditioned from 1 to about 1e3.
        a = m @ np.conj(np.swapaxes(m, 1, 2)) / size
        return (a + np.logspace(-3, 0, count)[:, None, None] * np.eye(size)).astype(
            dtype
        )
    # Nonsingular; the first block's large entries lie off its diagonal (a
    # shifted identity plus small noise): elimination needs pivoting there.
    a = m / np.sqrt(size) + 2 * np.eye(size)
    a[0] = np.roll(np.eye(size), 1, axis=0) + 0.1 * m[0]
    return a.astype(dtype)


@pytest.mark.parametrize("in_a_loop", [False, True])
@pytest.mark.parametrize("definite", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
def test_inverses_match_numpy(in_a_loop, definite, dtype):
    blocks = _blocks(dtype, definite)
    with jax.enable_x64(dtype != np.float32):
        found = jax.jit(lambda b: _block_inverse.invert_blocks(b, definite, in_a_loop))(
            blocks
        )
    expected = np.linalg.inv(blocks.astype(np.complex128))
    assert found.dtype == blocks.dtype
    scale = np.max(np.abs(expected))
    error = np.max(np.abs(np.asarray(found) - expected)) / scale
    assert error < (1e-4 if dtype == np.float32 else 1e-11), error


@pytest.mark.parametrize("in_a_loop", [False, True])
def test_singular_and_indefinite_blocks_are_not_finite(in_a_loop):
    blocks = _blocks(np.float64, definite=True)
    blocks[1] = -blocks[1]  # negative definite
    blocks[2, :, 0] = blocks[2, :, 1] = 0.0  # singular
    blocks[2, 0, :] = blocks[2, 1, :] = 0.0
    with jax.enable_x64(True):
        definite = _block_inverse.invert_blocks(jnp.asarray(blocks), True, in_a_loop)
        general = _block_inverse.invert_blocks(jnp.asarray(blocks), False, in_a_loop)
    finite = lambda x: np.isfinite(np.asarray(x)).all(axis=(1, 2))
    assert finite(definite).tolist() == [True, False, False, True, True]
    # As a general matrix the negative definite block is nonsingular.
    assert not finite(general)[2] and finite(general)[[0, 1, 3, 4]].all()


def test_block_jacobi_built_in_a_loop_matches(monkeypatch):
    """A whole block Jacobi build (a definite and a general operator) takes the
    loop's way where the backend does, with the same entries; the definite
    operator's indefinite block is NaN both ways (`throw=False`)."""
    size, n = 4, 12
    blocks = _blocks(np.float64, definite=True, count=n // size, size=size)
    blocks[1] = -blocks[1]
    matrix = np.zeros((n, n))
    for k in range(n // size):
        matrix[k * size : (k + 1) * size, k * size : (k + 1) * size] = blocks[k]
    matrix += 1e-3 * np.ones((n, n))

    def built(tags):
        with jax.enable_x64(True):
            op = lxd.MatrixLinearOperator(jnp.asarray(matrix), tags)
            return np.asarray(lxd.block_jacobi(op, size, throw=False).as_matrix())

    psd = lx.positive_semidefinite_tag
    before = built(psd), built(())
    monkeypatch.setattr(_block_inverse, "eliminates_in_a_loop", lambda: True)
    after = built(psd), built(())
    for a, b in zip(before, after):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert np.isnan(after[0][4:8, 4:8]).all() and np.isfinite(after[1]).all()


def test_the_loop_is_the_tpus():
    assert _block_inverse.eliminates_in_a_loop() == (jax.default_backend() == "tpu")
