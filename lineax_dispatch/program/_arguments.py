"""How `lxd.jit` reads its arguments, as `equinox.filter_jit` does: arrays are
traced, everything else is static (part of the cache key); arguments named by
`static_argnums` / `static_argnames` are static whole, their arrays included."""

import dataclasses
import inspect
import numbers
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._compat import array_placement
from ..policies.calls._keys import ByIdentity, exact_leaf, hashable_leaf


# What `equinox.is_array` takes for an array (as a tuple for one `isinstance`).
_NUMPY_TYPES = (np.ndarray, np.generic)
_ARRAY_TYPES = (*_NUMPY_TYPES, jax.Array)


class _Traced:
    """Marks a traced leaf's entry in a key: `(_TRACED, shape, dtype, weak,
    placement)` (no static leaf's exact form holds this private object)."""


_TRACED = _Traced()


class _ByValue(ByIdentity):
    """A NumPy array in a static argument, keyed by its contents when it was
    passed (it may be changed in place later: a program traced with the old
    contents must not serve the new ones)."""

    def __init__(self, value: np.ndarray):
        self.value = value
        self.key = (value.dtype.str, value.shape, value.tobytes())

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: Any) -> bool:
        return type(other) is _ByValue and other.key == self.key


def _hashable(leaf: Any) -> Any:
    """A static leaf of an argument as a key: a NumPy array by its value, a JAX
    array by its identity, anything else as `hashable_leaf`."""
    if isinstance(leaf, np.ndarray):
        return _ByValue(leaf)
    if eqx.is_array(leaf):
        return ByIdentity(leaf)
    return hashable_leaf(leaf)


def _unwrap(leaf: Any) -> Any:
    return leaf.value if isinstance(leaf, ByIdentity) else leaf


@dataclasses.dataclass(frozen=True)
class StaticPart:
    """The static half of one argument: its PyTree structure and its non-traced
    leaves (hashable, or keyed by identity)."""

    treedef: Any
    leaves: tuple

    def combine(self, dynamic: Any) -> Any:
        dynamic_leaves = self.treedef.flatten_up_to(dynamic)
        static_leaves = [_unwrap(x) for x in self.leaves]
        merged = [s if d is None else d for d, s in zip(dynamic_leaves, static_leaves)]
        return jtu.tree_unflatten(self.treedef, merged)


def _split(value: Any, whole: bool) -> tuple[Any, StaticPart, tuple]:
    """`(dynamic, static, key)`: dynamic has the value's structure with `None` for
    every static leaf (so that `donate_argnums` keeps its meaning); `key` is the part of the cache key this value
    makes: its structure, its static leaves as the key compares them (numbers by
    type and bits: `True`, `1`, `1.0` and `1+0j` trace to different programs, as do
    `0.0` and `-0.0`, which Python's `==` takes as one) and its traced leaves'
    shapes, dtypes, weak types and placements (`array_placement`: a program is
    compiled for its arguments' devices, shardings and layouts). (One pass over the
    leaves: `split_arguments` runs at every call of an `lxd.jit` function.)"""
    leaves, treedef = jtu.tree_flatten(value)
    if whole:
        static_leaves = tuple(_hashable(x) for x in leaves)
        dynamic = jtu.tree_unflatten(treedef, [None] * len(leaves))
        key = (treedef, tuple(exact_leaf(x) for x in static_leaves))
        return dynamic, StaticPart(treedef, static_leaves), key
    dynamic_leaves, static_leaves, entries = [], [], []
    for x in leaves:
        if isinstance(x, _ARRAY_TYPES):
            dynamic_leaves.append(x)
            static_leaves.append(None)
            weak = bool(getattr(x, "weak_type", False))
            entries.append((_TRACED, x.shape, x.dtype, weak, array_placement(x)))
        else:
            dynamic_leaves.append(None)
            hashable = _hashable(x)
            static_leaves.append(hashable)
            entries.append(exact_leaf(hashable))
    dynamic = jtu.tree_unflatten(treedef, dynamic_leaves)
    key = (treedef, tuple(entries))
    return dynamic, StaticPart(treedef, tuple(static_leaves)), key


def _normalise(values: Any, kind: type) -> tuple:
    if values is None:
        return ()
    if isinstance(values, kind):
        return (values,)
    return tuple(values)


@dataclasses.dataclass(frozen=True)
class Arguments:
    """One call's arguments, split: `dynamic_args`/`dynamic_kwargs` go to the jitted
    function, `key` identifies the compiled program (static parts and avals)."""

    dynamic_args: tuple
    dynamic_kwargs: dict
    static_args: tuple
    static_kwargs: dict
    key: Any

    def rebuild(self, dynamic_args: tuple, dynamic_kwargs: dict) -> tuple:
        args = tuple(s.combine(d) for d, s in zip(dynamic_args, self.static_args))
        kwargs = {
            name: self.static_kwargs[name].combine(value)
            for name, value in dynamic_kwargs.items()
        }
        return args, kwargs


