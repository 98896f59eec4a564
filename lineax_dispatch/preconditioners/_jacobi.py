"""The public builders: `lxd.jacobi` and `lxd.block_jacobi`."""

import equinox as eqx
import jax.numpy as jnp
import lineax as lx

from .._validate import check_positive_int
from ..policies._memory import optional_budget
from ._build import Built, check_operator, definite_sign, describe, read, resolve_budget
from ._operators import (
    AbstractPreconditioner,
    BlockJacobiPreconditioner,
    flat_structure,
    JacobiPreconditioner,
)
from ._patterns import AbstractPattern, check_pattern
from ._structure import plan


def _failure(what: str, sign: int, blocks: bool) -> str:
    entry = "diagonal block" if blocks else "diagonal entry"
    if sign:
        kind = "positive" if sign == 1 else "negative"
        fault = f"not {kind}{' definite' if blocks else ''} or not finite"
        fault += f", where the operator is tagged {kind} semidefinite"
    else:
        fault = "singular or not finite" if blocks else "zero or not finite"
    return (
        f"`{what}(operator)`: a {entry} of the operator is {fault}. Build with "
        "`throw=False` to hold NaN there instead: a solve of this package's with it "
        "then reports a failed `RESULTS` code."
    )


def assemble(
    operator: lx.AbstractLinearOperator,
    built: Built,
    block_size: int,
    build: str,
    throw: bool | None,
    blocks: bool,
) -> AbstractPreconditioner:
    """The preconditioner of `built`'s entries, a `BlockJacobiPreconditioner`
    where `blocks`: with `throw` an error at run time where an entry is not
    usable; `False` NaN there; `None` the entries as they are (unusable ones
    replaced by the identity's)."""
    sign = definite_sign(operator)
    what = "lxd.block_jacobi" if blocks else "lxd.jacobi"
    if blocks and block_size == 1:
        built = Built(
            inverse=built.inverse[:, None, None],
            usable=built.usable,
            valid=built.valid,
            spread=built.spread,
        )
    valid = built.valid
    inverse = built.inverse
    if throw:
        inverse = eqx.error_if(inverse, ~valid, _failure(what, sign, blocks))
    elif throw is False:
        mask = built.usable[:, None, None] if blocks else built.usable
        inverse = jnp.where(mask, inverse, jnp.nan)
    tags = frozenset()
    if sign:
        tags = frozenset({lx.positive_semidefinite_tag, lx.symmetric_tag})
    kind = BlockJacobiPreconditioner if blocks else JacobiPreconditioner
    return kind(flat_structure(operator.in_structure()), tags, build, valid, inverse)


def _build(operator, block_size, pattern, memory_budget, throw, what):
    if not isinstance(throw, bool):
        raise TypeError(f"`{what}(..., throw=...)` must be a bool; got {throw!r}.")
    blocks = what == "lxd.block_jacobi"
    check_operator(operator, what)
    check_pattern(pattern, f"{what}(..., pattern=...)")
    budget = resolve_budget(operator, optional_budget(memory_budget))
    if pattern is not None:  # a pattern that does not fit the operator fails here
        pattern.colouring(operator.in_size(), block_size)
    parts = plan(operator, block_size, pattern, budget)
    kind = f"Block Jacobi (blocks of {block_size})" if blocks else "Jacobi"
    built = read(operator, block_size, pattern, budget)
    build = describe(kind, operator, parts)
    return assemble(operator, built, block_size, build, throw, blocks)


