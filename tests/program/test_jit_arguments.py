"""`lxd.jit` as `jax.jit` in what it takes and gives back: nested `lxd.jit`
functions, static and donated arguments, Python and NumPy numbers in and out, NumPy
arrays as static arguments, functions closing over an enclosing trace's values."""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

import lineax_dispatch as lxd
from lineax_dispatch.program import _jit as _jit_module

from ..helpers.roll_programs import (
    _close,
    _loop,
    _MODELS,
    _operators,
    _sum,
    N,
)


def test_nested_static_and_donated():
    op = _operators(lxd.Auto(cost_model=_MODELS["roll"]))[0]
    lazy = _operators(lxd.Lazy())[0]
    x = jnp.linspace(0.1, 1.0, N)
    inner = lxd.jit(lambda x: _loop(op, x, 4))
    outer = lxd.jit(lambda x: inner(x) + _sum(op, x, 3))
    expected = jax.jit(lambda x: _loop(lazy, x, 4) + _sum(lazy, x, 3))(x)
    _close(outer(x), expected)

    @lxd.jit(static_argnums=1, donate_argnums=0)
    def f(x, k):
        return _loop(op, x, k)

    for k in (2, 3):
        _close(f(jnp.ones(N), k), jax.jit(lambda x: _loop(lazy, x, k))(jnp.ones(N)))


def test_outputs_are_those_of_jax_jit():
    """Python and NumPy numbers in the output come back as `jax.jit` returns them
    (arrays, weakly typed where Python numbers; also under `vmap`); other non-array
    leaves, which `jax.jit` rejects, come back as they are."""
    numbers = lambda x: (2 * x, 3, 2.5, True, None, np.float32(2), {"k": 1j})
    x = jnp.ones(2)
    ours, theirs = lxd.jit(numbers)(x), jax.jit(numbers)(x)
    flat, tree = jax.tree_util.tree_flatten(ours)
    expected, expected_tree = jax.tree_util.tree_flatten(theirs)
    assert tree == expected_tree
    for a, b in zip(flat, expected):
        assert isinstance(a, jax.Array)
        assert (a.dtype, a.weak_type) == (b.dtype, b.weak_type)
        np.testing.assert_array_equal(a, b)
    pair = lambda x: (x, 3)
    batched = jax.vmap(lxd.jit(pair))(jnp.ones(2))[1]
    assert batched.shape == (2,) and batched.weak_type
    assert lxd.jit(lambda x: (x, "name"))(x)[1] == "name"


def test_number_arguments_equal_only_as_numbers_trace_apart():
    """Python numbers are static arguments (as in `equinox.filter_jit`), and the
    cache tells apart those Python's `==` takes as one: `True`, `1`, `1.0` and
    `1+0j`, and `0.0` and `-0.0`, each give `jax.jit`'s result, not that of the
    first traced."""
    f = lambda x, s: (jnp.asarray(s), 1.0 / (x * s))
    ours, x = lxd.jit(f), jnp.ones(2)
    for s in (True, 1, 1.0, 1 + 0j, 0.0, -0.0, np.float32(0.0), np.float32(-0.0)):
        got, expected = ours(x, s), jax.jit(f)(x, s)
        for a, b in zip(got, expected):
            assert (a.dtype, a.weak_type) == (b.dtype, b.weak_type), s
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), s
    # As keyword and static arguments too.
    g = lxd.jit(lambda x, *, s: x * s)
    assert np.signbit(g(x, s=0.0)).tolist() == [False, False]
    assert np.signbit(g(x, s=-0.0)).tolist() == [True, True]
    h = lxd.jit(lambda x, s: x * s, static_argnums=1)
    assert h(x, 1).dtype == x.dtype and jnp.iscomplexobj(h(x, 1 + 0j))


def test_functions_closing_over_an_enclosing_trace():
    """An `lxd.jit` function called inside another trace (`jax.jit`, `grad`,
    `vmap`) and closing over its values (tracers, which `jax.jit` passes as its
    program's first inputs) gives `jax.jit`'s results, with nothing rewritten and
    with rolled sites; one `lxd.jit` function called in two traces traces for
    each (it crashed: the program's inputs did not match the call's)."""
    x = jnp.arange(4.0)
    op = lxd.MatrixLinearOperator(0.5 * jnp.eye(4), policy=lxd.Roll())
    bodies = (
        lambda y: lambda v: jnp.sin(v) * y,
        lambda y: lambda v: op.mv(op.mv(v) * y),
    )
    for body in bodies:
        for jit in (jax.jit, lxd.jit):
            outer = lambda y, x, jit=jit: jit(body(y))(x)
            got = (
                jax.jit(outer)(2.0, x),
                jax.grad(lambda y: jnp.sum(outer(y, x)))(2.0),
                jax.vmap(outer, in_axes=(0, None))(jnp.arange(1.0, 3.0), x),
            )
            if jit is jax.jit:
                expected = got
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    held = {}
    shared = lxd.jit(lambda v: v * held["y"])
    # (The dict is emptied before each trace ends: it holds no tracer after it.)
    first = lambda y: (held.update(y=y), shared(x), held.clear())[1]
    second = lambda y: (held.update(y=y), shared(x) + 0, held.clear())[1]
    with jax.checking_leaks():
        np.testing.assert_allclose(jax.jit(first)(2.0), 2 * x)
        np.testing.assert_allclose(jax.jit(second)(3.0), 3 * x)


