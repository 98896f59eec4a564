"""What the code a trace runs tells the trace that reads its program (`lxd.jit`,
`lxd.explain`): the recorder interface an `Auto` operator's `mv` and a solver's
`init` record through, implemented by the program's session
(`program/_session.py`), the records they hand it, and the hints an earlier trace
of the program left for them (`Hints`).

lineax calls an operator's `mv` and a solver's `init` with arguments of its own:
the recorder of the trace running is reached through one context variable."""

import abc
import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ContextManager

import equinox as eqx
from jaxtyping import PyTree

from ._keys import abstract_operator
from ._sites import user_site


@dataclasses.dataclass
class SolveRecord:
    """One solve of an `Auto` operator decided in a solver's `init` while `lxd.jit`
    or `lxd.explain` traces a program, for `explain`."""

    key: Any
    operator: Any
    executions: float
    decision: Any
    site: tuple[str, int]
    tolerance: float | None = None


class SolverChoice(eqx.Module):
    """What an `lxd.AutoSolver` chose for one solve (or the layout an `lxd.CG`
    with `layout="auto"` took), in an [`lineax_dispatch.ExplainReport`][]'s
    `solves`.

    **Arguments:** (each is also the attribute of that name)

    - `operator`: the operator's class name.
    - `size`: `"out x in"`.
    - `solver`: the chosen lineax solver's class name (for CG's layout,
        `"CG (inline layout)"` or `"CG (one-site layout)"`).
    - `reasons`: sentences explaining the choice.
    - `cost_model`: where the estimates' constants came from (the cost model's
        `source`).
    """

    operator: str
    size: str
    solver: str
    reasons: tuple[str, ...]
    cost_model: str = ""


@dataclasses.dataclass(frozen=True)
class Hints:
    """What an earlier trace of a program found, told to the next trace of it:
    `solves`, `(user site, operator key) -> k` solves sharing one matrix build
    (`solve_hint`); `layouts`, `(user site, operator key) -> runs` of a CG solve
    per run of the program (`layout_hint`)."""

    solves: Mapping[tuple, int] = dataclasses.field(default_factory=dict)
    layouts: Mapping[tuple, float] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.solves) or bool(self.layouts)


class Recorder(abc.ABC):
    """What an `Auto` operator's `mv` and a solver's `init` record in the trace
    of a program that reads it, and the hints that trace was told."""

    hints: Hints

    @abc.abstractmethod
    def recorded_mv(self, operator: Any, vector: PyTree[Any]) -> PyTree[Any]:
        """`operator.mv(vector)` as a marked call the program's reader finds."""

    @abc.abstractmethod
    def add_solve(self, record: SolveRecord, *, carried: bool) -> None:
        """Notes a solve's decision (see `record_solve`)."""

    @abc.abstractmethod
    def add_solver_choice(self, choice: SolverChoice) -> None:
        """Notes a solver's choice (see `record_solver_choice`)."""

    @abc.abstractmethod
    def own_code(self) -> ContextManager[None]:
        """See `own_code`."""

    @abc.abstractmethod
    def user_code(self) -> ContextManager[None]:
        """See `user_code`."""


# Context-local: lineax calls `mv` and `init` with its own arguments, so the
# recorder of the trace running reaches them no other way (each thread sees its own).
_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "lineax_dispatch_recorder", default=None
)


def current_recorder() -> Recorder | None:
    """The recorder of the `lxd.jit` or `lxd.explain` trace running, if any."""
    return _RECORDER.get()


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[None]:
    """Within this context `recorder` is the trace's (see `current_recorder`)."""
    token = _RECORDER.set(recorder)
    try:
        yield
    finally:
        _RECORDER.reset(token)


def own_code() -> ContextManager[None]:
    """Runs this package's own code (a solver's loop) under the default jit-cache
    context, so that the jits it calls (`jax.numpy`'s own, such as `jnp.where`) reuse
    their traces from earlier programs instead of being traced afresh for each
    `lxd.jit` trace. Code of the user's called from inside it (an operator's or a
    preconditioner's `mv`) goes through `user_code`, which restores the trace's
    context. Outside `lxd.jit` and `lxd.explain` it does nothing."""
    active = _RECORDER.get()
    return contextlib.nullcontext() if active is None else active.own_code()


def user_code() -> ContextManager[None]:
    """Inside `own_code`: the trace's own jit-cache context again, for the user's
    code (whose nested jits may apply `Auto` operators, which must be traced for
    this program). Elsewhere it does nothing."""
    active = _RECORDER.get()
    return contextlib.nullcontext() if active is None else active.user_code()


def record_solver_choice(
    operator: str,
    size: str,
    solver: str,
    reasons: tuple[str, ...],
    cost_model: str = "",
) -> SolverChoice | None:
    """Notes a solver choice in the observing trace of `lxd.jit` or `lxd.explain`,
    if one is running, and returns it (`None` where none is) for the solver's
    state to carry: made in a nested trace, it does not retire the shared
    jit-cache context, since a later program that reuses that trace reads it
    from its own program (`add_carried_solver_choices`)."""
    active = _RECORDER.get()
    if active is None:
        return None
    choice = SolverChoice(operator, size, solver, reasons, cost_model)
    active.add_solver_choice(choice)
    return choice


def solve_record(
    operator: Any,
    key: Any,
    executions: float,
    decision: Any,
    tolerance: float | None = None,
) -> Any:
    """The `SolveRecord` of a solve's decision made at the current user line, if an
    `lxd.jit` or `lxd.explain` trace is running, else `None`."""
    if _RECORDER.get() is None:
        return None
    return SolveRecord(
        key, abstract_operator(operator), executions, decision, user_site(), tolerance
    )


def record_solve(record: Any, *, carried: bool) -> None:
    """Notes a solve's `record` (from `solve_record`) in the `lxd.jit` or
    `lxd.explain` trace running, if any. A record `carried` by the solve's operator
    (its pinned policy, read back from the program by `carried_solves`) does not
    retire the shared jit-cache context, as `record_solver_choice`."""
    active = _RECORDER.get()
    if active is not None and record is not None:
        active.add_solve(record, carried=carried)


def solve_hint(key: Any) -> int:
    """How many solves of the operator kind `key` at the current user line share
    one build, as `lxd.jit` found in a first trace of the program (1 if none).

    **Arguments:**

    - `key`: the operator's kind key.

    **Returns:**

    A positive int.
    """
    return int(_hint("solves", key))


def layout_hint(key: Any) -> float:
    """How many times a CG solve of the operator kind `key` at the current user
    line runs per run of the program, as `lxd.jit` found in a first trace of it
    (the trips of its enclosing loops), where that changes the solve's layout; 1
    if none.

    **Arguments:**

    - `key`: the operator's kind key.

    **Returns:**

    A positive float.
    """
    return float(_hint("layouts", key))


def _hint(kind: str, key: Any) -> Any:
    # The hint of `Hints.<kind>` for `key` at the current user line, 1 if none.
    active = _RECORDER.get()
    if active is None or not active.hints:
        return 1
    return getattr(active.hints, kind).get((user_site(), key), 1)