def jacobi(
    operator: lx.AbstractLinearOperator,
    *,
    pattern: AbstractPattern | None = None,
    memory_budget: int | str | None = None,
    throw: bool = True,
) -> JacobiPreconditioner:
    """The Jacobi preconditioner of `operator`: the inverse of its diagonal, a
    linear operator to give as `options["preconditioner"]` to this package's
    solvers and to lineax's.

    The diagonal is read from the operator's structure where it has one: the
    entries of a matrix, a diagonal or tridiagonal operator, one `mv` of ones for
    an operator tagged diagonal, and the operands of sums, scalings, tags and
    compositions with a diagonal operator. The rest is read through the operator's
    `mv`: where `pattern` states its sparsity, from as many coloured probe vectors
    as the pattern's colouring needs (4 for a 5-point stencil on any 2-D grid);
    otherwise from the `n` basis vectors, as many at a time as `memory_budget`
    holds. The products of a batch of probes run at float32's precision or above
    on every backend. `explain()` of the result says which build was used.

    For an operator tagged positive semidefinite the diagonal must be positive, and
    the result is tagged positive semidefinite (as CG and MINRES need); for one
    tagged negative semidefinite it is the inverse of the negated diagonal (as CG,
    which solves the negated system, needs). Otherwise the diagonal must be
    nonzero. The result carries no gradient: it changes a solve's iterates, not
    its solution, and lineax does not differentiate `options`.

    **Arguments:**

    - `operator`: a square lineax operator (any of lineax's or this package's).
    - `pattern`: an [`lineax_dispatch.Stencil`][] or [`lineax_dispatch.Band`][]
        containing every nonzero of the operator, or `None`.
    - `memory_budget`: bytes (or a string like `"2GB"`) for the probes and their
        images; `None`: the operator's `Auto` or `Materialise` budget, else half
        the free memory.
    - `throw`: where an entry is zero, non-finite or of the wrong sign, raise an
        error when the preconditioner is computed (`True`, as lineax's `throw`),
        or hold NaN there (`False`: a solve of this package's with it reports
        `RESULTS.nonfinite_input`; lineax's own CG does not check what its
        preconditioner returns, so give it `throw=True`).

    **Returns:**

    A [`lineax_dispatch.JacobiPreconditioner`][].

    !!! Example

        ```python
        s = 32
        def diffusion(u):  # -div(a grad u), 5-point, on an s x s grid
            g = jnp.pad(u.reshape(s, s), 1)
            a = 1.0 + jnp.arange(s * s, dtype=u.dtype).reshape(s, s)
            near = g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:]
            return (a * (4 * g[1:-1, 1:-1] - near)).reshape(-1)

        structure = jax.ShapeDtypeStruct((s * s,), jnp.float32)
        op = lxd.FunctionLinearOperator(diffusion, structure)
        five_point = ((1, 0), (-1, 0), (0, 1), (0, -1))
        m = lxd.jacobi(op, pattern=lxd.Stencil((s, s), five_point))  # 4 mvs
        print(m.explain())
        sol = lx.linear_solve(op, jnp.ones(s * s, jnp.float32), lxd.GMRES(1e-5, 1e-5),
                              options={"preconditioner": m})
        ```
    """
    found = _build(operator, 1, pattern, memory_budget, throw, "lxd.jacobi")
    assert isinstance(found, JacobiPreconditioner)
    return found


def block_jacobi(
    operator: lx.AbstractLinearOperator,
    block_size: int,
    *,
    pattern: AbstractPattern | None = None,
    memory_budget: int | str | None = None,
    throw: bool = True,
) -> BlockJacobiPreconditioner:
    """The block Jacobi preconditioner of `operator`: the inverses of its diagonal
    blocks of `block_size` consecutive unknowns (in the flattened order of its
    input; the last block smaller where `block_size` does not divide the size).

    The blocks are read as [`lineax_dispatch.jacobi`][] reads the diagonal: from
    the operator's structure where it has one (a held matrix's entries, a
    diagonal, tridiagonal, sums, scalings, tags, compositions with a diagonal, a
    product of two held matrices), else through `mv`: from coloured probe vectors
    where `pattern` states the sparsity (`block_size` plus about the pattern's
    band width of them), otherwise from the `n` basis vectors within
    `memory_budget`. Each block is inverted once (by Cholesky where the operator is
    tagged positive or negative semidefinite, by LU otherwise; on a TPU by
    Gauss-Jordan elimination in one loop, without and with pivoting, which
    compiles in a fraction of the time there), and applying the result costs
    `2 n block_size` flops.

    **Arguments:**

    - `operator`: a square lineax operator.
    - `block_size`: the size of the blocks, a positive int.
    - `pattern`, `memory_budget`: as for [`lineax_dispatch.jacobi`][].
    - `throw`: where a block is singular, not definite as the operator's tags say,
        or not finite: raise an error when the preconditioner is computed (`True`)
        or hold NaN there (`False`).

    **Returns:**

    A [`lineax_dispatch.BlockJacobiPreconditioner`][].

    !!! Example

        ```python
        matrix = jnp.kron(jnp.eye(4), jnp.array([[4.0, 1.0], [1.0, 3.0]]))
        op = lxd.MatrixLinearOperator(matrix, lx.positive_semidefinite_tag)
        m = lxd.block_jacobi(op, 2)  # the inverse of `matrix`: it is block diagonal
        sol = lx.linear_solve(op, jnp.ones(8), lxd.CG(1e-6, 1e-6),
                              options={"preconditioner": m})
        ```
    """
    block_size = check_positive_int(block_size, "lxd.block_jacobi(block_size=...)")
    found = _build(
        operator, block_size, pattern, memory_budget, throw, "lxd.block_jacobi"
    )
    assert isinstance(found, BlockJacobiPreconditioner)
    return found
