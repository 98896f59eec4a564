"""Tables, acceptance and plot of `batch.py`."""

from pathlib import Path

import _plotting


RTOL = 1e-5
ACCEPTANCE = dict(
    dense_vs_limit_max=1.25, loop_vs_dense_min=20.0, auto_vs_lineax_max=1.0
)


def format_report(dense: list[dict], cg: dict, mem: dict, config: dict) -> str:
    lines = [
        f"(a) dense SPD n={config['dense_n']} float32, lx.LU, run times (ms)",
        f"{'B':>5} {'batch_solve':>12} {'loop':>10} {'limit':>10} "
        f"{'bs/limit':>9} {'loop/bs':>8} {'residual':>9}",
    ]
    for r in dense:
        lines.append(
            f"{r['batch']:>5} {1e3 * r['batch_solve_s']:>12.3f}"
            f" {1e3 * r['loop_s']:>10.2f}"
            f" {1e3 * r['limit_s']:>10.3f} {r['batch_solve_over_limit']:>9.2f}"
            f" {r['loop_over_batch_solve']:>8.1f} {r['residual']:>9.1e}"
        )
    lines += [
        "",
        f"(b) matrix-free SPD n={config['n']}, {config['layers']} layers, "
        f"{config['rhs']} rhs, CG rtol=atol={RTOL:g} (s)",
        f"{'':>8} {'compile':>8} {'run':>8} {'total':>8} {'steps':>6} {'residual':>9}",
    ]
    for name in ("auto", "lineax"):
        t = cg[name]
        lines.append(
            f"{name:>8} {t['compile_total_s']:>8.2f} {t['run_s']:>8.3f}"
            f" {t['total_s']:>8.2f} {t['steps_max']:>6} {t['max_residual']:>9.1e}"
        )
    lines.append(
        f"  Auto decided {cg['decision']['policy']} (executions="
        f"{cg['decision']['executions']}): " + " ".join(cg["decision"]["reasons"])
    )
    lines += [
        "",
        f"(c) CG on x -> d*x, n={config['mem_n']}, {config['mem_rhs']} rhs "
        f"(stack of vectors {mem['vectors_mb']:.0f} MB), budget "
        f"{mem['budget'] / 2**20:g} MiB",
        f"{'':>13} {'RSS before':>10} {'peak':>8} {'growth':>8} {'run s':>7} "
        f"{'steps':>6}",
    ]
    for name in ("auto_chunked", "lockstep"):
        m = mem[name]
        lines.append(
            f"{name:>13} {m['rss_before_mb']:>9.0f}M {m['peak_mb']:>7.0f}M"
            f" {m['growth_mb']:>7.0f}M {m['run_s']:>7.2f} {m['steps_max']:>6}"
        )
    lines.append(
        f"  Auto decided {mem['decision']['policy']}: "
        + " ".join(mem["decision"]["reasons"])
    )
    if not mem["peak_reset_available"]:
        lines.append("  (peak RSS reset unavailable: VmHWM is monotone)")
    return "\n".join(lines)


def acceptance(dense: list[dict], cg: dict) -> dict:
    last, a = dense[-1], ACCEPTANCE
    b = last["batch"]
    limit, loop = last["batch_solve_over_limit"], last["loop_over_batch_solve"]
    ratio = cg["auto"]["total_s"] / cg["lineax"]["total_s"]
    return {
        f"B={b}: batch_solve / limit = {limit:.2f} <= {a['dense_vs_limit_max']}": (
            limit <= a["dense_vs_limit_max"]
        ),
        f"B={b}: loop / batch_solve = {loop:.1f} >= {a['loop_vs_dense_min']}": (
            loop >= a["loop_vs_dense_min"]
        ),
        f"auto / vmapped lineax CG total = {ratio:.2f} <= "
        f"{a['auto_vs_lineax_max']}": ratio <= a["auto_vs_lineax_max"],
    }


def plot(dense: list[dict], cg: dict, mem: dict, path: Path) -> None:
    plt = _plotting.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    bs = [r["batch"] for r in dense]
    for key, label in (
        ("batch_solve_s", "lxd.batch_solve"),
        ("loop_s", "Python loop of lx.linear_solve"),
        ("limit_s", "lu_factor + lu_solve (limit)"),
    ):
        ax.plot(bs, [1e3 * r[key] for r in dense], "o-", label=label)
    ax.set(xscale="log", yscale="log", xlabel="right-hand sides B", ylabel="run (ms)")
    ax.set_title("(a) dense SPD, LU")
    ax.legend(fontsize=8)
    ax = axes[1]
    names = ["auto", "lineax"]
    comp = [cg[k]["compile_total_s"] for k in names]
    run = [cg[k]["run_s"] for k in names]
    ax.bar(names, comp, label="compile total")
    ax.bar(names, run, bottom=comp, label="run")
    ax.set(ylabel="seconds", title=f"(b) CG: Auto ({cg['decision']['strategy']})")
    ax.legend(fontsize=8)
    ax = axes[2]
    names = ["auto_chunked", "lockstep"]
    ax.bar(names, [mem[k]["growth_mb"] for k in names], color=["C2", "C3"])
    ax.set_xlabel(mem["decision"]["policy"] + " vs VmapBatch()", fontsize=8)
    ax.set(ylabel="peak RSS growth of the run (MB)", title="(c) peak memory, CG")
    fig.suptitle(f"batch_solve; {_plotting.jax_label()}, {_plotting.openblas_label()}")
    _plotting.save(fig, path)
