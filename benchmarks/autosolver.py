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

Timed as `harness.time_program`: compile total (trace + lower + compile + the
first call's extra) and the median run of further calls. AutoSolver's objective
is compile plus one run, so the report gives that total per solver, which the
best of default and cg, whether AutoSolver picked it, and AutoSolver's total over
the best's. Results: `benchmarks/results/autosolver.json` and `.png`.

Run: `python -m benchmarks.autosolver [--quick] [--grids 4,8,16,24,32,48] [--out DIR]`.
"""

import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness


bratu = harness.example("bratu")
FULL = dict(grids=(4, 8, 16, 24, 32, 40, 48, 64))
QUICK = dict(grids=(4, 16))
TOL = dict(rtol=1e-10, atol=1e-10)


def solvers() -> dict[str, lx.AbstractLinearSolver]:
    """The three linear solvers, freshly built."""
    return {
        "default": lx.AutoLinearSolver(well_posed=None),
        "cg": lxd.PolicySolver(lxd.CG(**TOL), lxd.Lazy()),
        "auto": lxd.AutoSolver(**TOL),
    }


def measure(n: int) -> dict:
    """The Newton solve on the `n` x `n` grid with each solver, and AutoSolver's
    choice against the best of the other two."""
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

        timings, _, out = harness.time_program(program, bratu.LAMBDA, None, min_runs=3)
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
    """Per grid: each solver's total, the best and AutoSolver's choice."""
    columns = [("N", lambda r: r["n"]), ("unknowns", lambda r: r["unknowns"])]
    columns += [
        (f"{name} total", lambda r, name=name: f"{r[name]['total_s']:.3f}s")
        for name in ("default", "cg", "auto")
    ]
    columns += [
        ("best", lambda r: r["best"]),
        ("auto chose", lambda r: r["auto_chose"]),
        ("auto/best", lambda r: f"{r['auto_over_best']:.2f}x"),
        ("default/best", lambda r: f"{r['default_over_best']:.2f}x"),
    ]
    return harness.column_table(columns, rows)


def plot(rows: list[dict], path) -> None:
    """Compile plus one run, and run, against the unknowns."""
    plt = harness.pyplot()
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
        f"Bratu, optimistix Newton: AutoSolver vs Cholesky vs CG ({harness.jax_label()})",
        fontsize=10,
    )
    harness.save(fig, path)


def main(argv=None):
    """Measure, print the table, write `autosolver.json` and `autosolver.png`."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--grids", type=harness.int_list, help="comma-separated N")
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    grids = list(args.grids)
    env = harness.environment(load_average=True)
    config = dict(grids=grids, lam=bratu.LAMBDA, tol=TOL, newton_tol=1e-8)
    harness.print_setup(env, config)
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
    harness.write_results(
        args.out, "autosolver", payload, lambda path: plot(rows, path)
    )


if __name__ == "__main__":
    main()
