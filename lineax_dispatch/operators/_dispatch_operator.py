"""The base class of every policy-carrying operator, the composite operators its
arithmetic builds (tagged, sum, scalar product, quotient, negation,
composition), and the conversion of lineax operators into ours (`with_policy`,
`adopt`), for which each module of operators registers its classes with
`rebuild`."""

import functools as ft
from collections.abc import Callable, Iterable
from typing import Any, cast

import equinox as eqx
import jax.numpy as jnp
import lineax as lx
from jaxtyping import ArrayLike, PyTree

from .._compat import root_trace_ref
from ..policies import AbstractPolicy, check_policy, default_policy, in_raw_mv_context
from ..policies._dense import EXPLICIT_OPERATORS
from ..policies._eager import eager_apply
from ..policies._memory import check_dense_budget
from ..policies._policy_interface import with_top_policy
from ._vector_structure import check_vector


class AbstractDispatchOperator(lx.AbstractLinearOperator):
    """Abstract base class of the operators of lineax-dispatch.

    Each concrete subclass also subclasses the lineax operator of the same name, so
    every lineax function, predicate and solver accepts it. On top of lineax it
    carries a `policy` ([`lineax_dispatch.AbstractPolicy`][]) that decides how `mv`
    is applied, checks the structure of the vector given to `mv`, and keeps its
    policy through transposition and operator arithmetic.

    Every concrete subclass takes lineax's constructor arguments plus a keyword
    `policy=` (the default policy, [`lineax_dispatch.Auto`][], if not given), and
    exposes it as the attribute `policy`. Use this class for `isinstance` checks;
    [`lineax_dispatch.with_policy`][] converts a plain lineax operator.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.eye(2), policy=lxd.Lazy())
        assert isinstance(op, lxd.AbstractDispatchOperator)
        assert isinstance(op, lx.MatrixLinearOperator)
        assert op.T.policy == lxd.Lazy()
        ```
    """

    policy: AbstractPolicy = eqx.field(static=True)

    def _set_policy(self, policy: AbstractPolicy | None) -> None:
        # Called from each concrete `__init__`.
        self.policy = default_policy() if policy is None else check_policy(policy)

    def mv(self, vector: PyTree[Any]) -> PyTree[Any]:
        """Computes the matrix-vector product, applied as this operator's policy
        says.

        **Arguments:**

        - `vector`: a PyTree of arrays matching `self.in_structure()` in shapes,
            with dtypes that promote safely to its dtypes (an integer vector for a
            floating operator is cast, as lineax's matrix product would promote
            it; a sharding annotation alone is not a mismatch).

        **Returns:**

        A PyTree of arrays matching `self.out_structure()`.

        **Raises:**

        `ValueError` at trace time if `vector` does not match the input structure.
        """
        if root_trace_ref() is None and not in_raw_mv_context():
            # Eager: the policy's compiled `mv`, resolved at the first call.
            found = eager_apply(self, vector)
            if found is not None:
                return found[0]
        vector = check_vector(self, vector)
        if in_raw_mv_context():
            return self.raw_mv(vector)
        return self.policy.mv(self, vector)

    def raw_mv(self, vector: PyTree[Any]) -> PyTree[Any]:
        """The lineax `mv` of this operator, with no policy applied.

        **Arguments:**

        - `vector`: a PyTree matching `self.in_structure()`.

        **Returns:**

        A PyTree matching `self.out_structure()`.
        """
        return super().mv(vector)  # pyright: ignore[reportAbstractUsage]

    def as_matrix(self):
        """The dense matrix, as lineax builds it; first, for an operator that does
        not hold its entries, a `Materialise` or `Auto` policy checks that the
        matrix fits its memory budget (a `ValueError` at trace time if not).

        **Returns:**

        A 2-D array of shape `(out_size, in_size)`.
        """
        if not holds_entries(self):
            check_dense_budget(self, self.policy)
        return super().as_matrix()  # pyright: ignore[reportAbstractUsage]

    def transpose(self) -> lx.AbstractLinearOperator:
        """The transpose, as an operator of lineax-dispatch with the same policy.

        **Returns:**

        An [`lineax_dispatch.AbstractDispatchOperator`][].
        """
        return adopt(super().transpose(), self.policy)  # pyright: ignore[reportAbstractUsage]

    def __add__(self, other) -> lx.AbstractLinearOperator:
        if not isinstance(other, lx.AbstractLinearOperator):
            raise ValueError("Can only add AbstractLinearOperators together.")
        return AddLinearOperator(self, other, policy=_joint_policy(self, other))

    def __sub__(self, other) -> lx.AbstractLinearOperator:
        if not isinstance(other, lx.AbstractLinearOperator):
            raise ValueError("Can only add AbstractLinearOperators together.")
        return self + (-other)

    def __radd__(self, other) -> lx.AbstractLinearOperator:
        # Python calls this before lineax's `__add__` only when `other` is of a
        # lineax class that this operator's class subclasses (`lx.MatrixLinearOperator
        # + lxd.MatrixLinearOperator`); otherwise lineax's `__add__` runs and makes a
        # plain lineax sum, in which this operator still applies its own policy.
        if not isinstance(other, lx.AbstractLinearOperator):
            return NotImplemented
        return AddLinearOperator(other, self, policy=_joint_policy(other, self))

    def __rsub__(self, other) -> lx.AbstractLinearOperator:
        if not isinstance(other, lx.AbstractLinearOperator):
            return NotImplemented
        negated = cast(AbstractDispatchOperator, -self)  # ours keep their class
        return negated.__radd__(other)

    def __rmatmul__(self, other) -> lx.AbstractLinearOperator:
        if not isinstance(other, lx.AbstractLinearOperator):
            return NotImplemented
        return ComposedLinearOperator(other, self, policy=_joint_policy(other, self))

    def __mul__(self, other) -> lx.AbstractLinearOperator:
        return MulLinearOperator(self, other, policy=self.policy)

    def __rmul__(self, other) -> lx.AbstractLinearOperator:
        return self * other

    def __matmul__(self, other) -> lx.AbstractLinearOperator:
        if not isinstance(other, lx.AbstractLinearOperator):
            raise ValueError("Can only compose AbstractLinearOperators together.")
        return ComposedLinearOperator(self, other, policy=_joint_policy(self, other))

    def __truediv__(self, other) -> lx.AbstractLinearOperator:
        return DivLinearOperator(self, other, policy=self.policy)

    def __neg__(self) -> lx.AbstractLinearOperator:
        return NegLinearOperator(self, policy=self.policy)


