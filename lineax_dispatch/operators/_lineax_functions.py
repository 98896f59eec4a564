"""lineax's operator functions on the operators of lineax-dispatch.

lineax dispatches `lx.materialise`, `lx.diagonal` and `lx.linearise` on the
operator's class with `functools.singledispatch`, and every class of ours subclasses
a lineax class, so without a registration of its own it would get lineax's: a dense
matrix built past its policy's memory budget, a plain lineax result without the
policy. The registrations here, on [`lineax_dispatch.AbstractDispatchOperator`][]
(which comes before the lineax class in the order in which Python looks up each of
our classes), run lineax's own implementation and then

- `materialise`: first check the dense matrix of a matrix-free operator (or of a
    plain lineax operand of a composite one) against the budget, and make the
    operands' own checks count the composite's budget too; the result keeps the
    policy;
- `diagonal`: where lineax would build the whole matrix and it does not fit the
    budget, build only the diagonal, a chunk of basis vectors at a time that fits;
- `linearise`: keep the type (an operator of ours) and the policy.

The matrix and diagonal builds apply the operator to many basis vectors together;
their products keep the precision one `mv` has (`_precision.batched_products`):
float32's on an accelerator, where lineax's own build runs at JAX's default (a
TPU's bfloat16 passes).

`lxd.materialise`, `lxd.diagonal` and `lxd.linearise` call these through lineax, so
both packages' functions behave the same on our operators. Plain lineax operators
keep lineax's behaviour.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.flatten_util as jfu
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import Array, Inexact

from .._precision import batched_products
from ..policies import Materialise, RawMv
from ..policies._dense import build_dense_matrix, diagonal_in_chunks
from ..policies._memory import (
    budget_in_force,
    build_bytes,
    check_bytes,
    check_dense_budget,
    diagonal_build_bytes,
    diagonal_chunk,
    itemsize,
    policy_in_force,
)
from ._dispatch_operator import (
    AbstractDispatchOperator,
    adopt,
    banded,
    holds_entries,
    operands_of,
)
from ._sharding import sharded_structure


_MATRIX_FREE = (lx.FunctionLinearOperator, lx.JacobianLinearOperator)


def _lineax_implementation(
    function: Any, operator: lx.AbstractLinearOperator
) -> Callable[[lx.AbstractLinearOperator], Any]:
    """lineax's registration of `function` for the lineax class that the class of
    `operator` subclasses."""
    for cls in type(operator).__mro__:
        if not issubclass(cls, AbstractDispatchOperator):
            return function.dispatch(cls)
    raise TypeError(f"{type(operator).__name__} subclasses no lineax operator")


def _check_dense(operator: lx.AbstractLinearOperator, policy: Any, what: str) -> None:
    """Checks the dense matrix of `operator` against `policy`'s budget where it is
    matrix-free, else that of each matrix-free plain lineax operand (reached
    through plain lineax nodes); operands of ours check their own, under the
    budget in force."""
    if isinstance(operator, _MATRIX_FREE):
        if not banded(operator):
            check_dense_budget(operator, policy, what=what)
        return
    for operand in operands_of(operator):
        if not isinstance(operand, AbstractDispatchOperator):
            _check_dense(operand, policy, what)


@lx.materialise.register(AbstractDispatchOperator)
def _materialise(operator: AbstractDispatchOperator) -> AbstractDispatchOperator:
    if not holds_entries(operator):
        _check_dense(operator, operator.policy, "`materialise`")
    with policy_in_force(operator.policy), batched_products():
        out = _sharded_matrix(operator)
        if out is None:
            out = _lineax_implementation(lx.materialise, operator)(operator)
    return adopt(out, operator.policy)


def _sharded_matrix(
    operator: lx.AbstractLinearOperator,
) -> lx.MatrixLinearOperator | None:
    """The matrix of `operator` where it is matrix-free and square, and takes and
    gives vectors of one type that an Explicit mesh axis shards (lineax builds the
    matrix from an identity that has no sharding, which the operator's function
    does not accept), else `None`. Built from basis vectors in the vectors'
    sharding (`policies._dense.build_dense_matrix`), its rows sharded as they are,
    which is how a `MatrixLinearOperator` of ours (`adopt`) types the vectors it
    takes and gives."""
    if not isinstance(operator, _MATRIX_FREE):
        return None
    leaves = jtu.tree_leaves((operator.in_structure(), operator.out_structure()))
    if len(leaves) != 2 or leaves[0].ndim != 1 or leaves[0] != leaves[1]:
        return None
    if sharded_structure(operator) is None:
        return None
    return lx.MatrixLinearOperator(build_dense_matrix(operator, None), operator.tags)


@lx.linearise.register(AbstractDispatchOperator)
def _linearise(operator: AbstractDispatchOperator) -> AbstractDispatchOperator:
    out = _lineax_implementation(lx.linearise, operator)(operator)
    return adopt(out, operator.policy)


def _ones_diagonal(operator: AbstractDispatchOperator) -> Inexact[Array, " size"]:
    # As lineax for a diagonal-tagged operator: one `mv` of a vector of ones, here
    # lineax's own `mv` (the policy's might build the matrix the budget refuses).
    with jax.ensure_compile_time_eval():
        ones = jtu.tree_map(
            lambda s: jnp.ones(s.shape, s.dtype), operator.in_structure()
        )
    diagonal, _ = jfu.ravel_pytree(RawMv(operator)(ones))
    return diagonal


def _whole_matrix_fits(operator: lx.AbstractLinearOperator, budget: int) -> bool:
    # lineax's route: an identity, its image (the matrix), then its diagonal.
    n_out, n_in = operator.out_size(), operator.in_size()
    return build_bytes(n_out, n_in, itemsize(operator), n_in) <= budget


def _builds_whole_matrix(operator: lx.AbstractLinearOperator) -> bool:
    """Whether lineax takes the diagonal of `operator` from its whole matrix."""
    if isinstance(operator, lx.ComposedLinearOperator):
        return not (
            lx.is_diagonal(operator.operator1) and lx.is_diagonal(operator.operator2)
        )
    return isinstance(operator, _MATRIX_FREE) and not lx.is_diagonal(operator)


@lx.diagonal.register(AbstractDispatchOperator)
def _diagonal(operator: AbstractDispatchOperator) -> Inexact[Array, " size"]:
    policy = operator.policy
    found = budget_in_force(policy)
    fits = found is None or _whole_matrix_fits(operator, found[1])
    if not fits and isinstance(operator, _MATRIX_FREE) and lx.is_diagonal(operator):
        return _ones_diagonal(operator)
    if fits or not _builds_whole_matrix(operator):
        # Where it does not fit, sums, products, tags...: lineax takes each
        # operand's diagonal (ours in chunks where needed); explicit operators
        # hold theirs.
        with policy_in_force(policy), batched_products():
            return _lineax_implementation(lx.diagonal, operator)(operator)
    assert found is not None
    n_out, n_in, size = operator.out_size(), operator.in_size(), itemsize(operator)
    chunk = diagonal_chunk(n_out, n_in, size, found[1])
    check_bytes(
        operator,
        policy,
        diagonal_build_bytes(n_out, n_in, size, max(chunk, 1)),
        what="`diagonal`",
        detail="one basis vector and its image at a time, and the diagonal",
    )
    if isinstance(policy, Materialise) and policy.batch_size is not None:
        chunk = min(chunk, policy.batch_size)
    return diagonal_in_chunks(operator, chunk)
