"""The memory-budget check of `as_matrix` on an operator that does not hold its
entries: lineax's direct solvers (LU, QR, Cholesky) call it, as does
`materialise`, so a budget also guards them."""

import math

import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx

from ..policies import Auto, Materialise, parse_memory_budget
from ..policies._budget import default_memory_budget, format_bytes


def itemsize(operator: lx.AbstractLinearOperator) -> int:
    """Bytes per entry of the dense matrix of `operator`.

    **Arguments:**

    - `operator`: the operator.

    **Returns:**

    The itemsize of the result dtype of its input and output structures.
    """
    leaves = jtu.tree_leaves((operator.in_structure(), operator.out_structure()))
    return jnp.result_type(*[x.dtype for x in leaves]).itemsize


def dense_bytes(operator: lx.AbstractLinearOperator) -> int:
    """Bytes of the dense matrix of `operator`.

    **Arguments:**

    - `operator`: the operator.

    **Returns:**

    `out_size * in_size * itemsize`, an int.
    """
    return math.prod((operator.out_size(), operator.in_size(), itemsize(operator)))


def policy_budget(policy) -> int | None:
    """The memory budget a policy sets for a dense matrix.

    **Arguments:**

    - `policy`: a policy.

    **Returns:**

    Bytes for `Auto` and `Materialise` (their `memory_budget`, else half of the
    free memory), `None` for policies without a budget.
    """
    if isinstance(policy, Auto):
        return policy.budget()
    if isinstance(policy, Materialise):
        if policy.memory_budget is None:
            return default_memory_budget()
        return parse_memory_budget(policy.memory_budget)
    return None


def check_dense_budget(operator: lx.AbstractLinearOperator, policy) -> None:
    """Raises a `ValueError` at trace time if the dense matrix of `operator` exceeds
    the memory budget of its `Materialise` or `Auto` policy; other policies have no
    budget.

    **Arguments:**

    - `operator`: the operator about to be turned into a dense matrix.
    - `policy`: its policy.

    **Returns:**

    Nothing.
    """
    budget = policy_budget(policy)
    if budget is None:
        return
    needed = dense_bytes(operator)
    if needed > budget:
        raise ValueError(
            f"`as_matrix()` of this {type(operator).__name__} "
            f"({operator.out_size()}x{operator.in_size()}) needs {format_bytes(needed)} "
            f"({needed} bytes) for the dense matrix alone, over the memory budget "
            f"of its `{type(policy).__name__}` policy: {format_bytes(budget)} "
            f"({budget} bytes). A direct solver (LU, QR, Cholesky) materialises its "
            "operator: use an iterative solver such as `lxd.AutoSolver`, or a larger "
            "`memory_budget`."
        )
