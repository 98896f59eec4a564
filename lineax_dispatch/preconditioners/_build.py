"""`jacobi` and `block_jacobi`: the preconditioners, built from an operator."""

from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
from jax.sharding import PartitionSpec
from jaxtyping import Array, Bool, Inexact, Real

from .._compat import is_tracer
from .._explicit_axes import explicit_sharding
from .._precision import batched_products
from .._reductions import all_finite, largest_and_smallest, LIBRARY_REDUCTION_SIZE
from ..policies._memory import (
    default_memory_budget,
    operator_dtype,
    policy_budget,
)
from ..policies.calls._scope import current_scope
from ._block_inverse import invert_blocks
from ._operators import (
    flat_structure,
)
from ._patterns import AbstractPattern
from ._structure import blocks_of, Part


class Built(eqx.Module):
    """A preconditioner's entries before any check is enforced: the inverse
    (`inverse`: the diagonal's, or the blocks'), whether each entry or block was
    usable (`usable`) and whether all were (`valid`), and the spread of what was
    inverted (`spread`: the largest over the smallest entry of the diagonal, or
    the largest block's 1-norm times the largest inverse block's)."""

    inverse: Inexact[Array, "..."]
    usable: Bool[Array, "..."]
    valid: Bool[Array, ""]
    spread: Real[Array, ""]


def definite_sign(operator: lx.AbstractLinearOperator) -> int:
    """1 for an operator tagged positive semidefinite, -1 for one tagged negative
    semidefinite (its preconditioner is then that of its negation, as CG takes
    it), 0 for neither."""
    if lx.is_positive_semidefinite(operator):
        return 1
    return -1 if lx.is_negative_semidefinite(operator) else 0


def check_operator(operator: Any, what: str) -> None:
    """Raises at trace time unless `operator` is a square lineax operator of an
    inexact dtype whose input and output structures agree."""
    if not isinstance(operator, lx.AbstractLinearOperator):
        raise TypeError(
            f"`{what}(operator)` must be a lineax linear operator; got "
            f"{type(operator).__name__}."
        )
    given_in, given_out = operator.in_structure(), operator.out_structure()
    if flat_structure(given_in) != flat_structure(given_out):
        raise ValueError(
            f"`{what}(operator)` needs a square operator whose input and output "
            f"structures agree; got input {given_in} and output {given_out}."
        )
    dtype = operator_dtype(operator)
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise ValueError(
            f"`{what}(operator)` needs a floating or complex operator; got dtype "
            f"{dtype}."
        )


def resolve_budget(
    operator: lx.AbstractLinearOperator, memory_budget: int | None
) -> int:
    """`memory_budget`, else the operator's own policy's, else half the free
    memory."""
    if memory_budget is not None:
        return memory_budget
    own = policy_budget(getattr(operator, "policy", None))
    return default_memory_budget() if own is None else own


def _invert_diagonal(diagonal: Inexact[Array, " n"], sign: int) -> Built:
    size = jnp.abs(diagonal)
    if sign:
        real = jnp.real(diagonal) * sign
        usable = jnp.isfinite(real) & (real > 0)
        inverse = (1 / jnp.where(usable, real, 1)).astype(diagonal.dtype)
    else:
        real = size
        usable = jnp.isfinite(diagonal) & (diagonal != 0)
        inverse = 1 / jnp.where(usable, diagonal, 1)
    # Every entry is usable where all are finite and the least (of the real
    # parts, or of the sizes) is positive: read with the spread's extremes, not
    # from `usable` in a reduction of booleans (see `LIBRARY_REDUCTION_SIZE`).
    if diagonal.size >= LIBRARY_REDUCTION_SIZE:
        top, bottom, least = jnp.max(size), jnp.min(size), jnp.min(real)
        valid = all_finite(diagonal) & (least > 0)
    else:  # one reduction with three outputs; NaN propagates through each
        top, bottom, least = largest_and_smallest(size, real)
        valid = (least > 0) & jnp.isfinite(top)
    return Built(inverse=inverse, usable=usable, valid=valid, spread=top / bottom)


def _invert_blocks(blocks: Inexact[Array, "k b b"], sign: int) -> Built:
    sharding = explicit_sharding(blocks)
    if sharding is not None:  # JAX's factorisations take no Explicit axis
        blocks = jax.sharding.reshard(blocks, PartitionSpec())
    eye = jnp.broadcast_to(jnp.eye(blocks.shape[1], dtype=blocks.dtype), blocks.shape)
    with batched_products():
        inverse = invert_blocks(blocks * sign if sign else blocks, definite=bool(sign))
    usable = jnp.all(jnp.isfinite(inverse), axis=(1, 2))
    # Arithmetic rather than a select: the blocks may be sharded, the mask not.
    kept = usable.astype(inverse.dtype)[:, None, None]
    inverse = jnp.where(jnp.isfinite(inverse), inverse, 0) * kept + eye * (1 - kept)
    norm = lambda b: jnp.max(jnp.sum(jnp.abs(b), axis=1), axis=-1)  # 1-norms
    spread = jnp.max(norm(blocks)) * jnp.max(norm(inverse))
    if sharding is not None:
        inverse = jax.sharding.reshard(inverse, sharding)
    return Built(inverse=inverse, usable=usable, valid=jnp.all(usable), spread=spread)


def _read(
    operator: lx.AbstractLinearOperator,
    block_size: int,
    pattern: AbstractPattern | None,
    budget: int,
) -> Built:
    blocks = blocks_of(operator, block_size, budget, pattern)
    sign = definite_sign(operator)
    if block_size == 1:
        return _invert_diagonal(blocks[:, 0, 0][: operator.in_size()], sign)
    return _invert_blocks(blocks, sign)


# Compiled once per operator kind and signature where called outside any trace.
_compiled_read = eqx.filter_jit(_read)


def read(
    operator: lx.AbstractLinearOperator,
    block_size: int,
    pattern: AbstractPattern | None,
    budget: int,
) -> Built:
    """The inverse diagonal (`block_size` 1) or inverse diagonal blocks of
    `operator`, with where they are usable and their spread; compiled where run
    eagerly, traced inline otherwise. The result carries no gradient (a
    preconditioner changes the iterates of a solve, not its solution).

    **Arguments:** as for `_structure.plan` (`operator` checked by
    `check_operator`).

    **Returns:**

    A `Built`.
    """
    eager = current_scope() is None and not any(
        is_tracer(x) for x in jax.tree_util.tree_leaves(operator)
    )
    found = (_compiled_read if eager else _read)(operator, block_size, pattern, budget)
    return lax.stop_gradient(found)


def describe(kind: str, operator: lx.AbstractLinearOperator, parts: list[Part]) -> str:
    """A preconditioner's build in words."""
    mvs = sum(p.mvs for p in parts)
    how = "; ".join(p.how for p in parts)
    return (
        f"{kind} of {_article(type(operator).__name__)} of {operator.in_size()} unknowns, "
        f"read from {how} ({mvs} `mv`s in all)."
    )


def _article(name: str) -> str:
    return ("an " if name[0].lower() in "aeiou" else "a ") + name
