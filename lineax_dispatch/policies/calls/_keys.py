"""Hashable keys: of an operator kind (its static part: functions, tags and
structures, with its arrays abstracted), of a static part of a marked call, and
of a value compared by identity or by its exact bits."""

from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
import lineax as lx
import numpy as np

from ..._compat import (
    hashable_partition,
)


class HashedKey:
    """A value as a jit cache key, hashed once (jax hashes a static argument at
    every call), equal to a key of the same class holding an equal value."""

    def __init__(self, value: Any):
        self.value = value
        self._compared = value  # what `==` compares
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return self is other or (
            type(other) is type(self)
            and self._hash == other._hash
            and self._compared == other._compared
        )


class ByIdentity:
    """A static leaf keyed by identity, the key holding the object (so that the
    identity stays its own): an unhashable one (a user's object defining `__eq__`
    only, which lineax, caching nothing, accepts), or an array in `lxd.jit`'s
    static arguments."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and other.value is self.value


def exact_leaf(leaf: Any) -> Any:
    """A static leaf as it is compared in a key: numbers by type and bits, which
    Python's `==` (and `hash`) does not tell apart (`1`, `1.0`, `True` and `1+0j`
    are equal, as are `0.0` and `-0.0`); anything else as it is."""
    if isinstance(leaf, float):
        return (float, leaf.hex())
    if isinstance(leaf, complex):
        return (complex, leaf.real.hex(), leaf.imag.hex())
    if isinstance(leaf, (bool, int)):
        return (type(leaf), leaf)
    if isinstance(leaf, np.generic):
        return (leaf.dtype.str, leaf.tobytes())
    return leaf


def hashable_leaf(leaf: Any) -> Any:
    """`leaf` where it is hashable, else a wrapper compared by its identity."""
    try:
        hash(leaf)
    except TypeError:
        return ByIdentity(leaf)
    return leaf


class StaticKey(HashedKey):
    """An operator's static part (functions, jaxprs, structures: slow to hash) as a
    cache key: two keys are equal where their static leaves are equal and numbers
    among them are of one type and the same bits (an operator whose static
    arguments are `1` and one whose are `1+0j` trace to different programs;
    lineax, which caches nothing, traces each afresh); an unhashable leaf is
    compared by identity.

    **Arguments:**

    - `value`: the static part, `(leaves, treedef)` (see `hashable_partition`).
    """

    def __init__(self, value: Any):
        leaves, treedef = value
        self.value = value
        exact = (tuple(exact_leaf(leaf) for leaf in leaves), treedef)
        try:
            self._hash = hash(exact)
        except TypeError:  # an unhashable leaf: by identity (found only then)
            exact = (tuple(hashable_leaf(leaf) for leaf in exact[0]), treedef)
            self._hash = hash(exact)
        self._compared = exact


def operator_key(operator: lx.AbstractLinearOperator) -> Any:
    """A hashable key of an operator's kind: its static part (functions, closure-
    converted jaxprs, tags, policy) and the shapes and dtypes of its arrays. Equal
    keys share one outlined callee; decisions are made per key."""
    dynamic, static = hashable_partition(operator, eqx.is_array)
    avals = tuple((tuple(x.shape), str(x.dtype)) for x in jtu.tree_leaves(dynamic))
    return (StaticKey(static), avals)


def is_leaf_array(x: Any) -> bool:
    """Arrays, and the shape-only stand-ins that records keep instead of them."""
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def abstract_operator(operator: Any) -> Any:
    """`operator` with every array replaced by its shape and dtype, so that a
    record of it holds no tracer after its trace has ended."""
    return jtu.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if eqx.is_array(x) else x,
        operator,
    )
