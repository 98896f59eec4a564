"""Tables and plot of `callsites.py`: compile totals per (variant, k), their ratios
to the same variant at the smallest k and to plain lineax at the same k."""

from collections.abc import Sequence
from pathlib import Path

from _plotting import jax_label, openblas_label, plain_log_ticks, pyplot, save


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
    header = (
        f"{'variant':<18}{'k':>3}{'trace':>9}{'lower':>9}{'compile':>9}"
        f"{'1st-extra':>11}{'comp.total':>12}{'run/mv':>12}{'runs':>6}{'rel.err':>10}"
    )
    lines = [header, "-" * len(header)]
    for name, rows in results.items():
        for r in rows:
            lines.append(
                f"{name:<18}{r['k']:>3}{r['trace_s']:>8.3f}s{r['lower_s']:>8.3f}s"
                f"{r['compile_s']:>8.3f}s{r['first_call_extra_s']:>10.3f}s"
                f"{r['compile_total_s']:>11.3f}s{r['run_per_mv_s'] * 1e3:>9.3f} ms"
                f"{r['runs']:>6}{r['rel_err_vs_lineax']:>10.1e}"
            )
    return "\n".join(lines)


def format_ratios(table: dict, ks: Sequence[int]) -> str:
    header = f"{'variant':<18}" + "".join(f"{'k=' + str(k):>9}" for k in ks)
    lines = []
    for title, key in (
        (f"compile total / same variant at k={ks[0]}", "vs_own_first_k"),
        ("compile total / plain lineax at the same k", "vs_lineax_same_k"),
    ):
        lines += ["", title, header]
        for name, r in table.items():
            lines.append(f"{name:<18}" + "".join(f"{r[key][k]:>8.2f}x" for k in ks))
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], config: dict, path: Path) -> None:
    plt = pyplot()
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
        ax.set_xlabel("independent call sites k")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xticks(ks, [str(k) for k in ks])
        plain_log_ticks(ax)
    left.legend(fontsize=8)
    fig.suptitle(
        f"{config['layers']}-layer n={config['n']} float32 FunctionLinearOperator, "
        f"{jax_label()}, {openblas_label()}",
        fontsize=10,
    )
    save(fig, path)
