"""What `lxd.jit` keeps per signature of its arguments (`Compiled`), and its
program (`Program`): the trace with its jaxpr rewritten, lowered and called as
`jax.jit` would."""

import contextvars
import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple

import jax.extend.core as jex
import jax.tree_util as jtu

from .._compat import (
    calls_back_to_host,
    executable_call,
    is_tracer,
    root_trace_ref,
    traced_consts,
    with_jaxpr,
)
from ..policies.decision._records import Decision
from ._arguments import LastCall, missed, OutputBox
from ._call_convention import CallConvention
from ._decide import Plan
from ._errors import unpatched_jit
from ._trace import Trace
from .rewrite._rewrite import rewrite_program


class Compiled(NamedTuple):
    """What `lxd.jit` keeps per signature of its arguments: the program (a
    `Program`, lowered and called as a `jax.jit` would be), the output box, the
    decisions (per `Auto` operator kind) and the names of its marked calls.

    The program is lowered, compiled and called under the caller's jit-cache
    context, not the trace's own (`PASS_CONTEXT`): the decisions are fixed in the
    traced program by then, so the `jax.numpy` functions lineax calls when it
    lowers its solver reuse their traces from earlier programs."""

    program: "Program"
    box: OutputBox
    names: frozenset[str]

    @property
    def decisions(self) -> dict[Any, Decision]:
        """The decisions of its program, per `Auto` operator kind."""
        return self.program.decisions


def _entry(closed: jex.ClosedJaxpr, consts: tuple, out_tree: Any) -> Callable:
    """The program `closed` as a function of `lxd.jit`'s traced argument halves,
    returning the output PyTree. `consts` are the values the function closes over
    from an enclosing trace: `jax.jit` puts those first in the program it traces
    there, and they are not arguments of the call."""
    run = jex.jaxpr_as_fun(closed)

    def entry(*dynamic_args, **dynamic_kwargs):
        leaves = jtu.tree_leaves((dynamic_args, dynamic_kwargs))
        return jtu.tree_unflatten(out_tree, run(*consts, *leaves))

    return entry


