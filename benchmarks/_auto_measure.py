"""The measurements of `auto`: one (case, variant) with a fresh operator, what
Auto chose, all call-site counts of one (kind, workload, n) with the skipping of
dominated fixed variants, the separate call-site measurement and the warm-up."""

import math
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks._auto_grid import (
    AUTO_FOR,
    AUTOS,
    BASELINE,
    build_operator,
    Case,
    FIXED,
    layers_for,
    LXD_JIT,
    make_cheap,
    make_expensive,
    make_program,
    make_solver,
    MATERIALISE_CAP_BYTES,
    MAX_STEPS,
    OperatorData,
    RHS_SCALE,
    SCORES,
    VARIANTS,
    WORKLOADS,
)
from benchmarks._auto_report import TARGET_SITES
from benchmarks.harness import median_trial, relative_error, SEED, timed


# Skipping dominated fixed variants (see the docstring of `auto`).
SKIP_FACTOR = 2.0
SKIP_MARGIN = 0.8


def _decision_dict(decision) -> dict:
    return dict(
        strategy=decision.strategy,
        policy=repr(decision.policy),
        reasons=list(decision.reasons),
        estimates={e.strategy: e.seconds for e in decision.estimates},
        memory_needed=int(decision.memory_needed),
    )


def auto_choice(jitted, op, static, params, x, case: Case) -> dict:
    """What Auto chose (called after the timing, so nothing it computes is cached
    for the timed run)."""
    if case.workload == "mv":
        decisions = list(jitted.decisions(params, x).values())
        if not decisions:
            return dict(strategy="(none)", source="lxd.jit decisions: none")
        return dict(
            strategy="+".join(d.strategy for d in decisions),
            source="lxd.jit(...).decisions(params, x)",
            decisions=[_decision_dict(d) for d in decisions],
        )
    solver = make_solver(AUTOS[0])
    out = dict(
        source="CG.prepare(op) (filter_eval_shape); reasons from op.policy.decision",
        jit_decisions=len(jitted.decisions(params, x)),
    )
    try:
        prepared = eqx.filter_eval_shape(
            lambda p: solver.prepare(eqx.combine(p, static)), params
        )
        if isinstance(prepared, lx.MatrixLinearOperator):
            out["strategy"] = "Materialise"
        else:
            policy = getattr(prepared, "policy", None)
            # Under a trace the decided policy is applied as part of the solve's
            # trace (lineax_dispatch's private `_Pinned`), which holds it.
            policy = getattr(policy, "policy", policy)
            out["strategy"] = type(policy).__name__
    except Exception as e:  # pragma: no cover - the package is being written
        out["strategy"] = "?"
        out["prepare_error"] = repr(e)
    try:
        from lineax_dispatch.solvers._prepare import expected_iterations

        executions = expected_iterations(MAX_STEPS, case.n)
        decision = op.policy.decision(op, call_sites=1, executions=executions)
        out["executions"] = executions
        out["decisions"] = [_decision_dict(decision)]
        if out["strategy"] == "?":
            out["strategy"] = decision.strategy
    except Exception as e:  # pragma: no cover - private API changed
        out["decision_error"] = repr(e)
    return out


# Run time: the median of up to RUN_SAMPLES further calls, as many as fit in
# RUN_BUDGET_S (one call of a program that takes longer).
RUN_SAMPLES = 5
RUN_BUDGET_S = 1.0


