"""The report of `solvers` (its companion: the benchmark alone would be some 580
lines): per pair, the ratios of ours over lineax, the acceptance criteria, the
text tables and the plot."""

from benchmarks import harness


SIDES = ("lineax", "ours")
ACCEPTANCE = dict(solvers=("cg", "bicgstab"), compile_ratio=0.6, run_ratio=1.05)


def add_ratios(row: dict, bare_mv: dict) -> None:
    """Ours over lineax (compile, run, run per step) and each side over one bare
    mv (compile)."""
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
    for t in (lin, ours):
        t["compile_over_bare_mv"] = t["compile_total_s"] / bare_mv["compile_total_s"]


def acceptance(results: dict) -> dict:
    """For CG and BiCGStab: the compile and run ratios against `ACCEPTANCE`."""
    out = {}
    for key in (k for k in ACCEPTANCE["solvers"] if k in results):
        compile_ratio = results[key]["compile_ratio_ours_over_lineax"]
        run_ratio = results[key]["run_ratio_ours_over_lineax"]
        compile_ok = compile_ratio <= ACCEPTANCE["compile_ratio"]
        run_ok = run_ratio <= ACCEPTANCE["run_ratio"]
        out[key] = dict(
            compile_ratio=compile_ratio,
            run_ratio=run_ratio,
            compile_met=bool(compile_ok),
            run_met=bool(run_ok),
            met=bool(compile_ok and run_ok),
        )
    return out


def _copies(t: dict, layers: int) -> str:
    m = t["matmuls_in_hlo"]
    return "?" if m < 0 else f"{m / (2 * layers):g}"


def format_table(results: dict) -> str:
    """Per pair: both sides' compile and run, their ratios, steps, f traces,
    compile over a bare mv and the copies of `mv` in the HLO."""
    both = lambda f: lambda r: f"{f(r['lineax'])}/{f(r['ours'])}"  # noqa: E731
    columns = (
        ("solver", lambda r: r["key"]),
        ("lineax compile s", lambda r: f"{r['lineax']['compile_total_s']:.3f}"),
        ("ours compile s", lambda r: f"{r['ours']['compile_total_s']:.3f}"),
        ("ours/lineax", lambda r: f"{r['compile_ratio_ours_over_lineax']:.2f}x"),
        ("lineax run ms", lambda r: f"{r['lineax']['run_s'] * 1e3:.1f}"),
        ("ours run ms", lambda r: f"{r['ours']['run_s'] * 1e3:.1f}"),
        ("ours/lineax", lambda r: f"{r['run_ratio_ours_over_lineax']:.3f}x"),
        ("steps (lineax/ours)", both(lambda t: t["num_steps"])),
        ("f traces (lineax/ours)", both(lambda t: t["f_traces"]["total"])),
        (
            "compile / bare mv (lineax, ours)",
            lambda r: ", ".join(f"{r[s]['compile_over_bare_mv']:.1f}x" for s in SIDES),
        ),
        (
            "mv copies in HLO (lineax/ours)",
            lambda r: both(lambda t: _copies(t, r["layers"]))(r),
        ),
    )
    rows = [dict(row, key=key) for key, row in results.items()]
    return harness.column_table(columns, rows)


def format_details(results: dict) -> str:
    """Per solver: the timing stages, result, residual and every compile total."""
    columns = [("solver", lambda t: t["key"]), ("side", lambda t: t["side"])]
    columns += harness.stage_columns()
    columns += [
        ("run", lambda t: f"{t['run_s'] * 1e3:.1f} ms"),
        ("run/step", lambda t: f"{t['run_per_step_s'] * 1e3:.3f} ms"),
        ("runs", lambda t: t["runs"]),
        ("result", lambda t: t["result"]),
        ("rel.resid", lambda t: f"{t['relative_residual']:.1e}"),
        (
            "all compile totals (s)",
            lambda t: ", ".join(f"{c:.2f}" for c in t["compile_total_all_s"]),
        ),
    ]
    items = [
        dict(row[side], key=key, side=side)
        for key, row in results.items()
        for side in SIDES
    ]
    return harness.column_table(columns, items)


def format_summary(results, bare_mv, layers: int, accept, not_measured) -> str:
    """The bare mv, each pair's solution difference and run-per-step ratio, the
    acceptance criteria and the pairs not measured."""
    lines = [
        f"\nbare mv: compile total {bare_mv['compile_total_s']:.3f} s, "
        f"run {bare_mv['run_s'] * 1e3:.2f} ms, {bare_mv['matmuls_in_hlo']} matmuls "
        f"in HLO ({2 * layers} per mv)"
    ]
    lines += [
        f"{key}: |x_ours - x_lineax| / |x_lineax| = "
        f"{row['relative_difference_ours_vs_lineax']:.1e}; run per step ours/lineax "
        f"{row['run_per_step_ratio_ours_over_lineax']:.3f}x"
        for key, row in results.items()
    ]
    lines += [
        f"acceptance {key}: compile {a['compile_ratio']:.2f}x "
        f"(<= {ACCEPTANCE['compile_ratio']}: {harness.met(a['compile_met'])}), "
        f"run {a['run_ratio']:.3f}x "
        f"(<= {ACCEPTANCE['run_ratio']}: {harness.met(a['run_met'])})"
        for key, a in accept.items()
    ]
    lines += [f"not measured: {key} ({why})" for key, why in not_measured.items()]
    return "\n".join(lines)


def plot(results: dict, bare_mv: dict, config: dict, path) -> None:
    """Compile total (labelled with f traces) and run time (labelled with steps)
    per pair, both sides, against one bare mv."""
    plt = harness.pyplot()
    keys = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(max(11, 2.0 * len(keys) + 5), 4.8))
    width, xs = 0.38, range(len(keys))
    panels = (
        (
            "compile_total_s",
            1.0,
            "compile total (trace+lower+compile+first-call extra)",
            "seconds",
            "--",
        ),  # fmt: skip
        ("run_s", 1e3, "run time per solve (median)", "milliseconds", ":"),
    )
    for ax, (field, scale, title, ylabel, line) in zip(axes, panels):
        for offset, side, label in ((-1, "lineax", "lineax"), (1, "ours", "lineax-dispatch")):  # fmt: skip
            values = [results[k][side][field] * scale for k in keys]
            bars = ax.bar([x + offset * width / 2 for x in xs], values, width, label=label)  # fmt: skip
            if field == "compile_total_s":
                labels = [f"{results[k][side]['f_traces']['total']}f" for k in keys]
            else:
                labels = [f"{results[k][side]['num_steps']} st" for k in keys]
            ax.bar_label(bars, labels=labels, fontsize=7)
        ax.set_xticks(list(xs), [results[k]["label"] for k in keys], fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        bare = bare_mv[field] * scale
        shown = f"{bare:.2f} s" if field == "compile_total_s" else f"{bare:.3g} ms"
        ax.axhline(bare, color="k", linestyle=line, linewidth=1, label=f"one bare mv ({shown})")  # fmt: skip
        ax.legend(fontsize=8)
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
        f"{harness.jax_label(openblas=True)}",
        fontsize=10,
    )
    harness.save(fig, path, rect=(0, 0.03, 1, 1))
