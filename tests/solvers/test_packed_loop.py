"""`packed_while_loop`: `lax.while_loop` with the state's scalars carried in one
array (XLA:CPU compiles each array a loop returns as a kernel of its own). The
same values as `lax.while_loop`, under jit and vmap."""

from typing import NamedTuple

import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array

from lineax_dispatch.solvers.skeleton import _packed_loop
from lineax_dispatch.solvers.skeleton._flat_vectors import computed_once
from lineax_dispatch.solvers.skeleton._packed_loop import packed_while_loop


class _State(NamedTuple):
    x: Array
    gamma: Array
    scale: Array
    step: Array
    mode: Array
    done: Array
    flags: tuple


def _init(x: Array) -> _State:
    return _State(
        x=x,
        gamma=jnp.sum(x * x),
        scale=jnp.array(0.5, x.dtype),
        step=jnp.array(0, jnp.int32),
        mode=jnp.array(3, jnp.int32),
        done=jnp.array(False),
        flags=(jnp.array(True), jnp.array(7, jnp.int32)),
    )


def _cond(s: _State) -> Array:
    return (~s.done) & (s.step < 40)


def _body(s: _State) -> _State:
    x = s.x * s.scale + jnp.roll(s.x, 1)
    gamma = jnp.sum(x * x)
    mode = jnp.where(gamma > s.gamma, s.mode + 1, s.mode - 1)
    return _State(
        x=x,
        gamma=gamma,
        scale=s.scale * 1.01,
        step=s.step + 1,
        mode=mode,
        done=gamma > 1e3,
        flags=(~s.flags[0], s.flags[1] + mode),
    )


def _both(x):
    return (
        packed_while_loop(_cond, _body, _init(x)),
        lax.while_loop(_cond, _body, _init(x)),
    )


def _assert_same(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex64])
def test_the_same_values_as_a_while_loop(dtype):
    x = jnp.linspace(-1, 1, 5).astype(dtype)
    with jax.checking_leaks():
        got, want = jax.jit(_both)(x)
    _assert_same(got, want)


def test_the_same_values_under_vmap():
    # Each batch member stops at its own step: the predicate is batched.
    xs = jnp.outer(jnp.array([0.1, 1.0, 3.0]), jnp.linspace(-1, 1, 4))
    got, want = jax.jit(jax.vmap(_both))(xs)
    _assert_same(got, want)
    assert len(set(np.asarray(got.step).tolist())) > 1


@pytest.mark.parametrize(
    "dtype, want",
    [
        # The vector; the float32 `gamma` and `scale`, the three int32 scalars
        # and the two booleans as one array of 32-bit integers.
        (jnp.float32, [("float32", (4,)), ("int32", (7,))]),
        # The float64 scalars with the int32 ones and the booleans: one array
        # of 64-bit integers.
        (jnp.float64, [("float64", (4,)), ("int64", (7,))]),
        # The complex scalars apart (by their dtype), the rest as above.
        (jnp.complex64, [("complex64", (2,)), ("complex64", (4,)), ("int32", (5,))]),
    ],
)
def test_the_loop_carries_one_array_of_its_real_and_integer_scalars(dtype, want):
    jaxpr = jax.make_jaxpr(lambda x: packed_while_loop(_cond, _body, _init(x)))(
        jnp.ones(4, dtype)
    )
    (loop,) = [e for e in jaxpr.eqns if e.primitive is lax.while_p]
    shapes = sorted((str(v.aval.dtype), v.aval.shape) for v in loop.outvars)
    assert shapes == want


def test_carried_bits_come_back_as_they_went():
    # Integers whose bits are subnormal floats or NaNs, and floats that are:
    # carried by their bits, each comes back the same.
    ints = jnp.array([0, 1, 5, -1, -4, 2**31 - 1, -(2**31)], jnp.int32)
    floats = jnp.array(
        [0.0, -0.0, 1e-45, 1e-40, jnp.inf, -jnp.inf, jnp.nan], jnp.float32
    )

    def body(c):
        step, xs, ys = c
        return step + 1, xs[::-1], ys[::-1]

    def run(ints, floats):
        init = (jnp.array(0, jnp.int32), tuple(ints), tuple(floats))
        return packed_while_loop(lambda c: c[0] < 3, body, init)

    _, got_ints, got_floats = jax.jit(run)(ints, floats)
    want_ints, want_floats = ints[::-1], floats[::-1]
    np.testing.assert_array_equal(np.stack(got_ints), np.asarray(want_ints))
    got_bits = jax.lax.bitcast_convert_type(jnp.stack(got_floats), jnp.int32)
    want_bits = jax.lax.bitcast_convert_type(want_floats, jnp.int32)
    np.testing.assert_array_equal(np.asarray(got_bits), np.asarray(want_bits))


