"""BiCGStab with one `mv` call site."""

import functools as ft
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias

import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
from jaxtyping import Array, Bool, Inexact, Int, PyTree, Scalar
from lineax.internal import max_norm

from .._validate import check_square
from .skeleton._flat_vectors import binary_scale, dot, keep_linearise
from .skeleton._linear_system import System
from .skeleton._one_site_solver import AbstractOneSiteSolver


_BiCGStabState: TypeAlias = lx.AbstractLinearOperator


# Phases of the loop: which input the single `mv` slot receives.
_RESIDUAL, _P_HALF, _S_HALF = 0, 1, 2


class _Loop(NamedTuple):
    """BiCGStab's loop state: the iterate `y`, the residual `r` and shadow
    residual `rhat`, the recurrence's vectors `p`, `v = A M p`, `s` and `x = M p`,
    its scalars, the last update `diff`, the step count, the `phase` of the next
    pass; `finite` and `b_scale` describe the right-hand side; `gain` is the
    operator's `|A M x| / |x|` on the last half-step (1 after a residual pass),
    against which `_broken` measures `alpha` and `omega`."""

    y: Inexact[Array, " n"]
    r: Inexact[Array, " n"]
    rhat: Inexact[Array, " n"]
    p: Inexact[Array, " n"]
    v: Inexact[Array, " n"]
    s: Inexact[Array, " n"]
    x: Inexact[Array, " n"]
    alpha: Inexact[Array, ""]
    omega: Inexact[Array, ""]
    rho: Inexact[Array, ""]
    diff: Inexact[Array, " n"]
    step: Int[Array, ""]
    phase: Int[Array, ""]
    finite: Bool[Array, ""]
    b_scale: Array
    gain: Array


class _HalfStep(NamedTuple):
    """A pass's values: the first half-step's `rho`, direction `p`, `m = M p`,
    `alpha` and `s`; the second's `omega` and update `diff` (with `m = M s`), and
    whether `t = A M s` is `nonzero`; and the operator slot's output `out` (the
    residual on a residual pass, `A M p` or `A M s` on a half-step)."""

    rho: Inexact[Array, ""]
    p: Inexact[Array, " n"]
    m: Inexact[Array, " n"]
    out: Inexact[Array, " n"]
    alpha: Inexact[Array, ""]
    s: Inexact[Array, " n"]
    omega: Inexact[Array, ""]
    nonzero: Bool[Array, ""]
    diff: Inexact[Array, " n"]
    gain: Array


