"""The `Auto` policy: decides from the operator and the program it is used in."""

import dataclasses
import os
from typing import Any

import jax
import lineax as lx
from jaxtyping import PyTree

from .._jaxpr import out_leaves
from .._validate import check_positive_real
from ._eager import compiled_mv
from ._memory import optional_budget, resolve_budget
from ._outline import Outline, outline_runs_here
from ._policy_interface import AbstractPolicy
from .calls._marked import inline_mv, marked_mv, mv_parts, outline_mv
from .calls._recorder import current_recorder
from .calls._scope import current_scope
from .decision._calibration import machine_cost_model
from .decision._cost import jaxpr_cost, MvCost
from .decision._model import CostModel
from .decision._observation import observe
from .decision._records import Decision
from .decision._rule import decide
from .decision._unseen import decide_unseen


# CPU cores a process needs for `Auto(race=None)` to race two compiles: one for
# each compile and one for the program and everything else it runs meanwhile.
RACE_CORES = 4

# Backends where `Auto(race=None)` does not race: on a TPU, with `Roll`'s margin
# fitted there (`_calibration.TPU_MARGINS`), the race changed no choice of 20 on
# the held-out half of `benchmarks.families` at compile + 1 run and cost a median
# 8.5% of the first call where it raced (Auto against Auto(race=False) in the
# same processes: benchmarks/results/tpu/families-held-out/families.json).
UNRACED_BACKENDS = ("tpu",)


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Auto(AbstractPolicy):
    """Chooses, per operator, the cheapest way to apply it: `Lazy`, `Roll`,
    `Materialise` or `Outline` for single `mv`s (and `VmapBatch` or `Scan` for
    stacks of vectors), from its size, the memory budget, the call sites in the
    program and the cost of one `mv`, minimising compile time plus `runs` times
    the run time.

    - Under [`lineax_dispatch.jit`][] the program is traced once; its call sites of
        each operator kind are read from the traced program (with the executions of
        enclosing loops), decided there, and the program is rewritten: sites
        rolled into one loop body, or one matrix built for the whole program, or
        left inline.
    - The solvers of this package (and [`lineax_dispatch.PolicySolver`][]) decide
        once per solve, in `init`, counting the solver's expected iterations as
        executions.
    - Under a plain `jax.jit`, where the program's call sites are never counted,
        each site is decided alone ([`lineax_dispatch.policies.decide_unseen`][]):
        out of line (`jax.Inline.XLA_LATE`, jax >= 0.11) where the cost model says
        that a further site would then compile in less time, else inline, as
        lineax does. On XLA:CPU, which compiles a called function again for each
        caller (`CostModel.outline_clone = 1`), that is always inline. Eagerly,
        `mv` runs through the operator's compiled `mv`, compiled once per operator
        kind and signature.

    A decision depends only on the program being compiled, the operator, the
    budget and the cost model, never on earlier calls; with one exception where
    `race` is on: under `lxd.jit`, where the estimates of `Roll` and `Lazy` for a
    group of call sites are within the model's measured error of each other, both
    programs are compiled at the first call, side by side, and the first to finish
    runs (a measurement instead of a prediction).

    It is the default policy (`policy=lxd.Auto()` to set its budget, cost model or
    `runs`). See [`lineax_dispatch.explain`][] for the decisions and their
    reasons.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Auto("2GB"))
        f = lxd.jit(lambda x: op.mv(op.mv(x)) + op.mv(x))  # reads 3 call sites
        y = f(jnp.ones(64, jnp.float32))
        print(lxd.explain(f, jnp.ones(64, jnp.float32)))
        ```
    """

    memory_budget: int | None = None
    cost_model: CostModel | None = None
    runs: float = 100.0
    race: bool | None = None

    def __init__(
        self,
        memory_budget: int | float | str | None = None,
        cost_model: CostModel | None = None,
        runs: int | float = 100,
        race: bool | None = None,
    ):
        """**Arguments:**

        - `memory_budget`: bytes (int) or a string like `"2GB"` (see
            [`lineax_dispatch.parse_memory_budget`][]) that a materialised matrix,
            with the peak of building it, may use on one device (a matrix whose
            rows an Explicit mesh axis shards counts its part on each). `None`
            (the default) allows half of the free memory of the default device
            (the host's available memory where the device does not report it),
            read at decision time.
        - `cost_model`: a [`lineax_dispatch.CostModel`][], the machine constants of
            the decision rule. `None` (the default) uses this machine's: the
            defaults scaled by micro-measurements taken at first use and cached
            per machine (`lxd.explain` says which it used).
        - `runs`: how many times a compiled program is expected to run: decisions
            minimise compile time plus `runs` times the run time. `100` by default;
            `1` for a program run once.
        - `race`: whether `lxd.jit` may compile two programs of one signature side
            by side at its first call and run the first compiled: the program as
            decided and the one with an uncertain choice between `Roll` and `Lazy`
            taken the other way (where the model's run estimates of the two are
            within 10%). `None` (the default) races where this process may use at
            least `RACE_CORES` CPU cores (the loser's compile runs on in the
            background until it finishes), except on a TPU, where the margins
            fitted there leave the race nothing to correct.
        """
        self.memory_budget = optional_budget(memory_budget)
        if cost_model is not None and not isinstance(cost_model, CostModel):
            raise TypeError(
                "`cost_model` must be an `lxd.CostModel` or None; got "
                f"{type(cost_model).__name__}."
            )
        self.cost_model = cost_model
        self.runs = check_positive_real(runs, "Auto(runs=...)")
        if race is not None and not isinstance(race, bool):
            raise TypeError(
                f"`race` of `lxd.Auto` must be True, False or None; got {race!r}."
            )
        self.race = race

    def races(self) -> bool:
        """Whether `lxd.jit` may race two compiles of a program for this policy's
        uncertain choices (`race`, or where `None`, whether this process may use
        at least `RACE_CORES` CPU cores and its backend is not one of
        `UNRACED_BACKENDS`).

        **Returns:**

        A bool.
        """
        if self.race is not None:
            return self.race
        backend = jax.default_backend()
        return usable_cores() >= RACE_CORES and backend not in UNRACED_BACKENDS

    def budget(self) -> int:
        """The memory budget in bytes: `memory_budget` if one was given, else half of
        the free memory of the default device, read now.

        **Returns:**

        An int.
        """
        return resolve_budget(self.memory_budget)

    def model(self) -> CostModel:
        """The cost model of the decisions: `cost_model` if one was given, else
        this machine's (`CostModel()`'s defaults scaled by a calibration measured
        at first use and cached per machine; see
        `lineax_dispatch.policies.machine_cost_model`).

        **Returns:**

        A [`lineax_dispatch.CostModel`][], its `outline_callbacks` off where the
        default backend cannot run an outlined call.
        """
        model = machine_cost_model() if self.cost_model is None else self.cost_model
        if model.outline_callbacks and not outline_runs_here():
            model = dataclasses.replace(model, outline_callbacks=False)
        return model

    def decision(
        self,
        operator: lx.AbstractLinearOperator,
        *,
        call_sites: int = 1,
        executions: float | None = None,
        batch: int = 1,
        solves: int = 0,
        rollable: bool = False,
        cost: MvCost | None = None,
        out_structure: Any = None,
        solve_tolerance: float | None = None,
    ) -> Decision:
        """The decision for `operator` with the given use.

        **Arguments:**

        - `operator`: the operator.
        - `call_sites`: copies of `mv` in the program.
        - `executions`: expected executions of `mv` per run of the program; `None`
            uses the current solver's expectation, else 1.
        - `batch`: vectors per application.
        - `solves`: how many of the call sites are solves.
        - `rollable`: whether the call sites can be rolled into one loop body.
        - `cost`, `out_structure`: the cost of one `mv` and the output structure,
            if already known (see [`lineax_dispatch.observe`][]).
        - `solve_tolerance`: where the call sites are a solve, its tolerance (see
            [`lineax_dispatch.Observation`][]).

        **Returns:**

        A [`lineax_dispatch.Decision`][].
        """
        if executions is None:
            executions = 1.0
        observation = observe(
            operator,
            memory_budget=self.budget(),
            call_sites=call_sites,
            executions=executions,
            batch=batch,
            solves=solves,
            runs=self.runs,
            rollable=rollable,
            cost=cost,
            out_structure=out_structure,
            solve_tolerance=solve_tolerance,
        )
        return decide(observation, self.model())

    def eager_mv(self, operator: lx.AbstractLinearOperator):
        # As `mv` outside any trace (below).
        return compiled_mv(operator)

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        if current_scope() is None:
            # Eager: no program to decide for; the compiled `mv`, compiled once
            # per operator kind and signature, with no decision work.
            return marked_mv(operator, vector)
        active = current_recorder()
        if active is not None:
            # Traced by `lxd.jit`: a marked call of this operator kind's own, which
            # `lxd.jit` finds in the traced program, decides for and rewrites.
            return active.recorded_mv(operator, vector)
        # Under a plain `jax.jit`: each site decided alone; lineax's behaviour
        # (inlined by XLA) unless an out-of-line call pays.
        if (
            outline_mv is not None
            and self.model().outline_native
            and self.model().outline_clone < 1.0
        ):
            parts = mv_parts(operator)
            dynamic, key = parts
            traced = inline_mv.trace((key, current_scope()), dynamic, vector)
            decision = self.unseen_decision(operator, traced.jaxpr)
            if isinstance(decision.policy, Outline):
                return marked_mv(operator, vector, outline_mv, parts)
            return marked_mv(operator, vector, inline_mv, parts)
        return marked_mv(operator, vector, inline_mv)

    def unseen_decision(self, operator: lx.AbstractLinearOperator, callee) -> Decision:
        """The decision for one call site of `operator` in a program that is not
        read (under a plain `jax.jit`).

        **Arguments:**

        - `operator`: the operator.
        - `callee`: its traced `mv`, a `ClosedJaxpr` (its cost is read from it).

        **Returns:**

        A [`lineax_dispatch.Decision`][]: `Outline()` or `Lazy()`.
        """
        observation = observe(
            operator,
            memory_budget=self.budget(),
            runs=self.runs,
            cost=jaxpr_cost(callee),
            out_structure=out_leaves(callee),
        )
        return decide_unseen(observation, self.model())
