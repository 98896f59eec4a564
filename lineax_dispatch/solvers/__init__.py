"""Iterative solvers whose operator `mv` appears once in the compiled program."""

from ._base import AbstractOneSiteSolver as AbstractOneSiteSolver
from ._cg import CG as CG
from ._bicgstab import BiCGStab as BiCGStab
from ._gmres import GMRES as GMRES
from ._normal import Normal as Normal
from ._linear_solve import linear_solve as linear_solve
from ._minres import MINRES as MINRES
