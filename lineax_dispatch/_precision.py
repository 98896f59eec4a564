"""The precision of the products a strategy creates.

One unbatched `mv` of a user's function computes its dot products as matrix-vector
products. A strategy that applies the function to many vectors together (a dense
build from basis vectors, a stack of call sites, a batch of right-hand sides) turns
them into matrix-matrix products, and on an accelerator a float32 matrix-matrix
product at JAX's default precision runs in bfloat16 passes (a TPU) or in TF32 (a
GPU): about three digits, where the matrix-vector product keeps float32's seven.
Within `batched_products()` the products such a strategy traces take
`Precision.HIGHEST` (float32 accuracy on every backend; XLA:CPU computes float32
products exactly so at any setting), unless the user has set a default precision
(`jax.default_matmul_precision`), which is kept; a precision the user's function
gives a product itself is kept in any case. `traced_precision` gives an already
traced computation the precision its products would have been traced with now.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.extend.core.primitives as prims
import jax.lax as lax
import jax.numpy as jnp

from ._jaxpr import map_equations


# The products whose precision a strategy sets: those a batch turns from
# matrix-vector into matrix-matrix work.
_PRODUCTS = frozenset({prims.dot_general_p, prims.conv_general_dilated_p})

# What a batched product runs at where the user set no default.
BATCHED_PRECISION = "highest"


def _default_setting() -> Any:
    """`jax.default_matmul_precision`'s value in force (`None`: none)."""
    return jax.config.jax_default_matmul_precision  # pyright: ignore[reportAttributeAccessIssue]


@contextlib.contextmanager
def batched_products() -> Iterator[None]:
    """Within: a product traced with no precision of its own takes
    `BATCHED_PRECISION`, unless a default precision is already in force (the
    user's, kept).

    **Returns:**

    A context manager.
    """
    if _default_setting() is None:
        with jax.default_matmul_precision(BATCHED_PRECISION):
            yield
    else:
        yield


def default_precision() -> Any:
    """The precision a product traced now with no precision of its own takes:
    `None` where no default is in force, else as a jaxpr holds it (a pair of
    `jax.lax.Precision`s, or a dot algorithm), read from a product traced now."""
    if _default_setting() is None:
        return None
    spec = jax.ShapeDtypeStruct((1, 1), jnp.float32)
    traced = jax.make_jaxpr(lambda a, b: lax.dot(a, b))(spec, spec)
    return traced.jaxpr.eqns[0].params["precision"]


def traced_precision(traced: Any) -> Any:
    """`with_precision(traced, default_precision())`: each product that has no
    precision of its own given the one it would be traced with now."""
    return with_precision(traced, default_precision())


def with_precision(traced: Any, precision: Any) -> Any:
    """`traced` (a `ClosedJaxpr` or a jaxpr equation) with each product at any depth
    that has no precision of its own given `precision`; `traced` itself where
    `precision` is `None` or nothing changes.

    **Arguments:**

    - `traced`: a `jax.extend.core.ClosedJaxpr` or `JaxprEqn`.
    - `precision`: a canonical precision (`default_precision()`), or `None`.

    **Returns:**

    The same kind of object.
    """
    if precision is None:
        return traced

    def given(eqn: Any) -> Any:
        if eqn.primitive in _PRODUCTS and eqn.params.get("precision", 0) is None:
            return eqn.replace(params={**eqn.params, "precision": precision})
        return None

    return map_equations(traced, given)


def stacking_keeps_cost(callee: Any) -> bool:
    """Whether stacking calls of `callee` (a `ClosedJaxpr`) into one batched call
    costs about what its calls cost apart on the default backend. Not on a TPU
    where the batch would raise some of its float32 products to `BATCHED_PRECISION`
    (no default precision in force, a product with no precision of its own):
    XLA:TPU computes a float32 product at `HIGHEST` as several bfloat16 passes,
    and compiles it in time that grows with the matrix, where the same
    matrix-vector product at the default compiles quickly
    (`benchmarks/results/tpu/logs/highest-products-probe.json`). Rolling those
    calls into a loop keeps each one the user's own product.

    **Arguments:**

    - `callee`: the computation the calls apply.

    **Returns:**

    A bool.
    """
    if jax.default_backend() != "tpu" or _default_setting() is not None:
        return True
    highest = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
    return with_precision(callee, highest) is callee
