"""The values a rolled loop carries and reads (see `_roll_loop.py`): each typed exactly
as its aval, whatever branch wrote it; a slot's value before the loop; a branch's
literal read from its table at the step."""

from collections.abc import Sequence
from typing import Any

import jax
import jax.lax as lax
import jax.numpy as jnp

from ..._explicit_axes import explicit_sharding


def as_aval(value: Any, aval: Any) -> Any:
    """`value` with exactly `aval`'s dtype and no weak type, and its sharding where
    that is on an Explicit mesh axis (part of the type), so that a loop carry has
    one type whatever branch wrote it."""
    out = lax.convert_element_type(jnp.asarray(value), aval.dtype)
    sharding = explicit_sharding(aval)
    if sharding is not None and explicit_sharding(out) != sharding:
        out = jax.sharding.reshard(out, sharding)
    return out


def at(table: jax.Array, j: jax.Array) -> jax.Array:
    """`table[j]` for a step number `j` known to be in range (no wrap-around of
    negative indices to compile)."""
    return lax.dynamic_index_in_dim(
        table, j, keepdims=False, allow_negative_indices=False
    )


def table_literal(table: dict, key: Any, j: Any, value: Any, aval: Any) -> Any:
    """A literal of a branch's code at step `j`: from its table where the steps
    differ in it, else `value`."""
    if key not in table:
        return value
    return lax.convert_element_type(at(table[key], j), aval.dtype)


def zeros(aval: Any) -> jax.Array:
    """Zeros of type `aval` (its sharding too, where on an Explicit axis)."""
    return jnp.zeros(aval.shape, aval.dtype, out_sharding=explicit_sharding(aval))


def slot_start(start: Any, aval: Any, env: dict) -> jax.Array:
    """A slot's value before the loop (`RollPlan.initial`)."""
    if start is None:
        return zeros(aval)
    kind, value = start
    value = env[value] if kind == "var" else value
    return as_aval(jnp.broadcast_to(jnp.asarray(value), aval.shape), aval)


def set_slots(env: dict, slot_vars: Sequence[Any], slots: Sequence[Any]) -> None:
    """Binds each slot's variable (`None`: the slot holds nothing) to its value."""
    env.update((v, x) for v, x in zip(slot_vars, slots) if v is not None)
