"""The decision rule: `decide(observation) -> Decision`, one pure function.

It estimates, for each strategy, the time to compile the program's copies of `mv`
plus `runs` times the time one run of the program spends in them (the compiled
program runs many times: `Auto(runs=100)` by default; `_formulas`), and picks the
cheapest that fits the memory budget. The constants are in `CostModel` (this
machine's by default; set your own with `Auto(cost_model=...)`). No JAX tracing
happens here."""

from collections.abc import Iterable

from .._batching import Scan, VmapBatch
from .._lazy import Lazy
from .._materialise import Materialise
from .._memory import format_bytes
from ._formulas import build_chunk, estimates, materialise_memory, workspace
from ._model import CostModel
from ._observation import Observation
from ._records import Decision, Estimate


def cheapest(
    candidates: Iterable[Estimate], model: CostModel | None = None
) -> Estimate | None:
    """The allowed estimate of fewest seconds (`Lazy` on a tie), `None` if none is
    allowed. With `model`, where `Lazy` is allowed, a strategy is a candidate only
    where it is estimated more than its margin (`CostModel.margin`) times cheaper
    than `Lazy`."""
    allowed = [(e.seconds, e) for e in candidates if e.seconds is not None]
    lazy = next((s for s, e in allowed if isinstance(e.policy, Lazy)), None)
    if lazy is not None and model is not None:
        allowed = [
            (s, e)
            for s, e in allowed
            if isinstance(e.policy, Lazy) or s * model.margin(type(e.policy)) < lazy
        ]
    if not allowed:
        return None
    return min(allowed, key=lambda se: (se[0], not isinstance(se[1].policy, Lazy)))[1]


def decide(o: Observation, model: CostModel = CostModel()) -> Decision:
    """Chooses how to apply the operator described by `o`.

    **Arguments:**

    - `o`: an [`lineax_dispatch.Observation`][].
    - `model`: the machine constants.

    **Returns:**

    A [`lineax_dispatch.Decision`][]: the policy, the reasons in words and the
    estimates.

    !!! Example

        ```python
        structure = jax.ShapeDtypeStruct((64,), jnp.float32)
        op = lxd.FunctionLinearOperator(jnp.cumsum, structure)
        observation = lxd.observe(op, memory_budget=2**30, call_sites=16)
        decision = lxd.decide(observation, lxd.CostModel(compile_per_dot=1e-2))
        ```
    """
    if not isinstance(o, Observation):
        raise TypeError(
            "`o` of `decide` must be an `lxd.Observation` (see `lxd.observe`); got "
            f"{type(o).__name__}."
        )
    if not isinstance(model, CostModel):
        raise TypeError(
            f"`model` of `decide` must be an `lxd.CostModel`; got {type(model).__name__}."
        )
    if o.batch > 1:
        return _decide_batch(o, model)
    if o.explicit:
        return Decision(
            Lazy(),
            (f"{o.kind} already holds its entries: apply them as they are.",),
        )
    costs = estimates(o, model)
    needed = materialise_memory(o, 1)
    weight = max(o.runs, 1.0)
    best = cheapest(costs, model)
    assert best is not None  # Lazy is always allowed
    reasons = [
        f"{o.call_sites} call site(s), about {o.executions:g} execution(s) of an mv "
        f"of {o.mv_flops:.3g} flops and {format_bytes(o.mv_bytes)} accessed; "
        f"compile once, run {weight:g} time(s)."
    ]
    reasons += [_estimate_reason(e, o, needed, weight, model) for e in costs]
    others = ", ".join(
        f"{e.strategy} ~{e.seconds:.3g} s{_error(e, model)}"
        if e.seconds is not None
        else f"{e.strategy} over budget"
        for e in costs
        if e is not best
    )
    fastest = cheapest(costs)
    if fastest is not None and fastest is not best:
        reasons.append(
            f"Lazy (lineax's behaviour): {fastest.strategy} is estimated at "
            f"~{fastest.seconds:.3g} s ({others}), not more than "
            f"{model.margin(type(fastest.policy)):g}x (the model's measured error "
            "here) below Lazy's."
        )
    else:
        reasons.append(
            f"{best.strategy} is cheapest: ~{best.seconds:.3g} s"
            f"{_error(best, model)} ({others})."
        )
    return Decision(best.policy, tuple(reasons), costs, needed)


