"""Eager `mv`: a short path from `op.mv(v)` to the compiled `mv`.

Outside any trace, the policies that apply a compiled `mv` (`Lazy`, `Auto`,
`Roll`, and `Outline` on a JAX with `jax.Inline.XLA_LATE`) run the `jax.jit` of the
operator kind's plain lineax `mv`. Reaching it through the general path costs more
than the compiled call itself for a cheap or medium operator: the vector's check
against the input structure, the policy's dispatch, and equinox's bound methods
(each a module built at each attribute access). Here the application is resolved
once per operator object (the compiled function and the operator's arrays, from
the policy's `eager_mv`) and kept while the object lives; a later call whose
vector has exactly the input structure's shapes and dtypes (JAX arrays, no cast
needed) goes straight to it. Any other vector takes the general path, which casts
it or raises as before.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu
from jaxtyping import PyTree

from .._compat import is_tracer
from .calls._marked import eager_parts, lineax_dispatch_mv, MarkedCall
from .calls._per_object import cached_per_object, per_object_cache


_Apply = Callable[[PyTree[Any]], PyTree[Any]]

_EAGER_APPLICATIONS = per_object_cache("lineax_dispatch_eager_applications")


def compiled_mv(operator: Any, call: MarkedCall | None = None) -> _Apply:
    """The eager application of `operator` through the marked call `call` (the
    shared one if `None`): its compiled `jax.jit` with the operator's arrays bound.

    **Arguments:**

    - `operator`: an operator of lineax-dispatch.
    - `call`: the marked call its policy applies it through.

    **Returns:**

    A function of a vector matching the operator's input structure.
    """
    call = lineax_dispatch_mv if call is None else call
    dynamic, key = eager_parts(operator)  # shared with the general eager path
    jitted = call.jitted((key, None))

    def apply(vector: PyTree[Any]) -> PyTree[Any]:
        return jitted(dynamic, vector)

    return apply


def _fast_path(operator: Any) -> Callable[[PyTree[Any]], Any] | None:
    apply = operator.policy.eager_mv(operator)
    if apply is None:
        return None
    leaves, treedef = jtu.tree_flatten(operator.in_structure())
    expected = [(tuple(s.shape), s.dtype) for s in leaves]

    def fast(vector: PyTree[Any]) -> Any:
        got, got_def = jtu.tree_flatten(vector)
        if got_def != treedef:
            return None
        for x, (shape, dtype) in zip(got, expected):
            if (
                not isinstance(x, jax.Array)
                or is_tracer(x)
                or x.shape != shape
                or x.dtype != dtype
            ):
                return None
        return (apply(vector),)

    return fast


def eager_apply(operator: Any, vector: PyTree[Any]) -> tuple[PyTree[Any]] | None:
    """Applies `operator` to `vector` by the short path, if there is one for this
    operator and the vector needs no check beyond its shapes and dtypes.

    **Arguments:**

    - `operator`: an operator of lineax-dispatch, applied outside any trace.
    - `vector`: the vector given to `mv`.

    **Returns:**

    `(product,)`, or `None` where the general path must run.
    """
    fast = cached_per_object(
        _EAGER_APPLICATIONS, operator, lambda: _fast_path(operator)
    )
    return None if fast is None else fast(vector)
