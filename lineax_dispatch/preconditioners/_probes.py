"""Reading an operator's diagonal blocks through its `mv`: from coloured probe
vectors where a pattern allows, otherwise from basis vectors, in batches within a
memory budget, the batched products at float32's precision or above
(`_precision.batched_products`, as every build of this package)."""

import functools
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.flatten_util as jfu
import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
import numpy as np
from jaxtyping import Array, Inexact, Int

from .._explicit_axes import explicit_sharding
from .._precision import batched_products
from ..operators import AbstractDispatchOperator
from ..policies import RawMv
from ..policies._dense import images_of_basis
from ..policies._memory import format_bytes, itemsize
from ._patterns import AbstractPattern, Colouring


def plain_mv(operator: lx.AbstractLinearOperator) -> Callable[[Any], Any]:
    """The operator's lineax `mv`, whatever its policy (an operator of this
    package's), or its `mv` (a plain lineax operator's)."""
    if isinstance(operator, AbstractDispatchOperator):
        return RawMv(operator)
    return operator.mv


class Route(eqx.Module):
    """How the blocks of a matrix-free operator are read: `probes` vectors through
    `mv` (`colouring` `None`: basis vectors), `batch` of them at a time."""

    probes: int = eqx.field(static=True)
    batch: int = eqx.field(static=True)
    colouring: Colouring | None = eqx.field(static=True)

    def describe(self) -> str:
        """The route in words."""
        at_once = (
            "all at once" if self.batch >= self.probes else f"{self.batch} at a time"
        )
        if self.colouring is None:
            return f"{self.probes} basis vectors through `mv`, {at_once}"
        return (
            f"{self.probes} coloured probe vectors through `mv` "
            f"({self.colouring.description}), {at_once}"
        )


