"""`AutoSolver`: direct when the matrix fits the memory budget, else iterative."""

from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import Array, PyTree

from ..operators import AbstractDispatchOperator
from ..policies import Auto, parse_memory_budget
from ..policies._budget import default_memory_budget
from ._cg import CG
from ._gmres import GMRES
from ._lsmr import LSMR
from ._minres import MINRES


def _itemsize(operator: lx.AbstractLinearOperator) -> int:
    leaves = jtu.tree_leaves((operator.in_structure(), operator.out_structure()))
    return jnp.result_type(*[x.dtype for x in leaves]).itemsize


class AutoSolver(lx.AbstractLinearSolver):
    """Chooses a solver for each operator: a direct one (lineax's
    `AutoLinearSolver`, which picks by tags: diagonal, triangular, Cholesky, LU, QR)
    when the operator's dense matrix fits the memory budget; otherwise a
    one-`mv`-site iterative one of this package: `CG` for a positive or negative
    semidefinite operator, `MINRES` for a symmetric one, `GMRES` for a square one,
    `LSMR` for a non-square one.

    !!! Example

        ```python
        sol = lxd.linear_solve(op, b, lxd.AutoSolver(rtol=1e-6, atol=1e-6,
                                                     memory_budget="1GB"))
        ```
    """

    rtol: float = 1e-6
    atol: float = 1e-6
    max_steps: int | None = None
    well_posed: bool = True
    memory_budget: int | str | None = None

    def __check_init__(self):
        if self.memory_budget is not None:
            parse_memory_budget(self.memory_budget)

    def budget(self, operator: lx.AbstractLinearOperator) -> int:
        if self.memory_budget is not None:
            return parse_memory_budget(self.memory_budget)
        if isinstance(operator, AbstractDispatchOperator) and isinstance(
            operator.policy, Auto
        ):
            return operator.policy.budget()
        return default_memory_budget()

    def select(self, operator: lx.AbstractLinearOperator) -> lx.AbstractLinearSolver:
        """The solver this chooses for `operator`.

        **Arguments:**

        - `operator`: the operator.

        **Returns:**

        A lineax solver.
        """
        square = operator.in_size() == operator.out_size()
        if self.well_posed and not square:
            raise ValueError(
                "`AutoSolver(well_posed=True)` needs a square operator; got "
                f"{operator.out_size()} x {operator.in_size()}. Use "
                "`AutoSolver(well_posed=False)` for least squares."
            )
        matrix_bytes = operator.in_size() * operator.out_size() * _itemsize(operator)
        if matrix_bytes <= self.budget(operator):
            return lx.AutoLinearSolver(well_posed=self.well_posed)
        kwargs = dict(rtol=self.rtol, atol=self.atol, max_steps=self.max_steps)
        if not square:
            return LSMR(**kwargs)
        if lx.is_positive_semidefinite(operator) | lx.is_negative_semidefinite(
            operator
        ):
            return CG(**kwargs)
        if lx.is_symmetric(operator):
            return MINRES(**kwargs)
        return GMRES(**kwargs)

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        solver = self.select(operator)
        return solver, solver.init(operator, options)

    def compute(
        self, state: Any, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        solver, inner = state
        return solver.compute(inner, vector, options)

    def transpose(self, state: Any, options: dict[str, Any]):
        solver, inner = state
        inner, options = solver.transpose(inner, options)
        return (solver, inner), options

    def conj(self, state: Any, options: dict[str, Any]):
        solver, inner = state
        inner, options = solver.conj(inner, options)
        return (solver, inner), options

    def assume_full_rank(self):
        return self.well_posed


AutoSolver.__init__.__doc__ = """**Arguments:**

- `rtol`, `atol`, `max_steps`: for the iterative solver, if one is chosen.
- `well_posed`: `True` (the default) for square nonsingular systems, as lineax's
    `AutoLinearSolver`; `False` allows least-squares and minimum-norm solutions.
- `memory_budget`: bytes or a string like `"2GB"` the dense matrix may take; `None`
    uses the operator's `Auto` budget, else half of the free memory.
"""
