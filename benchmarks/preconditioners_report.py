"""The text report and the figure of `benchmarks.preconditioners`."""

from benchmarks import harness


def report(payload: dict) -> str:
    """The diffusion table and the targets, of the parts measured."""
    lines = []
    for row in payload.get("diffusion", []):
        columns = [
            ("program", lambda kv: kv[0]),
            ("steps", lambda kv: kv[1]["steps"]),
            (
                "compile",
                lambda kv: f"{kv[1].get('compile_total_s', float('nan')):.3f}s",
            ),
            ("run", lambda kv: f"{kv[1].get('run_s', float('nan')):.4f}s"),
            (
                "total",
                lambda kv: (
                    f"{kv[1]['total_s']:.3f}s" + "*" * bool(kv[1].get("estimated"))
                ),
            ),
        ]
        lines.append(f"diffusion {row['s']}x{row['s']} (span {row['span']:g}):")
        lines.append(harness.column_table(columns, list(row["results"].items())))
        r = row["ratios"]
        steps = r["steps_jacobi_over_plain"]
        lines.append(
            f"  Jacobi/plain steps {steps:.3f} (target <= 1/3: "
            f"{harness.met(steps <= 1 / 3)}); AutoSolver chose {row['auto_chose']}"
        )
        for key, what in (("run", "run (build + solve)"), ("total", "compile + run")):
            over = [
                r[f"{who}_{key}_over_jacobi"] for who in ("plain", "lineax", "hand")
            ]
            lines.append(
                f"  {what}: lxd.CG plain {over[0]:.2f}x, lineax CG {over[1]:.2f}x, "
                f"lineax + hand Jacobi {over[2]:.2f}x of lxd.CG + jacobi (target > 1: "
                f"{harness.met(min(over[0], over[2]) > 1)})"
            )
    if "blocks" in payload:
        lines.append(_blocks_line(payload["blocks"]))
    if "families" in payload:
        lines.append(_families_line(payload["families"]))
    return "\n".join(lines)


def _blocks_line(blocks: dict) -> str:
    ratio = blocks["jacobi_over_block_steps"]
    return (
        f"blocks n={blocks['n']}: Jacobi/block Jacobi steps {ratio:.2f}x (target >= 2: "
        f"{harness.met(ratio >= 2)}); AutoSolver chose {blocks['auto_chose']}, "
        f"applied {blocks['auto_preconditioned']}"
        + (
            f", {blocks['auto_over_best']:.2f}x the best total"
            if "auto_over_best" in blocks
            else ""
        )
    )


def _families_line(fam: dict) -> str:
    picked = sum(c["preconditioned"] for c in fam["choices"])
    return (
        f"families: a preconditioner on {picked} of {len(fam['choices'])} operators "
        f"(target 0: {harness.met(picked == 0)}); stencil told its pattern: "
        f"{fam['regret']:.2f}x the total without"
    )


def plot(payload: dict, path) -> None:
    """Totals per program and grid; steps against the coefficient's span."""
    plt = harness.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    rows = payload.get("diffusion", [])
    names = list(rows[0]["results"]) if rows else []
    width = 0.8 / max(len(rows), 1)
    for i, row in enumerate(rows):
        totals = [
            row["results"][k]["total_s"] if k in row["results"] else 0 for k in names
        ]
        xs = [j + i * width for j in range(len(names))]
        axes[0].bar(xs, totals, width, label=f"{row['s']}x{row['s']}")
    axes[0].set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
    axes[0].set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    axes[0].set_yscale("log")
    axes[0].set_title("diffusion: compile + one run, build included (s)")
    axes[0].legend()
    if "spread" in payload:
        _spread_panel(axes[1], payload)
    if "blocks" in payload:
        blocks = payload["blocks"]["results"]
        axes[2].bar(list(blocks), [r["steps"] for r in blocks.values()])
        axes[2].set_title(f"block-dominant dense, n={payload['blocks']['n']}: CG steps")
    fig.suptitle(f"Preconditioners ({harness.jax_label(openblas=True)})", fontsize=10)
    harness.save(fig, path)


def _spread_panel(axis, payload: dict) -> None:
    spread = payload["spread"]
    spans = [r["span"] for r in spread]
    axis.plot(spans, [r["plain_steps"] for r in spread], "o-", label="CG")
    axis.plot(spans, [r["jacobi_steps"] for r in spread], "s-", label="CG + jacobi")
    axis.set_xscale("log")
    axis.set_title(
        f"steps against the coefficient's span ({payload['config']['grids'][0]}^2)"
    )
    axis.legend()
