"""Operators that hold their entries: matrix, PyTree, diagonal, tridiagonal,
identity."""

from collections.abc import Iterable
from operator import methodcaller

import jax
import jax.lax as lax
import lineax as lx
from jaxtyping import Array, ArrayLike, Inexact, PyTree, Shaped

from ..policies import AbstractPolicy
from ._dispatch_operator import AbstractDispatchOperator, rebuild_as
from ._sharding import matrix_vector_shardings, sharded_matvec


_sentinel = object()


class MatrixLinearOperator(AbstractDispatchOperator, lx.MatrixLinearOperator):
    """[`lineax.MatrixLinearOperator`][] carrying a policy: a two-dimensional array
    as a linear operator.

    It already holds its entries, so every policy applies it as a matrix-vector
    product ([`lineax_dispatch.Auto`][] keeps it inline); the policy matters when it
    is part of a composite operator, and for stacks of vectors.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.eye(3), lx.positive_semidefinite_tag)
        y = op.mv(jnp.ones(3))
        ```
    """

    def __init__(
        self,
        matrix: Shaped[Array, "a b"],
        tags: object | frozenset[object] = (),
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `matrix`: a two-dimensional array of shape `(a, b)`: the operator maps
            vectors of shape `(b,)` to vectors of shape `(a,)`.
        - `tags`: lineax tags (`lx.symmetric_tag`, ...), unchecked.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default policy if
            not given.
        """
        lx.MatrixLinearOperator.__init__(self, matrix, tags)
        self._set_policy(policy)

    def raw_mv(self, vector: Array) -> Array:
        """The matrix-vector product, as lineax's; for a matrix whose type holds an
        explicit sharding, in the sharding of `out_structure()`.

        **Arguments:**

        - `vector`: a vector matching `self.in_structure()`.

        **Returns:**

        A vector matching `self.out_structure()`.
        """
        if matrix_vector_shardings(self.matrix) is None:
            return super().raw_mv(vector)
        return sharded_matvec(self.matrix, vector, lax.Precision.HIGHEST)

    def in_structure(self) -> jax.ShapeDtypeStruct:
        """The input structure, as lineax's; on a mesh with Explicit axes it holds
        the sharding of the vectors the matrix takes (see the docs' page "Across
        devices and machines").

        **Returns:**

        A `jax.ShapeDtypeStruct`.
        """
        return _with_sharding(super().in_structure(), self.matrix, 0)

    def out_structure(self) -> jax.ShapeDtypeStruct:
        """As `in_structure`, for the vectors the matrix gives."""
        return _with_sharding(super().out_structure(), self.matrix, 1)


def _with_sharding(
    structure: jax.ShapeDtypeStruct, matrix: Array, which: int
) -> jax.ShapeDtypeStruct:
    shardings = matrix_vector_shardings(matrix)
    if shardings is None:
        return structure
    return jax.ShapeDtypeStruct(
        structure.shape, structure.dtype, sharding=shardings[which]
    )


class PyTreeLinearOperator(AbstractDispatchOperator, lx.PyTreeLinearOperator):
    """[`lineax.PyTreeLinearOperator`][] carrying a policy: a matrix stored as a
    PyTree of blocks, for input and output spaces that are PyTrees.

    !!! Example

        ```python
        # Input: an array of shape (2,); output: {"a": shape (2,), "b": shape (3,)}.
        blocks = {"a": jnp.eye(2), "b": jnp.ones((3, 2))}
        out = {"a": jax.ShapeDtypeStruct((2,), blocks["a"].dtype),
               "b": jax.ShapeDtypeStruct((3,), blocks["b"].dtype)}
        op = lxd.PyTreeLinearOperator(blocks, out)
        y = op.mv(jnp.ones(2))  # {"a": [1, 1], "b": [2, 2, 2]}
        ```
    """

    def __init__(
        self,
        pytree: PyTree[ArrayLike],
        output_structure: PyTree[jax.ShapeDtypeStruct],
        tags: object | frozenset[object] = (),
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `pytree`: the PyTree of blocks, as for lineax: the output structure, each
            leaf of which is a PyTree of the input structure, whose leaves have the
            shape of the output leaf followed by the shape of the input leaf.
        - `output_structure`: PyTree of `jax.ShapeDtypeStruct` of the output space.
        - `tags`: lineax tags, unchecked.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        lx.PyTreeLinearOperator.__init__(self, pytree, output_structure, tags)
        self._set_policy(policy)


class DiagonalLinearOperator(AbstractDispatchOperator, lx.DiagonalLinearOperator):
    """[`lineax.DiagonalLinearOperator`][] carrying a policy: elementwise
    multiplication by its diagonal.

    !!! Example

        ```python
        op = lxd.DiagonalLinearOperator(jnp.array([1.0, 2.0, 3.0]))
        y = op.mv(jnp.ones(3))  # [1., 2., 3.]
        ```
    """

    def __init__(
        self, diagonal: PyTree[ArrayLike], *, policy: AbstractPolicy | None = None
    ):
        """**Arguments:**

        - `diagonal`: an array or PyTree of arrays, the diagonal; the input and
            output structures are its structure.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        lx.DiagonalLinearOperator.__init__(self, diagonal)
        self._set_policy(policy)


class TridiagonalLinearOperator(AbstractDispatchOperator, lx.TridiagonalLinearOperator):
    """[`lineax.TridiagonalLinearOperator`][] carrying a policy: a square matrix
    stored as its three central diagonals.

    !!! Example

        ```python
        op = lxd.TridiagonalLinearOperator(2 * jnp.ones(4), -jnp.ones(3), -jnp.ones(3))
        sol = lx.linear_solve(op, jnp.ones(4), lx.Tridiagonal())
        ```
    """

    def __init__(
        self,
        diagonal: Inexact[Array, " size"],
        lower_diagonal: Inexact[Array, " size-1"],
        upper_diagonal: Inexact[Array, " size-1"],
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `diagonal`: the main diagonal, shape `(a,)`.
        - `lower_diagonal`: the diagonal below it, shape `(a - 1,)`.
        - `upper_diagonal`: the diagonal above it, shape `(a - 1,)`.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        lx.TridiagonalLinearOperator.__init__(
            self, diagonal, lower_diagonal, upper_diagonal
        )
        self._set_policy(policy)


class IdentityLinearOperator(AbstractDispatchOperator, lx.IdentityLinearOperator):
    """[`lineax.IdentityLinearOperator`][] carrying a policy: the identity of a
    PyTree space (or, between two structures of the same size, the map that keeps
    the flattened entries).

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((3,), jnp.float32)
        op = lxd.IdentityLinearOperator(structure)
        shifted = op + lxd.DiagonalLinearOperator(jnp.ones(3, jnp.float32))
        ```
    """

    def __init__(
        self,
        input_structure: PyTree[jax.ShapeDtypeStruct],
        output_structure: PyTree[jax.ShapeDtypeStruct] | Iterable = _sentinel,  # pyright: ignore
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `input_structure`: PyTree of `jax.ShapeDtypeStruct` of the input space.
        - `output_structure`: PyTree of `jax.ShapeDtypeStruct` of the output space,
            as lineax; defaults to `input_structure`.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        if output_structure is _sentinel:
            output_structure = input_structure
        lx.IdentityLinearOperator.__init__(self, input_structure, output_structure)
        self._set_policy(policy)


rebuild_as(lx.MatrixLinearOperator, MatrixLinearOperator, "matrix", "tags")
rebuild_as(
    lx.PyTreeLinearOperator,
    PyTreeLinearOperator,
    "pytree",
    methodcaller("out_structure"),
    "tags",
)
rebuild_as(lx.DiagonalLinearOperator, DiagonalLinearOperator, "diagonal")
rebuild_as(
    lx.TridiagonalLinearOperator,
    TridiagonalLinearOperator,
    "diagonal",
    "lower_diagonal",
    "upper_diagonal",
)
rebuild_as(
    lx.IdentityLinearOperator,
    IdentityLinearOperator,
    methodcaller("in_structure"),
    methodcaller("out_structure"),
)
