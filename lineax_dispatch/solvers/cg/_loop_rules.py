"""What CG's two loops (`_cg.py`, `_inline_layout.py`) share: the values of `mode`,
the step's curvature test (`curvature_test`) and the stagnation rule
(`failed_tests`); and the one-site loop's choice of its next pass (`next_mode`).
The scalar logic is written in `lax` functions (see `skeleton/_flat_vectors.constant`).

The one-site loop's `mode` says what its next pass does: an ordinary step
(`STEP`), a residual pass (`RESIDUAL`: the first and every refresh) or a check
(`CHECK`: a residual pass after a step whose updated residual passed the test).
Negative, it says why either loop stopped: the last `p^T A p` was negative (the
operator is not definite: `breakdown`) or too small (`singular`), a true residual
that failed the test after a failed check had not halved since the failed test
before (`stagnation`), or a true residual passed the test (converged). One value
rather than flags and a code, the passes to come positive so that `mode > STEP`
is the one comparison that says a pass is a residual pass: XLA:CPU compiles each
scalar the loop computes apart as a kernel of its own."""

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Inexact, Int, Scalar

from ..skeleton._flat_vectors import (
    both,
    constant,
    dot,
    either,
    negated,
    real_part,
    select,
)
from ..skeleton._linear_system import Residuals, System
from ..skeleton._one_site_solver import CHECK_SLACK


STEP, RESIDUAL, CHECK = np.int32(0), np.int32(1), np.int32(2)

CURVATURE_NEGATIVE, CURVATURE_ZERO, STAGNATED, CONVERGED = (
    np.int32(c) for c in range(-1, -5, -1)
)

# After a failed check, a true residual that fails the test counts as a stall
# unless it is at most this fraction of that at the failed test before.
CHECK_PROGRESS = 0.5


class CGSettings(Protocol):
    """What the inline loop and the choice of layout read of the solver running
    them: `lxd.CG`'s settings, and the stopping test of its base class."""

    @property
    def max_steps(self) -> int | None: ...
    @property
    def stabilise_every(self) -> int | None: ...
    @property
    def stagnation_iters(self) -> int | None: ...
    @property
    def check_residual(self) -> bool: ...
    @property
    def layout(self) -> str: ...
    @property
    def residual_update(self) -> str: ...
    @property
    def has_scale(self) -> bool: ...
    def in_cond(self, r: Array) -> bool: ...
    def fused_test(self, size: int) -> bool: ...
    def b_scale(self, system: System) -> Callable[[Array], Array]: ...
    def test_measure(self, system: System, state: Residuals) -> Scalar: ...
    def measure_and_dot(
        self, system: System, state: Residuals, z: Array
    ) -> tuple[Scalar, Scalar]: ...


def failed_tests(
    tested: Bool[Array, ""],
    check: Bool[Array, ""],
    unconverged: Bool[Array, ""],
    measure: Array,
    checked: Array,
    stalls: Array,
    stagnation_iters: int | None,
) -> tuple[Bool[Array, ""], Array, Bool[Array, ""]]:
    """The stagnation rule, after a test of the stopping measure: from the first
    failed check on, a test of a true residual that fails without having found it
    at most `CHECK_PROGRESS` times the one before is a stall, and the solve stops
    after `stagnation_iters` stalls in a row.

    **Arguments:**

    - `tested`: whether the measure is that of a true residual `b - A y`.
    - `check`: whether that test is a check (the updated residual had passed).
    - `unconverged`: whether the measure failed the test.
    - `measure`: the measure.
    - `checked`: the measure at the last failed test from the first failed check
        on (infinite before it).
    - `stalls`: the stalls in a row so far.
    - `stagnation_iters`: the stalls that stop the solve (`None`: never).

    **Returns:**

    `(failed, stalls, stagnated)`: whether the test failed and `checked` records
    it, the stalls in a row after it, and whether the solve stops with
    `stagnation`.
    """
    failed = both(both(tested, unconverged), either(check, lax.is_finite(checked)))
    progress = lax.mul(constant(CHECK_PROGRESS, checked), checked)
    measure = lax.convert_element_type(measure, checked.dtype)
    stall = both(failed, negated(lax.le(measure, progress)))
    one = constant(1, stalls)
    stalls = lax.select(
        failed, lax.select(stall, lax.add(stalls, one), lax.sub(one, one)), stalls
    )
    if stagnation_iters is None:
        return failed, stalls, jnp.array(False)
    return failed, stalls, lax.ge(stalls, constant(stagnation_iters, stalls))


