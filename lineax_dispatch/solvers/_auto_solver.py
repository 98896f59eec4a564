"""`AutoSolver`: a dense factorisation or a one-`mv`-site iterative solver, whichever
fits the memory budget and is estimated to be cheaper."""

import math
from typing import Any

import equinox as eqx
import lineax as lx
from jaxtyping import Array, PyTree

from .._validate import check_positive_int, check_tolerance
from ..operators import AbstractDispatchOperator, with_policy
from ..operators._sharding import sharded_structure
from ..policies import Auto, CostModel, observe
from ..policies._memory import (
    default_memory_budget,
    format_bytes,
    itemsize as operator_itemsize,
    matrix_bytes,
    optional_budget,
    policy_budget,
    vector_bytes,
)
from ..policies._pinned import ChoiceRef
from ..policies.calls._recorder import record_solver_choice
from ..policies.decision._calibration import machine_cost_model
from ..policies.decision._formulas import batched_compile, mv_compile, mv_run, read_rate
from ..preconditioners import AbstractPattern
from ..preconditioners._choice import preconditioner_choice
from ._gmres import GMRES
from ._minres import MINRES
from ._policy_solver import hide_static, reveal_static
from ._prepare import expected_iterations
from .cg import CG
from .lsmr import LSMR


class _DirectCost(eqx.Module):
    """What the direct solver of `_direct_cost` costs: its `name` (the lineax class),
    its `flops` and the `bytes` it needs."""

    name: str
    flops: float
    bytes: int


def _direct_cost(
    operator: lx.AbstractLinearOperator, well_posed: bool | None, itemsize: int
) -> _DirectCost:
    """The direct solver lineax's `AutoLinearSolver` would use for `operator`: its
    name, its flops, and the bytes it needs (the dense matrix and its factors, or
    just the bands)."""
    m, n = operator.out_size(), operator.in_size()
    lo, hi = min(m, n), max(m, n)
    dense = matrix_bytes(m, n, itemsize)
    solver = lx.AutoLinearSolver(well_posed=well_posed).select_solver(operator)
    name = type(solver).__name__
    if isinstance(solver, lx.Diagonal):
        return _DirectCost(name, float(n), vector_bytes(m + n, itemsize))
    if isinstance(solver, lx.Tridiagonal):
        return _DirectCost(name, 10.0 * n, vector_bytes(4 * n, itemsize))
    if isinstance(solver, lx.Triangular):
        return _DirectCost(name, float(n) ** 2, dense)
    if isinstance(solver, lx.Cholesky):
        return _DirectCost(name, float(n) ** 3 / 3, 2 * dense)
    if isinstance(solver, lx.QR):
        return _DirectCost(name, 2.0 * hi * lo**2, 2 * dense)
    if isinstance(solver, lx.SVD):
        return _DirectCost(name, 4.0 * hi * lo**2 + 22.0 * lo**3, 3 * dense)
    return _DirectCost(name, 2.0 * float(n) ** 3 / 3, 2 * dense)


def _iterative_class(
    operator: lx.AbstractLinearOperator, well_posed: bool | None
) -> type[CG] | type[GMRES] | type[LSMR] | type[MINRES]:
    """The iterative solver of this package for `operator`, by shape and tags."""
    if well_posed is False or operator.in_size() != operator.out_size():
        return LSMR  # least squares / minimum norm
    if lx.is_positive_semidefinite(operator) | lx.is_negative_semidefinite(operator):
        return CG
    if lx.is_symmetric(operator):
        return MINRES
    return GMRES


