"""Tables, summary and plot of `auto`: every case's scores (compile + runs x
run, for runs=1 and runs=100), Auto / best over the grid against its targets, the
worst cases, and the call-site ratio."""

import statistics
from pathlib import Path

from benchmarks._auto_grid import AUTOS, BASELINE, SCORES, VARIANTS
from benchmarks.harness import jax_label, plain_log_ticks, pyplot, save


TARGET_MEDIAN = 1.05
TARGET_WORST = 1.5
# Auto against plain lineax where plain lineax is the best.
TARGET_LINEAX = 1.05
TARGET_SITES = 1.15
WORST_KEPT = 6


def _label(r: dict) -> str:
    return f"{r['kind']}/{r['workload']} n={r['n']} k={r['k']}"


def format_table(rows: list[dict], runs: int) -> str:
    key = str(runs)
    header = (
        f"{'kind':<10}{'work':<6}{'n':>5}{'L':>4}{'k':>4}"
        + "".join(f"{v:>12}" for v in VARIANTS)
        + f"  {'best':<12}{'Auto chose':<12}{'Auto/best':>10}{'lineax/best':>12}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        s = r["scores"][key]
        cells = [
            f"{s['totals'][v]:>11.3f}s" if v in s["totals"] else f"{'skip':>12}"
            for v in VARIANTS
        ]
        mark = "" if s["auto_picked_best"] else " *"
        lines.append(
            f"{r['kind']:<10}{r['workload']:<6}{r['n']:>5}{r['layers']:>4}{r['k']:>4}"
            + "".join(cells)
            + f"  {s['best']:<12}{s['auto_choice']:<12}"
            f"{s['auto_over_best']:>9.2f}x{s['lineax_over_best']:>11.2f}x{mark}"
        )
    return "\n".join(lines)


def summarise(rows: list[dict]) -> dict:
    """Per score: median and worst Auto / best, and Auto / lineax where plain
    lineax is the best."""
    out = {}
    for runs in SCORES:
        key = str(runs)
        scores = [r["scores"][key] for r in rows]
        ratios = [s["auto_over_best"] for s in scores]
        worst = max(range(len(rows)), key=lambda i: ratios[i])
        lineax_best = [s["auto_over_lineax"] for s in scores if s["best"] == BASELINE]
        out[key] = dict(
            cases=len(rows),
            median_auto_over_best=statistics.median(ratios),
            worst_auto_over_best=ratios[worst],
            worst_case=_label(rows[worst]),
            auto_picked_best=sum(s["auto_picked_best"] for s in scores),
            median_lineax_over_best=statistics.median(
                [s["lineax_over_best"] for s in scores]
            ),
            lineax_best_cases=len(lineax_best),
            worst_auto_over_lineax_where_lineax_best=max(lineax_best, default=None),
            median_target=TARGET_MEDIAN,
            worst_target=TARGET_WORST,
            lineax_target=TARGET_LINEAX,
            median_met=bool(statistics.median(ratios) <= TARGET_MEDIAN),
            worst_met=bool(ratios[worst] <= TARGET_WORST),
            lineax_met=bool(max(lineax_best, default=0.0) <= TARGET_LINEAX),
        )
    return out


def worst_cases(rows: list[dict], count: int = WORST_KEPT) -> dict:
    """Per score, the cases with the largest Auto / best, with every variant's
    measured times and Auto's decisions (reasons and estimates)."""
    out = {}
    for runs in SCORES:
        key = str(runs)
        ordered = sorted(
            rows, key=lambda r: r["scores"][key]["auto_over_best"], reverse=True
        )[:count]
        cases = []
        for r in ordered:
            s = r["scores"][key]
            auto = r["results"][s["auto"]]
            cases.append(
                dict(
                    case=f"{_label(r)} L={r['layers']}",
                    auto_over_best=s["auto_over_best"],
                    best=s["best"],
                    auto_choice=s["auto_choice"],
                    scores=s["totals"],
                    measured_compile_total_s={
                        v: t["compile_total_s"] for v, t in r["results"].items()
                    },
                    measured_run_s={v: t["run_s"] for v, t in r["results"].items()},
                    skipped=r["skipped"],
                    decisions=auto["choice"].get("decisions", []),
                )
            )
        out[key] = cases
    return out


_COLOURS = {
    "Lazy": "tab:blue",
    "Outline": "tab:orange",
    "Materialise": "tab:green",
    "Roll": "tab:purple",
}


def _panel(ax, rows: list[dict], summary: dict, runs: int) -> None:
    key = str(runs)
    markers = {"mv": "o", "solve": "s"}
    seen = set()
    ratios = [r["scores"][key]["auto_over_best"] for r in rows]
    for i, r in enumerate(rows):
        s = r["scores"][key]
        label = f"Auto chose {s['auto_choice']} ({r['workload']})"
        ax.scatter(
            i,
            s["auto_over_best"],
            c=_COLOURS.get(s["auto_choice"], "tab:gray"),
            marker=markers[r["workload"]],
            edgecolors="black" if not s["auto_picked_best"] else "none",
            s=40,
            label=None if label in seen else label,
            zorder=3,
        )
        seen.add(label)
    for target, colour, what in (
        (TARGET_MEDIAN, "tab:purple", "median"),
        (TARGET_WORST, "tab:red", "worst"),
    ):
        ax.axhline(target, color=colour, ls="--", lw=1, label=f"{target:g} ({what})")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(
        range(len(rows)),
        [f"{r['kind'][0]}/{r['workload']} {r['n']} k{r['k']}" for r in rows],
        rotation=90,
        fontsize=6,
    )
    ax.set_yscale("log")
    plain_log_ticks(ax)
    top, bottom = max(ratios + [TARGET_WORST]), min(ratios + [1.0])
    ax.set_ylim(bottom / 1.1, top * 2.2)  # head room for the legend
    ax.set_yticks(
        [
            t
            for t in (0.5, 0.75, 1, 1.05, 1.5, 2, 3, 5, 10, 20)
            if bottom / 1.1 <= t <= top * 2.2
        ]
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


def plot(rows: list[dict], summary: dict, check: dict | None, config: dict, path: Path):
    plt = pyplot()
    fig, axes = plt.subplots(
        1, 3, figsize=(17, 4.8), gridspec_kw=dict(width_ratios=(3, 3, 1))
    )
    for ax, runs in zip(axes[:2], SCORES):
        _panel(ax, rows, summary, runs)
    right = axes[2]
    if check is not None:
        names = [BASELINE, AUTOS[-1]]
        values = [check[v]["ratio"] for v in names]
        right.bar(names, values, color=["tab:gray", "tab:blue"])
        right.axhline(
            TARGET_SITES, color="tab:red", ls="--", lw=1, label=f"{TARGET_SITES} target"
        )
        right.set_title(
            f"compile total k={check['sites'][-1]} / k={check['sites'][0]}\n"
            f"expensive mv, n={check['n']}, L={check['layers']}",
            fontsize=9,
        )
        right.legend(fontsize=7)
        right.grid(True, axis="y", alpha=0.3)
    else:
        right.axis("off")
    fig.suptitle(
        f"lxd.jit + Auto vs fixed policies and plain lineax; {jax_label()}, "
        f"layers<={config['layers']}",
        fontsize=10,
    )
    save(fig, path)


def format_results(rows: list[dict], summary: dict, check: dict | None) -> str:
    """The tables, the skipped measurements, Auto / best over the grid and the
    call-site ratio."""
    lines = []
    for runs in SCORES:
        sm = summary[str(runs)]
        lines += [
            "",
            f"score = compile (with the first call's extra) + {runs} x run, seconds; "
            f"Auto is Auto(runs={runs}); * = Auto did not pick the best",
            format_table(rows, runs),
            f"runs={runs}: Auto / best over {sm['cases']} cases: median "
            f"{sm['median_auto_over_best']:.2f}x (target <= {TARGET_MEDIAN}: "
            f"{'met' if sm['median_met'] else 'NOT met'}), worst "
            f"{sm['worst_auto_over_best']:.2f}x at {sm['worst_case']} (target <= "
            f"{TARGET_WORST}: {'met' if sm['worst_met'] else 'NOT met'}); Auto picked "
            f"the best in {sm['auto_picked_best']} of {sm['cases']}; where plain "
            f"lineax is the best ({sm['lineax_best_cases']} cases) Auto / lineax at "
            f"worst {sm['worst_auto_over_lineax_where_lineax_best'] or 0:.2f}x "
            f"(target <= {TARGET_LINEAX}: {'met' if sm['lineax_met'] else 'NOT met'})",
        ]
    skipped = [(r, v, why) for r in rows for v, why in r["skipped"].items()]
    if skipped:
        lines.append("\nskipped:")
        for r, v, why in skipped:
            lines.append(f"  {_label(r)} {v}: {why}")
    if check is not None:
        first, last = check["sites"][0], check["sites"][-1]
        auto = AUTOS[-1]
        lines.append(
            f"call sites (expensive mv, n={check['n']}, L={check['layers']}): compile "
            f"total k={last} / k={first}: Auto {check[auto]['ratio']:.2f}x (target <= "
            f"{TARGET_SITES}: {'met' if check['met'] else 'NOT met'}; chose "
            + ", ".join(
                f"k={k}: {t['choice']['strategy']}"
                for k, t in check[auto]["results"].items()
            )
            + f"), plain lineax {check[BASELINE]['ratio']:.2f}x"
        )
    return "\n".join(lines)
