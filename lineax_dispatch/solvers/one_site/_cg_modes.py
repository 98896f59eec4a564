"""What CG's two loops (`_cg.py`, `_cg_inline.py`) share: the values of `mode`,
the step's curvature test (`curvature_test`) and the stagnation rule
(`failed_tests`); and the one-site loop's choice of its next pass (`next_mode`).
The scalar logic is written in `lax` functions (see `_flat.constant`).

The one-site loop's `mode` says what its next pass does: an ordinary step
(`STEP`), a residual pass (`RESIDUAL`: the first and every refresh) or a check
(`CHECK`: a residual pass after a step whose updated residual passed the test).
Negative, it says why either loop stopped: the last `p^T A p` was negative (the
operator is not definite: `breakdown`) or too small (`singular`), a true residual
that failed the test after a failed check had not halved since the failed test
before (`stagnation`), or a true residual passed the test (converged). One value
rather than flags and a code, the passes to come positive so that `mode > STEP`
is the one comparison that says a pass is a residual pass: XLA:CPU compiles each
scalar the loop computes apart as a kernel of its own, at 2-4 ms of compile
each."""

from typing import Any, NamedTuple

import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from ._flat import both, constant, dot, either, negated, real_part, select


STEP, RESIDUAL, CHECK = np.int32(0), np.int32(1), np.int32(2)

CURVATURE_NEGATIVE, CURVATURE_ZERO, STAGNATED, CONVERGED = (
    np.int32(c) for c in range(-1, -5, -1)
)

# After a failed check, a true residual that fails the test stops the solve unless
# it is at most this fraction of that at the failed test before.
CHECK_PROGRESS = 0.5


def failed_tests(
    tested: Bool[Array, ""],
    check: Bool[Array, ""],
    unconverged: Bool[Array, ""],
    measure: Array,
    checked: Array,
) -> tuple[Bool[Array, ""], Bool[Array, ""]]:
    """The stagnation rule, after a test of the stopping measure: from the first
    failed check on, every test of a true residual that fails must find it at
    most `CHECK_PROGRESS` times the one before, or the solve stops.

    **Arguments:**

    - `tested`: whether the measure is that of a true residual `b - A y`.
    - `check`: whether that test is a check (the updated residual had passed).
    - `unconverged`: whether the measure failed the test.
    - `measure`: the measure.
    - `checked`: the measure at the last failed test from the first failed check
        on (infinite before it).

    **Returns:**

    `(failed, stagnated)`: whether the test failed and `checked` records it, and
    whether the solve stops with `stagnation`.
    """
    failed = both(both(tested, unconverged), either(check, lax.is_finite(checked)))
    progress = lax.mul(constant(CHECK_PROGRESS, checked), checked)
    measure = lax.convert_element_type(measure, checked.dtype)
    return failed, both(failed, negated(lax.le(measure, progress)))


def curvature_test(
    p: Array, product: Array, gamma: Array, rcond: Any
) -> tuple[Bool[Array, ""], Array, Array]:
    """The step along `p` from its curvature `p^H A p` (`product` is `A p`).

    **Arguments:**

    - `p`: the search direction.
    - `product`: `A p`.
    - `gamma`: `<M r, r>` of the current residual.
    - `rcond`: the curvature's relative threshold.

    **Returns:**

    `(ok, code, alpha)`: whether the curvature is positive enough to step, the
    stop code where it is not (`CURVATURE_NEGATIVE`: not definite, else
    `CURVATURE_ZERO`), and the step length `gamma / p^H A p`.
    """
    curvature = dot(p, product)
    magnitude = lax.abs(gamma)
    threshold = lax.mul(constant(100 * rcond, magnitude), magnitude)
    ok = lax.gt(real_part(curvature), threshold)
    negative = lax.lt(real_part(curvature), lax.neg(threshold))
    code = lax.select(negative, CURVATURE_NEGATIVE, CURVATURE_ZERO)
    return ok, code, lax.div(gamma, select(ok, curvature, 1))


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
    outcome: Outcome,
    measure: Array,
    has_scale: bool,
) -> tuple[Int[Array, ""], Bool[Array, ""]]:
    """The one-site loop's stopping decision after a pass from `mode`, whose new
    state the stopping test measures as `measure`.

    **Arguments:**

    - `mode`, `checked`: the loop's `mode` and `checked` before the pass.
    - `outcome`: how the pass went.
    - `measure`: the stopping test's measure of the new state.
    - `has_scale`: whether the solver has a tolerance (else it never converges).

    **Returns:**

    The loop's next `mode`; and whether the pass was a failed residual pass that
    `checked` records.
    """
    pending, step_taken = outcome.pending, outcome.step_taken
    if has_scale:
        unconverged = negated(lax.le(measure, constant(1, measure)))
    else:
        unconverged = jnp.array(True)
    # A step whose updated residual passes the test is checked: the next pass
    # computes the true residual `b - A y` (the updated one drifts from it, and
    # goes on shrinking below the dtype's precision), and the loop stops only if
    # that passes too. From the first failed check on, every residual pass that
    # fails the test (a check or a refresh) must have halved the true residual
    # since the one before, or the loop stops (`stagnation`).
    passed = negated(unconverged)
    check = both(step_taken, passed)
    failed, stagnated = failed_tests(
        pending, lax.eq(mode, CHECK), unconverged, measure, checked
    )
    next_pass = lax.select(check, CHECK, lax.select(outcome.refresh, RESIDUAL, STEP))
    next_pass = lax.select(both(pending, passed), CONVERGED, next_pass)
    next_pass = lax.select(stagnated, STAGNATED, next_pass)
    return lax.select(outcome.bad, outcome.code, next_pass), failed
