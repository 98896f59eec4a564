"""LSMR with one `mv` call site and one transpose `mv` call site.

Ported from lineax's LSMR, whose implementation is adapted from SciPy, with BSD
license:

Copyright (c) 2001-2002 Enthought, Inc. 2003-2024, SciPy Developers.
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions
are met:

1. Redistributions of source code must retain the above copyright
   notice, this list of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above
   copyright notice, this list of conditions and the following
   disclaimer in the documentation and/or other materials provided
   with the distribution.

3. Neither the name of the copyright holder nor the names of its
   contributors may be used to endorse or promote products derived
   from this software without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS
"AS IS" AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT
LIMITED TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR
A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT
OWNER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL,
SPECIAL, EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT
LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE,
DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY
THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
(INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""

from collections.abc import Callable
from typing import Any, TypeAlias

import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import Array, PyTree, Scalar
from lineax.internal import two_norm

from ._base import AbstractOneSiteSolver, finish_result
from ._flat import (
    all_finite,
    flat_mv,
    Flattener,
    keep_conj,
    keep_linearise,
    preconditioner_and_y0,
    result_dtype,
)


_LSMRState: TypeAlias = lx.AbstractLinearOperator


class LSMR(AbstractOneSiteSolver[_LSMRState]):
    """LSMR solver for linear systems, with the operator's `mv` and its adjoint's
    `mv` each written once in the compiled program.

    This solver can handle any operator, even nonsquare or singular ones. In these
    cases it will return the pseudoinverse solution to the linear system.

    A drop-in for [`lineax.LSMR`][]: the same fields, defaults and `options`, the
    same iterates, stopping rules (`stats["istop"]`) and statistics, and
    `stats["num_steps"]` counting the same steps. lineax's LSMR writes `A` twice
    (the initial residual `b - A x0` and the loop body) and `A^H` twice (the first
    right vector `A^H u` and the loop body, there inside a `lax.cond`). This one has
    one slot for each in its loop: on the first pass, which is not counted as a
    step, the `A` slot is fed with `x0` and gives `u = b - A x0`, and the `A^H` slot
    gives `v = A^H u`; on every later pass they give `A v - alpha u` and
    `A^H u - beta v`. The adjoint is always applied, to a safely normalised `u`,
    and its output discarded where lineax would skip it (`beta == 0`).

    This supports the following `options` (as passed to
    `lx.linear_solve(..., options=...)`).

    - `y0`: The initial estimate of the solution to the linear system. Defaults to all
        zeros.

    !!! Example

        ```python
        op = lxd.MatrixLinearOperator(jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        b = jnp.array([1.0, 2.0, 4.0])
        sol = lx.linear_solve(op, b, lxd.LSMR(rtol=1e-6, atol=1e-6))  # least squares
        ```
    """

    rtol: float
    atol: float
    norm: Callable[[PyTree], Scalar] = two_norm
    max_steps: int | None = None
    conlim: float = 1e8

    def __check_init__(self):
        if isinstance(self.conlim, (int, float)) and self.conlim < 0:
            raise ValueError(
                f"`LSMR(..., conlim=...)` must be non-negative, got {self.conlim}."
            )

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        del options
        return keep_linearise(self.prepare(operator))

    def compute(
        self, state: _LSMRState, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        operator = state
        _, y0 = preconditioner_and_y0(
            operator, vector, options, allow_preconditioner=False, solver_name="LSMR"
        )
        dtype = result_dtype(vector, operator.in_structure(), operator.out_structure())
        rdtype = jnp.finfo(dtype).dtype
        damp = jnp.zeros((), rdtype)  # damp is not supported at this time, as lineax.
        in_flat = Flattener(operator.in_structure(), dtype)
        out_flat = Flattener(operator.out_structure(), dtype)
        # Each called once, in the loop body. (Transposing a FunctionLinearOperator
        # traces its function once, here.)
        mv = flat_mv(operator, in_flat, out_flat)
        rmv = flat_mv(keep_conj(operator).transpose(), out_flat, in_flat)
        b = out_flat.ravel(vector)
        x0 = jnp.zeros((in_flat.size,), dtype) if y0 is None else in_flat.ravel(y0)
        norm_in, norm_out = self._flat_norm(in_flat), self._flat_norm(out_flat)

        # As lineax: ten times the number of singular values, avoiding overflow.
        int_max = jnp.iinfo(jnp.dtype(f"int{rdtype.itemsize * 8}")).max
        min_dim = min(in_flat.size, out_flat.size)
        default_steps = int_max if min_dim > int_max / 10 else 10 * min_dim
        max_steps = default_steps if self.max_steps is None else self.max_steps
        normb = norm_out(b)
        real = lambda value: jnp.asarray(value, rdtype)  # noqa: E731
        zeros_in = jnp.zeros_like(x0)
        # Generally, latin letters (b, x, u, v, h etc) are vectors that may be
        # complex; greek letters (alpha, beta, rho, zeta etc) are real scalars.
        init = dict(first=jnp.array(True), x=x0, u=jnp.zeros_like(b), itn=jnp.array(0))
        init.update(v=zeros_in, h=zeros_in, hbar=zeros_in, istop=jnp.array(0))
        for value, names in [
            (0.0, "alpha beta zetabar alphabar sbar betadd betad tautildeold"),
            (0.0, "thetatilde zeta delta normA2 maxrbar normr normAr"),
            (1.0, "rho rhobar cbar rhodold condA"),
            (jnp.finfo(rdtype).max, "minrbar"),
        ]:
            init.update({name: real(value) for name in names.split()})
        init["finite"] = all_finite(b)

        def cond_fun(s):
            return s["finite"] & (s["first"] | (s["istop"] == 0))

        def body_fun(s):
            first = s["first"]
            # The A slot: `b - A x0` on the first pass, else `A v - alpha u`.
            out = mv(jnp.where(first, s["x"], s["v"]))
            u = jnp.where(first, b - out, out - s["alpha"].astype(dtype) * s["u"])
            beta = norm_out(u)
            u = u / jnp.where(beta == 0, 1, beta).astype(dtype)
            # The A^H slot: `A^H u` on the first pass, else `A^H u - beta v`.
            w = rmv(u)
            v = jnp.where(first, w, w - beta.astype(dtype) * s["v"])
            alpha = norm_in(v)
            v = v / jnp.where(alpha == 0, 1, alpha).astype(dtype)
            # Where lineax skips the A^H slot (beta == 0), keep alpha and v (on the
            # first pass these are lineax's alpha = 0, v = 0).
            alpha = jnp.where(beta == 0, s["alpha"], alpha)
            v = jnp.where(beta == 0, s["v"], v)

            # The first pass: lineax's initialisation. beta == 0 means x exactly
            # solves the well posed problem; alpha == 0 means x exactly solves the
            # least squares problem: stop at once, avoiding division by zero.
            istop = jnp.where(beta == 0, 1, jnp.where(alpha == 0, 2, 0))
            start = dict(s, first=jnp.array(False), u=u, v=v, h=v, alpha=alpha)
            start.update(beta=beta, zetabar=alpha * beta, alphabar=alpha)
            start.update(betadd=beta, normA2=alpha**2, istop=istop)
            start.update(normr=beta, normAr=alpha * beta)
            # A later pass: one LSMR step, with beta = beta_{k+1}, alpha = alpha_{k+1}.
            step = dict(s, u=u, v=v, alpha=alpha, beta=beta)
            step = self._step(step, damp, normb, norm_in, max_steps)
            return jtu.tree_map(
                lambda a, c: jnp.where(first, a, c).astype(a.dtype), start, step
            )

        s = lax.while_loop(cond_fun, body_fun, init)

        stats = dict(num_steps=s["itn"], istop=s["istop"], norm_r=s["normr"])
        stats.update(norm_Ar=s["normAr"], norm_A=jnp.sqrt(s["normA2"]))
        stats.update(cond_A=s["condA"], norm_x=norm_in(s["x"]))
        hit = s["itn"] == max_steps
        if self.max_steps is None:
            result = lx.RESULTS.where(hit, lx.RESULTS.singular, lx.RESULTS.successful)
        elif self.has_scale:
            result = lx.RESULTS.where(
                hit, lx.RESULTS.max_steps_reached, lx.RESULTS.successful
            )
        else:
            result = lx.RESULTS.successful
        result = lx.RESULTS.where(s["istop"] < 3, lx.RESULTS.successful, result)
        result = lx.RESULTS.where(s["istop"] == 3, lx.RESULTS.conlim, result)
        result = finish_result(result, s["finite"])
        return in_flat.unravel(s["x"]), result, stats

    def _flat_norm(self, flat: Flattener) -> Callable[[Array], Array]:
        """`self.norm` of a flat vector, seen with the structure's shapes in the
        working dtype (so that no imaginary part is dropped)."""
        leaves, treedef = flat.structure
        promoted = [jax.ShapeDtypeStruct(x.shape, flat.dtype) for x in leaves]
        view = Flattener(jtu.tree_unflatten(treedef, promoted), flat.dtype)
        real = jnp.finfo(flat.dtype).dtype
        return lambda x: jnp.asarray(self.norm(view.unravel(x)), real)

    def _step(self, st: dict[str, Array], damp, normb, norm_in, max_steps):
        """lineax's LSMR loop body after the bidiagonalisation: rotations, updates
        of `h`, `hbar`, `x`, the estimates of `||r||`, `||A||`, `cond(A)`, and the
        stopping rules."""
        st["itn"] = st["itn"] + 1
        dtype = st["x"].dtype
        # Construct rotation Qhat_{k,2k+1}.
        chat, shat, alphahat = self._givens(st["alphabar"], damp)
        # Use a plane rotation (Q_i) to turn B_i to R_i
        rhoold = st["rho"]
        c, s, st["rho"] = self._givens(alphahat, st["beta"])
        thetanew = s * st["alpha"]
        st["alphabar"] = c * st["alpha"]
        # Use a plane rotation (Qbar_i) to turn R_i^T to R_i^bar
        rhobarold = st["rhobar"]
        zetaold = st["zeta"]
        thetabar = st["sbar"] * st["rho"]
        rhotemp = st["cbar"] * st["rho"]
        st["cbar"], st["sbar"], st["rhobar"] = self._givens(rhotemp, thetanew)
        st["zeta"] = st["cbar"] * st["zetabar"]
        st["zetabar"] = -st["sbar"] * st["zetabar"]
        # Update h, h_hat, x.
        scale = -(thetabar * st["rho"] / (rhoold * rhobarold))
        st["hbar"] = st["hbar"] * scale.astype(dtype) + st["h"]
        step = st["zeta"] / (st["rho"] * st["rhobar"])
        st["x"] = st["x"] + step.astype(dtype) * st["hbar"]
        st["h"] = st["h"] * -(thetanew / st["rho"]).astype(dtype) + st["v"]
        # Estimate of ||r||.
        # Apply rotation Qhat_{k,2k+1}.
        betaacute = chat * st["betadd"]
        betacheck = -shat * st["betadd"]
        # Apply rotation Q_{k,k+1}.
        betahat = c * betaacute
        st["betadd"] = -s * betaacute
        # Apply rotation Qtilde_{k-1}.
        # betad = betad_{k-1} here.
        thetatildeold = st["thetatilde"]
        ctildeold, stildeold, rhotildeold = self._givens(st["rhodold"], thetabar)
        st["thetatilde"] = stildeold * st["rhobar"]
        st["rhodold"] = ctildeold * st["rhobar"]
        st["betad"] = -stildeold * st["betad"] + ctildeold * betahat
        # betad   = betad_k here.
        # rhodold = rhod_k  here.
        st["tautildeold"] = (zetaold - thetatildeold * st["tautildeold"]) / rhotildeold
        taud = (st["zeta"] - st["thetatilde"] * st["tautildeold"]) / st["rhodold"]
        st["delta"] = st["delta"] + betacheck**2
        st["normr"] = jnp.sqrt(
            st["delta"] + (st["betad"] - taud) ** 2 + st["betadd"] ** 2
        )
        # Estimate ||A||.
        st["normA2"] = st["normA2"] + st["beta"] ** 2
        normA = jnp.sqrt(st["normA2"])
        st["normA2"] = st["normA2"] + st["alpha"] ** 2
        # Estimate cond(A).
        st["maxrbar"] = jnp.maximum(st["maxrbar"], rhobarold)
        st["minrbar"] = jnp.where(
            st["itn"] > 1, jnp.minimum(st["minrbar"], rhobarold), st["minrbar"]
        )
        st["condA"] = jnp.maximum(st["maxrbar"], rhotemp) / jnp.minimum(
            st["minrbar"], rhotemp
        )
        # Compute norms for convergence testing.
        st["normAr"] = jnp.abs(st["zetabar"])
        well_posed_tol = self.atol + self.rtol * (normA * norm_in(st["x"]) + normb)
        least_squares_tol = self.atol + self.rtol * (normA * st["normr"])
        # maxiter exceeded; cond(A) seems to be greater than conlim; x solves the
        # least-squares problem, or A x = b, according to atol and rtol.
        istop = jnp.where(st["itn"] >= max_steps, 4, st["istop"])
        istop = jnp.where(st["condA"] > self.conlim, 3, istop)
        istop = jnp.where(st["normAr"] < least_squares_tol, 2, istop)
        st["istop"] = jnp.where(st["normr"] < well_posed_tol, 1, istop)
        return st

    def _givens(self, a, b):
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

        def b_gt_a(a, b):
            tau = a / jnp.where(b == 0.0, 1.0, b)
            s = jnp.sign(b) / jnp.sqrt(1.0 + tau**2)
            c = s * tau
            r = b / jnp.where(s == 0.0, 1.0, s)
            return c, s, r

        def a_ge_b(a, b):
            tau = b / jnp.where(a == 0.0, 1.0, a)
            c = jnp.sign(a) / jnp.sqrt(1.0 + tau**2)
            s = c * tau
            r = a / jnp.where(c == 0.0, 1.0, c)
            return c, s, r

        def either_zero(a, b):
            return lax.cond(b == 0.0, bzero, azero, a, b)

        def both_nonzero(a, b):
            return lax.cond(jnp.abs(b) > jnp.abs(a), b_gt_a, a_ge_b, a, b)

        return lax.cond((a == 0.0) | (b == 0.0), either_zero, both_nonzero, a, b)

    # `transpose` and `conj` are the base class's (LSMR takes no preconditioner).

    def assume_full_rank(self):
        return False


LSMR.__init__.__doc__ = r"""**Arguments:**

- `rtol`: Relative tolerance for terminating solve.
- `atol`: Absolute tolerance for terminating solve.
- `norm`: The norm to use when computing whether the error falls within the tolerance.
    Defaults to the two norm.
- `max_steps`: The maximum number of iterations to run the solver for. If more steps
    than this are required, then the solve is halted with a failure. Defaults to ten
    times the smaller dimension of the operator, as lineax.
- `conlim`: The solver terminates if an estimate of cond(A) exceeds conlim. For
    compatible systems Ax = b, conlim could be as large as 1.0e+12 (say). For
    least-squares problems, conlim should be less than 1.0e+8. Maximum precision can
    be obtained by setting atol = rtol = 0, conlim = np.inf, but the number of
    iterations may then be excessive. Default is 1e8.
"""
