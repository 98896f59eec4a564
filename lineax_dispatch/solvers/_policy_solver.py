"""`PolicySolver`: any lineax solver, with a policy applied to its operator."""

from typing import Any

import lineax as lx
from jaxtyping import Array, PyTree

from ..operators import with_policy
from ..policies import AbstractPolicy, Auto, check_policy
from ._prepare import expected_iterations, resolve_for_solve


_ITERATIVE = (lx.CG, lx.GMRES, lx.BiCGStab, lx.LSMR, lx.Normal)


class PolicySolver(lx.AbstractLinearSolver):
    """Wraps any lineax solver so that the operator it solves carries `policy`.

    In `init` the operator (every node of it, converted to lineax-dispatch if it
    is a plain lineax operator) gets `policy`; with `Auto` the decision is then
    fixed once for the solve, counting the solver's expected iterations. This is how
    a policy reaches a solve that someone else sets up, such as optimistix's:

    !!! Example

        ```python
        solver = optx.Newton(rtol=1e-6, atol=1e-6,
                             linear_solver=lxd.PolicySolver(lxd.GMRES(1e-6, 1e-6),
                                                            lxd.Auto()))
        ```
    """

    solver: lx.AbstractLinearSolver
    policy: AbstractPolicy

    def __check_init__(self):
        if not isinstance(self.solver, lx.AbstractLinearSolver):
            raise TypeError(
                "`solver` of `PolicySolver` must be a lineax AbstractLinearSolver; got "
                f"{type(self.solver).__name__}."
            )
        check_policy(self.policy)

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        operator = with_policy(operator, self.policy)
        # Solvers of this package fix Auto's decision in their own `init`.
        if isinstance(self.policy, Auto) and isinstance(self.solver, _ITERATIVE):
            max_steps = getattr(self.solver, "max_steps", None)
            operator = resolve_for_solve(
                operator, expected_iterations(max_steps, operator.in_size())
            )
        return self.solver.init(operator, options)

    def compute(
        self, state: Any, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        return self.solver.compute(state, vector, options)

    def transpose(self, state: Any, options: dict[str, Any]):
        return self.solver.transpose(state, options)

    def conj(self, state: Any, options: dict[str, Any]):
        return self.solver.conj(state, options)

    def assume_full_rank(self):
        return self.solver.assume_full_rank()


PolicySolver.__init__.__doc__ = """**Arguments:**

- `solver`: any lineax solver (including those of lineax-dispatch).
- `policy`: the policy the operator gets for this solver's solves.
"""
