"""Matrix-free operators: a linear function, or the Jacobian of a function."""

from collections.abc import Callable, Iterable
from operator import methodcaller
from typing import Any, Literal

import equinox as eqx
import jax
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import Array, ArrayLike, Inexact, PyTree

from ..policies import AbstractPolicy
from ._dispatch_operator import AbstractDispatchOperator, rebuild_as
from ._sharding import as_stated
from ._vector_structure import flat_structure, FlatStructure, recorded_output_structure


class _MatrixFree(AbstractDispatchOperator):
    """The output structure of a function's operator, known from construction:
    the one equinox recorded where lineax closure-converted the function by
    tracing it, otherwise lineax's abstract evaluation of the function, done once
    at construction (as lineax does there for an operator tagged symmetric).
    lineax's evaluates an untagged operator's function when first asked, inside
    its first solve: a third trace of the user's code in a jitted solve."""

    output_structure: FlatStructure = eqx.field(static=True)

    def _set_output_structure(self, *arguments: Any) -> None:
        # Called from each concrete `__init__`, with `fn`'s arguments.
        fn = self.fn  # pyright: ignore[reportAttributeAccessIssue]
        recorded = recorded_output_structure(fn)
        if recorded is None:
            recorded = flat_structure(eqx.filter_eval_shape(fn, *arguments))
        self.output_structure = recorded

    def out_structure(self) -> PyTree[jax.ShapeDtypeStruct]:
        """The output structure, known from construction (see the class).

        **Returns:**

        A PyTree of `jax.ShapeDtypeStruct`s.
        """
        leaves, treedef = self.output_structure
        return jtu.tree_unflatten(treedef, leaves)

    def raw_mv(self, vector: PyTree[Array]) -> PyTree[Array]:
        """The function applied to `vector`, its output sharded as `out_structure()`
        states (see `lineax_dispatch.operators._sharding.as_stated`).

        **Arguments:**

        - `vector`: a PyTree matching `self.in_structure()`.

        **Returns:**

        A PyTree matching `self.out_structure()`.
        """
        return as_stated(super().raw_mv(vector), self.out_structure())


class FunctionLinearOperator(_MatrixFree, lx.FunctionLinearOperator):
    """[`lineax.FunctionLinearOperator`][] carrying a policy.

    This is where policies matter most: `fn` may be expensive to compile and to
    run, and JAX inlines it at every call site of `mv`.

    !!! Example

        ```python
        op = lxd.FunctionLinearOperator(
            lambda x: 2 * x, jax.ShapeDtypeStruct((3,), jnp.float32),
            policy=lxd.Outline(),
        )
        y = op.mv(jnp.ones(3, jnp.float32))
        ```
    """

    def __init__(
        self,
        fn: Callable[[PyTree[Inexact[Array, "..."]]], PyTree[Inexact[Array, "..."]]],
        input_structure: PyTree[jax.ShapeDtypeStruct],
        tags: object | Iterable[object] = (),
        closure_convert: bool = True,
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `fn`: a linear function `X -> Y`, taking and returning PyTrees of arrays.
        - `input_structure`: PyTree of `jax.ShapeDtypeStruct` describing `X` (what
            `jax.eval_shape(lambda: x)` gives for an input `x`).
        - `tags`: lineax tags (`lx.positive_semidefinite_tag`, ...), unchecked.
        - `closure_convert`: as lineax (default `True`): trace `fn` once, so that
            arrays it closes over become part of the operator.
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        lx.FunctionLinearOperator.__init__(
            self, fn, input_structure, tags, closure_convert
        )
        self._set_output_structure(self.in_structure())
        self._set_policy(policy)


class JacobianLinearOperator(_MatrixFree, lx.JacobianLinearOperator):
    """[`lineax.JacobianLinearOperator`][] carrying a policy: the Jacobian
    `d(fn)/dx` of a function at a point, applied matrix-free by forward- or
    reverse-mode autodiff.

    !!! Example

        ```python
        x = jnp.array([0.5, 1.0])
        op = lxd.JacobianLinearOperator(lambda x, args: jnp.sin(x) * args, x, 3.0)
        y = op.mv(jnp.ones(2))  # 3 cos(x)
        ```
    """

    def __init__(
        self,
        fn: Callable,
        x: PyTree[ArrayLike],
        args: PyTree[Any] = None,
        tags: object | Iterable[object] = (),
        jac: Literal["fwd", "bwd"] | None = None,
        closure_convert: bool = True,
        *,
        policy: AbstractPolicy | None = None,
    ):
        """**Arguments:**

        - `fn`: a function `(x, args) -> y`.
        - `x`: the point at which the Jacobian is taken.
        - `args`: further (non-differentiated) arguments of `fn`.
        - `tags`: lineax tags, unchecked.
        - `jac`: `"fwd"` (`jax.jacfwd`-style forward mode), `"bwd"` (reverse mode)
            or `None` to let lineax choose, as lineax.
        - `closure_convert`: as lineax (default `True`).
        - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not
            given.
        """
        lx.JacobianLinearOperator.__init__(
            self, fn, x, args, tags, jac, closure_convert
        )
        self._set_output_structure(self.x, self.args)
        self._set_policy(policy)


rebuild_as(
    lx.FunctionLinearOperator,
    FunctionLinearOperator,
    "fn",
    methodcaller("in_structure"),
    "tags",
    closure_convert=False,
)
rebuild_as(
    lx.JacobianLinearOperator,
    JacobianLinearOperator,
    *("fn", "x", "args", "tags", "jac"),
    closure_convert=False,
)
