"""The preconditioners as lineax operators: the inverse of a diagonal, and the
inverses of diagonal blocks. Every function of lineax that dispatches on an
operator's class (`lx.linearise`, `lx.is_positive_semidefinite`, ...) is
registered for them, so lineax's solvers and this package's take them as
`options["preconditioner"]`."""

import abc
from typing import Any

import equinox as eqx
import jax
import jax.flatten_util as jfu
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jax.sharding import PartitionSpec
from jaxtyping import Array, Bool, Inexact, PyTree

from .._explicit_axes import explicit_sharding


def flat_structure(structure: PyTree[jax.ShapeDtypeStruct]) -> tuple[Any, Any]:
    """`structure` as a hashable `(leaves, treedef)`, sharding and weak typing
    dropped (as lineax keeps structures in static fields)."""
    leaves, treedef = jtu.tree_flatten(structure)
    return tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves), treedef


class AbstractPreconditioner(lx.AbstractLinearOperator):
    """A preconditioner built by this package: a linear operator approximating the
    inverse of another, square one, applied to flattened vectors.

    `build` says how its entries were found (read from the operator's structure,
    from coloured probe vectors, or from basis vectors in batches); `explain()`
    returns it. `valid` says whether every entry was usable (a nonzero diagonal,
    of the right sign where the operator is definite, invertible blocks): a
    preconditioner built with `throw=False` holds NaN where it is not.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.diag(jnp.array([2.0, 4.0])))
        m = lxd.jacobi(op)
        assert isinstance(m, lxd.AbstractPreconditioner)
        print(m.explain())  # read from the matrix's entries
        ```
    """

    structure: tuple[Any, Any] = eqx.field(static=True)
    tags: frozenset[object] = eqx.field(static=True)
    build: str = eqx.field(static=True)
    valid: Bool[Array, ""]

    @abc.abstractmethod
    def flat_mv(self, x: Inexact[Array, " n"]) -> Inexact[Array, " n"]:
        """The preconditioner applied to a flattened vector.

        **Arguments:**

        - `x`: a one-dimensional array of the operator's size.

        **Returns:**

        An array of the same shape.
        """

    @abc.abstractmethod
    def flat_diagonal(self) -> Inexact[Array, " n"]:
        """The preconditioner's own diagonal, flattened.

        **Returns:**

        A one-dimensional array.
        """

    @abc.abstractmethod
    def map_arrays(self, fn) -> "AbstractPreconditioner":
        """This preconditioner with `fn` applied to its entries (transposed where
        `fn` is `"transpose"`).

        **Arguments:**

        - `fn`: a function of an array, or `"transpose"`.

        **Returns:**

        A preconditioner of the same class.
        """

    def explain(self) -> str:
        """How this preconditioner was built.

        **Returns:**

        A sentence.
        """
        return self.build

    def mv(self, vector: PyTree[Array]) -> PyTree[Array]:
        flat, unravel = jfu.ravel_pytree(vector)
        return unravel(self.flat_mv(flat))

    def as_matrix(self) -> Inexact[Array, "n n"]:
        size = self.in_size()
        eye = jnp.eye(size, dtype=self.flat_diagonal().dtype)
        return jax.vmap(self.flat_mv, in_axes=1, out_axes=1)(eye)

    def transpose(self) -> "AbstractPreconditioner":
        return self.map_arrays("transpose")

    def in_structure(self) -> PyTree[jax.ShapeDtypeStruct]:
        leaves, treedef = self.structure
        return jtu.tree_unflatten(treedef, leaves)

    def out_structure(self) -> PyTree[jax.ShapeDtypeStruct]:
        return self.in_structure()


class JacobiPreconditioner(AbstractPreconditioner):
    """The inverse of an operator's diagonal, as [`lineax_dispatch.jacobi`][]
    builds it: `mv` multiplies each entry of the flattened vector by
    `inverse_diagonal`.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.diag(jnp.array([2.0, 4.0])))
        m = lxd.jacobi(op)
        y = m.mv(jnp.ones(2))  # [0.5, 0.25]
        ```
    """

    inverse_diagonal: Inexact[Array, " n"]

    def flat_mv(self, x):
        with jax.numpy_dtype_promotion("standard"):
            return (self.inverse_diagonal * x).astype(x.dtype)

    def flat_diagonal(self):
        return self.inverse_diagonal

    def map_arrays(self, fn):
        if fn == "transpose":
            return self
        return eqx.tree_at(
            lambda p: p.inverse_diagonal, self, fn(self.inverse_diagonal)
        )


