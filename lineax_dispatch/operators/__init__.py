"""Policy-carrying subclasses of every concrete lineax operator."""

# Registers lineax's `materialise`, `diagonal` and `linearise` for our operators.
from . import _dispatch as _dispatch
from ._base import AbstractDispatchOperator as AbstractDispatchOperator
from ._composite import (
    AddLinearOperator as AddLinearOperator,
    ComposedLinearOperator as ComposedLinearOperator,
    DivLinearOperator as DivLinearOperator,
    MulLinearOperator as MulLinearOperator,
    NegLinearOperator as NegLinearOperator,
    TaggedLinearOperator as TaggedLinearOperator,
)
from ._convert import adopt as adopt, with_policy as with_policy
from ._explicit import (
    DiagonalLinearOperator as DiagonalLinearOperator,
    IdentityLinearOperator as IdentityLinearOperator,
    MatrixLinearOperator as MatrixLinearOperator,
    PyTreeLinearOperator as PyTreeLinearOperator,
    TridiagonalLinearOperator as TridiagonalLinearOperator,
)
from ._function import (
    FunctionLinearOperator as FunctionLinearOperator,
    JacobianLinearOperator as JacobianLinearOperator,
)
from ._functions import (
    conj as conj,
    diagonal as diagonal,
    linearise as linearise,
    materialise as materialise,
    tridiagonal as tridiagonal,
)
from ._structure import check_vector as check_vector
