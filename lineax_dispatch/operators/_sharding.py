"""Explicit shardings in the types of vectors and matrices.

On a mesh with `jax.sharding.AxisType.Explicit` axes (what `jax.make_mesh` creates
by default), an array's sharding is part of its type: `jax.typeof(x).sharding`,
and the `jax.ShapeDtypeStruct` that `jax.eval_shape` gives of it. lineax compares
a vector's structure with the operator's exactly, so an operator that holds a
sharded matrix states the shardings of the vectors it takes and gives, the way
JAX types `matrix @ vector`; and solvers create their vectors in that sharding and
ask for replicated inner products (JAX will not guess the output sharding of a
contraction over a sharded axis). On Auto axes, or without a mesh, none of this
applies: every function here then returns `None` and the code paths are those of
an unsharded program.
"""

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from .._explicit_axes import axes_of as _axes, explicit_sharding as explicit_sharding


def sharded_structure(operator: Any) -> PartitionSpec | None:
    """The `PartitionSpec` of the first leaf of `operator`'s input or output
    structure that is sharded over an Explicit mesh axis, else `None`.

    **Arguments:**

    - `operator`: a lineax operator.

    **Returns:**

    A `jax.sharding.PartitionSpec`, or `None`.
    """
    sharding = _first_explicit((operator.in_structure(), operator.out_structure()))
    return None if sharding is None else sharding.spec


def _first_explicit(tree: Any) -> NamedSharding | None:
    # The explicit sharding of the first leaf of `tree` that has one.
    shardings = map(explicit_sharding, jax.tree_util.tree_leaves(tree))
    return next((s for s in shardings if s is not None), None)


def batch_as_structure(vectors: Any, structure: Any) -> Any:
    """Stacked vectors (a leading batch axis on each leaf) resharded as the leaves of
    `structure` are where those hold an explicit sharding, the batch axis
    unsharded: `lxd.batch_solve`'s right-hand sides, for an operator sharded over
    Explicit mesh axes. Other leaves are returned as they are.

    **Arguments:**

    - `vectors`: a PyTree of arrays, each with a leading batch axis.
    - `structure`: the operator's output structure, a PyTree of
        `jax.ShapeDtypeStruct`s.

    **Returns:**

    `vectors`, resharded where needed.
    """

    def one(x: Any, leaf: Any) -> Any:
        batched = stacked_like(leaf)
        return x if batched is None else jax.sharding.reshard(x, batched)

    return jax.tree_util.tree_map(one, vectors, structure)


def stack_sharding(operator: Any, vectors: Any) -> NamedSharding | None:
    """Where the right-hand sides' types carry an Explicit mesh axis and the
    operator's structure does not: the sharding of the solutions' stack (the batch
    axis sharded as the right-hand sides', the rest replicated), in which the
    stack is solved with the mesh's axes Auto (`jax.sharding.auto_axes`). Each
    right-hand side then has the operator's structure (lineax compares shardings
    too), and `vmap` batches the solvers' loops over an Auto axis (JAX cannot over
    an Explicit one). `None` otherwise.

    **Arguments:**

    - `operator`: the operator.
    - `vectors`: the right-hand sides, a leading batch axis on each leaf.

    **Returns:**

    A `jax.sharding.NamedSharding`, or `None`.
    """
    sharding = _first_explicit(vectors)
    if sharded_structure(operator) is not None or sharding is None:
        return None
    batch_axis = tuple(sharding.spec)[:1] or (None,)
    return NamedSharding(sharding.mesh, PartitionSpec(*batch_axis))


def as_stated(outputs: Any, structure: Any) -> Any:
    """A function's outputs resharded as `structure` states them, where a leaf of
    `structure` holds an explicit sharding that the output's type does not: what
    an operator whose function holds sharded arrays (closure-converted, they are
    part of the operator) gives where those arrays have lost their shardings.
    lineax's `linear_solve` evaluates a solve abstractly with the solver state's
    arrays, the operator's among them, as shapes and dtypes alone, so there `a @
    y` with `a` sharded by rows is typed replicated, not as `y`. Elsewhere the
    output's type is the structure's (the structure is what the function gives)
    and nothing is resharded.

    **Arguments:**

    - `outputs`: the function's output, a PyTree of arrays.
    - `structure`: the operator's output structure, a PyTree of
        `jax.ShapeDtypeStruct`s.

    **Returns:**

    `outputs`, resharded where needed.
    """

    def one(x: Any, leaf: Any) -> Any:
        stated = explicit_sharding(leaf)
        if stated is None:
            return x
        ndim = len(leaf.shape)
        if _padded(jax.typeof(x).sharding.spec, ndim) == _padded(stated.spec, ndim):
            return x
        return jax.sharding.reshard(x, stated)

    return jax.tree_util.tree_map(one, outputs, structure)