def holds_entries(operator: lx.AbstractLinearOperator) -> bool:
    """Whether `as_matrix` returns entries the operator already holds."""
    if isinstance(operator, lx.TaggedLinearOperator):
        return holds_entries(operator.operator)
    return isinstance(operator, EXPLICIT_OPERATORS)


def banded(operator: lx.AbstractLinearOperator) -> bool:
    """Whether lineax materialises `operator` to its bands, through `mv`: no dense
    matrix."""
    return lx.is_diagonal(operator) or lx.is_tridiagonal(operator)


def _joint_policy(
    left: lx.AbstractLinearOperator, right: lx.AbstractLinearOperator
) -> AbstractPolicy:
    """The policy of a binary combination: the operands' common policy if they agree
    (or only one of them has one), otherwise the default, under which each operand
    keeps applying its own."""
    policies = [
        op.policy for op in (left, right) if isinstance(op, AbstractDispatchOperator)
    ]
    if policies and all(policy == policies[0] for policy in policies):
        return policies[0]
    return default_policy()


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


_Child = Callable[[lx.AbstractLinearOperator], lx.AbstractLinearOperator]


@ft.singledispatch
def rebuild(
    operator: lx.AbstractLinearOperator, policy: AbstractPolicy, child: _Child
) -> AbstractDispatchOperator:
    """The operator of ours of the same kind as the lineax `operator`, carrying
    `policy`, its operands mapped by `child`. Each module of operators registers
    its classes here (`rebuild_as`), beside their definitions."""
    raise TypeError(
        "`operator` must be one of lineax's concrete operators (Matrix, PyTree, "
        "Diagonal, Tridiagonal, Identity, Function, Jacobian, Tagged, Add, Mul, Div, "
        f"Neg, Composed); got {type(operator).__name__}"
    )


def rebuild_as(
    lineax_class: type,
    ours: type,
    *fields: str | Callable[[Any], Any],
    operands: tuple[str, ...] = (),
    **keywords: Any,
) -> None:
    """Registers `rebuild` for `lineax_class`: `ours(*operands, *fields,
    **keywords, policy=policy)`, each operand and field read from the lineax
    operator (a field given as a function is called with it), the operands mapped
    by `child`."""

    def make(operator, policy, child):
        arguments = [child(getattr(operator, name)) for name in operands]
        arguments += [
            f(operator) if callable(f) else getattr(operator, f) for f in fields
        ]
        return ours(*arguments, **keywords, policy=policy)

    rebuild.register(lineax_class)(make)


rebuild_as(
    lx.TaggedLinearOperator, TaggedLinearOperator, "tags", operands=("operator",)
)
rebuild_as(lx.AddLinearOperator, AddLinearOperator, operands=("operator1", "operator2"))
rebuild_as(
    lx.ComposedLinearOperator,
    ComposedLinearOperator,
    operands=("operator1", "operator2"),
)
rebuild_as(lx.MulLinearOperator, MulLinearOperator, "scalar", operands=("operator",))
rebuild_as(lx.DivLinearOperator, DivLinearOperator, "scalar", operands=("operator",))
rebuild_as(lx.NegLinearOperator, NegLinearOperator, operands=("operator",))


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
    _operator(operator, "operator")
    return rebuild(operator, policy, lambda op: with_policy(op, policy))


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
        return rebuild(op, policy, child)

    if isinstance(operator, AbstractDispatchOperator):
        if operator.policy == policy:
            return operator
        if not _plain_children(operator):
            # Only the top node's policy changes: no `__init__` run again.
            return with_top_policy(operator, check_policy(policy))
    return rebuild(operator, policy, child)


def operands_of(operator: lx.AbstractLinearOperator) -> list[lx.AbstractLinearOperator]:
    """The operators `operator` holds (a composite's operands)."""
    return [
        v for v in vars(operator).values() if isinstance(v, lx.AbstractLinearOperator)
    ]


def _plain_children(operator: AbstractDispatchOperator) -> bool:
    return not all(
        isinstance(v, AbstractDispatchOperator) for v in operands_of(operator)
    )
