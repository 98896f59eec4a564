"""`lxd.AutoSolver`'s choice between a dense factorisation and a matrix-free CG,
against both, on the 2-D Bratu problem with optimistix's Newton.

What is measured
----------------

For each grid of N x N interior points (N^2 unknowns; `docs/examples/bratu.py`,
float64, Jacobian tagged symmetric positive semidefinite), the whole jitted
Newton solve (rtol = atol = 1e-8, five steps) with three linear solvers:

    default     optimistix's default, `lx.AutoLinearSolver(well_posed=None)`
                (materialises the Jacobian and factorises it: Cholesky)
    cg          `lxd.PolicySolver(lxd.CG(1e-10, 1e-10), lxd.Lazy())`, matrix-free
    auto        `lxd.AutoSolver(rtol=1e-10, atol=1e-10)`, which picks one of them

Timed as `_common.time_program`: compile total (trace + lower + compile + the
first call's extra) and the median run of further calls. AutoSolver's objective
is compile plus one run, so the report gives that total per solver, which the
best of default and cg, whether AutoSolver picked it, and AutoSolver's total over
the best's. Results: `benchmarks/results/autosolver.json` and `.png`.

Run: `python benchmarks/autosolver.py [--grids 4,8,16,24,32,48] [--out DIR]`.
"""

import argparse
import os
import sys
from pathlib import Path


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "examples"))

import bratu  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import lineax as lx  # noqa: E402
from _common import environment, print_setup, time_program, write_results  # noqa: E402
from _plotting import jax_label, pyplot, save  # noqa: E402

import lineax_dispatch as lxd  # noqa: E402


TOL = dict(rtol=1e-10, atol=1e-10)


def solvers() -> dict[str, lx.AbstractLinearSolver]:
    return {
        "default": lx.AutoLinearSolver(well_posed=None),
        "cg": lxd.PolicySolver(lxd.CG(**TOL), lxd.Lazy()),
        "auto": lxd.AutoSolver(**TOL),
    }


def measure(n: int) -> dict:
    operator = lxd.JacobianLinearOperator(
        bratu.residual, jnp.zeros(n * n), bratu.LAMBDA, tags=bratu.TAGS
    )
    chosen, reasons = solvers()["auto"].choose(operator)
    row: dict = dict(
        n=n,
        unknowns=n * n,
        auto_chose="default" if isinstance(chosen, lx.AutoLinearSolver) else "cg",
        auto_reasons=list(reasons),
    )
    values = {}
    for name, linear_solver in solvers().items():

        def program(lam, _, linear_solver=linear_solver):
            return bratu.solve(n, linear_solver, lam).value

        timings, _, out = time_program(program, bratu.LAMBDA, None, min_runs=3)
        timings["total_s"] = timings["compile_total_s"] + timings["run_s"]
        row[name] = timings
        values[name] = out
        print(
            f"  N={n:3d} {name:<8} compile total {timings['compile_total_s']:6.3f} s"
            f"   run {timings['run_s'] * 1e3:9.2f} ms   total {timings['total_s']:6.3f} s"
        )
    row["max_difference"] = float(
        max(jnp.max(jnp.abs(values[k] - values["default"])) for k in ("cg", "auto"))
    )
    best = min(("default", "cg"), key=lambda k: row[k]["total_s"])
    row["best"] = best
    row["auto_picked_best"] = row["auto_chose"] == best
    row["auto_over_best"] = row["auto"]["total_s"] / row[best]["total_s"]
    row["default_over_best"] = row["default"]["total_s"] / row[best]["total_s"]
    return row


def report(rows: list[dict]) -> str:
    header = (
        f"{'N':>4} {'unknowns':>9} {'default total':>14} {'cg total':>10} "
        f"{'auto total':>11} {'best':>8} {'auto chose':>11} {'auto/best':>10} "
        f"{'default/best':>13}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['n']:>4} {r['unknowns']:>9} {r['default']['total_s']:>13.3f}s "
            f"{r['cg']['total_s']:>9.3f}s {r['auto']['total_s']:>10.3f}s "
            f"{r['best']:>8} {r['auto_chose']:>11} {r['auto_over_best']:>9.2f}x "
            f"{r['default_over_best']:>12.2f}x"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    sizes = [r["unknowns"] for r in rows]
    for name, marker in (("default", "o"), ("cg", "s"), ("auto", "x")):
        axes[0].plot(
            sizes, [r[name]["total_s"] for r in rows], marker=marker, label=name
        )
        axes[1].plot(
            sizes, [r[name]["run_s"] * 1e3 for r in rows], marker=marker, label=name
        )
    axes[0].set_title("compile + one run (s)")
    axes[1].set_title("run (ms)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("unknowns (N^2)")
        ax.legend()
    fig.suptitle(
        f"Bratu, optimistix Newton: AutoSolver vs Cholesky vs CG ({jax_label()})",
        fontsize=10,
    )
    save(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", default="4,8,16,24,32,40,48,64")
    parser.add_argument("--quick", action="store_true", help="grids 4,16 only")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    grids = [4, 16] if args.quick else [int(g) for g in args.grids.split(",")]
    env = environment(load_average=True)
    config = dict(grids=grids, lam=bratu.LAMBDA, tol=TOL, newton_tol=1e-8)
    print_setup(env, config)
    measure(4)  # warm-up: the first compile of a process pays one-off costs
    print("(warm-up done)")
    rows = [measure(n) for n in grids]
    print(report(rows))
    picked = sum(r["auto_picked_best"] for r in rows)
    worst = max(r["auto_over_best"] for r in rows)
    summary = dict(grids=len(rows), auto_picked_best=picked, worst_auto_over_best=worst)
    print(
        f"AutoSolver picked the faster of Cholesky and CG (compile + one run) on "
        f"{picked} of {len(rows)} grids; worst AutoSolver / best {worst:.2f}x"
    )
    payload = dict(environment=env, config=config, rows=rows, summary=summary)
    write_results(args.out, "autosolver", payload, lambda path: plot(rows, path))


if __name__ == "__main__":
    main()
