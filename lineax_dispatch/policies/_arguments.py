"""How `lxd.jit` reads its arguments, as `equinox.filter_jit` does: arrays are
traced, everything else is static (part of the cache key); arguments named by
`static_argnums` / `static_argnames` are static whole, their arrays included."""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu


def _is_traced_array(x: Any) -> bool:
    return eqx.is_array(x)


class _ById:
    """A static leaf that cannot be hashed (or an array in a static argument),
    keyed by identity; the key holds the object, so the identity stays its own."""

    def __init__(self, value: Any):
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _ById) and other.value is self.value


def _hashable(leaf: Any) -> Any:
    if eqx.is_array(leaf):
        return _ById(leaf)
    try:
        hash(leaf)
    except TypeError:
        return _ById(leaf)
    return leaf


def _unwrap(leaf: Any) -> Any:
    return leaf.value if isinstance(leaf, _ById) else leaf


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


def _split(value: Any, whole: bool) -> tuple[Any, StaticPart]:
    """`(dynamic, static)`: dynamic has the value's structure with `None` for every
    static leaf (so that `donate_argnums` keeps its meaning)."""
    leaves, treedef = jtu.tree_flatten(value)
    if whole:
        dynamic_leaves = [None] * len(leaves)
    else:
        dynamic_leaves = [x if _is_traced_array(x) else None for x in leaves]
    static_leaves = tuple(
        None if d is not None else _hashable(x) for d, x in zip(dynamic_leaves, leaves)
    )
    return jtu.tree_unflatten(treedef, dynamic_leaves), StaticPart(
        treedef, static_leaves
    )


def _abstract(dynamic: Any) -> Any:
    return tuple(
        (tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False)))
        for x in jtu.tree_leaves(dynamic)
    )


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


def split_arguments(
    fun: Callable, args: tuple, kwargs: dict, static_argnums: Any, static_argnames: Any
) -> Arguments:
    """Splits a call's arguments into traced arrays and a static key.

    **Arguments:**

    - `fun`: the function (to map `static_argnames` to positions and back).
    - `args`, `kwargs`: the call's arguments.
    - `static_argnums`, `static_argnames`: as for `jax.jit`.

    **Returns:**

    An `Arguments`.
    """
    nums = {
        n % len(args) if -len(args) <= n < len(args) else n
        for n in _normalise(static_argnums, int)
    }
    names = set(_normalise(static_argnames, str))
    try:
        parameters = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        parameters = []
    for name in list(names):
        if name in parameters and parameters.index(name) < len(args):
            nums.add(parameters.index(name))
    for num in list(nums):
        if num < len(parameters):
            names.add(parameters[num])
    dynamic_args, static_args = [], []
    for i, value in enumerate(args):
        dynamic, static = _split(value, whole=i in nums)
        dynamic_args.append(dynamic)
        static_args.append(static)
    dynamic_kwargs, static_kwargs = {}, {}
    for name in sorted(kwargs):
        dynamic, static = _split(kwargs[name], whole=name in names)
        dynamic_kwargs[name] = dynamic
        static_kwargs[name] = static
    key = (
        tuple(static_args),
        tuple(sorted(static_kwargs.items())),
        _abstract((dynamic_args, dynamic_kwargs)),
    )
    return Arguments(
        tuple(dynamic_args), dynamic_kwargs, tuple(static_args), static_kwargs, key
    )


class OutputBox:
    """Carries the static half of a traced function's output out of the trace (as
    `equinox.filter_jit` does), so that non-array outputs come back as they are."""

    def __init__(self):
        self.static: Any = None
        self.filled = False

    def store(self, out: Any) -> Any:
        dynamic, static = eqx.partition(out, eqx.is_array)
        self.static, self.filled = static, True
        return dynamic

    def combine(self, dynamic: Any) -> Any:
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
