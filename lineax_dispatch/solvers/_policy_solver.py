"""`PolicySolver`: any lineax solver, with a policy applied to its operator."""

from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax.extend as jex
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import Array, PyTree

from ..operators import with_policy
from ..policies import AbstractPolicy, Auto, check_policy
from ._prepare import expected_iterations, resolve_for_solve, stated_tolerance


_ITERATIVE = (lx.CG, lx.GMRES, lx.BiCGStab, lx.LSMR, lx.Normal)


class _SameJaxpr:
    """Holds a jaxpr as static metadata that compares by its text: the same
    function traced twice (a primal and its JVP) gives two distinct but equal
    jaxprs, while different functions of the same shapes stay different."""

    def __init__(self, jaxpr: jex.core.Jaxpr):
        self.jaxpr = jaxpr
        self._text: str | None = None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = str(self.jaxpr)
        return self._text

    def __hash__(self):
        return hash(self.text)

    def __eq__(self, other):
        return type(self) is type(other) and (
            self.jaxpr is other.jaxpr or self.text == other.text
        )


def _wrap(leaf: Any) -> Any:
    return _SameJaxpr(leaf) if isinstance(leaf, jex.core.Jaxpr) else leaf


def _unwrap(leaf: Any) -> Any:
    return leaf.jaxpr if isinstance(leaf, _SameJaxpr) else leaf


def hide_static(state: Any) -> tuple[Any, eqxi.Static]:
    """Splits a solver state into its arrays and a static remainder.

    A lineax solver's state often holds the operator, and a linearised operator
    holds a closure-converted function whose jaxpr is a pytree leaf. optimistix's
    `Chord` keeps the state in its own state: through `lax.stop_gradient`, its loop
    and its implicit JVP, which accept arrays only (lineax's own iterative solvers
    fail there). With the state split, they see arrays only; jaxprs compare by
    their text, so a primal and its JVP trace of the same function agree.

    **Arguments:**

    - `state`: a solver state.

    **Returns:**

    `(arrays, eqxi.Static(rest))`, for `reveal_static`.
    """
    dynamic, static = eqx.partition(state, eqx.is_array)
    return dynamic, eqxi.Static(jtu.tree_map(_wrap, static))


def reveal_static(state: tuple[Any, eqxi.Static]) -> Any:
    """Inverse of `hide_static`.

    **Arguments:**

    - `state`: the output of `hide_static`.

    **Returns:**

    The solver state.
    """
    dynamic, static = state
    return eqx.combine(dynamic, jtu.tree_map(_unwrap, static.value))


class PolicySolver(lx.AbstractLinearSolver):
    """Wraps any lineax solver so that the operator it solves carries `policy`.

    In `init` the operator (every node of it, converted to lineax-dispatch if it
    is a plain lineax operator) gets `policy`; with `Auto` the decision is then
    fixed once for the solve, counting the solver's expected iterations. This is how
    a policy reaches a solve that someone else sets up, such as optimistix's:

    !!! Example

        ```python
        import optimistix as optx

        def fn(y, args):
            return y + 0.1 * jnp.sin(jnp.roll(y, 1)) - args

        linear_solver = lxd.PolicySolver(lxd.GMRES(rtol=1e-6, atol=1e-6), lxd.Auto())
        solver = optx.Newton(rtol=1e-5, atol=1e-5, linear_solver=linear_solver)
        sol = optx.root_find(fn, solver, jnp.zeros(4), jnp.ones(4))
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
                operator,
                expected_iterations(max_steps, operator.in_size()),
                stated_tolerance(self.solver),
            )
        return hide_static(self.solver.init(operator, options))

    def compute(
        self, state: Any, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        return self.solver.compute(reveal_static(state), vector, options)

    def transpose(self, state: Any, options: dict[str, Any]):
        state, options = self.solver.transpose(reveal_static(state), options)
        return hide_static(state), options

    def conj(self, state: Any, options: dict[str, Any]):
        state, options = self.solver.conj(reveal_static(state), options)
        return hide_static(state), options

    def assume_full_rank(self):
        return self.solver.assume_full_rank()


PolicySolver.__init__.__doc__ = """**Arguments:**

- `solver`: any lineax solver (including those of lineax-dispatch).
- `policy`: the policy the operator gets for this solver's solves.
"""