def _run_time(compiled, params, x, first_s: float) -> float:
    """The median of as many calls as fit in RUN_BUDGET_S, 1 to RUN_SAMPLES."""
    count = int(max(1, min(RUN_SAMPLES, RUN_BUDGET_S // max(first_s, 1e-6))))
    return harness.median_call_time(lambda: compiled(params, x), count)


def measure(variant: str, data: OperatorData, case: Case) -> tuple[dict, object]:
    """Times one (case, variant) with a fresh operator."""
    op = build_operator(variant, data, case.workload)
    solver = make_solver(variant) if case.workload == "solve" else None
    f, params, static = make_program(op, case.workload, case.k, solver)
    x = jax.random.normal(jax.random.key(SEED + 7), (case.n,), jnp.float32)
    if case.workload == "solve":
        x = RHS_SCALE * x
    if variant in LXD_JIT:
        # One trace, the analysis and the rewrite, then the lowering of the
        # rewritten program.
        jitted = lxd.jit(f)
        _, trace_s = timed(lambda: jitted.decisions(params, x))
        lowered, lower_s = timed(lambda: jitted.lower(params, x))
    else:
        jitted = jax.jit(f)
        traced, trace_s = timed(lambda: jitted.trace(params, x))
        lowered, lower_s = timed(traced.lower)
    compiled, compile_s = timed(lowered.compile)
    out, first_s = timed(lambda: jax.block_until_ready(compiled(params, x)))
    run_s = _run_time(compiled, params, x, first_s)
    total = trace_s + lower_s + compile_s + first_s
    timings = dict(
        trace_s=trace_s,
        lower_s=lower_s,
        compile_s=compile_s,
        first_call_s=first_s,
        run_s=run_s,
        total_s=total,
        compile_total_s=total - min(run_s, first_s),
    )
    if case.workload == "solve":
        value, steps, ok = out
        timings["num_steps_max"] = int(steps)
        timings["all_successful"] = bool(ok)
        out = value
    if variant in AUTOS:
        timings["choice"] = auto_choice(jitted, op, static, params, x, case)
    return timings, out


def measure_repeated(
    variant: str, data: OperatorData, case: Case, repeats: int
) -> tuple[dict, object]:
    """`measure` `repeats` times; the repeat with the median total, with every
    repeat's total added."""
    trials = [measure(variant, data, case) for _ in range(repeats)]
    timings, out = median_trial(trials, "total_s")
    timings = dict(timings, total_all_s=[t["total_s"] for t, _ in trials])
    return timings, out


def score(timings: dict, runs: int) -> float:
    """Compile (with the first call's extra) plus `runs` runs."""
    return timings["compile_total_s"] + runs * timings["run_s"]


def _lower_bounds(variant: str, previous: dict, k: int, k_prev: int) -> dict:
    """Lower bounds on each score of `variant` at `k` from its timings at `k_prev`:
    the k sites of `Lazy` and `Outline` each run their own `mv`s; `Materialise`
    and `Roll` share one build or one loop body between them."""
    if variant in ("Materialise", "Roll"):
        return {r: SKIP_MARGIN * score(previous, r) for r in SCORES}
    run = previous["run_s"] * k / k_prev
    return {r: SKIP_MARGIN * r * run for r in SCORES}


def run_cell(
    data: OperatorData, workload: str, sites: Sequence[int], repeats: int
) -> list[dict]:
    """All k of one (kind, workload, n)."""
    rows: list[dict] = []
    previous: dict[str, dict] = {}
    k_prev = None
    for k in sites:
        case = Case(data.kind, workload, data.n, data.layers, k)
        row: dict = dict(
            kind=case.kind,
            workload=workload,
            n=case.n,
            layers=case.layers,
            k=k,
            results={},
            skipped={},
        )
        if k_prev is None:
            order = list(FIXED)
        else:
            order = sorted(
                FIXED,
                key=lambda v: previous[v]["total_s"] if v in previous else math.inf,
            )
        outputs = {}
        for variant in order + [BASELINE, *AUTOS]:
            if variant == "Materialise" and 4 * data.n * data.n > MATERIALISE_CAP_BYTES:
                row["skipped"][variant] = (
                    f"matrix of {4 * data.n * data.n / 2**30:.1f} GiB > 1 GiB"
                )
                continue
            if variant in FIXED and k_prev is not None:
                measured = [row["results"][v] for v in FIXED if v in row["results"]]
                if variant not in previous:
                    row["skipped"][variant] = f"skipped at k={k_prev}"
                    continue
                bounds = _lower_bounds(variant, previous[variant], k, k_prev)
                best = {
                    r: min((score(t, r) for t in measured), default=math.inf)
                    for r in SCORES
                }
                if measured and all(bounds[r] > SKIP_FACTOR * best[r] for r in SCORES):
                    row["skipped"][variant] = (
                        "lower bounds "
                        + ", ".join(
                            f"runs={r}: {bounds[r]:.2f} s > {SKIP_FACTOR:g} x best "
                            f"{best[r]:.2f} s"
                            for r in SCORES
                        )
                        + f" (from k={k_prev})"
                    )
                    continue
            timings, out = measure_repeated(variant, data, case, repeats)
            row["results"][variant] = timings
            outputs[variant] = out
            print(
                f"    {case.label():<30} {variant:<12} "
                f"total {timings['total_s']:8.3f} s"
                f"  (run {timings['run_s']:.3f} s)"
                + (f"  -> {timings['choice']['strategy']}" if variant in AUTOS else ""),
                flush=True,
            )
        reference = outputs.get("Lazy", next(iter(outputs.values())))
        for variant, out in outputs.items():
            row["results"][variant]["rel_err_vs_lazy"] = relative_error(out, reference)
        finish_row(row)
        rows.append(row)
        previous = {v: row["results"][v] for v in FIXED if v in row["results"]}
        k_prev = k
    return rows


def finish_row(row: dict) -> None:
    """Each score's best fixed policy (plain lineax among the candidates) and Auto
    (told that number of runs) against it."""
    results = row["results"]
    row["scores"] = {}
    for runs in SCORES:
        candidates = {
            v: score(results[v], runs) for v in FIXED + (BASELINE,) if v in results
        }
        best = min(candidates, key=candidates.get)
        auto = results[AUTO_FOR[runs]]
        choice = auto["choice"]["strategy"]
        row["scores"][str(runs)] = dict(
            totals={v: score(t, runs) for v, t in results.items()},
            best=best,
            best_s=candidates[best],
            auto=AUTO_FOR[runs],
            auto_choice=choice,
            auto_over_best=score(auto, runs) / candidates[best],
            lineax_over_best=candidates[BASELINE] / candidates[best],
            auto_over_lineax=score(auto, runs) / candidates[BASELINE],
            auto_picked_best=choice == best or (best == BASELINE and choice == "Lazy"),
        )


# --------------------------------------------------------------------------------------
# The separate call-site measurement


def sites_check(config: dict, repeats: int) -> dict:
    """Expensive operator, "mv" workload, k=1 and k=16: compile total under
    `lxd.jit` + Auto and under plain lineax."""
    data = make_expensive(config["n"], config["layers"])
    out: dict = dict(
        n=config["n"], layers=config["layers"], sites=list(config["sites"])
    )
    for variant in (BASELINE, AUTOS[-1]):
        rows = {}
        for k in config["sites"]:
            case = Case("expensive", "mv", config["n"], config["layers"], k)
            timings, _ = measure_repeated(variant, data, case, repeats)
            rows[k] = timings
            print(
                f"    sites check {variant:<8} k={k:<3} compile total "
                f"{timings['compile_total_s']:.3f} s"
                + (f"  -> {timings['choice']['strategy']}" if variant in AUTOS else ""),
                flush=True,
            )
        first, last = config["sites"][0], config["sites"][-1]
        out[variant] = dict(
            results={str(k): v for k, v in rows.items()},
            ratio=rows[last]["compile_total_s"] / rows[first]["compile_total_s"],
        )
    out["target"] = TARGET_SITES
    out["met"] = bool(out[AUTOS[-1]]["ratio"] <= TARGET_SITES)
    return out


def warm_up() -> None:
    """Every variant once, on both workloads of a tiny operator (discarded)."""
    for data in (make_cheap(16), make_expensive(16, 2)):
        for workload in WORKLOADS:
            for variant in VARIANTS:
                measure(variant, data, Case(data.kind, workload, 16, data.layers, 2))


def run_grid(
    kinds: Sequence[str],
    ns: Sequence[int],
    workloads: Sequence[str],
    sites: Sequence[int],
    layers: int,
    repeats: int,
) -> list[dict]:
    """Every (kind, n, workload, k), the rows in that order."""
    rows: list[dict] = []
    for kind in kinds:
        for n in ns:
            if kind == "cheap":
                data = make_cheap(n)
            else:
                data = make_expensive(n, layers_for(n, layers))
            print(f"  {kind} n={n}: {data.note}", flush=True)
            # The first Outline call at a size pays a one-off first touch.
            measure("Outline", data, Case(kind, "mv", n, data.layers, 1))
            for workload in workloads:
                rows += run_cell(data, workload, sites, repeats)
            del data
    return rows
