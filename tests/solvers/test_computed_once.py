"""`computed_once`: an integer scalar returned unchanged, through a division XLA
cannot fold (so that XLA:CPU computes the logic before it once, not inside each
vector kernel that reads it); and CG's loop, which passes its next pass through
it, computes that decision in one kernel."""

import re

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.solvers.skeleton._flat_vectors import computed_once


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int64])
def test_returns_the_value_of_either_sign(dtype):
    if dtype == jnp.int64 and not jax.config.jax_enable_x64:
        pytest.skip("int64 needs float64 enabled")
    values = jnp.array([-4, -1, 0, 1, 2, 7], dtype)
    counts = jnp.array([0, 1, 5, 0, 9, 123], dtype)
    got = jax.jit(jax.vmap(computed_once))(values, counts)
    np.testing.assert_array_equal(got, values)
    assert got.dtype == values.dtype
    for v, c in zip(values, counts):
        assert int(computed_once(v, c)) == int(v)


def test_the_division_survives_lowering():
    def f(value, count):
        return computed_once(value, count)

    text = jax.jit(f).lower(jnp.int32(3), jnp.int32(5)).as_text()
    assert "stablehlo.divide" in text


def _kernels_comparing(text: str, n: int) -> int:
    """The fused computations of `text` that take a vector of `n` entries and
    compare scalars more than a few times (the next pass's logic)."""
    count = 0
    for comp in re.split(r"\n(?=\S)", text):
        lines = comp.splitlines()
        if not lines or "fused_computation" not in lines[0]:
            continue
        if f"[{n}]" in lines[0] and sum(" compare(" in x for x in lines) > 6:
            count += 1
    return count


def test_cg_decides_its_next_pass_once():
    n = 32
    matrix = jnp.eye(n) * 3.0 + 0.1
    b = jnp.arange(n, dtype=matrix.dtype)
    solver = lxd.CG(rtol=1e-5, atol=1e-5, layout="one_site", residual_update="select")

    def solve(matrix, b):
        op = lx.MatrixLinearOperator(matrix, lx.positive_semidefinite_tag)
        return lx.linear_solve(op, b, solver, throw=False).value

    text = jax.jit(solve).lower(matrix, b).compile().as_text()
    assert _kernels_comparing(text, n) == 0
    expected = jnp.linalg.solve(matrix, b)
    np.testing.assert_allclose(solve(matrix, b), expected, rtol=1e-4, atol=1e-4)