def test_narrower_bits_in_a_wider_carrier_come_back_as_they_went():
    # 32-bit values (integers at their extremes, unsigned ones past int32's
    # range, floats that are subnormal or NaN) carried beside a float64 scalar,
    # in an array of 64-bit integers: each comes back with its bits.
    ints = jnp.array([0, -1, 2**31 - 1, -(2**31)], jnp.int32)
    unsigned = jnp.array([0, 2**31, 2**32 - 1], jnp.uint32)
    floats = jnp.array([-0.0, 1e-45, 1e-40, jnp.inf, jnp.nan], jnp.float32)
    wide = jnp.array([5e-324, jnp.nan], jnp.float64)

    def body(c):
        step, *rest = c
        return (step + 1, *(xs[::-1] for xs in rest))

    def run(*arrays):
        init = (jnp.array(0, jnp.int32), *(tuple(a) for a in arrays))
        return packed_while_loop(lambda c: c[0] < 3, body, init)

    jaxpr = jax.make_jaxpr(run)(ints, unsigned, floats, wide)
    (loop,) = [e for e in jaxpr.eqns if e.primitive is lax.while_p]
    assert [(str(v.aval.dtype), v.aval.shape) for v in loop.outvars] == [
        ("int64", (15,))
    ]
    _, *got = jax.jit(run)(ints, unsigned, floats, wide)
    for given, back in zip((ints, unsigned, floats, wide), got):
        back = jnp.stack(back)
        assert back.dtype == given.dtype
        kind = jnp.int64 if given.dtype.itemsize == 8 else jnp.int32
        np.testing.assert_array_equal(
            np.asarray(lax.bitcast_convert_type(back, kind)),
            np.asarray(lax.bitcast_convert_type(given[::-1], kind)),
        )


def test_a_key_in_the_state_is_carried_as_it_is():
    def body(c):
        step, key, total = c
        key, sub = jax.random.split(key)
        return step + 1, key, total + jax.random.uniform(sub, dtype=jnp.float32)

    init = (jnp.array(0, jnp.int32), jax.random.key(3), jnp.array(0.0, jnp.float32))
    cond = lambda c: c[0] < 4
    got = jax.jit(lambda i: packed_while_loop(cond, body, i))(init)
    want = jax.jit(lambda i: lax.while_loop(cond, body, i))(init)
    assert int(got[0]) == 4 and float(got[2]) == float(want[2])
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(got[1])),
        np.asarray(jax.random.key_data(want[1])),
    )


def test_a_state_without_scalars_is_a_plain_while_loop():
    def cond(c):
        return c[0][0] < 10

    def body(c):
        return (c[0] + 1, c[1] * 2)

    init = (jnp.zeros(2), jnp.ones(3))
    got = packed_while_loop(cond, body, init)
    _assert_same(got, lax.while_loop(cond, body, init))


def test_a_weakly_typed_scalar_comes_back_with_its_dtype():
    def cond(c):
        return c[0] < 3

    def body(c):
        return (c[0] + 1, c[1] * 2.0)

    got = jax.jit(lambda: packed_while_loop(cond, body, (0, 1.0)))()
    assert got[0].dtype == jnp.int32 or got[0].dtype == jnp.int64
    assert int(got[0]) == 3 and float(got[1]) == 8.0


def test_other_backends_carry_the_state_as_it_is(monkeypatch):
    """The packing is XLA:CPU's: elsewhere the loop's carry is the state's own
    leaves, and `computed_once` returns its value untouched."""
    x = jnp.arange(4.0)

    def carried(backend):
        monkeypatch.setattr(_packed_loop.jax, "default_backend", lambda: backend)
        jaxpr = jax.make_jaxpr(lambda x: packed_while_loop(_cond, _body, _init(x)))(x)
        (loop,) = [e for e in jaxpr.jaxpr.eqns if e.primitive is lax.while_p]
        return [v.aval.shape for v in loop.outvars]

    leaves = [jnp.shape(leaf) for leaf in jax.tree.leaves(_init(x))]
    assert carried("tpu") == leaves
    assert carried("cpu") != leaves
    monkeypatch.setattr(_packed_loop.jax, "default_backend", lambda: "tpu")
    value = jnp.int32(3)
    assert computed_once(value, jnp.int32(5)) is value
