"""Checking that a vector matches an operator's input structure."""

from collections.abc import Callable
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import PyTree


FlatStructure: TypeAlias = tuple[list[jax.ShapeDtypeStruct], Any]


def recorded_output_structure(fn: Callable) -> FlatStructure | None:
    """The output structure that a function closure-converted by equinox recorded
    when it was traced (what lineax's operators hold when built with
    `closure_convert=True` from a function with a closure), flattened as lineax
    keeps structures in static fields, with weak typing stripped as lineax strips
    it; `None` for any other function (whose structure only an abstract
    evaluation, a trace of the user's code, can tell).

    **Arguments:**

    - `fn`: the operator's function.

    **Returns:**

    `(leaves, treedef)` of the output's `jax.ShapeDtypeStruct`s, or `None`.
    """
    if not hasattr(fn, "out_dynamic_struct"):
        return None
    return flat_structure(fn.out_struct)  # pyright: ignore[reportAttributeAccessIssue]


def flat_structure(structure: PyTree[jax.ShapeDtypeStruct]) -> FlatStructure:
    """`structure` without weak typing, flattened to `(leaves, treedef)`."""
    return jtu.tree_flatten(
        jtu.tree_map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=s.sharding),
            structure,
        )
    )


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
        and (g.dtype == e.dtype or (promote and promotes_to(g.dtype, e.dtype)))
        for g, e in zip(got_leaves, expected_leaves)
    )


def promotes_to(got, expected) -> bool:
    """Whether dtype `got` promotes safely to `expected` (standard promotion)."""
    with jax.numpy_dtype_promotion("standard"):
        return jnp.promote_types(got, expected) == jnp.dtype(expected)


def _structure_of(x: Any) -> jax.ShapeDtypeStruct:
    """The shape and dtype of an array (or array-like) leaf, without tracing."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


def check_vector(
    operator: lx.AbstractLinearOperator, vector: PyTree[Any], *, name: str = "vector"
) -> PyTree[Any]:
    """Raises a ValueError, at trace time, if `vector` does not match the input
    structure of `operator`; otherwise returns it with every leaf cast to the
    input structure's dtype (a no-op where they already agree).

    **Arguments:**

    - `operator`: the operator about to be applied.
    - `vector`: the PyTree it is applied to.
    - `name`: the argument name to use in the message.

    **Returns:**

    `vector`, cast to the input structure's dtypes.
    """
    expected = operator.in_structure()
    try:
        got = jtu.tree_map(_structure_of, vector)
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
    got_leaves = jtu.tree_leaves(got)
    expected_leaves, treedef = jtu.tree_flatten(expected)
    if all(g.dtype == e.dtype for g, e in zip(got_leaves, expected_leaves)):
        return vector
    return jtu.tree_unflatten(
        treedef,
        [
            x if g.dtype == e.dtype else jnp.asarray(x, e.dtype)
            for x, g, e in zip(jtu.tree_leaves(vector), got_leaves, expected_leaves)
        ],
    )
