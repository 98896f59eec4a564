"""Iterative solvers whose operator `mv` appears once in the compiled program,
`linear_solve` with a per-solve policy, `PolicySolver` and `AutoSolver`."""

from ._auto_solver import AutoSolver as AutoSolver
from ._batch import batch_mv as batch_mv, batch_solve as batch_solve
from ._linear_solve import linear_solve as linear_solve
from ._policy_solver import PolicySolver as PolicySolver
from ._prepare import (
    expected_iterations as expected_iterations,
    resolve_for_solve as resolve_for_solve,
)
from .one_site._base import AbstractOneSiteSolver as AbstractOneSiteSolver
from .one_site._bicgstab import BiCGStab as BiCGStab
from .one_site._cg import CG as CG
from .one_site._gmres import GMRES as GMRES
from .one_site._lsmr import LSMR as LSMR
from .one_site._minres import MINRES as MINRES
from .one_site._normal import Normal as Normal
