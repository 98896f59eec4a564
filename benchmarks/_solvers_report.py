"""Tables and plot of `solvers.py`: per pair, compile totals and run times of
both sides, their ratios, and the acceptance criteria."""

from pathlib import Path

from _plotting import jax_label, openblas_label, pyplot, save
from _solvers_pairs import SIDES


ACCEPTANCE = dict(solvers=("cg", "bicgstab"), compile_ratio=0.6, run_ratio=1.05)


def add_ratios(row: dict, bare_mv: dict) -> None:
    lin, ours = row["lineax"], row["ours"]
    row["compile_ratio_ours_over_lineax"] = (
        ours["compile_total_s"] / lin["compile_total_s"]
    )
    row["run_ratio_ours_over_lineax"] = ours["run_s"] / lin["run_s"]
    # The two sides may stop at different steps (float32 rounding in the stopping
    # test): the run time per step separates the cost of a step from that.
    row["run_per_step_ratio_ours_over_lineax"] = (
        ours["run_per_step_s"] / lin["run_per_step_s"]
    )
    for side in SIDES:
        t = row[side]
        t["compile_over_bare_mv"] = t["compile_total_s"] / bare_mv["compile_total_s"]


def acceptance(results: dict) -> dict:
    out = {}
    for key in ACCEPTANCE["solvers"]:
        if key not in results:
            continue
        row = results[key]
        compile_ratio = row["compile_ratio_ours_over_lineax"]
        compile_ok = compile_ratio <= ACCEPTANCE["compile_ratio"]
        run_ok = row["run_ratio_ours_over_lineax"] <= ACCEPTANCE["run_ratio"]
        out[key] = dict(
            compile_ratio=compile_ratio,
            run_ratio=row["run_ratio_ours_over_lineax"],
            compile_met=bool(compile_ok),
            run_met=bool(run_ok),
            met=bool(compile_ok and run_ok),
        )
    return out


def format_table(results: dict) -> str:
    columns = (
        ("solver", 9),
        ("lineax compile s", 17),
        ("ours compile s", 15),
        ("ours/lineax", 12),
        ("lineax run ms", 14),
        ("ours run ms", 12),
        ("ours/lineax", 12),
        ("steps (lineax/ours)", 20),
        ("f traces (lineax/ours)", 23),
        ("compile / bare mv (lineax, ours)", 33),
        ("mv copies in HLO (lineax/ours)", 31),
    )
    header = " | ".join(
        f"{title:<{width}}" if i == 0 else f"{title:>{width}}"
        for i, (title, width) in enumerate(columns)
    )
    lines = [header, "-" * len(header)]
    for key, row in results.items():
        lin, ours = row["lineax"], row["ours"]

        def copies(t, layers=row["layers"]):
            m = t["matmuls_in_hlo"]
            return "?" if m < 0 else f"{m / (2 * layers):g}"

        cells = (
            key,
            f"{lin['compile_total_s']:.3f}",
            f"{ours['compile_total_s']:.3f}",
            f"{row['compile_ratio_ours_over_lineax']:.2f}x",
            f"{lin['run_s'] * 1e3:.1f}",
            f"{ours['run_s'] * 1e3:.1f}",
            f"{row['run_ratio_ours_over_lineax']:.3f}x",
            f"{lin['num_steps']}/{ours['num_steps']}",
            f"{lin['f_traces']['total']}/{ours['f_traces']['total']}",
            f"{lin['compile_over_bare_mv']:.1f}x, {ours['compile_over_bare_mv']:.1f}x",
            f"{copies(lin)}/{copies(ours)}",
        )
        lines.append(
            " | ".join(
                f"{cell:<{width}}" if i == 0 else f"{cell:>{width}}"
                for i, (cell, (_, width)) in enumerate(zip(cells, columns))
            )
        )
    return "\n".join(lines)


