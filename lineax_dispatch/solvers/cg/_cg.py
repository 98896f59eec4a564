"""Conjugate gradients with one `mv` call site."""

import functools as ft
from collections.abc import Callable
from typing import Any, ClassVar, TypeAlias

import equinox as eqx
import equinox.internal as eqxi
import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
from jaxtyping import Array, PyTree, Scalar
from lineax.internal import max_norm

from ..._reductions import any_nonzero
from ..._validate import check_square
from ..skeleton._flat_vectors import (
    both,
    computed_once,
    conj_options,
    constant,
    keep_conj,
    keep_linearise,
    negated,
    real_part,
    select,
    transpose_options,
)
from ..skeleton._linear_system import System, UPDATE_IN_COND
from ..skeleton._one_site_solver import AbstractOneSiteSolver
from ..skeleton._packed_loop import packed_while_loop
from ._inline_layout import inline_solve, InlineLoop
from ._layout_choice import cg_choices
from ._loop_rules import (
    continues,
    CONVERGED,
    CURVATURE_NEGATIVE,
    curvature_test,
    CURVATURE_ZERO,
    Loop,
    next_mode,
    Outcome,
    RESIDUAL,
    STAGNATED,
    STEP,
)


LAYOUTS = ("auto", "one_site", "inline")
UPDATES = ("auto", "select", "cond")


_CGState: TypeAlias = tuple[lx.AbstractLinearOperator, eqxi.Static, eqxi.Static]


