"""A linear system in residual form, applied through one call site.

A solver asks the system for `N x` or for the residual `c - N x` through the same
function, `system.apply(x, residual)`, which calls the operator's `mv` once. The
square solvers of this package are written against this, so that the initial
residual, residual refreshes and the Krylov iteration share one `mv` site, and so
that `Normal` can hand them `N = A^H A` with `c = A^H b` without a second site for
`A^H b`."""

from collections.abc import Callable
from typing import Protocol

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
from jaxtyping import Array, Bool, PyTree

from ..._reductions import (
    all_finite,
    largest_and_smallest,
    LIBRARY_REDUCTION_SIZE,
)
from ._flat_vectors import (
    binary_scale,
    binary_scale_of_largest,
    both,
    flat_mv,
    Flattener,
    result_dtype,
    select,
)
from ._packed_loop import on_xla_cpu


# Below this many unknowns `System.updated_residual` is as fast without a `lax.cond`
# (and CG's `residual_update="auto"` takes none).
UPDATE_IN_COND = 4096


class System(eqx.Module):
    """`N y = c` as seen by a solver.

    **Fields:**

    - `apply`: `(x, residual) -> c - N x` where `residual` is true, else `N x`.
    - `rhs`: `c` as a flat array, or `None` when it is only known through `apply`;
        then the solver must start at `y = 0`, where the first residual is `c`.
    - `offset`: the solution of the user's problem is `offset + y` (used by the
        stopping test's `|y|` scale); `None` for no offset.
    - `flat`: ravels and unravels vectors of the system's structure.
    - `split`: `(x, residual) -> (apply(x, residual), N x)` through the same one
        `mv`, where the system can give `N x` apart from the residual (the plain
        system); `None` where it cannot (see `apply_split`).
    - `unit`: the power of two by which the user's right-hand side (and initial
        estimate) was divided to give this system's (see `rhs_unit`): the
        user's solution is `unit` times the system's, and an absolute tolerance
        `atol` of the user's is `atol / unit` here. `None` for no division.
    - `residual_of`: `w -> c - w` as the plain system computes it inside a loop
        (see `residual_in_units`); `None` for `rhs - w`.
    - `rhs_finite`: whether `rhs` is finite, where the system knows it already
        (`plain_system`, from the reduction of `rhs_unit_and_finite`); `None`
        where `scale_of_rhs` reduces `rhs` for it.
    """

    apply: Callable[[Array, Bool[Array, ""]], Array]
    rhs: Array | None
    offset: Array | None
    flat: Flattener
    split: Callable[[Array, Bool[Array, ""]], tuple[Array, Array]] | None = None
    unit: Array | None = None
    residual_of: Callable[[Array], Array] | None = None
    rhs_finite: Bool[Array, ""] | None = None

    def apply_split(self, x: Array, residual: Bool[Array, ""]) -> tuple[Array, Array]:
        """`(apply(x, residual), product)` from one `mv`, where `product` is `N x`
        whenever `residual` is false (and, where `residual` is true, either `N x`
        or the same as the first). A solver that reads `N x` only on its
        non-residual passes uses `product` there: it is the `mv`'s output itself,
        not a select between it and the residual, which XLA:CPU would compile as
        a kernel of its own."""
        if self.split is None:
            out = self.apply(x, residual)
            return out, out
        return self.split(x, residual)

    def updated_residual(
        self,
        residual: Bool[Array, ""],
        out: Array,
        product: Array,
        r: Array,
        coef: Array,
        taken: Bool[Array, ""],
        in_cond: bool,
    ) -> Array:
        """From a pass's `(out, product) = apply_split(x, residual)`: the residual
        `out` where `residual` is true, else `r - coef * product` where the step
        was `taken`, else `r`.

        A select between the two, except for the plain system where `in_cond`:
        there a `lax.cond` whose branches read `N x` (the `mv`'s output) as
        computed, `c - N x` or `r - coef N x`. As a select, XLA:CPU fuses the
        `mv`'s own operations into the update and computes them a second time
        there, from `UPDATE_IN_COND` unknowns on; the `cond` costs more compile
        (CG's `residual_update` weighs the two: `cg/_layout_choice.py`; the
        figures are `python -m benchmarks.steady`'s). The branch reads `taken`
        and `coef` as they are, and selects the coefficient itself: selected
        before, the coefficient is an operand of the `cond`, which XLA:CPU
        computes in a kernel of its own.
        """
        rhs = self.rhs
        if self.split is None or rhs is None or not in_cond:
            return select(residual, out, r - select(taken, coef, 0) * product)
        residual_of = self.residual_of or (lambda w: rhs - w)
        return lax.cond(
            residual,
            lambda w, r, coef, taken: residual_of(w),
            lambda w, r, coef, taken: r - select(taken, coef, 0) * w,
            product,
            r,
            coef,
            taken,
        )

    def total(self, y: Array) -> Array:
        """The solution of the user's problem for the system's iterate `y`."""
        return y if self.offset is None else self.offset + y

    def scale_of_rhs(
        self, scale: Callable[[Array], Array], like: Array | jax.ShapeDtypeStruct
    ) -> tuple[Array, Bool[Array, ""]]:
        """The initial `(scale(c), all_finite(c))` of a solver's loop.

        **Arguments:**

        - `scale`: the function of `c` the solver's stopping test reads (e.g.
            `atol + rtol * |c|`).
        - `like`: an array, or `jax.ShapeDtypeStruct`, shaped as `c`.

        **Returns:**

        The pair; where `c` is unknown (`rhs` is `None`), a placeholder
        `(zeros, True)` shaped as `scale(like)`, which the loop replaces on its
        first pass by `from_first_residual`.
        """
        if self.rhs is None:
            shape = jax.eval_shape(scale, like)
            return jnp.zeros_like(shape), jnp.array(True)
        finite = all_finite(self.rhs) if self.rhs_finite is None else self.rhs_finite
        return scale(self.rhs), finite

    def from_first_residual(
        self,
        first: Bool[Array, ""],
        residual: Array,
        scale: Callable[[Array], Array],
        current: tuple[Array, Bool[Array, ""]],
    ) -> tuple[Array, Bool[Array, ""]]:
        """`current`, the `(scale(c), all_finite(c))` of `scale_of_rhs`, derived
        from the first residual where `c` is unknown: at `y = 0` it is `c`.

        **Arguments:**

        - `first`: whether this is the loop's first pass, where `residual` is
            `c - N y0`.
        - `residual`: the output of the pass's `apply` (after the preconditioner
            where the solver scales the preconditioned residual).
        - `scale`: as given to `scale_of_rhs`.
        - `current`: the pair carried by the loop.

        **Returns:**

        The pair to carry on.
        """
        if self.rhs is not None:
            return current
        scaled, finite = current
        new = scale(residual)
        return (
            jnp.where(first, new, scaled),
            jnp.where(first, all_finite(residual), finite),
        )


