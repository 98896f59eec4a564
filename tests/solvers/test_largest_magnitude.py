"""`largest_magnitude` is `max |x|` on either side of `ONE_KERNEL_BELOW`, and
`rhs_unit` is `binary_scale`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lineax_dispatch.solvers.skeleton._flat_vectors import (
    binary_scale,
    largest_magnitude,
    ONE_KERNEL_BELOW,
)
from lineax_dispatch.solvers.skeleton._linear_system import rhs_unit


_DTYPES = [jnp.float32, jnp.float64, jnp.complex64, jnp.float16]


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("size", [1, 5, ONE_KERNEL_BELOW - 1, ONE_KERNEL_BELOW + 3])
def test_largest_magnitude_is_the_largest_absolute_value(dtype, size):
    rng = np.random.default_rng(size)
    x = rng.normal(size=size) * 10.0 ** rng.integers(-3, 3, size=size)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        x = x + 1j * rng.normal(size=size)
    x = jnp.asarray(x, dtype)
    got = jax.jit(largest_magnitude)(x)
    assert got == jnp.max(jnp.abs(x))
    assert jax.jit(rhs_unit)(x) == binary_scale(x)
    assert jax.jit(rhs_unit)(-x) == binary_scale(x)


@pytest.mark.parametrize("size", [4, ONE_KERNEL_BELOW + 3])
def test_largest_magnitude_of_special_values(size):
    for special in (np.inf, -np.inf, np.nan):
        x = jnp.ones(size, jnp.float32).at[size // 2].set(special)
        got = jax.jit(largest_magnitude)(x)
        if np.isnan(special):
            assert jnp.isnan(got)
        else:
            assert got == np.inf
        assert jax.jit(rhs_unit)(x) == 1
    assert rhs_unit(jnp.zeros(size, jnp.float32)) == 1
    assert rhs_unit(jnp.zeros(0, jnp.float32)) == 1
