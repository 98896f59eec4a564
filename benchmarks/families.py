"""Auto on program families it was not fitted to: stencils, adjoint pairs
`J^T J + lambda I`, Gauss-Newton normal operators and Jacobians of small networks,
each at n from 64 to 4096 with mixes of one to four solves and `mv`s
(`benchmarks/families_cases.py`), scored as `benchmarks.auto` scores its grid:
compile + 1 run (`Auto(runs=1)`) and compile + 100 runs (`Auto()`) over the best
fixed policy (plain lineax among the candidates), measured in the same process.
Where Auto races (`lxd.Auto.races`: hosts with cores to spare), its variants are
timed by their first call, trace to run, as a user makes it: the race happens
there and not in `.lower()`. Their runs are timed once the race's losing compile
has ended (`harness.settle`; its seconds after the first call are recorded).
A variant's run is the median of as many calls as fit in half a second (3 to
51), after one untimed call (one of the 3, for a program slower than a sixth of
a second). With `--unraced`, `Auto(race=False)` is measured beside them (both
scores), so that whether the race pays on this machine is read from one process.

The cases are split in two halves (`families_cases.split`: alternating within each
family). `benchmarks.fit_cost_model` fits the cost model's constants on the first
half only and reports regret on the second; this benchmark reports the measured
regret of Auto on each half (target on the held-out half: median <= 1.05 and worst
<= 1.5 at both scores). Each Auto variant's observations (what `decide` read) are
kept, so that a cost model can be scored on them offline.

A policy may change how fast an answer comes, not the answer: a variant is a
candidate for the best only where its answer is one (`answer_ok`: it reported
success, or it is within `ANSWER_TOLERANCE` of `Lazy`'s, our matrix-free solve's,
failed or not). Plain lineax's CG, for one, returns zeros where its curvature test
reports a well-posed solve singular (the stencil's chained solves at n = 4096),
and a dense build's float32 rounding can keep a solve at the edge of float32 from
its tolerance: no time of a wrong answer is a bar. Each score also counts where
Auto's own answer is not one (`auto_answer_ok`), and, at compile + 1 run, where
Auto's first call is slower than plain lineax's by more than 5% where lineax's
answer is one (`auto_over_lineax`). `--merge` scores its files' cases again by
these rules.

Our variants solve with our solvers (`lxd.CG`, `lxd.GMRES`: one `mv` site), whose
compile differs from lineax's; `--solvers lineax` gives them lineax's solvers, so
that the scores measure the policies alone against plain lineax, as a user who
keeps lineax's solver and swaps in our operators meets them.

How to run
----------

    python -m benchmarks.families                 # every case, 3 repeats
    python -m benchmarks.families --quick         # n <= 256, 1 repeat
    python -m benchmarks.families --half held_out # one half only
    python -m benchmarks.families --merge a/families.json b/families.json --out c
    python -m benchmarks.families --half held_out --unraced  # also Auto(race=False)
    python -m benchmarks.families --half held_out --solvers lineax  # policies alone

Results: `benchmarks/results/families.json` and `.png`.
"""

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from unittest import mock

import jax
import jax.numpy as jnp

import lineax_dispatch as lxd
from benchmarks import families_cases as fc, harness
from benchmarks.auto_report import AUTO_FOR, BASELINE, FIXED, SCORES
from benchmarks.families_scores import (
    case_score,
    format_rows,
    summary,
    TARGET_MEDIAN,
    TARGET_WORST,
    UNRACED,
)
from lineax_dispatch.policies import _auto, machine_cost_model
from lineax_dispatch.policies._outline import outline_runs_here
from lineax_dispatch.program import _decide as _program


POLICIES = dict(
    Lazy=lxd.Lazy,
    Outline=lxd.Outline,
    Roll=lxd.Roll,
    Materialise=lambda: lxd.Materialise(batch_size=128),
    Auto1=lambda: lxd.Auto(runs=1),
    Auto=lxd.Auto,
)
POLICIES[UNRACED["Auto1"]] = lambda: lxd.Auto(runs=1, race=False)
POLICIES[UNRACED["Auto"]] = lambda: lxd.Auto(race=False)
AUTOS = (*AUTO_FOR.values(), *UNRACED.values())
# `Outline` where this backend runs it (refused off the CPU on jax 0.10:
# docs/accelerators.md).
VARIANTS = tuple(
    v
    for v in FIXED + (BASELINE,) + tuple(AUTO_FOR.values())
    if v != "Outline" or outline_runs_here()
)
LXD_JIT = ("Roll", *AUTOS)
RUN_SAMPLES, RUN_BUDGET_S = 51, 0.5


def cost_model_record(model: lxd.CostModel) -> dict:
    """A `CostModel`'s fields as a JSON dict."""
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}


def observation_record(o) -> dict:
    """An `lxd.Observation` as a JSON dict (`lxd.Observation(**record)` rebuilds
    it)."""
    return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}