def format_details(results: dict) -> str:
    header = (
        f"{'solver':<9}{'side':<8}{'trace':>9}{'lower':>9}{'compile':>9}"
        f"{'1st-extra':>11}{'comp.total':>12}{'run':>11}{'run/step':>11}{'runs':>6}"
        f"  {'result':<18}{'rel.resid':>10}  all compile totals (s)"
    )
    lines = [header, "-" * len(header)]
    for key, row in results.items():
        for side in SIDES:
            t = row[side]
            lines.append(
                f"{key:<9}{side:<8}{t['trace_s']:>8.3f}s{t['lower_s']:>8.3f}s"
                f"{t['compile_s']:>8.3f}s{t['first_call_extra_s']:>10.3f}s"
                f"{t['compile_total_s']:>11.3f}s{t['run_s'] * 1e3:>8.1f} ms"
                f"{t['run_per_step_s'] * 1e3:>8.3f} ms{t['runs']:>6}  {t['result']:<18}"
                f"{t['relative_residual']:>10.1e}  "
                + ", ".join(f"{c:.2f}" for c in t["compile_total_all_s"])
            )
    return "\n".join(lines)


def plot(results: dict, bare_mv: dict, config: dict, path: Path) -> None:
    plt = pyplot()
    keys = list(results)
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(11, 2.0 * len(keys) + 5), 4.8))
    width = 0.38
    xs = range(len(keys))
    for ax, field, scale, title, ylabel in (
        (
            left,
            "compile_total_s",
            1.0,
            "compile total (trace+lower+compile+first-call extra)",
            "seconds",
        ),
        (right, "run_s", 1e3, "run time per solve (median)", "milliseconds"),
    ):
        for offset, side, label in (
            (-width / 2, "lineax", "lineax"),
            (width / 2, "ours", "lineax-dispatch"),
        ):
            values = [results[k][side][field] * scale for k in keys]
            bars = ax.bar([x + offset for x in xs], values, width, label=label)
            if field == "compile_total_s":
                ax.bar_label(
                    bars,
                    labels=[f"{results[k][side]['f_traces']['total']}f" for k in keys],
                    fontsize=7,
                )
            else:
                ax.bar_label(
                    bars,
                    labels=[f"{results[k][side]['num_steps']} st" for k in keys],
                    fontsize=7,
                )
        ax.set_xticks(list(xs), [results[k]["label"] for k in keys], fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    left.axhline(
        bare_mv["compile_total_s"],
        color="k",
        linestyle="--",
        linewidth=1,
        label=f"one bare mv ({bare_mv['compile_total_s']:.2f} s)",
    )
    right.axhline(
        bare_mv["run_s"] * 1e3,
        color="k",
        linestyle=":",
        linewidth=1,
        label=f"one bare mv ({bare_mv['run_s'] * 1e3:.3g} ms)",
    )
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.text(
        0.5,
        0.005,
        "bar labels: f = runs of the Python function while compiling (small operator, "
        "closure_convert=False); st = solver steps",
        ha="center",
        fontsize=7,
    )
    fig.suptitle(
        f"SPD {config['layers']}-layer (x2) n={config['n']} float32 "
        f"FunctionLinearOperator, rtol=atol={config['rtol']:g}, "
        f"max_steps={config['max_steps']}\n"
        f"{jax_label()}, {openblas_label()}",
        fontsize=10,
    )
    save(fig, path, rect=(0, 0.03, 1, 1))


def format_summary(
    results: dict, bare_mv: dict, layers: int, accept: dict, not_measured: dict
) -> str:
    """The bare mv, each pair's solution difference and run-per-step ratio, the
    acceptance criteria and the pairs not measured."""
    lines = [
        f"\nbare mv: compile total {bare_mv['compile_total_s']:.3f} s, "
        f"run {bare_mv['run_s'] * 1e3:.2f} ms, {bare_mv['matmuls_in_hlo']} matmuls "
        f"in HLO ({2 * layers} per mv)"
    ]
    for key, row in results.items():
        lines.append(
            f"{key}: |x_ours - x_lineax| / |x_lineax| = "
            f"{row['relative_difference_ours_vs_lineax']:.1e}; "
            "run per step ours/lineax "
            f"{row['run_per_step_ratio_ours_over_lineax']:.3f}x"
        )
    for key, a in accept.items():
        lines.append(
            f"acceptance {key}: compile {a['compile_ratio']:.2f}x "
            f"(<= {ACCEPTANCE['compile_ratio']}: "
            f"{'met' if a['compile_met'] else 'NOT met'}), run {a['run_ratio']:.3f}x "
            f"(<= {ACCEPTANCE['run_ratio']}: {'met' if a['run_met'] else 'NOT met'})"
        )
    for key, why in not_measured.items():
        lines.append(f"not measured: {key} ({why})")
    return "\n".join(lines)
