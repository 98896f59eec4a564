"""Scoring and reporting `benchmarks.auto`'s grid: each case's scores (compile
total + runs x run) against the best fixed policy and plain lineax, the summary
against the targets, the text tables and the plot."""

from statistics import median

from benchmarks import harness


# The variants: the fixed policies, plain lineax, Auto(runs=1) and Auto() (runs=100).
FIXED, BASELINE = ("Lazy", "Outline", "Materialise", "Roll"), "lineax"
AUTOS = ("Auto1", "Auto")
VARIANTS = FIXED + (BASELINE,) + AUTOS
# With `--twin`: plain lineax measured a second time each round, a program identical
# to the baseline's. Never a candidate for the best; its ratio to the baseline is
# the spread of identical measurements (`stage_gaps`).
TWIN = "lineax twin"
# The scores (compile total + runs x run) and the Auto variant told that many runs.
SCORES, AUTO_FOR = (1, 100), {1: "Auto1", 100: "Auto"}
# Auto / best (median, worst); Auto / plain lineax where plain lineax is the best.
TARGET_MEDIAN, TARGET_WORST, TARGET_LINEAX = 1.05, 1.5, 1.05
# The stages of a measurement (trace to first call), recorded per round.
STAGES = ("trace_s", "lower_s", "compile_s", "first_call_s")


def label(case: dict) -> str:
    """`kind/workload n=.. k=..` of a case (or of a row of the results)."""
    return f"{case['kind']}/{case['workload']} n={case['n']} k={case['k']}"


def score(timings: dict, runs: int) -> float:
    """Compile (with the first call's extra) plus `runs` runs."""
    return timings["compile_total_s"] + runs * timings["run_s"]


def paired_ratios(a: dict, b: dict, runs: int) -> list[float]:
    """Per round, `a`'s score over `b`'s in the same round (each round's compile
    total, plus `runs` x the variant's median run)."""
    pairs = zip(a["compile_total_all_s"], b["compile_total_all_s"])
    return [(ca + runs * a["run_s"]) / (cb + runs * b["run_s"]) for ca, cb in pairs]


def paired_ratio(a: dict, b: dict, runs: int) -> float:
    """The median over rounds of `paired_ratios`: a slow spell of the machine falls
    on both halves of a ratio, not on one variant's median."""
    return median(paired_ratios(a, b, runs))


def quartiles(values: list[float]) -> tuple[float, float]:
    """The lower and upper quartiles of `values` (the middle half lies between)."""
    ordered = sorted(values)
    last = len(ordered) - 1
    return ordered[round(last / 4)], ordered[round(3 * last / 4)]


def row_score(results: dict, runs: int) -> dict:
    """At one score: the best fixed policy (plain lineax among the candidates) and
    Auto (told that number of runs) against it, as a ratio of the variants' median
    scores and as `paired_ratio`."""
    totals = {v: score(t, runs) for v, t in results.items()}
    best = min((v for v in FIXED + (BASELINE,) if v in totals), key=totals.get)
    auto, choice = AUTO_FOR[runs], results[AUTO_FOR[runs]]["choice"]["strategy"]
    paired = lambda a, b: paired_ratio(results[a], results[b], runs)
    return dict(
        totals=totals, best=best, best_s=totals[best], auto=auto, auto_choice=choice,
        auto_over_best=totals[auto] / totals[best],
        lineax_over_best=totals[BASELINE] / totals[best],
        auto_over_lineax=totals[auto] / totals[BASELINE],
        auto_over_best_paired=paired(auto, best),
        auto_over_lineax_paired=paired(auto, BASELINE),
        auto_picked_best=choice == best or (best == BASELINE and choice == "Lazy"),
    )  # fmt: skip


