"""Restarted GMRES with one `mv` call site."""

import functools as ft
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, TypeAlias

import jax.lax as lax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import lineax as lx
from jaxtyping import Array, Bool, Inexact, Int, PyTree, Real, Scalar
from lineax.internal import max_norm

from .._validate import check_square
from .skeleton._flat_vectors import (
    binary_scale,
    keep_linearise,
    project,
    scaled_norm,
    stacked_zeros,
    two_norm,
)
from .skeleton._linear_system import System
from .skeleton._one_site_solver import AbstractOneSiteSolver


_GMRESState: TypeAlias = lx.AbstractLinearOperator


class _Loop(NamedTuple):
    """GMRES's loop state: the iterate `y`, the residual `r` of the last restart,
    the last update `diff`; the Krylov `basis`, Hessenberg matrix `hess`, the
    residual's 2-norm `r_norm` and the index `j` of the cycle; `pending` marks a
    residual pass; the breakdown flags, stagnation count and restart count `step`;
    `iterate`, lineax's test between restarts, taken at the last residual pass;
    `finite` and `b_scale` describe the right-hand side."""

    y: Inexact[Array, " n"]
    r: Inexact[Array, " n"]
    diff: Inexact[Array, " n"]
    basis: Inexact[Array, "k n"]
    hess: Inexact[Array, "k-1 k"]
    r_norm: Real[Array, ""]
    j: Int[Array, ""]
    pending: Bool[Array, ""]
    initial_breakdown: Bool[Array, ""]
    breakdown: Bool[Array, ""]
    deferred_breakdown: Bool[Array, ""]
    cycle_breakdown: Bool[Array, ""]
    r_min: Real[Array, ""]
    stagnation: Int[Array, ""]
    step: Int[Array, ""]
    iterate: Bool[Array, ""]
    finite: Bool[Array, ""]
    b_scale: Array


class _Constants(NamedTuple):
    """What GMRES's loop reads besides its state: the bound `max_steps` on its
    restart cycles, the size `restart` of a cycle's basis, the working `dtype` and
    its `eps`."""

    max_steps: int
    restart: int
    dtype: Any
    eps: Any


