"""Fixing an `Auto` operator's strategy once per solve, outside the solver's loop."""

import math

import jax
import lineax as lx

from .._validate import as_real
from ..operators import AbstractDispatchOperator, adopt, MatrixLinearOperator
from ..policies import Auto, dense_matrix, Lazy, Materialise
from ..policies._pinned import pinned
from ..policies.calls._keys import operator_key
from ..policies.calls._recorder import record_solve, solve_hint, solve_record
from ..policies.calls._scope import current_scope


def expected_iterations(max_steps: int | None, size: int) -> int:
    """How many `mv`s an iterative solve is expected to take: `2 sqrt(n)` (at
    least 10), capped by `max_steps`. Well-conditioned Krylov solves usually take
    far fewer than lineax's bound of `10 n`.

    **Arguments:**

    - `max_steps`: the solver's `max_steps` (`None` for lineax's default).
    - `size`: the number of unknowns.

    **Returns:**

    The expected number of `mv`s, a positive int.

    !!! Example

        ```python
        from lineax_dispatch.solvers import expected_iterations

        assert expected_iterations(None, 10_000) == 200
        assert expected_iterations(50, 10_000) == 50
        ```
    """
    guess = max(10, math.ceil(2 * math.sqrt(max(size, 1))))
    return guess if max_steps is None else max(1, min(max_steps, guess))


# Every tag of lineax's, read back from an operator's predicates (a materialised
# operator keeps them: `lx.Diagonal`, `lx.Tridiagonal`... check them).
_TAGS = (
    (lx.is_symmetric, lx.symmetric_tag),
    (lx.is_diagonal, lx.diagonal_tag),
    (lx.is_tridiagonal, lx.tridiagonal_tag),
    (lx.is_lower_triangular, lx.lower_triangular_tag),
    (lx.is_upper_triangular, lx.upper_triangular_tag),
    (lx.has_unit_diagonal, lx.unit_diagonal_tag),
    (lx.is_positive_semidefinite, lx.positive_semidefinite_tag),
    (lx.is_negative_semidefinite, lx.negative_semidefinite_tag),
)


def _tags(operator: lx.AbstractLinearOperator) -> tuple:
    return tuple(tag for predicate, tag in _TAGS if predicate(operator))


def _single_array(structure) -> bool:
    return isinstance(structure, jax.ShapeDtypeStruct) and len(structure.shape) == 1


def stated_tolerance(solver: lx.AbstractLinearSolver) -> float | None:
    """The relative tolerance an iterative `solver` states: the smaller of its
    nonzero `rtol` and `atol` (for a right-hand side of order one both are
    relative). `None` where it has neither, both are zero, or either is traced."""
    given = [as_real(getattr(solver, name, None)) for name in ("rtol", "atol")]
    if None in given:
        return None
    nonzero = [t for t in given if t is not None and t > 0]
    return min(nonzero) if nonzero else None


def resolve_for_solve(
    operator: lx.AbstractLinearOperator,
    executions: float,
    tolerance: float | None = None,
) -> lx.AbstractLinearOperator:
    """If `operator` carries `Auto`, decides once for a solve that runs `mv`
    `executions` times from one call site, and returns the operator ready for the
    loop: materialised now (the matrix is built once, outside the loop), or carrying
    the fixed `Lazy` or `Outline` policy. Other operators are returned unchanged.

    **Arguments:**

    - `operator`: the operator to be solved.
    - `executions`: the expected number of `mv`s.
    - `tolerance`: the solve's relative tolerance, where the solver states one:
        the matrix is not built where its products' rounding could keep the solve
        from it (see [`lineax_dispatch.Observation`][]'s `solve_tolerance`).

    **Returns:**

    An equivalent operator.

    !!! Example

        ```python
        from lineax_dispatch.solvers import resolve_for_solve

        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Auto())
        fixed = resolve_for_solve(op, executions=100)  # in a solver's `init`
        ```
    """
    if not isinstance(operator, AbstractDispatchOperator):
        return operator
    policy = operator.policy
    if not isinstance(policy, Auto):
        return operator
    key = operator_key(operator)
    # `lxd.jit` found this solve repeated (k solves of the same arrays from this
    # line, rolled): they share one matrix build.
    shared = solve_hint(key)
    decision = policy.decision(
        operator,
        call_sites=1,
        executions=executions * shared,
        solves=1,
        solve_tolerance=tolerance,
    )
    if shared > 1:
        note = (
            f"{shared} solves of this operator from this line apply the same "
            "arrays: decided for all of them (one matrix build would serve all)."
        )
        decision = decision.with_reason(note)
    # For `lxd.jit` and `lxd.explain`; carried by the operator's pinned policy
    # where there is one, so that a program reusing this trace reads it back.
    record = solve_record(operator, key, executions, decision, tolerance)
    scope = current_scope()
    record_solve(record, carried=scope is not None)
    chosen = decision.policy
    if isinstance(chosen, Materialise) and not isinstance(
        operator, MatrixLinearOperator
    ):
        applied = Lazy() if scope is None else pinned(Lazy(), scope, record)
        if _single_array(operator.in_structure()) and _single_array(
            operator.out_structure()
        ):
            matrix = dense_matrix(operator, chosen.batch_size)
            return MatrixLinearOperator(matrix, _tags(operator), policy=applied)
        return adopt(lx.materialise(operator), applied)
    if isinstance(chosen, Materialise):
        chosen = Lazy()
    if scope is not None:
        # The solve's own traces (lineax's primitive evaluates and lowers the
        # solver apart) share the `mv` traced for the decision.
        chosen = pinned(chosen, scope, record)
    return adopt(operator, chosen)
