"""A marked call: one `jax.jit` per operator kind (and trace) of its plain lineax
`mv`, each named alike, so that every call site of a kind is one equation of one
callee.

One `jax.jit` per key, rather than one `jax.jit` taking the key as a static
argument: jax hashes a static argument's tree structure without its contents, so
the keys of every kind ever applied would share one hash in jax's cache of
argument shardings, and each new trace of a marked call would compare its key with
all of them (the time to trace a program grew with the number of operator kinds
applied before it, in the same process).
"""

import collections
import contextvars
import weakref
from collections.abc import Callable
from typing import Any

import jax
from jaxtyping import PyTree

from .._compat import hashable_combine, JAX_INLINE, XLA_OUTLINE


# Eagerly applied kinds whose compiled `mv`s are kept (the least recently used
# beyond it are dropped, and compiled again if applied again).
EAGER_KINDS_KEPT = 256


class MarkedCall:
    """The marked call named `name`: `call(key, dynamic, vector)` applies the plain
    lineax `mv` of the operator `hashable_combine(dynamic, key[0].value)`, through
    the `jax.jit` of `key` (the operator's static part and its trace scope, see
    `TraceScope`), made at the key's first call.

    **Arguments:**

    - `name`: the equations' name.
    - `mode`: what a call under a trace leaves in the calling program: `"call"`,
        one call equation (which XLA inlines); `"inline"`, the callee's equations
        (`jax.jit(..., inline=True)`, `jax.Inline.JAX_EARLY` on jax >= 0.11);
        `"outline"`, one call equation marked for XLA to compile the callee once
        and keep it out of line (`jax.Inline.XLA_LATE`, on jax >= 0.11 only).
    """

    def __init__(self, name: str, mode: str = "call"):
        if mode not in ("call", "inline", "outline"):
            raise ValueError(f"unknown marked-call mode {mode!r}.")
        if mode == "outline" and XLA_OUTLINE is None:
            raise ValueError("this JAX has no `jax.Inline.XLA_LATE` to outline with.")
        self.name = name
        self.mode = mode
        self._inline = {"call": False, "inline": JAX_INLINE, "outline": XLA_OUTLINE}[
            mode
        ]
        # `{key: jit}` of traced calls, each entry dropped when its trace ends;
        # an ordered `{static key: jit}` of eager ones, bounded.
        self._traced: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
            f"lineax_dispatch_{name}_traced", default=None
        )
        self._eager: contextvars.ContextVar[collections.OrderedDict | None] = (
            contextvars.ContextVar(f"lineax_dispatch_{name}_eager", default=None)
        )

    def _make(self, static: Any) -> Callable:
        def apply(dynamic: PyTree[Any], vector: PyTree[Any]) -> PyTree[Any]:
            return hashable_combine(dynamic, static.value)(vector)

        apply.__name__ = apply.__qualname__ = self.name
        return jax.jit(apply, inline=self._inline)

    def jitted(self, key: tuple) -> Callable:
        """The `jax.jit` of `key = (static key, scope)`, made once per key while
        its trace lives (eagerly, `scope` is `None`: kept among the
        `EAGER_KINDS_KEPT` kinds last applied)."""
        static, scope = key
        if scope is None:
            eager = self._eager.get()
            if eager is None:
                eager = collections.OrderedDict()
                self._eager.set(eager)
            jitted = eager.get(static)
            if jitted is None:
                jitted = eager[static] = self._make(static)
                while len(eager) > EAGER_KINDS_KEPT:
                    eager.popitem(last=False)
            else:
                eager.move_to_end(static)
            return jitted
        traced = self._traced.get()
        if traced is None:
            traced = {}
            self._traced.set(traced)
        jitted = traced.get(key)
        if jitted is None:
            jitted = self._make(static)
            trace = scope.value()
            if trace is not None:  # kept while the trace lives
                traced[key] = jitted
                weakref.finalize(trace, traced.pop, key, None)
        return jitted

    def __call__(self, key: tuple, dynamic: PyTree[Any], vector: PyTree[Any]) -> Any:
        return self.jitted(key)(dynamic, vector)

    def trace(self, key: tuple, dynamic: PyTree[Any], vector: PyTree[Any]) -> Any:
        """As `jax.jit(...).trace` of the call (see `jitted`)."""
        return self.jitted(key).trace(dynamic, vector)
