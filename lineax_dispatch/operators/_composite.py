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
    """[`lineax.TaggedLinearOperator`][] carrying a policy.

    **Arguments:**

    - `operator`: the wrapped operator.
    - `tags`: tags to declare, unchecked.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self,
        operator: lx.AbstractLinearOperator,
        tags: object | Iterable[object],
        *,
        policy: AbstractPolicy | None = None,
    ):
        lx.TaggedLinearOperator.__init__(self, _operator(operator, "operator"), tags)
        self._set_policy(policy)


class AddLinearOperator(AbstractDispatchOperator, lx.AddLinearOperator):
    """[`lineax.AddLinearOperator`][] carrying a policy: `operator1 + operator2`.

    **Arguments:**

    - `operator1`, `operator2`: operators with equal structures.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self,
        operator1: lx.AbstractLinearOperator,
        operator2: lx.AbstractLinearOperator,
        *,
        policy: AbstractPolicy | None = None,
    ):
        self.operator1 = _operator(operator1, "operator1")
        self.operator2 = _operator(operator2, "operator2")
        self._set_policy(policy)


class MulLinearOperator(AbstractDispatchOperator, lx.MulLinearOperator):
    """[`lineax.MulLinearOperator`][] carrying a policy: `operator * scalar`.

    **Arguments:**

    - `operator`: an operator.
    - `scalar`: a scalar.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self,
        operator: lx.AbstractLinearOperator,
        scalar: ArrayLike,
        *,
        policy: AbstractPolicy | None = None,
    ):
        self.operator = _operator(operator, "operator")
        self.scalar = _scalar(scalar, "multiply")
        self._set_policy(policy)


class DivLinearOperator(AbstractDispatchOperator, lx.DivLinearOperator):
    """[`lineax.DivLinearOperator`][] carrying a policy: `operator / scalar`.

    **Arguments:**

    - `operator`: an operator.
    - `scalar`: a scalar.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self,
        operator: lx.AbstractLinearOperator,
        scalar: ArrayLike,
        *,
        policy: AbstractPolicy | None = None,
    ):
        self.operator = _operator(operator, "operator")
        self.scalar = _scalar(scalar, "divide")
        self._set_policy(policy)


class NegLinearOperator(AbstractDispatchOperator, lx.NegLinearOperator):
    """[`lineax.NegLinearOperator`][] carrying a policy: `-operator`.

    **Arguments:**

    - `operator`: an operator.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self,
        operator: lx.AbstractLinearOperator,
        *,
        policy: AbstractPolicy | None = None,
    ):
        self.operator = _operator(operator, "operator")
        self._set_policy(policy)


class ComposedLinearOperator(AbstractDispatchOperator, lx.ComposedLinearOperator):
    """[`lineax.ComposedLinearOperator`][] carrying a policy: `operator1 @
    operator2`.

    **Arguments:**

    - `operator1`: applied second.
    - `operator2`: applied first; its output structure must match `operator1`'s
        input structure.
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
    """

    def __init__(
        self,
        operator1: lx.AbstractLinearOperator,
        operator2: lx.AbstractLinearOperator,
        *,
        policy: AbstractPolicy | None = None,
    ):
        self.operator1 = _operator(operator1, "operator1")
        self.operator2 = _operator(operator2, "operator2")
        self._set_policy(policy)
