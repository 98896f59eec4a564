"""The memory guard: every path that builds a dense matrix (`Materialise`'s `mv`,
`as_matrix` for lineax's direct solvers, `lxd.materialise`, `lxd.dense_matrix`,
`batch_mv` and `batch_solve`) checks it against the budget of the policy in force,
and raises the same `ValueError` at trace time when it does not fit."""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import lineax as lx

from ._budget import format_bytes
from ._sizes import dense_bytes, operator_build_bytes


# The policy a batch path (`batch_solve`, `batch_mv`) applies on behalf of an
# operator whose own policy it has replaced by an inline one: its budget still
# guards any dense matrix built meanwhile (a direct solver's `as_matrix`).
_IN_FORCE: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "lineax_dispatch_policy_in_force", default=None
)


@contextlib.contextmanager
def policy_in_force(policy: Any) -> Iterator[None]:
    """Within this context, dense matrices are also checked against `policy`'s
    budget."""
    token = _IN_FORCE.set(policy)
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


def check_dense_budget(
    operator: lx.AbstractLinearOperator,
    policy: Any,
    *,
    what: str = "`as_matrix()`",
    batch_size: int | None = None,
    with_build: bool = False,
) -> None:
    """Raises a `ValueError` if the dense matrix of `operator` exceeds the budget of
    `policy` or of the policy in force (see `policy_in_force`), whichever is
    smaller; policies without a budget (`Lazy`, `Outline`...) set none.

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
    candidates = [(p, policy_budget(p)) for p in (policy, _IN_FORCE.get())]
    candidates = [(p, b) for p, b in candidates if b is not None]
    if not candidates:
        return
    owner, budget = min(candidates, key=lambda c: c[1])
    if with_build:
        needed = operator_build_bytes(operator, batch_size)
        detail = "the matrix and the build's peak"
    else:
        needed = dense_bytes(operator)
        detail = "the dense matrix alone"
    if needed > budget:
        raise ValueError(
            f"{what} of this {type(operator).__name__} "
            f"({operator.out_size()}x{operator.in_size()}) needs {format_bytes(needed)} "
            f"({needed} bytes: {detail}), over the memory budget of its "
            f"`{type(owner).__name__}` policy: {format_bytes(budget)} ({budget} "
            "bytes). Use an iterative solver (such as `lxd.AutoSolver`) or a policy "
            "that does not build the matrix, a smaller `batch_size`, or a larger "
            "`memory_budget`."
        )
