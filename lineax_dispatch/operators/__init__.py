"""Policy-carrying subclasses of every concrete lineax operator."""

# Registers lineax's `materialise`, `diagonal` and `linearise` for our operators.
from . import _lineax_functions as _lineax_functions
from ._dispatch_operator import (
    AbstractDispatchOperator as AbstractDispatchOperator,
    AddLinearOperator as AddLinearOperator,
    adopt as adopt,
    ComposedLinearOperator as ComposedLinearOperator,
    DivLinearOperator as DivLinearOperator,
    MulLinearOperator as MulLinearOperator,
    NegLinearOperator as NegLinearOperator,
    TaggedLinearOperator as TaggedLinearOperator,
    with_policy as with_policy,
)
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
from ._operator_functions import (
    conj as conj,
    diagonal as diagonal,
    linearise as linearise,
    materialise as materialise,
    tridiagonal as tridiagonal,
)
from ._vector_structure import check_vector as check_vector
