"""CG's inline layout: its residual refreshes and checks inside its steps.

The one-site loop of `_cg.py` takes a pass of its own through its one `mv` slot for
the initial residual, every residual refresh and every check of the true residual:
a whole iteration of its loop (its vector updates, its stopping test, the loop's
round trip) beyond the `mv`. The inline layout writes `mv` where lineax's CG does:
the initial residual before the loop, the step, and `b - A y` in a `lax.cond` of
the step, taken at a refresh and wherever the updated residual passes the stopping
test (a check). The iterates, steps and results are the one-site loop's; only the
passes differ, and the compile: two more copies of `mv`.

`_layout_choice.py` weighs the two (`choose_layout`): the inline layout where
`runs` solves save more passes than its copies of `mv` cost to compile."""

import functools as ft
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox.internal as eqxi
import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Inexact, Int

from ..skeleton._flat_vectors import (
    both,
    branch_select,
    constant,
    dot,
    either,
    negated,
    real_part,
    select,
)
from ..skeleton._linear_system import System
from ..skeleton._packed_loop import packed_while_loop
from ._loop_rules import (
    CGSettings,
    CONVERGED,
    curvature_test,
    failed_tests,
    passed_true_test,
    STAGNATED,
    STEP,
)


class InlineLoop(NamedTuple):
    """The inline loop's state: iterate `y`, residual `r`, search direction `p`,
    last update `diff`, `gamma = <M r, r>`, the step count, `mode` (`STEP` while
    the loop goes on, else why it stopped) and `checked` (as in the one-site loop:
    the stopping test's measure at the last failed test of a true residual from
    the first failed check on, infinite before it) and `stiffness` (the largest
    `p^H A p / gamma` of the steps so far: see `curvature_test`)."""

    y: Inexact[Array, " n"]
    r: Inexact[Array, " n"]
    p: Inexact[Array, " n"]
    diff: Inexact[Array, " n"]
    gamma: Inexact[Array, ""]
    step: Int[Array, ""]
    mode: Int[Array, ""]
    checked: Array
    stiffness: Array
    stalls: Int[Array, ""]


class _Tested(NamedTuple):
    """What `test_measure` reads."""

    y: Array
    r: Array
    diff: Array
    b_scale: Array


def _updated(
    ok: Bool[Array, ""], r: Array, product: Array, alpha: Array, in_cond: bool
) -> Array:
    """`r - alpha A p` where the step was taken (`ok`), else `r`. Where `in_cond`,
    in a `lax.cond`, which reads `A p` as computed: as plain arithmetic, XLA:CPU
    fuses the operator's own operations into the update and computes them a
    second time there (see `System.updated_residual`)."""
    if not in_cond:
        return lax.sub(r, lax.mul(select(ok, alpha, 0), product))
    return lax.cond(ok, lambda r, w, a: r - a * w, lambda r, w, a: r, r, product, alpha)


class _Inline(NamedTuple):
    """What every step of the inline loop reads besides its state."""

    solver: CGSettings
    system: System
    precond: Callable[[Array], Array]
    rcond: Any
    b_scale: Array

    @property
    def fused(self) -> bool:
        """Whether the stopping test and `gamma` are one reduction
        (`measure_and_dot`): then both are taken wherever a residual is."""
        return self.solver.fused_test(self.system.flat.size)

    def measured(self, y: Array, r: Array, diff: Array) -> tuple[Array, ...]:
        """`(r, measure, z, gamma)` where `fused`, else `(r, measure)`: the
        residual `r`, the stopping test's measure, the preconditioned residual `z`
        and `gamma = <z, r>`."""
        tested = _Tested(y, r, diff, self.b_scale)
        if not self.fused:
            return r, self.solver.test_measure(self.system, tested)
        z = self.precond(r)
        m, gamma = self.solver.measure_and_dot(self.system, tested, z)
        return r, m, z, gamma

    def finished(self, *measured: Array) -> tuple[Array, ...]:
        """`(r, measure, z, gamma)` from what `measured` gave."""
        if len(measured) == 4:
            return measured
        r, m = measured
        z = self.precond(r)
        return r, m, z, dot(z, r)

    def true_residual(self, y, diff, *measured_and_recompute):
        # Under `vmap` the branch runs where any vector of the batch needs it:
        # the others keep their updated residual.
        *measured, recompute = measured_and_recompute
        true = self.system.apply(y, jnp.array(True))
        return self.measured(y, branch_select(recompute, true, measured[0]), diff)


def _kept(y, diff, *measured_and_recompute):
    return measured_and_recompute[:-1]


