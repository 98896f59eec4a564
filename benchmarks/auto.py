"""How close `lxd.Auto` under `lxd.jit` comes to the best fixed policy (and to plain
lineax), scored twice: compile (including the first call's extra) plus ONE run of
the compiled program, with `Auto(runs=1)`; and compile plus 100 runs, with the
default `Auto()` (`runs=100`).

What is measured
----------------

A grid of cases (kind x workload x n x call sites k), each under every fixed
policy of lineax-dispatch, under plain lineax, and under `Auto`:

- operator kinds, all `FunctionLinearOperator`s of float32 `n x n` maps:

  - "cheap": one dense matrix-vector product, `x -> M @ x`, with
    `M = I + G G^T / (SHIFT lambda_max(G G^T))` (`G ~ N(0, 1/n)`), so `M` is
    symmetric positive definite with its spectrum in about `[1, 1 + 1 / SHIFT]`.
  - "expensive": a chain of `L` dense layers (as in `callsites`),
    `C x = s_L * (W_L @ (... s_1 * (W_1 @ x)))`, `W_i ~ N(0, 1/n)`,
    `s_i ~ U(0.5, 1.5)`. For `mv` the operator is `C` itself (`L` matmuls); for
    solves it is the SPD `x -> x + C^T (C x)` (transposes applied by hand, `2 L`
    matmuls), the scales multiplied by a common factor (power iteration) so that
    `C^T C` has its largest eigenvalue about `1 / SHIFT`. `L` is `--layers`
    (default 32) but at most what keeps the weights within 256 MiB (`L = 4` at
    n=4096); the table's `L` column gives the layers actually used.

  Solves use operators tagged `lx.positive_semidefinite_tag`; with `SHIFT = 0.02`
  (condition number about 50) CG converges in a few tens of steps. The spectrum
  starts at 1, not at `SHIFT`: lineax's CG, and `lxd.CG` after it, report
  `singular` when a curvature `p^T A p` falls below `100 rcond p^T p` with
  `rcond = 2 eps n`, about `0.1 p^T p` at n=4096 in float32, so an operator whose
  Rayleigh quotients are small in absolute terms fails at large n. The
  right-hand side `b` is `RHS_SCALE = 1/16` times a standard normal vector, so
  that even `b * 16` stays at a scale where float32 rounding of the residual
  (about `eps * cond * |b|`) is below `atol = 1e-5`; with `b` of unit scale the
  solves with `b * 4` and beyond stalled at `max_steps`.

- workloads, with `k` independent call sites written as a Python loop (each a
  separate copy in the traced program):

  - "mv": `f(x) = sum_{i<k} op.mv(x * (i + 1))`;
  - "solve": `f(b) = sum_{i<k} lx.linear_solve(op, b * (i + 1), solver,
    throw=False).value` with `solver = lxd.CG(rtol=1e-5, atol=1e-5,
    max_steps=200)` (the program also returns the largest step count and whether
    every solve succeeded).

- variants:

  - `Lazy`, `Outline`, `Materialise`: `lxd.FunctionLinearOperator` with the fixed
    policy `lxd.Lazy()`, `lxd.Outline()`, `lxd.Materialise(batch_size=128)`,
    compiled with `jax.jit`; `Roll`: with `lxd.Roll()`, compiled with `lxd.jit`
    (which rolls its sites, and repeated solves, into one loop body).
    `Materialise` is skipped where the matrix would exceed 1 GiB (recorded; it
    never does in the default grid). `VmapBatch`/`Scan` equal `Lazy` for single
    vectors and are not run.
  - `lineax`: plain `lx.FunctionLinearOperator` with `jax.jit`, the reference
    (for solves with lineax's own `lx.CG(rtol=1e-5, atol=1e-5, max_steps=200)`,
    i.e. no lineax-dispatch at all).
  - `Auto` and `Auto1`: `lxd.FunctionLinearOperator(..., policy=lxd.Auto())`
    (runs=100) and `policy=lxd.Auto(runs=1)`, compiled with `lxd.jit`, which traces
    the program once, reads each operator's call sites and the cost of its `mv`
    from the traced program, decides and rewrites it: all of that is in Auto's
    time. The strategy reported is `jitted.decisions(params, x)` (after the
    timing): for "mv" the program's decision; for "solve" those made in `CG`'s
    `init` (one call site run the solver's expected number of iterations), told
    by `lxd.jit` of repeated solves of one operator. Only where `lxd.jit` records
    no decision for a solve is the strategy what `solver.prepare(op)` returns
    (evaluated with `eqx.filter_eval_shape`), with the reasons from
    `op.policy.decision(op, call_sites=1, executions=expected_iterations(200, n))`.

How the operator reaches the compiled program (as in `harness`): each measurement
builds a fresh operator, its function `eqx.Partial(new_function_object, *arrays)`
with `closure_convert=False`, so that its key is new (and with it Auto's history
and cost cache, equinox's cache of `Outline`'s callee and jax's tracing caches:
nothing carries over between variants); `harness.split_program` makes its arrays
(matrix, weights, scales) an *argument* of the jitted function and closes over the
rest (`lxd.jit` has `jax.jit` semantics: the operator, which holds a Python
function, cannot be an argument). Closing over the arrays instead can make them
HLO constants (with lineax's default `closure_convert=True`, whether the
closed-over arrays stay operator leaves or become literals of the
closure-converted jaxpr depends on jax's `jax_use_simplified_jaxpr_constants`
setting); compiling 128 MiB of constants adds about a second to every program, for
every variant alike, which is not what is compared here.

Timing, per (case, variant), with a fresh operator: the stages of `harness`
(trace, lower, compile, first call: `harness.compile_stages`), except that for
`lxd.jit` variants trace is `jitted.decisions(params, x)` (the one trace, the
analysis and the rewrite) and lower is `jitted.lower(params, x)` (the lowering of
the rewritten program); the first call includes compiling `Outline`'s callee and
the work XLA:CPU defers to it. Run: the median of up to 5 further executions, as
many as fit in 1 s (one for a program that runs longer).

"compile total" = trace + lower + compile + first call - one run, i.e. compile
with the first call's extra; the score at `runs` is compile total + `runs` x run.
The best of a case, per score, is the least score among Lazy, Outline,
Materialise, Roll and plain lineax; Auto is scored with the variant told that
number of runs (`Auto1` at runs=1, `Auto` at runs=100).
With `--repeats r` each (case, variant) is measured r times and the repeat with
the median total is kept (all totals are in the JSON).

Skipped measurements, to keep the default grid within about 15 minutes on two
cores (each recorded with its reason in the JSON and shown as `skip` in the
table): within one (kind, workload, n) the call-site counts are run in increasing
order, and at each k after the first the fixed variants are measured best-first
(by their total at the previous k); a fixed variant is not measured when lower
bounds on both its scores already exceed twice the best score measured at this k,
so it cannot be the best. The bounds are 0.8 x runs x (its run time at the
previous k) x (k / previous k) for `Lazy` and `Outline` (each of the k sites runs
its own `mv`s: `Outline` with a host callback that copies all the weights each
time, which makes its solves of the large expensive operators take tens of
seconds), and 0.8 x its score at the previous k for `Materialise` and `Roll`
(their build or loop body is shared by the k sites). Auto and lineax are always
measured.

Before the grid, every variant is run once on a tiny case and discarded
(warm-up), and for each (kind, n) `Outline` is run once (its first call at a size
pays a one-off first touch of the host memory the callback copies into).

A separate measurement: the expensive operator at n=1024, L=32 (`--quick`: n=256,
L=4) with the "mv" workload at k=1 and k=16, under `lxd.jit` + Auto and under plain
lineax: compile total at k=16 / compile total at k=1 (target for Auto: <= 1.15).

Targets over the grid, for both scores: median Auto / best <= 1.05, worst <= 1.5,
and Auto / plain lineax <= 1.05 wherever plain lineax is the best.

Noise. With the default `--repeats 1` single cells are noisy on a shared 2-core
machine: in the recorded run, Auto's total against the fixed policy it chose
(the same compiled program plus Auto's observing trace) ranged from 0.66x to 1.78x
(median 1.02x) at a load average of about 3.5. Use `--repeats 3` (and a subset of
the grid) to confirm a single cell.

How to run
----------

    python -m benchmarks.auto           # n=64,256,1024,4096; k=1,4,16; L=32:
                                        # about 11 minutes
    python -m benchmarks.auto --quick   # n=64,256; k=1,4; L=4: 1 minute
    python -m benchmarks.auto --n 256,1024 --sites 1,16 --layers 16
    python -m benchmarks.auto --kinds expensive --workloads solve

Results: `auto.json` and `auto.png` in `benchmarks/results/` (`--out` to change
the folder).

Code: `_auto_cases.py` (constants, cases, measurement), this file (report, command
line, main), `harness.py` (what the benchmarks share).
"""

