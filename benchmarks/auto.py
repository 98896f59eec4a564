"""How close `lxd.Auto` under `lxd.jit` comes to the best fixed policy and to plain
lineax, scored as compile + 1 run (`Auto(runs=1)`) and compile + 100 runs (`Auto()`)
over a grid of operators, sizes, call sites, `mv`s and CG solves.

What is measured, how, what is skipped and the targets: docs/benchmarks_auto.md.
`python -m benchmarks.auto` (n=64,256,1024,4096; k=1,4,16; L=32), `--quick` (n=64,256;
k=1,4; L=4), `--n 256,1024 --sites 1,16 --repeats 3`...: `auto.json`, `auto.png`."""

import itertools
import math
import time
from collections import namedtuple
from collections.abc import Sequence
from statistics import median

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.auto_report import (
    AUTOS,
    BASELINE,
    FIXED,
    format_gaps,
    format_results,
    label,
    plot,
    row_score,
    score,
    SCORES,
    stage_gaps,
    STAGES,
    summarise,
    TARGET_LINEAX,
    TARGET_MEDIAN,
    TARGET_WORST,
    TWIN,
    VARIANTS,
)
from benchmarks.harness import SEED


FULL = dict(n=(64, 256, 1024, 4096), sites=(1, 4, 16), layers=32)
QUICK = dict(n=(64, 256), sites=(1, 4), layers=4)
KINDS, WORKLOADS = ("cheap", "expensive"), ("mv", "solve")
WEIGHT_CAP_BYTES, MATERIALISE_CAP_BYTES, MATERIALISE_BATCH = 256 * 2**20, 2**30, 128
RTOL, ATOL, MAX_STEPS, SHIFT, RHS_SCALE = 1e-5, 1e-5, 200, 0.02, 1 / 16
POLICIES = dict(Lazy=lxd.Lazy, Outline=lxd.Outline, Roll=lxd.Roll, Auto=lxd.Auto)
POLICIES.update(Materialise=lambda: lxd.Materialise(batch_size=MATERIALISE_BATCH))
POLICIES.update(Auto1=lambda: lxd.Auto(runs=1))
LXD_JIT = ("Roll",) + AUTOS  # compiled with `lxd.jit` (Roll acts only there)
# Skipping dominated fixed variants; the run time: the median, over the repeats,
# of 3 to RUN_SAMPLES further calls each, as many as fit in RUN_BUDGET_S (a
# sub-millisecond run's median needs many samples: its score at 100 runs
# multiplies the call's jitter by 100).
SKIP_FACTOR, SKIP_MARGIN, RUN_SAMPLES, RUN_BUDGET_S = 2.0, 0.8, 51, 0.5
# A cell whose first round measured every variant in under SMALL_CELL_S (trace to
# first call) is repeated at least SMALL_CELL_REPEATS times: its variants differ by
# milliseconds, the machine's spread between identical measurements.
SMALL_CELL_S, SMALL_CELL_REPEATS = 1.0, 11


# ------------------------------------------------------------------ cases


OperatorData = namedtuple("OperatorData", "kind n layers mv_arrays solve_arrays note")


