"""Policy-preserving versions of lineax's operator functions."""

import lineax as lx
from jaxtyping import Array, Shaped

from ..policies import AbstractPolicy, default_policy
from ._base import AbstractDispatchOperator
from ._convert import adopt


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

    !!! Example

        ```python
        dense = lxd.materialise(lxd.FunctionLinearOperator(fn, s, policy=lxd.Outline()))
        assert dense.policy == lxd.Outline()
        ```
    """
    return adopt(lx.materialise(operator), _policy_of(operator))


def linearise(operator: lx.AbstractLinearOperator) -> AbstractDispatchOperator:
    """As [`lineax.linearise`][] (caching the primal of a Jacobian operator), keeping
    the policy.

    **Arguments:**

    - `operator`: a linear operator.

    **Returns:**

    An equivalent operator of lineax-dispatch with the same policy.
    """
    return adopt(lx.linearise(operator), _policy_of(operator))


def conj(operator: lx.AbstractLinearOperator) -> AbstractDispatchOperator:
    """As [`lineax.conj`][]: the elementwise complex conjugate, keeping the policy.

    **Arguments:**

    - `operator`: a linear operator.

    **Returns:**

    The conjugate operator, of lineax-dispatch, with the same policy.
    """
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
    """
    return lx.tridiagonal(operator)
