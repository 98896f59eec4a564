"""`lxd.jit(f).lower(...).compile()` is called as `jax.jit`'s compiled object is:
without the arguments that `static_argnums` / `static_argnames` make static, with
the others as lowered (a Python number, static under `lxd.jit`'s rule, as it was
lowered with), raising `jax.jit`'s `TypeError`s for a call that does not fit, and
returning what a call of `lxd.jit(f)` returns (non-array outputs put back)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lineax_dispatch as lxd


# Our message for a call whose structure is not the lowered one (`jax.jit`'s
# compiled function raises a `TypeError` too, in words of its JAX version's).
_MISMATCH = "does not match the input pytree"


def _compiled(jit, f, *args, **kwargs):
    options = {
        k: kwargs.pop(k) for k in ("static_argnums", "static_argnames") if k in kwargs
    }
    return jit(f, **options).lower(*args, **kwargs).compile()


def _raises_as_jax(ours, theirs, *args, **kwargs):
    """`ours(*args, **kwargs)` raises what `theirs(...)` (`jax.jit`'s) raises: the
    same type, its message's first line the same."""
    with pytest.raises(Exception) as expected:
        theirs(*args, **kwargs)
    with pytest.raises(type(expected.value)) as got:
        ours(*args, **kwargs)
    first = lambda e: str(e.value).splitlines()[0]
    assert first(got) == first(expected)


def _close(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if isinstance(y, jax.Array):
            assert (x.dtype, x.shape, x.weak_type) == (y.dtype, y.shape, y.weak_type)
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)
        else:
            assert x == y


def test_static_argnums_are_left_out_of_the_call():
    f = lambda x, k: x * k + 1.0
    x = jnp.linspace(0.0, 1.0, 3)
    theirs = _compiled(jax.jit, f, x, 3, static_argnums=1)
    ours = _compiled(lxd.jit, f, x, 3, static_argnums=1)
    _close(ours(x), theirs(x))
    _close(ours(2 * x), theirs(2 * x))
    for args, kwargs in (((x, 3), {}), ((x, None), {}), ((x, 4), {}), ((), {})):
        for c, match in ((theirs, None), (ours, _MISMATCH)):
            with pytest.raises(TypeError, match=match):
                c(*args, **kwargs)
    for c, match in ((theirs, None), (ours, _MISMATCH)):
        with pytest.raises(TypeError, match=match):
            c(x, k=3)
    _raises_as_jax(ours, theirs, jnp.ones(2))


def test_static_argnames_are_left_out_of_the_call():
    f = lambda x, *, k: x * k
    x = jnp.linspace(0.0, 1.0, 3)
    for jit, match in ((jax.jit, None), (lxd.jit, _MISMATCH)):
        c = _compiled(jit, f, x, k=2, static_argnames="k")
        _close(c(x), 2 * x)
        with pytest.raises(TypeError, match=match):
            c(x, k=2)


def test_a_python_number_is_called_as_it_was_lowered():
    """Under `lxd.jit` a Python number is static: the compiled program takes it
    as it was lowered (as `jax.jit`'s takes the number), and refuses another
    (which `jax.jit`'s would compute with: ours has it in its program)."""
    f = lambda x, k: x * k
    x = jnp.linspace(0.0, 1.0, 3)
    theirs, ours = _compiled(jax.jit, f, x, 3), _compiled(lxd.jit, f, x, 3)
    _close(ours(x, 3), theirs(x, 3))
    with pytest.raises(TypeError, match="static"):
        ours(x, 4)
    with pytest.raises(TypeError, match="static"):
        ours(x, 3.0)  # (a float traces to another program than an int)
    for c, match in ((theirs, None), (ours, _MISMATCH)):
        with pytest.raises(TypeError, match=match):
            c(x)
    _raises_as_jax(ours, theirs, jnp.ones(2), 3)


def test_outputs_are_those_of_a_call():
    f = lambda x: (2 * x, "name", 3, {"k": 1.5})
    x = jnp.ones(2)
    got = _compiled(lxd.jit, f, x)(x)
    _close(got, lxd.jit(f)(x))
    assert got[1] == "name"
    g = lambda x: (2 * x, 3, np.float32(2))
    _close(_compiled(lxd.jit, g, x)(x), _compiled(jax.jit, g, x)(x))


def test_operators_and_rewritten_programs():
    """An operator argument (static leaves under `lxd.jit`'s rule) and a program
    that `lxd.jit` rewrites (rolled sites of a `Roll` operator)."""
    n = 6
    weights = (
        jnp.eye(n) + 0.1 * jnp.arange(n * n, dtype=jnp.float64).reshape(n, n) / n**2
    )
    structure = jax.ShapeDtypeStruct((n,), jnp.float64)

    def operator(policy, scale=1.0):
        return lxd.FunctionLinearOperator(
            lambda v: scale * jnp.tanh(weights @ v), structure, policy=policy
        )

    def f(op, x):
        for _ in range(3):
            x = op.mv(x)
        return x

    x = jnp.linspace(0.1, 1.0, n)
    lazy = operator(lxd.Lazy())
    expected = jax.jit(lambda x: f(lazy, x))(x)
    op = operator(lxd.Roll())
    c = _compiled(lxd.jit, f, op, x)
    for _ in range(2):  # (the repeated call goes straight to the program)
        np.testing.assert_allclose(c(op, x), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="static"):
        c(operator(lxd.Roll(), scale=2.0), x)
    expected = jax.jit(lambda x: f(lazy, x))(2 * x)
    np.testing.assert_allclose(c(op, 2 * x), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError):
        c(op, jnp.ones(n + 1))
