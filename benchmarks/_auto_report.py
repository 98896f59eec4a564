"""Tables, summary and plot of `auto.py`: every case's totals, Auto / best over
the grid against its targets, the worst cases, and the call-site ratio."""

import statistics
from pathlib import Path

from _auto_grid import AUTO, BASELINE, VARIANTS
from _plotting import jax_label, plain_log_ticks, pyplot, save


TARGET_MEDIAN = 1.15
TARGET_WORST = 2.0
TARGET_SITES = 1.3
WORST_KEPT = 6


def format_table(rows: list[dict]) -> str:
    header = (
        f"{'kind':<10}{'work':<6}{'n':>5}{'L':>4}{'k':>4}"
        + "".join(f"{v:>12}" for v in VARIANTS)
        + f"  {'best':<12}{'Auto chose':<12}{'Auto/best':>10}{'lineax/best':>12}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        cells = []
        for v in VARIANTS:
            if v in r["results"]:
                cells.append(f"{r['results'][v]['total_s']:>11.3f}s")
            else:
                cells.append(f"{'skip':>12}")
        mark = "" if r["auto_picked_best"] else " *"
        lines.append(
            f"{r['kind']:<10}{r['workload']:<6}{r['n']:>5}{r['layers']:>4}{r['k']:>4}"
            + "".join(cells)
            + f"  {r['best']:<12}{r['auto_choice']:<12}"
            f"{r['auto_over_best']:>9.2f}x{r['lineax_over_best']:>11.2f}x{mark}"
        )
    return "\n".join(lines)


def summarise(rows: list[dict]) -> dict:
    ratios = [r["auto_over_best"] for r in rows]
    worst = max(rows, key=lambda r: r["auto_over_best"])
    lineax = [r["lineax_over_best"] for r in rows]
    return dict(
        cases=len(rows),
        median_auto_over_best=statistics.median(ratios),
        worst_auto_over_best=worst["auto_over_best"],
        worst_case=f"{worst['kind']}/{worst['workload']} n={worst['n']} k={worst['k']}",
        auto_picked_best=sum(r["auto_picked_best"] for r in rows),
        median_lineax_over_best=statistics.median(lineax),
        median_target=TARGET_MEDIAN,
        worst_target=TARGET_WORST,
        median_met=bool(statistics.median(ratios) <= TARGET_MEDIAN),
        worst_met=bool(worst["auto_over_best"] <= TARGET_WORST),
    )


def worst_cases(rows: list[dict], count: int = WORST_KEPT) -> list[dict]:
    """The cases with the largest Auto / best, with every variant's measured
    totals and Auto's decisions (reasons and estimates)."""
    ordered = sorted(rows, key=lambda r: r["auto_over_best"], reverse=True)[:count]
    out = []
    for r in ordered:
        auto = r["results"][AUTO]
        out.append(
            dict(
                case=f"{r['kind']}/{r['workload']} n={r['n']} L={r['layers']} "
                f"k={r['k']}",
                auto_over_best=r["auto_over_best"],
                best=r["best"],
                auto_choice=r["auto_choice"],
                measured_total_s={v: t["total_s"] for v, t in r["results"].items()},
                measured_compile_total_s={
                    v: t["compile_total_s"] for v, t in r["results"].items()
                },
                measured_run_s={v: t["run_s"] for v, t in r["results"].items()},
                skipped=r["skipped"],
                decisions=auto["choice"].get("decisions", []),
            )
        )
    return out


def plot(rows: list[dict], summary: dict, check: dict | None, config: dict, path: Path):
    plt = pyplot()
    colours = {"Lazy": "tab:blue", "Outline": "tab:orange", "Materialise": "tab:green"}
    markers = {"mv": "o", "solve": "s"}
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(13, 4.8), gridspec_kw=dict(width_ratios=(3.2, 1))
    )
    seen = set()
    for i, r in enumerate(rows):
        choice = r["auto_choice"]
        label = f"Auto chose {choice} ({r['workload']})"
        left.scatter(
            i,
            r["auto_over_best"],
            c=colours.get(choice, "tab:gray"),
            marker=markers[r["workload"]],
            edgecolors="black" if not r["auto_picked_best"] else "none",
            s=45,
            label=None if label in seen else label,
            zorder=3,
        )
        seen.add(label)
    for target, colour, what in (
        (TARGET_MEDIAN, "tab:purple", "median"),
        (TARGET_WORST, "tab:red", "worst"),
    ):
        label = f"{target:g} ({what} target)"
        left.axhline(target, color=colour, ls="--", lw=1, label=label)
    left.axhline(1.0, color="black", lw=0.6)
    left.set_xticks(
        range(len(rows)),
        [f"{r['kind'][0]}/{r['workload']} {r['n']} k{r['k']}" for r in rows],
        rotation=90,
        fontsize=6,
    )
    left.set_yscale("log")
    plain_log_ticks(left)
    top = max([r["auto_over_best"] for r in rows] + [TARGET_WORST])
    bottom = min([r["auto_over_best"] for r in rows] + [1.0])
    # Head room for the legend.
    left.set_ylim(bottom / 1.1, top * 2.2)
    left.set_yticks(
        [
            t
            for t in (0.5, 0.75, 1, 1.15, 1.5, 2, 3, 5, 10, 20)
            if bottom / 1.1 <= t <= top * 2.2
        ]
    )
    left.set_ylabel("Auto total / best fixed total")
    left.set_title(
        f"Auto / best per case: median {summary['median_auto_over_best']:.2f}, "
        f"worst {summary['worst_auto_over_best']:.2f} (black edge: not the best)",
        fontsize=9,
    )
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7, ncol=3, loc="upper left")
    if check is not None:
        names = [BASELINE, AUTO]
        values = [check[v]["ratio"] for v in names]
        right.bar(names, values, color=["tab:gray", "tab:blue"])
        right.axhline(TARGET_SITES, color="tab:red", ls="--", lw=1, label="1.3 target")
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
        f"lxd.jit + Auto vs fixed policies, total = compile + one run; "
        f"{jax_label()}, layers<={config['layers']}",
        fontsize=10,
    )
    save(fig, path)


