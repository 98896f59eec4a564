"""`lxd.explain`: what Auto decides, and why, as a table."""

import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import lineax as lx

from .._jaxpr import out_leaves
from ..policies._auto import Auto
from ..policies._materialise import Materialise
from ..policies._memory import format_bytes
from ..policies._outline import Outline
from ..policies._roll import Roll
from ..policies.calls._recorder import SolverChoice
from ..policies.calls._sites import site_text
from ..policies.decision._cost import jaxpr_cost
from ..policies.decision._observation import observe
from ..policies.decision._records import Decision
from ._decide import mv_callee, Plan, plan_program
from ._jit import CompileAware
from ._trace import trace_program
from .analyse._groups import find_groups
from .analyse._solves import solve_sites
from .analyse._stack_plan import StackPlan
from .rewrite._rewrite import rewrite_program


class ExplainRow(eqx.Module):
    """One operator's line in an [`lineax_dispatch.ExplainReport`][]."""

    operator: str
    size: str
    dtype: str
    call_sites: int
    sites: tuple[str, ...]
    executions: float
    mv_flops: float
    memory_needed: int
    memory_budget: int
    decision: Decision


class ExplainReport(eqx.Module):
    """The decisions for every `Auto` operator of a program, as returned by
    [`lineax_dispatch.explain`][]. `str(report)` is a table; `report.rows` holds the
    details (each row's `decision.reasons` gives every estimate).

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Auto())
        report = lxd.explain(op)
        print(report)  # the table
        row = report.rows[0]
        print(row.operator, row.call_sites, row.decision.strategy)
        ```
    """

    rows: tuple[ExplainRow, ...]
    solves: tuple[SolverChoice, ...] = ()
    cost_models: tuple[str, ...] = ()
    rewrites: tuple[str, ...] = ()
    stage_seconds: tuple[tuple[str, float], ...] = ()

    def __str__(self) -> str:
        headers = (
            "operator",
            "size",
            "dtype",
            "call sites",
            "mv flops",
            "memory needed / budget",
            "decision",
            "reason",
        )
        table: list[tuple[str, ...]] = [headers]
        for row in self.rows:
            table.append(
                (
                    row.operator,
                    row.size,
                    row.dtype,
                    str(row.call_sites),
                    f"{row.mv_flops:.3g}",
                    f"{format_bytes(row.memory_needed)} / "
                    f"{format_bytes(row.memory_budget)}",
                    row.decision.strategy,
                    row.decision.reasons[-1],
                )
            )
        widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
            for line in table
        ]
        lines.insert(1, "  ".join("-" * width for width in widths))
        for row in self.rows:
            if row.sites:
                counts: dict[str, int] = {}
                for site in row.sites:
                    counts[site] = counts.get(site, 0) + 1
                where = "; ".join(
                    site if n == 1 else f"{site} x{n}" for site, n in counts.items()
                )
                lines.append(f"{row.operator} traced at: {where}")
        if not self.rows:
            lines.append("(no operator with an Auto policy had its mv applied)")
        return "\n".join(lines + self._notes())

    def _notes(self) -> list[str]:
        """The lines below the table: the solver choices, the rewrites, the
        stages' seconds and the cost models."""
        lines = []
        if self.solves:
            lines.append("solver choices (lxd.AutoSolver; lxd.CG's layout):")
        for choice in self.solves:
            lines.append(
                f"  {choice.operator} {choice.size} -> {choice.solver}: "
                + " ".join(choice.reasons)
            )
        if self.rewrites:
            lines.append("rewrites (lxd.jit):")
            lines.extend(f"  {rewrite}" for rewrite in self.rewrites)
        if self.stage_seconds:
            stages = ", ".join(f"{name} {s:.3g} s" for name, s in self.stage_seconds)
            lines.append(f"lxd.jit's own stages for this program: {stages}")
        sources = dict.fromkeys(self.cost_models)
        sources.update(dict.fromkeys(c.cost_model for c in self.solves if c.cost_model))
        for source in sources:
            lines.append(f"cost model: {source}")
        return lines

    def __repr__(self) -> str:
        return str(self)


