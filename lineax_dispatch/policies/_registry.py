"""Context-local records of where operators' `mv`s are traced, and of the decisions
and matrices that `lxd.jit` fixes for one compiled program.

Everything here lives in context variables: each thread (and each asyncio task)
sees its own registry, and there is no module-level mutable state.
"""

import contextlib
import contextvars
import dataclasses
import linecache
import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import jax
import jax.extend.core as jex
import jax.tree_util as jtu
import lineax as lx
from equinox._compile_utils import hashable_partition


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP_DIRS = (
    _PACKAGE_DIR,
    os.path.dirname(os.path.abspath(jax.__file__)),
    os.path.dirname(os.path.abspath(eqx.__file__)),
    os.path.dirname(os.path.abspath(lx.__file__)),
)


def operator_key(operator: lx.AbstractLinearOperator) -> Any:
    """A hashable key of an operator's kind: its static part (functions, closure-
    converted jaxprs, tags, policy) and the shapes and dtypes of its arrays. Equal
    keys share one outlined callee; decisions are made per key."""
    dynamic, static = hashable_partition(operator, eqx.is_array)
    avals = tuple((tuple(x.shape), str(x.dtype)) for x in jtu.tree_leaves(dynamic))
    return (static, avals)


def is_leaf_array(x: Any) -> bool:
    """Arrays, and the shape-only stand-ins that records keep instead of them."""
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def abstract_operator(operator: Any) -> Any:
    """`operator` with every array replaced by its shape and dtype, so that a
    record of it holds no tracer after its trace has ended."""
    return jtu.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if eqx.is_array(x) else x,
        operator,
    )


def user_site() -> tuple[str, int]:
    """The innermost frame outside lineax-dispatch, lineax, equinox and jax."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_SKIP_DIRS) and "<frozen" not in filename:
            return filename, frame.f_lineno
        frame = frame.f_back
    return "<unknown>", 0


@dataclasses.dataclass
class SiteRecord:
    """What was observed of one operator kind during one trace."""

    operator: Any  # an example operator (for the cost analysis and `explain`)
    sites: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    executions: float = 0.0
    solves: int = 0

    @property
    def call_sites(self) -> int:
        return len(self.sites)


@dataclasses.dataclass
class Session:
    """The state of one `lxd.jit` compilation: observations of its first
    (observing) trace, then the decisions fixed for its second trace and the
    matrices built there (per trace, so none is used outside the trace that made
    it)."""

    observing: bool
    token: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    records: dict[Any, SiteRecord] = dataclasses.field(default_factory=dict)
    decisions: dict[Any, Any] = dataclasses.field(default_factory=dict)
    matrices: dict[Any, Any] = dataclasses.field(default_factory=dict)
    top_trace: Any = None
    # `AutoSolver`'s choices: (operator, size, solver, reasons), for `explain`.
    solver_choices: list[tuple[str, str, str, tuple[str, ...]]] = dataclasses.field(
        default_factory=list
    )


# Expected executions of an `mv` traced below the top level of `lxd.jit` (a loop
# body, a nested jit) when no solver says more.
NESTED_EXECUTIONS = 10.0

# A jit-cache-sensitive context (`jax.make_user_context`): each `lxd.jit` pass
# traces under its own value, so that jits nested in the user's function (lineax's
# `linear_solve` is one) are traced afresh in each pass instead of reusing a trace
# made under other decisions.
PASS_CONTEXT = jax.make_user_context(default_value=None)

_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "lineax_dispatch_session", default=None
)
# Observations that outlive one compilation: operator key -> SiteRecord of the
# latest observing trace. A dict created per context on first use.
_HISTORY: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "lineax_dispatch_history", default=None
)
# Expected executions of each `mv` traced here (set by solvers around their loop).
_EXECUTIONS: contextvars.ContextVar[float] = contextvars.ContextVar(
    "lineax_dispatch_executions", default=1.0
)
# Per-context cache of cost analyses: operator key -> cost dict.
_COSTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "lineax_dispatch_costs", default=None
)


def _context_dict(var: contextvars.ContextVar[dict | None]) -> dict:
    value = var.get()
    if value is None:
        value = {}
        var.set(value)
    return value


def history() -> dict:
    return _context_dict(_HISTORY)


def cost_cache() -> dict:
    return _context_dict(_COSTS)


def current_session() -> Session | None:
    return _SESSION.get()


def record_solver_choice(
    operator: str, size: str, solver: str, reasons: tuple[str, ...]
) -> None:
    """Notes a solver choice in the observing trace of `lxd.jit` or `lxd.explain`,
    if one is running."""
    active = _SESSION.get()
    if active is not None and active.observing:
        active.solver_choices.append((operator, size, solver, reasons))


@contextlib.contextmanager
def session(value: Session) -> Iterator[Session]:
    token = _SESSION.set(value)
    try:
        yield value
    finally:
        _SESSION.reset(token)


@contextlib.contextmanager
def expected_executions(count: float) -> Iterator[None]:
    """Within this context each traced `mv` is expected to run `count` times per
    run of the program (times any enclosing expectation)."""
    token = _EXECUTIONS.set(_EXECUTIONS.get() * max(float(count), 1.0))
    try:
        yield
    finally:
        _EXECUTIONS.reset(token)


def current_executions() -> float:
    return _EXECUTIONS.get()


def record_call(
    operator: Any, key: Any, executions: float | None = None, solve: bool = False
) -> None:
    """Notes one traced `mv` of `operator` (at the user's call site) in the
    observing session, if any: `executions` times per run (default: the current
    expectation), `solve` if the site is a solve's."""
    active = _SESSION.get()
    if active is None or not active.observing:
        return
    record = active.records.get(key)
    if record is None:
        record = active.records[key] = SiteRecord(abstract_operator(operator))
    record.sites.append(user_site())
    record.solves += int(solve)
    if executions is None:
        executions = current_executions()
    if executions <= 1 and not at_top_trace():
        # Traced inside a loop body, a `vmap` or a nested `jit` with no solver
        # saying how often: assume it runs several times.
        executions = NESTED_EXECUTIONS
    record.executions += executions


def at_top_trace() -> bool:
    """Whether the current trace is the top level of the `lxd.jit` being traced
    (not inside a loop body, a `vmap`, a nested `jit`...)."""
    active = _SESSION.get()
    if active is None or active.top_trace is None:
        return False
    return jex.get_opaque_trace_state() == active.top_trace


def site_text(site: tuple[str, int]) -> str:
    filename, line = site
    source = linecache.getline(filename, line).strip()
    short = os.path.basename(filename)
    return f"{short}:{line}" + (f" ({source})" if source else "")