class Program:
    """The program of one signature, lowered and called as `jax.jit` would: the
    trace with its jaxpr replaced by the rewritten one, compiled (once) without
    tracing anything again. Its rolled calls are `lax.while_loop`s there (JAX
    lowers a `while` directly, a `scan` by tracing its `while` form again). Called
    under a trace (a transformation, an outer jit), it is the program rewritten
    with `lax.scan`s instead (a transformation may differentiate it in reverse
    mode, which needs a scan), as a function that the trace transforms. Each form
    is rewritten when first needed.

    **Arguments:**

    - `traced`: the user's function's `jax.stages.Traced`.
    - `plan`: the decide stage's plan: the actions to rewrite its program with
        (the rewrite is deterministic: the same groups, rewritten the same way,
        for either kind of loop), its decisions, and a contender plan where some
        choices are raced (`Plan.contender`): at the first call outside a trace,
        both programs are compiled side by side (`race`) and the first compiled is
        kept.
    - `jit_kwargs`: the `jax.jit` arguments it is compiled with.

    **Attributes:**

    - `plan`: the plan compiled: the decide stage's, or its contender where that
        won the race.
    - `jaxprs`: the forms of `plan` rewritten so far, by kind of loop (`"while"`,
        `"scan"`).
    - `consts`: the values the function closes over from an enclosing trace.
    - `race_seconds`: where a race was run, the seconds each plan's compile took
        (`None` for the one not waited for).
    - `stage_seconds`: the seconds `lxd.jit`'s own stages took for this program:
        `"trace"` and `"decide"` (given), and `"rewrite"`, the rewrites of the
        program made so far (0 before the first).
    """

    def __init__(
        self,
        traced: Any,
        plan: Plan,
        jit_kwargs: dict[str, Any],
        stage_seconds: dict[str, float] | None = None,
    ):
        self._traced = traced
        self.plan = plan
        self._jit_kwargs = jit_kwargs
        self.consts = traced_consts(traced)
        self.jaxprs: dict[str, jex.ClosedJaxpr] = {}
        self._compiled = None
        self._callbacks = True
        self._under_trace = None
        self.race_seconds: tuple[float | None, float | None] | None = None
        self.stage_seconds = {"trace": 0.0, "decide": 0.0, **(stage_seconds or {})}
        self.stage_seconds["rewrite"] = 0.0

    def jaxpr(self, loop: str) -> jex.ClosedJaxpr:
        """The program with its rolled calls as `loop`s (`"while"` or `"scan"`):
        the traced program itself where nothing is rewritten."""
        closed = self.jaxprs.get(loop)
        if closed is None:
            closed = self._rewrite(self.plan, loop)
            self.jaxprs[loop] = closed
        return closed

    def _rewrite(self, plan: Plan, loop: str) -> jex.ClosedJaxpr:
        """The program rewritten with `plan`'s actions, its seconds added to
        `stage_seconds["rewrite"]`."""
        start = time.perf_counter()
        closed = rewrite_program(self._traced.jaxpr, plan.actions, loop)
        self.stage_seconds["rewrite"] += time.perf_counter() - start
        return closed

    @property
    def decisions(self) -> dict[Any, Decision]:
        """The decisions of the plan compiled, per `Auto` operator kind."""
        return self.plan.decisions

    @property
    def rewritten(self) -> bool:
        """Whether the program as compiled differs from the trace."""
        return self.jaxpr("while") is not self._traced.jaxpr

    def _jitted(self, closed: jex.ClosedJaxpr) -> Any:
        entry = _entry(closed, self.consts, self._traced.out_tree)
        return unpatched_jit()(entry, **self._jit_kwargs)

    def lower(self, *args, **kwargs):
        return self._lower(self.jaxpr("while"), args, kwargs)

    def _lower(self, closed: jex.ClosedJaxpr, args: tuple, kwargs: dict):
        if closed is self._traced.jaxpr:
            return self._traced.lower()
        spliced = with_jaxpr(self._traced, closed)
        if spliced is None:  # pragma: no cover - JAX changed: trace it again
            return self._jitted(closed).lower(*args, **kwargs)
        return spliced.lower()

    def __call__(self, *args, **kwargs):
        if root_trace_ref() is not None:
            if self._under_trace is None:
                self._under_trace = self._jitted(self.jaxpr("scan"))
            return self._under_trace(*args, **kwargs)
        if self._compiled is None:
            if self.plan.contender is None:
                self._compiled = self.lower(*args, **kwargs).compile()
            else:
                self._compiled = self._race(args, kwargs)
            self._callbacks = calls_back_to_host(self._compiled)
        return self._compiled(*args, **kwargs)

    def _race(self, args: tuple, kwargs: dict) -> Any:
        """Compiles the plan and its contender side by side (`race`) and keeps the
        first compiled: its plan and its `"while"` form."""
        contender = self.plan.contender
        assert contender is not None
        plans = (self.plan, contender)
        forms: dict[int, jex.ClosedJaxpr] = {}

        def lowering(index: int) -> Callable[[], Any]:
            def lower():
                closed = self._rewrite(plans[index], "while")
                forms[index] = closed
                return self._lower(closed, args, kwargs)

            return lower

        lowerings = [lowering(i) for i in (0, 1)]
        penalties = [p.run_seconds for p in plans]
        winner, compiled, self.race_seconds = race(lowerings, penalties)
        self.plan = _raced(plans, winner, self.race_seconds)
        self.jaxprs = {"while": forms[winner]}
        return compiled

    @property
    def executable(self) -> Any:
        """The compiled program (a `jax.stages.Compiled`), or `None` before its
        first call."""
        return self._compiled

    @property
    def plain(self) -> bool:
        """Whether a call can go straight to the compiled program, as `jax.jit`'s
        does: compiled, and with no host callback in it (an `equinox.error_if`, an
        outlined call on jax < 0.11), so no run-time error for `lxd.jit` to wait
        for and raise as `equinox.filter_jit` does."""
        return self._compiled is not None and not self._callbacks


# The name prefix of a race's compile threads (a benchmark waits for them).
RACE_THREADS = "lxd-race"


def race(
    lowerings: Sequence[Callable[[], Any]], penalties: Sequence[float]
) -> tuple[int, Any, tuple]:
    """Compiles programs side by side, each in a thread of its own (XLA compiles
    without Python's lock), and returns the one of least seconds to compile (from
    the race's start) plus its penalty (the estimated seconds of its runs): the
    first compiled, unless another with a smaller penalty finishes within the
    difference. Each is lowered here, in turn, and its compile started at once.
    The others' compiles run on to their end in the background (a compile cannot
    be stopped) and are dropped.

    **Arguments:**

    - `lowerings`: functions returning each program's `jax.stages.Lowered`.
    - `penalties`: seconds added to each program's compile.

    **Returns:**

    `(index, compiled, seconds)`: the index of the program kept, its
    `jax.stages.Compiled`, and each compile's seconds from the race's start
    (`None` for those not finished by then). A program that fails to lower or
    compile drops out; where all do, the first's error is raised.
    """
    start = time.perf_counter()
    pool = ThreadPoolExecutor(
        max_workers=len(lowerings), thread_name_prefix=RACE_THREADS
    )
    pending: dict[Future, int] = {}
    errors: dict[int, BaseException] = {}
    try:
        for index, lower in enumerate(lowerings):
            try:
                lowered = lower()
            except Exception as error:  # noqa: BLE001 - the others may compile
                errors[index] = error
                continue
            context = contextvars.copy_context()
            pending[pool.submit(context.run, _compile, lowered)] = index
    finally:
        pool.shutdown(wait=False)
    seconds: list[float | None] = [None] * len(lowerings)
    best: tuple[float, int, Any] | None = None
    while pending:
        timeout = None
        if best is not None:
            least = min(penalties[i] for i in pending.values())
            timeout = best[0] - least - (time.perf_counter() - start)
            if timeout <= 0:
                break
        done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        for future in done:
            index = pending.pop(future)
            if future.exception() is not None:
                errors[index] = future.exception()  # pyright: ignore
                continue
            took = time.perf_counter() - start
            seconds[index] = took
            score = took + penalties[index]
            if best is None or score < best[0]:
                best = (score, index, future.result())
    if best is None:
        raise errors[min(errors)]
    return best[1], best[2], tuple(seconds)