def rhs_unit(b: Array) -> Array:
    """The power of two `2^e` with `max |b|` in `[2^e, 2^(e+1))`, as a real
    scalar; 1 where `b` is zero or not finite.

    Dividing the right-hand side (and the initial estimate) by it makes a
    solver's loop see a right-hand side of largest entry in `[1, 2)` whatever the
    scale of the user's: its inner products neither overflow (`|b|^2` of a
    float32 `b` with entries about 1e20) nor underflow (`b` about 1e-30), and the
    thresholds it compares them with mean the same at every scale. A power of two
    divides exactly (no rounding, away from overflow and subnormals), so the
    iterates are the user's own, scaled.
    """
    return rhs_unit_and_finite(b)[0]


def rhs_unit_and_finite(b: Array) -> tuple[Array, Bool[Array, ""]]:
    """`(rhs_unit(b), all_finite(b))`. A solver whose loop needs both (GMRES,
    BiCGStab, MINRES) reads no further reduction of `b`, nor `b / unit` as an
    array of its own. A long real `b` is read by two reductions XLA:CPU runs as
    library kernels (`max |b|` and the sum of `all_finite`, see
    `LIBRARY_REDUCTION_SIZE`); a shorter one by one reduction with two outputs,
    `max |b|` as `max(max b, -min b)`, and `b` finite where both are (`lax.max`
    and `lax.min` propagate a NaN)."""
    if b.size == 0 or b.size >= LIBRARY_REDUCTION_SIZE or jnp.iscomplexobj(b):
        return binary_scale(b), all_finite(b)
    top, bottom = largest_and_smallest(b)
    finite = both(lax.is_finite(top), lax.is_finite(bottom))
    return binary_scale_of_largest(lax.max(top, lax.neg(bottom))), finite


def residual_in_units(b: Array, unit: Array) -> Callable[[Array], Array]:
    """`w -> b / unit - w` for the power of two `unit`, computed as
    `(b - w unit) / unit`: the same values (scaling by a power of two is exact,
    away from overflow and subnormals), but reading the user's `b` rather than
    `b / unit`, which a loop would read as an array computed before it (XLA
    moves a computation that does not change in the loop out of it): a kernel
    of its own and an array more in the loop's state."""
    u = unit.astype(b.dtype)
    return lambda w: lax.div(lax.sub(b, lax.mul(w, u)), u)


