"""The base class shared by every policy-carrying operator."""

from typing import Any, cast

import equinox as eqx
import lineax as lx
from jaxtyping import PyTree

from .._compat import root_trace_ref
from ..policies import AbstractPolicy, check_policy, default_policy, in_raw_mv_context
from ..policies._dense import EXPLICIT_OPERATORS
from ..policies._eager import eager_apply
from ..policies._memory import check_dense_budget
from ._structure import check_vector


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
        from ._convert import adopt

        return adopt(super().transpose(), self.policy)  # pyright: ignore[reportAbstractUsage]

    def __add__(self, other) -> lx.AbstractLinearOperator:
        from ._composite import AddLinearOperator

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
        from ._composite import AddLinearOperator

        if not isinstance(other, lx.AbstractLinearOperator):
            return NotImplemented
        return AddLinearOperator(other, self, policy=_joint_policy(other, self))

    def __rsub__(self, other) -> lx.AbstractLinearOperator:
        if not isinstance(other, lx.AbstractLinearOperator):
            return NotImplemented
        negated = cast(AbstractDispatchOperator, -self)  # ours keep their class
        return negated.__radd__(other)

    def __rmatmul__(self, other) -> lx.AbstractLinearOperator:
        from ._composite import ComposedLinearOperator

        if not isinstance(other, lx.AbstractLinearOperator):
            return NotImplemented
        return ComposedLinearOperator(other, self, policy=_joint_policy(other, self))

    def __mul__(self, other) -> lx.AbstractLinearOperator:
        from ._composite import MulLinearOperator

        return MulLinearOperator(self, other, policy=self.policy)

    def __rmul__(self, other) -> lx.AbstractLinearOperator:
        return self * other

    def __matmul__(self, other) -> lx.AbstractLinearOperator:
        from ._composite import ComposedLinearOperator

        if not isinstance(other, lx.AbstractLinearOperator):
            raise ValueError("Can only compose AbstractLinearOperators together.")
        return ComposedLinearOperator(self, other, policy=_joint_policy(self, other))

    def __truediv__(self, other) -> lx.AbstractLinearOperator:
        from ._composite import DivLinearOperator

        return DivLinearOperator(self, other, policy=self.policy)

    def __neg__(self) -> lx.AbstractLinearOperator:
        from ._composite import NegLinearOperator

        return NegLinearOperator(self, policy=self.policy)


def holds_entries(operator: lx.AbstractLinearOperator) -> bool:
    """Whether `as_matrix` returns entries the operator already holds."""
    if isinstance(operator, lx.TaggedLinearOperator):
        return holds_entries(operator.operator)
    return isinstance(operator, EXPLICIT_OPERATORS)


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