def format_results(rows: list[dict], summary: dict, check: dict | None) -> str:
    """The table, the skipped measurements, Auto / best over the grid and the
    call-site ratio."""
    lines = [
        "",
        "total seconds (compile + first-call extra + one run); * = Auto did not "
        "pick the best fixed policy",
        format_table(rows),
    ]
    skipped = [(r, v, why) for r in rows for v, why in r["skipped"].items()]
    if skipped:
        lines.append("\nskipped:")
        for r, v, why in skipped:
            lines.append(
                f"  {r['kind']}/{r['workload']} n={r['n']} k={r['k']} {v}: {why}"
            )
    lines.append(
        f"\nAuto / best over {summary['cases']} cases: median "
        f"{summary['median_auto_over_best']:.2f}x (target <= {TARGET_MEDIAN}: "
        f"{'met' if summary['median_met'] else 'NOT met'}), worst "
        f"{summary['worst_auto_over_best']:.2f}x at {summary['worst_case']} "
        f"(target <= {TARGET_WORST}: {'met' if summary['worst_met'] else 'NOT met'}); "
        f"Auto picked the best fixed policy in {summary['auto_picked_best']} of "
        f"{summary['cases']}; plain lineax / best: median "
        f"{summary['median_lineax_over_best']:.2f}x"
    )
    if check is not None:
        first, last = check["sites"][0], check["sites"][-1]
        lines.append(
            f"call sites (expensive mv, n={check['n']}, L={check['layers']}): compile "
            f"total k={last} / k={first}: Auto {check[AUTO]['ratio']:.2f}x (target <= "
            f"{TARGET_SITES}: {'met' if check['met'] else 'NOT met'}; chose "
            + ", ".join(
                f"k={k}: {t['choice']['strategy']}"
                for k, t in check[AUTO]["results"].items()
            )
            + f"), plain lineax {check[BASELINE]['ratio']:.2f}x"
        )
    return "\n".join(lines)