def _estimate_reason(
    e: Estimate, o: Observation, needed: int, weight: float, model: CostModel
) -> str:
    """A sentence on one strategy's estimate: its compile and run, and the
    model's measured error where it has one; or why it is not allowed."""
    if e.seconds is None:
        if isinstance(e.policy, Materialise) and not o.materialise_keeps_answer:
            return f"{e.strategy} not allowed: {_rounding_reason(o)}"
        return f"{e.strategy} not allowed: {_why_not(o, needed)}"
    error = model.margin(type(e.policy))
    within = (
        f", within x{error:g} (the model's measured error here)" if error > 1 else ""
    )
    return (
        f"{e.strategy}: compile ~{e.compile_seconds:.3g} s + {weight:g} x "
        f"run ~{e.run_seconds:.3g} s{within}."
    )


def _error(e: Estimate, model: CostModel) -> str:
    """The model's measured error of `e` (`" (x/÷4.2)"`) where its margin says it
    has one (above 1), else `""`."""
    error = model.margin(type(e.policy))
    return f" (x/÷{error:g})" if error > 1 else ""


def _why_not(o: Observation, needed: int) -> str:
    """Why a strategy was not allowed (`estimates` gives it no seconds)."""
    if o.mv_effects:
        return "mv has effects, which must run where the program applies it."
    if not o.mv_batchable:
        return "vmap cannot batch mv (a jax.pure_callback without a vmap_method)."
    return f"it needs {format_bytes(needed)} with a budget of " + (
        f"{format_bytes(o.memory_budget)}."
    )


def _rounding_reason(o: Observation) -> str:
    """Why a solve is not materialised: its tolerance is within the dense
    product's rounding (`Observation.materialise_keeps_answer`)."""
    return (
        f"a dense product of {o.in_size} terms in {o.dtype} rounds by up to "
        f"{o.dense_rounding:.2g}, not below the solve's tolerance "
        f"{o.solve_tolerance:.2g}: the matrix could keep the solve from an answer "
        "the user's mv reaches."
    )


def _decide_batch(o: Observation, model: CostModel) -> Decision:
    """Many vectors at once: materialise when there are at least as many vectors as
    unknowns and the matrix fits; else all in lockstep if the workspace fits, else
    chunks, else one at a time."""
    per_vector = workspace(o)
    budget = o.memory_budget
    if o.mv_effects or not o.mv_batchable:
        return Decision(
            Scan(),
            (f"one vector at a time: {_why_not(o, 0)}",),
        )
    if not o.explicit and o.batch >= o.in_size:
        chunk = build_chunk(o, model)
        if chunk is not None:
            needed = materialise_memory(o, chunk)
            return Decision(
                Materialise(batch_size=chunk),
                (
                    f"{o.batch} vectors for {o.in_size} unknowns, and the matrix "
                    f"with its build ({format_bytes(needed)}) fits the budget of "
                    f"{format_bytes(budget)}: build it once, then one matrix "
                    "product for the whole stack.",
                ),
                memory_needed=needed,
            )
    if o.batch * per_vector <= budget:
        return Decision(
            VmapBatch(),
            (
                f"{o.batch} vectors x {format_bytes(per_vector)} of workspace fit the "
                f"budget of {format_bytes(budget)}: apply all in lockstep.",
            ),
        )
    chunk = int(budget // max(per_vector, 1))
    if chunk >= 2:
        return Decision(
            VmapBatch(batch_size=chunk),
            (
                f"{o.batch} vectors do not fit the budget of {format_bytes(budget)} "
                f"together; {chunk} at a time do.",
            ),
        )
    return Decision(
        Scan(),
        (
            f"even two vectors' workspace ({format_bytes(2 * per_vector)}) exceed "
            f"the budget of {format_bytes(budget)}: one at a time.",
        ),
    )
