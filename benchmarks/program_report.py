"""Reporting `benchmarks.program`'s results: the text report (nested jit, eager
`mv`, and per pattern each variant's compile total, its ratios to k=1, to plain
lineax and to the program rolled by hand, and run per mv) and the plot of compile
total against k."""

from collections.abc import Iterable

from benchmarks import harness


def report(results: dict, ks, patterns: Iterable[str]) -> None:
    """Compile totals, their ratios and run per mv, as text (the patterns in the
    order given)."""
    print("\nnested jit (a jitted 256-term function at k sites)")
    for name, row in results["nested jit"].items():
        print(
            f"    {name:22s} compile {row['compile_total_s']:.3f} s ({row['compile_vs_k1']:.2f}x k=1)"
        )
    for case, by_pattern in results.items():
        if case == "nested jit":
            continue
        print(f"\n{case}")
        e = by_pattern["eager"]
        jitted = e["jitted mv"]["later_s"]
        plain = ("lineax", "lineax default")
        print(
            "  eager mv (later calls): "
            + "; ".join(
                f"{v} {1e3 * e[v]['later_s']:.2f} ms ({e[v]['later_s'] / jitted:.2f}x "
                "jitted)"
                for v in plain
            )
            + "; "
            + "; ".join(
                f"{v} {1e3 * e[v]['later_s']:.2f} ms ({e[v]['later_s'] / jitted:.2f}x "
                "jitted, faster than lineax by "
                + ", ".join(f"{e[p]['later_s'] / e[v]['later_s']:.1f}x" for p in plain)
                + ")"
                for v in ("lxd Lazy", "lxd Auto")
            )
            + f"; jitted mv {1e3 * jitted:.2f} ms"
        )
        for pattern in patterns:
            print(f"  {pattern}:")
            for name, row in by_pattern[pattern].items():
                extra = ""
                if "compile_vs_lineax" in row:
                    extra = (
                        f"  vs lineax: compile {row['compile_vs_lineax']:.2f}x, run/mv "
                        f"{row['run_per_mv_vs_lineax']:.2f}x; vs by hand: compile "
                        f"{row['compile_vs_by_hand']:.2f}x"
                    )
                print(
                    f"    {name:22s} compile {row['compile_total_s']:.3f} s "
                    f"({row['compile_vs_k1']:.2f}x k=1 by round, "
                    f"{row['compile_median_vs_k1']:.2f}x of medians)  run/mv "
                    f"{1e3 * row['run_per_mv_s']:.3f} ms{extra}"
                )


def plot(results: dict, ks, variants: Iterable[str], path) -> None:
    """Compile total against k, per case, variant (in the order given) and
    pattern."""
    plt = harness.pyplot()
    cases = [c for c in results if c != "nested jit"]
    fig, axes = plt.subplots(
        1, len(cases), figsize=(5.5 * len(cases), 4), squeeze=False
    )
    for ax, case in zip(axes[0], cases):
        for pattern, style in (("independent", "-"), ("dependent", "--")):
            for variant in variants:
                rows = results[case][pattern]
                ax.plot(
                    ks,
                    [rows[f"{variant} k={k}"]["compile_total_s"] for k in ks],
                    style,
                    marker="o",
                    label=f"{variant}, {pattern}",
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("call sites k")
        ax.set_ylabel("compile total (s)")
        ax.set_title(case)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"program-level dispatch; {harness.jax_label(openblas=True)}",
        fontsize=9,
    )
    harness.save(fig, path)
