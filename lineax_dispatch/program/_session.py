"""The session of an `lxd.jit` or `lxd.explain` trace: the records of the `Auto`
operators met, the solves decided and the solver choices made while it traces a
program (it is the trace's `Recorder`), and the jit-cache context its traces run
under."""

import contextlib
import contextvars
import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import jax
from jaxtyping import PyTree

from .._compat import current_trace
from ..policies.calls._keys import abstract_operator, operator_key
from ..policies.calls._marked import (
    AUTO_NAME,
    lifted_call,
    marked_mv,
    mv_parts,
    named_marked,
)
from ..policies.calls._recorder import (
    current_recorder,
    Hints,
    Recorder,
    recording,
    SolverChoice,
    SolveRecord,
)
from ..policies.calls._scope import current_scope


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


# A jit-cache-sensitive context (`jax.make_user_context`): `lxd.jit` traces run
# under `shared_context()`, so that the jits nested in the user's function that
# hold nothing of a session (`jax.numpy`'s own, the user's helpers) keep their
# traces from one program to the next, as under `jax.jit`. A nested trace holding
# an `Auto` operator's marked call named for one program may be reused by another:
# that program finds the foreign marked call in its own (`foreign_marked_calls`),
# retires the shared value (`retire_shared_context`) and is traced again. A solve
# decided in its solver's `init` rides on its operator, and an `AutoSolver` choice
# on its solver's state (`ChoiceRef`): both are read back from the program
# (`program/analyse/_solves.py`). A trace told hints runs under a value of its own.
PASS_CONTEXT = jax.make_user_context(default_value=None)


# The `PASS_CONTEXT` value of the trace while this package's own code runs under
# the default one (see `Session.own_code`); `None` elsewhere. Context-local, as
# `PASS_CONTEXT` is, whose value it restores in the same thread or task.
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


@dataclasses.dataclass
class Session(Recorder):
    """The state of one `lxd.jit` (or `lxd.explain`) trace: the `Auto` operator kinds
    whose `mv`s were traced, each through a marked call of its own, so that the
    traced program tells their call sites apart; what was decided in solvers; and
    the hints an earlier trace of the program left (`Hints`)."""

    hints: Hints = dataclasses.field(default_factory=Hints)
    token: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    records: dict[Any, AutoRecord] = dataclasses.field(default_factory=dict)
    solves: list[SolveRecord] = dataclasses.field(default_factory=list)
    # `AutoSolver`'s choices, for `explain`.
    solver_choices: list[SolverChoice] = dataclasses.field(default_factory=list)
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

    def recorded_mv(self, operator: Any, vector: PyTree[Any]) -> PyTree[Any]:
        """A marked call of this operator kind's own, which `lxd.jit` finds in the
        traced program, decides for and rewrites."""
        record, parts = self.apply_parts(operator)
        dynamic, key = parts
        traced = record.call.trace((key, current_scope()), dynamic, vector)
        if not traced.jaxpr.consts:
            out = marked_mv(operator, vector, record.call, parts)
            # The callee just called (jax's cached trace: the equation's).
            record.note_callee(traced.jaxpr)
            return out
        # Arrays the operator's function reads but is not given (a module's
        # global): passed to the call (`lifted_call`), as constants of this trace.
        lifted = record.lifted(traced)
        consts = list(traced.jaxpr.consts)
        record.note_callee(lifted.trace(consts, dynamic, vector).jaxpr)
        return lifted(consts, dynamic, vector)

    def add_solve(self, record: SolveRecord, *, carried: bool) -> None:
        if not carried:
            self.note_record()
        self.solves.append(record)

    def add_solver_choice(self, choice: SolverChoice) -> None:
        self.solver_choices.append(choice)

    @contextlib.contextmanager
    def own_code(self) -> Iterator[None]:
        """The default jit-cache context, for this package's own code (see
        `policies.calls._recorder.own_code`)."""
        value = PASS_CONTEXT.value
        if value is None:
            yield
            return
        with _switched(value, None):
            yield

    @contextlib.contextmanager
    def user_code(self) -> Iterator[None]:
        """Inside `own_code`, the trace's own jit-cache context again."""
        value = _OUTER.get()
        if value is None:
            yield
            return
        with _switched(None, value):
            yield


def current_session() -> Session | None:
    """The session of the `lxd.jit` or `lxd.explain` trace running, if any."""
    active = current_recorder()
    return active if isinstance(active, Session) else None


class _Generation:
    """The shared jit-cache context of one thread's `lxd.jit` traces: a token (each
    thread's caches apart) and a count, raised when a trace retires the value. One
    object per thread's context, shared by reference with the contexts copied from
    it (asyncio tasks), so that a retirement anywhere is seen everywhere."""

    def __init__(self):
        self.token = uuid.uuid4().hex
        self.count = 0


# Context-local, as JAX's jit caches are keyed per thread: each thread's traces
# share one generation, and the asyncio tasks copied from its context share it too.
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
    """The `PASS_CONTEXT` value of an `lxd.jit` trace without hints."""
    value = _generation()
    return ("lxd.jit", value.token, value.count)


def retire_shared_context() -> None:
    """Gives later traces a new `shared_context()`: the nested traces cached under
    the current one hold a session's records."""
    _generation().count += 1


@contextlib.contextmanager
def session(value: Session) -> Iterator[Session]:
    """Within this context `value` is the session (the recorder) of the trace
    running; its operators' cached parts are dropped when it ends."""
    try:
        with recording(value):
            yield value
    finally:
        value.applied.clear()
        value.top = None
