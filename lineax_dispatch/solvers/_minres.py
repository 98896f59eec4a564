"""MINRES with one `mv` call site."""

import functools as ft
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, TypeAlias

import jax
import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
from jaxtyping import Array, Bool, Inexact, Int, PyTree, Real, Scalar
from lineax.internal import max_norm

from .._reductions import all_finite
from .._validate import check_square
from .skeleton._flat_vectors import (
    binary_scale,
    dot,
    keep_linearise,
    two_norm,
)
from .skeleton._linear_system import System
from .skeleton._one_site_solver import AbstractOneSiteSolver, CHECK_SLACK


_MINRESState: TypeAlias = lx.AbstractLinearOperator


class _Loop(NamedTuple):
    """MINRES's loop state, named as in scipy's: the iterate `y`, the Lanczos
    vectors `v`, `r1`, `r2`, the update directions `w`, `w2`, the Lanczos and
    Givens scalars and `phibar`, the residual's 2-norm estimate (`checked` where
    the last pass computed it from the true residual); `finite` and the tolerance
    `tol` describe the right-hand side."""

    y: Inexact[Array, " n"]
    v: Inexact[Array, " n"]
    r1: Inexact[Array, " n"]
    r2: Inexact[Array, " n"]
    w: Inexact[Array, " n"]
    w2: Inexact[Array, " n"]
    beta: Real[Array, ""]
    oldb: Real[Array, ""]
    tnorm: Real[Array, ""]
    dbar: Real[Array, ""]
    epsln: Real[Array, ""]
    phibar: Real[Array, ""]
    sn: Real[Array, ""]
    cs: Real[Array, ""]
    step: Int[Array, ""]
    started: Bool[Array, ""]
    checked: Bool[Array, ""]
    breakdown: Bool[Array, ""]
    singular: Bool[Array, ""]
    finite: Bool[Array, ""]
    tol: Real[Array, ""]


class _Constants(NamedTuple):
    """What MINRES's loop reads besides its state: the bound `max_steps` on its
    steps, `rcond` (`2 eps n`, `eps` the real dtype's), the zero scalar and
    vector a restart resets the recurrences to, and the `tolerance` of a
    right-hand side."""

    max_steps: int
    rcond: Any
    zero: Real[Array, ""]
    zeros: Inexact[Array, " n"]
    tolerance: Callable[[Array], Real[Array, ""]]


class _Lanczos(NamedTuple):
    """A pass's Lanczos step: the slot's output `out`, the next unnormalised
    Lanczos vector `u` and its preconditioned `z`, `alpha`, the next `beta`, and
    whether `beta^2 = <u, z>` came out negative (`breakdown`: an indefinite
    preconditioner)."""

    out: Inexact[Array, " n"]
    u: Inexact[Array, " n"]
    z: Inexact[Array, " n"]
    alpha: Real[Array, ""]
    beta: Real[Array, ""]
    breakdown: Bool[Array, ""]


class _QRStep(NamedTuple):
    """A Lanczos step's QR update: the new `tnorm`, `dbar`, rotation `cs`, `sn`,
    the iterate's step `phi w`, whether the step finds the system `singular` and
    whether it is taken (`take`)."""

    tnorm: Real[Array, ""]
    dbar: Real[Array, ""]
    cs: Real[Array, ""]
    sn: Real[Array, ""]
    phi: Real[Array, ""]
    w: Inexact[Array, " n"]
    singular: Bool[Array, ""]
    take: Bool[Array, ""]