def summarise(rows: list[dict]) -> dict:
    """Per score: Auto / best (median, worst), Auto / lineax where lineax is best."""
    out = {}
    for key in map(str, SCORES):
        scores = [r["scores"][key] for r in rows]
        ratios = [s["auto_over_best"] for s in scores]
        worst = max(range(len(rows)), key=lambda i: ratios[i])
        lineax = [s["auto_over_lineax"] for s in scores if s["best"] == BASELINE]
        lineax_paired = [
            s["auto_over_lineax_paired"] for s in scores if s["best"] == BASELINE
        ]
        paired = [s["auto_over_best_paired"] for s in scores]
        out[key] = dict(
            cases=len(rows), median_auto_over_best=median(ratios),
            worst_auto_over_best=ratios[worst], worst_case=label(rows[worst]),
            auto_picked_best=sum(s["auto_picked_best"] for s in scores),
            median_lineax_over_best=median([s["lineax_over_best"] for s in scores]),
            lineax_best_cases=len(lineax),
            worst_auto_over_lineax_where_lineax_best=max(lineax, default=None),
            median_auto_over_best_paired=median(paired),
            worst_auto_over_best_paired=max(paired),
            worst_auto_over_lineax_where_lineax_best_paired=max(
                lineax_paired, default=None
            ),
        )  # fmt: skip
    return out


def stage_gaps(rows: list[dict]) -> list[dict]:
    """Where plain lineax is the best at some score: by how much each stage of
    `Lazy`, of the Auto told that score's runs and of the twin (where measured)
    takes longer than plain lineax's, the median over rounds of the difference
    within a round (milliseconds), and the paired ratio of their scores with its
    quartiles over the rounds."""
    out = []
    for r in rows:
        for key in map(str, SCORES):
            s = r["scores"][key]
            if s["best"] != BASELINE:
                continue
            base = r["results"][BASELINE]
            for variant in ("Lazy", s["auto"], TWIN):
                got = r["results"].get(variant)
                if got is None:  # skipped at this k
                    continue
                gaps = {
                    stage: 1e3 * median(
                        a - b for a, b in zip(
                            got["stages_all_s"][stage], base["stages_all_s"][stage]
                        )
                    )
                    for stage in STAGES
                }  # fmt: skip
                ratios = paired_ratios(got, base, int(key))
                out.append(dict(case=label(r), runs=int(key), variant=variant,
                                gap_ms=gaps, over_lineax_paired=median(ratios),
                                over_lineax_quartiles=quartiles(ratios)))  # fmt: skip
    return out


def format_gaps(gaps: list[dict]) -> str:
    """`stage_gaps` as a table (empty where plain lineax is nowhere the best)."""
    if not gaps:
        return ""
    headers = ["case", "runs", "variant", *(s[:-2] for s in STAGES), "/lineax"]
    headers.append("quartiles")
    cells = [[g["case"], g["runs"], g["variant"],
              *(f"{g['gap_ms'][s]:+.1f}ms" for s in STAGES),
              f"{g['over_lineax_paired']:.3f}x",
              "{:.3f}-{:.3f}".format(*g["over_lineax_quartiles"])]
             for g in gaps]  # fmt: skip
    return (
        "\nwhere plain lineax is the best: each stage's time over plain lineax's "
        "(median over rounds of the difference within a round) and the score "
        "over plain lineax's, paired by round (median, and the quartiles over the "
        f"rounds; `{TWIN}`: the same program as plain lineax's, measured again)\n"
        + harness.table(headers, cells)
    )


