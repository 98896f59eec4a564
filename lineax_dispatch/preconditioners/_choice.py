"""`AutoSolver`'s rule for a preconditioner, one pure function of what is known at
trace time, and a run-time test of what was built.

- Trace time: a Jacobi (or, given a block size, block Jacobi) preconditioner is
    built where the build takes at most `BUILD_FRACTION` of the solve's expected
    steps in `mv`s: none where the operator's structure holds the entries, one
    per colour where a pattern is stated, `n` otherwise (never within a tenth of
    the `2 sqrt(n)` steps expected). So a matrix-free operator without a stated
    pattern is solved as before.
- Run time: it is applied where its spread is at least `SPREAD_MIN` (a diagonal
    whose largest entry is at least ten times its smallest); otherwise the solve
    runs with the identity in its place. `benchmarks/preconditioners.py` measures
    the steps either way across spreads.
"""

import lineax as lx

from ._build import resolve_budget
from ._patterns import AbstractPattern
from ._solver import PreconditionedSolver
from ._structure import plan


# The build's `mv`s may be at most this share of the solve's expected steps.
BUILD_FRACTION = 0.1
# The spread from which a built preconditioner is applied.
SPREAD_MIN = 10.0


def preconditioner_choice(
    operator: lx.AbstractLinearOperator,
    solver: lx.AbstractLinearSolver,
    steps: int,
    pattern: AbstractPattern | None,
    block_size: int | None,
    memory_budget: int | None,
) -> tuple[lx.AbstractLinearSolver, str]:
    """`solver` with a preconditioner where the rule takes one, and why.

    **Arguments:**

    - `operator`: the square operator to solve with.
    - `solver`: the iterative solver chosen for it (`CG` or `GMRES` take one).
    - `steps`: the solve's expected steps.
    - `pattern`: the operator's sparsity as the user states it, or `None`.
    - `block_size`: the block size for block Jacobi, or `None` for Jacobi.
    - `memory_budget`: bytes for a build through `mv`, or `None`.

    **Returns:**

    `(solver, reason)`: a `PreconditionedSolver` wrapping `solver`, or `solver`
    itself, and a sentence.
    """
    name = type(solver).__name__
    size = 1 if block_size is None else block_size
    kind = "Jacobi" if size == 1 else f"block Jacobi (blocks of {size})"
    budget = resolve_budget(operator, memory_budget)
    try:
        parts = plan(operator, size, pattern, budget)
    except ValueError as error:  # a pattern that does not fit, a budget too small
        return solver, f"No {kind} preconditioner: {error}"
    mvs = sum(p.mvs for p in parts)
    how = "; ".join(p.how for p in parts)
    limit = BUILD_FRACTION * steps
    if mvs > limit:
        return solver, (
            f"No {kind} preconditioner: its build ({how}) takes {mvs} `mv`s, more "
            f"than {BUILD_FRACTION:g} of the ~{steps} steps expected of {name}."
        )
    wrapped = PreconditionedSolver(
        solver,
        block_size=size,
        pattern=pattern,
        memory_budget=memory_budget,
        spread_min=SPREAD_MIN,
    )
    return wrapped, (
        f"{name} with a {kind} preconditioner: its build ({how}) takes {mvs} "
        f"`mv`s, within {BUILD_FRACTION:g} of the ~{steps} steps expected; applied "
        f"where its spread is at least {SPREAD_MIN:g} (checked at run time: "
        "`stats['preconditioned']`)."
    )
