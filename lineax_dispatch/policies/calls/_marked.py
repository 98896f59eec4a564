"""Marked calls: an operator's `mv` applied through a cached `jax.jit` of its plain
lineax `mv`, with the operator's arrays as arguments, one per operator kind (its
functions, tags and structures) and trace.

The user's function is then traced once per operator kind and signature, however
many call sites there are, and each call site is one recognisable `jit` equation
(named `lineax_dispatch_mv`) in the traced program, which `lxd.jit` can find and
rewrite. Under a plain `jax.jit`, XLA inlines it: lineax's behaviour.

One `jax.jit` per key (`MarkedCall`), rather than one `jax.jit` taking the key as
a static argument: jax hashes a static argument's tree structure without its
contents, so the keys of every kind ever applied would share one hash in jax's
cache of argument shardings, and each new trace of a marked call would compare its
key with all of them (the time to trace a program grew with the number of
operator kinds applied before it, in the same process)."""

import collections
import contextvars
import weakref
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.extend.core as jex
import lineax as lx
from jaxtyping import PyTree

from ..._compat import (
    hashable_combine,
    hashable_partition,
    JAX_INLINE,
    XLA_OUTLINE,
)
from ..._jaxpr import call_name
from .._policy_interface import AbstractPolicy, RawMv, with_top_policy
from ._keys import StaticKey
from ._per_object import cached_per_object, per_object_cache
from ._scope import current_scope


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
        # an ordered `{static key: jit}` of eager ones, bounded. Context variables:
        # `mv` is called by lineax with no argument to carry them, per thread.
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


def lifted_call(name: str, traced: Any) -> Callable:
    """A `jax.jit`, named `name`, of a traced marked callee that takes the
    callee's constants as its first argument: `(constants, dynamic, vector)`.

    An operator made outside a trace whose function reads arrays it is not given
    (a module's global: lineax's closure conversion keeps them in the static
    half) has a callee holding them as constants. `jax.jit` puts an operator's
    `mv` inline, and those arrays become constants of the calling trace, passed
    into loops as their operands; a call left in a loop body would be lowered
    holding them as constants of its own, which XLA:CPU compiles far slower
    (`python -m benchmarks.fixed_cost --program loop` measures it). Called with
    the constants, the call leaves them to the calling trace, as `jax.jit` does.

    **Arguments:**

    - `name`: the marked call's name.
    - `traced`: `jax.jit(...).trace` of the marked call (a `jax.stages.Traced`).

    **Returns:**

    The jitted function.
    """
    closed, out_tree = traced.jaxpr, traced.out_tree

    def lifted(consts: list, dynamic: PyTree[Any], vector: PyTree[Any]) -> Any:
        flat = jax.tree_util.tree_leaves((dynamic, vector))
        out = jex.jaxpr_as_fun(jex.ClosedJaxpr(closed.jaxpr, list(consts)))(*flat)
        return jax.tree_util.tree_unflatten(out_tree, out)

    lifted.__name__ = lifted.__qualname__ = name
    return jax.jit(lifted)


# The name of every marked call's equation in a traced program.
MARKED_NAME = "lineax_dispatch_mv"


# The prefix of the marked calls of `Auto` operators traced by `lxd.jit`, one name
# per operator kind and trace (`Session.record`).
AUTO_NAME = MARKED_NAME + "_auto"


def named_marked(name: str, mode: str = "call") -> MarkedCall:
    """A marked call of its own, whose equations are named `name` (which must start
    with `MARKED_NAME`): how `lxd.jit` tells the call sites of each `Auto` operator
    kind in a traced program apart.

    **Arguments:**

    - `name`, `mode`: as for `MarkedCall` (an `"inline"` call is still traced
        once per trace and signature, but leaves no call equation, so the
        program is lowered and compiled exactly as lineax's).

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


def mv_parts(
    operator: lx.AbstractLinearOperator,
    is_dynamic: Callable[[Any], bool] = eqx.is_array,
) -> tuple[PyTree[Any], Any]:
    """`(arrays, static key)` of the plain lineax `mv` of `operator`.

    **Arguments:**

    - `operator`: an operator of lineax-dispatch.
    - `is_dynamic`: which leaves make the dynamic half (`is_leaf_array` for an
        operator a record keeps, whose arrays are `jax.ShapeDtypeStruct`s: they
        then take the places the arrays took, and the static key is the one of
        the operator the record was made from).

    **Returns:**

    The dynamic half (a PyTree of arrays) and a hashable key of the static half.
    """
    dynamic, static = hashable_partition(RawMv(_top_policy_free(operator)), is_dynamic)
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
