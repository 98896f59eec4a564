"""The cases and measurements of `auto` (described in its docstring): constants,
operators, programs, the timing of one (case, variant), the grid with its skipping
of dominated fixed variants, the worst cases, the call-site measurement, warm-up."""

import math
from collections import namedtuple
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.harness import SEED
from lineax_dispatch.solvers._prepare import expected_iterations


KINDS, WORKLOADS = ("cheap", "expensive"), ("mv", "solve")
WEIGHT_CAP_BYTES, MATERIALISE_CAP_BYTES, MATERIALISE_BATCH = 256 * 2**20, 2**30, 128
RTOL = ATOL = 1e-5
MAX_STEPS, SHIFT, RHS_SCALE = 200, 0.02, 1 / 16
# The variants: the fixed policies, plain lineax, Auto(runs=1) and Auto() (runs=100).
FIXED, BASELINE = ("Lazy", "Outline", "Materialise", "Roll"), "lineax"
AUTOS = ("Auto1", "Auto")
VARIANTS = FIXED + (BASELINE,) + AUTOS
POLICIES = dict(
    Lazy=lxd.Lazy, Outline=lxd.Outline, Roll=lxd.Roll, Auto=lxd.Auto,
    Materialise=lambda: lxd.Materialise(batch_size=MATERIALISE_BATCH),
    Auto1=lambda: lxd.Auto(runs=1),
)  # fmt: skip
# Variants compiled with `lxd.jit` (Roll only acts there); the others with jax.jit.
LXD_JIT = ("Roll",) + AUTOS
# The scores (compile total + runs x run) and the Auto variant told that many runs.
SCORES, AUTO_FOR = (1, 100), {1: "Auto1", 100: "Auto"}
# Skipping dominated fixed variants; the run time: the median of 1 to RUN_SAMPLES
# further calls, as many as fit in RUN_BUDGET_S.
SKIP_FACTOR, SKIP_MARGIN, RUN_SAMPLES, RUN_BUDGET_S = 2.0, 0.8, 5, 1.0
WORST_KEPT = 6  # the worst cases (largest Auto / best) kept in the JSON per score


# ------------------------------------------------------------------ cases


# The arrays of one (kind, n) for "mv" and the (SPD) "solve"; "cheap" has 1 layer.
OperatorData = namedtuple("OperatorData", "kind n layers mv_arrays solve_arrays note")


