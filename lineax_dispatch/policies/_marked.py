"""Marked calls: an operator's `mv` applied through a cached `jax.jit` of its plain
lineax `mv`, with the operator's arrays as arguments, one per static part (its
functions, tags and structures) and trace (see `_marked_call.py`).

The user's function is then traced once per operator kind and signature, however
many call sites there are, and each call site is one recognisable `jit` equation
(named `lineax_dispatch_mv`) in the traced program, which `lxd.jit` can find and
rewrite. Under a plain `jax.jit`, XLA inlines it: lineax's behaviour.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import lineax as lx
import numpy as np
from jaxtyping import PyTree

from .._compat import call_name, hashable_partition, root_trace_ref, XLA_OUTLINE
from ._base import AbstractPolicy, RawMv, with_top_policy
from ._marked_call import MarkedCall
from ._per_object import cached_per_object, per_object_cache


# The name of every marked call's equation in a traced program.
MARKED_NAME = "lineax_dispatch_mv"
# The prefix of the marked calls of `Auto` operators traced by `lxd.jit`, one name
# per operator kind and trace (`Session.record`).
AUTO_NAME = MARKED_NAME + "_auto"


class _HashedKey:
    """A value as a jit cache key, hashed once (jax hashes a static argument at
    every call), equal to a key of the same class holding an equal value."""

    def __init__(self, value: Any):
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return self is other or (
            type(other) is type(self)
            and self._hash == other._hash
            and self.value == other.value
        )


class TraceScope(_HashedKey):
    """The outermost trace a call is traced in (the `jax.jit` trace whose loop
    bodies, nested jits, JVP and batching traces hold the call), as a hashable key:
    by identity, through a weak reference (its value), so a finished trace is not
    kept alive.

    A compiled callee is cached by its static part, functions included; a function
    may read Python state that changes between traces (a global, a closed-over
    list), so sharing one callee between traces could return results computed from
    old state where lineax, tracing afresh, sees the new. Keyed by the trace, every
    call site of one trace shares one callee and a new trace compiles its own.
    """


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


def _hashable(leaf: Any) -> Any:
    try:
        hash(leaf)
    except TypeError:
        return ByIdentity(leaf)
    return leaf


class StaticKey(_HashedKey):
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
            exact = (tuple(_hashable(leaf) for leaf in exact[0]), treedef)
            self._hash = hash(exact)
        self._exact = exact

    def __eq__(self, other: Any) -> bool:
        return self is other or (
            type(other) is type(self)
            and self._hash == other._hash
            and self._exact == other._exact
        )

    def __hash__(self) -> int:
        return self._hash


# The scope a solve's operator is pinned to (see `pinned_scope`).
_PINNED: contextvars.ContextVar[TraceScope | None] = contextvars.ContextVar(
    "lineax_dispatch_pinned_scope", default=None
)


def current_scope() -> TraceScope | None:
    """The scope of the current trace (or the one pinned by `pinned_scope`), or
    `None` outside any trace (eager)."""
    root = root_trace_ref()
    if root is None:
        return None
    pinned = _PINNED.get()
    return TraceScope(root) if pinned is None else pinned


@contextlib.contextmanager
def pinned_scope(scope: TraceScope | None) -> Iterator[None]:
    """Within this context, traces count as part of the trace `scope`.

    A solve bound in one trace is abstractly evaluated and lowered in traces of
    their own (lineax's `linear_solve` primitive traces its solver there); they are
    parts of the same program, so its operator's marked callee, traced for the
    solve's decision, is shared with them rather than traced again.

    **Arguments:**

    - `scope`: the trace to count as (`None`: no change).
    """
    if scope is None:
        yield
        return
    token = _PINNED.set(scope)
    try:
        yield
    finally:
        _PINNED.reset(token)


def named_marked(name: str, mode: str = "call") -> MarkedCall:
    """A marked call of its own, whose equations are named `name` (which must start
    with `MARKED_NAME`): how `lxd.jit` tells the call sites of each `Auto` operator
    kind in a traced program apart.

    **Arguments:**

    - `name`: the equations' name.
    - `mode`: what a call under a trace leaves in the calling program (see
        `MarkedCall`): `"call"`, one call equation; `"inline"`, the callee's
        equations (still traced once per trace and signature, but with no call
        equation, so the program is lowered and compiled exactly as lineax's);
        `"outline"`, one call equation XLA keeps out of line (jax >= 0.11).

    **Returns:**

    A `MarkedCall` of `(key, dynamic, vector)`.
    """
    if not name.startswith(MARKED_NAME):
        raise ValueError(f"a marked call's name must start with {MARKED_NAME!r}.")
    return MarkedCall(name, mode)


# The marked call of `Roll` operators: `lxd.jit` rolls its call sites.
lineax_dispatch_mv = named_marked(MARKED_NAME)
# The call of operators applied inline (`Lazy`, and `Auto` under a plain
# `jax.jit`): traced once per trace and signature, its equations put in the calling
# program (no call equation: the program lowers and compiles as lineax's); `lxd.jit`
# finds nothing of it to rewrite.
INLINE_NAME = MARKED_NAME + "_inline"
inline_mv = named_marked(INLINE_NAME, mode="inline")


# The call of `Outline` operators on a JAX with `jax.Inline.XLA_LATE`: one call
# equation per site, of one callee per trace and signature, which XLA compiles once
# and keeps out of line (`None` on older JAX, where `Outline` uses a host
# callback). `lxd.jit` leaves its calls as they are.
OUTLINE_NAME = MARKED_NAME + "_outline"
outline_mv: MarkedCall | None = (
    None if XLA_OUTLINE is None else named_marked(OUTLINE_NAME, mode="outline")
)


def is_marked(eqn: Any) -> bool:
    """Whether a jaxpr equation is a marked call (of any name).

    **Arguments:**

    - `eqn`: a `jax.extend.core.JaxprEqn`.

    **Returns:**

    A bool.
    """
    name = call_name(eqn)
    return name is not None and name.startswith(MARKED_NAME)


def mv_parts(operator: lx.AbstractLinearOperator) -> tuple[PyTree[Any], Any]:
    """`(arrays, static key)` of the plain lineax `mv` of `operator`.

    **Arguments:**

    - `operator`: an operator of lineax-dispatch.

    **Returns:**

    The dynamic half (a PyTree of arrays) and a hashable key of the static half.
    """
    dynamic, static = hashable_partition(
        RawMv(_top_policy_free(operator)), eqx.is_array
    )
    return dynamic, StaticKey(static)


def _top_policy_free(operator: Any) -> Any:
    # The plain lineax `mv` does not read the top node's own policy (its children
    # keep theirs): give every top policy one key, so an `Auto` operator and the
    # same operator with its decided policy share one callee.
    policy = getattr(operator, "policy", None)
    if policy is None or type(policy) is _TopPolicy:
        return operator
    return with_top_policy(operator, _TOP_POLICY)


class _TopPolicy(AbstractPolicy):
    """The one policy every marked callee's operator carries at its top node
    (which its plain lineax `mv` never applies): lineax's `mv`, inline."""

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        return operator.raw_mv(vector)  # pyright: ignore[reportAttributeAccessIssue]


_TOP_POLICY = _TopPolicy()


# Eager calls: the arrays and the key of each operator applied, so that an
# operator applied again skips the partition and the hashing.
_EAGER = per_object_cache("lineax_dispatch_eager_mv")


def eager_parts(operator: Any) -> tuple[PyTree[Any], Any]:
    """`mv_parts(operator)`, computed once per live operator object (for eager
    calls)."""
    return cached_per_object(_EAGER, operator, lambda: mv_parts(operator))


def marked_mv(
    operator: lx.AbstractLinearOperator,
    vector: PyTree[Any],
    call: Callable | None = None,
    parts: tuple[PyTree[Any], Any] | None = None,
) -> PyTree:
    """Applies the plain lineax `mv` of `operator` through the marked call.

    **Arguments:**

    - `operator`: an operator of lineax-dispatch.
    - `vector`: a PyTree matching its input structure.
    - `call`: the marked call to apply it through (from `named_marked`); `None` for
        the shared one, named `MARKED_NAME`.
    - `parts`: `mv_parts(operator)`, if already known.

    **Returns:**

    The product. Eagerly, the compiled `mv` (compiled once per operator kind and
    signature, and reused); under a trace, one `lineax_dispatch_mv` equation.
    """
    call = lineax_dispatch_mv if call is None else call
    scope = current_scope()
    if parts is not None:
        dynamic, key = parts
    elif scope is not None:
        dynamic, key = mv_parts(operator)
    else:
        dynamic, key = eager_parts(operator)
    return call((key, scope), dynamic, vector)
