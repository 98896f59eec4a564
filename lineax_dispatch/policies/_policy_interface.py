"""The policy interface and the context that switches policies off inside one."""

import abc
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import lineax as lx
from jaxtyping import PyTree


# True while tracing the body of an operator whose policy has already taken charge
# (inside an outlined call, or while building a materialised matrix). Nested
# operators then apply their plain lineax `mv`: the outermost non-`Lazy` policy
# decides for the whole expression. A context variable: the nested `mv`s are
# called by lineax or the user's function, with no argument to carry it.
_RAW_MV: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "lineax_dispatch_raw_mv", default=False
)


@contextlib.contextmanager
def raw_mv_context() -> Iterator[None]:
    """Within this context, operators of this package skip their policy."""
    token = _RAW_MV.set(True)
    try:
        yield
    finally:
        _RAW_MV.reset(token)


def in_raw_mv_context() -> bool:
    """Whether the current trace is inside a policy's own application."""
    return _RAW_MV.get()


class RawMv(eqx.Module):
    """The plain lineax `mv` of an operator, as a callable PyTree.

    Its arrays are the operator's arrays and its static part the operator's static
    part, so two `RawMv`s of the same operator hash equal: this is what lets
    `equinox.internal.noinline` compile one callee for every call site.
    """

    operator: lx.AbstractLinearOperator

    def __call__(self, vector: PyTree[Any]) -> PyTree[Any]:
        with raw_mv_context():
            return self.operator.raw_mv(vector)  # pyright: ignore[reportAttributeAccessIssue]


class AbstractPolicy(eqx.Module):
    """Abstract base class for policies: how an operator applies its `mv`.

    A policy is attached to an operator (`policy=` on every operator of
    lineax-dispatch) and acts each time the operator's `mv` is called. The concrete
    policies are [`lineax_dispatch.Auto`][] (the default), [`lineax_dispatch.Lazy`][],
    [`lineax_dispatch.Outline`][], [`lineax_dispatch.Materialise`][],
    [`lineax_dispatch.VmapBatch`][] and [`lineax_dispatch.Scan`][]. A new one
    subclasses this and implements `mv`, in which `operator.raw_mv(vector)` is
    lineax's own `mv`. Policies are equinox modules: hashable, compared by value.

    !!! Example

        ```python
        class Logged(lxd.AbstractPolicy):
            def mv(self, operator, vector):
                print("tracing the mv of", type(operator).__name__)
                return operator.raw_mv(vector)

        op = lxd.MatrixLinearOperator(jnp.eye(2), policy=Logged())
        y = op.mv(jnp.ones(2))
        ```
    """

    @abc.abstractmethod
    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        """Applies `operator` to `vector` in the way this policy prescribes.

        **Arguments:**

        - `operator`: an operator of lineax-dispatch.
        - `vector`: a PyTree matching `operator.in_structure()`.

        **Returns:**

        A PyTree matching `operator.out_structure()`.
        """

    def eager_mv(
        self, operator: lx.AbstractLinearOperator
    ) -> Callable[[PyTree[Any]], PyTree[Any]] | None:
        """How `mv` applies `operator` outside any trace, when that is one function
        of the vector for the operator's whole life (a compiled `mv` with the
        operator's arrays bound): the operator then resolves it at its first eager
        `mv` and calls it directly at the later ones, given a vector of exactly its
        input structure. `None` (the default): every eager `mv` calls `mv`.

        **Arguments:**

        - `operator`: an operator of lineax-dispatch carrying this policy.

        **Returns:**

        A function of the vector, or `None`.
        """
        del operator
        return None


def _concrete_policies() -> list[type[AbstractPolicy]]:
    found = []
    stack = list(AbstractPolicy.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        # Abstract bases and private policies (the library's own, never given by
        # a user) aside.
        if not getattr(cls, "__abstractmethods__", None) and not (
            cls.__name__.startswith(("_", "Abstract"))
        ):
            found.append(cls)
    return sorted(found, key=lambda c: c.__name__)


def check_policy(policy: Any, *, name: str = "policy") -> AbstractPolicy:
    """Validates a policy given by a user.

    **Arguments:**

    - `policy`: the value to check.
    - `name`: the argument name to use in the error message.

    **Returns:**

    `policy` itself, if it is an [`lineax_dispatch.AbstractPolicy`][].

    **Raises:**

    `TypeError` naming the argument, the allowed kinds and what was given.
    """
    if isinstance(policy, AbstractPolicy):
        return policy
    allowed = ", ".join(f"{cls.__name__}()" for cls in _concrete_policies())
    if isinstance(policy, type) and issubclass(policy, AbstractPolicy):
        hint = (
            f" (got the class {policy.__name__}; instantiate it: {policy.__name__}())"
        )
    else:
        hint = f"; got {policy!r} of type {type(policy).__name__}"
    raise TypeError(
        f"`{name}` must be a lineax-dispatch policy, one of {allowed}{hint}"
    )


def with_top_policy(operator: Any, policy: AbstractPolicy) -> Any:
    """`operator` with `policy` at its top node, its children and arrays shared: a
    shallow copy, as equinox's own unflattening makes one (no `__init__`, whose
    checks the operator passed when it was made; a tagged `FunctionLinearOperator`'s
    evaluates its function's output structure again).

    **Arguments:**

    - `operator`: an operator of lineax-dispatch.
    - `policy`: the new top policy (not checked here).

    **Returns:**

    The copy.
    """
    copy = object.__new__(type(operator))
    copy.__dict__.update(operator.__dict__)
    copy.__dict__["policy"] = policy
    return copy