class BlockJacobiPreconditioner(AbstractPreconditioner):
    """The inverses of an operator's diagonal blocks, as
    [`lineax_dispatch.block_jacobi`][] builds them: `mv` splits the flattened
    vector into consecutive pieces of `block_size` (the last one padded with
    zeros where the size is not a multiple) and multiplies each by its block's
    inverse, at float32's precision or above on every backend.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.kron(jnp.eye(2), jnp.ones((2, 2)) + jnp.eye(2)))
        m = lxd.block_jacobi(op, 2)
        y = m.mv(op.mv(jnp.arange(4.0)))  # [0., 1., 2., 3.]: op is block diagonal
        ```
    """

    inverse_blocks: Inexact[Array, "blocks size size"]

    def flat_mv(self, x):
        count, size, _ = self.inverse_blocks.shape
        n = x.shape[0]
        pieces = jnp.pad(x, (0, count * size - n)).reshape(count, size)
        inverse = self.inverse_blocks
        sharding = explicit_sharding(pieces)
        if sharding is not None:  # the blocks split as the pieces are
            spec = PartitionSpec(sharding.spec[0], None, None)
            inverse = jax.sharding.reshard(inverse, spec)
        with jax.numpy_dtype_promotion("standard"):
            out = jnp.einsum(
                "kij,kj->ki",
                inverse,
                pieces,
                precision=lax.Precision.HIGHEST,
            )
        return out.reshape(-1)[:n].astype(x.dtype)

    def flat_diagonal(self):
        return jnp.diagonal(self.inverse_blocks, axis1=1, axis2=2).reshape(-1)[
            : self.in_size()
        ]

    def map_arrays(self, fn):
        blocks = self.inverse_blocks
        new = jnp.swapaxes(blocks, 1, 2) if fn == "transpose" else fn(blocks)
        return eqx.tree_at(lambda p: p.inverse_blocks, self, new)


@lx.linearise.register(AbstractPreconditioner)
@lx.materialise.register(AbstractPreconditioner)
def _itself(operator):
    return operator


@lx.diagonal.register(AbstractPreconditioner)
def _diagonal(operator):
    return operator.flat_diagonal()


@lx.tridiagonal.register(AbstractPreconditioner)
def _tridiagonal(operator):
    matrix = operator.as_matrix()
    return (
        jnp.diagonal(matrix),
        jnp.diagonal(matrix, offset=-1),
        jnp.diagonal(matrix, offset=1),
    )


@lx.is_symmetric.register(AbstractPreconditioner)
def _is_symmetric(operator):
    return isinstance(operator, JacobiPreconditioner) or (
        lx.symmetric_tag in operator.tags
    )


@lx.is_diagonal.register(AbstractPreconditioner)
@lx.is_tridiagonal.register(AbstractPreconditioner)
@lx.is_lower_triangular.register(AbstractPreconditioner)
@lx.is_upper_triangular.register(AbstractPreconditioner)
def _is_diagonal(operator):
    return isinstance(operator, JacobiPreconditioner)


@lx.has_unit_diagonal.register(AbstractPreconditioner)
@lx.is_negative_semidefinite.register(AbstractPreconditioner)
def _false(operator):
    return False


@lx.is_positive_semidefinite.register(AbstractPreconditioner)
def _is_positive_semidefinite(operator):
    return lx.positive_semidefinite_tag in operator.tags


@lx.conj.register(AbstractPreconditioner)
def _conj(operator):
    return operator.map_arrays(jnp.conj)


_FIELDS = """**Arguments:**

- `structure`: the operator's input structure, as `flat_structure` gives it.
- `tags`: lineax tags (positive semidefinite and symmetric where the operator is
    definite).
- `build`: how the entries were read, in words.
- `valid`: whether every entry was usable.
"""

JacobiPreconditioner.__init__.__doc__ = (
    _FIELDS + "- `inverse_diagonal`: the inverse of the flattened diagonal.\n"
)
BlockJacobiPreconditioner.__init__.__doc__ = (
    _FIELDS
    + "- `inverse_blocks`: the inverse diagonal blocks, of shape `(blocks, size, "
    "size)`.\n"
)
