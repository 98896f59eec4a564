"""The power of two every solver divides its right-hand side and its norms by
(`binary_scale`): exact; from the bits of the largest entry, except for a float64
on a TPU, where it is built by arithmetic alone, since XLA:TPU does not compile
bit operations of a float64 (its emulated bit shifts: "Binary op
shift-right-arithmetic with different element types", seen on a TPU v5e)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from lineax_dispatch.solvers.skeleton._flat_vectors import (
    _power_of_two_by_arithmetic,
    _power_of_two_by_bits,
    binary_scale,
)
from lineax_dispatch.solvers.skeleton._linear_system import rhs_unit


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex128])
def test_the_scale_is_the_power_of_two_below_the_largest_entry(dtype):
    # (The suite runs with x64 enabled: tests/conftest.py.)
    real = np.finfo(dtype).dtype
    tiny, big = np.log(np.finfo(real).tiny), np.log(np.finfo(real).max)
    rng = np.random.default_rng(0)
    largest = np.exp(rng.uniform(tiny + 1, big - 1, 500)).astype(real)
    powers = np.ldexp(real.type(1), np.arange(-60, 60))
    largest = np.concatenate([largest, powers, np.nextafter(powers, 0)])
    vectors = np.stack([largest, -0.5 * largest], axis=1).astype(dtype)
    got = np.asarray(jax.jit(jax.vmap(binary_scale))(vectors))
    _, exponent = np.frexp(largest)
    np.testing.assert_array_equal(got, np.ldexp(real.type(1), exponent - 1))
    for special in (0.0, np.inf, np.nan):
        assert binary_scale(jnp.full(3, special, dtype)) == 1


def _operations(platform: str, dtype) -> set[str]:
    exported = export.export(jax.jit(binary_scale), platforms=[platform])(
        jax.ShapeDtypeStruct((4,), dtype)
    )
    return set(re.findall(r"stablehlo\.(\w+)", exported.mlir_module()))


def test_a_float64_scale_on_a_tpu_uses_no_bit_manipulation():
    operations = _operations("tpu", jnp.float64)
    assert "multiply" in operations  # the text was read
    assert not {op for op in operations if "shift" in op or "bitcast" in op}


def test_the_tpu_s_arithmetic_gives_the_bits_scale():
    # Run here on the CPU: every float64 exponent, each power of two, its next
    # float up and its next float down, and the values the scale refuses.
    powers = np.ldexp(1.0, np.arange(-1074, 1024))
    values = np.concatenate(
        [
            powers,
            np.nextafter(powers, np.inf),
            np.nextafter(powers[1:], 0.0),
            [0.0, np.inf, np.nan, np.finfo(np.float64).max],
        ]
    )
    arithmetic = jax.jit(jax.vmap(_power_of_two_by_arithmetic))(values)
    bits = jax.jit(jax.vmap(_power_of_two_by_bits))(values)
    np.testing.assert_array_equal(np.asarray(arithmetic), np.asarray(bits))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_elsewhere_the_scale_clears_the_mantissa_bits(dtype):
    # A few scalar operations rather than a chain of them: XLA fuses them into
    # each kernel that reads the scale.
    operations = _operations("cpu", dtype)
    assert "bitcast_convert" in operations
    assert not {"log", "floor", "power"} & operations


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex64])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_right_hand_side_s_unit_is_the_scale_of_its_largest_entry(dtype, sign):
    # `rhs_unit` finds `max |b|` as `max(max b, -min b)`: the largest entry may
    # be of either sign.
    real = np.finfo(dtype).dtype
    rng = np.random.default_rng(1)
    vectors = rng.uniform(-1, 1, (50, 7)) * np.exp(rng.uniform(-30, 30, (50, 1)))
    vectors[:, 3] = sign * 4 * np.abs(vectors).max(axis=1)
    vectors = vectors.astype(dtype)
    got = np.asarray(jax.jit(jax.vmap(rhs_unit))(vectors))
    want = np.asarray(jax.vmap(binary_scale)(vectors))
    np.testing.assert_array_equal(got, want)
    assert got.dtype == real
    for special in (0.0, np.inf, -np.inf, np.nan):
        b = jnp.array([1.0, special, -3.0], dtype)
        assert rhs_unit(b) == (2.0 if special == 0.0 else 1.0)