def format_results(rows: list[dict], summary: dict) -> str:
    """Per score a table of each case (variants' scores, the best, Auto's choice
    and ratios) and the summary; then the skipped measurements."""
    headers = ["kind", "work", "n", "L", "k", *VARIANTS, "best", "Auto chose"]
    headers += ["Auto/best", "lineax/best"]
    lines = []
    for key, sm in summary.items():
        cells = []
        for r in rows:
            s = r["scores"][key]
            totals = [f"{s['totals'][v]:.3f}s" if v in s["totals"] else "skip"
                      for v in VARIANTS]  # fmt: skip
            mark = "" if s["auto_picked_best"] else " *"
            cells.append([r["kind"], r["workload"], r["n"], r["layers"], r["k"],
                          *totals, s["best"], s["auto_choice"],
                          f"{s['auto_over_best']:.2f}x",
                          f"{s['lineax_over_best']:.2f}x{mark}"])  # fmt: skip
        ok = lambda v, limit: f"{v:.2f}x (<= {limit}: {harness.met(v <= limit)})"
        lineax = sm["worst_auto_over_lineax_where_lineax_best"] or 0
        lineax_paired = sm["worst_auto_over_lineax_where_lineax_best_paired"] or 0
        lines += [
            f"\nscore = compile (with the first call's extra) + {key} x run, seconds; "
            f"Auto is Auto(runs={key}); * = Auto did not pick the best",
            harness.table(headers, cells),
            f"runs={key}, {sm['cases']} cases: Auto / best median "
            f"{ok(sm['median_auto_over_best'], TARGET_MEDIAN)}, worst "
            f"{ok(sm['worst_auto_over_best'], TARGET_WORST)} at {sm['worst_case']}; "
            f"Auto picked the best in {sm['auto_picked_best']}; where plain lineax is "
            f"the best ({sm['lineax_best_cases']} cases) Auto / lineax at worst "
            f"{ok(lineax, TARGET_LINEAX)}",
            f"paired by round: Auto / best median "
            f"{ok(sm['median_auto_over_best_paired'], TARGET_MEDIAN)}, worst "
            f"{ok(sm['worst_auto_over_best_paired'], TARGET_WORST)}; Auto / lineax "
            f"where plain lineax is the best, at worst "
            f"{ok(lineax_paired, TARGET_LINEAX)}",
        ]
    skipped = [f"  {label(r)} {v}: {why}" for r in rows
               for v, why in r["skipped"].items()]  # fmt: skip
    return "\n".join(lines + (["\nskipped:"] + skipped if skipped else []))


COLOURS = dict(zip(FIXED, ("tab:blue", "tab:orange", "tab:green", "tab:purple")))
TARGETS = ((TARGET_MEDIAN, "median", "tab:purple"), (TARGET_WORST, "worst", "tab:red"))
TICKS = (0.5, 0.75, 1, 1.05, 1.5, 2, 3, 5, 10, 20)


def plot(rows: list[dict], summary: dict, config: dict, path) -> None:
    """Auto / best per case at each score, coloured by what Auto chose (squares:
    solves; a black edge: Auto did not pick the best)."""
    plt = harness.pyplot()
    fig, axes = plt.subplots(1, len(SCORES), figsize=(15, 4.8))
    for ax, runs in zip(axes, SCORES):
        key, seen = str(runs), set()
        scores = [r["scores"][key] for r in rows]
        for i, (r, s) in enumerate(zip(rows, scores)):
            name = f"Auto chose {s['auto_choice']} ({r['workload']})"
            edge = "none" if s["auto_picked_best"] else "black"
            marker = "o" if r["workload"] == "mv" else "s"
            colour = COLOURS.get(s["auto_choice"], "tab:gray")
            ax.scatter(i, s["auto_over_best"], 40, colour, marker=marker, zorder=3,
                       edgecolors=edge, label=None if name in seen else name)  # fmt: skip
            seen.add(name)
        for y, what, colour in TARGETS:
            ax.axhline(y, color=colour, ls="--", lw=1, label=f"{y:g} ({what})")
        ax.axhline(1.0, color="black", lw=0.6)
        ticks = [f"{r['kind'][0]}/{r['workload']} {r['n']} k{r['k']}" for r in rows]
        ax.set_xticks(range(len(rows)), ticks, rotation=90, fontsize=6)
        ratios = [s["auto_over_best"] for s in scores]
        # Head room for the legend above the largest ratio.
        ylim = (min(ratios + [1.0]) / 1.1, max(ratios + [TARGET_WORST]) * 2.2)
        harness.log_axis(ax, ylim, TICKS)
        ax.set_ylabel(f"Auto / best, compile + {runs} x run")
        sm = summary[key]
        ax.set_title(f"runs={runs}: median {sm['median_auto_over_best']:.2f}, worst "
                     f"{sm['worst_auto_over_best']:.2f} (black edge: not the best)",
                     fontsize=9)  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=3, loc="upper left")
    fig.suptitle(f"lxd.jit + Auto vs fixed policies and plain lineax; "
                 f"{harness.jax_label()}, layers<={config['layers']}")  # fmt: skip
    harness.save(fig, path)