def layers_for(n: int, layers: int) -> int:
    """`layers`, or fewer so that the weights stay within WEIGHT_CAP_BYTES."""
    return max(1, min(layers, WEIGHT_CAP_BYTES // (4 * n * n)))


def make_cheap(n: int, seed: int = SEED) -> OperatorData:
    """`M = I + G G^T / (1.05 SHIFT lambda_max(G G^T))`."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    g = jax.random.normal(k1, (n, n), jnp.float32) / jnp.sqrt(n)
    gram = g @ g.T
    lam = float(harness.top_eigenvalue(jax.jit(lambda x: gram @ x), n, k2))
    matrix = jnp.eye(n, dtype=jnp.float32) + gram / (1.05 * SHIFT * lam)
    arrays = (jax.block_until_ready(matrix),)
    return OperatorData(
        "cheap", n, 1, arrays, arrays, "x -> M @ x, one dense SPD matrix"
    )


def make_expensive(n: int, layers: int, seed: int = SEED) -> OperatorData:
    """Weights `W_i ~ N(0, 1/n)`, scales `s_i ~ U(0.5, 1.5)`; for solves the scales
    are multiplied by a common factor making `lambda_max(C^T C)` about `1 / SHIFT`."""
    keys = jax.random.split(jax.random.key(seed + 1), 2 * layers + 1)
    weights, scales = harness.random_layers(keys, n, layers)
    gram = jax.jit(lambda x: harness.apply_gram(weights, scales, x))
    lam = float(harness.top_eigenvalue(gram, n, keys[-1]))
    factor = (1.05 * SHIFT * lam) ** (-1.0 / (2 * layers))
    spd_scales = tuple(s * factor for s in scales)
    weights, scales, spd_scales = jax.block_until_ready((weights, scales, spd_scales))
    note = f"chain of {layers} dense layers ({layers * n * n * 4 / 2**20:.0f} MiB of "
    note += "weights)"
    return OperatorData(
        "expensive", n, layers, (weights, scales), (weights, spd_scales), note
    )


def build_operator(variant: str, data: OperatorData, workload: str):
    """A fresh operator for `variant`: `eqx.Partial(new function object, *arrays)`,
    the arrays leaves (see the docstring of `auto`)."""
    if data.kind == "cheap":
        fn = lambda matrix, x: matrix @ x
    elif workload == "mv":
        fn = lambda weights, scales, x: harness.apply_chain(weights, scales, x)
    else:
        fn = lambda weights, scales, x: x + harness.apply_gram(weights, scales, x)
    arrays = data.mv_arrays if workload == "mv" else data.solve_arrays
    args = (eqx.Partial(fn, *arrays), jax.ShapeDtypeStruct((data.n,), jnp.float32))
    tags = lx.positive_semidefinite_tag if workload == "solve" else ()
    if variant == BASELINE:
        return lx.FunctionLinearOperator(*args, tags, closure_convert=False)
    policy = POLICIES[variant]()
    return lxd.FunctionLinearOperator(*args, tags, closure_convert=False, policy=policy)


def make_solver(variant: str):
    """`lx.CG` for plain lineax, else `lxd.CG`, with the same arguments."""
    return (lx if variant == BASELINE else lxd).CG(
        rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS
    )


def make_program(op, workload: str, k: int, solver) -> tuple[Callable, object, object]:
    """`(f, params, static)`: `f(params, x)` runs the workload with `k` call sites
    on `eqx.combine(params, static)` (`harness.split_program`)."""

    def mvs(op, x):
        total = op.mv(x * 1)
        for i in range(1, k):
            total = total + op.mv(x * (i + 1))
        return total

    def solves(op, b):
        total, steps, ok = None, [], []
        for i in range(k):
            sol = lx.linear_solve(op, b * (i + 1), solver, throw=False)
            total = sol.value if total is None else total + sol.value
            steps.append(sol.stats["num_steps"])
            ok.append(sol.result == lx.RESULTS.successful)
        return total, jnp.max(jnp.stack(steps)), jnp.all(jnp.stack(ok))

    return harness.split_program(op, mvs if workload == "mv" else solves)


def label(case: dict) -> str:
    """`kind/workload n=.. k=..` of a case (or of a row of the results)."""
    return f"{case['kind']}/{case['workload']} n={case['n']} k={case['k']}"


def config(args) -> dict:
    """The configuration of a run (`args`: `auto`'s command line), for the JSON."""
    return dict(
        kinds=list(args.kinds),
        workloads=list(args.workloads),
        n=list(args.n),
        sites=list(args.sites),
        layers=args.layers,
        layers_per_n={n: layers_for(n, args.layers) for n in args.n},
        weight_cap_bytes=WEIGHT_CAP_BYTES,
        materialise_batch_size=MATERIALISE_BATCH,
        materialise_cap_bytes=MATERIALISE_CAP_BYTES,
        solver=f"lxd.CG(rtol={RTOL}, atol={ATOL}, max_steps={MAX_STEPS}) "
        f"(lineax reference: lx.CG, same arguments)",
        shift=SHIFT,
        rhs_scale=RHS_SCALE,
        repeats=args.repeats,
        dtype="float32",
        closure_convert=False,
        operator_arrays="jit argument (eqx.partition), static part closed over",
        skip_rule=dict(factor=SKIP_FACTOR, margin=SKIP_MARGIN),
        seed=SEED,
        sites_check=args.sites_check,
    )


# ------------------------------------------------------------------ measure


def measure(variant: str, data: OperatorData, case: dict) -> tuple[dict, object]:
    """Times one (case, variant) with a fresh operator."""
    workload = case["workload"]
    op = build_operator(variant, data, workload)
    solver = make_solver(variant) if workload == "solve" else None
    f, params, static = make_program(op, workload, case["k"], solver)
    x = jax.random.normal(jax.random.key(SEED + 7), (case["n"],), jnp.float32)
    args = (params, RHS_SCALE * x if workload == "solve" else x)
    if variant in LXD_JIT:
        # One trace, the analysis and the rewrite; then the rewritten lowering.
        jitted = lxd.jit(f)
        stages = (lambda: jitted.decisions(*args), lambda _: jitted.lower(*args))
    else:
        jitted = jax.jit(f)
        stages = (lambda: jitted.trace(*args), lambda traced: traced.lower())
    timings, compiled, out = harness.compile_stages(*stages, args)
    first_s = timings["first_call_s"]
    count = int(max(1, min(RUN_SAMPLES, RUN_BUDGET_S // max(first_s, 1e-6))))
    run_s = harness.median_call_time(lambda: compiled(*args), count)
    total = sum(timings.values())  # trace + lower + compile + first call
    timings.update(
        run_s=run_s, total_s=total, compile_total_s=total - min(run_s, first_s)
    )
    if workload == "solve":
        out, steps, ok = out
        timings.update(num_steps_max=int(steps), all_successful=bool(ok))
    if variant in AUTOS:
        timings["choice"] = auto_choice(jitted, op, static, *args, case)
    return timings, out


def auto_choice(jitted, op, static, params, x, case: dict) -> dict:
    """What Auto chose (after the timing, so that nothing it computes is cached for
    the timed run): `lxd.jit`'s decisions (for "solve", those of the solves; else
    `CG.prepare`'s)."""
    decisions = list(jitted.decisions(params, x).values())
    record = lambda d: harness.decision_record(
        d, estimates={e.strategy: e.seconds for e in d.estimates}
    )
    solve = case["workload"] == "solve"
    executions = expected_iterations(MAX_STEPS, case["n"])
    if decisions:  # a solve's as made in CG's `init`, told of repeated solves
        out = dict(
            strategy="+".join(d.strategy for d in decisions),
            source="lxd.jit(...).decisions(params, x)",
            decisions=[record(d) for d in decisions],
        )
        extra = dict(jit_decisions=len(decisions), executions=executions)
        return out | (extra if solve else {})
    if not solve:
        return dict(strategy="(none)", source="lxd.jit decisions: none")
    solver = make_solver(AUTOS[0])
    prepared = eqx.filter_eval_shape(
        lambda p: solver.prepare(eqx.combine(p, static)), params
    )
    # Under a trace the decided policy is applied as part of the solve's trace
    # (lineax_dispatch's private `_Pinned`), which holds it.
    policy = getattr(prepared, "policy", None)
    policy = getattr(policy, "policy", policy)
    decision = op.policy.decision(op, call_sites=1, executions=executions)
    return dict(
        source="CG.prepare(op) (filter_eval_shape); reasons from op.policy.decision",
        jit_decisions=len(decisions),
        strategy="Materialise"
        if isinstance(prepared, lx.MatrixLinearOperator)
        else type(policy).__name__,
        executions=executions,
        decisions=[record(decision)],
    )


def measure_repeated(variant, data, case: dict, repeats: int) -> tuple[dict, object]:
    """`measure` `repeats` times: the repeat with the median total, with every
    repeat's total (`total_all_s`)."""
    trials = [measure(variant, data, case) for _ in range(repeats)]
    return harness.median_trial(trials, "total_s", every=("total_s",))


def score(timings: dict, runs: int) -> float:
    """Compile (with the first call's extra) plus `runs` runs."""
    return timings["compile_total_s"] + runs * timings["run_s"]


def skip_reason(variant, n, results, previous, k, k_prev) -> str | None:
    """Why `variant` is not measured at `k` (None: it is), given the `results` at
    `k` so far and the fixed variants' at `k_prev`: lower bounds on its scores from
    `k_prev` (the k sites of `Lazy` and `Outline` each run their own `mv`s,
    `Materialise` and `Roll` share one build or loop body) over twice the best."""
    if variant == "Materialise" and 4 * n * n > MATERIALISE_CAP_BYTES:
        return f"matrix of {4 * n * n / 2**30:.1f} GiB > 1 GiB"
    if variant not in FIXED or k_prev is None:
        return None
    if variant not in previous:
        return f"skipped at k={k_prev}"
    if variant in ("Materialise", "Roll"):
        bounds = {r: SKIP_MARGIN * score(previous[variant], r) for r in SCORES}
    else:
        run = previous[variant]["run_s"] * k / k_prev
        bounds = {r: SKIP_MARGIN * r * run for r in SCORES}
    fixed = [t for v, t in results.items() if v in FIXED]
    best = {r: min((score(t, r) for t in fixed), default=math.inf) for r in SCORES}
    if not all(bounds[r] > SKIP_FACTOR * best[r] for r in SCORES):
        return None
    why = [f"runs={r}: {bounds[r]:.2f} s > {SKIP_FACTOR:g} x best {best[r]:.2f} s"
           for r in SCORES]  # fmt: skip
    return f"lower bounds {', '.join(why)} (from k={k_prev})"


def run_cell(data: OperatorData, workload: str, sites, repeats: int) -> list[dict]:
    """All k of one (kind, workload, n), in increasing order; at each k after the
    first the fixed variants best-first (by their total at the previous k)."""
    rows, previous, k_prev = [], {}, None
    for k in sites:
        case = dict(
            kind=data.kind, workload=workload, n=data.n, layers=data.layers, k=k
        )
        row = dict(case, results={}, skipped={})
        results, outputs = row["results"], {}
        order = sorted(
            FIXED, key=lambda v: previous.get(v, {}).get("total_s", math.inf)
        )
        for variant in order + [BASELINE, *AUTOS]:
            why = skip_reason(variant, data.n, results, previous, k, k_prev)
            if why is not None:
                row["skipped"][variant] = why
                continue
            timings, outputs[variant] = measure_repeated(variant, data, case, repeats)
            results[variant] = timings
            chose = f"  -> {timings['choice']['strategy']}" if variant in AUTOS else ""
            print(
                f"    {label(case):<30} {variant:<12} total {timings['total_s']:8.3f} s"
                f"  (run {timings['run_s']:.3f} s){chose}",
                flush=True,
            )
        reference = outputs.get("Lazy", next(iter(outputs.values())))
        for variant, out in outputs.items():
            results[variant]["rel_err_vs_lazy"] = harness.relative_error(out, reference)
        row["scores"] = {str(runs): row_score(results, runs) for runs in SCORES}
        rows.append(row)
        previous, k_prev = {v: results[v] for v in FIXED if v in results}, k
    return rows


def row_score(results: dict, runs: int) -> dict:
    """At one score: the best fixed policy (plain lineax among the candidates) and
    Auto (told that number of runs) against it."""
    candidates = {
        v: score(results[v], runs) for v in FIXED + (BASELINE,) if v in results
    }
    best = min(candidates, key=candidates.get)
    auto = score(results[AUTO_FOR[runs]], runs)
    choice = results[AUTO_FOR[runs]]["choice"]["strategy"]
    return dict(
        totals={v: score(t, runs) for v, t in results.items()},
        best=best,
        best_s=candidates[best],
        auto=AUTO_FOR[runs],
        auto_choice=choice,
        auto_over_best=auto / candidates[best],
        lineax_over_best=candidates[BASELINE] / candidates[best],
        auto_over_lineax=auto / candidates[BASELINE],
        auto_picked_best=choice == best or (best == BASELINE and choice == "Lazy"),
    )


def run_grid(args) -> list[dict]:
    """Every (kind, n, workload, k) of `auto`'s command line, the rows in that order."""
    rows = []
    for kind in args.kinds:
        for n in args.n:
            layers = layers_for(n, args.layers)
            data = make_cheap(n) if kind == "cheap" else make_expensive(n, layers)
            print(f"  {kind} n={n}: {data.note}", flush=True)
            # The first Outline call at a size pays a one-off first touch.
            measure("Outline", data, dict(kind=kind, workload="mv", n=n, k=1))
            for workload in args.workloads:
                rows += run_cell(data, workload, args.sites, args.repeats)
            del data
    return rows


def worst_cases(rows: list[dict]) -> dict:
    """Per score, the WORST_KEPT cases with the largest Auto / best, with every
    variant's measured times and Auto's decisions (reasons and estimates)."""
    out, each = {}, lambda r, f: {v: t[f] for v, t in r["results"].items()}
    for key in map(str, SCORES):
        ordered = sorted(rows, key=lambda r: -r["scores"][key]["auto_over_best"])
        out[key] = [
            dict(
                case=f"{label(r)} L={r['layers']}",
                auto_over_best=(s := r["scores"][key])["auto_over_best"],
                best=s["best"],
                auto_choice=s["auto_choice"],
                scores=s["totals"],
                measured_compile_total_s=each(r, "compile_total_s"),
                measured_run_s=each(r, "run_s"),
                skipped=r["skipped"],
                decisions=r["results"][s["auto"]]["choice"].get("decisions", []),
            )
            for r in ordered[:WORST_KEPT]
        ]
    return out


def sites_check(n: int, layers: int, sites: Sequence[int], repeats: int) -> dict:
    """Expensive operator, "mv" workload, each k of `sites`: compile total under
    `lxd.jit` + Auto and under plain lineax, and its ratio, last k over first."""
    data = make_expensive(n, layers)
    out = dict(n=n, layers=layers, sites=list(sites))
    for variant in (BASELINE, "Auto"):
        results = {}
        for k in sites:
            case = dict(kind="expensive", workload="mv", n=n, k=k)
            results[str(k)] = t = measure_repeated(variant, data, case, repeats)[0]
            chose = f"  -> {t['choice']['strategy']}" if variant in AUTOS else ""
            print(
                f"    sites check {variant:<8} k={k:<3} compile total "
                f"{t['compile_total_s']:.3f} s{chose}",
                flush=True,
            )
        totals = [t["compile_total_s"] for t in results.values()]
        out[variant] = dict(results=results, ratio=totals[-1] / totals[0])
    return out


def warm_up() -> None:
    """Every variant once, on both workloads of a tiny operator (discarded)."""
    for data in (make_cheap(16), make_expensive(16, 2)):
        for workload in WORKLOADS:
            for variant in VARIANTS:
                measure(
                    variant, data, dict(kind=data.kind, workload=workload, n=16, k=2)
                )
