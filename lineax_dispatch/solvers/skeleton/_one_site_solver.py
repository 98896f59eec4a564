"""What every iterative solver of this package shares: tolerances, the stopping
test and the mapping from how a loop ended to lineax's `RESULTS`."""

import abc
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
import numpy as np
from jaxtyping import Array, Bool, PyTree, Scalar
from lineax.internal import max_norm

from ..._validate import as_int, as_real, check_tolerance
from ...policies.calls._recorder import own_code
from .._prepare import expected_iterations, resolve_for_solve, stated_tolerance
from ._flat_vectors import (
    both,
    conj_options,
    constant,
    dot,
    Flattener,
    keep_conj,
    preconditioner_and_y0,
    quotient,
    structure_mesh,
    transpose_options,
)
from ._linear_system import (
    flat_preconditioner,
    in_user_units,
    LoopEnd,
    plain_system,
    Residuals,
    System,
)
from ._loop_results import finish_result, results_where


_State = TypeVar("_State")

FUSED_TEST_BELOW = 1024  # (unknowns: see `measure_and_dot`)

# A check of CG or MINRES (the true residual after a step whose updated residual passed the test)
# passes where the true residual is within this many times the tolerance: `b - A y`
# computed in the dtype carries rounding of the tolerance's order where the
# tolerance is near the dtype's precision (on a float32 system preconditioned by
# its inverse, the true residual of lineax's solution measured 1.34 of the
# tolerance as computed in float32, 0.72 exactly), and the updated residual,
# within the tolerance, drifts from it by no more than that.
CHECK_SLACK = 2.0


