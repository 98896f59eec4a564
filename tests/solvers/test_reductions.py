"""Reductions in the forms XLA:CPU compiles cheaply (`lineax_dispatch/_reductions.py`,
`_flat_vectors.dot`): the same answers either side of the length from which
its float reductions are library kernels (whose maximum drops a NaN in jax
0.10.2), and a CG solve's inner products padded to that length from 1,024
unknowns."""

import re

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch._reductions import all_finite, any_nonzero, LIBRARY_REDUCTION_SIZE
from lineax_dispatch.solvers.skeleton._flat_vectors import (
    _library_length,
    dot,
    PADDED_DOT_FROM,
)
from lineax_dispatch.solvers.skeleton._linear_system import rhs_unit_and_finite


LENGTHS = (1, 7, LIBRARY_REDUCTION_SIZE - 1, LIBRARY_REDUCTION_SIZE, 5000)


def _smallest_kept(dtype) -> float:
    """The smallest positive normal number of `dtype` that the default device
    keeps: `finfo(dtype).tiny`, or float32's where the device flushes that to zero
    (a TPU holds float64 with float32's exponent range)."""
    for tiny in (np.finfo(np.finfo(dtype).dtype).tiny, np.finfo(np.float32).tiny):
        if np.asarray(jax.device_put(np.asarray(tiny, dtype))) != 0:
            return float(tiny)
    raise AssertionError(f"the device flushes {dtype.__name__}'s smallest normals")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex64])
def test_finiteness_and_nonzero_entries_at_every_length(dtype):
    # Either side of the length from which XLA:CPU's reductions are library
    # kernels, whose maximum drops a NaN in jax 0.10.2: a sum does not.
    check = jax.jit(lambda x: (all_finite(x), any_nonzero(x), rhs_unit_and_finite(x)))
    for n in LENGTHS:
        clean = np.linspace(1.0, 3.0, n).astype(dtype)
        finite, nonzero, (_, rhs_finite) = check(clean)
        assert finite and nonzero and rhs_finite, n
        assert not check(np.zeros(n, dtype))[1], n
        for at in {0, n // 2, n - 1}:
            for special in (np.nan, np.inf, -np.inf):
                bad = clean.copy()
                bad[at] = special
                finite, nonzero, (_, rhs_finite) = check(bad)
                assert not finite and not rhs_finite and nonzero, (n, at, special)
            lone = np.zeros(n, dtype)
            lone[at] = np.nan if at else _smallest_kept(dtype)
            assert check(lone)[1], (n, at)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_a_long_right_hand_side_s_unit(dtype):
    rng = np.random.default_rng(2)
    b = (rng.uniform(-1, 1, 5000) * np.exp(rng.uniform(-30, 30))).astype(dtype)
    unit, finite = jax.jit(rhs_unit_and_finite)(b)
    _, exponent = np.frexp(np.max(np.abs(b)))
    assert unit == np.ldexp(np.finfo(dtype).dtype.type(1), exponent - 1) and finite


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex64])
def test_inner_products_either_side_of_the_padding(dtype):
    rng = np.random.default_rng(3)
    lengths = (7, PADDED_DOT_FROM - 1, PADDED_DOT_FROM, 3000, LIBRARY_REDUCTION_SIZE)
    for n in lengths:
        parts = rng.standard_normal((2, 2, n))
        pair = parts[0] + (1j * parts[1] if dtype == jnp.complex64 else 0)
        a, b = jnp.asarray(pair.astype(dtype))
        exact = np.vdot(np.asarray(a, np.complex128), np.asarray(b, np.complex128))
        # The summation's error bound, whatever the order of the sum.
        bound = n * np.finfo(dtype).eps * np.sum(np.abs(a) * np.abs(b))
        assert abs(complex(jax.jit(dot)(a, b)) - exact) <= bound, n
        # A NaN or an infinity in either vector comes out of the sum.
        assert not np.isfinite(jax.jit(dot)(a.at[n // 2].set(np.nan), b))
        assert not np.isfinite(jax.jit(dot)(a, b.at[0].set(np.inf)))
    batched = jax.jit(jax.vmap(dot))(*(rng.standard_normal((2, 3, PADDED_DOT_FROM))))
    assert batched.shape == (3,)


def test_a_cg_solve_s_inner_products_are_library_kernels_from_1024_unknowns():
    if jax.default_backend() != "cpu":
        # The padding is for XLA:CPU's library kernels: elsewhere none is added.
        x = jax.ShapeDtypeStruct((PADDED_DOT_FROM,), jnp.float32)
        assert jax.eval_shape(_library_length, x).shape == x.shape
        return

    def program(n):
        structure = jax.ShapeDtypeStruct((n,), jnp.float32)

        def stencil(x):
            padded = jnp.pad(x, 1)
            return 4.5 * x - padded[:-2] - padded[2:]

        op = lxd.FunctionLinearOperator(
            stencil, structure, lx.positive_semidefinite_tag
        )
        solver = lxd.CG(1e-5, 1e-5, max_steps=50)
        f = jax.jit(lambda b: lx.linear_solve(op, b, solver, throw=False).value)
        b = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32)
        text = f.lower(b).compile().as_text()
        return len(re.findall(r"__ynn_fusion", text)), f(b)

    library, _ = program(PADDED_DOT_FROM - 1)
    assert library == 0  # (XLA:CPU's rule, jax 0.10.2 to 0.12.1)
    library, y = program(PADDED_DOT_FROM)
    assert library >= 2, "CG's two inner products, padded to the library length"
    assert np.all(np.isfinite(np.asarray(y)))