def in_user_units(y: Array, unit: Array) -> Array:
    """`y * unit`, the solution of a system whose right-hand side was divided by
    the power of two `unit`. On XLA:CPU in a `lax.cond` taken where `unit` is
    not 1: the product is a kernel of its own rather than fused into the kernels
    that read the solution (XLA:CPU compiles each distinct kernel once; fused, a
    second solve's preparation and every `mv` of a solution differ from the same
    computations on an argument, and compile again), and where `unit` is 1 no
    product is computed. Under `vmap` the `cond` is taken where any vector's
    `unit` is not 1 (`nonbatchable(unvmap_any(...))`), and multiplies each by
    its own, exactly 1 for the rest: no select of the two. Elsewhere the product
    as it reads (see `_packed_loop.on_xla_cpu`)."""

    def product(y: Array, u: Array) -> Array:
        return lax.mul(y, u.astype(y.dtype))

    if not on_xla_cpu():
        return product(y, unit)
    scaled = lax.ne(unit, jnp.ones((), unit.dtype))
    return lax.cond(
        eqxi.nonbatchable(eqxi.unvmap_any(scaled)),
        product,
        lambda y, u: y,
        y,
        unit,
    )


def flatteners(
    operator: lx.AbstractLinearOperator, vector: PyTree[Array]
) -> tuple[Flattener, Flattener]:
    """The flatteners of `operator`'s input and output structures, in the dtype a
    solve of `operator y = vector` works in. Each structure is asked for once: a
    lineax `FunctionLinearOperator` looks its output structure up in a cache keyed
    on its function, at a cost per ask."""
    in_structure, out_structure = operator.in_structure(), operator.out_structure()
    dtype = result_dtype(vector, in_structure, out_structure)
    return Flattener(in_structure, dtype), Flattener(out_structure, dtype)


def plain_system(
    operator: lx.AbstractLinearOperator, vector: PyTree[Array], y0: PyTree | None
) -> tuple[System, Array]:
    """The system `A y = b / unit`, and the flat starting point `y0 / unit`, for
    the power of two `unit = rhs_unit(b)` (`System.unit`). (`N` is `A`; the
    operator is square for every solver but `LSMR`.)

    The iterate stays in the system's units, the solution multiplied back after
    the loop: kept in the user's units instead (each step multiplied by `unit`
    as it is added), a float32 solve whose solution lies within a few powers of
    ten of float32's smallest normal number would take steps that XLA:CPU
    flushes to zero, and its update's tolerance `rtol |y|` with them
    (`tests/solvers/test_units.py`)."""
    flat, out_flat = flatteners(operator, vector)
    mv = flat_mv(operator, flat, out_flat)
    b = out_flat.ravel(vector)
    unit, finite = rhs_unit_and_finite(b)
    residual_of = residual_in_units(b, unit)
    b = b / unit.astype(b.dtype)

    def split(x: Array, residual: Bool[Array, ""]) -> tuple[Array, Array]:
        w = mv(x)
        return select(residual, residual_of(w), w), w

    def apply(x: Array, residual: Bool[Array, ""]) -> Array:
        return split(x, residual)[0]

    if y0 is None:
        y0_flat = flat.zeros()
    else:
        y0_flat = flat.ravel(y0) / unit.astype(flat.dtype)
    system = System(
        apply=apply,
        rhs=b,
        offset=None,
        flat=flat,
        split=split,
        unit=unit,
        residual_of=residual_of,
        rhs_finite=finite,
    )
    return system, y0_flat


def flat_preconditioner(
    preconditioner: lx.AbstractLinearOperator | None, flat: Flattener
) -> Callable[[Array], Array]:
    """The preconditioner as a function of flat vectors (identity when `None`)."""
    if preconditioner is None:
        return lambda x: x
    return flat_mv(preconditioner, flat, flat)


class LoopEnd(Protocol):
    """The fields of a loop state that `loop_end` reads (read-only, as the fields of
    the solvers' `NamedTuple` states)."""

    @property
    def y(self) -> Array: ...
    @property
    def step(self) -> Array: ...


class Residuals(Protocol):
    """The fields of a loop state that lineax's stopping test reads (read-only)."""

    @property
    def y(self) -> Array: ...
    @property
    def r(self) -> Array: ...
    @property
    def diff(self) -> Array: ...
    @property
    def b_scale(self) -> Array: ...