class MINRES(AbstractOneSiteSolver[_MINRESState]):
    """Minimum residual solver for symmetric (or Hermitian), possibly indefinite,
    operators, with the operator's `mv` written once in the compiled program.

    The preconditioned MINRES of Paige and Saunders, with the same iterates as
    `scipy.sparse.linalg.minres`. Lineax has no MINRES. The loop body has a single
    application slot: the first pass feeds it the initial estimate and asks for the
    residual `b - A y0`, a step feeds it the current Lanczos vector, and the check
    of the true residual (below) feeds it the iterate. The preconditioner is
    likewise applied once per pass.

    MINRES does not form its residual vector: its stopping test is on its running
    estimate `phibar` of the residual's 2-norm, `phibar <= atol + rtol * ||b||_2`.
    (This differs from lineax's elementwise test on the residual and the last
    update; `norm` is not used.) With a preconditioner `M`, `phibar` measures the
    residual in the norm `sqrt(r^H M r)`. The estimate goes on shrinking below the
    precision of the dtype, so once it passes the test (or the Lanczos process
    ends: beta negligible against the estimate of `||A||`), one more pass through
    the slot computes the true residual `b - A y`, and the solve stops only if that
    passes the same test. Otherwise MINRES restarts from `y` with that residual
    (a fresh Lanczos process; the steps already taken count towards `max_steps`).
    A true residual that cannot be reduced further (the restarted process ends at
    once) stops the solve with `stagnation`.

    `options` (as passed to `lx.linear_solve(..., options=...)`):

    - `preconditioner`: a positive definite linear operator approximating the
        inverse of the operator. Defaults to the identity.
    - `y0`: the initial estimate of the solution. Defaults to zeros.

    Results: `max_steps_reached` (or `singular` when `max_steps=None`, as lineax);
    `stagnation` when the true residual misses the tolerance and cannot be reduced;
    `singular` when, short of the tolerance, the projected tridiagonal matrix loses
    rank or `||A r||` becomes negligible against `||A|| ||r||` (a least-squares
    solution); `breakdown` when the preconditioner is found indefinite;
    `nonfinite_input`. A singular operator with an inconsistent right-hand side
    that is not caught so may run to `max_steps`, its iterate growing once the
    Krylov subspace is exhausted.

    !!! Example

        ```python
        indefinite = jnp.array([[1.0, 2.0], [2.0, -1.0]])
        op = lxd.MatrixLinearOperator(indefinite, lx.symmetric_tag)
        b = jnp.array([1.0, 0.0])
        sol = lx.linear_solve(op, b, lxd.MINRES(rtol=1e-6, atol=1e-6))
        ```
    """

    psd_preconditioner: ClassVar[bool] = True

    rtol: float
    atol: float
    norm: Callable[[PyTree], Scalar] = max_norm
    max_steps: int | None = None

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        del options
        check_square(operator, "MINRES")
        if not (
            lx.is_symmetric(operator)
            | lx.is_positive_semidefinite(operator)
            | lx.is_negative_semidefinite(operator)
        ):
            raise ValueError(
                "`MINRES` needs a symmetric (Hermitian) operator, tagged with "
                "`lx.symmetric_tag`, `lx.positive_semidefinite_tag` or "
                "`lx.negative_semidefinite_tag`; got one with none of these tags."
            )
        return keep_linearise(self.prepare(operator))

    def solve_system(
        self, system: System, precond: Callable[[Array], Array], y0: Array
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """Runs MINRES on `system` from `y0` (flat). Returns the flat solution (with
        the system's offset added), the result and the stats."""
        size = system.flat.size
        real = jnp.finfo(system.flat.dtype).dtype
        eps = jnp.finfo(real).eps
        c = _Constants(
            max_steps=self.resolve_max_steps(size),
            rcond=2 * eps * max(size, 1),
            zero=jnp.zeros((), real),
            zeros=jnp.zeros_like(y0),
            tolerance=ft.partial(self._residual_tolerance, real, system.unit),
        )
        s = lax.while_loop(
            ft.partial(_continues, c),
            ft.partial(_pass, system, precond, c),
            _init_loop(system, y0, c),
        )
        nc = _not_converged(s)
        finite_state = jnp.isfinite(s.phibar) & jnp.isfinite(s.beta) & all_finite(s.y)
        return self.loop_end(
            system,
            s,
            c.max_steps,
            nc,
            finite_input=s.finite,
            codes=(
                (_ended(s, c.rcond) & nc, lx.RESULTS.stagnation),
                (s.singular & nc, lx.RESULTS.singular),
            ),
            breakdown=s.breakdown,
            finite_state=finite_state,
        )

    def _residual_tolerance(
        self, real: Any, unit: Array | None, b: Array
    ) -> Real[Array, ""]:
        """The stopping test's tolerance `atol + rtol * ||b||_2` for a right-hand
        side `b` in the units of a system whose right-hand side is the user's
        divided by `unit` (`atol / unit` there), in the dtype `real`."""
        atol = self.atol if unit is None else jnp.asarray(self.atol, real) / unit
        with jax.numpy_dtype_promotion("standard"):
            return jnp.asarray(atol + self.rtol * two_norm(b), real)


def _init_loop(system: System, y0: Array, c: _Constants) -> _Loop:
    """The loop's state before its first pass, a residual pass at `y0`."""
    zero, zeros = c.zero, c.zeros
    tol, finite = system.scale_of_rhs(c.tolerance, y0)
    return _Loop(
        y=y0,
        **dict.fromkeys(("v", "r1", "r2", "w", "w2"), zeros),
        **dict.fromkeys(("beta", "oldb", "tnorm", "dbar", "epsln"), zero),
        phibar=zero,
        sn=zero,
        cs=jnp.array(-1, zero.dtype),
        step=jnp.array(0),
        started=jnp.array(False),
        checked=jnp.array(False),
        breakdown=jnp.array(False),
        singular=jnp.array(False),
        finite=finite,
        tol=tol,
    )


def _not_converged(s: _Loop) -> Bool[Array, ""]:
    """The stopping test on the residual's 2-norm estimate; after a check of the
    true residual (a residual pass past the first), on that residual within
    `CHECK_SLACK` times the tolerance, as CG's check (`b - A y` computed in the
    dtype carries rounding of the tolerance's order near its precision)."""
    check = s.checked & (s.step > 0)
    return s.phibar > jnp.where(check, CHECK_SLACK * s.tol, s.tol)


def _ended(s: _Loop, rcond: Any) -> Bool[Array, ""]:
    """Whether the Lanczos process has ended (`rcond` is `2 eps n`)."""
    # The Lanczos process has ended when beta is negligible against the
    # estimate of the operator's norm, `tnorm`.
    return s.beta <= rcond * s.tnorm


def _residual_pass(s: _Loop, rcond: Any) -> Bool[Array, ""]:
    """Whether the next pass through the slot is a residual pass."""
    # The first pass, and a check of the true residual once the estimate
    # passes the test or the process ends (a restart where it fails).
    return ~s.started | (~s.checked & (~_not_converged(s) | _ended(s, rcond)))


def _continues(c: _Constants, s: _Loop) -> Bool[Array, ""]:
    """The loop's condition: finite and no breakdown, and a residual pass to make
    or a step to take."""
    going = s.finite & ~s.breakdown
    iterate = (
        ~s.singular & ~_ended(s, c.rcond) & (s.step < c.max_steps) & _not_converged(s)
    )
    return going & (_residual_pass(s, c.rcond) | iterate)


def _pass(
    system: System, precond: Callable[[Array], Array], c: _Constants, s: _Loop
) -> _Loop:
    """The loop body: a Lanczos step (`_lanczos`) and its QR update (`_qr_step`),
    or, on a residual pass, a (re)start of the process from the true residual."""
    first = ~s.started
    restart = _residual_pass(s, c.rcond)
    lanczos = _lanczos(system, precond, s, restart)
    step = ~restart
    qr = _qr_step(s, lanczos, step, c)
    beta_new = lanczos.beta
    phibar = jnp.where(
        restart, beta_new, jnp.where(qr.take, qr.sn * s.phibar, s.phibar)
    )
    tol, finite = system.from_first_residual(
        first, lanczos.out, c.tolerance, (s.tol, s.finite)
    )
    pick = ft.partial(_pick, step, restart)
    return _Loop(
        y=jnp.where(qr.take, s.y + qr.phi * qr.w, s.y),
        v=lanczos.z / jnp.where(beta_new > 0, beta_new, 1),
        r1=pick(s.r2, s.r1),
        r2=lanczos.u,
        w=pick(qr.w, s.w, c.zeros),
        w2=pick(s.w, s.w2, c.zeros),
        beta=beta_new,
        oldb=pick(s.beta, s.oldb, c.zero),
        tnorm=qr.tnorm,
        dbar=pick(qr.dbar, s.dbar, c.zero),
        epsln=pick(s.sn * beta_new, s.epsln, c.zero),
        phibar=phibar,
        sn=pick(qr.sn, s.sn, c.zero),
        cs=pick(qr.cs, s.cs, jnp.array(-1, c.zero.dtype)),
        step=s.step + step.astype(s.step.dtype),
        started=jnp.array(True),
        checked=restart,
        breakdown=s.breakdown | lanczos.breakdown,
        singular=s.singular | qr.singular,
        finite=finite,
        tol=tol,
    )


def _pick(
    step: Bool[Array, ""],
    restart: Bool[Array, ""],
    new: Array,
    old: Array,
    start: Array | None = None,
) -> Array:
    """The value of one of the loop's recurrences after a pass."""
    # A step's value; on a residual pass the old one, or `start` where the pass
    # restarts the process.
    kept = old if start is None else jnp.where(restart, start, old)
    return jnp.where(step, new, kept)


def _lanczos(
    system: System,
    precond: Callable[[Array], Array],
    s: _Loop,
    restart: Bool[Array, ""],
) -> _Lanczos:
    """The pass through the `mv` slot and the preconditioner: a Lanczos step, or,
    where `restart`, the (preconditioned) true residual."""
    v, beta, oldb = s.v, s.beta, s.oldb
    # The one application slot: the residual at the iterate on a residual
    # pass (y0 on the first), else the operator applied to the Lanczos
    # vector.
    out = system.apply(jnp.where(restart, s.y, v), restart)
    # Lanczos: u = A v - (beta / oldb) r1 - (alpha / beta) r2.
    u = out - (beta / jnp.where(oldb > 0, oldb, 1)) * s.r1
    alpha = jnp.real(dot(v, u))
    u = u - (alpha / jnp.where(beta > 0, beta, 1)) * s.r2
    u = jnp.where(restart, out, u)
    z = precond(u)
    # `beta = sqrt(<u, M u>)`, with `u` and `z` divided by a power of two near
    # their largest entries: the product of an operator of norm 1e-20 (or
    # 1e20) would underflow (overflow) in float32 when squared.
    u_unit, z_unit = binary_scale(u), binary_scale(z)
    beta_sq = jnp.real(dot(u / u_unit.astype(u.dtype), z / z_unit.astype(z.dtype)))
    breakdown = beta_sq < 0
    beta_new = jnp.sqrt(jnp.maximum(beta_sq, 0)) * (jnp.sqrt(u_unit) * jnp.sqrt(z_unit))
    return _Lanczos(out, u, z, alpha, beta_new, breakdown)


def _qr_step(
    s: _Loop, lanczos: _Lanczos, step: Bool[Array, ""], c: _Constants
) -> _QRStep:
    """The estimate of the operator's norm and the QR update of a Lanczos step
    (read where `step`)."""
    alpha, beta, beta_new = lanczos.alpha, s.beta, lanczos.beta
    # `tnorm` estimates the norm of the operator (||T||_F), accumulated by
    # `hypot` (the squares of an operator's entries of 1e-20 underflow in
    # float32). Unlike scipy, it leaves out the first beta, the norm of the
    # residual.
    entries = jnp.hypot(jnp.hypot(alpha, beta_new), jnp.where(s.oldb > 0, beta, 0))
    tnorm = jnp.where(step, jnp.hypot(s.tnorm, entries), s.tnorm)
    small = c.rcond * tnorm
    # QR of the Lanczos tridiagonal by Givens rotations.
    delta = s.cs * s.dbar + s.sn * alpha
    gbar = s.sn * s.dbar - s.cs * alpha
    dbar = -s.cs * beta_new
    gamma_raw = jnp.hypot(gbar, beta_new)
    # Where `gamma_raw` is negligible (at most `small`) the step is not taken;
    # elsewhere it is itself. (An absolute floor, as scipy's `eps`, would take
    # the place of every `gamma` of an operator of norm below `eps`.)
    gamma = jnp.maximum(gamma_raw, small)
    gamma = jnp.where(gamma > 0, gamma, 1)
    cs, sn = gbar / gamma, beta_new / gamma
    phi = cs * s.phibar
    w = (s.v - s.epsln * s.w2 - delta * s.w) / gamma
    # The projected matrix is singular (the step, which would blow up, is
    # not taken), or the iterate is a least-squares solution: `||A r||` is
    # negligible against `||A|| ||r||`.
    degenerate = step & (gamma_raw <= small)
    singular = degenerate | (step & (jnp.hypot(gbar, dbar) <= small))
    take = step & ~degenerate
    return _QRStep(tnorm, dbar, cs, sn, phi, w, singular, take)


MINRES.__init__.__doc__ = r"""**Arguments:**

- `rtol`: relative tolerance for terminating the solve: the residual's 2-norm
    estimate must be within `atol + rtol * ||b||_2`.
- `atol`: absolute tolerance for terminating the solve.
- `norm`: accepted for a signature like lineax's iterative solvers; unused, as the
    stopping test is on the 2-norm. Defaults to the max norm.
- `max_steps`: the maximum number of Lanczos steps. Defaults to ten times the number
    of unknowns, as lineax (then hitting it reports `singular`).
"""
