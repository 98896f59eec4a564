"""LSMR's loop state and its step after the bidiagonalisation (see `_lsmr.py`).

Ported from lineax's LSMR, whose implementation is adapted from SciPy, under
SciPy's BSD license: its copyright notice, conditions and disclaimer are in
`SCIPY_LICENSE.txt` in this folder."""

from collections.abc import Callable
from typing import NamedTuple

import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Inexact, Int, Real


class Loop(NamedTuple):
    """LSMR's loop state, named as in lineax's (and scipy's). Latin letters are
    vectors that may be complex: the iterate `x`, the bidiagonalisation's `u` and
    `v`, the update directions `h` and `hbar`. Greek letters are real scalars: the
    bidiagonalisation's `alpha` and `beta`, the rotations' and the estimates of
    `||r||`, `||A^H r||`, `||A||` and `cond(A)`. `first` marks the first pass,
    `istop` is the reason to stop (0 to go on); `normb` and `finite` describe the
    right-hand side."""

    first: Bool[Array, ""]
    x: Inexact[Array, " n"]
    u: Inexact[Array, " m"]
    v: Inexact[Array, " n"]
    h: Inexact[Array, " n"]
    hbar: Inexact[Array, " n"]
    itn: Int[Array, ""]
    istop: Int[Array, ""]
    alpha: Real[Array, ""]
    beta: Real[Array, ""]
    zetabar: Real[Array, ""]
    alphabar: Real[Array, ""]
    sbar: Real[Array, ""]
    betadd: Real[Array, ""]
    betad: Real[Array, ""]
    tautildeold: Real[Array, ""]
    thetatilde: Real[Array, ""]
    zeta: Real[Array, ""]
    delta: Real[Array, ""]
    normA: Real[Array, ""]
    maxrbar: Real[Array, ""]
    normr: Real[Array, ""]
    normAr: Real[Array, ""]
    rho: Real[Array, ""]
    rhobar: Real[Array, ""]
    cbar: Real[Array, ""]
    rhodold: Real[Array, ""]
    condA: Real[Array, ""]
    minrbar: Real[Array, ""]
    normb: Real[Array, ""]
    finite: Bool[Array, ""]


def lsmr_step(
    st: Loop,
    damp: Real[Array, ""],
    norm_x: Callable[[Array], Array],
    max_steps: int,
    tolerances: tuple[float, float, float],
) -> Loop:
    """lineax's LSMR loop body after the bidiagonalisation: rotations, updates of
    `h`, `hbar`, `x`, the estimates of `||r||`, `||A||`, `cond(A)`, and the stopping
    rules.

    **Arguments:**

    - `st`: the loop state, its `u`, `v`, `alpha` and `beta` those of this step.
    - `damp`: the damping factor (zero: lineax supports no other).
    - `norm_x`: the norm of the solution for a value of `st.x`.
    - `max_steps`: the bound on the number of steps.
    - `tolerances`: the solver's `(atol, rtol, conlim)`.

    **Returns:**

    The state after the step.
    """
    new, rotations = _rotate(st, damp)
    new = _estimate_normr(st, new, rotations)
    new, normA = _estimate_normA_condA(st, new, rotations)
    return _stopping_rules(st, new, normA, norm_x, max_steps, tolerances)


class _Rotations(NamedTuple):
    """A step's rotations that the estimates read: Qhat's `chat`, `shat`, Q's `c`,
    `s`, and Qbar's `thetabar` and `rhotemp`."""

    chat: Real[Array, ""]
    shat: Real[Array, ""]
    c: Real[Array, ""]
    s: Real[Array, ""]
    thetabar: Real[Array, ""]
    rhotemp: Real[Array, ""]


