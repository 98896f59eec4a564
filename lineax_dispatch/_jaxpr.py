"""What `lxd.jit` reads from a traced program: the call sites of each repeated
computation (an `Auto` operator kind's `mv`, a `Roll` operator's, a `jax.jit`
function of the user's), how often each runs, and what to do with each group."""

from typing import Any

import jax


def out_leaves(callee: Any) -> list[jax.ShapeDtypeStruct]:
    """The leaves of an operator's output structure, read from its traced `mv`
    (asking the operator may trace its function again)."""
    return [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in callee.jaxpr.outvars
    ]