def passed_true_test(
    measure: Array, check: Bool[Array, ""], has_scale: bool
) -> Bool[Array, ""]:
    """Whether a true residual's measure passes the stopping test: at most 1, or
    at most `CHECK_SLACK` at a check."""
    if not has_scale:
        return jnp.array(False)
    within = lax.le(measure, constant(1, measure))
    slack = lax.le(measure, constant(CHECK_SLACK, measure))
    return either(within, both(check, slack))


def curvature_test(
    p: Array, product: Array, gamma: Array, rcond: Any, stiffness: Array
) -> tuple[Bool[Array, ""], Array, Array, Array]:
    """The step along `p` from its curvature `p^H A p` (`product` is `A p`).

    The curvature is judged against the operator's own scale, so that the test
    does not change when `A`, `b` or the preconditioner is scaled: `1 / alpha =
    p^H A p / gamma` is a Rayleigh quotient of the preconditioned operator, and
    `stiffness`, the largest of the steps so far, estimates its largest
    eigenvalue from below. The step is taken where the curvature exceeds
    `rcond * gamma * stiffness` (at the first step any positive curvature); it
    is negative (the operator is not definite) below minus that, else zero to
    within rounding (`singular`). (lineax compares `p^H A p` with
    `100 * rcond * gamma`, which mixes the operator's units with the residual's:
    a well-conditioned operator of small scale failed it at its first step.)

    **Arguments:**

    - `p`: the search direction.
    - `product`: `A p`.
    - `gamma`: `<M r, r>` of the current residual.
    - `rcond`: the curvature's relative threshold.
    - `stiffness`: the largest `p^H A p / gamma` of the steps taken so far (0
        before the first).

    **Returns:**

    `(ok, code, alpha, stiffness)`: whether the curvature is positive enough to
    step, the stop code where it is not (`CURVATURE_NEGATIVE`: not definite,
    else `CURVATURE_ZERO`), the step length `gamma / p^H A p`, and `stiffness`
    with this step's.
    """
    curvature = dot(p, product)
    real = real_part(curvature)
    magnitude = lax.abs(real_part(gamma))
    scale = lax.max(lax.mul(magnitude, stiffness), lax.abs(real))
    threshold = lax.mul(constant(rcond, scale), scale)
    ok = lax.gt(real, threshold)
    negative = lax.lt(real, lax.neg(threshold))
    code = lax.select(negative, CURVATURE_NEGATIVE, CURVATURE_ZERO)
    alpha = lax.div(gamma, select(ok, curvature, 1))
    quotient = lax.div(real, select(ok, magnitude, constant(1, magnitude)))
    stiffness = select(ok, lax.max(stiffness, quotient), stiffness)
    return ok, code, alpha, stiffness


class Outcome(NamedTuple):
    """How a pass of the one-site loop went: whether it was a residual pass
    (`pending`), an ordinary step whose curvature `p^T A p` passed (`step_taken`)
    or failed (`bad`, to stop with `code`), and whether the step taken makes the
    next pass a residual refresh (`refresh`)."""

    pending: Bool[Array, ""]
    step_taken: Bool[Array, ""]
    bad: Bool[Array, ""]
    code: Int[Array, ""]
    refresh: Bool[Array, ""]


