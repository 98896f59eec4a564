"""lineax's `RESULTS` codes from how a solver's loop ended, selected as `lax`
selects of their integer codes."""

import jax.lax as lax
import lineax as lx
from jaxtyping import Array, Bool


# The class of `RESULTS`' items (equinox's `EnumerationItem`): an item is its
# integer code and its enumeration.
_Item = type(lx.RESULTS.successful)


def results_where(
    pred: Bool[Array, ""], on_true: lx.RESULTS, on_false: lx.RESULTS
) -> lx.RESULTS:
    """`lx.RESULTS.where(pred, on_true, on_false)`, as one `lax.select` of the two
    codes. (equinox's `where` calls `jnp.where`, a jitted function: a call of its
    own to trace, and a solver is traced twice per solve, by the solve and by its
    lowering.)

    **Arguments:**

    - `pred`: a scalar boolean.
    - `on_true`, `on_false`: items of `lx.RESULTS`.

    **Returns:**

    An item of `lx.RESULTS`.
    """
    if on_true._value is on_false._value:
        return on_true
    value = lax.select(pred, on_true._value, on_false._value)
    # (equinox declares the item's `__init__` with one argument for type checkers
    # only: it is a module of two fields.)
    return _Item(value, lx.RESULTS)  # pyright: ignore[reportCallIssue]


def finish_result(
    result: lx.RESULTS,
    finite_input: Bool[Array, ""],
    breakdown: Bool[Array, ""] | None = None,
    finite_state: Bool[Array, ""] | None = None,
) -> lx.RESULTS:
    """Applies, in increasing order of precedence, breakdown and non-finite input.

    `finite_state` says whether the loop's final state (its iterate and the scalars
    its stopping test read) is finite: an operator holding NaN or inf makes the
    first residual non-finite, every comparison with it false, and the loop stop
    at once with an untouched iterate, which must not pass for a solution.

    **Arguments:**

    - `result`: the result so far.
    - `finite_input`: whether the right-hand side is finite.
    - `breakdown`: where the solver broke down (`None`: it cannot).
    - `finite_state`: whether the loop's final state is finite (`None`: not
        checked).

    **Returns:**

    An item of `lx.RESULTS`.
    """
    if breakdown is not None:
        result = results_where(breakdown, lx.RESULTS.breakdown, result)
    if finite_state is not None:
        finite_input = lax.bitwise_and(finite_input, finite_state)
    return results_where(finite_input, result, lx.RESULTS.nonfinite_input)
