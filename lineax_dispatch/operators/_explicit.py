"""Operators that hold their entries: matrix, PyTree, diagonal, tridiagonal,
identity."""

from collections.abc import Iterable

import jax
import lineax as lx
from jaxtyping import Array, ArrayLike, Inexact, PyTree, Shaped

from ..policies import AbstractPolicy
from ._base import AbstractDispatchOperator


_sentinel = object()


class MatrixLinearOperator(AbstractDispatchOperator, lx.MatrixLinearOperator):
    """[`lineax.MatrixLinearOperator`][] carrying a policy.

    **Arguments:**

    - `matrix`: a two-dimensional array of shape `(a, b)`.
    - `tags`: lineax tags (`lx.symmetric_tag`, ...), unchecked.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default policy if not
        given.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.eye(3), lx.positive_semidefinite_tag)
        ```
    """

    def __init__(
        self,
        matrix: Shaped[Array, "a b"],
        tags: object | frozenset[object] = (),
        *,
        policy: AbstractPolicy | None = None,
    ):
        lx.MatrixLinearOperator.__init__(self, matrix, tags)
        self._set_policy(policy)


class PyTreeLinearOperator(AbstractDispatchOperator, lx.PyTreeLinearOperator):
    """[`lineax.PyTreeLinearOperator`][] carrying a policy.

    **Arguments:**

    - `pytree`: the PyTree of blocks, as for lineax.
    - `output_structure`: PyTree of `jax.ShapeDtypeStruct` of the output space.
    - `tags`: lineax tags, unchecked.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self,
        pytree: PyTree[ArrayLike],
        output_structure: PyTree[jax.ShapeDtypeStruct],
        tags: object | frozenset[object] = (),
        *,
        policy: AbstractPolicy | None = None,
    ):
        lx.PyTreeLinearOperator.__init__(self, pytree, output_structure, tags)
        self._set_policy(policy)


class DiagonalLinearOperator(AbstractDispatchOperator, lx.DiagonalLinearOperator):
    """[`lineax.DiagonalLinearOperator`][] carrying a policy.

    **Arguments:**

    - `diagonal`: an array or PyTree of arrays, the diagonal.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self, diagonal: PyTree[ArrayLike], *, policy: AbstractPolicy | None = None
    ):
        lx.DiagonalLinearOperator.__init__(self, diagonal)
        self._set_policy(policy)


class TridiagonalLinearOperator(AbstractDispatchOperator, lx.TridiagonalLinearOperator):
    """[`lineax.TridiagonalLinearOperator`][] carrying a policy.

    **Arguments:**

    - `diagonal`: shape `(a,)`.
    - `lower_diagonal`: shape `(a - 1,)`.
    - `upper_diagonal`: shape `(a - 1,)`.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self,
        diagonal: Inexact[Array, " size"],
        lower_diagonal: Inexact[Array, " size-1"],
        upper_diagonal: Inexact[Array, " size-1"],
        *,
        policy: AbstractPolicy | None = None,
    ):
        lx.TridiagonalLinearOperator.__init__(
            self, diagonal, lower_diagonal, upper_diagonal
        )
        self._set_policy(policy)


class IdentityLinearOperator(AbstractDispatchOperator, lx.IdentityLinearOperator):
    """[`lineax.IdentityLinearOperator`][] carrying a policy.

    **Arguments:**

    - `input_structure`: PyTree of `jax.ShapeDtypeStruct`.
    - `output_structure`: as lineax; defaults to `input_structure`.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self,
        input_structure: PyTree[jax.ShapeDtypeStruct],
        output_structure: PyTree[jax.ShapeDtypeStruct] | Iterable = _sentinel,  # pyright: ignore
        *,
        policy: AbstractPolicy | None = None,
    ):
        if output_structure is _sentinel:
            output_structure = input_structure
        lx.IdentityLinearOperator.__init__(self, input_structure, output_structure)
        self._set_policy(policy)
