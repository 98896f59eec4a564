"""Small operators shared by tests/test_reliability.py and tests/test_dropin.py."""

import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd


N = 4
STRUCTURE = jax.ShapeDtypeStruct((N,), jnp.float64)
PSD = (lx.positive_semidefinite_tag, lx.symmetric_tag)


def matrix(bad=None):
    """A 4x4 SPD matrix, with entry (1, 1) set to `bad` if given."""
    a = 3.0 * jnp.eye(N) + 0.1
    return a if bad is None else a.at[1, 1].set(bad)


def function_operator(a, policy=None, tags=PSD):
    """`x -> a @ x` as a FunctionLinearOperator (policy Lazy unless given)."""
    return lxd.FunctionLinearOperator(
        lambda x: a @ x, STRUCTURE, tags, policy=policy or lxd.Lazy()
    )