ExplainReport.__init__.__doc__ = """**Arguments:**

- `rows`: one row per operator kind, each with the attributes `operator` (the class
    name), `size` (`"out x in"`), `dtype`, `call_sites`, `sites` (where each call
    site was traced, as `file:line (source)`), `executions` (expected runs of `mv`
    per run of the program), `mv_flops`, `memory_needed` and `memory_budget` (bytes)
    and `decision` (a [`lineax_dispatch.Decision`][]).
- `solves`: the choices of every `lxd.AutoSolver` in the program, and the
    layout of every `lxd.CG` with `layout="auto"`, each a
    `lineax_dispatch.policies.SolverChoice` (`operator`, `size`, `solver`, `reasons`,
    `cost_model`).
- `cost_models`: where the constants of the rows' decisions came from, one entry
    per distinct cost model (its `source`: this machine's calibration, the fitted
    defaults, or a user's).
- `rewrites`: one line per group of calls the rewrite of `lxd.jit` changes (an
    operator's `mv`s rolled, materialised or outlined; a repeated function of the
    user's rolled): its name, its number of call sites and what is done.
- `stage_seconds`: `(stage, seconds)` of `lxd.jit`'s own work for the program,
    what deciding costs before XLA compiles: `"trace"` (the function traced, the
    decisions made inside the trace included), `"decide"` (the program's
    analysis and the decisions for its groups of calls) and `"rewrite"` (the
    program rewritten with them).
"""


def _row(
    operator,
    decision: Decision,
    call_sites,
    executions,
    sites,
    cost=None,
    out_structure=None,
) -> ExplainRow:
    policy = operator.policy
    # A solve's operator is kept with shapes for arrays: its cost is the one its
    # decision read, cached under its `mv`'s kind.
    observation = observe(
        operator,
        memory_budget=policy.budget(),
        call_sites=call_sites,
        executions=executions,
        cost=cost,
        out_structure=out_structure,
    )
    return ExplainRow(
        operator=type(operator).__name__,
        size=f"{observation.out_size}x{observation.in_size}",
        dtype=observation.dtype,
        call_sites=call_sites,
        sites=tuple(sites),
        executions=executions,
        mv_flops=observation.mv_flops,
        memory_needed=decision.memory_needed or observation.matrix_bytes,
        memory_budget=observation.memory_budget,
        decision=decision,
    )


def explain(fun_or_operator: Callable | lx.AbstractLinearOperator, *args, **kwargs):
    """Reports what `Auto` decides for each operator of a program, or for one
    operator.

    **Arguments:**

    - `fun_or_operator`: a function (or an `lxd.jit`-compiled one), then `*args`
        and `**kwargs` to trace it with; or an operator of lineax-dispatch with an
        `Auto` policy, for its decision at one call site.

    **Returns:**

    An [`lineax_dispatch.ExplainReport`][]; `print` it for a table of operator,
    size, dtype, call sites, mv flops, memory needed vs budget, decision and
    reason.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Auto())
        x = jnp.ones(64, jnp.float32)
        print(lxd.explain(lambda x: op.mv(op.mv(x)) + op.mv(x), x))
        print(lxd.explain(op))  # at one call site
        ```
    """
    if isinstance(fun_or_operator, lx.AbstractLinearOperator):
        return _explain_operator(fun_or_operator, args, kwargs)
    if not callable(fun_or_operator):
        raise TypeError(
            "`lxd.explain` takes a function (and its arguments) or an operator; got "
            f"{type(fun_or_operator).__name__}."
        )
    return _explain_program(fun_or_operator, args, kwargs)


