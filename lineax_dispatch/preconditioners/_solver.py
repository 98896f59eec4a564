"""`PreconditionedSolver`: an iterative lineax solver given a Jacobi or block
Jacobi preconditioner built from each operator it solves with."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import lineax as lx
from jaxtyping import Array, PyTree

from .._validate import check_positive_int
from ..policies._memory import optional_budget
from ._build import Built, check_operator, describe, read, resolve_budget
from ._jacobi import assemble
from ._patterns import AbstractPattern, check_pattern
from ._structure import plan


def _where(apply: Array, built: Built, block_size: int) -> Built:
    """`built` where `apply`, else the identity (one preconditioner either way)."""
    if block_size == 1:
        identity = jnp.ones_like(built.inverse)
    else:
        eye = jnp.eye(block_size, dtype=built.inverse.dtype)
        identity = jnp.broadcast_to(eye, built.inverse.shape)
    inverse = jnp.where(apply, built.inverse, identity)
    return Built(
        inverse=inverse, usable=built.usable, valid=built.valid, spread=built.spread
    )


class PreconditionedSolver(lx.AbstractLinearSolver):
    """`solver` (an iterative lineax solver that takes `options["preconditioner"]`:
    `lxd.CG`, `lxd.GMRES`, lineax's...) with the Jacobi preconditioner
    (`block_size` 1) or the block Jacobi one of each operator it is given, built in
    `init` as [`lineax_dispatch.jacobi`][] and [`lineax_dispatch.block_jacobi`][]
    build it. A preconditioner given in `options` is used instead.

    The preconditioner is applied where every entry is usable (a nonzero diagonal,
    positive where the operator is tagged positive semidefinite; invertible
    blocks) and its spread is at least `spread_min` (for Jacobi the ratio of the
    diagonal's largest to smallest entry, for blocks the largest block's 1-norm
    times the largest inverse block's); otherwise the solve runs with the identity
    in its place, the same single preconditioner site. `stats["preconditioned"]`
    says which. This is what [`lineax_dispatch.AutoSolver`][] uses where it
    chooses a preconditioner.

    !!! Example

        ```python
        matrix = jnp.diag(jnp.logspace(0.0, 3.0, 64)) + 0.1
        op = lxd.MatrixLinearOperator(matrix, lx.positive_semidefinite_tag)
        solver = lxd.PreconditionedSolver(lxd.CG(1e-6, 1e-6))
        sol = lx.linear_solve(op, jnp.ones(64), solver)
        assert sol.stats["preconditioned"]
        ```
    """

    solver: lx.AbstractLinearSolver
    block_size: int = 1
    pattern: AbstractPattern | None = None
    memory_budget: int | None = eqx.field(default=None, converter=optional_budget)
    spread_min: float = 0.0

    def __check_init__(self):
        if not isinstance(self.solver, lx.AbstractLinearSolver):
            raise TypeError(
                "`PreconditionedSolver(solver=...)` must be a lineax solver; got "
                f"{type(self.solver).__name__}."
            )
        check_positive_int(self.block_size, "PreconditionedSolver(block_size=...)")
        check_pattern(self.pattern, "PreconditionedSolver(pattern=...)")

    def describe(self, operator: lx.AbstractLinearOperator) -> str:
        """How the preconditioner of `operator` is built, in words.

        **Arguments:**

        - `operator`: a square operator.

        **Returns:**

        A sentence.
        """
        budget = resolve_budget(operator, self.memory_budget)
        parts = plan(operator, self.block_size, self.pattern, budget)
        kind = "Jacobi" if self.block_size == 1 else f"Block Jacobi ({self.block_size})"
        return describe(kind, operator, parts)

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        inner = self.solver.init(operator, options)
        if options.get("preconditioner") is not None:
            return inner, None, None
        check_operator(operator, "PreconditionedSolver")
        budget = resolve_budget(operator, self.memory_budget)
        built = read(operator, self.block_size, self.pattern, budget)
        apply = built.valid & (built.spread >= self.spread_min)
        built = _where(apply, built, self.block_size)
        blocks = self.block_size > 1
        found = assemble(
            operator, built, self.block_size, self.describe(operator), None, blocks
        )
        return inner, found, apply

    def compute(
        self, state: Any, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        inner, preconditioner, apply = state
        if preconditioner is None:
            return self.solver.compute(inner, vector, options)
        options = dict(options, preconditioner=preconditioner)
        value, result, stats = self.solver.compute(inner, vector, options)
        return value, result, dict(stats, preconditioned=apply)

    def transpose(self, state: Any, options: dict[str, Any]):
        inner, preconditioner, apply = state
        inner, options = self.solver.transpose(inner, options)
        if preconditioner is not None:
            preconditioner = preconditioner.transpose()
        return (inner, preconditioner, apply), options

    def conj(self, state: Any, options: dict[str, Any]):
        inner, preconditioner, apply = state
        inner, options = self.solver.conj(inner, options)
        if preconditioner is not None:
            preconditioner = lx.conj(preconditioner)
        return (inner, preconditioner, apply), options

    def assume_full_rank(self):
        return self.solver.assume_full_rank()


PreconditionedSolver.__init__.__doc__ = """**Arguments:**

- `solver`: an iterative lineax solver taking `options["preconditioner"]`.
- `block_size`: 1 (the default) for Jacobi, else the size of block Jacobi's blocks.
- `pattern`: the operators' sparsity ([`lineax_dispatch.Stencil`][],
    [`lineax_dispatch.Band`][]) for a build from coloured probe vectors, or `None`.
- `memory_budget`: bytes (or a string like `"2GB"`) for the build's probes.
- `spread_min`: the spread from which the preconditioner is applied (0: wherever it
    is usable).
"""
