"""Operators built from other operators: tagged, sum, scalar product, quotient,
negation, composition."""

from collections.abc import Iterable

import jax.numpy as jnp
import lineax as lx
from jaxtyping import ArrayLike

from ..policies import AbstractPolicy
from ._base import AbstractDispatchOperator


def _scalar(value: ArrayLike, what: str):
    value = jnp.asarray(value)
    if value.shape != ():
        raise ValueError(
            f"Can only {what} AbstractLinearOperators by scalars; `scalar` has shape "
            f"{value.shape}"
        )
    return value


def _operator(value, name: str) -> lx.AbstractLinearOperator:
    if not isinstance(value, lx.AbstractLinearOperator):
        raise TypeError(
            f"`{name}` must be a lineax AbstractLinearOperator; got "
            f"{type(value).__name__}"
        )
    return value


class TaggedLinearOperator(AbstractDispatchOperator, lx.TaggedLinearOperator):
    """[`lineax.TaggedLinearOperator`][] carrying a policy: another operator with
    extra tags, for solvers that need them (`CG` needs a positive or negative
    semidefinite operator, `MINRES` a symmetric one).

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.array([[2.0, 1.0], [1.0, 2.0]]))
        spd = lxd.TaggedLinearOperator(op, lx.positive_semidefinite_tag)
        sol = lx.linear_solve(spd, jnp.ones(2), lxd.CG(rtol=1e-6, atol=1e-6))
        ```
    """

    def __init__(
        self,
        operator: lx.AbstractLinearOperator,
        tags: object | Iterable[object],
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `operator`: the wrapped operator.
        - `tags`: a tag or a collection of tags to declare, unchecked.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        lx.TaggedLinearOperator.__init__(self, _operator(operator, "operator"), tags)
        self._set_policy(policy)


class AddLinearOperator(AbstractDispatchOperator, lx.AddLinearOperator):
    """[`lineax.AddLinearOperator`][] carrying a policy: `operator1 + operator2`.

    Usually made by `+` (or `-`): the sum keeps the operands' policy when they
    agree; otherwise it gets the default policy and each operand keeps its own.

    !!! Example

        ```python
        a = lxd.MatrixLinearOperator(jnp.eye(2), policy=lxd.Lazy())
        op = a + lxd.DiagonalLinearOperator(jnp.ones(2), policy=lxd.Lazy())
        assert isinstance(op, lxd.AddLinearOperator) and op.policy == lxd.Lazy()
        ```
    """

    def __init__(
        self,
        operator1: lx.AbstractLinearOperator,
        operator2: lx.AbstractLinearOperator,
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `operator1`, `operator2`: operators with equal input structures and equal
            output structures.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        self.operator1 = _operator(operator1, "operator1")
        self.operator2 = _operator(operator2, "operator2")
        self._set_policy(policy)


class MulLinearOperator(AbstractDispatchOperator, lx.MulLinearOperator):
    """[`lineax.MulLinearOperator`][] carrying a policy: `operator * scalar`.

    Usually made by `*` with a scalar on either side; it keeps the operator's
    policy.

    !!! Example

        ```python
        op = 2.0 * lxd.MatrixLinearOperator(jnp.eye(2))
        assert isinstance(op, lxd.MulLinearOperator)
        ```
    """

    def __init__(
        self,
        operator: lx.AbstractLinearOperator,
        scalar: ArrayLike,
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `operator`: an operator.
        - `scalar`: a scalar (a Python number or an array of shape `()`).
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        self.operator = _operator(operator, "operator")
        self.scalar = _scalar(scalar, "multiply")
        self._set_policy(policy)


class DivLinearOperator(AbstractDispatchOperator, lx.DivLinearOperator):
    """[`lineax.DivLinearOperator`][] carrying a policy: `operator / scalar`.

    Usually made by `/`; it keeps the operator's policy.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.eye(2)) / 4.0
        assert isinstance(op, lxd.DivLinearOperator)
        ```
    """

    def __init__(
        self,
        operator: lx.AbstractLinearOperator,
        scalar: ArrayLike,
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `operator`: an operator.
        - `scalar`: a scalar (a Python number or an array of shape `()`).
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        self.operator = _operator(operator, "operator")
        self.scalar = _scalar(scalar, "divide")
        self._set_policy(policy)


class NegLinearOperator(AbstractDispatchOperator, lx.NegLinearOperator):
    """[`lineax.NegLinearOperator`][] carrying a policy: `-operator`.

    Usually made by unary `-`; it keeps the operator's policy.

    !!! Example

        ```python
        op = -lxd.MatrixLinearOperator(jnp.eye(2))
        assert isinstance(op, lxd.NegLinearOperator)
        ```
    """

    def __init__(
        self,
        operator: lx.AbstractLinearOperator,
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `operator`: an operator.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        self.operator = _operator(operator, "operator")
        self._set_policy(policy)


class ComposedLinearOperator(AbstractDispatchOperator, lx.ComposedLinearOperator):
    """[`lineax.ComposedLinearOperator`][] carrying a policy: `operator1 @
    operator2`, which applies `operator2` and then `operator1`.

    Usually made by `@`: the composition keeps the operands' policy when they
    agree; otherwise it gets the default policy and each operand keeps its own.

    !!! Example

        ```python
        scale = lxd.DiagonalLinearOperator(jnp.array([1.0, 2.0]))
        rotate = lxd.MatrixLinearOperator(jnp.array([[0.0, -1.0], [1.0, 0.0]]))
        op = scale @ rotate
        assert isinstance(op, lxd.ComposedLinearOperator)
        y = op.mv(jnp.array([1.0, 0.0]))  # [0., 2.]
        ```
    """

    def __init__(
        self,
        operator1: lx.AbstractLinearOperator,
        operator2: lx.AbstractLinearOperator,
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `operator1`: applied second.
        - `operator2`: applied first; its output structure must match `operator1`'s
            input structure.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        self.operator1 = _operator(operator1, "operator1")
        self.operator2 = _operator(operator2, "operator2")
        self._set_policy(policy)
