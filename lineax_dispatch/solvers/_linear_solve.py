"""`lxd.linear_solve`: lineax's `linear_solve` with a per-solve policy."""

from typing import Any

import lineax as lx
from jaxtyping import ArrayLike, PyTree

from .._compat import sentinel
from ..operators import with_policy
from ..policies import AbstractPolicy, check_policy


def linear_solve(
    operator: lx.AbstractLinearOperator,
    vector: PyTree[ArrayLike],
    solver: lx.AbstractLinearSolver = lx.AutoLinearSolver(well_posed=True),
    *,
    policy: AbstractPolicy | None = None,
    options: dict[str, Any] | None = None,
    state: PyTree[Any] = sentinel,
    throw: bool = True,
) -> lx.Solution:
    """Solves `operator x = vector`, as [`lineax.linear_solve`][], optionally
    applying the operator under `policy` for this solve only.

    Autodiff (JVP, VJP) and `vmap` go through lineax's `linear_solve` primitive, so
    they behave as lineax's. Every lineax solver works, and so do this package's
    one-`mv`-site solvers (`lxd.CG`, `lxd.GMRES`, ...).

    **Arguments:**

    - `operator`: a lineax linear operator (of lineax-dispatch or plain lineax).
    - `vector`: the right-hand side, matching `operator.out_structure()`.
    - `solver`: the solver. Defaults to `lx.AutoLinearSolver(well_posed=True)`.
    - `policy`: if given, an [`lineax_dispatch.AbstractPolicy`][] that overrides the
        operator's own (every node of a composite operator gets it) for this solve.
        `None` keeps the operator as it is.
    - `options`: the solver's options (e.g. `preconditioner`, `y0`).
    - `state`: the result of `solver.init(operator, options)`, to reuse it.
    - `throw`: raise on failure (`True`) or report it in `Solution.result`.

    **Returns:**

    A [`lineax.Solution`][].

    !!! Example

        ```python
        fn = lambda x: 3 * x - jnp.roll(x, 1) - jnp.roll(x, -1)  # positive definite
        structure = jax.ShapeDtypeStruct((4,), jnp.float32)
        op = lxd.FunctionLinearOperator(fn, structure, lx.positive_semidefinite_tag)
        b = jnp.arange(4.0, dtype=jnp.float32)
        sol = lxd.linear_solve(op, b, lxd.CG(rtol=1e-6, atol=1e-6),
                               policy=lxd.Outline())
        ```
    """
    if not isinstance(operator, lx.AbstractLinearOperator):
        raise TypeError(
            "`operator` of `lxd.linear_solve` must be a lineax AbstractLinearOperator "
            f"(e.g. `lxd.MatrixLinearOperator(matrix)`); got {type(operator).__name__}."
        )
    if not isinstance(solver, lx.AbstractLinearSolver):
        raise TypeError(
            "`solver` of `lxd.linear_solve` must be a lineax AbstractLinearSolver; "
            f"got {type(solver).__name__}."
        )
    if policy is not None:
        operator = with_policy(operator, check_policy(policy))
    return lx.linear_solve(
        operator, vector, solver, options=options, state=state, throw=throw
    )
