"""LSMR with one `mv` call site and one transpose `mv` call site.

Ported from lineax's LSMR, whose implementation is adapted from SciPy, under
SciPy's BSD license: its copyright notice, conditions and disclaimer are in
`SCIPY_LICENSE.txt` in this folder."""

import functools as ft
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, TypeAlias

import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import Array, Bool, PyTree, Real, Scalar
from lineax.internal import two_norm

from ...operators._sharding import explicit_sharding
from ...policies.calls._recorder import own_code
from ..skeleton._flat_vectors import (
    binary_scale,
    flat_mv,
    Flattener,
    keep_conj,
    keep_linearise,
    preconditioner_and_y0,
    structure_mesh,
    two_norm as flat_two_norm,
)
from ..skeleton._linear_system import in_user_units, plain_system, System
from ..skeleton._loop_results import finish_result
from ..skeleton._one_site_solver import AbstractOneSiteSolver
from ._lsmr_step import Loop, lsmr_step


_LSMRState: TypeAlias = lx.AbstractLinearOperator


class _Constants(NamedTuple):
    """What LSMR's loop reads besides its state: the `system` (its `apply` the `A`
    slot), the `A^H` slot `rmv`, the norms of vectors of the input and output
    spaces and of the solution for an iterate, the damping factor `damp` and the
    bound `max_steps` on the steps."""

    system: System
    rmv: Callable[[Array], Array]
    norm_in: Callable[[Array], Array]
    norm_out: Callable[[Array], Array]
    norm_x: Callable[[Array], Array]
    damp: Real[Array, ""]
    max_steps: int


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

    As the inner solver of [`lineax_dispatch.Normal`][] it runs on the normal
    equations `A^H A x = A^H b`, whose operator is its own adjoint: both slots
    apply it, so `A` and `A^H` are each written twice.

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

    takes_preconditioner: ClassVar[bool] = False

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
        with structure_mesh(state):
            return self._compute(state, vector, options)

    def _compute(
        self, operator: _LSMRState, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        _, y0 = preconditioner_and_y0(
            operator, vector, options, allow_preconditioner=False, solver_name="LSMR"
        )
        system, x0 = plain_system(operator, vector, y0)
        out_flat = Flattener(operator.out_structure(), system.flat.dtype)
        # Each called once, in the loop body. (Transposing a FunctionLinearOperator
        # traces its function once, here.)
        rmv = flat_mv(keep_conj(operator).transpose(), out_flat, system.flat)
        with own_code():
            solver = self.in_units(system.unit)
            run = solver._run  # pyright: ignore[reportAttributeAccessIssue]
            x, result, stats = run(system, rmv, out_flat, x0)
        # The system's right-hand side is the user's divided by `unit`.
        unit = system.unit
        if unit is not None:
            x = in_user_units(x, unit)
            for name in ("norm_r", "norm_Ar", "norm_x"):
                stats[name] = stats[name] * unit
        return system.flat.unravel(x), result, stats

    def solve_system(
        self, system: System, precond: Callable[[Array], Array], y0: Array
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """Runs LSMR on `system` from `y0` (flat), for a system whose operator is its
        own adjoint (as `Normal`'s): the adjoint slot applies it too. `precond` is
        the identity (LSMR takes no preconditioner)."""
        del precond
        rmv = lambda u: system.apply(u, jnp.array(False))  # noqa: E731
        return self._run(system, rmv, system.flat, y0)

    def _run(
        self,
        system: System,
        rmv: Callable[[Array], Array],
        out_flat: Flattener,
        x0: Array,
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """The LSMR loop on `system` (`A` through `system.apply`, `A^H` through
        `rmv`, from `system.flat` to `out_flat`) from `x0`."""
        in_flat = system.flat
        rdtype = jnp.finfo(in_flat.dtype).dtype
        damp = jnp.zeros((), rdtype)  # damp is not supported at this time, as lineax.
        norm_in = self._flat_norm(in_flat)
        c = _Constants(
            system=system,
            rmv=rmv,
            norm_in=norm_in,
            norm_out=self._flat_norm(out_flat),
            norm_x=lambda x: norm_in(system.total(x)),
            damp=damp,
            max_steps=self._resolve_lsmr_max_steps(in_flat, out_flat),
        )
        s = lax.while_loop(
            _continues, ft.partial(self._pass, c), self._init_loop(c, out_flat, x0)
        )
        stats = dict(num_steps=s.itn, istop=s.istop, norm_r=s.normr)
        stats.update(norm_Ar=s.normAr, norm_A=s.normA)
        stats.update(cond_A=s.condA, norm_x=c.norm_x(s.x))
        result = self.steps_result(s.istop == 4)
        result = lx.RESULTS.where(s.istop < 3, lx.RESULTS.successful, result)
        result = lx.RESULTS.where(s.istop == 3, lx.RESULTS.conlim, result)
        result = finish_result(result, s.finite)
        return system.total(s.x), result, stats

    def _resolve_lsmr_max_steps(self, in_flat: Flattener, out_flat: Flattener) -> int:
        """`max_steps`, or lineax's default for LSMR."""
        # As lineax: ten times the number of singular values, avoiding overflow.
        rdtype = jnp.finfo(in_flat.dtype).dtype
        int_max = jnp.iinfo(jnp.dtype(f"int{rdtype.itemsize * 8}")).max
        min_dim = min(in_flat.size, out_flat.size)
        default_steps = int_max if min_dim > int_max / 10 else 10 * min_dim
        return default_steps if self.max_steps is None else self.max_steps

    def _init_loop(self, c: _Constants, out_flat: Flattener, x0: Array) -> Loop:
        """The loop's state before its first pass, which starts from `x0`."""
        dtype = c.system.flat.dtype
        rdtype = jnp.finfo(dtype).dtype
        rhs_like = jax.ShapeDtypeStruct((out_flat.size,), dtype)
        normb, finite = c.system.scale_of_rhs(c.norm_out, rhs_like)
        real = lambda value: jnp.asarray(value, rdtype)  # noqa: E731
        zeros_in = jnp.zeros_like(x0)
        scalars = {}
        for value, names in [
            (0.0, "alpha beta zetabar alphabar sbar betadd betad tautildeold"),
            (0.0, "thetatilde zeta delta normA maxrbar normr normAr"),
            (1.0, "rho rhobar cbar rhodold condA"),
            (jnp.finfo(rdtype).max, "minrbar"),
        ]:
            scalars.update({name: real(value) for name in names.split()})
        return Loop(
            first=jnp.array(True),
            x=x0,
            u=out_flat.zeros(),
            v=zeros_in,
            h=zeros_in,
            hbar=zeros_in,
            itn=jnp.array(0),
            istop=jnp.array(0),
            normb=normb,
            finite=finite,
            **scalars,
        )

    def _pass(self, c: _Constants, s: Loop) -> Loop:
        """The loop body: the bidiagonalisation's pass through both slots
        (`_bidiagonalise`), then lineax's initialisation on the first pass, else
        one LSMR step."""
        first = s.first
        u, v, alpha, beta, normb, finite = _bidiagonalise(c, s)
        # The first pass: lineax's initialisation. beta == 0 means x exactly
        # solves the well posed problem; alpha == 0 means x exactly solves the
        # least squares problem: stop at once, avoiding division by zero.
        istop = jnp.where(beta == 0, 1, jnp.where(alpha == 0, 2, 0))
        if c.max_steps == 0:
            # No step allowed: x0 unless it already solves (lineax took a
            # step and reported success with it).
            istop = jnp.where(istop == 0, 4, istop)
        start = s._replace(
            first=jnp.array(False),
            u=u,
            v=v,
            h=v,
            alpha=alpha,
            beta=beta,
            zetabar=alpha * beta,
            alphabar=alpha,
            betadd=beta,
            normA=alpha,
            istop=istop,
            normr=beta,
            normAr=alpha * beta,
            normb=normb,
            finite=finite,
        )
        # A later pass: one LSMR step, with beta = beta_{k+1}, alpha = alpha_{k+1}.
        step = lsmr_step(
            s._replace(u=u, v=v, alpha=alpha, beta=beta),
            c.damp,
            c.norm_x,
            c.max_steps,
            (self.atol, self.rtol, self.conlim),
        )
        return jtu.tree_map(
            lambda a, b: jnp.where(first, a, b).astype(a.dtype), start, step
        )

    def _flat_norm(self, flat: Flattener) -> Callable[[Array], Array]:
        """`self.norm` of a flat vector, seen with the structure's shapes in the
        working dtype (so that no imaginary part is dropped)."""
        leaves, treedef = flat.structure
        real = jnp.finfo(flat.dtype).dtype
        if self.norm is two_norm and any(explicit_sharding(x) for x in leaves):
            # lineax's two norm is a `jnp.dot`, which JAX will not reduce over an
            # Explicit mesh axis without being told where the sum goes.
            measure = flat_two_norm
        else:
            promoted = [jax.ShapeDtypeStruct(x.shape, flat.dtype) for x in leaves]
            view = Flattener(jtu.tree_unflatten(treedef, promoted), flat.dtype)
            measure = lambda x: self.norm(view.unravel(x))  # noqa: E731

        def norm(x: Array) -> Array:
            # Of `x` divided by a power of two near its largest entry, multiplied
            # back: a two norm squares the entries, which overflow (underflow)
            # in float32 from about 1e19 (below 1e-19).
            unit = binary_scale(x)
            return jnp.asarray(measure(x / unit.astype(x.dtype)), real) * unit

        return norm

    # `transpose` and `conj` are the base class's (LSMR takes no preconditioner).

    def assume_full_rank(self):
        return False


def _continues(s: Loop) -> Bool[Array, ""]:
    """The loop's condition: a finite right-hand side, and the first pass or no
    reason to stop yet."""
    return s.finite & (s.first | (s.istop == 0))


def _bidiagonalise(
    c: _Constants, s: Loop
) -> tuple[Array, Array, Array, Array, Array, Array]:
    """The pass through the `A` and `A^H` slots: the bidiagonalisation's next `u`,
    `v`, `alpha` and `beta` (on the first pass, its first), and the right-hand
    side's `(normb, finite)`."""
    first = s.first
    dtype = c.system.flat.dtype
    # The A slot: `b - A x0` on the first pass, else `A v - alpha u`.
    out = c.system.apply(jnp.where(first, s.x, s.v), first)
    u = jnp.where(first, out, out - s.alpha.astype(dtype) * s.u)
    normb, finite = c.system.from_first_residual(
        first, out, c.norm_out, (s.normb, s.finite)
    )
    beta = c.norm_out(u)
    u = u / jnp.where(beta == 0, 1, beta).astype(dtype)
    # The A^H slot: `A^H u` on the first pass, else `A^H u - beta v`.
    w = c.rmv(u)
    v = jnp.where(first, w, w - beta.astype(dtype) * s.v)
    alpha = c.norm_in(v)
    v = v / jnp.where(alpha == 0, 1, alpha).astype(dtype)
    # Where lineax skips the A^H slot (beta == 0), keep alpha and v (on the
    # first pass these are lineax's alpha = 0, v = 0).
    alpha = jnp.where(beta == 0, s.alpha, alpha)
    v = jnp.where(beta == 0, s.v, v)
    return u, v, alpha, beta, normb, finite


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