class StaticSpec:
    """Which arguments of a function are static whole (`static_argnums`,
    `static_argnames`), read once per function and number of positional
    arguments: `split_arguments` runs at every call of an `lxd.jit` function.

    **Arguments:**

    - `fun`: the function (to map `static_argnames` to positions and back).
    - `static_argnums`, `static_argnames`: as for `jax.jit`.
    """

    def __init__(self, fun: Callable, static_argnums: Any, static_argnames: Any):
        self._nums = tuple(int(n) for n in _normalise(static_argnums, numbers.Integral))
        self._names = _normalise(static_argnames, str)
        self._fun = fun
        self._parameters: list[str] | None = None
        self._by_count: dict[int, tuple[frozenset, frozenset]] = {}

    @property
    def any_static(self) -> bool:
        """Whether any argument is static whole."""
        return bool(self._nums or self._names)

    def _read_parameters(self) -> list[str]:
        if self._parameters is None:
            try:
                self._parameters = list(inspect.signature(self._fun).parameters)
            except (TypeError, ValueError):
                self._parameters = []
        return self._parameters

    def positions(self, count: int) -> tuple[frozenset, frozenset]:
        """`(positions, names)` of the static arguments of a call with `count`
        positional arguments."""
        found = self._by_count.get(count)
        if found is not None:
            return found
        nums = {n % count if -count <= n < count else n for n in self._nums}
        names = set(self._names)
        if nums or names:
            parameters = self._read_parameters()
            for name in list(names):
                if name in parameters and parameters.index(name) < count:
                    nums.add(parameters.index(name))
            for num in list(nums):
                if num < len(parameters):
                    names.add(parameters[num])
        found = self._by_count[count] = (frozenset(nums), frozenset(names))
        return found


def _array_entry(x: jax.Array) -> tuple:
    """A `jax.Array` argument's part of a `LastCall`'s signature: its shape, dtype,
    weak type and placement (what `split_arguments` keys it by)."""
    return (x.shape, x.dtype, x.weak_type, array_placement(x))


class _Same:
    """A static leaf's part of a `LastCall`'s signature: the leaf itself, matched
    by identity (the same object gives the same key in `split_arguments`)."""

    __slots__ = ("leaf",)

    def __init__(self, leaf: Any):
        self.leaf = leaf


class LastCall:
    """The last compiled program called with positional arguments, none static
    whole, whose traced leaves are all `jax.Array`s, and what a call must match
    to go straight to it, as `jax.jit`'s fast path does: splitting and keying the
    arguments (`split_arguments`) is Python work before each dispatch, a large
    share of a cheap solve's call.

    A call matches where its arguments flatten to the same PyTree structure, each
    array leaf with the same shape, dtype, weak type and placement, and each
    static leaf (a number, a string, a function) the very object of the last
    call: then `split_arguments` would give the same key. (A NumPy array leaf is
    traced, but keyed as an array of its own: such calls take the split.)

    Made by `LastCall.of` from the call's positional arguments.

    **Arguments:**

    - `leaves`, `treedef`: the call's positional arguments, flattened.
    - `call`: the compiled program's call (`executable_call`), taking the
        arguments with `None` for every static leaf.
    - `box`: the output's static half (`None` where the output is all arrays).
    """

    __slots__ = ("treedef", "signature", "statics", "call", "box")

    def __init__(self, leaves: list, treedef: Any, call: Callable, box: Any):
        self.treedef = treedef
        self.signature = tuple(
            _array_entry(x) if isinstance(x, jax.Array) else _Same(x) for x in leaves
        )
        self.statics = any(type(e) is _Same for e in self.signature)
        self.call, self.box = call, box

    @staticmethod
    def of(args: tuple, call: Callable, box: "OutputBox") -> "LastCall | None":
        """A `LastCall` of these arguments and the program's output box, or `None`
        where a leaf is a NumPy array or number (traced, but not a `jax.Array`)."""
        leaves, treedef = jtu.tree_flatten(args)
        if any(isinstance(x, _NUMPY_TYPES) for x in leaves):
            return None
        return LastCall(leaves, treedef, call, None if box.arrays_only else box)

    def __call__(self, args: tuple) -> Any:
        """The program's output for `args`, or `_MISSED` where they do not match."""
        leaves, treedef = jtu.tree_flatten(args)
        if treedef != self.treedef:
            return _MISSED
        for x, expected in zip(leaves, self.signature):
            if type(expected) is _Same:
                if x is not expected.leaf:
                    return _MISSED
            elif not isinstance(x, jax.Array) or _array_entry(x) != expected:
                return _MISSED
        if self.statics:
            dynamic = [
                None if type(e) is _Same else x for x, e in zip(leaves, self.signature)
            ]
            args = jtu.tree_unflatten(treedef, dynamic)
        out = self.call(*args)
        return out if self.box is None else self.box.combine(out)


