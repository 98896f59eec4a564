"""Sparsity patterns a user states, and the colourings of probe vectors they allow.

A pattern says which entries of an operator may be nonzero. Columns whose nonzeros
never meet in the rows a preconditioner reads can share one probe vector (the sum
of their basis vectors): one `mv` of it gives each of their entries at once. A
colouring gives each column a colour; the probe vectors are one per colour."""

import abc
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import numpy as np
from jaxtyping import Array, Int

from .._validate import as_int, check_positive_int


# A flat index array: NumPy's where the colours are computed on the host.
_Index = Int[Array, "..."] | Int[np.ndarray, "..."]


class Colouring(eqx.Module):
    """A colouring of the columns of an operator of `size` unknowns.

    - `count`: how many colours (probe vectors).
    - `colour_of`: the colour of each flat column index (an integer array in,
        one of the same shape out), computed with the array's own `//` and `%`
        (NumPy's at trace time: the colours are constants of the program).
    - `description`: the colouring in words.
    """

    count: int = eqx.field(static=True)
    colour_of: Callable[[_Index], _Index] = eqx.field(static=True)
    description: str = eqx.field(static=True)


def band_colouring(size: int, width: int, block_size: int, what: str) -> Colouring:
    """The colouring by flat index modulo a period, for an operator whose nonzeros
    lie within `width` of the diagonal, read in blocks of `block_size` rows and
    columns: columns a period apart never have a nonzero in each other's block.

    **Arguments:**

    - `size`: the operator's unknowns.
    - `width`: the largest distance of a nonzero from the diagonal.
    - `block_size`: the size of the blocks read (1 for the diagonal).
    - `what`: the band in words, for the description.

    **Returns:**

    A `Colouring` of at most `size` colours.
    """
    # Same colour: columns j and j + m * period, m != 0. The rows of j's block lie
    # within block_size - 1 of j, so within a period - block_size + 1 of the other
    # column, more than `width` away.
    repeats = (width + block_size - 1) // block_size + 1
    period = min(block_size * repeats, size)
    return Colouring(
        count=period,
        colour_of=lambda index: index % period,
        description=f"flat index modulo {period} ({what})",
    )


class AbstractPattern(eqx.Module):
    """Which entries of a square operator may be nonzero, as the user states it.
    The preconditioners of [`lineax_dispatch.jacobi`][] and
    [`lineax_dispatch.block_jacobi`][] read the entries they need from as many
    coloured probe vectors as the pattern's colouring needs, where the operator
    has no structure of its own to read them from. Entries outside the pattern
    must be zero: the entries read would otherwise hold sums of several.

    !!! Example

        ```python
        pattern = lxd.Band(lower=2, upper=2)
        assert isinstance(pattern, lxd.AbstractPattern)
        assert pattern.colouring(100, 1).count == 3  # probes for the diagonal
        ```
    """

    @abc.abstractmethod
    def colouring(self, size: int, block_size: int) -> Colouring:
        """The colouring of the columns of an operator of `size` unknowns whose
        diagonal blocks of `block_size` (1: the diagonal) are read.

        **Arguments:**

        - `size`: the operator's unknowns (in the flattened order of its input).
        - `block_size`: the size of the diagonal blocks read.

        **Returns:**

        A `Colouring`.
        """


def check_pattern(pattern: Any, argument: str) -> None:
    """Raises unless `pattern` (given as `argument`) is a pattern or `None`."""
    if pattern is not None and not isinstance(pattern, AbstractPattern):
        raise TypeError(
            f"`{argument}` must be an `lxd.Band`, an `lxd.Stencil` or None; got "
            f"{type(pattern).__name__}."
        )


class Band(AbstractPattern):
    """A banded operator: nonzeros at most `lower` below and `upper` above the
    diagonal, in the flattened order of the operator's input. Its diagonal needs
    `max(lower, upper) + 1` probe vectors.

    !!! Example

        ```python
        # A tridiagonal operator: three probe vectors whatever its size.
        pattern = lxd.Band(lower=1, upper=1)
        ```
    """

    lower: int = eqx.field(static=True)
    upper: int = eqx.field(static=True)

    def __check_init__(self):
        for name in ("lower", "upper"):
            value = as_int(getattr(self, name))
            if value is None or value < 0:
                raise ValueError(
                    f"`Band({name}=...)` must be a non-negative int; got "
                    f"{getattr(self, name)!r}."
                )

    def colouring(self, size: int, block_size: int) -> Colouring:
        width = max(self.lower, self.upper)
        return band_colouring(size, width, block_size, f"a band of width {width}")