import time
from collections.abc import Sequence
from statistics import median

from benchmarks import _auto_cases as cases, harness
from benchmarks._auto_cases import BASELINE, label, SCORES, VARIANTS


FULL = dict(n=(64, 256, 1024, 4096), sites=(1, 4, 16), layers=32)
QUICK = dict(n=(64, 256), sites=(1, 4), layers=4)
# The separate call-site measurement (`--quick`: its layers follow `--layers`).
SITES_CHECK = dict(n=1024, layers=32, sites=(1, 16))
QUICK_SITES_CHECK = dict(n=256, layers=4, sites=(1, 16))
# Auto / best (median, worst); Auto / plain lineax where plain lineax is the best;
# compile total at the last k over the first in the call-site measurement.
TARGET_MEDIAN, TARGET_WORST, TARGET_LINEAX, TARGET_SITES = 1.05, 1.5, 1.05, 1.15


# ------------------------------------------------------------------ report


def summarise(rows: list[dict]) -> dict:
    """Per score: median and worst Auto / best, and Auto / lineax where plain
    lineax is the best."""
    out = {}
    for key in map(str, SCORES):
        scores = [r["scores"][key] for r in rows]
        ratios = [s["auto_over_best"] for s in scores]
        worst = max(range(len(rows)), key=lambda i: ratios[i])
        lineax_best = [s["auto_over_lineax"] for s in scores if s["best"] == BASELINE]
        out[key] = dict(
            cases=len(rows),
            median_auto_over_best=median(ratios),
            worst_auto_over_best=ratios[worst],
            worst_case=label(rows[worst]),
            auto_picked_best=sum(s["auto_picked_best"] for s in scores),
            median_lineax_over_best=median([s["lineax_over_best"] for s in scores]),
            lineax_best_cases=len(lineax_best),
            worst_auto_over_lineax_where_lineax_best=max(lineax_best, default=None),
            median_target=TARGET_MEDIAN,
            worst_target=TARGET_WORST,
            lineax_target=TARGET_LINEAX,
            median_met=bool(median(ratios) <= TARGET_MEDIAN),
            worst_met=bool(ratios[worst] <= TARGET_WORST),
            lineax_met=bool(max(lineax_best, default=0.0) <= TARGET_LINEAX),
        )
    return out


