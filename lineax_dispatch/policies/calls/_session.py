"""The session of an `lxd.jit` or `lxd.explain` trace: context-local records of
the `Auto` operators met, the solves decided and the solver choices made while it
traces a program, and the jit-cache context its traces run under.

Everything here lives in context variables: each thread (and each asyncio task)
sees its own session, and there is no module-level mutable state."""

import contextlib
import contextvars
import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import jax

from ..._compat import current_trace
from ._keys import abstract_operator, operator_key
from ._marked import AUTO_NAME, lifted_call, mv_parts, named_marked
from ._sites import user_site


@dataclasses.dataclass
class AutoRecord:
    """One `Auto` operator kind met while `lxd.jit` traces a program: an example
    operator (shapes only, for `explain`; its policy), its kind key, the marked
    call its `mv`s go through (its equations named `name`) and the callees of
    those calls (`ClosedJaxpr`s, one per signature applied).

    Only calls of those callees are the operator's `mv`: a transformation in the
    program (`jax.grad`, `jax.jvp`, `jax.linearize`) makes calls of the same name
    whose callees compute something else (a JVP, a primal with residuals, a
    transpose)."""

    name: str
    key: Any
    operator: Any
    call: Any
    callees: list = dataclasses.field(default_factory=list)
    # `{id(traced callee): (traced callee, lifted_call of it)}`.
    lifted_calls: dict = dataclasses.field(default_factory=dict, repr=False)

    def lifted(self, traced: Any) -> Any:
        """The `lifted_call` of the traced marked call `traced`, made once per
        traced callee (one callee for all the sites it serves)."""
        entry = self.lifted_calls.get(id(traced.jaxpr))
        if entry is None:
            entry = (traced.jaxpr, lifted_call(self.name, traced))
            self.lifted_calls[id(traced.jaxpr)] = entry
        return entry[1]

    def note_callee(self, callee: Any) -> None:
        """Notes `callee` as one of the operator's plain `mv`s."""
        if not any(c is callee for c in self.callees):
            self.callees.append(callee)

    def applies(self, callee: Any) -> bool:
        """Whether `callee` is one of the operator's plain `mv`s (by identity)."""
        return any(c is callee for c in self.callees)


@dataclasses.dataclass
class SolveRecord:
    """One solve of an `Auto` operator decided in a solver's `init` while `lxd.jit`
    or `lxd.explain` traces a program, for `explain`."""

    key: Any
    operator: Any
    executions: float
    decision: Any
    site: tuple[str, int]


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


@dataclasses.dataclass
class Session:
    """The state of one `lxd.jit` (or `lxd.explain`) trace: the `Auto` operator kinds
    whose `mv`s were traced, each through a marked call of its own, so that the
    traced program tells their call sites apart; and what was decided in solvers."""

    token: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    records: dict[Any, AutoRecord] = dataclasses.field(default_factory=dict)
    solves: list[SolveRecord] = dataclasses.field(default_factory=list)
    # `AutoSolver`'s choices, for `explain`.
    solver_choices: list[SolverChoice] = dataclasses.field(default_factory=list)
    # What an earlier trace of the program found: `(user site, operator key) -> k`
    # solves sharing one matrix build (`solve_hint`), and `(user site,
    # (LAYOUT_HINT, operator key)) -> runs` of a CG solve per run of the program
    # (`layout_hint`).
    solve_hints: dict[tuple, float] = dataclasses.field(default_factory=dict)
    # `id -> (operator, record, mv parts)` of the operators applied in this trace
    # (emptied when it ends: the parts hold its tracers), so that one operator
    # applied at many call sites is partitioned and hashed once.
    applied: dict[int, tuple] = dataclasses.field(default_factory=dict, repr=False)
    # The trace of the function's own body (set when it starts), and whether any
    # of this session's records was made in another trace: a nested jit (lineax's
    # `linear_solve` is one), a loop body, a transformation (see `shared_context`).
    top: Any = dataclasses.field(default=None, repr=False)
    nested_records: bool = False
    # The marked calls of other `lxd.jit` programs called in this trace (their own
    # decisions made): not this program's to decide, nor a sign of a stale trace.
    embedded: set[str] = dataclasses.field(default_factory=set)

    def note_record(self) -> None:
        """Notes that a record of this session is being made in the current trace."""
        if current_trace() is not self.top:
            self.nested_records = True

    def apply_parts(self, operator: Any) -> tuple[AutoRecord, tuple[Any, Any]]:
        """`(record, mv_parts(operator))` of an `Auto` operator applied in this
        trace, computed at its first `mv` and reused at its later ones. (Made in
        a nested trace, its record does not retire the shared jit-cache context:
        a later program that reuses that trace finds this session's marked call in
        its own program, and is traced again; see `foreign_marked_calls`.)"""
        entry = self.applied.get(id(operator))
        if entry is not None and entry[0] is operator:
            return entry[1], entry[2]
        record = self.record(operator, operator_key(operator))
        parts = mv_parts(operator)
        self.applied[id(operator)] = (operator, record, parts)
        return record, parts

    def record(self, operator: Any, key: Any) -> AutoRecord:
        """The record of `operator`'s kind (`key`), made at its first `mv`."""
        record = self.records.get(key)
        if record is None:
            # Unique to this trace: a nested `lxd.jit` names its own apart.
            name = f"{AUTO_NAME}_{self.token[:12]}_{len(self.records)}"
            record = AutoRecord(
                name, key, abstract_operator(operator), named_marked(name)
            )
            self.records[key] = record
        return record

    def by_name(self) -> dict[str, AutoRecord]:
        """The records, by the name of their marked call."""
        return {record.name: record for record in self.records.values()}


