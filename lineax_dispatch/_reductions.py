"""Reductions of vectors that XLA:CPU compiles cheaply: which form of a
reduction it runs as a library kernel, and the finiteness test and extremes
every solver and preconditioner reads."""

import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float, PyTree, Shaped


# XLA:CPU runs a reduction of a float vector of at least this many entries (a
# sum, a maximum, a dot product, with an elementwise operand fused in) as a
# library kernel (YNNPACK's), which compiles in a fraction of a millisecond; a
# shorter one, one of booleans or one with several outputs it generates code for,
# about 5-30 ms of compile each. (jax 0.10.2 to 0.12.1, float32 and float64.)
LIBRARY_REDUCTION_SIZE = 4096


def largest_and_smallest(x: Float[Array, " n"], *others: Float[Array, " n"]) -> tuple:
    """`(max x, min x)` of a real vector, and `min y` of each of `others` (real
    vectors of its length) after them, in one reduction of the vectors
    themselves (a variadic `lax.reduce`): XLA:CPU compiles an elementwise
    function of `x` ahead of a reduction (`|x|`, `x != 0`) as a kernel of its
    own, and a single-operand reduction shorter than `LIBRARY_REDUCTION_SIZE` as
    two more. NaN where a vector holds one (`lax.max` and `lax.min` propagate
    it); `-inf` and `inf` for empty ones."""
    inf = np.array(np.inf, x.dtype)
    operands = (x, x, *others)
    starts = (lax.neg(inf), inf, *(np.array(np.inf, y.dtype) for y in others))
    return tuple(lax.reduce(operands, starts, _max_then_mins, (0,)))


def _max_then_mins(a: tuple, b: tuple) -> tuple:
    """The reduction of `largest_and_smallest`: the maximum of the first operand,
    the minimum of each other. (One function for every call: JAX caches a
    reduction's computation by the function.)"""
    return (lax.max(a[0], b[0]), *(lax.min(p, q) for p, q in zip(a[1:], b[1:])))


def all_finite(tree: PyTree[Array]) -> Array:
    """Whether every entry of every leaf of `tree` is finite: `sum(x * 0)` is 0
    where it is and NaN otherwise (`inf * 0` is NaN, and a sum keeps a NaN).
    From `LIBRARY_REDUCTION_SIZE` entries XLA:CPU compiles such a sum as a
    library kernel with its elementwise operand fused in, in a fraction of the
    time of the code it generates for a reduction of booleans
    (`jnp.all(jnp.isfinite(x))`, at every length) or of several outputs; below
    it, both forms are generated code of about the same compile. The library's
    maximum and minimum do not propagate a NaN in every version (jax 0.10.2's),
    a sum does."""
    out = jnp.array(True)
    for leaf in jtu.tree_leaves(tree):
        if jnp.issubdtype(leaf.dtype, jnp.inexact) and leaf.size:
            out = out & jnp.isfinite(jnp.sum(leaf * 0))
    return out


def any_nonzero(x: Shaped[Array, " n"]) -> Array:
    """Whether any entry of the vector `x` is not zero (or is NaN). A long `x`
    from `sum |x|` (a library kernel, see `LIBRARY_REDUCTION_SIZE`); a shorter
    real one from its largest and smallest entries in one reduction of `x`
    itself (no kernel for `|x|` ahead of it). (Entries below the smallest normal
    number count as zero where XLA:CPU flushes them.)"""
    if x.size == 0:
        return jnp.array(False)
    if x.size >= LIBRARY_REDUCTION_SIZE or jnp.iscomplexobj(x):
        total = jnp.sum(jnp.abs(x))
        return lax.ne(total, np.zeros((), total.dtype))
    top, bottom = largest_and_smallest(x)
    zero = np.zeros((), top.dtype)
    return lax.bitwise_or(lax.ne(top, zero), lax.ne(bottom, zero))