def _padded(spec: Any, ndim: int) -> tuple:
    return tuple(spec) + (None,) * (ndim - len(spec))


def _order(sharding: NamedSharding, entry: Any) -> int:
    names = list(sharding.mesh.axis_names)
    return min(names.index(a) for a in _axes(entry))


def _rows_and_columns(sharding: NamedSharding) -> tuple[Any, Any]:
    rows, columns = _padded(sharding.spec, 2)
    return rows, columns


def replicated_like(x: Any, ndim: int = 0) -> NamedSharding | None:
    """The replicated sharding of an `ndim`-dimensional result on the mesh of
    `x`'s explicit sharding (where a reduction over `x`'s sharded axes must put
    its result), else `None` (the default `out_sharding` of JAX's functions).

    The `PartitionSpec` names every axis of the result (`None` each): `vmap`'s
    rule for a product inserts the batch axis into the spec by position, and fails
    on a shorter one.

    **Arguments:**

    - `x`: an array or tracer.
    - `ndim`: the number of axes of the result.

    **Returns:**

    A `jax.sharding.NamedSharding`, or `None`.
    """
    sharding = explicit_sharding(x)
    if sharding is None:
        return None
    return NamedSharding(sharding.mesh, PartitionSpec(*(None,) * ndim))


def stacked_like(x: Any) -> NamedSharding | None:
    """The sharding of a stack of arrays like `x` (a new leading axis, unsharded;
    each row sharded as `x`) where `x` has an explicit sharding, else `None`.

    **Arguments:**

    - `x`: an array, tracer or `jax.ShapeDtypeStruct`.

    **Returns:**

    A `jax.sharding.NamedSharding`, or `None`.
    """
    sharding = explicit_sharding(x)
    if sharding is None:
        return None
    return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))


def matrix_vector_shardings(
    matrix: Any,
) -> tuple[NamedSharding, NamedSharding] | None:
    """The shardings of the vectors a matrix with an explicit sharding takes and
    gives: `(in, out)`, or `None` where its type has no Explicit axis.

    A rectangular matrix sharded `P(rows, columns)` takes vectors sharded
    `P(columns)` and gives vectors sharded `P(rows)`, as JAX types the product. A
    square matrix takes and gives vectors in one sharding (a solver's iterate and
    residual live in one space): that of its rows or of its columns, whichever
    mesh axis comes first in the mesh (the same for the matrix and its transpose,
    so that a transposed solve takes the cotangent in the solution's sharding).

    **Arguments:**

    - `matrix`: a two-dimensional array or tracer.

    **Returns:**

    The pair of `jax.sharding.NamedSharding`s, or `None`.
    """
    sharding = explicit_sharding(matrix)
    if sharding is None:
        return None
    rows, columns = _rows_and_columns(sharding)
    out_size, in_size = jnp.shape(matrix)
    if out_size == in_size:
        entries = [e for e in (rows, columns) if e is not None]
        entry = min(entries, key=lambda e: _order(sharding, e)) if entries else None
        vector = NamedSharding(sharding.mesh, PartitionSpec(entry))
        return vector, vector
    return (
        NamedSharding(sharding.mesh, PartitionSpec(columns)),
        NamedSharding(sharding.mesh, PartitionSpec(rows)),
    )


def sharded_matvec(matrix: Any, vector: Any, precision: Any) -> Any:
    """`matrix @ vector` for a matrix with an explicit sharding: the vector is
    resharded as the matrix's columns, and the product is given in the sharding of
    `matrix_vector_shardings`'s output (JAX reduces over a sharded contraction once
    told the output's sharding).

    **Arguments:**

    - `matrix`: a two-dimensional array with an explicit sharding.
    - `vector`: a one-dimensional array.
    - `precision`: as for `jnp.matmul`.

    **Returns:**

    The product, a one-dimensional array.
    """
    sharding = explicit_sharding(matrix)
    shardings = matrix_vector_shardings(matrix)
    assert sharding is not None and shardings is not None
    _, columns = _rows_and_columns(sharding)
    vector = jax.sharding.reshard(
        vector, NamedSharding(sharding.mesh, PartitionSpec(columns))
    )
    return jnp.matmul(matrix, vector, precision=precision, out_sharding=shardings[1])