# A jit-cache-sensitive context (`jax.make_user_context`): `lxd.jit` traces run
# under `shared_context()`, so that the jits nested in the user's function that
# hold nothing of a session (`jax.numpy`'s own, the user's helpers) keep their
# traces from one program to the next, as under `jax.jit`. A nested trace holding
# an `Auto` operator's marked call named for one program may be reused by another:
# that program finds the foreign marked call in its own (`foreign_marked_calls`),
# retires the shared value (`retire_shared_context`) and is traced again. A solve
# decided in its solver's `init` rides on its operator, and an `AutoSolver` choice
# on its solver's state (`ChoiceRef`): both are read back from the program
# (`program/analyse/_solves.py`). A trace told solve hints runs under a value of
# its own.
PASS_CONTEXT = jax.make_user_context(default_value=None)


# The `PASS_CONTEXT` value of the trace while this package's own code runs under
# the default one (see `own_code`); `None` elsewhere.
_OUTER: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "lineax_dispatch_outer_context", default=None
)


@contextlib.contextmanager
def _switched(outer: Any, inner: Any) -> Iterator[None]:
    """`_OUTER` set to `outer` and `PASS_CONTEXT` to `inner`, both restored after."""
    token = _OUTER.set(outer)
    try:
        with PASS_CONTEXT(inner):
            yield
    finally:
        _OUTER.reset(token)


@contextlib.contextmanager
def own_code() -> Iterator[None]:
    """Runs this package's own code (a solver's loop) under the default jit-cache
    context, so that the jits it calls (`jax.numpy`'s own, such as `jnp.where`) reuse
    their traces from earlier programs instead of being traced afresh for each
    `lxd.jit` trace. Code of the user's called from inside it (an operator's or a
    preconditioner's `mv`) goes through `user_code`, which restores the trace's
    context. Outside `lxd.jit` and `lxd.explain` it does nothing."""
    value = PASS_CONTEXT.value
    if value is None:
        yield
        return
    with _switched(value, None):
        yield


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """Inside `own_code`: the trace's own jit-cache context again, for the user's
    code (whose nested jits may apply `Auto` operators, which must be traced for
    this program). Elsewhere it does nothing."""
    value = _OUTER.get()
    if value is None:
        yield
        return
    with _switched(None, value):
        yield


_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "lineax_dispatch_session", default=None
)


def current_session() -> Session | None:
    return _SESSION.get()


class _Generation:
    """The shared jit-cache context of one thread's `lxd.jit` traces: a token (each
    thread's caches apart) and a count, raised when a trace retires the value. One
    object per thread's context, shared by reference with the contexts copied from
    it (asyncio tasks), so that a retirement anywhere is seen everywhere."""

    def __init__(self):
        self.token = uuid.uuid4().hex
        self.count = 0


_GENERATION: contextvars.ContextVar[_Generation | None] = contextvars.ContextVar(
    "lineax_dispatch_generation", default=None
)


def _generation() -> _Generation:
    value = _GENERATION.get()
    if value is None:
        value = _Generation()
        _GENERATION.set(value)
    return value


def shared_context() -> tuple:
    """The `PASS_CONTEXT` value of an `lxd.jit` trace without solve hints."""
    value = _generation()
    return ("lxd.jit", value.token, value.count)


def retire_shared_context() -> None:
    """Gives later traces a new `shared_context()`: the nested traces cached under
    the current one hold a session's records."""
    _generation().count += 1


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
    active = _SESSION.get()
    if active is None:
        return None
    choice = SolverChoice(operator, size, solver, reasons, cost_model)
    active.solver_choices.append(choice)
    return choice


@contextlib.contextmanager
def session(value: Session) -> Iterator[Session]:
    """Within this context `value` is the session of the trace running (see
    `current_session`); its operators' cached parts are dropped when it ends."""
    token = _SESSION.set(value)
    try:
        yield value
    finally:
        _SESSION.reset(token)
        value.applied.clear()
        value.top = None


def solve_record(operator: Any, key: Any, executions: float, decision: Any) -> Any:
    """The `SolveRecord` of a solve's decision made at the current user line, if an
    `lxd.jit` or `lxd.explain` trace is running, else `None`."""
    if _SESSION.get() is None:
        return None
    return SolveRecord(
        key, abstract_operator(operator), executions, decision, user_site()
    )


def record_solve(record: Any, *, carried: bool) -> None:
    """Notes a solve's `record` (from `solve_record`) in the `lxd.jit` or
    `lxd.explain` trace running, if any. A record `carried` by the solve's operator
    (its pinned policy, read back from the program by `carried_solves`) does not
    retire the shared jit-cache context when made in a nested trace: a later
    program that reuses that trace finds it in its own program."""
    active = _SESSION.get()
    if active is not None and record is not None:
        if not carried:
            active.note_record()
        active.solves.append(record)


def solve_hint(key: Any) -> int:
    """How many solves of the operator kind `key` at the current user line share
    one build, as `lxd.jit` found in a first trace of the program (1 if none).

    **Arguments:**

    - `key`: the operator's kind key.

    **Returns:**

    A positive int.
    """
    active = current_session()
    if active is None or not active.solve_hints:
        return 1
    return int(active.solve_hints.get((user_site(), key), 1))


# The key of a CG layout hint in `Session.solve_hints`, after the user's line.
LAYOUT_HINT = "cg-layout"


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
    active = current_session()
    if active is None or not active.solve_hints:
        return 1.0
    return float(active.solve_hints.get((user_site(), (LAYOUT_HINT, key)), 1.0))
