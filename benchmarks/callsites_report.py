"""Reporting `benchmarks.callsites`'s results: compile total over the same variant
at the smallest k and over plain lineax at the same k, the text tables and the
plot of compile total and run per mv against k."""

from collections.abc import Sequence

from benchmarks import harness


# The reference variant: plain lineax.
BASELINE = "lineax"


def ratios(results: dict[str, list[dict]]) -> dict:
    """Compile total over the same variant at the smallest k, and over plain
    lineax at the same k."""
    base = {r["k"]: r["compile_total_s"] for r in results[BASELINE]}
    out = {}
    for name, rows in results.items():
        first = rows[0]["compile_total_s"]
        out[name] = {
            "vs_own_first_k": {r["k"]: r["compile_total_s"] / first for r in rows},
            "vs_lineax_same_k": {
                r["k"]: r["compile_total_s"] / base[r["k"]] for r in rows
            },
        }
    return out


def format_table(results: dict[str, list[dict]]) -> str:
    """Every (variant, k): the timing stages, run per mv and the error."""
    columns = [("variant", lambda r: r["name"]), ("k", lambda r: r["k"])]
    columns += harness.stage_columns()
    columns += [
        ("run/mv", lambda r: f"{r['run_per_mv_s'] * 1e3:.3f} ms"),
        ("runs", lambda r: r["runs"]),
        ("rel.err", lambda r: f"{r['rel_err_vs_lineax']:.1e}"),
    ]
    rows = [dict(r, name=name) for name, rs in results.items() for r in rs]
    return harness.column_table(columns, rows)


def format_ratios(table: dict, ks: Sequence[int]) -> str:
    """The two ratio tables of `ratios`."""
    lines = []
    for title, key in (
        (f"compile total / same variant at k={ks[0]}", "vs_own_first_k"),
        ("compile total / plain lineax at the same k", "vs_lineax_same_k"),
    ):
        rows = [[name] + [f"{r[key][k]:.2f}x" for k in ks] for name, r in table.items()]
        headers = ["variant"] + [f"k={k}" for k in ks]
        lines += ["", title, harness.table(headers, rows)]
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], config: dict, path) -> None:
    """Compile total and run per mv against k, per variant."""
    plt = harness.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, rows in results.items():
        ks = [r["k"] for r in rows]
        left.plot(ks, [r["compile_total_s"] for r in rows], "o-", label=name)
        right.plot(ks, [r["run_per_mv_s"] * 1e3 for r in rows], "o-", label=name)
    for ax, title, ylabel in (
        (left, "compile total (trace+lower+compile+first-call extra)", "seconds"),
        (right, "steady run time per mv", "milliseconds"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"{config['pattern']} call sites k")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xticks(ks, [str(k) for k in ks])
        harness.plain_log_ticks(ax)
    left.legend(fontsize=8)
    fig.suptitle(
        f"{config['layers']}-layer n={config['n']} float32 FunctionLinearOperator, "
        f"{harness.jax_label(openblas=True)}",
        fontsize=10,
    )
    harness.save(fig, path)