class _Missed:
    """What a `LastCall` gives for arguments that do not match it."""


_MISSED = _Missed()


def missed(out: Any) -> bool:
    """Whether a `LastCall`'s output says its arguments did not match."""
    return out is _MISSED


def split_arguments(spec: StaticSpec, args: tuple, kwargs: dict) -> Arguments:
    """Splits a call's arguments into traced arrays and a static key.

    **Arguments:**

    - `spec`: the function's static arguments (a `StaticSpec`).
    - `args`, `kwargs`: the call's arguments.

    **Returns:**

    An `Arguments`.
    """
    nums, names = spec.positions(len(args))
    dynamic_args, static_args, arg_keys = [], [], []
    for i, value in enumerate(args):
        dynamic, static, key = _split(value, whole=i in nums)
        dynamic_args.append(dynamic)
        static_args.append(static)
        arg_keys.append(key)
    dynamic_kwargs, static_kwargs, kwarg_keys = {}, {}, []
    for name in sorted(kwargs):
        dynamic, static, key = _split(kwargs[name], whole=name in names)
        dynamic_kwargs[name] = dynamic
        static_kwargs[name] = static
        kwarg_keys.append((name, key))
    key = (tuple(arg_keys), tuple(kwarg_keys))
    return Arguments(
        tuple(dynamic_args), dynamic_kwargs, tuple(static_args), static_kwargs, key
    )


def static_key(key: Any) -> Any:
    """An `Arguments.key` without its traced leaves' entries (their shapes,
    dtypes and placements): what a compiled program takes no other value of."""

    def strip(part: tuple) -> tuple:
        treedef, entries = part
        kept = [
            _TRACED if type(e) is tuple and e and e[0] is _TRACED else e
            for e in entries
        ]
        return treedef, tuple(kept)

    arg_keys, kwarg_keys = key
    return (
        tuple(strip(k) for k in arg_keys),
        tuple((name, strip(k)) for name, k in kwarg_keys),
    )


# Outputs that `jax.jit` returns as arrays (weakly typed where Python numbers).
_NUMBERS = (bool, int, float, complex, np.number, np.bool_)


def _number_as_array(x: Any) -> Any:
    return jnp.asarray(x) if isinstance(x, _NUMBERS) else x


class OutputBox:
    """Carries the static half of a traced function's output out of the trace (as
    `equinox.filter_jit` does), so that non-array outputs that `jax.jit` rejects
    (strings, functions...) come back as they are; Python and NumPy numbers are
    returned as arrays, as `jax.jit` returns them."""

    def __init__(self):
        self.static: Any = None
        self.filled = False
        self._arrays_only = False

    def store(self, out: Any) -> Any:
        out = jtu.tree_map(_number_as_array, out)
        dynamic, static = eqx.partition(out, eqx.is_array)
        self.static, self.filled = static, True
        # (Every output an array: nothing to put back, at each call.)
        self._arrays_only = not jtu.tree_leaves(static)
        return dynamic

    @property
    def arrays_only(self) -> bool:
        """Whether every output leaf is an array (`combine` returns its input)."""
        return self._arrays_only

    def combine(self, dynamic: Any) -> Any:
        if self._arrays_only:
            return dynamic
        return eqx.combine(dynamic, self.static)


def check_jit_kwargs(jit_kwargs: dict) -> dict:
    """The keyword arguments passed on to `jax.jit` (every one but the static ones,
    which `split_arguments` handles)."""
    passed = dict(jit_kwargs)
    passed.pop("static_argnums", None)
    passed.pop("static_argnames", None)
    try:
        inspect.signature(jax.jit).bind(lambda: None, **passed)
    except TypeError as e:
        raise TypeError(f"`lxd.jit` got a keyword `jax.jit` does not take: {e}") from e
    return passed


def check_static_arguments(fun: Callable, jit_kwargs: dict) -> None:
    """Raises `jax.jit`'s error where `static_argnums` or `static_argnames` name an
    argument `fun` does not take (`jax.jit` checks them against the signature when
    it is made)."""
    static = {
        k: jit_kwargs[k]
        for k in ("static_argnums", "static_argnames")
        if jit_kwargs.get(k) is not None
    }
    for name, kind, what in (
        ("static_argnums", numbers.Integral, "an int or a sequence of ints"),
        ("static_argnames", str, "a str or a sequence of strs"),
    ):
        value = static.get(name)
        if value is None:
            continue
        items = (value,) if isinstance(value, (numbers.Integral, str)) else value
        try:
            ok = all(isinstance(v, kind) and not isinstance(v, bool) for v in items)
        except TypeError:  # not iterable
            ok = False
        if not ok:
            raise TypeError(f"`lxd.jit({name}=...)` must be {what}; got {value!r}.")
    if static:
        try:
            jax.jit(fun, **static)
        except ValueError as e:
            raise ValueError(f"`lxd.jit`: {e}") from None
