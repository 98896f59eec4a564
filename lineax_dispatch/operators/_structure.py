"""Checking that a vector matches an operator's input structure."""

from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import PyTree


def _describe(structure: PyTree[jax.ShapeDtypeStruct]) -> str:
    return str(
        jtu.tree_map(lambda s: f"{s.dtype}{list(s.shape)}".replace(" ", ""), structure)
    )


def structures_match(
    got: PyTree[jax.ShapeDtypeStruct],
    expected: PyTree[jax.ShapeDtypeStruct],
    *,
    promote: bool = False,
) -> bool:
    """Whether two structures agree in PyTree shape, array shapes and dtypes.

    Weak typing and sharding annotations are ignored: a vector sharded across
    devices still matches an operator built from unsharded structures. With
    `promote`, a dtype that promotes safely to the expected one (an integer or a
    lower-precision float for a floating structure) also matches.
    """
    got_leaves, got_def = jtu.tree_flatten(got)
    expected_leaves, expected_def = jtu.tree_flatten(expected)
    if got_def != expected_def:
        return False
    return all(
        tuple(g.shape) == tuple(e.shape)
        and (g.dtype == e.dtype or (promote and _promotes_to(g.dtype, e.dtype)))
        for g, e in zip(got_leaves, expected_leaves)
    )


def _promotes_to(got, expected) -> bool:
    with jax.numpy_dtype_promotion("standard"):
        return jnp.promote_types(got, expected) == jnp.dtype(expected)


def cast_vector(operator: lx.AbstractLinearOperator, vector: PyTree[Any]) -> PyTree:
    """`vector` with every leaf cast to the dtype of the operator's input
    structure (a no-op where they already agree).

    **Arguments:**

    - `operator`: the operator.
    - `vector`: a PyTree that `check_vector` accepted.

    **Returns:**

    The PyTree, with the input structure's dtypes.
    """
    return jtu.tree_map(
        lambda x, s: x if jnp.result_type(x) == s.dtype else jnp.asarray(x, s.dtype),
        vector,
        operator.in_structure(),
    )


def check_vector(
    operator: lx.AbstractLinearOperator, vector: PyTree[Any], *, name: str = "vector"
) -> None:
    """Raises a ValueError, at trace time, if `vector` does not match the input
    structure of `operator`.

    **Arguments:**

    - `operator`: the operator about to be applied.
    - `vector`: the PyTree it is applied to.
    - `name`: the argument name to use in the message.
    """
    expected = operator.in_structure()
    try:
        got = jax.eval_shape(lambda: vector)
    except TypeError as e:
        raise ValueError(
            f"`{name}` must be a PyTree of arrays matching the operator's input "
            f"structure {_describe(expected)}; got {vector!r}"
        ) from e
    if not structures_match(got, expected, promote=True):
        raise ValueError(
            f"`{name}` does not match the input structure of "
            f"{type(operator).__name__}: expected {_describe(expected)}, "
            f"got {_describe(got)}"
        )