class AutoSolver(lx.AbstractLinearSolver):
    """Chooses a solver for each operator: a direct one (lineax's
    `AutoLinearSolver`, which picks by tags and shape: diagonal, tridiagonal,
    triangular, Cholesky, LU, QR, or SVD when not well posed) or a one-`mv`-site
    iterative one of this package (`CG` for a positive or negative semidefinite
    operator, `MINRES` for a symmetric one, `GMRES` for a square one, `LSMR` for a
    non-square one or when not well posed).

    Direct is chosen when what it needs (for most solvers the dense matrix and its
    factors) fits the memory budget
    and building and factorising it is estimated to cost less than the iterative
    solve: compile time plus one run, from the operator's size, the cost of one
    `mv` (as `Auto` measures it) and the expected number of iterations
    (`2 sqrt(n)`, at least 10). So small systems are factorised, and large or
    cheap-to-apply ones (a stencil) are solved matrix-free. A plain lineax
    operator gets the `Auto` policy, so an iterative solve also decides how to
    apply its `mv`. A `CG` or `GMRES` solve gets a Jacobi preconditioner (block
    Jacobi given `block_size`) where building it takes at most a tenth of the
    expected steps in `mv`s (free where the operator holds its entries, a few
    coloured probes given a `pattern`), applied where its diagonal spans at least
    a factor of ten ([`lineax_dispatch.PreconditionedSolver`][]). This is the
    `linear_solver` to give optimistix:

    !!! Example

        ```python
        import optimistix as optx

        def fn(y, args):  # a root-finding problem with a symmetric Jacobian
            return 3.0 * y + jnp.tanh(y) - args

        solver = optx.Newton(rtol=1e-6, atol=1e-6,
                             linear_solver=lxd.AutoSolver(rtol=1e-8, atol=1e-8))
        tags = frozenset({lx.symmetric_tag, lx.positive_semidefinite_tag})
        sol = optx.root_find(fn, solver, jnp.zeros(3), jnp.ones(3), tags=tags)

        op = lxd.JacobianLinearOperator(fn, jnp.zeros(3), jnp.ones(3), tags=tags)
        chosen, reasons = lxd.AutoSolver().choose(op)  # a Cholesky, for 3 unknowns
        ```
    """

    rtol: float = 1e-6
    atol: float = 1e-6
    max_steps: int | None = None
    well_posed: bool | None = None
    memory_budget: int | None = eqx.field(default=None, converter=optional_budget)
    cost_model: CostModel | None = None
    pattern: AbstractPattern | None = None
    block_size: int | None = None
    precondition: bool = True

    def __check_init__(self):
        if self.block_size is not None:
            check_positive_int(self.block_size, "AutoSolver(..., block_size=...)")
        if self.pattern is not None and not isinstance(self.pattern, AbstractPattern):
            raise TypeError(
                "`pattern` of `AutoSolver` must be an `lxd.Band`, an `lxd.Stencil` or "
                f"None; got {type(self.pattern).__name__}."
            )
        for field in ("rtol", "atol"):
            check_tolerance(getattr(self, field), f"AutoSolver(..., {field}=...)")
        if self.max_steps is not None:
            check_positive_int(self.max_steps, "AutoSolver(..., max_steps=...)")
        if self.well_posed not in (None, True, False):
            raise TypeError(
                "`well_posed` of `AutoSolver` must be `True`, `False` or `None` (as "
                "lineax's `AutoLinearSolver`); got "
                f"{self.well_posed!r} of type {type(self.well_posed).__name__}."
            )
        if self.cost_model is not None and not isinstance(self.cost_model, CostModel):
            raise TypeError(
                "`cost_model` of `AutoSolver` must be an `lxd.CostModel` or None; got "
                f"{type(self.cost_model).__name__}."
            )

    def model(self) -> CostModel:
        """`cost_model` if one was given, else this machine's (see `lxd.Auto`).

        **Returns:**

        A [`lineax_dispatch.CostModel`][].
        """
        return machine_cost_model() if self.cost_model is None else self.cost_model

    def budget(self, operator: lx.AbstractLinearOperator) -> int:
        """The memory budget in bytes for `operator`.

        **Arguments:**

        - `operator`: the operator.

        **Returns:**

        The smallest of `memory_budget` (if set) and the budget of the operator's
        own `Auto` or `Materialise` policy (which `as_matrix` checks); half of the
        free memory if neither has one.
        """
        budgets = []
        if self.memory_budget is not None:
            budgets.append(self.memory_budget)
        if isinstance(operator, AbstractDispatchOperator):
            own = policy_budget(operator.policy)
            if own is not None:
                budgets.append(own)
        return min(budgets) if budgets else default_memory_budget()

    def _iterative(
        self, operator: lx.AbstractLinearOperator
    ) -> lx.AbstractLinearSolver:
        solver = _iterative_class(operator, self.well_posed)
        return solver(rtol=self.rtol, atol=self.atol, max_steps=self.max_steps)

    def choose(
        self, operator: lx.AbstractLinearOperator
    ) -> tuple[lx.AbstractLinearSolver, tuple[str, ...]]:
        """The solver this chooses for `operator`, and why.

        **Arguments:**

        - `operator`: the operator.

        **Returns:**

        `(solver, reasons)`: a lineax solver and sentences explaining the choice.
        """
        m, n = operator.out_size(), operator.in_size()
        if self.well_posed and m != n:
            raise ValueError(
                "`AutoSolver(well_posed=True)` needs a square operator; got "
                f"{m} x {n}. Use `AutoSolver(well_posed=False)` for least squares."
            )
        iterative = self._iterative(operator)
        sharded = sharded_structure(operator)
        if sharded is not None:
            return iterative, (
                f"The operator's vectors are sharded over Explicit mesh axes "
                f"({sharded}); a dense factorisation needs the whole matrix on "
                f"each device: {type(iterative).__name__}, which keeps the vectors "
                "sharded.",
            )
        direct = lx.AutoLinearSolver(well_posed=self.well_posed)
        budget = self.budget(operator)
        itemsize = operator_itemsize(operator)
        cost = _direct_cost(operator, self.well_posed, itemsize)
        name, needed = cost.name, cost.bytes
        if needed > budget:
            return self._preconditioned(
                operator,
                iterative,
                f"{name} needs {format_bytes(needed)} (the dense matrix and its "
                f"factors), over the budget of {format_bytes(budget)}: "
                f"{type(iterative).__name__}, matrix-free.",
            )
        o = observe(operator, memory_budget=budget)
        direct_time, iterative_time, source, steps = _estimated_times(
            o, self.model(), cost, iterative, self.max_steps, itemsize
        )
        estimates = (
            f"{name} of the {m} x {n} matrix (from {source}) ~{direct_time:.3g} s; "
            f"{type(iterative).__name__} ~{steps} iterations ~{iterative_time:.3g} s "
            "(compile and one run)."
        )
        if direct_time <= iterative_time or not math.isfinite(iterative_time):
            return direct, (
                estimates,
                f"direct is cheaper, and {name} ({format_bytes(needed)}) fits the "
                f"budget of {format_bytes(budget)}.",
            )
        return self._preconditioned(
            operator,
            iterative,
            estimates,
            f"{type(iterative).__name__} is cheaper: matrix-free.",
        )

    def _preconditioned(
        self,
        operator: lx.AbstractLinearOperator,
        iterative: lx.AbstractLinearSolver,
        *reasons: str,
    ) -> tuple[lx.AbstractLinearSolver, tuple[str, ...]]:
        """`iterative`, with a preconditioner where `preconditioner_choice` takes
        one (CG and GMRES, unless `precondition=False`), and the reasons."""
        if not self.precondition or not isinstance(iterative, (CG, GMRES)):
            return iterative, reasons
        steps = expected_iterations(self.max_steps, operator.in_size())
        chosen, why = preconditioner_choice(
            operator,
            iterative,
            steps,
            self.pattern,
            self.block_size,
            self.memory_budget,
        )
        return chosen, (*reasons, why)

    def select(self, operator: lx.AbstractLinearOperator) -> lx.AbstractLinearSolver:
        """The solver this chooses for `operator` (see `choose`).

        **Arguments:**

        - `operator`: the operator.

        **Returns:**

        A lineax solver.
        """
        return self.choose(operator)[0]

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        if not isinstance(operator, AbstractDispatchOperator):
            try:
                operator = with_policy(operator, Auto(memory_budget=self.memory_budget))
            except TypeError:  # an operator class lineax-dispatch does not know
                pass
        solver, reasons = self.choose(operator)
        inner_solver = getattr(solver, "solver", solver)
        choice = record_solver_choice(
            type(operator).__name__,
            f"{operator.out_size()}x{operator.in_size()}",
            type(inner_solver).__name__
            + (" + preconditioner" * (solver is not inner_solver)),
            reasons,
            self.model().source,
        )
        inner = solver.init(operator, options)
        return hide_static((solver, inner, ChoiceRef(choice)))

    def compute(
        self, state: Any, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        solver, inner, _ = reveal_static(state)
        return solver.compute(inner, vector, options)

    def transpose(self, state: Any, options: dict[str, Any]):
        solver, inner, choice = reveal_static(state)
        inner, options = solver.transpose(inner, options)
        return hide_static((solver, inner, choice)), options

    def conj(self, state: Any, options: dict[str, Any]):
        solver, inner, choice = reveal_static(state)
        inner, options = solver.conj(inner, options)
        return hide_static((solver, inner, choice)), options

    def assume_full_rank(self):
        return self.well_posed is not False


AutoSolver.__init__.__doc__ = """**Arguments:**

- `rtol`, `atol`, `max_steps`: for the iterative solver, if one is chosen.
- `well_posed`: as lineax's `AutoLinearSolver`: `None` (the default, as
    optimistix's least-squares solvers use) for a square operator assumed
    nonsingular or a rectangular one assumed of full rank (lineax's QR when
    direct, `LSMR` when iterative), so `GaussNewton`, `Dogleg` and the
    Levenberg-Marquardt solvers take a bare `AutoSolver()`; `True` for square
    nonsingular operators only (a rectangular one is an error); `False` for
    least-squares and minimum-norm solutions of any operator (lineax's SVD when
    direct, `LSMR` when iterative).
- `memory_budget`: bytes or a string like `"2GB"` the dense matrix and its factors
    may take; `None` uses the operator's `Auto` budget, else half of the free
    memory.
- `cost_model`: the machine constants of the estimates (an `lxd.CostModel`). `None`
    (the default) uses this machine's, as `lxd.Auto` does.
- `pattern`: the sparsity of the operators ([`lineax_dispatch.Stencil`][],
    [`lineax_dispatch.Band`][]), from which a preconditioner is built with a few
    coloured probe vectors; `None` if not known.
- `block_size`: consider block Jacobi with blocks of this size rather than Jacobi.
- `precondition`: whether to consider a preconditioner at all (see
    [`lineax_dispatch.PreconditionedSolver`][]).
"""


def _estimated_times(
    o: Any,
    model: Any,
    cost: Any,
    iterative: lx.AbstractLinearSolver,
    max_steps: int | None,
    itemsize: int,
) -> tuple[float, float, str, int]:
    """`(direct, iterative, source, steps)`: the estimated seconds to compile and
    run once a direct solve (the matrix built from `mv`s where it is not held,
    then factorised) and `iterative`'s solve of its expected steps; where the
    matrix comes from; those steps. `o` is the operator's observation (its sizes
    are the operator's), `cost` the direct solve's `_direct_cost`."""
    m, n = o.out_size, o.in_size
    if o.explicit:  # the entries are there: no build; an mv is a matmul
        source = "the operator's entries"
        direct_time = 0.0
        run = max(
            2 * m * n / model.flops_per_second,
            o.matrix_bytes / read_rate(o.matrix_bytes, model),
        )
        copy = model.matmul_site
    else:
        source = f"{n} mvs of {o.mv_flops:.3g} flops"
        direct_time = (
            model.materialise_fixed
            + batched_compile(o, model)
            + n * o.mv_flops / model.flops_per_second
        )
        run, copy = mv_run(o, model), mv_compile(o, model)
    direct_time += cost.flops / model.factor_flops_per_second
    steps = expected_iterations(max_steps, n)
    mvs = 2 if isinstance(iterative, LSMR) else 1
    step = mvs * run + model.krylov_step
    vectors = 10 * vector_bytes(m + n, itemsize)
    step += vectors / read_rate(vectors, model)
    iterative_time = model.krylov_compile + mvs * copy + steps * step
    return direct_time, iterative_time, source, steps
