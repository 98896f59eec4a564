"""The `Auto` policy: observes the operator and its use, then decides."""

from typing import Any

import equinox as eqx
import jax.tree_util as jtu
import lineax as lx
from jaxtyping import PyTree

from ._base import AbstractPolicy
from ._budget import parse_memory_budget, resolve_budget
from ._decide import CostModel, decide, Decision
from ._dense import dense_matrix, dense_mv
from ._lazy import Lazy
from ._marked import current_scope, marked_mv
from ._materialise import Materialise
from ._observation import observe
from ._outline import Outline
from ._registry import (
    at_top_trace,
    current_executions,
    current_session,
    history,
    operator_key,
    record_call,
)


class Auto(AbstractPolicy):
    """Chooses, per operator, the cheapest way to apply it: `Lazy`, `Outline` or
    `Materialise` for single `mv`s (and `VmapBatch` or `Scan` for stacks of
    vectors), from its size, the memory budget, the number of call sites observed
    and the cost of one `mv`.

    - Under [`lineax_dispatch.jit`][] the whole program is traced once to count the
        call sites of each operator, then decided and traced for real; a
        materialised matrix is then built once per compiled program.
    - Outside it, Auto uses the call sites that earlier `lxd.jit` traces observed
        for an operator of the same kind, or one.
    - The solvers of this package (and [`lineax_dispatch.PolicySolver`][]) decide
        once per solve, counting the solver's expected iterations as executions.

    Ask for it with `policy=lxd.Auto()` (the default policy is `Lazy()` until
    program-level dispatch makes Auto cheap enough to be the default). See [`lineax_dispatch.explain`][]
    for the decisions and their reasons.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Auto("2GB"))
        f = lxd.jit(lambda x: op.mv(op.mv(x)) + op.mv(x))  # counts 3 call sites
        y = f(jnp.ones(64, jnp.float32))
        print(lxd.explain(f, jnp.ones(64, jnp.float32)))
        ```
    """

    memory_budget: int | None = None
    cost_model: CostModel = CostModel()

    def __init__(
        self, memory_budget: int | float | str | None = None, cost_model=CostModel()
    ):
        """**Arguments:**

        - `memory_budget`: bytes (int) or a string like `"2GB"` (see
            [`lineax_dispatch.parse_memory_budget`][]) that a materialised matrix,
            with the peak of building it, may use. `None` (the default) allows half
            of the free memory of the default device (the host's available memory
            where the device does not report it), read at decision time.
        - `cost_model`: a [`lineax_dispatch.CostModel`][], the machine constants of
            the decision rule.
        """
        self.memory_budget = (
            None if memory_budget is None else parse_memory_budget(memory_budget)
        )
        if not isinstance(cost_model, CostModel):
            raise TypeError(
                "`cost_model` must be an `lxd.CostModel`; got "
                f"{type(cost_model).__name__}."
            )
        self.cost_model = cost_model

    def budget(self) -> int:
        """The memory budget in bytes: `memory_budget` if one was given, else half of
        the free memory of the default device, read now.

        **Returns:**

        An int.
        """
        return resolve_budget(self.memory_budget)

    def decision(
        self,
        operator: lx.AbstractLinearOperator,
        *,
        call_sites: int | None = None,
        executions: float | None = None,
        batch: int = 1,
        solves: int = 0,
        key: Any = None,
    ) -> Decision:
        """The decision for `operator` with the given (or observed) use.

        **Arguments:**

        - `operator`: the operator.
        - `call_sites`: copies of `mv` in the program; `None` uses what earlier
            `lxd.jit` traces observed for this kind of operator, else 1.
        - `executions`: expected executions of `mv` per run; `None` uses the
            current solver's expectation, else 1.
        - `batch`: vectors per application.
        - `solves`: how many of the call sites are solves.
        - `key`: the operator's kind key (computed when `None`).

        **Returns:**

        A [`lineax_dispatch.Decision`][].
        """
        if key is None:
            key = operator_key(operator)
        if call_sites is None:
            seen = history().get(key)
            call_sites = 1 if seen is None else seen.call_sites
        if executions is None:
            executions = current_executions()
        observation = observe(
            operator,
            memory_budget=self.budget(),
            call_sites=call_sites,
            executions=executions,
            batch=batch,
            solves=solves,
            key=key,
        )
        return decide(observation, self.cost_model)

    def mv(
        self, operator: lx.AbstractLinearOperator, vector: PyTree[Any]
    ) -> PyTree[Any]:
        if current_scope() is None:
            # Eager: no program to decide for; the compiled `mv`, compiled once
            # per operator kind and signature, with no decision work.
            return marked_mv(operator, vector)
        key = operator_key(operator)
        record_call(operator, key)
        active = current_session()
        if active is not None and active.observing:
            # The observing trace of `lxd.jit`: inline, only count.
            return operator.raw_mv(vector)  # pyright: ignore[reportAttributeAccessIssue]
        if active is not None and key in active.decisions:
            decision = active.decisions[key]
        else:
            decision = self.decision(operator, key=key)
        policy = decision.policy
        if isinstance(policy, Materialise):
            if active is not None and at_top_trace():
                return _build_once(active, key, operator, policy, vector)
            if current_executions() > 1 or active is not None:
                # Inside a loop or a nested trace a matrix would be rebuilt at
                # every execution: take the best strategy that does not build one.
                policy = _without_materialise(decision)
        return policy.mv(operator, vector)


def _build_once(active, key, operator, policy: Materialise, vector):
    dynamic = eqx.filter(operator, eqx.is_array)
    leaves = jtu.tree_leaves(dynamic)
    cache_key = (key, tuple(id(x) for x in leaves))
    entry = active.matrices.get(cache_key)
    if entry is None:
        matrix = dense_matrix(operator, policy.batch_size)
        # Keep the leaves alive so that their ids stay theirs.
        active.matrices[cache_key] = entry = (matrix, leaves)
    return dense_mv(entry[0], vector, operator.out_structure())


def _without_materialise(decision: Decision) -> AbstractPolicy:
    totals = {name: t for name, t in decision.estimates if t is not None}
    lazy, outline = totals.get("Lazy"), totals.get("Outline")
    if lazy is not None and outline is not None and outline < lazy:
        return Outline()
    return Lazy()