def _rotate(st: Loop, damp: Real[Array, ""]) -> tuple[Loop, _Rotations]:
    """The step's rotations and the updates of `h`, `hbar` and `x`.

    **Returns:**

    `st` with the step count, the rotations' scalars and `h`, `hbar`, `x` of the
    step; and the rotations the estimates read.
    """
    itn = st.itn + 1
    dtype = st.x.dtype
    # Construct rotation Qhat_{k,2k+1}.
    chat, shat, alphahat = givens(st.alphabar, damp)
    # Use a plane rotation (Q_i) to turn B_i to R_i
    rhoold = st.rho
    c, s, rho = givens(alphahat, st.beta)
    thetanew = s * st.alpha
    alphabar = c * st.alpha
    # Use a plane rotation (Qbar_i) to turn R_i^T to R_i^bar
    rhobarold = st.rhobar
    thetabar = st.sbar * rho
    rhotemp = st.cbar * rho
    cbar, sbar, rhobar = givens(rhotemp, thetanew)
    zeta = cbar * st.zetabar
    zetabar = -sbar * st.zetabar
    # Update h, h_hat, x. (The quotients by products of two of the operator's
    # scalars are taken one factor at a time: the products of an operator's of
    # norm 1e-20 underflow in float32. The barrier keeps XLA from rewriting
    # `(a / b) / c` as `a / (b * c)`.)
    ratios = lax.optimization_barrier((thetabar / rhoold, zeta / rho))
    scale = -(ratios[0] * (rho / rhobarold))
    hbar = st.hbar * scale.astype(dtype) + st.h
    step = ratios[1] / rhobar
    x = st.x + step.astype(dtype) * hbar
    h = st.h * -(thetanew / rho).astype(dtype) + st.v
    new = st._replace(
        itn=itn,
        x=x,
        h=h,
        hbar=hbar,
        zetabar=zetabar,
        alphabar=alphabar,
        sbar=sbar,
        zeta=zeta,
        rho=rho,
        rhobar=rhobar,
        cbar=cbar,
    )
    return new, _Rotations(chat, shat, c, s, thetabar, rhotemp)


def _estimate_normr(st: Loop, new: Loop, rotations: _Rotations) -> Loop:
    """`new` (the step's state so far, from `st`) with the estimate of `||r||` and
    the scalars of its recurrence."""
    chat, shat, c, s = rotations.chat, rotations.shat, rotations.c, rotations.s
    rhobar, zetaold, zeta = new.rhobar, st.zeta, new.zeta
    # Estimate of ||r||.
    # Apply rotation Qhat_{k,2k+1}.
    betaacute = chat * st.betadd
    betacheck = -shat * st.betadd
    # Apply rotation Q_{k,k+1}.
    betahat = c * betaacute
    betadd = -s * betaacute
    # Apply rotation Qtilde_{k-1}.
    # betad = betad_{k-1} here.
    thetatildeold = st.thetatilde
    ctildeold, stildeold, rhotildeold = givens(st.rhodold, rotations.thetabar)
    thetatilde = stildeold * rhobar
    rhodold = ctildeold * rhobar
    betad = -stildeold * st.betad + ctildeold * betahat
    # betad   = betad_k here.
    # rhodold = rhod_k  here.
    tautildeold = (zetaold - thetatildeold * st.tautildeold) / rhotildeold
    taud = (zeta - thetatilde * tautildeold) / rhodold
    delta = st.delta + betacheck**2
    normr = jnp.sqrt(delta + (betad - taud) ** 2 + betadd**2)
    return new._replace(
        betadd=betadd,
        betad=betad,
        tautildeold=tautildeold,
        thetatilde=thetatilde,
        delta=delta,
        normr=normr,
        rhodold=rhodold,
    )