def format_table(rows: list[dict], key: str) -> str:
    """Per case: each variant's score (`skip` where not measured), the best, what
    Auto chose, Auto / best and lineax / best (`*`: Auto did not pick the best)."""

    def cells(r):
        s, mark = r["scores"][key], "" if r["scores"][key]["auto_picked_best"] else " *"
        totals = [
            f"{s['totals'][v]:.3f}s" if v in s["totals"] else "skip" for v in VARIANTS
        ]
        return [r["kind"], r["workload"], r["n"], r["layers"], r["k"], *totals,
                s["best"], s["auto_choice"], f"{s['auto_over_best']:.2f}x",
                f"{s['lineax_over_best']:.2f}x{mark}"]  # fmt: skip

    headers = ["kind", "work", "n", "L", "k", *VARIANTS, "best", "Auto chose"]
    headers += ["Auto/best", "lineax/best"]
    return harness.table(headers, [cells(r) for r in rows])


def format_results(rows: list[dict], summary: dict, check: dict | None) -> str:
    """The tables, the skipped measurements, Auto / best over the grid and the
    call-site ratio."""
    lines = []
    for runs in SCORES:
        sm, met = summary[str(runs)], lambda key: harness.met(sm[key])
        lines += [
            f"\nscore = compile (with the first call's extra) + {runs} x run, seconds; "
            f"Auto is Auto(runs={runs}); * = Auto did not pick the best",
            format_table(rows, str(runs)),
            f"runs={runs}: Auto / best over {sm['cases']} cases: median "
            f"{sm['median_auto_over_best']:.2f}x (target <= {TARGET_MEDIAN}: "
            f"{met('median_met')}), worst {sm['worst_auto_over_best']:.2f}x at "
            f"{sm['worst_case']} (target <= {TARGET_WORST}: {met('worst_met')}); "
            f"Auto picked the best in {sm['auto_picked_best']} of {sm['cases']}; where "
            f"plain lineax is the best ({sm['lineax_best_cases']} cases) Auto / lineax "
            f"at worst {sm['worst_auto_over_lineax_where_lineax_best'] or 0:.2f}x "
            f"(target <= {TARGET_LINEAX}: {met('lineax_met')})",
        ]
    skipped = [
        f"  {label(r)} {v}: {why}" for r in rows for v, why in r["skipped"].items()
    ]
    lines += ["\nskipped:"] + skipped if skipped else []
    if check is not None:
        first, last = check["sites"][0], check["sites"][-1]
        auto = check["Auto"]
        chose = ", ".join(
            f"k={k}: {t['choice']['strategy']}" for k, t in auto["results"].items()
        )
        lines.append(
            f"call sites (expensive mv, n={check['n']}, L={check['layers']}): compile "
            f"total k={last} / k={first}: Auto {auto['ratio']:.2f}x (target <= "
            f"{TARGET_SITES}: {harness.met(check['met'])}; chose {chose}), plain "
            f"lineax {check[BASELINE]['ratio']:.2f}x"
        )
    return "\n".join(lines)


