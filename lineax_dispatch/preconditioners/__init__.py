"""Preconditioners this package builds from an operator: Jacobi and block Jacobi,
read from the operator's structure or through its `mv`."""

from ._jacobi import block_jacobi as block_jacobi, jacobi as jacobi
from ._operators import (
    AbstractPreconditioner as AbstractPreconditioner,
    BlockJacobiPreconditioner as BlockJacobiPreconditioner,
    JacobiPreconditioner as JacobiPreconditioner,
)
from ._patterns import (
    AbstractPattern as AbstractPattern,
    Band as Band,
    Stencil as Stencil,
)
from ._solver import PreconditionedSolver as PreconditionedSolver
