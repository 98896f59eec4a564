"""lineax-dispatch: lineax operators that choose how to apply themselves.

```python
import lineax_dispatch as lxd
```
"""

import importlib.metadata

from .operators import (
    AbstractDispatchOperator as AbstractDispatchOperator,
    AddLinearOperator as AddLinearOperator,
    ComposedLinearOperator as ComposedLinearOperator,
    conj as conj,
    diagonal as diagonal,
    DiagonalLinearOperator as DiagonalLinearOperator,
    DivLinearOperator as DivLinearOperator,
    FunctionLinearOperator as FunctionLinearOperator,
    IdentityLinearOperator as IdentityLinearOperator,
    JacobianLinearOperator as JacobianLinearOperator,
    linearise as linearise,
    materialise as materialise,
    MatrixLinearOperator as MatrixLinearOperator,
    MulLinearOperator as MulLinearOperator,
    NegLinearOperator as NegLinearOperator,
    PyTreeLinearOperator as PyTreeLinearOperator,
    TaggedLinearOperator as TaggedLinearOperator,
    tridiagonal as tridiagonal,
    TridiagonalLinearOperator as TridiagonalLinearOperator,
    with_policy as with_policy,
)
from .policies import (
    AbstractPolicy as AbstractPolicy,
    Auto as Auto,
    CostModel as CostModel,
    decide as decide,
    Decision as Decision,
    dense_matrix as dense_matrix,
    Lazy as Lazy,
    Materialise as Materialise,
    Observation as Observation,
    observe as observe,
    Outline as Outline,
    parse_memory_budget as parse_memory_budget,
    Roll as Roll,
    Scan as Scan,
    VmapBatch as VmapBatch,
)
from .preconditioners import (
    AbstractPattern as AbstractPattern,
    AbstractPreconditioner as AbstractPreconditioner,
    Band as Band,
    block_jacobi as block_jacobi,
    BlockJacobiPreconditioner as BlockJacobiPreconditioner,
    jacobi as jacobi,
    JacobiPreconditioner as JacobiPreconditioner,
    PreconditionedSolver as PreconditionedSolver,
    Stencil as Stencil,
)
from .program import (
    explain as explain,
    ExplainReport as ExplainReport,
    jit as jit,
)
from .solvers import (
    AbstractOneSiteSolver as AbstractOneSiteSolver,
    AutoSolver as AutoSolver,
    batch_mv as batch_mv,
    batch_solve as batch_solve,
    BiCGStab as BiCGStab,
    CG as CG,
    GMRES as GMRES,
    linear_solve as linear_solve,
    LSMR as LSMR,
    MINRES as MINRES,
    Normal as Normal,
    PolicySolver as PolicySolver,
)


try:
    __version__ = importlib.metadata.version("lineax_dispatch")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0+unknown"