COLOURS = dict(
    Lazy="tab:blue", Outline="tab:orange", Materialise="tab:green", Roll="tab:purple"
)


def panel(ax, rows: list[dict], summary: dict, runs: int) -> None:
    """Auto / best per case at one score, coloured by what Auto chose."""
    key, seen = str(runs), set()
    ratios = [r["scores"][key]["auto_over_best"] for r in rows]
    for i, r in enumerate(rows):
        s = r["scores"][key]
        name = f"Auto chose {s['auto_choice']} ({r['workload']})"
        colour, y = COLOURS.get(s["auto_choice"], "tab:gray"), s["auto_over_best"]
        style = dict(marker=dict(mv="o", solve="s")[r["workload"]], zorder=3)
        style.update(edgecolors="none" if s["auto_picked_best"] else "black")
        ax.scatter(i, y, 40, colour, label=None if name in seen else name, **style)
        seen.add(name)
    for target, colour, what in (
        (TARGET_MEDIAN, "tab:purple", "median"),
        (TARGET_WORST, "tab:red", "worst"),
    ):
        ax.axhline(target, color=colour, ls="--", lw=1, label=f"{target:g} ({what})")
    ax.axhline(1.0, color="black", lw=0.6)
    ticks = [f"{r['kind'][0]}/{r['workload']} {r['n']} k{r['k']}" for r in rows]
    ax.set_xticks(range(len(rows)), ticks, rotation=90, fontsize=6)
    ax.set_yscale("log")
    harness.plain_log_ticks(ax)
    low, high = min(ratios + [1.0]) / 1.1, max(ratios + [TARGET_WORST]) * 2.2
    ax.set_ylim(low, high)  # head room for the legend
    ax.set_yticks(
        [t for t in (0.5, 0.75, 1, 1.05, 1.5, 2, 3, 5, 10, 20) if low <= t <= high]
    )
    ax.set_ylabel(f"Auto / best, compile + {runs} x run")
    sm = summary[key]
    ax.set_title(
        f"runs={runs}: median {sm['median_auto_over_best']:.2f}, worst "
        f"{sm['worst_auto_over_best']:.2f} (black edge: not the best)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=3, loc="upper left")


def plot(rows: list[dict], summary: dict, check: dict | None, config: dict, path):
    """Auto / best at each score, and the call-site ratio (Auto and plain lineax)."""
    plt = harness.pyplot()
    widths = dict(width_ratios=(3, 3, 1))
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw=widths)
    for ax, runs in zip(axes[:2], SCORES):
        panel(ax, rows, summary, runs)
    right = axes[2]
    if check is None:
        right.axis("off")
    else:
        values = [check[v]["ratio"] for v in (BASELINE, "Auto")]
        right.bar([BASELINE, "Auto"], values, color=["tab:gray", "tab:blue"])
        target = f"{TARGET_SITES} target"
        right.axhline(TARGET_SITES, color="tab:red", ls="--", lw=1, label=target)
        right.set_title(
            f"compile total k={check['sites'][-1]} / k={check['sites'][0]}\n"
            f"expensive mv, n={check['n']}, L={check['layers']}",
            fontsize=9,
        )
        right.legend(fontsize=7)
        right.grid(True, axis="y", alpha=0.3)
    fig.suptitle(
        f"lxd.jit + Auto vs fixed policies and plain lineax; {harness.jax_label()}, "
        f"layers<={config['layers']}",
        fontsize=10,
    )
    harness.save(fig, path)


