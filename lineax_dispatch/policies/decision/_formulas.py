"""The model's formulas: for each strategy, the time to compile the program's
copies of `mv` plus `runs` times the time one run of the program spends in them,
and the memory it needs, from an `Observation` and a `CostModel`. `decide` picks
the cheapest that fits the memory budget. No JAX tracing happens here."""

import math

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
    policy: AbstractPolicy, compile_seconds: float, run_seconds: float, weight: float
) -> Estimate:
    return Estimate(
        policy, compile_seconds, run_seconds, compile_seconds + weight * run_seconds
    )


def estimates(o: Observation, model: CostModel) -> tuple[Estimate, ...]:
    """A `lineax_dispatch.policies.Estimate` of each strategy: compile seconds, seconds
    per run of the program and their total over `o.runs` runs, `None` where not
    allowed."""
    copy = mv_compile(o, model)
    batched_copy = batched_compile(o, model)
    site = model.compile_per_site
    weight = max(o.runs, 1.0)
    # Each solve builds its own matrix (in its `init`); plain call sites share one
    # build under `lxd.jit`.
    builds = o.solves + (1 if o.call_sites > o.solves else 0)
    run_mv = mv_run(o, model)
    k, runs = max(o.call_sites, 1), max(o.executions, 1.0) * max(o.batch, 1)
    out = [_estimate(Lazy(), k * (copy + site), runs * run_mv, weight)]
    if o.rollable and k >= 2:
        if o.stackable:
            # One batched call (its dot products on blocks of vectors): the flops
            # of every execution, the operator's arrays read once per execution
            # of a site.
            reads = runs / k
            roll_run = max(
                runs * o.mv_flops / model.flops_per_second,
                reads * o.mv_bytes / mv_read_rate(o, model),
            )
            roll_copy = batched_copy
        else:
            roll_run = runs * run_mv
            roll_copy = copy
        out.append(
            _estimate(
                Roll(),
                roll_copy + site + model.roll_fixed + k * model.roll_site,
                roll_run + k * model.roll_step,
                weight,
            )
        )
    if o.mv_effects:
        # Its effects run where and as often as the program applies it.
        out.append(Estimate(Outline()))
        out.append(Estimate(Materialise()))
        return tuple(out)
    out.append(outline_estimate(o, model))
    chunk = build_chunk(o, model) if o.mv_batchable else None
    if chunk is None:
        out.append(Estimate(Materialise()))
    else:
        build = o.in_size * o.mv_flops / model.flops_per_second + math.ceil(
            o.in_size / chunk
        ) * (o.mv_bytes / mv_read_rate(o, model))
        apply = runs * o.matrix_bytes / read_rate(o.matrix_bytes, model)
        out.append(
            _estimate(
                Materialise(batch_size=chunk),
                builds * (model.materialise_fixed + batched_copy + site)
                + k * model.matmul_site,
                builds * build + apply,
                weight,
            )
        )
    return tuple(out)


def outline_estimate(o: Observation, model: CostModel) -> Estimate:
    """The `Outline` estimate: natively (`model.outline_native`), one copy of `mv`
    plus `outline_clone` of a copy at each further site, run at native speed;
    else a host callback at every site, each call paying a round trip and the
    hand-over of the operator's arrays. Not allowed (no seconds) where the
    backend cannot run a host callback's call (`model.outline_callbacks`)."""
    if not (model.outline_native or model.outline_callbacks):
        return Estimate(Outline())
    copy = mv_compile(o, model)
    k, runs = max(o.call_sites, 1), max(o.executions, 1.0) * max(o.batch, 1)
    weight = max(o.runs, 1.0)
    run_mv = mv_run(o, model)
    if model.outline_native:
        compile_seconds = copy * (1 + model.outline_clone * (k - 1))
        return _estimate(
            Outline(),
            compile_seconds + k * model.compile_per_site,
            runs * run_mv,
            weight,
        )
    return _estimate(
        Outline(),
        copy + model.compile_per_site + k * model.outline_site,
        runs
        * (
            run_mv
            + model.outline_call
            + o.operator_bytes / model.callback_bytes_per_second
        ),
        weight,
    )
