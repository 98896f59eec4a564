"""Matrix-free operators: a linear function, or the Jacobian of a function."""

from collections.abc import Callable, Iterable
from typing import Any, Literal

import jax
import lineax as lx
from jaxtyping import Array, ArrayLike, Inexact, PyTree

from ..policies import AbstractPolicy
from ._base import AbstractDispatchOperator


class FunctionLinearOperator(AbstractDispatchOperator, lx.FunctionLinearOperator):
    """[`lineax.FunctionLinearOperator`][] carrying a policy.

    This is where policies matter most: `fn` may be expensive to compile and to
    run.

    **Arguments:**

    - `fn`: a linear function `X -> Y`.
    - `input_structure`: PyTree of `jax.ShapeDtypeStruct` describing `X`.
    - `tags`: lineax tags, unchecked.
    - `closure_convert`: as lineax (default `True`).
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.

    !!! Example

        ```python
        op = lxd.FunctionLinearOperator(
            lambda x: 2 * x, jax.ShapeDtypeStruct((3,), jnp.float32),
            policy=lxd.Outline(),
        )
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
        lx.FunctionLinearOperator.__init__(
            self, fn, input_structure, tags, closure_convert
        )
        self._set_policy(policy)


class JacobianLinearOperator(AbstractDispatchOperator, lx.JacobianLinearOperator):
    """[`lineax.JacobianLinearOperator`][] carrying a policy.

    **Arguments:**

    - `fn`: a function `(x, args) -> y`.
    - `x`: the point at which the Jacobian is taken.
    - `args`: further (non-differentiated) arguments of `fn`.
    - `tags`: lineax tags, unchecked.
    - `jac`: `"fwd"`, `"bwd"` or `None`, as lineax.
    - `closure_convert`: as lineax (default `True`).
    - `policy`: an [`lineax_dispatch.AbstractPolicy`][]; the default if not given.
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
        lx.JacobianLinearOperator.__init__(
            self, fn, x, args, tags, jac, closure_convert
        )
        self._set_policy(policy)