def _inline_step(c: _Inline, s: InlineLoop) -> InlineLoop:
    """The loop body: a step of CG, with `b - A y` where the step refreshes the
    residual or checks it."""
    solver = c.solver
    _, product = c.system.apply_split(s.p, jnp.array(False))
    ok, code, alpha, stiffness = curvature_test(
        s.p, product, s.gamma, c.rcond, s.stiffness
    )
    diff = select(ok, lax.mul(alpha, s.p), s.diff)
    y = select(ok, lax.add(s.y, diff), s.y)
    r = _updated(ok, s.r, product, alpha, solver.in_cond(s.r))
    measured = c.measured(y, r, diff)
    m = measured[1]
    # A check where the updated residual passes the test; a refresh every
    # `stabilise_every` steps. Either takes the true residual `b - A y`.
    test = both(ok, lax.le(m, constant(1, m))) if solver.has_scale else None
    passed = jnp.array(False) if test is None else test
    check = passed if solver.check_residual else jnp.array(False)
    recompute = check
    step = lax.add(s.step, lax.convert_element_type(ok, s.step.dtype))
    if solver.stabilise_every is not None:
        every = lax.rem(step, constant(solver.stabilise_every, step))
        recompute = either(recompute, both(ok, lax.eq(every, constant(0, step))))
    any_recompute = eqxi.nonbatchable(eqxi.unvmap_any(recompute))
    measured = lax.cond(
        any_recompute, c.true_residual, _kept, y, diff, *measured, recompute
    )
    r, m, z, gamma = c.finished(*measured)
    # As the one-site loop: the solve converges where a true residual passes the
    # test; from the first failed check on, every true residual that fails it
    # must have halved since the one before (else `stagnation`).
    accepted = passed_true_test(m, check, solver.has_scale)
    failed, stalls, stagnated = failed_tests(
        recompute,
        check,
        negated(accepted),
        m,
        s.checked,
        s.stalls,
        solver.stagnation_iters,
    )
    mode = lax.select(both(recompute, accepted), CONVERGED, STEP)
    if not solver.check_residual:
        # As lineax's CG: the updated residual's test stands, except at a
        # refresh, where the true residual's does.
        mode = lax.select(both(passed, negated(recompute)), CONVERGED, mode)
    mode = lax.select(ok, lax.select(stagnated, STAGNATED, mode), code)
    advance = lax.eq(mode, STEP)
    p = lax.add(z, lax.mul(lax.div(gamma, s.gamma), s.p))
    return InlineLoop(
        y=y,
        r=r,
        p=select(advance, p, s.p),
        diff=diff,
        gamma=select(advance, gamma, s.gamma),
        step=step,
        mode=mode,
        checked=select(failed, lax.convert_element_type(m, s.checked.dtype), s.checked),
        stiffness=stiffness,
        stalls=stalls,
    )


def inline_solve(
    solver: CGSettings,
    system: System,
    precond: Callable[[Array], Array],
    y0: Array,
    rcond: Any,
    max_steps: int,
) -> InlineLoop:
    """Runs CG on the plain `system` (its right-hand side known) from `y0`.

    **Arguments:**

    - `solver`: the CG solver (tolerances, norm, `stabilise_every`).
    - `system`: the system; `system.rhs` is not `None`.
    - `precond`: the preconditioner as a function of flat vectors.
    - `y0`: the flat initial estimate.
    - `rcond`: the curvature's relative threshold, as the one-site loop's.
    - `max_steps`: the bound on the steps.

    **Returns:**

    The loop's final state.
    """
    assert system.rhs is not None
    b_scale, _ = system.scale_of_rhs(solver.b_scale(system), y0)
    r0 = system.apply(y0, jnp.array(True))
    constants = _Inline(solver, system, precond, rcond, b_scale)
    diff0 = jnp.full_like(y0, jnp.inf)
    inf = jnp.full((), jnp.inf, jnp.finfo(y0.dtype).dtype)
    first = constants.measured(y0, r0, diff0) if constants.fused else (r0, inf)
    _, m0, z0, gamma0 = constants.finished(*first)
    # `checked` starts infinite (NaN where the first residual is, and the loop
    # does not run), read from the first measure `m0` (itself infinite): where
    # that comes with `gamma0` from one reduction, this keeps it live, so that
    # the reduction computes `gamma0` as every later `gamma` is computed, and as
    # the one-site loop's first pass does. (XLA would simplify a variadic
    # reduction with an unused output to a plain one, summing in another order.)
    init = InlineLoop(
        y=y0,
        r=r0,
        p=z0,
        diff=diff0,
        gamma=gamma0,
        step=jnp.array(0),
        mode=jnp.asarray(STEP),
        checked=jnp.maximum(m0, jnp.inf),
        stiffness=jnp.zeros((), inf.dtype),
        stalls=jnp.array(0, jnp.int32),
    )

    def continues(s: InlineLoop) -> Bool[Array, ""]:
        gamma = real_part(s.gamma)
        positive = lax.gt(gamma, constant(0, gamma))
        steps_left = lax.lt(s.step, constant(max_steps, s.step))
        return both(both(lax.eq(s.mode, STEP), positive), steps_left)

    return packed_while_loop(continues, ft.partial(_inline_step, constants), init)
