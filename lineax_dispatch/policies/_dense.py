"""Building the dense matrix of an operator, a chunk of columns at a time."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.flatten_util as jfu
import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
from jaxtyping import Array, Inexact, PyTree

from .._explicit_axes import explicit_sharding
from .._precision import batched_products
from .._validate import check_positive_int
from ._memory import check_dense_budget
from ._policy_interface import RawMv
from .calls._scope import current_scope


# Operators that already hold their entries: their own `mv` is the materialised one.
EXPLICIT_OPERATORS = (
    lx.MatrixLinearOperator,
    lx.PyTreeLinearOperator,
    lx.DiagonalLinearOperator,
    lx.TridiagonalLinearOperator,
    lx.IdentityLinearOperator,
)


def check_batch_size(batch_size: Any, *, name: str = "batch_size") -> int | None:
    """Validates a chunk size: `None` or a positive integer (NumPy integers
    accepted, returned as `int`); otherwise a `ValueError` naming `name`."""
    return check_positive_int(batch_size, name, allow_none=True)


def _flat_spec(structure: PyTree[jax.ShapeDtypeStruct]):
    flat, unravel = eqx.filter_eval_shape(jfu.ravel_pytree, structure)
    return flat, unravel


def images_of_basis(
    mv: Callable[[PyTree[Any]], PyTree[Any]],
    in_structure: PyTree[jax.ShapeDtypeStruct],
    count: int | None,
    batch_size: int | None,
    keep: Callable[[Array, Array], Array],
) -> Array:
    """`keep(image, index)` for the first `count` basis vectors of the flattened
    input space of the linear function `mv`, each `image` its value at the basis
    vector `index` (flattened); `batch_size` vectors at a time (`None`: all at
    once). The one build of columns: an operator's (`build_dense_matrix`,
    `build_diagonal`) and that of `lxd.jit`'s materialised program.

    **Arguments:**

    - `mv`: a linear function of a PyTree shaped as `in_structure`.
    - `in_structure`: its input's structure (where an Explicit mesh axis types the
        flattened input, the basis vectors are made in its sharding).
    - `count`: how many basis vectors, the first ones, or `None` for all.
    - `batch_size`: the basis vectors applied together, or `None`.
    - `keep`: what to keep of each image.

    **Returns:**

    The kept values, stacked on a first axis (one entry per basis vector). The
    products of `mv` that have no precision of their own take float32's
    (`_precision.batched_products`).
    """
    flat_in, unravel_in = _flat_spec(in_structure)
    size = flat_in.size
    # The sharding of the input where an Explicit mesh axis types it.
    sharding = explicit_sharding(flat_in)
    count = size if count is None else count

    def apply(index):
        # The basis vector is made inside the chunk: no full identity in memory.
        basis_vector = (jnp.arange(size) == index).astype(flat_in.dtype)
        if sharding is not None:
            basis_vector = jax.sharding.reshard(basis_vector, sharding)
        out, _ = jfu.ravel_pytree(mv(unravel_in(basis_vector)))
        return keep(out, index)

    indices = jnp.arange(count)
    # The basis vectors go through `mv` together: its products at the precision
    # one `mv` has (`_precision`).
    with batched_products():
        if batch_size is None or batch_size >= count:
            return jax.vmap(apply)(indices)
        return lax.map(apply, indices, batch_size=batch_size)


def matrix_of(
    mv: Callable[[PyTree[Any]], PyTree[Any]],
    in_structure: PyTree[jax.ShapeDtypeStruct],
    batch_size: int | None,
) -> Inexact[Array, "out in"]:
    """The matrix of the linear function `mv` of a PyTree shaped as
    `in_structure`, in the flattened order of its input and output, built
    `batch_size` columns at a time (`None`: all at once)."""
    return images_of_basis(mv, in_structure, None, batch_size, lambda out, _: out).T


def build_dense_matrix(
    operator: lx.AbstractLinearOperator, batch_size: int | None
) -> Inexact[Array, "out in"]:
    """[`lineax_dispatch.dense_matrix`][]'s build, without its budget check (for
    callers that have checked it) and traced inline."""
    return matrix_of(RawMv(operator), operator.in_structure(), batch_size)


# Compiled once per operator kind and signature (its static part, the shapes of its
# arrays and `batch_size`) and reused by every eager build; jax holds the cache.
_compiled_build = eqx.filter_jit(build_dense_matrix)


def build_diagonal(
    operator: lx.AbstractLinearOperator, batch_size: int | None
) -> Inexact[Array, " size"]:
    """The diagonal of `operator` (in the flattened order of its PyTrees) without its
    matrix: its lineax `mv` applied to basis vectors, `batch_size` at a time
    (`None`: all at once), keeping only the diagonal entry of each image.

    **Arguments:**

    - `operator`: an operator of lineax-dispatch (or a plain lineax one).
    - `batch_size`: the basis vectors applied together, or `None`.

    **Returns:**

    A one-dimensional array of `min(out_size, in_size)` entries, of the dtype of the
    flattened output.
    """
    count = min(operator.in_size(), operator.out_size())
    structure = operator.in_structure()
    keep = lambda out, i: out[i]
    return images_of_basis(RawMv(operator), structure, count, batch_size, keep)


_compiled_diagonal = eqx.filter_jit(build_diagonal)


def diagonal_in_chunks(
    operator: lx.AbstractLinearOperator, batch_size: int | None
) -> Inexact[Array, " size"]:
    """`build_diagonal`, compiled once per operator kind and signature when run
    eagerly in chunks (as `dense_matrix` is), else traced inline.

    **Arguments:**

    - `operator`: the operator.
    - `batch_size`: the basis vectors applied together, or `None`.

    **Returns:**

    The diagonal, a one-dimensional array.
    """
    if compile_eagerly(operator, batch_size):
        return _compiled_diagonal(operator, batch_size)
    return build_diagonal(operator, batch_size)


def dense_matrix(
    operator: lx.AbstractLinearOperator, batch_size: int | None = None
) -> Inexact[Array, "out in"]:
    """The matrix of `operator`, of shape `(out_size, in_size)`, in the flattened
    (`jax.flatten_util.ravel_pytree`) order of its input and output PyTrees.

    This is how [`lineax_dispatch.Materialise`][] builds its matrix: the operator's
    lineax `mv` is applied to basis vectors directly, whatever its policy, and
    operators nested in it are applied inline.

    Outside any trace (eager code) a chunked build runs compiled, compiled once per
    operator kind and signature and reused; as with `jax.jit` (and eager `mv` under
    [`lineax_dispatch.Lazy`][]), Python state the function reads is read when it is
    first compiled.

    **Arguments:**

    - `operator`: an operator of lineax-dispatch, or a plain
        `lx.MatrixLinearOperator` (whose matrix is returned as it is). Give other
        plain lineax operators a policy first ([`lineax_dispatch.with_policy`][]).
    - `batch_size`: `None` to apply the operator to every basis vector at once
        (`vmap`), otherwise the number of columns computed together; the columns are
        then built by `jax.lax.map(..., batch_size=batch_size)`, which bounds the
        memory of the intermediates.

    **Returns:**

    A two-dimensional JAX array.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((4,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure)
        matrix = lxd.dense_matrix(op, batch_size=2)  # lower triangle of ones
        ```
    """
    batch_size = check_batch_size(batch_size, name="dense_matrix(batch_size=...)")
    if isinstance(operator, lx.MatrixLinearOperator):
        return operator.matrix
    check_dense_budget(
        operator,
        getattr(operator, "policy", None),
        what="`dense_matrix`",
        batch_size=batch_size,
        with_build=True,
    )
    if compile_eagerly(operator, batch_size):
        return _compiled_build(operator, batch_size)
    return build_dense_matrix(operator, batch_size)


def compile_eagerly(
    operator: lx.AbstractLinearOperator, batch_size: int | None
) -> bool:
    """Whether an eager build is run compiled: outside any trace, in chunks (an
    eager `lax.map` would trace and compile its body at every build; the
    all-at-once `vmap` runs operation by operation, cheaper for a single build)."""
    chunked = batch_size is not None and batch_size < operator.in_size()
    return chunked and current_scope() is None


def dense_mv(
    matrix: Inexact[Array, "out in"],
    vector: PyTree[Any],
    out_structure: PyTree[jax.ShapeDtypeStruct],
) -> PyTree[Any]:
    """Applies a flattened matrix to a PyTree vector, returning a PyTree shaped as
    `out_structure`."""
    flat_vector, _ = jfu.ravel_pytree(vector)
    _, unravel_out = _flat_spec(out_structure)
    with jax.numpy_dtype_promotion("standard"):
        flat_out = jnp.matmul(matrix, flat_vector, precision=lax.Precision.HIGHEST)
    return unravel_out(flat_out)