def _checked_offsets(shape: tuple[int, ...], offsets) -> tuple[tuple[int, ...], ...]:
    try:
        found = tuple(tuple(o) for o in offsets)
    except TypeError:
        found = ()
    ok = bool(found) and all(
        len(o) == len(shape) and all(as_int(v) is not None for v in o) for o in found
    )
    if not ok:
        raise ValueError(
            "`Stencil(offsets=...)` must be a non-empty sequence of integer tuples, "
            f"each of len(shape) = {len(shape)} entries; got {offsets!r}."
        )
    return tuple(sorted({tuple(int(v) for v in o) for o in found}))


class Stencil(AbstractPattern):
    """An operator on a grid of `shape` (flattened in row-major order, as
    `jnp.ravel`) whose row at a grid point has nonzeros only at that point and at
    its neighbours `offsets` away (the zero offset may be left out). `periodic`
    says whether neighbours wrap around the grid's edges.

    Its diagonal is read from `prod(r + 1)` probe vectors, `r` the largest offset
    along each axis (where the grid wraps, the smallest divisor of the axis's
    length from `r + 1`): 4 for a 5-point or a 9-point stencil in 2-D, 8 for a
    7-point one in 3-D, whatever the grid's size. Blocks of the diagonal (`block
    _jacobi`) are read with the colouring of the band the stencil spans in the
    flattened order.

    !!! Example

        ```python
        # A 5-point stencil on a 64 x 64 grid: 4 probe vectors, not 4096.
        five_point = ((1, 0), (-1, 0), (0, 1), (0, -1))
        pattern = lxd.Stencil((64, 64), five_point)
        ```
    """

    shape: tuple[int, ...] = eqx.field(static=True, converter=tuple)
    offsets: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    periodic: bool = eqx.field(static=True, default=False)

    def __init__(self, shape, offsets, periodic: bool = False):
        try:
            shape = tuple(shape)
        except TypeError:
            shape = (shape,)
        if not shape:
            raise ValueError("`Stencil(shape=...)` must have at least one axis.")
        for s in shape:
            check_positive_int(s, "Stencil(shape=...)")
        self.shape = tuple(int(s) for s in shape)
        self.offsets = _checked_offsets(self.shape, offsets)
        if not isinstance(periodic, bool):
            raise ValueError(
                f"`Stencil(periodic=...)` must be a bool; got {periodic!r}."
            )
        self.periodic = periodic

    def _periods(self) -> tuple[int, ...]:
        """Per axis, the period of the colouring along it."""
        periods = []
        for axis, length in enumerate(self.shape):
            reach = max(abs(o[axis]) for o in self.offsets)
            period = min(reach + 1, length)
            if self.periodic:  # colours must repeat evenly around the wrap
                period = next(p for p in range(period, length + 1) if length % p == 0)
            periods.append(period)
        return tuple(periods)

    def _flat_width(self) -> int:
        strides = [math.prod(self.shape[axis + 1 :]) for axis in range(len(self.shape))]
        if self.periodic:
            return math.prod(self.shape) - 1
        return max(
            abs(sum(o * s for o, s in zip(off, strides))) for off in self.offsets
        )

    def colouring(self, size: int, block_size: int) -> Colouring:
        if size != math.prod(self.shape):
            raise ValueError(
                f"`pattern`, a Stencil on a grid of shape {self.shape} "
                f"({math.prod(self.shape)} points), does not fit an operator of "
                f"{size} unknowns: expected a grid of {size} points."
            )
        if block_size > 1:
            width = self._flat_width()
            what = f"the band of width {width} the stencil spans"
            return band_colouring(size, width, block_size, what)
        periods, shape = self._periods(), self.shape

        def colour_of(index):
            colour = index * 0
            for axis in range(len(shape)):
                coordinate = (index // math.prod(shape[axis + 1 :])) % shape[axis]
                colour = colour * periods[axis] + coordinate % periods[axis]
            return colour

        text = " x ".join(map(str, periods))
        return Colouring(
            count=math.prod(periods),
            colour_of=colour_of,
            description=f"grid coordinates modulo {text}",
        )


Band.__init__.__doc__ = """**Arguments:**

- `lower`: how far below the diagonal nonzeros may lie (a non-negative int).
- `upper`: how far above it.
"""

Stencil.__init__.__doc__ = """**Arguments:**

- `shape`: the grid's shape; its points are the operator's unknowns in row-major
    order.
- `offsets`: the neighbours' offsets, each a tuple of `len(shape)` ints.
- `periodic`: whether neighbours wrap around the grid's edges.
"""