class AbstractOneSiteSolver(lx.AbstractLinearSolver[_State], Generic[_State]):
    """Abstract base class for the iterative solvers of lineax-dispatch.

    Each concrete solver writes `operator.mv` at exactly one place in its traced
    program (and the preconditioner's `mv` at most at one): the loop body has a
    single application slot whose input is chosen by data on the loop's phase, so
    the initial residual and any residual refresh go through the same slot as the
    iteration itself. An expensive `mv` is therefore traced and compiled once.
    (CG also has an inline layout, with lineax's three sites, which it takes
    where a copy of `mv` is cheap to compile: see [`lineax_dispatch.CG`][].)

    Subclasses declare `rtol`, `atol`, `norm` and `max_steps` as lineax's solvers
    do (same names, order and defaults), call `self.prepare(operator)` in `init`
    (which fixes an `Auto` operator's decision once per solve), and implement the
    abstract `solve_system(system, precond, y0)`, whose loop applies the operator
    only through `system.apply(x, residual)`. [`lineax_dispatch.Normal`][] relies
    on this to hand them the normal equations with one site for `A` and one for
    its transpose. The loops share lineax's stopping test (`not_converged`), the
    mapping of their end to `RESULTS` (`loop_end`) and, where the right-hand side
    is known only through the first residual, its derivation from that residual
    (`System.scale_of_rhs`, `System.from_first_residual`).

    !!! Example

        ```python
        solver = lxd.CG(rtol=1e-6, atol=1e-6)
        assert isinstance(solver, lxd.AbstractOneSiteSolver)
        assert isinstance(solver, lx.AbstractLinearSolver)
        ```
    """

    # Whether `options["preconditioner"]` is accepted, and whether it must be
    # tagged positive semidefinite.
    takes_preconditioner: ClassVar[bool] = True
    psd_preconditioner: ClassVar[bool] = False
    # Whether `vmap` can batch the solve of vectors sharded over an Explicit mesh
    # axis (`batch_solve` solves them one after another where it cannot).
    vmaps_explicit_axes: ClassVar[bool] = True

    rtol: eqx.AbstractVar[float]
    atol: eqx.AbstractVar[float]
    norm: eqx.AbstractVar[Callable[[PyTree], Scalar]]
    max_steps: eqx.AbstractVar[int | None]

    def __check_init__(self):
        name = type(self).__name__
        for field in ("rtol", "atol"):
            check_tolerance(getattr(self, field), f"{name}(..., {field}=...)")
        if not callable(self.norm):
            raise ValueError(
                f"`{name}(..., norm=...)` must be a function of a PyTree returning a "
                f"scalar (e.g. `lineax.internal.max_norm`); got {self.norm!r} of type "
                f"{type(self.norm).__name__}."
            )
        steps = as_int(self.max_steps)
        if self.max_steps is not None and (steps is None or steps < 0):
            raise ValueError(
                f"`{name}(..., max_steps=...)` must be a non-negative int or None, "
                f"got {self.max_steps!r}."
            )
        if not self.has_scale and self.max_steps is None:
            raise ValueError(
                f"`{name}` needs `rtol`, `atol` or `max_steps` (or a combination): "
                "got rtol=0, atol=0 and max_steps=None, which would never stop."
            )

    @property
    def has_scale(self) -> bool:
        return not (as_real(self.atol) == 0 and as_real(self.rtol) == 0)

    @abc.abstractmethod
    def solve_system(
        self, system: System, precond: Callable[[Array], Array], y0: Array
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """Runs the solver on `system` from `y0`.

        The loop applies the system's operator only through
        `system.apply(x, residual)`. Where `system.rhs` is `None`, `y0` is zero and
        the right-hand side is known through the first residual only (see
        `System.scale_of_rhs`).

        **Arguments:**

        - `system`: the square system `N y = c`, on flat vectors.
        - `precond`: the preconditioner as a function of flat vectors (the identity
            where none was given).
        - `y0`: the flat initial estimate.

        **Returns:**

        The flat solution (with the system's offset added), the result and the
        stats.
        """

    def solve_square(
        self,
        operator: lx.AbstractLinearOperator,
        vector: PyTree[Array],
        options: dict[str, Any],
    ) -> tuple[Array, lx.RESULTS, dict[str, Any], Flattener]:
        """Reads `options`, builds the square system `operator y = vector` and runs
        `self.solve_system` on it. Returns the flat solution, the result, the stats
        and the flattener of the solution. All of it is this package's own code
        (`own_code`: the `jax.numpy` functions it calls reuse their traces from
        earlier programs); the operator's and preconditioner's `mv`s are the user's
        (`flat_mv` applies them under the program's own jit-cache context)."""
        with own_code(), structure_mesh(operator):
            return self._solve_square(operator, vector, options)

    def _solve_square(
        self,
        operator: lx.AbstractLinearOperator,
        vector: PyTree[Array],
        options: dict[str, Any],
    ) -> tuple[Array, lx.RESULTS, dict[str, Any], Flattener]:
        name = type(self).__name__
        preconditioner, y0 = preconditioner_and_y0(
            operator,
            vector,
            options,
            allow_preconditioner=self.takes_preconditioner,
            solver_name=name,
        )
        if (
            self.psd_preconditioner
            and preconditioner is not None
            and not lx.is_positive_semidefinite(preconditioner)
        ):
            raise ValueError(
                f"`options['preconditioner']` of `{name}` must be tagged positive "
                "semidefinite (`lx.positive_semidefinite_tag`)."
            )
        system, y0_flat = plain_system(operator, vector, y0)
        precond = flat_preconditioner(preconditioner, system.flat)
        y, result, stats = self.run_system(system, precond, y0_flat)
        return y, result, stats, system.flat

    def run_system(
        self, system: System, precond: Callable[[Array], Array], y0: Array
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """Runs `self.solve_system(system, precond, y0)` as this package's own code:
        its loop under JAX's default jit-cache context, the operator and
        preconditioner applied under the program's (`own_code`). Callers (here
        `solve_square`, and `Normal` for its inner solver) go through this rather
        than calling `solve_system` directly.

        Where the system's right-hand side was divided by a power of two
        (`system.unit`), the loop's tolerances are in those units (see
        `_tolerance`) and the solution it returns is multiplied back.

        **Arguments:** as for `solve_system`.

        **Returns:**

        What `solve_system` returns.
        """
        with own_code():
            y, result, stats = self.solve_system(system, precond, y0)
        if system.unit is not None:
            y = in_user_units(y, system.unit)
        return y, result, stats

    def in_units(self, unit: Array | None) -> "AbstractOneSiteSolver":
        """This solver for a system whose right-hand side is the user's divided by
        `unit`: its absolute tolerance divided by `unit` (a traced scalar), its
        relative one as it is. Itself where `unit` is `None` or `atol` is 0."""
        if unit is None or as_real(self.atol) == 0:
            return self
        atol = jnp.asarray(self.atol, unit.dtype) / unit
        return eqx.tree_at(lambda s: s.atol, self, atol)

    def compute(
        self, state: Any, vector: PyTree[Array], options: dict[str, Any]
    ) -> tuple[PyTree[Array], lx.RESULTS, dict[str, Any]]:
        """For square solvers whose state is the (linearised) operator."""
        y, result, stats, flat = self.solve_square(state, vector, options)
        return flat.unravel(y), result, stats

    def transpose(self, state: Any, options: dict[str, Any]):
        """For solvers whose state is the (linearised) operator: the transposed
        operator and the transposed preconditioner."""
        return state.transpose(), transpose_options(options)

    def conj(self, state: Any, options: dict[str, Any]):
        """For solvers whose state is the (linearised) operator: the conjugate
        operator and the conjugate preconditioner."""
        return keep_conj(state), conj_options(options)

    def assume_full_rank(self):
        return True

    def prepare(self, operator: lx.AbstractLinearOperator) -> lx.AbstractLinearOperator:
        """Fixes an `Auto` operator's strategy for this solve (see
        `resolve_for_solve`), counting the expected iterations as executions, with
        the solve's tolerance (`stated_tolerance`)."""
        executions = expected_iterations(self.max_steps, operator.in_size())
        return resolve_for_solve(operator, executions, stated_tolerance(self))

    def resolve_max_steps(self, size: int) -> int:
        """lineax's default: ten times the number of unknowns."""
        return 10 * size if self.max_steps is None else self.max_steps

    def not_converged(self, system: System, state: Residuals) -> Bool[Array, ""]:
        """lineax's test: the residual `state.r` must be within `atol + rtol * |c|`
        (`state.b_scale`) and the last update `state.diff` within
        `atol + rtol * |y|`, both measured by `norm`."""
        if not self.has_scale:
            return jnp.array(True)
        y_scale = self._y_scale(system, state)
        with jax.numpy_dtype_promotion("standard"):
            update = self.norm(system.flat.unravel(state.diff / y_scale))
        return (self.residual_norm(system, state) > 1) | (update > 1)

    def _y_scale(self, system: System, state: Residuals) -> Array:
        """`atol + rtol * |y|`, elementwise, in the system's units: the scale of
        the update's test."""
        return self._tolerance(system.total(state.y), system.unit)

    def _tolerance(self, x: Array, unit: Array | None = None) -> Array:
        """`atol + rtol * |x|`, elementwise, for `x` in the units of a system whose
        right-hand side is the user's divided by the power of two `unit` (see
        `System.unit`): there `atol / unit + rtol * |x|`, computed as
        `(atol + rtol * |x unit|) / unit`. The same values (scaling by a power of
        two is exact, away from overflow and subnormals), with no scalar
        `atol / unit` apart: a loop reads such a scalar as an array XLA computes
        before it (it moves a computation that does not change in the loop out
        of it), a kernel of its own, where `unit` is in the loop's state anyway.

        With Python numbers for tolerances (as given almost always), in `lax`
        functions at `|x|`'s dtype (see `constant`); else (NumPy or traced
        tolerances) as `jax.numpy` promotes."""
        magnitude = lax.abs(x)
        if unit is None or as_real(self.atol) == 0:
            return self._tolerance_of(magnitude)
        u = unit.astype(magnitude.dtype)
        tolerance = self._tolerance_of(lax.mul(magnitude, u))
        return lax.div(tolerance, u.astype(tolerance.dtype))

    def _tolerance_of(self, magnitude: Array) -> Array:
        """`atol + rtol * magnitude`, elementwise (see `_tolerance`)."""
        if type(self.atol) in (float, int) and type(self.rtol) in (float, int):
            rtol = lax.mul(constant(self.rtol, magnitude), magnitude)
            return lax.add(constant(self.atol, magnitude), rtol)
        with jax.numpy_dtype_promotion("standard"):
            return self.atol + self.rtol * magnitude

    def test_measure(self, system: System, state: Residuals) -> Scalar:
        """The larger of `not_converged`'s two measures: the residual `state.r` and
        the last update `state.diff`, each measured by `norm` in units of its
        tolerance (`state.b_scale`, and `atol + rtol * |y|`). The test passes at
        or below 1; a NaN (a non-finite residual or iterate) fails it.

        With the default `max_norm` both are one reduction over the elementwise
        larger of the two (absolute values before the division by the real
        scales: an infinite complex update stays infinite), where lineax reduces
        each apart: XLA:CPU compiles every reduction in a loop into kernels of its
        own.
        """
        if self.norm is max_norm and system.flat.size > 0:  # (`_max_terms`)
            return jnp.max(self._max_terms(system, state))
        y_scale = self._y_scale(system, state)
        with jax.numpy_dtype_promotion("standard"):
            update = self.norm(system.flat.unravel(state.diff / y_scale))
        return jnp.maximum(self.residual_norm(system, state), update)

    def measure_and_dot(
        self, system: System, state: Residuals, z: Array
    ) -> tuple[Scalar, Scalar]:
        """`test_measure(system, state)` and the inner product `<z, state.r>`
        (`z` conjugated). With the default `max_norm`, below `FUSED_TEST_BELOW`
        unknowns, both in one reduction (a variadic `lax.reduce`): XLA:CPU
        compiles every reduction into kernels of its own, but does not vectorise
        a variadic one (from `FUSED_TEST_BELOW` unknowns it runs slower than the
        two).

        **Arguments:** `system` and `state` as for `test_measure`; `z` a flat vector
        of `state.r`'s shape (the preconditioned residual).

        **Returns:** `(measure, inner product)`.
        """
        if not self.fused_test(system.flat.size):
            return self.test_measure(system, state), dot(z, state.r)
        terms = self._max_terms(system, state)
        products = lax.mul(lax.conj(z) if jnp.iscomplexobj(z) else z, state.r)
        return lax.reduce(
            (terms, products),
            (constant(-np.inf, terms), constant(0, products)),
            _max_and_sum,
            (0,),
        )

    def fused_test(self, size: int) -> bool:
        """Whether `measure_and_dot` takes one reduction for `size` unknowns."""
        return self.norm is max_norm and 0 < size < FUSED_TEST_BELOW

    def _max_terms(self, system: System, state: Residuals) -> Array:
        """The elementwise larger of the residual and the update, each in units of
        its tolerance: `max_norm`'s test is their maximum."""
        residual = quotient(lax.abs(state.r), state.b_scale)
        return lax.max(
            residual, quotient(lax.abs(state.diff), self._y_scale(system, state))
        )

    def residual_norm(self, system: System, state: Residuals) -> Scalar:
        """The residual `state.r` measured by `norm` in units of its tolerance
        `state.b_scale` (`atol + rtol * |c|`): the first half of `not_converged`'s
        test, which it passes at or below 1."""
        with jax.numpy_dtype_promotion("standard"):
            return self.norm(system.flat.unravel(state.r / state.b_scale))

    def b_scale(self, system: System) -> Callable[[Array], Array]:
        """`c -> atol + rtol * |c|`, elementwise, for a right-hand side `c` of
        `system` (in its units: see `_tolerance`): the scale of lineax's residual
        test."""
        return lambda c: self._tolerance(c, system.unit)

    def steps_result(self, hit: Bool[Array, ""]) -> lx.RESULTS:
        """The result of a loop that ran out of steps short of convergence where
        `hit`: lineax's convention is `singular` when `max_steps=None` (the default
        bound of 10x the size was hit) and `max_steps_reached` when the user set
        `max_steps`."""
        if self.max_steps is None:
            return results_where(hit, lx.RESULTS.singular, lx.RESULTS.successful)
        if self.has_scale:
            return results_where(
                hit, lx.RESULTS.max_steps_reached, lx.RESULTS.successful
            )
        return lx.RESULTS.successful

    def loop_end(
        self,
        system: System,
        state: LoopEnd,
        max_steps: int,
        not_converged: Bool[Array, ""],
        *,
        finite_input: Bool[Array, ""],
        codes: tuple[tuple[Bool[Array, ""], lx.RESULTS], ...] = (),
        breakdown: Bool[Array, ""] | None = None,
        finite_state: Bool[Array, ""] | None = None,
    ) -> tuple[Array, lx.RESULTS, dict[str, Any]]:
        """What `solve_system` returns once its loop has ended.

        **Arguments:**

        - `system`: the system solved.
        - `state`: the loop's final state (its iterate `y` and step count `step`).
        - `max_steps`: the bound on `state.step` the loop ran under.
        - `not_converged`: the stopping test on the final state.
        - `finite_input`: whether the right-hand side is finite (as far as the
            solver checks it: see `finish_result`'s `finite_state`).
        - `codes`: `(where, result)` pairs applied, in order, over the result of the
            step count.
        - `breakdown`, `finite_state`: as for `finish_result`.

        **Returns:**

        The flat solution (with the system's offset added), the result and the
        stats (`num_steps`, `max_steps`).
        """
        hit = lax.ge(state.step, constant(max_steps, state.step))
        result = self.steps_result(both(hit, not_converged))
        for where, code in codes:
            result = results_where(where, code, result)
        result = finish_result(result, finite_input, breakdown, finite_state)
        stats = {"num_steps": state.step, "max_steps": self.max_steps}
        return system.total(state.y), result, stats


def _max_and_sum(a: tuple, b: tuple) -> tuple:
    """The reduction of `measure_and_dot`: the larger of the terms, the sum of the
    products. One function for every solve, so that JAX traces it once (it caches
    a reduction's computation by the function)."""
    return lax.max(a[0], b[0]), lax.add(a[1], b[1])