class BiCGStab(AbstractOneSiteSolver[_BiCGStabState]):
    """Biconjugate gradient stabilised method for square operators, with the
    operator's `mv` (and the preconditioner's) written once in the compiled program.

    A drop-in for [`lineax.BiCGStab`][]: the same fields, defaults, `options` and
    iterates. lineax's BiCGStab writes `mv` three times (initial residual and the
    two products of each step). Here one BiCGStab step is two passes through a loop
    with a single slot, `A M p` on the first half-step and `A M s` on the second,
    and the initial residual is a third kind of pass through the same slot. A step
    whose updated residual passes the stopping test is followed by such a pass:
    the solve stops only if the true residual `b - A y` passes it too, and
    otherwise restarts from `y` (lineax's test reads the updated residual, which
    drifts from the true one and can shrink below the dtype's precision).

    `options`:

    - `preconditioner`: a linear operator, applied on the right. Defaults to the
        identity.
    - `y0`: the initial estimate of the solution. Defaults to zeros.

    Results: `max_steps_reached` (or `singular` when `max_steps=None`),
    `breakdown` when one of the recurrence's scalars vanishes before convergence,
    `nonfinite_input`. Breakdown is tested as `|x| == 0` in float64 and
    `|x| < 1e-16` in lower precision (lineax tests the signed value), with `alpha`
    and `omega` multiplied by the operator's gain `|A M x| / |x|` (to a power of
    two) on the pass that computed them: lineax's test of `alpha` and `omega`
    alone reported `breakdown` for an operator of scale 1e20 in float32.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.array([[3.0, 1.0], [-1.0, 2.0]]))
        b = jnp.array([1.0, 2.0])
        sol = lx.linear_solve(op, b, lxd.BiCGStab(rtol=1e-6, atol=1e-6),
                              options={"y0": jnp.zeros(2)})
        ```
    """

    rtol: float
    atol: float
    norm: Callable[[PyTree], Scalar] = max_norm
    max_steps: int | None = None

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        del options
        check_square(operator, "BiCGStab")
        return keep_linearise(self.prepare(operator))

    def solve_system(
        self, system: System, precond: Callable[[Array], Array], y0: Array
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """Runs BiCGStab on `system` from `y0` (flat)."""
        flat = system.flat
        max_steps = self.resolve_max_steps(flat.size)
        real = jnp.finfo(flat.dtype).dtype
        tiny = 0.0 if real == jnp.float64 else 1e-16
        one = jnp.ones((), flat.dtype)
        s = lax.while_loop(
            ft.partial(self._continues, system, max_steps, tiny),
            ft.partial(self._pass, system, precond, one),
            self._init_loop(system, y0, one),
        )
        nc = self.not_converged(system, s)
        return self.loop_end(
            system,
            s,
            max_steps,
            nc,
            finite_input=s.finite,
            breakdown=_broken(s, tiny) & nc,
        )

    def _init_loop(self, system: System, y0: Array, one: Array) -> _Loop:
        """The loop's state before its first pass, a residual pass at `y0`."""
        zeros = jnp.zeros_like(y0)
        b_scale, finite = system.scale_of_rhs(self.b_scale(system), y0)
        return _Loop(
            y=y0,
            r=zeros,
            rhat=zeros,
            p=zeros,
            v=zeros,
            s=zeros,
            x=zeros,
            alpha=one,
            omega=one,
            rho=one,
            diff=jnp.full_like(y0, jnp.inf),
            step=jnp.array(0),
            phase=jnp.array(_RESIDUAL),
            finite=finite,
            b_scale=b_scale,
            gain=jnp.ones((), jnp.finfo(y0.dtype).dtype),
        )

    def _continues(
        self, system: System, max_steps: int, tiny: float, s: _Loop
    ) -> Bool[Array, ""]:
        """The loop's condition: a finite right-hand side, and a pass other than
        a step's first half to make, or a step to take."""
        iterate = (
            ~_broken(s, tiny) & self.not_converged(system, s) & (s.step < max_steps)
        )
        return s.finite & ((s.phase != _P_HALF) | iterate)

    def _pass(
        self,
        system: System,
        precond: Callable[[Array], Array],
        one: Array,
        s: _Loop,
    ) -> _Loop:
        """The loop body: one pass through the slots (`_half_step`), then the
        state it leaves and the phase of the next pass."""
        phase = s.phase
        is_res, is_p = phase == _RESIDUAL, phase == _P_HALF
        h = _half_step(system, precond, s, is_res, is_p)
        is_s = phase == _S_HALF
        # Only the first residual pass (before any step) reads `b`'s scale.
        b_scale, finite = system.from_first_residual(
            is_res & (s.step == 0), h.out, self.b_scale(system), (s.b_scale, s.finite)
        )
        new = _Loop(
            y=jnp.where(is_s, s.y + h.diff, s.y),
            r=jnp.where(is_res, h.out, jnp.where(is_s, s.s - h.omega * h.out, s.r)),
            rhat=jnp.where(is_res, h.out, s.rhat),
            # A residual pass (re)starts the recurrence from the true residual.
            p=jnp.where(is_p, h.p, jnp.where(is_res, 0, s.p)),
            v=jnp.where(is_p, h.out, jnp.where(is_res, 0, s.v)),
            s=jnp.where(is_p, h.s, s.s),
            x=jnp.where(is_p, h.m, s.x),
            alpha=jnp.where(is_p, h.alpha, jnp.where(is_res, one, s.alpha)),
            omega=jnp.where(is_s, h.omega, jnp.where(is_res, one, s.omega)),
            rho=jnp.where(is_p, h.rho, jnp.where(is_res, one, s.rho)),
            # With s = 0, or a residual pass finding `b - A y = 0` (`b = 0`,
            # say), the residual is exactly 0: the update test (lineax's guard
            # against stagnation) does not apply to an exact solve, and no step
            # is taken (its scalars would be 0/0).
            diff=jnp.where(
                is_s | (is_res & ~h.nonzero),
                jnp.where(h.nonzero, h.diff, 0),
                s.diff,
            ),
            step=s.step + is_s.astype(s.step.dtype),
            phase=jnp.where(is_p, _S_HALF, _P_HALF),
            finite=finite,
            b_scale=b_scale,
            # (The recurrence's scalars restart at 1 with it.)
            gain=jnp.where(is_res, jnp.ones_like(s.gain), h.gain),
        )
        # A step that passes the test on the updated residual is checked: the
        # next pass computes the true residual.
        check = is_s & ~self.not_converged(system, new)
        return new._replace(phase=jnp.where(check, _RESIDUAL, new.phase))


def _broken(s: _Loop, tiny: float) -> Bool[Array, ""]:
    """Whether one of the recurrence's scalars has vanished (at most `tiny`):
    `alpha` and `omega`, in the inverse units of the operator, measured against
    its gain (`s.gain`), so that the test does not change when it is scaled."""
    return (
        (jnp.abs(s.omega) * s.gain <= tiny)
        | (jnp.abs(s.alpha) * s.gain <= tiny)
        | (jnp.abs(s.rho) <= tiny)
    )


def _half_step(
    system: System,
    precond: Callable[[Array], Array],
    s: _Loop,
    is_res: Bool[Array, ""],
    is_p: Bool[Array, ""],
) -> _HalfStep:
    """The pass through the preconditioner's and the operator's slots, and both
    half-steps' values from it (each read only in its own phase)."""
    rho_new = dot(s.rhat, s.r)
    beta = (rho_new / s.rho) * (s.alpha / s.omega)
    p_new = s.r + beta * (s.p - s.omega * s.v)
    # The one preconditioner slot and the one operator slot.
    slot_input = jnp.where(is_p, p_new, s.s)
    m = precond(slot_input)
    out = system.apply(jnp.where(is_res, s.y, m), is_res)
    # First half-step: v = A M p.
    alpha_new = rho_new / dot(s.rhat, out)
    s_new = s.r - alpha_new * out
    # Second half-step: t = A M s.
    # `t = 0` where `s = 0`: the first half-step solved the system exactly
    # (b an eigenvector of A, say). omega = 0 then keeps the update
    # `alpha p` and the residual `s` (0/0 gave NaN); the loop stops on
    # convergence, or reports `breakdown` where `s` is not 0.
    # `<t, s> / <t, t>` with `t` divided by a power of two near its largest
    # entry (exactly: the same quotient), divided back: `<t, t>` of an operator
    # of scale 1e20 overflows in float32.
    out_unit = binary_scale(out)
    t = out / out_unit.astype(out.dtype)
    tt = dot(t, t)
    nonzero = tt != 0
    omega_new = jnp.where(
        nonzero, dot(t, s.s) / jnp.where(nonzero, tt, 1) / out_unit.astype(tt.dtype), 0
    )
    # The operator's (preconditioned) gain on this pass, `|A M x| / |x|` to a
    # power of two: `alpha` and `omega` are in its inverse units.
    gain = out_unit / binary_scale(slot_input)
    diff = s.alpha * s.x + omega_new * m
    return _HalfStep(
        rho_new, p_new, m, out, alpha_new, s_new, omega_new, nonzero, diff, gain
    )


BiCGStab.__init__.__doc__ = r"""**Arguments:**

- `rtol`: relative tolerance for terminating the solve.
- `atol`: absolute tolerance for terminating the solve.
- `norm`: the norm in which the scaled residual and update are measured. Defaults to
    the max norm.
- `max_steps`: the maximum number of steps (each two `mv`s). Defaults to ten times
    the number of unknowns, as lineax.
"""
