"""The memory guard: every path that builds a dense matrix (`Materialise`'s `mv`,
`as_matrix` for lineax's direct solvers, `lx.materialise` and `lxd.materialise`,
`lx.diagonal` where only the whole matrix gives it, `lxd.dense_matrix`, `batch_mv`
and `batch_solve`) checks it against the budget of the policy in force, and raises
the same `ValueError` at trace time when it does not fit."""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import lineax as lx

from ._budget import format_bytes
from ._sizes import dense_bytes, operator_build_bytes


# The policies a batch path (`batch_solve`, `batch_mv`) applies on behalf of an
# operator whose own policy it has replaced by an inline one, or a composite
# operator whose operands are being materialised: their budgets still guard any
# dense matrix built meanwhile (a direct solver's `as_matrix`, an operand's).
_IN_FORCE: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
    "lineax_dispatch_policy_in_force", default=()
)


@contextlib.contextmanager
def policy_in_force(policy: Any) -> Iterator[None]:
    """Within this context, dense matrices are also checked against `policy`'s
    budget (as well as against those of enclosing contexts)."""
    token = _IN_FORCE.set((*_IN_FORCE.get(), policy))
    try:
        yield
    finally:
        _IN_FORCE.reset(token)


def policy_budget(policy: Any) -> int | None:
    """The memory budget (bytes) a policy sets for a dense matrix: that of `Auto`
    and `Materialise` (their `memory_budget`, else half of the free memory), `None`
    for policies without one."""
    budget: Callable[[], int] | None = getattr(policy, "budget", None)
    return budget() if callable(budget) else None


def budget_in_force(policy: Any) -> tuple[Any, int] | None:
    """The smallest budget among `policy`'s and those of the policies in force (see
    `policy_in_force`), with the policy setting it; `None` where none sets one.

    **Arguments:**

    - `policy`: the policy deciding for an operator (or `None`).

    **Returns:**

    A pair `(owner, budget in bytes)`, or `None`.
    """
    candidates = [(p, policy_budget(p)) for p in (policy, *_IN_FORCE.get())]
    candidates = [(p, b) for p, b in candidates if b is not None]
    if not candidates:
        return None
    return min(candidates, key=lambda c: c[1])


def check_bytes(
    operator: lx.AbstractLinearOperator,
    policy: Any,
    needed: int,
    *,
    what: str,
    detail: str,
) -> None:
    """Raises the budget's `ValueError` if `needed` bytes, to be spent on `operator`,
    exceed the budget of `policy` or of a policy in force.

    **Arguments:**

    - `operator`: the operator the bytes are spent on.
    - `policy`: the policy deciding for it.
    - `needed`: the bytes needed.
    - `what`: the operation, for the message.
    - `detail`: what the bytes are, for the message.

    **Returns:**

    Nothing.
    """
    found = budget_in_force(policy)
    if found is None:
        return
    owner, budget = found
    if needed > budget:
        raise ValueError(
            f"{what} of `operator`, a {type(operator).__name__} "
            f"({operator.out_size()}x{operator.in_size()}), needs {format_bytes(needed)} "
            f"({needed} bytes: {detail}), over the memory budget of its "
            f"`{type(owner).__name__}` policy: {format_bytes(budget)} ({budget} "
            "bytes). Use an iterative solver (such as `lxd.AutoSolver`) or a policy "
            "that does not build the matrix, a smaller `batch_size`, or a larger "
            "`memory_budget`."
        )


def check_dense_budget(
    operator: lx.AbstractLinearOperator,
    policy: Any,
    *,
    what: str = "`as_matrix()`",
    batch_size: int | None = None,
    with_build: bool = False,
) -> None:
    """Raises a `ValueError` if the dense matrix of `operator` exceeds the budget of
    `policy` or of the policies in force (see `policy_in_force`), whichever is
    smallest; policies without a budget (`Lazy`, `Outline`...) set none.

    **Arguments:**

    - `operator`: the operator about to be turned into a dense matrix.
    - `policy`: the policy deciding for it (its own, or a per-call override).
    - `what`: the operation, for the message.
    - `batch_size`: the columns built together, when `with_build`.
    - `with_build`: count the peak of building the matrix too, not only the
        matrix.

    **Returns:**

    Nothing.
    """
    if with_build:
        needed = operator_build_bytes(operator, batch_size)
        detail = "the matrix and the build's peak"
    else:
        needed = dense_bytes(operator)
        detail = "the dense matrix alone"
    check_bytes(operator, policy, needed, what=what, detail=detail)
