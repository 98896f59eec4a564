"""Values computed once per live object (an operator applied eagerly again and
again), held in a context variable's dict and dropped with the object."""

import contextvars
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar


_T = TypeVar("_T")


def per_object_cache(name: str) -> contextvars.ContextVar[dict | None]:
    """A new cache: a context variable holding `{(id, extra): (weak ref, value)}`.

    **Arguments:**

    - `name`: the context variable's name.

    **Returns:**

    A `contextvars.ContextVar` for `cached_per_object`.
    """
    # A context variable: eager calls in each thread or task keep their own
    # values, with no lock and no state shared at module level.
    return contextvars.ContextVar(name, default=None)


def cached_per_object(
    cache: contextvars.ContextVar[dict | None],
    obj: Any,
    make: Callable[[], _T],
    extra: Hashable = None,
) -> _T:
    """`make()`, computed once per live `obj` (and `extra`) in this context.

    **Arguments:**

    - `cache`: from `per_object_cache`.
    - `obj`: the object the value belongs to (weakly referenced: the entry goes
        when it does; an object without weak references is not cached).
    - `make`: computes the value.
    - `extra`: a further hashable part of the key.

    **Returns:**

    The value.
    """
    entries = cache.get()
    if entries is None:
        entries = {}
        cache.set(entries)
    key = (id(obj), extra)
    entry = entries.get(key)
    if entry is not None and entry[0]() is obj:
        return entry[1]
    value = make()
    try:
        ref = weakref.ref(obj, lambda _: entries.pop(key, None))
    except TypeError:  # an object without weak references: no cache
        return value
    entries[key] = (ref, value)
    return value