class CG(AbstractOneSiteSolver[_CGState]):
    """Conjugate gradient solver for positive or negative (semi)definite operators,
    with the operator's `mv` written once in the compiled program where a copy of
    it is expensive to compile.

    A drop-in for [`lineax.CG`][]: the same fields, defaults and `options`, the same
    iterates, and `stats["num_steps"]` counting the same steps. lineax's CG writes
    `mv` three times (initial residual, loop body, the periodic residual refresh);
    this one has a single application slot in its loop, fed with the search
    direction on an ordinary step and with the current iterate on a residual step
    (the first step and every `stabilise_every`-th). Each refresh therefore costs
    one extra pass through the loop rather than a second copy of `mv`. A step whose
    updated residual passes the stopping test is followed by such a pass, and the
    solve stops only if the true residual passes it too, to within twice the
    tolerance (`b - A y` computed in the dtype carries rounding of the
    tolerance's order where the tolerance is near the dtype's precision): a
    reported success is one of the true residual, where lineax's test reads the
    updated one, which can shrink below the dtype's precision. After a failed
    check CG goes on from the true residual; from then on a residual pass (a check
    or a refresh) that fails the test without having halved the true residual
    since the failed pass before is a stall, and `stagnation_iters` stalls in a
    row stop the solve with `stagnation` (the tolerance is below what the dtype
    can reach on this system), where going on to `max_steps` gains nothing.
    `check_residual=False` takes lineax's rule instead: the updated residual's
    test stands.

    Under `jax.grad` the backward solve (with the transposed operator) uses this
    same solver, its tolerances and these settings. Where it reports
    `stagnation`, the tolerance is out of the dtype's reach on the transposed
    system: loosen `rtol`/`atol`, solve in float64, allow more stalls
    (`stagnation_iters`), or accept the updated residual as lineax does
    (`check_residual=False`). (lineax's message for `stagnation` also names
    `restart`, a field of GMRES.)

    The step's curvature test compares `p^H A p` with the largest curvature per
    unit of `<M r, r>` seen so far, rather than with `<M r, r>` itself as lineax
    does: its verdict does not change when the operator, the right-hand side or
    the preconditioner is scaled. The right-hand side is divided by a power of two
    near its largest entry before the loop (and the solution multiplied back):
    the inner products neither overflow nor underflow for a `b` whose squared
    norm would.

    Each of those residual passes is a whole iteration of the loop. Where a copy of
    `mv` compiles cheaply and the solve runs many times, the inline layout
    (`layout="inline"`) is faster: `mv` is written where lineax's CG writes it
    (before the loop, in the step, and in a `lax.cond` of the step for `b - A y`,
    taken at each refresh and wherever the updated residual passes the test), with
    the same iterates, checks and results as the one-site loop in fewer passes.
    `layout="auto"` (the default) takes it where the passes it saves over the
    solve's expected runs (the operator's [`lineax_dispatch.Auto`][] `runs`, else
    `Auto`'s default) take longer than its two further copies of `mv` take to
    compile, as the cost model estimates them; else the one-site loop. A lineax
    operator holding a function of the user's, whose cost is not known without
    tracing the function again, stays on one site. From 4096 unknowns either
    loop updates its residual in a `lax.cond` where that pays for its compile
    over the expected runs (`residual_update`). Both choices are the CPU's:
    on another backend `"auto"` takes the one-site loop and the update as one
    expression (a `lax.cond` in every step costs an accelerator more than the
    passes the inline layout saves).

    `options` (as passed to `lx.linear_solve(..., options=...)`):

    - `preconditioner`: a positive definite linear operator, applied on the left
        (the termination test uses the unpreconditioned residual).
        Defaults to the identity.
    - `y0`: the initial estimate of the solution. Defaults to zeros.

    Results: `max_steps_reached` (or `singular` when `max_steps=None`, as lineax),
    `stagnation` when the true residual misses the tolerance and stops shrinking,
    `breakdown` when a direction of negative curvature shows the operator is not
    definite, `singular` when the curvature vanishes, `nonfinite_input`.

    !!! Example

        ```python
        matrix = jnp.array([[4.0, 1.0], [1.0, 3.0]])
        op = lxd.MatrixLinearOperator(matrix, lx.positive_semidefinite_tag)
        sol = lx.linear_solve(op, jnp.array([1.0, 2.0]), lxd.CG(rtol=1e-6, atol=1e-6))
        ```
    """

    psd_preconditioner: ClassVar[bool] = True

    rtol: float
    atol: float
    norm: Callable[[PyTree], Scalar] = max_norm
    stabilise_every: int | None = 10
    max_steps: int | None = None
    layout: str = "auto"
    residual_update: str = "auto"
    stagnation_iters: int | None = 1
    check_residual: bool = True

    def __check_init__(self):
        for name, allowed in (("layout", LAYOUTS), ("residual_update", UPDATES)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"`CG(..., {name}=...)` must be one of {allowed}, got "
                    f"{getattr(self, name)!r}."
                )
        if self.stagnation_iters is not None and (
            isinstance(self.stagnation_iters, bool)
            or not isinstance(self.stagnation_iters, int)
            or self.stagnation_iters < 1
        ):
            raise ValueError(
                "`CG(..., stagnation_iters=...)` must be a positive int or None, got "
                f"{self.stagnation_iters!r}."
            )
        if self.stabilise_every is not None and (
            not isinstance(self.stabilise_every, int) or self.stabilise_every < 1
        ):
            raise ValueError(
                "`CG(..., stabilise_every=...)` must be a positive int or None, got "
                f"{self.stabilise_every!r}."
            )

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        check_square(operator, "CG")
        is_nsd = lx.is_negative_semidefinite(operator)
        if not (lx.is_positive_semidefinite(operator) | is_nsd):
            raise ValueError(
                "`CG` needs an operator tagged positive or negative semidefinite "
                "(e.g. `lx.positive_semidefinite_tag`); got one with neither tag. "
                "Use `MINRES` for symmetric indefinite operators."
            )
        given = operator
        if is_nsd:
            operator = -operator
        prepared = keep_linearise(self.prepare(operator))
        choices = cg_choices(self, given, prepared, options)
        return prepared, eqxi.Static(is_nsd), eqxi.Static(choices)

    def compute(
        self, state: _CGState, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        operator, is_nsd, choices = state
        layout, update = choices.value[:2]
        solver = self
        if (layout, update) != (self.layout, self.residual_update):
            solver = eqx.tree_at(
                lambda s: (s.layout, s.residual_update), self, (layout, update)
            )
        y, result, stats, flat = solver.solve_square(operator, vector, options)
        if is_nsd.value:
            y = -y
        return flat.unravel(y), result, stats

    def solve_system(
        self, system: System, precond: Callable[[Array], Array], y0: Array
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """Runs CG on `system` from `y0` (flat). Returns the flat solution (with the
        system's offset added), the result and the stats."""
        size = system.flat.size
        max_steps = self.resolve_max_steps(size)
        rcond = 2 * jnp.finfo(system.flat.dtype).eps * max(size, 1)
        if self.layout == "inline" and system.rhs is not None:
            s = inline_solve(self, system, precond, y0, rcond, max_steps)
            return self._loop_end(system, s, max_steps)
        s = packed_while_loop(
            ft.partial(continues, max_steps),
            ft.partial(self._pass, system, precond, rcond),
            self._init_loop(system, y0),
        )
        return self._loop_end(system, s, max_steps)

    def in_cond(self, r: Array) -> bool:
        """Whether the loop updates the residual in a `lax.cond` (see
        `residual_update`; `"auto"` not decided, as in `Normal`'s inner solve:
        from `UPDATE_IN_COND` unknowns on)."""
        if self.residual_update == "auto":
            return r.size >= UPDATE_IN_COND
        return self.residual_update == "cond"

    def _init_loop(self, system: System, y0: Array) -> Loop:
        """The loop's state before its first pass, a residual pass at `y0`."""
        dtype = system.flat.dtype
        zero = jnp.zeros((), dtype)
        b_scale, _ = system.scale_of_rhs(self.b_scale(system), y0)
        return Loop(
            y=y0,
            r=jnp.zeros_like(y0),
            p=jnp.zeros_like(y0),
            v=y0,
            diff=jnp.full_like(y0, jnp.inf),
            gamma=zero,
            step=jnp.array(0),
            mode=jnp.asarray(RESIDUAL),
            checked=jnp.full((), jnp.inf, jnp.finfo(dtype).dtype),
            b_scale=b_scale,
            stiffness=jnp.zeros((), jnp.finfo(dtype).dtype),
            stalls=jnp.array(0, jnp.int32),
        )

    def _pass(
        self,
        system: System,
        precond: Callable[[Array], Array],
        rcond: float,
        s: Loop,
    ) -> Loop:
        """The loop body: one pass through the `mv` slot (`_step`), the
        preconditioned residual and `gamma`, then the next search direction and
        the next pass (`next_mode`)."""
        out, new, outcome = self._step(system, rcond, s)
        # Only the first pass starts with `gamma == 0`: a later pass runs on a
        # positive `gamma`, or refreshes the residual keeping such a one.
        first = lax.eq(s.gamma, constant(0, s.gamma))
        b_scale, _ = system.from_first_residual(
            first, out, self.b_scale(system), (s.b_scale, jnp.array(True))
        )
        z = precond(new.r)
        new = new._replace(b_scale=b_scale)
        # The stopping test and `gamma` in one reduction.
        measure, gamma_new = self.measure_and_dot(system, new, z)
        beta = select(first, 0, lax.div(gamma_new, select(first, 1, s.gamma)))
        mode, failed, stalls = next_mode(
            s.mode,
            s.checked,
            s.stalls,
            outcome,
            measure,
            self.has_scale,
            self.stagnation_iters,
            self.check_residual,
        )
        mode = computed_once(mode, s.step)
        # (Read from `mode`, which the loop carries anyway, rather than from
        # `refresh` and `bad`: one scalar kernel fewer.)
        advance = lax.eq(mode, STEP)
        p_new = select(advance, lax.add(z, lax.mul(beta, s.p)), s.p)
        measure = lax.convert_element_type(measure, s.checked.dtype)
        return new._replace(
            p=p_new,
            v=select(lax.gt(mode, STEP), new.y, p_new),
            gamma=select(advance, gamma_new, s.gamma),
            mode=mode,
            checked=select(failed, measure, s.checked),
            stalls=stalls,
        )

    def _step(
        self, system: System, rcond: float, s: Loop
    ) -> tuple[Array, Loop, Outcome]:
        """The pass through the `mv` slot and the step it takes.

        **Returns:**

        The slot's output `out` (the residual on a residual pass), `s` with the
        iterate, residual, update and step count after the pass, and how the pass
        went (`Outcome`).
        """
        pending = lax.gt(s.mode, STEP)
        p, gamma = s.p, s.gamma
        # The one application slot: the iterate on a residual step, else the
        # search direction. `out` is then the residual; `product` is `A p` on
        # an ordinary step (where it is read), the bare output of `mv`.
        out, product = system.apply_split(s.v, pending)
        ok, code, alpha, stiffness = curvature_test(
            p, product, gamma, rcond, s.stiffness
        )
        stepping = negated(pending)
        step_taken = both(stepping, ok)
        bad = both(stepping, negated(ok))
        diff = select(step_taken, lax.mul(alpha, p), s.diff)
        y = select(step_taken, lax.add(s.y, diff), s.y)
        r = system.updated_residual(
            pending, out, product, s.r, alpha, step_taken, self.in_cond(s.r)
        )
        step = lax.add(s.step, lax.convert_element_type(step_taken, s.step.dtype))
        if self.stabilise_every is None:
            refresh = jnp.array(False)
        else:
            every = constant(self.stabilise_every, step)
            refresh = both(step_taken, lax.eq(lax.rem(step, every), constant(0, step)))
        stiffness = select(step_taken, stiffness, s.stiffness)
        new = s._replace(y=y, r=r, diff=diff, step=step, stiffness=stiffness)
        return out, new, Outcome(pending, step_taken, bad, code, refresh)

    def _loop_end(
        self, system: System, s: Loop | InlineLoop, max_steps: int
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """The solution, result and stats from the loop's final state `s`."""
        # `gamma = <M r, r>` is that of the final residual, or of the updated one
        # before a residual pass that passed the test (so finite where that is):
        # every other pass that changes `r` but not `gamma` is followed by one
        # that does. It is non-finite where
        # the right-hand side or the operator is (a non-finite entry of `r` makes a
        # term of the sum inf or NaN), so it stands for the check of both. (A
        # non-finite iterate with a finite residual is left to `lx.linear_solve`'s
        # own check of the solution.) A loop that stopped on a `gamma` of 0
        # short of the test solved the system exactly where the residual is 0
        # (`b = 0`); elsewhere `gamma` vanished (it underflowed, or the
        # preconditioner annihilates the residual), which is no solution.
        vanished = (s.mode == STEP) & (real_part(s.gamma) <= 0) & any_nonzero(s.r)
        return self.loop_end(
            system,
            s,
            max_steps,
            s.mode != CONVERGED,
            finite_input=jnp.isfinite(s.gamma),
            codes=(
                (s.mode == CURVATURE_ZERO, lx.RESULTS.singular),
                (s.mode == STAGNATED, lx.RESULTS.stagnation),
                (vanished, lx.RESULTS.singular),
            ),
            breakdown=s.mode == CURVATURE_NEGATIVE,
        )

    def transpose(self, state: _CGState, options: dict[str, Any]):
        operator, is_nsd, layout = state
        return (operator.transpose(), is_nsd, layout), transpose_options(options)

    def conj(self, state: _CGState, options: dict[str, Any]):
        operator, is_nsd, layout = state
        return (keep_conj(operator), is_nsd, layout), conj_options(options)


CG.__init__.__doc__ = r"""**Arguments:**

- `rtol`: relative tolerance for terminating the solve.
- `atol`: absolute tolerance for terminating the solve.
- `norm`: the norm in which the scaled residual and update are measured. Defaults to
    the max norm.
- `stabilise_every`: every this many steps the residual is recomputed as `b - A y`
    (through the same `mv` slot, or the inline layout's own copy) rather than updated, to correct rounding drift.
    `None` never recomputes it. Defaults to 10.
- `max_steps`: the maximum number of steps. Defaults to ten times the number of
    unknowns, as lineax (then hitting it reports `singular`).
- `layout`: `"one_site"` (`mv` written once: refreshes and checks are passes of
    the loop), `"inline"` (`mv` written three times, as lineax's CG: refreshes and
    checks inside the steps) or `"auto"` (the default: whichever the cost model
    estimates cheaper for this operator, see above). The normal equations of
    [`lineax_dispatch.Normal`][] are always solved on one site.
- `residual_update`: `"select"` (the update `r - alpha A p` as one expression),
    `"cond"` (in a `lax.cond` reading `A p` as computed: from 4096 unknowns XLA:CPU
    would otherwise compute the operator's elementwise operations a second time in
    the update, but it takes longer to compile) or `"auto"` (the default: the
    `cond` from 4096 unknowns where the solve's expected runs repay it).
- `stagnation_iters`: how many failed tests of the true residual in a row,
    from the first failed check on, that do not halve it stop the solve with
    `stagnation`. `None` never stops for stagnation (the solve goes on to
    `max_steps`). Defaults to 1.
- `check_residual`: whether a step whose updated residual passes the stopping test
    is confirmed on the true residual `b - A y` (`True`, the default), or accepted
    as lineax's CG accepts it (`False`).
"""
