"""Policy-preserving versions of lineax's operator functions."""

import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import Array, Shaped

from ..policies import AbstractPolicy, default_policy
from ..policies._memory import check_dense_budget
from ._dispatch_operator import AbstractDispatchOperator, adopt, banded, holds_entries
from ._function import FunctionLinearOperator, JacobianLinearOperator


def _policy_of(operator: lx.AbstractLinearOperator) -> AbstractPolicy:
    if isinstance(operator, AbstractDispatchOperator):
        return operator.policy
    return default_policy()


def materialise(operator: lx.AbstractLinearOperator) -> AbstractDispatchOperator:
    """As [`lineax.materialise`][], returning an operator of lineax-dispatch that
    keeps `operator`'s policy (or gets the default policy, for a plain lineax
    operator).

    **Arguments:**

    - `operator`: a linear operator.

    **Returns:**

    The materialised operator (a matrix or PyTree operator, or a diagonal or
    tridiagonal one where tags say so).

    **Raises:**

    `ValueError` at trace time when the operator's `Materialise` or `Auto`
    policy has a memory budget the dense matrix exceeds (as `mv` and `as_matrix`).

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((3,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Outline())
        dense = lxd.materialise(op)  # a PyTreeLinearOperator holding the matrix
        assert dense.policy == lxd.Outline()
        ```
    """
    policy = _policy_of(operator)
    if not (holds_entries(operator) or banded(operator)):
        check_dense_budget(operator, policy, what="`materialise`")
    return adopt(lx.materialise(operator), policy)


def linearise(operator: lx.AbstractLinearOperator) -> AbstractDispatchOperator:
    """As [`lineax.linearise`][] (caching the primal of a Jacobian operator), keeping
    the policy.

    **Arguments:**

    - `operator`: a linear operator.

    **Returns:**

    An equivalent operator of lineax-dispatch with the same policy.

    !!! Example

        ```python
        fn = lambda x, args: jnp.sin(x)
        op = lxd.JacobianLinearOperator(fn, jnp.zeros(2), policy=lxd.Lazy())
        lin = lxd.linearise(op)  # the primal computed once, not at every `mv`
        assert lin.policy == lxd.Lazy()
        ```
    """
    return adopt(lx.linearise(operator), _policy_of(operator))


def conj(operator: lx.AbstractLinearOperator) -> AbstractDispatchOperator:
    """As [`lineax.conj`][]: the elementwise complex conjugate, keeping the policy.

    **Arguments:**

    - `operator`: a linear operator.

    **Returns:**

    The conjugate operator, of lineax-dispatch, with the same policy.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.array([[1j, 0], [0, 1]]), policy=lxd.Lazy())
        assert lxd.conj(op).policy == lxd.Lazy()  # the matrix [[-1j, 0], [0, 1]]
        ```
    """
    if isinstance(operator, (FunctionLinearOperator, JacobianLinearOperator)):
        # lineax wraps the function in a lineax operator, whose output structure
        # it evaluates with the closed-over arrays as shapes alone (a sharding
        # lost): built as ours, it states the structure the function gives.
        return FunctionLinearOperator(
            lambda vector: jtu.tree_map(
                jnp.conj, operator.mv(jtu.tree_map(jnp.conj, vector))
            ),
            operator.in_structure(),
            operator.tags,
            policy=operator.policy,
        )
    return adopt(lx.conj(operator), _policy_of(operator))


def diagonal(operator: lx.AbstractLinearOperator) -> Shaped[Array, " size"]:
    """As [`lineax.diagonal`][]: the diagonal of `operator` as a vector.

    The result is an array, not an operator, so there is no policy to keep; this is
    here so that `lxd.` is a complete drop-in for lineax's functions. For a
    matrix-free operator lineax materialises it to take the diagonal (or applies
    `mv` once where it is tagged diagonal, through the operator's policy).

    **Arguments:**

    - `operator`: a linear operator.

    **Returns:**

    A one-dimensional array.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.array([[1.0, 2.0], [3.0, 4.0]]))
        d = lxd.diagonal(op)  # [1., 4.]
        ```
    """
    return lx.diagonal(operator)


def tridiagonal(
    operator: lx.AbstractLinearOperator,
) -> tuple[Shaped[Array, " size"], Shaped[Array, " size-1"], Shaped[Array, " size-1"]]:
    """As [`lineax.tridiagonal`][]: the diagonal, lower and upper diagonals.

    **Arguments:**

    - `operator`: a linear operator.

    **Returns:**

    A 3-tuple of arrays `(diagonal, lower_diagonal, upper_diagonal)`.

    !!! Example

        ```python
        matrix = jnp.array([[2.0, 1.0, 0.0], [3.0, 2.0, 1.0], [0.0, 3.0, 2.0]])
        op = lxd.MatrixLinearOperator(matrix, lx.tridiagonal_tag)
        d, lower, upper = lxd.tridiagonal(op)  # [2., 2., 2.], [3., 3.], [1., 1.]
        ```
    """
    return lx.tridiagonal(operator)
