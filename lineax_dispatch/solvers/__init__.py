"""Iterative solvers whose operator `mv` appears once in the compiled program."""

from ._base import AbstractOneSiteSolver as AbstractOneSiteSolver
from ._cg import CG as CG