class GMRES(AbstractOneSiteSolver[_GMRESState]):
    """Restarted GMRES for square operators, with the operator's `mv` (and the
    preconditioner's) written once in the compiled program.

    A drop-in for [`lineax.GMRES`][]: the same fields, defaults, `options`, stopping
    rules (including stagnation and deferred breakdown) and `stats["num_steps"]`
    (the number of restart cycles, counting the first residual evaluation as lineax
    does). lineax's GMRES writes `mv` twice (the Arnoldi step and the residual after
    each restart); here each pass through one loop either extends the Krylov basis
    by one vector or, after a restart, evaluates the residual, through the same
    slot.

    `options`:

    - `preconditioner`: a linear operator, applied on the left (the minimised
        residual is the preconditioned one). Defaults to the identity.
    - `y0`: the initial estimate of the solution. Defaults to zeros.

    Results: `max_steps_reached` (or `singular` when `max_steps=None`),
    `stagnation`, `breakdown`, `nonfinite_input`.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.array([[3.0, 1.0], [-1.0, 2.0]]))
        solver = lxd.GMRES(rtol=1e-6, atol=1e-6, restart=10)
        sol = lx.linear_solve(op, jnp.array([1.0, 2.0]), solver)
        ```
    """

    # Under `vmap`, JAX turns the `lax.cond` of a cycle's end into a select over
    # its operands and broadcasts the predicate without their sharding, which
    # fails for the Krylov basis sharded over an Explicit mesh axis (jax 0.10.2
    # and 0.12.0.1).
    vmaps_explicit_axes: ClassVar[bool] = False

    rtol: float
    atol: float
    norm: Callable[[PyTree], Scalar] = max_norm
    max_steps: int | None = None
    restart: int = 20
    stagnation_iters: int = 20

    def __check_init__(self):
        for field in ("restart", "stagnation_iters"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"`GMRES(..., {field}=...)` must be a positive int, got {value!r}."
                )

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        del options
        check_square(operator, "GMRES")
        return keep_linearise(self.prepare(operator))

    def solve_system(
        self, system: System, precond: Callable[[Array], Array], y0: Array
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """Runs restarted GMRES on `system` from `y0` (flat)."""
        flat = system.flat
        dtype = flat.dtype
        c = _Constants(
            max_steps=self.resolve_max_steps(flat.size),
            restart=min(self.restart, flat.size),
            dtype=dtype,
            eps=jnp.finfo(dtype).eps,
        )
        s = lax.while_loop(
            ft.partial(self._continues, system, c),
            ft.partial(self._pass, system, precond, c),
            self._init_loop(system, y0, c),
        )
        nc = self.not_converged(system, s)
        stagnated = s.stagnation >= self.stagnation_iters
        return self.loop_end(
            system,
            s,
            c.max_steps,
            nc,
            finite_input=s.finite,
            codes=((stagnated, lx.RESULTS.stagnation),),
            breakdown=s.deferred_breakdown & nc,
        )

    def _init_loop(self, system: System, y0: Array, c: _Constants) -> _Loop:
        """The loop's state before its first pass, a residual pass at `y0`."""
        real = jnp.finfo(c.dtype).dtype
        b_scale, finite = system.scale_of_rhs(self.b_scale(system), y0)
        return _Loop(
            y=y0,
            r=jnp.zeros_like(y0),
            diff=jnp.full_like(y0, jnp.inf),
            basis=stacked_zeros(c.restart + 1, y0),
            hess=jnp.eye(c.restart, c.restart + 1, dtype=c.dtype),
            r_norm=jnp.zeros((), real),
            j=jnp.array(0),
            pending=jnp.array(True),
            initial_breakdown=jnp.array(False),
            breakdown=jnp.array(False),
            deferred_breakdown=jnp.array(False),
            cycle_breakdown=jnp.array(False),
            r_min=jnp.array(jnp.inf, real),
            stagnation=jnp.array(0),
            step=jnp.array(0),
            iterate=jnp.array(True),
            finite=finite,
            b_scale=b_scale,
        )

    def _continues(self, system: System, c: _Constants, s: _Loop) -> Bool[Array, ""]:
        """The loop's condition: a finite right-hand side, and a pass within a
        cycle to make, or, at a restart, a cycle to run (lineax's test, taken by
        the residual pass)."""
        at_restart = ~s.pending & (s.j == 0)
        return s.finite & (~at_restart | s.iterate)

    def _pass(
        self,
        system: System,
        precond: Callable[[Array], Array],
        c: _Constants,
        s: _Loop,
    ) -> _Loop:
        """The loop body: one pass through the slots, then a residual pass or an
        Arnoldi pass, as `s.pending` says.

        The two passes are the branches of a `lax.cond` (a select over the state
        where `pending` is batched): XLA:CPU compiles a select over both passes'
        states more slowly than the `cond`, and runs it more slowly too."""
        pending = s.pending
        # The one operator slot and the one preconditioner slot.
        x = jnp.where(pending, s.y, s.basis[s.j])
        w = precond(system.apply(x, pending))
        residual = ft.partial(self._residual_pass, system, c)
        return lax.cond(pending, residual, ft.partial(_arnoldi_pass, c), s, w)

    def _residual_pass(
        self, system: System, c: _Constants, s: _Loop, w: Array
    ) -> _Loop:
        """The state after a residual pass that computed `w`."""
        # `w = M (b - A y)`: the new residual; start a cycle from it.
        r_norm = self.norm(system.flat.unravel(w))
        decreased = r_norm < s.r_min
        size2 = two_norm(w)
        initial_breakdown = size2 < c.eps
        safe = jnp.where(initial_breakdown, jnp.inf, size2).astype(c.dtype)
        b_scale, finite = system.from_first_residual(
            s.step == 0, w, self.b_scale(system), (s.b_scale, s.finite)
        )
        s = s._replace(
            r=w,
            basis=jnp.zeros_like(s.basis).at[0].set(w / safe),
            hess=jnp.eye(c.restart, c.restart + 1, dtype=c.dtype),
            r_norm=size2,
            j=jnp.array(0),
            pending=jnp.array(False),
            initial_breakdown=initial_breakdown,
            cycle_breakdown=initial_breakdown,
            deferred_breakdown=s.breakdown,
            breakdown=s.cycle_breakdown,
            r_min=jnp.minimum(r_norm, s.r_min),
            stagnation=jnp.where(decreased, 0, s.stagnation + 1),
            step=s.step + 1,
            finite=finite,
            b_scale=b_scale,
        )
        # Between restarts, lineax's test: once here rather than at every pass.
        iterate = (
            ~s.deferred_breakdown
            & (s.stagnation < self.stagnation_iters)
            & self.not_converged(system, s)
            & (s.step < c.max_steps)
        )
        return s._replace(iterate=iterate)


def _arnoldi_pass(c: _Constants, s: _Loop, w: Array) -> _Loop:
    """The state after an Arnoldi pass that computed `w = M A q_j`: the basis
    extended by one vector, and at the cycle's end the update of the iterate."""
    j, basis = s.j, s.basis
    # `w` is of the operator's scale: its norms are taken scaled (`scaled_norm`),
    # both by the scale of `w` before its projection is removed: what remains is
    # no longer, and where its squares underflow there, it is below `eps` of the
    # step (a breakdown either way).
    unit = binary_scale(w)
    step_norm = scaled_norm(w, unit)
    proj = project(basis, w)
    w = w - basis.T @ proj
    w_norm = scaled_norm(w, unit)
    breakdown = (w_norm < step_norm * c.eps) | s.initial_breakdown
    w = w / jnp.where(breakdown, jnp.inf, w_norm).astype(c.dtype)
    proj = proj.at[j + 1].set(w_norm.astype(c.dtype))
    # Updated in place: a select of the row, not of the whole matrix.
    hess = s.hess.at[j].set(jnp.where(s.initial_breakdown, s.hess[j], proj))
    basis = basis.at[j + 1].set(jnp.where(s.initial_breakdown, basis[j + 1], w))
    j = j + 1
    done = (j >= c.restart) | breakdown
    finish = ft.partial(_cycle_update, c, s.r_norm)
    diff = lax.cond(done, finish, lambda h, b: jnp.zeros_like(s.y), hess, basis)
    return s._replace(
        y=jnp.where(done, s.y + diff, s.y),
        diff=jnp.where(done, diff, s.diff),
        basis=basis,
        hess=hess,
        j=j,
        pending=done,
        cycle_breakdown=breakdown,
    )


def _cycle_update(
    c: _Constants, r_norm: Real[Array, ""], hess: Array, basis: Array
) -> Inexact[Array, " n"]:
    """The update of the iterate at a cycle's end, from the Hessenberg matrix
    `hess`, the Krylov `basis` and the norm `r_norm` of the cycle's residual."""
    # Least squares with the Hessenberg matrix, as lineax (by QR).
    rhs = jnp.zeros(c.restart + 1, c.dtype).at[0].set(r_norm.astype(c.dtype))
    q, upper = jnp.linalg.qr(hess.T)
    z = jsl.solve_triangular(upper, q.conj().T @ rhs)
    return basis[:-1].T @ z


GMRES.__init__.__doc__ = r"""**Arguments:**

- `rtol`: relative tolerance for terminating the solve.
- `atol`: absolute tolerance for terminating the solve.
- `norm`: the norm in which the scaled residual and update are measured. Defaults to
    the max norm.
- `max_steps`: the maximum number of restart cycles. Defaults to ten times the
    number of unknowns, as lineax.
- `restart`: the size of the Krylov basis built between restarts. Defaults to 20.
- `stagnation_iters`: stop with `stagnation` after this many restarts without a
    decrease of the residual. Defaults to 20.
"""