def layers_for(n: int, layers: int) -> int:
    """`layers`, or fewer so that the weights stay within WEIGHT_CAP_BYTES."""
    return max(1, min(layers, WEIGHT_CAP_BYTES // (4 * n * n)))


def make_data(kind: str, n: int, layers: int) -> OperatorData:
    """Arrays of `kind` at size `n` ("mv", SPD "solve"): `M = I + G G^T / (1.05 SHIFT
    lambda_max)`, `G ~ N(0, 1/n)` ("cheap"); `harness`'s chain, `layers_for(n,
    layers)` layers, for solves scaled to `lambda_max(C^T C) = 1 / (1.05 SHIFT)`."""
    if kind == "cheap":
        k1, k2 = jax.random.split(jax.random.key(SEED))
        g = jax.random.normal(k1, (n, n), jnp.float32) / jnp.sqrt(n)
        gram = g @ g.T
        lam = float(harness.top_eigenvalue(jax.jit(lambda x: gram @ x), n, k2))
        matrix = jnp.eye(n, dtype=jnp.float32) + gram / (1.05 * SHIFT * lam)
        arrays = (jax.block_until_ready(matrix),)
        return OperatorData(kind, n, 1, arrays, arrays, "x -> M @ x, one dense SPD")
    layers = layers_for(n, layers)
    keys = jax.random.split(jax.random.key(SEED + 1), 2 * layers + 1)
    weights, scales = harness.random_layers(keys, n, layers)
    gram = jax.jit(lambda x: harness.apply_gram(weights, scales, x))
    lam = float(harness.top_eigenvalue(gram, n, keys[-1]))
    factor = (1.05 * SHIFT * lam) ** (-1.0 / (2 * layers))
    arrays = jax.block_until_ready((weights, scales, tuple(s * factor for s in scales)))
    note = f"chain of {layers} dense layers ({layers * n * n * 4 / 2**20:.0f} MiB)"
    return OperatorData(kind, n, layers, arrays[:2], arrays[::2], note)


def make_program(variant: str, data: OperatorData, workload: str, k: int):
    """`(f, params, static)` (`harness.split_program`): `f(params, x)` runs the
    workload with `k` call sites (a Python loop) on a fresh operator over
    `eqx.Partial(new function, *arrays)`, so no cache carries over; solves with
    `lx.CG` for plain lineax (and its twin), else `lxd.CG`, with the same
    arguments."""
    if variant == TWIN:
        variant = BASELINE
    if data.kind == "cheap":
        fn = lambda matrix, x: matrix @ x
    elif workload == "mv":
        fn = lambda weights, scales, x: harness.apply_chain(weights, scales, x)
    else:
        fn = lambda weights, scales, x: x + harness.apply_gram(weights, scales, x)
    arrays = data.mv_arrays if workload == "mv" else data.solve_arrays
    args = (eqx.Partial(fn, *arrays), jax.ShapeDtypeStruct((data.n,), jnp.float32))
    args += (lx.positive_semidefinite_tag if workload == "solve" else (),)
    module = lx if variant == BASELINE else lxd
    policy = {} if variant == BASELINE else dict(policy=POLICIES[variant]())
    op = module.FunctionLinearOperator(*args, closure_convert=False, **policy)
    solver = module.CG(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)

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


def config(args) -> dict:
    """The configuration of a run (`args`: the command line) and the constants."""
    out = {k: v for k, v in vars(args).items() if k not in ("out", "quick")}
    numbers = {k: v for k, v in globals().items() if isinstance(v, (int, float))}
    out |= {k.lower(): v for k, v in numbers.items() if k.isupper()}
    targets = (TARGET_MEDIAN, TARGET_WORST, TARGET_LINEAX)
    out |= dict(zip(("target_median", "target_worst", "target_lineax"), targets))
    out["layers_per_n"] = {str(n): layers_for(n, args.layers) for n in args.n}
    out["reference"] = "plain lineax: lx.FunctionLinearOperator, lx.CG, jax.jit"
    return out


# ------------------------------------------------------------------ measure


def measure(variant: str, data: OperatorData, case: dict) -> tuple[dict, object]:
    """Times one (case, variant) with a fresh operator: trace (for `lxd.jit`, its
    one trace, analysis and rewrite), lower, compile, first call, run."""
    workload = case["workload"]
    f, params, _ = make_program(variant, data, workload, case["k"])
    x = jax.random.normal(jax.random.key(SEED + 7), (case["n"],), jnp.float32)
    args = (params, RHS_SCALE * x if workload == "solve" else x)
    jitted, stages = harness.jit_stages(f, args, variant in LXD_JIT)
    timings, compiled, out = harness.compile_stages(*stages, args)
    first_s = timings["first_call_s"]
    count = int(max(3, min(RUN_SAMPLES, RUN_BUDGET_S // max(first_s, 1e-6))))
    run_s = harness.median_call_time(lambda: compiled(*args), count)
    total = sum(timings.values())  # trace + lower + compile + first call
    timings.update(run_s=run_s, total_s=total)
    timings["compile_total_s"] = total - min(run_s, first_s)
    if workload == "solve":
        out, steps, ok = out
        timings.update(num_steps_max=int(steps), all_successful=bool(ok))
    if variant in AUTOS:  # after the timing: nothing computed here is reused by it
        decisions = list(jitted.decisions(*args).values())
        records = [harness.decision_record(d) for d in decisions]
        strategy = "+".join(d.strategy for d in decisions) or "(none)"
        timings["choice"] = dict(strategy=strategy, decisions=records)
    return timings, out


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
    why = ", ".join(f"runs={r}: {bounds[r]:.2f} s > {SKIP_FACTOR:g} x best "
                    f"{best[r]:.2f} s" for r in SCORES)  # fmt: skip
    return f"lower bounds {why} (from k={k_prev})"


def run_cell(
    data: OperatorData, workload: str, sites, repeats: int, twin: bool = False
) -> list[dict]:
    """All k of one (kind, workload, n), in increasing order; at each k after the
    first the fixed variants best-first (by their total at the previous k). Each
    (case, variant) is measured `repeats` times, interleaved: every round measures
    each variant once (the skips decided in the first), so that a slow spell of the
    machine falls on all of them, every other round in reverse order; the repeat
    with the median total is kept. A cell of small programs (every first total
    under `SMALL_CELL_S`, trace to first call) gets at least `SMALL_CELL_REPEATS` rounds.
    With `twin`, plain lineax is measured a second time each round (`TWIN`)."""
    rows, previous, k_prev = [], {}, None
    for k in sites:
        row = dict(kind=data.kind, workload=workload, n=data.n, layers=data.layers, k=k)
        results, skipped, outputs = {}, {}, {}
        row.update(results=results, skipped=skipped)
        by_total = lambda v: previous.get(v, {}).get("total_s", math.inf)
        measured, trials = [], {}
        extra = [TWIN] if twin else []
        for variant in sorted(FIXED, key=by_total) + [BASELINE, *AUTOS, *extra]:
            # The first round: the skips read its totals.
            if why := skip_reason(variant, data.n, results, previous, k, k_prev):
                skipped[variant] = why
                continue
            measured.append(variant)
            trials[variant] = [measure(variant, data, row)]
            results[variant] = trials[variant][0][0]
        rounds = repeats
        if all(t["total_s"] < SMALL_CELL_S for t in results.values()):
            rounds = max(repeats, SMALL_CELL_REPEATS)
        row["repeats"] = rounds
        for round_ in range(1, rounds):
            # Each later round in reverse order of the one before: no variant is
            # always measured last in its round.
            for variant in measured[:: -1 if round_ % 2 else 1]:
                trials[variant].append(measure(variant, data, row))
        for variant in measured:
            got = trials[variant]
            t, outputs[variant] = harness.median_trial(got, "total_s", ["total_s"])
            t["run_s"] = median(trial["run_s"] for trial, _ in got)
            t["run_all_s"] = [trial["run_s"] for trial, _ in got]
            # In round order, for ratios paired by round (`paired_ratio`), and each
            # stage's, for where a gap lies (`stage_gaps`).
            t["compile_total_all_s"] = [trial["compile_total_s"] for trial, _ in got]
            t["stages_all_s"] = {s: [trial[s] for trial, _ in got] for s in STAGES}
            results[variant] = t
            chose = f"  -> {t['choice']['strategy']}" if variant in AUTOS else ""
            print(f"    {label(row):<30} {variant:<12} total {t['total_s']:8.3f} s  "
                  f"(run {t['run_s']:.3f} s){chose}", flush=True)  # fmt: skip
        reference = outputs.get("Lazy", next(iter(outputs.values())))
        for variant, out in outputs.items():
            results[variant]["rel_err_vs_lazy"] = harness.relative_error(out, reference)
        row["scores"] = {str(runs): row_score(results, runs) for runs in SCORES}
        rows.append(row)
        previous, k_prev = {v: results[v] for v in FIXED if v in results}, k
    return rows


def run_grid(args) -> list[dict]:
    """Every (kind, n, workload, k) of the command line, the rows in that order."""
    rows = []
    for kind in args.kinds:
        for n in args.n:
            data = make_data(kind, n, args.layers)
            print(f"  {kind} n={n}: {data.note}", flush=True)
            # The first Outline call at a size pays a one-off first touch.
            measure("Outline", data, dict(kind=kind, workload="mv", n=n, k=1))
            for workload in args.workloads:
                rows += run_cell(data, workload, args.sites, args.repeats, args.twin)
    return rows


# ------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None):
    """The command line; sizes left out take the defaults (or `--quick`'s)."""
    parser = harness.parser(__doc__, FULL, QUICK)
    add, names, ints = parser.add_argument, harness.name_list, harness.int_list
    add("--n", type=ints, help=f"sizes (default {harness.joined(FULL['n'])})")
    add("--sites", type=ints, help=f"call sites (default {FULL['sites']})")
    add("--layers", type=int, help="layers of the expensive operator (default 32)")
    add("--kinds", type=names(KINDS), default=KINDS, help="cheap,expensive")
    add("--workloads", type=names(WORKLOADS), default=WORKLOADS, help="mv,solve")
    add("--repeats", type=int, default=1, help="repeats per cell (median kept)")
    add(
        "--twin",
        action="store_true",
        help="measure plain lineax twice per round (the spread of identical programs)",
    )
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    args.n, args.sites = tuple(sorted(set(args.n))), tuple(sorted(set(args.sites)))
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Warm up, measure the grid, print the tables, write `auto.json`/`auto.png`."""
    args = parse_args(argv)
    start = time.perf_counter()
    env, conf = harness.environment(load_average=True), config(args)
    harness.print_setup(env, conf)
    # Warm-up: every variant once, on both workloads of a tiny operator (discarded).
    for data in (make_data("cheap", 16, 1), make_data("expensive", 16, 2)):
        for workload, variant in itertools.product(WORKLOADS, VARIANTS):
            measure(variant, data, dict(kind=data.kind, workload=workload, n=16, k=2))
    print(f"warm-up done ({time.perf_counter() - start:.1f} s)", flush=True)
    rows = run_grid(args)
    summary, elapsed = summarise(rows), time.perf_counter() - start
    env["load_average_end"] = harness.load_average_now()
    gaps = stage_gaps(rows)
    print(format_results(rows, summary) + format_gaps(gaps))
    print(f"total benchmark time: {elapsed:.1f} s; load average at start "
          f"{env['load_average']}, at end {env['load_average_end']}")  # fmt: skip
    payload = dict(environment=env, config=conf, cases=rows, summary=summary)
    payload["lineax_gaps"] = gaps
    payload.update(total_seconds=elapsed)
    plot_to = lambda path: plot(rows, summary, conf, path)
    harness.write_results(args.out, "auto", payload, plot_to)


if __name__ == "__main__":
    main()