def route(
    operator: lx.AbstractLinearOperator,
    block_size: int,
    pattern: AbstractPattern | None,
    budget: int,
) -> Route:
    """The route `probe_blocks` takes for `operator`: coloured probes where
    `pattern` gives fewer than one per unknown, else basis vectors; as many at a
    time as `budget` bytes hold (each probe and its image, besides the blocks).

    **Arguments:**

    - `operator`: a square operator.
    - `block_size`: the size of the diagonal blocks (1: the diagonal).
    - `pattern`: the user's pattern, or `None`.
    - `budget`: bytes.

    **Returns:**

    A `Route`. Raises a `ValueError` naming `memory_budget` where not one probe
    fits.
    """
    n = operator.in_size()
    colouring = None if pattern is None else pattern.colouring(n, block_size)
    if colouring is not None and colouring.count >= n:
        colouring = None
    probes = n if colouring is None else colouring.count
    size = itemsize(operator)
    kept = n * block_size if colouring is None else probes * n
    per_probe = size * (operator.in_size() + operator.out_size())
    batch = min(probes, (budget - size * kept) // per_probe)
    if batch < 1:
        raise ValueError(
            f"Reading the diagonal blocks of `operator` ({n} unknowns) through "
            f"{probes} probe vectors needs {format_bytes(size * kept + per_probe)} "
            f"at the least (one probe and its image, and what is kept), over the "
            f"`memory_budget` of {format_bytes(budget)}."
        )
    return Route(probes=probes, batch=int(batch), colouring=colouring)


def padded_count(n: int, block_size: int) -> int:
    """The number of blocks of `block_size` covering `n` unknowns."""
    return math.ceil(n / block_size)


def indices(n: int) -> Int[Array, " n"]:
    """`0, ..., n - 1`, as int32 where they fit: with float64 enabled `jnp.arange`
    gives int64, which XLA:TPU emulates, and the division and remainder of a
    colouring then take tens of seconds to compile there."""
    return jnp.arange(n, dtype=jnp.int32 if n < 2**31 else jnp.int64)


def identity_padding(
    blocks: Inexact[Array, "k b b"], n: int
) -> Inexact[Array, "k b b"]:
    """`blocks` with the rows and columns past the `n`-th unknown (those of the
    last block where `n` is not a multiple of the block size) set to the
    identity's."""
    count, size, _ = blocks.shape
    if count * size == n:
        return blocks
    index = indices(count * size).reshape(count, size)
    inside = (index < n)[:, :, None] & (index < n)[:, None, :]
    eye = jnp.eye(size, dtype=blocks.dtype)
    return jnp.where(inside, blocks, eye)


# Up to this many probes the diagonal's masked sum over them is written out.
UNROLLED_SUM = 8

# Up to this many indices the colours are a constant of the program.
TABLE_ENTRIES = 2**20


def colour_table(colouring: Colouring, count: int) -> Int[Array, " count"]:
    """The colour of each of the first `count` flat indices. Up to
    `TABLE_ENTRIES` of them, computed on the host at trace time and held as a
    constant of the program in the smallest integer type of the colours (at most
    a byte an index): computed in the program from the index, they took integer
    divisions and remainders that XLA compiles (the coloured build of a 64 x 64
    stencil compiled in about 0.07 s against 0.05 s, float64 on the CPU), and a
    TPU emulates. Past it, computed in the program, whose size does not grow
    with `count`."""
    if count > TABLE_ENTRIES:
        return jnp.asarray(colouring.colour_of(indices(count)))
    host = colouring.colour_of(np.arange(count, dtype=np.int64))
    kind = np.min_scalar_type(max(colouring.count - 1, 0))
    return jnp.asarray(np.asarray(host).astype(kind))


def _coloured_blocks(
    operator: lx.AbstractLinearOperator, block_size: int, found: Route
) -> Inexact[Array, "k b b"]:
    colouring = found.colouring
    assert colouring is not None
    flat_in, unravel = eqx.filter_eval_shape(jfu.ravel_pytree, operator.in_structure())
    n, b = operator.in_size(), block_size
    sharding = explicit_sharding(flat_in)
    mv = plain_mv(operator)

    count = padded_count(n, b)
    table = colour_table(colouring, count * b)

    def apply(colour):
        probe = (table[:n] == colour).astype(flat_in.dtype)
        if sharding is not None:
            probe = jax.sharding.reshard(probe, sharding)
        image, _ = jfu.ravel_pytree(mv(unravel(probe)))
        return image

    colours = jnp.arange(found.probes, dtype=table.dtype)
    with batched_products():
        if found.batch >= found.probes:
            images = jax.vmap(apply)(colours)
        else:
            images = lax.map(apply, colours, batch_size=found.batch)
    column_colours = table % found.probes
    if b == 1:
        # Entry i of the diagonal was read by the probe of its colour: a masked
        # sum over the probes (one term each), which compiles to less than a
        # gather.
        mine = column_colours[:n] == colours[:, None]
        picked = jnp.where(mine, images, 0)
        if found.probes > UNROLLED_SUM:
            return jnp.sum(picked, axis=0)[:, None, None]
        # A sum of a few rows written out: elementwise, it fuses with the probes'
        # images, where a reduction over them is a kernel of its own.
        return functools.reduce(lax.add, list(picked))[:, None, None]
    images = jnp.pad(images, ((0, 0), (0, count * b - n))).reshape(-1, count, b)
    # Column t of block k was read by the probe of its colour: rows of block k.
    which = column_colours.reshape(count, b).T[:, :, None]
    read = jnp.take_along_axis(images, which, axis=0)  # [t, k, r]
    return jnp.transpose(read, (1, 2, 0))


def _basis_blocks(
    operator: lx.AbstractLinearOperator, block_size: int, found: Route
) -> Inexact[Array, "k b b"]:
    n, b = operator.in_size(), block_size
    count = padded_count(n, b)
    batch = None if found.batch >= n else found.batch
    mv, structure = plain_mv(operator), operator.in_structure()
    if b == 1:  # a masked sum rather than a gather: the image may be sharded
        at = lambda image, index: jnp.sum(jnp.where(jnp.arange(n) == index, image, 0))
        return images_of_basis(mv, structure, n, batch, at)[:, None, None]

    def keep(image, index):
        padded = jnp.pad(image, (0, count * b - n))
        return lax.dynamic_slice(padded, ((index // b) * b,), (b,))

    columns = images_of_basis(mv, structure, n, batch, keep)
    columns = jnp.pad(columns, ((0, count * b - n), (0, 0)))  # [k * b + t, r]
    return jnp.transpose(columns.reshape(count, b, b), (0, 2, 1))


def probe_blocks(
    operator: lx.AbstractLinearOperator, block_size: int, found: Route
) -> Inexact[Array, "k b b"]:
    """The diagonal blocks of `operator` read through its lineax `mv` along
    `found` (see `route`), those past its last unknown the identity's.

    **Arguments:**

    - `operator`: a square operator.
    - `block_size`: the size of the blocks.
    - `found`: the route.

    **Returns:**

    An array of `ceil(n / block_size)` blocks of `block_size` x `block_size`.
    """
    if found.colouring is None:
        blocks = _basis_blocks(operator, block_size, found)
    else:
        blocks = _coloured_blocks(operator, block_size, found)
    return identity_padding(blocks, operator.in_size())
