"""A decided policy pinned to the trace a solve was bound in."""

from typing import Any

import equinox as eqx
import lineax as lx
from jaxtyping import PyTree

from ._policy_interface import AbstractPolicy
from .calls._scope import pinned_scope, TraceScope


class _Unkeyed:
    """A value a policy carries without entering its equality or hash: every two of
    one kind compare equal. An operator's structure (its policy is static) must not
    depend on the trace it was prepared in, nor on which program's record it
    carries (optimistix carries a solver's state through `custom_jvp` and loops,
    whose structures are compared; a jit keyed on it must hit for a solve decided
    alike)."""

    __slots__ = ()

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


class _ScopeRef(_Unkeyed):
    """The trace scope a pinned policy applies its policy in."""

    __slots__ = ("scope",)

    def __init__(self, scope: TraceScope):
        self.scope = scope

    def live(self) -> TraceScope | None:
        """The scope while its trace is alive (being traced, its solves being
        evaluated), else `None`: a state kept past its trace pins nothing."""
        return self.scope if self.scope.value() is not None else None


class _RecordRef(_Unkeyed):
    """The record of the decision a pinned policy applies (`None` where no
    `lxd.jit` or `lxd.explain` trace was running): a later program that reuses the
    trace of its solve (a jit cache hit, which runs no `init`) reads the record
    from its own program (`carried_solves`). Always present, with or without a
    record, so that the policy's structure is the same in every trace of one solve
    (optimistix compares the structures of a primal and its JVP; a missing leaf
    shifted the static leaves after it)."""

    __slots__ = ("record",)

    def __init__(self, record: Any):
        self.record = record


class ChoiceRef(_Unkeyed):
    """The `lxd.AutoSolver` choice (a `SolverChoice`) made in a solver's `init`
    while `lxd.jit` or `lxd.explain` traced a program (`None` elsewhere), carried
    in the solver's state: a later program that reuses the trace of its solve
    reads it from its own program (`add_carried_solver_choices`), as a solve's
    record is read (`_RecordRef`). Always present, and equal to every other, for
    the same reasons."""

    __slots__ = ("choice",)

    def __init__(self, choice: Any):
        self.choice = choice


class _Pinned(AbstractPolicy):
    """Applies `policy` as part of the trace `scope`.

    What a solver's `init` gives a decided `Auto` operator: lineax's `linear_solve`
    primitive evaluates and lowers its solver in traces of their own, and pinned to
    the trace the solve was bound in, the operator's `mv` there reuses the marked
    callee traced for the decision instead of tracing the user's function again.
    """

    policy: AbstractPolicy
    scope: _ScopeRef = eqx.field(static=True)
    record: _RecordRef = eqx.field(static=True, default=_RecordRef(None))

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        with pinned_scope(self.scope.live()):
            return self.policy.mv(operator, vector)


def pinned(
    policy: AbstractPolicy, scope: TraceScope, record: Any = None
) -> AbstractPolicy:
    """`policy`, applied as part of the trace `scope` (see `_Pinned`).

    **Arguments:**

    - `policy`: a decided policy.
    - `scope`: the trace (from `current_scope()`).
    - `record`: the `SolveRecord` of the decision, read back from the traced
        program by `carried_solves`.

    **Returns:**

    A policy.
    """
    return _Pinned(policy, _ScopeRef(scope), _RecordRef(record))


def carried_record(policy: Any) -> Any:
    """The `SolveRecord` a pinned policy carries, else `None`."""
    if isinstance(policy, _Pinned):
        return policy.record.record
    return None