# ------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None):
    """The command line; sizes left out take the defaults (or `--quick`'s)."""
    parser = harness.parser(__doc__, FULL, QUICK)
    add, names = parser.add_argument, harness.name_list
    add("--n", type=harness.int_list, help="comma-separated sizes (default "
        f"{harness.joined(FULL['n'])})")  # fmt: skip
    add("--sites", type=harness.int_list, help="comma-separated call-site counts "
        f"(default {harness.joined(FULL['sites'])})")  # fmt: skip
    add("--layers", type=int, help=f"layers of the expensive operator (default "
        f"{FULL['layers']}; fewer where the weights would exceed 256 MiB)")  # fmt: skip
    add("--kinds", type=names(cases.KINDS), default=cases.KINDS, help="cheap,expensive")
    add("--workloads", type=names(cases.WORKLOADS), default=cases.WORKLOADS,
        help="mv,solve")  # fmt: skip
    add("--repeats", type=int, default=1, help="fresh-operator repeats per (case, "
        "variant), the median total kept (default 1)")  # fmt: skip
    add("--no-sites-check", action="store_true",
        help="skip the separate k=16 / k=1 compile measurement")  # fmt: skip
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    args.n, args.sites = tuple(sorted(set(args.n))), tuple(sorted(set(args.sites)))
    args.sites_check = None
    if not args.no_sites_check:
        args.sites_check = dict(QUICK_SITES_CHECK if args.quick else SITES_CHECK)
        if args.quick and args.layers != QUICK["layers"]:
            args.sites_check["layers"] = args.layers
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Warm up, measure the grid and the call sites, print the tables, write
    `auto.json` and `auto.png`."""
    args = parse_args(argv)
    start = time.perf_counter()
    env = harness.environment(load_average=True)
    config = cases.config(args)
    harness.print_setup(env, config)
    capped = {n: L for n, L in config["layers_per_n"].items() if L < args.layers}
    if "expensive" in args.kinds and capped:
        which = ", ".join(f"n={n}: L={layers}" for n, layers in capped.items())
        cap = f"{cases.WEIGHT_CAP_BYTES // 2**20} MiB"
        print(f"expensive operator: fewer layers where the weights would exceed {cap}: "
              + which)  # fmt: skip
    cases.warm_up()
    print(f"warm-up done ({time.perf_counter() - start:.1f} s)", flush=True)
    rows = cases.run_grid(args)
    check = None
    if args.sites_check is not None:
        print("  separate call-site measurement", flush=True)
        check = cases.sites_check(**args.sites_check, repeats=args.repeats)
        check.update(target=TARGET_SITES, met=check["Auto"]["ratio"] <= TARGET_SITES)
    summary = summarise(rows)
    elapsed = time.perf_counter() - start
    env["load_average_end"] = harness.load_average_now()
    print(format_results(rows, summary, check))
    print(
        f"total benchmark time: {elapsed:.1f} s; load average at start "
        f"{env['load_average']}, at end {env['load_average_end']}"
    )
    payload = dict(
        environment=env, config=config, cases=rows, summary=summary,
        worst_cases=cases.worst_cases(rows), sites_check=check, total_seconds=elapsed,
    )  # fmt: skip
    harness.write_results(
        args.out, "auto", payload, lambda path: plot(rows, summary, check, config, path)
    )


if __name__ == "__main__":
    main()