def _compile(lowered: Any) -> Any:
    return lowered.compile()


def _raced(plans: tuple[Plan, Plan], winner: int, seconds: tuple) -> Plan:
    """The winning plan of a race, each of its raced decisions saying so."""
    plan = plans[winner]
    names = [{k: d.strategy for k, d in p.decisions.items()} for p in plans]
    took = [f"{s:.3g} s" if s is not None else "not waited for" for s in seconds]
    decisions = {}
    for key, decision in plan.decisions.items():
        other = names[1 - winner].get(key, decision.strategy)
        if other != decision.strategy:
            decision = decision.with_reason(
                f"Raced at the first call: {decision.strategy} kept, compiled in "
                f"{took[winner]} ({other}: {took[1 - winner]}; with the estimated "
                f"runs {plans[winner].run_seconds:.3g} s against "
                f"{plans[1 - winner].run_seconds:.3g} s)."
            )
        decisions[key] = decision
    return dataclasses.replace(plan, decisions=decisions, contender=None)


class Lowered:
    """What `lxd.jit(f).lower(...)` returns: `jax.jit`'s `jax.stages.Lowered` of
    the (rewritten) program, whose `compile()` gives an `Executable`. Its other
    attributes (`as_text`, `cost_analysis`...) are the `jax.stages.Lowered`'s.

    **Arguments:**

    - `lowered`: the program's `jax.stages.Lowered`.
    - `convention`: how the compiled program is called (a `CallConvention`).
    - `box`: the box of the program's output.
    """

    def __init__(self, lowered: Any, convention: CallConvention, box: OutputBox):
        self._lowered = lowered
        self._convention = convention
        self._box = box

    def compile(self, *args, **kwargs) -> "Executable":
        """As `jax.stages.Lowered.compile`; returns an `Executable`."""
        compiled = self._lowered.compile(*args, **kwargs)
        return Executable(compiled, self._convention, self._box)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lowered, name)


class Executable:
    """What `lxd.jit(f).lower(...).compile()` returns: called as `jax.jit`'s
    `jax.stages.Compiled` is (without the arguments `static_argnums` and
    `static_argnames` make static; see `CallConvention`), returning what a call of
    `lxd.jit(f)` returns. Its other attributes (`as_text`, `input_shardings`...)
    are the `jax.stages.Compiled`'s.

    **Arguments:**

    - `compiled`: the program's `jax.stages.Compiled`.
    - `convention`: how it is called.
    - `box`: the box of its output.
    """

    def __init__(self, compiled: Any, convention: CallConvention, box: OutputBox):
        self._compiled = compiled
        self._convention = convention
        self._box = box
        # The last call's arguments, for calls that match them (`LastCall`).
        self._last: LastCall | None = None

    def __call__(self, *args, **kwargs):
        last = self._last
        if last is not None and not kwargs:
            out = last(args)
            if not missed(out):
                return out
        split = self._convention.split(args, kwargs)
        out = self._compiled(*split.dynamic_args, **split.dynamic_kwargs)
        if not kwargs and self._convention.positional:
            call = executable_call(self._compiled)
            self._last = LastCall.of(args, call, self._box)
        return self._box.combine(out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


def compile_program(
    trace: Trace,
    plan: Plan,
    jit_kwargs: dict[str, Any],
    stage_seconds: dict[str, float] | None = None,
) -> tuple[Compiled, bool]:
    """The traced program rewritten with `plan`'s actions, as it is lowered and
    called: the traced (or rewritten) program is compiled as it is, and the user's
    function is not traced again.

    **Arguments:**

    - `trace`: the program's trace.
    - `plan`: the decide stage's plan for it.
    - `jit_kwargs`: the `jax.jit` arguments it is compiled with.
    - `stage_seconds`: the seconds its trace and decide stages took (`"trace"`,
        `"decide"`), kept with the program (`Program.stage_seconds`).

    **Returns:**

    `(compiled, reusable)`: `reusable` is false where the program closes over
    another trace's values (its tracers) and so serves that trace only: it is
    traced again for the next, as `jax.jit` does.
    """
    traced = trace.traced
    program = Program(traced, plan, jit_kwargs, stage_seconds)
    names = frozenset(trace.session.by_name())
    compiled = Compiled(program, trace.box, names)
    return compiled, not any(is_tracer(c) for c in program.consts)
