"""Turning lineax operators into policy-carrying ones."""

import functools as ft
from collections.abc import Callable

import lineax as lx

from ..policies import AbstractPolicy, check_policy
from ..policies._base import with_top_policy
from ._base import AbstractDispatchOperator
from ._composite import (
    AddLinearOperator,
    ComposedLinearOperator,
    DivLinearOperator,
    MulLinearOperator,
    NegLinearOperator,
    TaggedLinearOperator,
)
from ._explicit import (
    DiagonalLinearOperator,
    IdentityLinearOperator,
    MatrixLinearOperator,
    PyTreeLinearOperator,
    TridiagonalLinearOperator,
)
from ._function import FunctionLinearOperator, JacobianLinearOperator


_Child = Callable[[lx.AbstractLinearOperator], lx.AbstractLinearOperator]


@ft.singledispatch
def _rebuild(
    operator: lx.AbstractLinearOperator, policy: AbstractPolicy, child: _Child
) -> AbstractDispatchOperator:
    raise TypeError(
        "`operator` must be one of lineax's concrete operators (Matrix, PyTree, "
        "Diagonal, Tridiagonal, Identity, Function, Jacobian, Tagged, Add, Mul, Div, "
        f"Neg, Composed); got {type(operator).__name__}"
    )


@_rebuild.register(lx.MatrixLinearOperator)
def _(operator, policy, child):
    return MatrixLinearOperator(operator.matrix, operator.tags, policy=policy)


@_rebuild.register(lx.PyTreeLinearOperator)
def _(operator, policy, child):
    return PyTreeLinearOperator(
        operator.pytree, operator.out_structure(), operator.tags, policy=policy
    )


@_rebuild.register(lx.DiagonalLinearOperator)
def _(operator, policy, child):
    return DiagonalLinearOperator(operator.diagonal, policy=policy)


@_rebuild.register(lx.TridiagonalLinearOperator)
def _(operator, policy, child):
    return TridiagonalLinearOperator(
        operator.diagonal,
        operator.lower_diagonal,
        operator.upper_diagonal,
        policy=policy,
    )


@_rebuild.register(lx.IdentityLinearOperator)
def _(operator, policy, child):
    return IdentityLinearOperator(
        operator.in_structure(), operator.out_structure(), policy=policy
    )


@_rebuild.register(lx.FunctionLinearOperator)
def _(operator, policy, child):
    return FunctionLinearOperator(
        operator.fn,
        operator.in_structure(),
        operator.tags,
        closure_convert=False,
        policy=policy,
    )


@_rebuild.register(lx.JacobianLinearOperator)
def _(operator, policy, child):
    return JacobianLinearOperator(
        operator.fn,
        operator.x,
        operator.args,
        operator.tags,
        operator.jac,
        closure_convert=False,
        policy=policy,
    )


@_rebuild.register(lx.TaggedLinearOperator)
def _(operator, policy, child):
    return TaggedLinearOperator(child(operator.operator), operator.tags, policy=policy)


@_rebuild.register(lx.AddLinearOperator)
def _(operator, policy, child):
    return AddLinearOperator(
        child(operator.operator1), child(operator.operator2), policy=policy
    )


@_rebuild.register(lx.ComposedLinearOperator)
def _(operator, policy, child):
    return ComposedLinearOperator(
        child(operator.operator1), child(operator.operator2), policy=policy
    )


@_rebuild.register(lx.MulLinearOperator)
def _(operator, policy, child):
    return MulLinearOperator(child(operator.operator), operator.scalar, policy=policy)


@_rebuild.register(lx.DivLinearOperator)
def _(operator, policy, child):
    return DivLinearOperator(child(operator.operator), operator.scalar, policy=policy)


@_rebuild.register(lx.NegLinearOperator)
def _(operator, policy, child):
    return NegLinearOperator(child(operator.operator), policy=policy)


def with_policy(
    operator: lx.AbstractLinearOperator, policy: AbstractPolicy
) -> AbstractDispatchOperator:
    """Converts any lineax operator into the lineax-dispatch operator of the same
    kind, carrying `policy`. Composite operators are converted recursively, every
    node getting `policy`; an operator that is already ours gets the new policy.

    **Arguments:**

    - `operator`: a lineax operator (plain or of lineax-dispatch).
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][].

    **Returns:**

    An [`lineax_dispatch.AbstractDispatchOperator`][] with the same arrays, tags and
    structure.

    !!! Example

        ```python
        plain = lx.MatrixLinearOperator(jnp.eye(3)) + lx.IdentityLinearOperator(
            jax.eval_shape(lambda: jnp.ones(3))
        )
        op = lxd.with_policy(plain, lxd.Outline())  # an lxd.AddLinearOperator
        assert op.operator1.policy == lxd.Outline()
        ```
    """
    check_policy(policy)
    if not isinstance(operator, lx.AbstractLinearOperator):
        raise TypeError(
            "`operator` must be a lineax AbstractLinearOperator; got "
            f"{type(operator).__name__}"
        )
    return _rebuild(operator, policy, lambda op: with_policy(op, policy))


def adopt(
    operator: lx.AbstractLinearOperator, policy: AbstractPolicy
) -> AbstractDispatchOperator:
    """Gives `operator` (typically a plain lineax result of a lineax function applied
    to ours) the policy `policy`: the top node gets `policy`, plain lineax nodes
    below it are converted with `policy`, and nodes that are already ours keep
    their own policies.

    **Arguments:**

    - `operator`: a lineax operator.
    - `policy`: the policy for the top node and for converted nodes.

    **Returns:**

    An [`lineax_dispatch.AbstractDispatchOperator`][].
    """

    def child(op):
        if isinstance(op, AbstractDispatchOperator):
            return op
        return _rebuild(op, policy, child)

    if isinstance(operator, AbstractDispatchOperator):
        if operator.policy == policy:
            return operator
        if not _plain_children(operator):
            # Only the top node's policy changes: no `__init__` run again.
            return with_top_policy(operator, check_policy(policy))
    return _rebuild(operator, policy, child)


def _plain_children(operator: AbstractDispatchOperator) -> bool:
    return any(
        isinstance(value, lx.AbstractLinearOperator)
        and not isinstance(value, AbstractDispatchOperator)
        for value in vars(operator).values()
    )