def _explain_operator(
    operator: lx.AbstractLinearOperator, args: tuple, kwargs: dict
) -> ExplainReport:
    """`explain(operator)`: its `Auto` policy's decision at one call site."""
    if args or kwargs:
        raise TypeError(
            "`lxd.explain(operator)` takes no further arguments; got "
            f"{len(args)} positional and {sorted(kwargs)} keyword. For a batch, "
            "use `operator.policy.decision(operator, batch=...)`."
        )
    policy: Any = getattr(operator, "policy", None)
    if not isinstance(policy, Auto):
        raise TypeError(
            "`lxd.explain(operator)` needs an operator of lineax-dispatch with an "
            f"`Auto` policy; got {type(operator).__name__} with policy "
            f"{policy!r}."
        )
    decision = policy.decision(operator)
    return ExplainReport(
        (_row(operator, decision, 1, 1.0, ()),),
        cost_models=(policy.model().source,),
    )


def _explain_program(fun: Callable, args: tuple, kwargs: dict) -> ExplainReport:
    """`explain(fun, *args, **kwargs)`: the decisions of `lxd.jit(fun)`'s trace,
    one row per `Auto` operator kind met and per solve of this package's solvers."""
    compiled = fun if isinstance(fun, CompileAware) else CompileAware(fun, {})
    start = time.perf_counter()
    trace = trace_program(
        compiled.fun, compiled.jit_kwargs, compiled.split(args, kwargs)
    )
    traced = time.perf_counter()
    active = trace.session
    plan = plan_program(trace.traced.jaxpr, active)
    decided = time.perf_counter()
    rewrite_program(trace.traced.jaxpr, plan.actions, "while")
    stages = (
        ("trace", traced - start),
        ("decide", decided - traced),
        ("rewrite", time.perf_counter() - decided),
    )
    autos = plan.autos
    program = trace.traced.jaxpr.jaxpr
    rows: list[ExplainRow] = [
        _row(
            a.record.operator,
            a.decision,
            a.group.call_sites,
            a.group.executions,
            [site_text(site) for site in a.sites],
            jaxpr_cost(a.group.callee),
            out_leaves(mv_callee(a.record, a.group)),
        )
        for a in autos
    ]
    for solve in active.solves:
        # k solves of one operator kind share one decision (and one record).
        sites = solve_sites(program, solve) or [solve.site]
        rows.append(
            _row(
                solve.operator,
                solve.decision,
                len(sites),
                solve.executions * len(sites),
                [site_text(site) for site in sites],
            )
        )
    policies = [a.record.operator.policy for a in autos]
    policies += [solve.operator.policy for solve in active.solves]
    sources = tuple(
        dict.fromkeys(p.model().source for p in policies if isinstance(p, Auto))
    )
    return ExplainReport(
        tuple(rows),
        tuple(active.solver_choices),
        sources,
        _rewrites(plan, program),
        stages,
    )


def _rewrites(plan: Plan, program: Any) -> tuple[str, ...]:
    """One line per group of calls of `program` (a traced program's top-level
    `Jaxpr`) that `plan` rewrites: the operator's kind for an `Auto` operator's
    `mv`s, else the call's name, its call sites, and the policy applied."""
    kinds = {
        (a.group.name, id(a.group.callee)): type(a.record.operator).__name__
        for a in plan.autos
    }
    groups = find_groups(program)
    lines = []
    for key, action in plan.actions.items():
        done = _DONE.get(type(action.policy))
        if done is None:  # `Lazy`: the calls stay as they are
            continue
        group = groups.get(key)
        sites = "" if group is None else f" at {group.call_sites} call sites"
        kind = kinds.get(key)
        what = f"`mv` of {kind}" if kind is not None else f"`{key[0]}`"
        if group is not None and isinstance(action.policy, Roll):
            made = action.plan_in(program, group.sites)
            done = _STACKED if isinstance(made, StackPlan) else done
        lines.append(f"{what}{sites}: {done}")
    return tuple(lines)


# What the rewrite does with a group's calls, per policy applied.
_DONE = {
    Roll: "rolled into one loop body",
    Materialise: "one matrix built, a matrix product at each site",
    Outline: "one separately compiled `mv` called at each site",
}
_STACKED = "stacked into one batched call"