def _estimate_normA_condA(
    st: Loop, new: Loop, rotations: _Rotations
) -> tuple[Loop, Real[Array, ""]]:
    """`new` (the step's state so far, from `st`) with the estimates of `||A||`
    and `cond(A)`; and the estimate of `||A||` the stopping rules read."""
    itn, rhobarold, rhotemp = new.itn, st.rhobar, rotations.rhotemp
    # Estimate ||A|| (by `hypot`: the squares of an operator's entries of 1e-20
    # underflow in float32).
    normA = jnp.hypot(st.normA, st.beta)
    normA_next = jnp.hypot(normA, st.alpha)
    # Estimate cond(A).
    # (At the first step `rhobarold` is the recurrence's starting 1, not a
    # value of the operator's: read by neither, or an operator of norm far from
    # 1 would seem ill-conditioned.)
    maxrbar = jnp.where(itn > 1, jnp.maximum(st.maxrbar, rhobarold), st.maxrbar)
    minrbar = jnp.where(itn > 1, jnp.minimum(st.minrbar, rhobarold), st.minrbar)
    condA = jnp.maximum(maxrbar, rhotemp) / jnp.minimum(minrbar, rhotemp)
    new = new._replace(normA=normA_next, maxrbar=maxrbar, minrbar=minrbar, condA=condA)
    return new, normA


def _stopping_rules(
    st: Loop,
    new: Loop,
    normA: Real[Array, ""],
    norm_x: Callable[[Array], Array],
    max_steps: int,
    tolerances: tuple[float, float, float],
) -> Loop:
    """`new` (the step's state so far, from `st`) with `normAr` and the reason
    `istop` to stop after the step (0 to go on)."""
    atol, rtol, conlim = tolerances
    itn = new.itn
    # Compute norms for convergence testing.
    normAr = jnp.abs(new.zetabar)
    well_posed_tol = atol + rtol * (normA * norm_x(new.x) + st.normb)
    # (`A^H r` is in units of `A` times those of `b`: the absolute tolerance, in
    # those of `b`, is scaled by the estimate of `||A||`, so that an operator of
    # small scale does not pass it at `x = 0`.)
    least_squares_tol = normA * (atol + rtol * new.normr)
    # maxiter exceeded; cond(A) seems to be greater than conlim; x solves the
    # least-squares problem, or A x = b, according to atol and rtol.
    istop = jnp.where(itn >= max_steps, 4, st.istop)
    istop = jnp.where(new.condA > conlim, 3, istop)
    istop = jnp.where(normAr < least_squares_tol, 2, istop)
    istop = jnp.where(new.normr < well_posed_tol, 1, istop)
    return new._replace(normAr=normAr, istop=istop)


def givens(a: Real[Array, ""], b: Real[Array, ""]):
    """Stable Givens rotation, as lineax's (S.-C. Choi, "Iterative Methods for
    Singular Linear Equations and Least-Squares Problems", 2006): finds real
    `c, s, r` with `[[c, -s], [s, c]] @ [a, b] = [r, 0]`, `r = sqrt(a^2 + b^2)`.
    Constants are made in the dtype of `a`, `b`, so float32 works under x64."""
    assert not jnp.iscomplexobj(a)
    assert not jnp.iscomplexobj(b)

    def bzero(a, b):
        return jnp.sign(a), jnp.zeros_like(a), jnp.abs(a)

    def azero(a, b):
        return jnp.zeros_like(b), jnp.sign(b), jnp.abs(b)

    def a_ge_b(a, b):
        tau = b / jnp.where(a == 0.0, 1.0, a)
        c = jnp.sign(a) / jnp.sqrt(1.0 + tau**2)
        s = c * tau
        r = a / jnp.where(c == 0.0, 1.0, c)
        return c, s, r

    def b_gt_a(a, b):
        # The same rotation with the roles of `a` and `b`, and of `c` and `s`,
        # exchanged.
        s, c, r = a_ge_b(b, a)
        return c, s, r

    def either_zero(a, b):
        return lax.cond(b == 0.0, bzero, azero, a, b)

    def both_nonzero(a, b):
        return lax.cond(jnp.abs(b) > jnp.abs(a), b_gt_a, a_ge_b, a, b)

    return lax.cond((a == 0.0) | (b == 0.0), either_zero, both_nonzero, a, b)
