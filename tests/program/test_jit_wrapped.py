"""`lxd.jit` of a function that wraps another jitted one (a JAX transformation of a
`jax.jit` or `lxd.jit` function, a `functools.wraps` wrapper, a callable object
with attributes of its own) compiles that function, as `jax.jit` does: what the
wrapped function's attributes say (JAX's transformations copy the jitted
function's `__dict__`) is not taken for `lxd.jit`'s own state."""

import functools

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd

from ..helpers.leaks import leak_checked


_TRANSFORMATIONS = {
    "vmap": jax.vmap,
    "grad": jax.grad,
    "value_and_grad": jax.value_and_grad,
    "jacfwd": jax.jacfwd,
    "jacrev": jax.jacrev,
    "hessian": jax.hessian,
    "checkpoint": jax.checkpoint,
}


def _scalar(u):
    return jnp.sum(jnp.sin(u) * u)


def _close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert jnp.shape(x) == jnp.shape(y)
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)
    assert jax.tree.structure(a) == jax.tree.structure(b)


@pytest.mark.parametrize("name", _TRANSFORMATIONS)
@pytest.mark.parametrize("inner", ["jax.jit", "lxd.jit"])
def test_transformations_of_a_jitted_function(name, inner):
    transform = _TRANSFORMATIONS[name]
    jitted = (jax.jit if inner == "jax.jit" else lxd.jit)(_scalar)
    f = transform(jitted)
    x = jnp.linspace(0.1, 1.2, 12).reshape(3, 4)
    expected = jax.jit(f)(x)
    _close(leak_checked(lambda: lxd.jit(f)(x), lambda: jax.jit(f)(x)), expected)
    _close(lxd.jit(f)(x), expected)  # (the compiled program's call)


def test_a_transformed_jitted_solve():
    n = 5
    structure = jax.ShapeDtypeStruct((n,), jnp.float64)
    tag = lx.positive_semidefinite_tag

    def stencil(v):
        return 2.5 * v - jnp.roll(v, 1) - jnp.roll(v, -1)

    def make(module, policy):
        if module is lxd:
            op = lxd.FunctionLinearOperator(stencil, structure, tag, policy=policy)
        else:
            op = lx.FunctionLinearOperator(stencil, structure, tag)

        @jax.jit
        def solve(b):
            return lx.linear_solve(op, b, module.CG(rtol=1e-10, atol=1e-10)).value

        return solve

    b = jnp.linspace(0.5, 1.5, 3 * n).reshape(3, n)
    expected = jax.jit(jax.vmap(make(lx, None)))(b)
    for policy in (lxd.Lazy(), lxd.Auto()):
        solve = make(lxd, policy)
        # (Not leak-checked: lineax's transposed `FunctionLinearOperator` leaks
        # alone on jax 0.10, see tests/helpers/leaks.py.)
        got = lxd.jit(jax.vmap(solve))(b)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10)
        grad = lxd.jit(jax.grad(lambda b: jnp.sum(solve(b) ** 2)))(b[0])
        reference = jax.jit(jax.grad(lambda b: jnp.sum(make(lx, None)(b) ** 2)))(b[0])
        np.testing.assert_allclose(grad, reference, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("inner", ["jax.jit", "lxd.jit"])
def test_functools_wraps_wrappers(inner):
    jitted = (jax.jit if inner == "jax.jit" else lxd.jit)(lambda u: u * 2)

    @functools.wraps(jitted)
    def wrapper(u):
        return jitted(u) + 1

    x = jnp.arange(4.0)
    _close(lxd.jit(wrapper)(x), jax.jit(wrapper)(x))
    _close(lxd.jit(wrapper)(x), 2 * x + 1)


def test_a_callable_object_with_attributes_named_as_ours():
    class Scaled:
        def __init__(self):
            self._compiled = "not a cache"
            self._fun = lambda u: u
            self._last = ("not", "a", "call")
            self._spec = None
            self._passed = {"donate_argnums": 0}
            self.scale = 3.0

        def __call__(self, u):
            return self.scale * u

    f = lxd.jit(Scaled())
    x = jnp.arange(4.0)
    _close(f(x), 3 * x)
    _close(f(x), 3 * x)  # (the repeated call's path)
    assert not x.is_deleted()
    assert f.scale == 3.0  # the object's attributes, as `jax.jit` copies them


@pytest.mark.parametrize("inner", ["jax.jit", "lxd.jit"])
def test_donated_through_a_nested_jit(inner):
    jitted = (jax.jit if inner == "jax.jit" else lxd.jit)(lambda u: u * 2)
    for outer in (jax.jit, lxd.jit):
        for f in (jitted, jax.vmap(jitted)):
            x = jnp.arange(4.0)
            y = outer(f, donate_argnums=0)(x)
            _close(y, 2 * jnp.arange(4.0))
            assert x.is_deleted(), (outer, f)


def test_the_wrapper_s_metadata_is_the_function_s():
    def documented(u):
        """A docstring."""
        return u

    documented.tag = "kept"
    f = lxd.jit(documented)
    assert f.__name__ == "documented" and f.__doc__ == "A docstring."
    assert f.__wrapped__ is documented and f.tag == "kept"
    assert f.fun is documented
    # A transformation of ours (which copies our `__dict__`) wraps our function.
    g = lxd.jit(jax.vmap(f))
    x = jnp.arange(6.0).reshape(2, 3)
    _close(g(x), x)
