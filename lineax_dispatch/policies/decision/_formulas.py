"""The model's formulas: for each strategy, the time to compile the program's
copies of `mv` plus `runs` times the time one run of the program spends in them,
and the memory it needs, from an `Observation` and a `CostModel`. `decide` picks
the cheapest that fits the memory budget. No JAX tracing happens here."""

import math
from collections.abc import Callable

from .._lazy import Lazy
from .._materialise import Materialise
from .._memory import vector_bytes
from .._outline import Outline
from .._policy_interface import AbstractPolicy
from .._roll import Roll
from ._model import CostModel as CostModel
from ._observation import Observation
from ._records import Estimate


def workspace(o: Observation) -> int:
    """Bytes one vector needs while `mv` runs: its intermediates where the cost
    analysis counted them, else input plus output."""
    return max(o.mv_workspace, vector_bytes(o.in_size + o.out_size, o.itemsize))


def materialise_memory(o: Observation, chunk: int) -> int:
    """Peak bytes on one device of materialising: the matrix, its rows split as
    the output is (`o.out_parts`), plus `chunk` columns' worth of the
    intermediates of `mv` while building it, split as the less split of the input
    and output."""
    matrix = -(-o.out_size // o.out_parts) * o.in_size * o.itemsize
    per_column = -(-workspace(o) // min(o.out_parts, o.in_parts))
    return matrix + int(chunk * per_column)


def build_chunk(o: Observation, model: CostModel) -> int | None:
    """The most columns (up to `model.build_chunk`) a matrix build may compute
    together within the memory budget; `None` if even one does not fit."""
    chunk = min(o.in_size, model.build_chunk)
    while chunk >= 1:
        if materialise_memory(o, chunk) <= o.memory_budget:
            return chunk
        chunk //= 2
    return None


def mv_compile(o: Observation, model: CostModel) -> float:
    """Seconds to compile one copy of `mv`."""
    return model.compile_per_dot * o.mv_dots + model.compile_per_op * o.mv_ops


def batched_compile(o: Observation, model: CostModel) -> float:
    """Seconds to compile one copy of `mv` applied to a block of vectors."""
    return model.compile_per_batched_dot * o.mv_dots + model.compile_per_op * o.mv_ops


def read_rate(working_set: float, model: CostModel) -> float:
    """Bytes per second of reading a working set of `working_set` bytes once per
    step of a loop: the cache's rate if it fits the last-level cache."""
    if working_set <= model.cache_bytes:
        return model.cache_bytes_per_second
    return model.bytes_per_second


def mv_read_rate(o: Observation, model: CostModel) -> float:
    """Bytes per second at which an `mv` reads what it touches: the cache's rate
    when the operator's arrays and one `mv`'s intermediates fit in it."""
    return read_rate(o.operator_bytes + workspace(o), model)


def mv_run(o: Observation, model: CostModel) -> float:
    """Seconds to run one `mv`: bound by flops or by memory traffic."""
    return max(o.mv_flops / model.flops_per_second, o.mv_bytes / mv_read_rate(o, model))


def _estimate(
    policy: AbstractPolicy, compile_seconds: float, run_seconds: float, o: Observation
) -> Estimate:
    """`policy`'s estimate: its compile plus `o.runs` times its run, in seconds."""
    seconds = compile_seconds + max(o.runs, 1.0) * run_seconds
    return Estimate(policy, compile_seconds, run_seconds, seconds)


def _sites_and_runs(o: Observation) -> tuple[int, float]:
    """The program's call sites and its executions of `mv` per run."""
    return max(o.call_sites, 1), max(o.executions, 1.0) * max(o.batch, 1)


def lazy_estimate(o: Observation, model: CostModel) -> Estimate:
    """The `Lazy` estimate: a copy of `mv` at every call site, run at native speed."""
    k, runs = _sites_and_runs(o)
    copy = mv_compile(o, model) + model.compile_per_site
    return _estimate(Lazy(), k * copy, runs * mv_run(o, model), o)


def roll_estimate(o: Observation, model: CostModel) -> Estimate | None:
    """The `Roll` estimate: one copy of `mv` in a loop over the call sites; where
    they are independent, one batched call (its dot products on blocks of
    vectors: the flops of every execution, the operator's arrays read once per
    execution of a site). `None` where the sites do not roll (`o.rollable`)."""
    k, runs = _sites_and_runs(o)
    if not o.rollable or k < 2:
        return None
    if o.stackable:
        reads = runs / k
        roll_run = max(
            runs * o.mv_flops / model.flops_per_second,
            reads * o.mv_bytes / mv_read_rate(o, model),
        )
        roll_copy = batched_compile(o, model)
    else:
        roll_run, roll_copy = runs * mv_run(o, model), mv_compile(o, model)
    site = model.compile_per_site
    compile_seconds = roll_copy + site + model.roll_fixed + k * model.roll_site
    return _estimate(Roll(), compile_seconds, roll_run + k * model.roll_step, o)


def materialise_estimate(o: Observation, model: CostModel) -> Estimate:
    """The `Materialise` estimate: the matrix built in chunks of columns
    (`build_chunk`) once per solve, and once for a program's plain call sites
    (under `lxd.jit` they share one build), a matrix product at each site. Not
    allowed (no seconds) where `mv` has effects, vmap cannot batch it, the build
    does not fit the memory budget, or a solve's tolerance is within the dense
    product's rounding (`Observation.materialise_keeps_answer`)."""
    usable = o.mv_batchable and not o.mv_effects and o.materialise_keeps_answer
    chunk = build_chunk(o, model) if usable else None
    if chunk is None:
        return Estimate(Materialise())
    k, runs = _sites_and_runs(o)
    builds = o.solves + (1 if o.call_sites > o.solves else 0)
    build = o.in_size * o.mv_flops / model.flops_per_second + math.ceil(
        o.in_size / chunk
    ) * (o.mv_bytes / mv_read_rate(o, model))
    apply = runs * o.matrix_bytes / read_rate(o.matrix_bytes, model)
    copy = model.materialise_fixed + batched_compile(o, model) + model.compile_per_site
    compile_seconds = builds * copy + k * model.matmul_site
    return _estimate(
        Materialise(batch_size=chunk), compile_seconds, builds * build + apply, o
    )


def outline_estimate(o: Observation, model: CostModel) -> Estimate:
    """The `Outline` estimate: natively (`model.outline_native`), one copy of `mv`
    plus `outline_clone` of a copy at each further site, run at native speed;
    else a host callback at every site, each call paying a round trip and the
    hand-over of the operator's arrays. Not allowed (no seconds) where `mv` has
    effects (they run where and as often as the program applies it) or where the
    backend cannot run a host callback's call (`model.outline_callbacks`)."""
    if o.mv_effects or not (model.outline_native or model.outline_callbacks):
        return Estimate(Outline())
    copy, run_mv = mv_compile(o, model), mv_run(o, model)
    k, runs = _sites_and_runs(o)
    if model.outline_native:
        compile_seconds = copy * (1 + model.outline_clone * (k - 1))
        compile_seconds += k * model.compile_per_site
        return _estimate(Outline(), compile_seconds, runs * run_mv, o)
    call = run_mv + model.outline_call
    call += o.operator_bytes / model.callback_bytes_per_second
    compile_seconds = copy + model.compile_per_site + k * model.outline_site
    return _estimate(Outline(), compile_seconds, runs * call, o)


# Each policy's estimate by policy class, in the order a decision lists them; the
# same functions its rule in `program/rewrite/_rules.py` reaches (`Rule.estimate`).
ESTIMATES: dict[type, Callable[[Observation, CostModel], Estimate | None]] = {
    Lazy: lazy_estimate,
    Roll: roll_estimate,
    Outline: outline_estimate,
    Materialise: materialise_estimate,
}


def estimates(o: Observation, model: CostModel) -> tuple[Estimate, ...]:
    """A `lineax_dispatch.policies.Estimate` of each strategy that applies
    (`ESTIMATES`): compile seconds, seconds per run of the program and their
    total over `o.runs` runs, `None` where not allowed."""
    found = (estimate(o, model) for estimate in ESTIMATES.values())
    return tuple(e for e in found if e is not None)