def test_a_numpy_array_changed_in_place_is_a_new_static_argument():
    """A NumPy array in a static argument is keyed by its contents: changed in
    place after a call, the next call traces with the new contents."""
    f = lxd.jit(lambda x, w: x * w, static_argnums=1)
    w, x = np.ones(3), jnp.ones(3)
    np.testing.assert_array_equal(f(x, w), np.ones(3))
    w[:] = 5.0
    np.testing.assert_array_equal(f(x, w), 5 * np.ones(3))


def test_repeated_calls_with_arrays_of_other_signatures_are_traced_again():
    """A call with the bare arrays of the last call's signature goes straight to its
    compiled program; any other call (shape, dtype, weak type, a NumPy array, a
    keyword) is split and keyed as before: one trace per signature."""
    traces = []

    def f(x, y=None):
        traces.append((x.shape, jnp.dtype(x.dtype).name, x.weak_type))
        return (x * 2, "tag") if y is None else x + y

    g = lxd.jit(f)
    x = jnp.arange(3.0)
    for _ in range(3):
        out, tag = g(x)
        np.testing.assert_array_equal(out, 2 * x)
        assert tag == "tag"
    # x's shape and dtype, weakly typed.
    weak = jnp.broadcast_to(jax.jit(lambda: 2.0)(), (3,))
    assert weak.weak_type and weak.dtype == x.dtype
    others = [jnp.arange(4.0), jnp.arange(3, dtype=jnp.int32), weak, x]
    for y in others:
        for _ in range(2):
            np.testing.assert_array_equal(g(y)[0], 2 * y)
            assert g(y)[0].weak_type == y.weak_type
    np.testing.assert_array_equal(g(np.arange(3.0))[0], 2 * np.arange(3.0))
    np.testing.assert_array_equal(g(x, y=x), 2 * x)
    np.testing.assert_array_equal(g(x)[0], 2 * x)
    name = jnp.dtype(x.dtype).name
    expected = [(3,), (4,), (3,), (3,), (3,)]
    assert [t[0] for t in traces] == expected
    assert traces[2][1] == "int32" and traces[3][2] and traces[4] == ((3,), name, False)
    # Under a trace: the program as a function that the trace transforms.
    np.testing.assert_array_equal(jax.vmap(lambda v: g(v)[0])(jnp.ones((2, 3))), 2.0)
    np.testing.assert_array_equal(jax.grad(lambda v: g(v)[0].sum())(x), 2.0)


def test_repeated_calls_with_pytrees_of_the_last_signature_skip_the_split():
    """A repeated call whose PyTree arguments match the last call's (structure,
    array signatures, the same static objects) goes straight to its compiled
    program, as `jax.jit`'s does; a static leaf of another value, an array of
    another shape, a NumPy array or another structure is split and keyed, with
    the results of `jax.jit`."""
    splits = []
    original = _jit_module.split_arguments

    def counting(*a, **k):
        splits.append(1)
        return original(*a, **k)

    def f(params, x):
        return params["w"] * x + params["k"], params["name"]

    g = lxd.jit(f)
    x = jnp.arange(3.0)
    params = {"w": jnp.full(3, 2.0), "k": 1.5, "name": "a"}
    with mock.patch.object(_jit_module, "split_arguments", counting):
        for _ in range(4):
            out, name = g(params, x)
            np.testing.assert_array_equal(out, 2 * x + 1.5)
            assert name == "a"
        assert len(splits) == 2  # the first call, and the one that keeps it
        changed = [
            dict(params, k=-0.5),
            dict(params, k=float("1.5")),  # the same value, another object
            dict(params, w=jnp.ones(4)),
            dict(params, w=np.full(3, 3.0)),
            dict(params, name="b"),
            {"w": params["w"], "k": 1.5, "name": "a", "extra": None},
            params,
        ]
        for p in changed:
            for _ in range(2):
                size = jnp.shape(p["w"])[0]
                y = jnp.arange(float(size))
                got, name = g(p, y)
                expected = p["w"] * y + p["k"]
                np.testing.assert_array_equal(got, expected)
                assert name == p["name"]
    # The NumPy array changed in place: traced, so its new values are read.
    p = dict(params, w=np.full(3, 3.0))
    g(p, x)
    p["w"][:] = 4.0
    np.testing.assert_array_equal(g(p, x)[0], 4 * x + 1.5)