def _recording(found: list):
    """`decide`, recording each observation it is given into `found`."""
    real = _program.decide

    def decide(o, model):
        found.append(observation_record(o))
        return real(o, model)

    return decide


def _time_runs(timings: dict, compiled, args) -> None:
    """Adds to a variant's `timings` its run (`run_s`: the median of as many calls
    as fit in `RUN_BUDGET_S`) and `compile_total_s` (its total less a run)."""
    # One call (`lxd.jit` keeps its fast path at its second call), then as many
    # as fit in the budget at that call's time; the first is one of the 3 samples
    # of a program slower than a third of the budget.
    (warm,) = harness.call_times(lambda: compiled(*args), 1)
    count = int(max(3, min(RUN_SAMPLES, RUN_BUDGET_S // max(warm, 1e-6))))
    samples = [warm] if 3 * warm > RUN_BUDGET_S else []
    samples += harness.call_times(lambda: compiled(*args), count - len(samples))
    run_s = median(samples)
    timings["run_s"] = run_s
    timings["compile_total_s"] = timings["total_s"] - min(
        run_s, timings["first_call_s"]
    )


def measure(
    variant: str,
    case: fc.Case,
    arrays: tuple,
    lineax_solvers: bool = False,
    runs: bool = True,
) -> tuple[dict, object]:
    """Times one (case, variant) with a fresh operator (solved with lineax's
    solvers where `lineax_solvers`): trace (for `lxd.jit`, its trace, analysis and
    rewrite), lower, compile, first call, and, where `runs`, the run (`run_s`,
    `compile_total_s`)."""
    policy = None if variant == BASELINE else POLICIES[variant]()
    op, solver = fc.make_operator(case.family, arrays, case.n, policy, lineax_solvers)
    f, params, _ = harness.split_program(op, fc.body(case, solver))
    x = jax.random.normal(jax.random.key(harness.SEED + 5), (case.n,), jnp.float32)
    args = (params, x)
    observed: list = []
    jitted, stages = harness.jit_stages(f, args, variant in LXD_JIT)
    recorder = _recording(observed)
    raced = variant in AUTOS and POLICIES[variant]().races()
    with mock.patch.object(_program, "decide", recorder):
        with mock.patch.object(_auto, "decide", recorder):
            if raced:
                # Auto races its uncertain choices at the first call (not in
                # `.lower()`): that call, trace to run, as a user makes it.
                harness.fresh_heap()
                out, first_s = harness.timed(
                    lambda: jax.block_until_ready(jitted(*args))
                )
                timings, compiled = dict(first_call_s=first_s), jitted
            else:
                timings, compiled, out = harness.compile_stages(*stages, args)
    # The race's losing compile, still running: its seconds after the first call
    # (not waited for by a user's call; the runs are timed after it).
    settled_s = harness.settle() if raced else 0.0
    timings["total_s"] = sum(timings.values())
    if raced:
        timings["loser_compile_after_s"] = settled_s
    if runs:
        _time_runs(timings, compiled, args)
    out, steps, ok = out
    timings.update(num_steps_max=int(steps), all_successful=bool(ok))
    if variant in LXD_JIT:
        # `lxd.jit`'s own stages (trace, decide, rewrite): what deciding costs.
        timings["stages"] = jitted.stage_seconds(*args)
    if variant in AUTOS:
        decisions = list(jitted.decisions(*args).values())
        timings["choice"] = dict(
            strategy="+".join(d.strategy for d in decisions) or "(none)",
            decisions=[harness.decision_record(d) for d in decisions],
        )
        timings["observations"] = observed
    return timings, out


def run_case(
    case: fc.Case,
    repeats: int,
    variants: tuple = VARIANTS,
    lineax_solvers: bool = False,
) -> dict:
    """Each of `variants` on `case`, `repeats` rounds interleaved (every other
    round in reverse order); per variant the round with the median total is kept,
    with the median run time. Ours solve with lineax's solvers where
    `lineax_solvers`."""
    arrays = fc.family_arrays(case.family, case.n)
    trials: dict = {v: [] for v in variants}
    for round_ in range(repeats):
        for variant in variants[:: -1 if round_ % 2 else 1]:
            trials[variant].append(measure(variant, case, arrays, lineax_solvers))
    results, outputs = {}, {}
    for variant, got in trials.items():
        t, outputs[variant] = harness.median_trial(got, "total_s", ["total_s"])
        t["run_s"] = median(trial["run_s"] for trial, _ in got)
        results[variant] = t
    reference = outputs["Lazy"]
    for variant, out in outputs.items():
        results[variant]["rel_err_vs_lazy"] = harness.relative_error(out, reference)
    row = dict(dataclasses.asdict(case), label=case.label, results=results)
    row["scores"] = {str(r): case_score(results, r) for r in SCORES}
    return row


def plot(rows: list[dict], path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    fit, _ = fc.split(fc.cases())
    fit_labels = {c.label for c in fit}
    for i, runs in enumerate(map(str, SCORES)):
        for j, row in enumerate(rows):
            held = row["label"] not in fit_labels
            ax.scatter(
                j + 0.2 * i,
                row["scores"][runs]["auto_over_best"],
                marker="o" if runs == "1" else "s",
                color="tab:red" if held else "tab:blue",
                s=16,
            )
    ax.axhline(TARGET_WORST, color="grey", linestyle=":")
    ax.axhline(TARGET_MEDIAN, color="grey", linestyle="--")
    ax.set_yscale("log")
    ax.set_xlabel("case (blue: fit half, red: held out; circle runs=1, square 100)")
    ax.set_ylabel("Auto / best fixed")
    ax.set_title(f"Auto on program families ({harness.jax_label()})")
    harness.save(fig, path)


def parse_args(argv: Sequence[str] | None = None):
    full, quick = dict(max_n=4096, repeats=3), dict(max_n=256, repeats=1)
    parser = harness.parser(__doc__, full, quick)
    parser.add_argument("--max-n", type=int, help="largest n (default 4096)")
    parser.add_argument("--repeats", type=int, help="rounds per case (default 3)")
    parser.add_argument(
        "--half", choices=("all", "fit", "held_out"), default="all", help="cases"
    )
    parser.add_argument("--families", type=harness.name_list(fc.FAMILIES))
    parser.add_argument(
        "--unraced",
        action="store_true",
        help="also measure Auto(race=False) at both scores",
    )
    parser.add_argument(
        "--solvers",
        choices=("ours", "lineax"),
        default="ours",
        help="the solvers of our variants: ours (default), or lineax's (the "
        "policies alone against plain lineax)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        help="measure nothing: write the cases of these results files as one",
    )
    args = parser.parse_args(argv)
    harness.fill_defaults(args, full, quick)
    return args


def selected(args) -> list[fc.Case]:
    fit, held = fc.split(fc.cases())
    pool = dict(all=fc.cases(), fit=fit, held_out=held)[args.half]
    families = args.families or fc.FAMILIES
    return [c for c in pool if c.n <= args.max_n and c.family in families]


def merge(paths: Sequence[Path], out: Path) -> None:
    """Writes the cases of several results files (one family per process, as on
    a machine whose calls are time-limited) as one, summarised as one run."""
    loaded = [json.loads(p.read_text()) for p in paths]
    rows = [row for payload in loaded for row in payload["cases"]]
    for row in rows:
        row["scores"] = {str(r): case_score(row["results"], r) for r in SCORES}
    payload = dict(loaded[0], cases=rows, summary=summary(rows))
    payload["config"] = dict(
        loaded[0]["config"],
        families=f"{len(paths)} runs, merged: "
        + ", ".join(sorted({row["family"] for row in rows})),
    )
    payload["total_seconds"] = sum(p.get("total_seconds") or 0.0 for p in loaded)
    print(format_rows(rows, payload["summary"]))
    harness.write_results(out, "families", payload, lambda p: plot(rows, p))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge:
        merge(args.merge, args.out)
        return
    start = time.perf_counter()
    env = harness.environment(load_average=True)
    conf = dict(max_n=args.max_n, repeats=args.repeats, half=args.half)
    conf["unraced"] = args.unraced
    conf["solvers"] = args.solvers
    lineax_solvers = args.solvers == "lineax"
    harness.print_setup(env, conf)
    variants = VARIANTS + (tuple(UNRACED.values()) if args.unraced else ())
    warm = fc.Case("stencil", 16, 1, 1)
    for variant in variants:  # JAX's own first-use costs, discarded
        measure(variant, warm, fc.family_arrays("stencil", 16), lineax_solvers)
    rows = []
    for case in selected(args):
        row = run_case(case, args.repeats, variants, lineax_solvers)
        rows.append(row)
        s1, s100 = (row["scores"][str(r)] for r in SCORES)
        print(
            f"  {case.label:<44} runs=1 {s1['auto_over_best']:.2f} "
            f"({s1['auto_choice']} vs {s1['best']}), runs=100 "
            f"{s100['auto_over_best']:.2f} ({s100['auto_choice']} vs {s100['best']})"
            + "".join(
                f"; unraced runs={r} {s['unraced_over_best']:.2f}"
                for r, s in ((1, s1), (100, s100))
                if "unraced_over_best" in s
            ),
            flush=True,
        )
    totals = summary(rows)
    print(format_rows(rows, totals))
    elapsed = time.perf_counter() - start
    print(f"total benchmark time: {elapsed:.1f} s")
    payload = dict(environment=env, config=conf, cases=rows, summary=totals)
    # The constants Auto decided with here: `benchmarks.fit_cost_model` fits its
    # multipliers over them.
    payload["cost_model"] = cost_model_record(machine_cost_model())
    payload["total_seconds"] = elapsed if math.isfinite(elapsed) else None
    harness.write_results(args.out, "families", payload, lambda p: plot(rows, p))


if __name__ == "__main__":
    main()
