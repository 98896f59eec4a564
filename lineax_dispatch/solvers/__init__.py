"""The solvers: the iterative ones, whose operator `mv` appears once in the
compiled program (written on `skeleton/`; CG and LSMR each a package, BiCGStab,
GMRES, MINRES and Normal a module each), `linear_solve` with a per-solve policy,
`PolicySolver`, `AutoSolver`, and `batch_mv` and `batch_solve` (`batch/`)."""

from ._auto_solver import AutoSolver as AutoSolver
from ._bicgstab import BiCGStab as BiCGStab
from ._gmres import GMRES as GMRES
from ._linear_solve import linear_solve as linear_solve
from ._minres import MINRES as MINRES
from ._normal import Normal as Normal
from ._policy_solver import PolicySolver as PolicySolver
from ._prepare import (
    expected_iterations as expected_iterations,
    resolve_for_solve as resolve_for_solve,
)
from .batch import batch_mv as batch_mv, batch_solve as batch_solve
from .cg import CG as CG
from .lsmr import LSMR as LSMR
from .skeleton._one_site_solver import AbstractOneSiteSolver as AbstractOneSiteSolver