def next_mode(
    mode: Int[Array, ""],
    checked: Array,
    stalls: Array,
    outcome: Outcome,
    measure: Array,
    has_scale: bool,
    stagnation_iters: int | None,
    check_residual: bool = True,
) -> tuple[Int[Array, ""], Bool[Array, ""], Array]:
    """The one-site loop's stopping decision after a pass from `mode`, whose new
    state the stopping test measures as `measure`.

    **Arguments:**

    - `mode`, `checked`, `stalls`: the loop's `mode`, `checked` and `stalls`
        before the pass.
    - `outcome`: how the pass went.
    - `measure`: the stopping test's measure of the new state.
    - `has_scale`: whether the solver has a tolerance (else it never converges).
    - `stagnation_iters`: the stalls that stop the solve (see `failed_tests`).
    - `check_residual`: whether a step whose updated residual passes the test is
        checked on the true residual (else it converges, as lineax's CG).

    **Returns:**

    The loop's next `mode`; whether the pass was a failed residual pass that
    `checked` records; and the stalls in a row after it.
    """
    pending, step_taken = outcome.pending, outcome.step_taken
    if has_scale:
        unconverged = negated(lax.le(measure, constant(1, measure)))
    else:
        unconverged = jnp.array(True)
    # A step whose updated residual passes the test is checked: the next pass
    # computes the true residual `b - A y` (the updated one drifts from it, and
    # goes on shrinking below the dtype's precision), and the loop stops only if
    # that passes too (within `CHECK_SLACK`). From the first failed check on,
    # every residual pass that fails the test (a check or a refresh) without
    # having halved the true residual since the one before is a stall, and
    # `stagnation_iters` stalls in a row stop the loop (`stagnation`).
    passed = negated(unconverged)
    check = both(step_taken, passed)
    at_check = lax.eq(mode, CHECK)
    accepted = passed_true_test(measure, at_check, has_scale)
    failed, stalls, stagnated = failed_tests(
        pending,
        at_check,
        negated(accepted),
        measure,
        checked,
        stalls,
        stagnation_iters,
    )
    if check_residual:
        next_pass = lax.select(
            check, CHECK, lax.select(outcome.refresh, RESIDUAL, STEP)
        )
    else:
        # As lineax's CG: the updated residual's test stands, except at a
        # refresh, where the true residual's does.
        next_pass = lax.select(
            outcome.refresh, RESIDUAL, lax.select(check, CONVERGED, STEP)
        )
    next_pass = lax.select(both(pending, accepted), CONVERGED, next_pass)
    next_pass = lax.select(stagnated, STAGNATED, next_pass)
    return lax.select(outcome.bad, outcome.code, next_pass), failed, stalls


class Loop(NamedTuple):
    """CG's loop state: the iterate `y`, residual `r`, search direction `p`, the
    next input `v` of the `mv` slot (`y` before a residual pass, else `p`: chosen
    at the end of the pass before, so that the slot reads one vector rather than a
    select, which XLA:CPU fused into the operator's own kernels), last update
    `diff` and `gamma = <M r, r>`; `mode` says what the next pass does, or
    why the loop stopped (`STEP`, `RESIDUAL`, `CHECK`, `_CURVATURE_*`,
    `STAGNATED`, `CONVERGED`: a loop in `STEP` has not passed the stopping
    test); `checked` is the stopping test's measure (`test_measure`: the residual
    or the update, in units of its tolerance) at the last failed residual pass
    from the first failed check on (infinite before it); `b_scale` scales the
    right-hand side for the stopping test; `stiffness` is the largest
    `p^H A p / gamma` of the steps so far (see `curvature_test`); `stalls`
    counts the failed tests of a true residual in a row that did not halve it
    (see `failed_tests`). (Whether that
    is finite needs no flag:
    `gamma` is non-finite from the first pass on where the residual is, and the
    loop stops.)"""

    y: Inexact[Array, " n"]
    r: Inexact[Array, " n"]
    p: Inexact[Array, " n"]
    v: Inexact[Array, " n"]
    diff: Inexact[Array, " n"]
    gamma: Inexact[Array, ""]
    step: Int[Array, ""]
    mode: Int[Array, ""]
    checked: Array
    b_scale: Array
    stiffness: Array
    stalls: Int[Array, ""]


def continues(max_steps: int, s: Loop) -> Bool[Array, ""]:
    """The loop's condition: a residual pass is pending, or an ordinary step may
    be taken (`gamma` positive and steps left)."""
    gamma = real_part(s.gamma)
    iterate = both(
        lax.gt(gamma, constant(0, gamma)), lax.lt(s.step, constant(max_steps, s.step))
    )
    return either(lax.gt(s.mode, STEP), both(lax.eq(s.mode, STEP), iterate))
