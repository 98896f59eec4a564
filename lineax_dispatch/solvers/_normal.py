"""The normal equations, with one site for `mv` and one for its transpose."""

from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import lineax as lx
from jaxtyping import Array, Bool, PyTree

from ..operators._vector_structure import structures_match
from ..policies.calls._recorder import own_code
from .skeleton._flat_vectors import (
    conj_options,
    flat_mv,
    keep_conj,
    keep_linearise,
    structure_mesh,
    transpose_options,
)
from .skeleton._linear_system import flatteners, rhs_unit, System
from .skeleton._one_site_solver import AbstractOneSiteSolver


_NormalState: TypeAlias = Any


def _check_preconditioner(
    preconditioner: Any, operator: lx.AbstractLinearOperator
) -> lx.AbstractLinearOperator:
    if not isinstance(preconditioner, lx.AbstractLinearOperator):
        raise ValueError(
            "`options['preconditioner']` of `Normal` must be a lineax linear "
            f"operator, got {type(preconditioner).__name__}."
        )
    for which, expected in (
        ("in_structure", operator.out_structure()),
        ("out_structure", operator.in_structure()),
    ):
        got = getattr(preconditioner, which)()
        if not structures_match(got, expected):
            raise ValueError(
                "`options['preconditioner']` of `Normal` approximates the "
                f"pseudoinverse of the operator, so its `{which}()` must be "
                f"{expected}; got {got}."
            )
    return keep_linearise(preconditioner)


class Normal(lx.AbstractLinearSolver[_NormalState]):
    """Solves `A x = b` for any `A` (square or not) through the normal equations
    `A^H A x = A^H b`, with an inner solver for positive semidefinite systems.

    With an inner solver of this package (`CG`, `MINRES`, `GMRES`, `BiCGStab`) the
    compiled program contains `A`'s `mv` once and its transpose's `mv` once: the
    inner solver's single slot computes `A^H (A x)`, or the residual
    `A^H (b - A x)`, and `A^H b` is that residual at `x = 0`, so it needs no site
    of its own (lineax's `Normal(CG)` writes `mv` three times and the transpose four
    times). `LSMR` applies the normal equations' operator in both of its slots, so
    writes each twice. Starting from zero, CG on the normal equations returns the
    least-squares solution of minimum norm, so wide and rank-deficient operators
    need no separate form. With any other inner solver (e.g. `lx.Cholesky()`,
    `lx.CG(...)`, `lx.LU()`) this behaves exactly as [`lineax.Normal`][]: the inner
    solver is applied to `A^H A` (or `A A^H` for a wide `A`), tagged positive
    semidefinite.

    `options`:

    - `preconditioner`: an approximation `M` of the pseudoinverse of `A`; the
        inner solver is preconditioned by `M M^H`.
    - `y0`: an initial estimate of `x`. Defaults to zeros.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        b = jnp.array([1.0, 2.0, 4.0])
        sol = lx.linear_solve(op, b, lxd.Normal(lxd.CG(rtol=1e-6, atol=1e-6)))
        ```
    """

    inner_solver: lx.AbstractLinearSolver

    def __check_init__(self):
        inner = self.inner_solver
        if isinstance(inner, lx.AbstractLinearSolver):
            return
        if isinstance(inner, type) and issubclass(inner, lx.AbstractLinearSolver):
            hint = f"; instantiate it: {inner.__name__}(...)"
        else:
            hint = ""
        raise TypeError(
            "`Normal(inner_solver=...)` must be a linear solver, an instance of "
            "`lineax.AbstractLinearSolver` (e.g. `lxd.CG(rtol=1e-6, atol=1e-6)` or "
            f"`lx.Cholesky()`); got {inner!r} of type {type(inner).__name__}{hint}."
        )

    @property
    def _one_site(self) -> AbstractOneSiteSolver | None:
        """The inner solver if it is one of this package's, else `None`."""
        inner = self.inner_solver
        return inner if isinstance(inner, AbstractOneSiteSolver) else None

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        inner = self._one_site
        if inner is None:
            return lx.Normal(self.inner_solver).init(operator, options)
        return keep_linearise(inner.prepare(operator))

    def compute(
        self, state: _NormalState, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        inner = self._one_site
        if inner is None:
            return lx.Normal(self.inner_solver).compute(state, vector, options)
        # This package's own code (see `AbstractOneSiteSolver.solve_square`).
        with own_code(), structure_mesh(state):
            return self._compute_one_site(inner, state, vector, options)

    def _compute_one_site(
        self,
        inner: AbstractOneSiteSolver,
        operator: _NormalState,
        vector: PyTree[Array],
        options: dict[str, Any],
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        x_flat, b_flat = flatteners(operator, vector)
        adjoint = keep_conj(operator).transpose()
        a_mv = flat_mv(operator, x_flat, b_flat)
        ah_mv = flat_mv(adjoint, b_flat, x_flat)
        b = b_flat.ravel(vector)
        # Solved for `b / unit` (see `rhs_unit`), the solution multiplied back by
        # the inner solver's `run_system`.
        unit = rhs_unit(b)
        b = b / unit.astype(b.dtype)
        y0 = options.get("y0")
        if y0 is not None:
            got = jax.eval_shape(lambda: y0)
            if not structures_match(got, operator.in_structure()):
                raise ValueError(
                    "`options['y0']` of `Normal` must match the operator's "
                    f"`in_structure()`: expected {operator.in_structure()}, got {got}."
                )
            offset = x_flat.ravel(y0) / unit.astype(x_flat.dtype)
        else:
            offset = None

        def apply(x: Array, residual: Bool[Array, ""]) -> Array:
            shifted = x if offset is None else jnp.where(residual, offset + x, x)
            t = a_mv(shifted)
            return ah_mv(jnp.where(residual, b - t, t))

        system = System(
            apply=apply,
            rhs=None,
            offset=offset,
            flat=x_flat,
            unit=unit,
        )
        preconditioner = options.get("preconditioner")
        if preconditioner is None:
            precond = lambda x: x
        elif not inner.takes_preconditioner:
            raise ValueError(
                f"`Normal({type(inner).__name__}(...))` does not accept "
                "`options['preconditioner']`: the inner solver takes none."
            )
        else:
            preconditioner = _check_preconditioner(preconditioner, operator)
            m_mv = flat_mv(preconditioner, b_flat, x_flat)
            mh_mv = flat_mv(keep_conj(preconditioner).transpose(), x_flat, b_flat)
            precond = lambda x: m_mv(mh_mv(x))
        zeros = x_flat.zeros()
        y, result, stats = inner.run_system(system, precond, zeros)
        return x_flat.unravel(y), result, stats

    def transpose(self, state: _NormalState, options: dict[str, Any]):
        if self._one_site is None:
            return lx.Normal(self.inner_solver).transpose(state, options)
        return state.transpose(), transpose_options(options)

    def conj(self, state: _NormalState, options: dict[str, Any]):
        if self._one_site is None:
            return lx.Normal(self.inner_solver).conj(state, options)
        return keep_conj(state), conj_options(options)

    def assume_full_rank(self):
        return self.inner_solver.assume_full_rank()


Normal.__init__.__doc__ = """**Arguments:**

- `inner_solver`: the solver for the positive semidefinite normal equations:
    `lxd.CG(...)` (the usual choice), any other solver of this package, or one of
    lineax's, such as the direct `lx.Cholesky()`.
"""
