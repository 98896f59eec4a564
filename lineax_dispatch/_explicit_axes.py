"""Whether an array's type carries an Explicit mesh axis (see
`lineax_dispatch.operators._sharding` for what that means for operators and
solvers): the one test every layer shares."""

import math
from typing import Any

import jax
from jax.sharding import AxisType, NamedSharding


def axes_of(entry: Any) -> set:
    """The mesh axis names of one entry of a `PartitionSpec`."""
    if entry is None:
        return set()
    if isinstance(entry, tuple):
        return set(entry)
    return {entry}


def explicit_sharding(x: Any) -> NamedSharding | None:
    """The sharding in `x`'s type where it uses an Explicit mesh axis, else `None`.

    **Arguments:**

    - `x`: an array, a tracer, a `jax.ShapeDtypeStruct` or an abstract value.

    **Returns:**

    A `jax.sharding.NamedSharding` (on an abstract mesh inside a trace), or `None`.
    """
    if isinstance(x, jax.ShapeDtypeStruct):
        sharding = x.sharding
    else:
        try:
            sharding = jax.typeof(x).sharding
        except (TypeError, AttributeError):  # an abstract value (or no array)
            sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return None
    explicit = _explicit_sizes(sharding.mesh).keys()
    if not any(axes_of(entry) & explicit for entry in sharding.spec):
        return None
    return sharding


def _explicit_sizes(mesh: Any) -> dict:
    """`{name: size}` of the Explicit axes of `mesh`."""
    return {
        name: size
        for name, size, kind in zip(mesh.axis_names, mesh.axis_sizes, mesh.axis_types)
        if kind == AxisType.Explicit
    }


def device_parts(x: Any) -> int:
    """How many parts the Explicit sharding in `x`'s type splits it into, one on
    each device: the product of the sizes of the Explicit mesh axes its
    `PartitionSpec` names (XLA places what Auto axes split); 1 without one.

    **Arguments:**

    - `x`: an array, a tracer, a `jax.ShapeDtypeStruct` or an abstract value.

    **Returns:**

    An int, at least 1.
    """
    sharding = explicit_sharding(x)
    if sharding is None:
        return 1
    explicit = _explicit_sizes(sharding.mesh)
    named = [a for entry in sharding.spec for a in axes_of(entry)]
    return math.prod(explicit[a] for a in named if a in explicit)


def parts_of(structure: Any) -> int:
    """The devices an operator's input or output `structure` (a PyTree of
    `jax.ShapeDtypeStruct`s) is split over: those its one array's type splits it
    over on Explicit mesh axes (`device_parts`); 1 otherwise."""
    leaves = jax.tree_util.tree_leaves(structure)
    return device_parts(leaves[0]) if len(leaves) == 1 else 1
