"""The lineax-dispatch showcase that `make demo` runs: the 2-D Bratu problem.

Newton's method (optimistix) on `-Δu - λ exp(u) = 0` at two grid sizes, with plain
optimistix/lineax defaults (the Jacobian materialised and factorised at every
step) and with `lxd.AutoSolver` (a factorisation while it is cheap, a matrix-free
CG once the grid grows). Prints `lxd.explain` tables and a comparison of compile
time, run time and peak memory (XLA's memory analysis of each compiled program),
then a memory-budget case: a grid whose dense Jacobian exceeds a set budget, where
Auto stays matrix-free and a materialising solve reports the bytes it would need.
Writes `demo.json` and `demo.png` into `--out`: by default `demo-results/` beside
this file (git-ignored), so `make demo` changes no tracked file. The figure the
docs show is regenerated with `python demo.py --out benchmarks/results`.
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import lineax as lx  # noqa: E402
import optimistix as optx  # noqa: E402

import lineax_dispatch as lxd  # noqa: E402
from benchmarks import harness  # noqa: E402
from lineax_dispatch.policies._memory import format_bytes


bratu = harness.example("bratu")
GRIDS = (16, 64)  # 256 and 4,096 unknowns
BUDGET_GRID, BUDGET = 128, "1GB"  # a 2.1 GB dense Jacobian
TOL = dict(rtol=1e-10, atol=1e-10)
# Where `make demo` writes (git-ignored); the docs' copy is in benchmarks/results.
DEFAULT_OUT = Path(__file__).resolve().parent / "demo-results"


def variants():
    return {
        "optimistix default": lx.AutoLinearSolver(well_posed=None),
        "lxd.AutoSolver": lxd.AutoSolver(**TOL),
    }


def measure(n: int, linear_solver, repeats: int) -> dict:
    """Compile (median of 3, each traced afresh) and run Newton on the `n` x `n`
    grid; peak memory from XLA's memory analysis."""
    compiles = []
    for _ in range(3):
        fn = jax.jit(lambda lam: bratu.solve(n, linear_solver, lam))
        start = time.perf_counter()
        compiled = fn.trace(bratu.LAMBDA).lower().compile()
        compiles.append(time.perf_counter() - start)
    compile_s = sorted(compiles)[1]
    sol = jax.block_until_ready(compiled(bratu.LAMBDA))
    run_s = harness.median_call_time(lambda: compiled(bratu.LAMBDA), repeats)
    memory = compiled.memory_analysis()
    peak = memory.temp_size_in_bytes + memory.argument_size_in_bytes
    peak += memory.output_size_in_bytes
    return dict(
        compile_s=compile_s,
        run_s=run_s,
        peak_bytes=int(peak),
        newton_steps=int(sol.stats["num_steps"]),
        successful=bool(sol.result == optx.RESULTS.successful),
        value=sol.value,
    )


def comparison(results: dict) -> str:
    header = (
        f"{'grid':>9} {'unknowns':>9} {'linear solver':<20} {'compile':>9} "
        f"{'run':>10} {'peak memory':>12} {'steps':>6}"
    )
    lines = [header, "-" * len(header)]
    for n, by_variant in results.items():
        for name, r in by_variant.items():
            lines.append(
                f"{f'{n}x{n}':>9} {n * n:>9} {name:<20} {r['compile_s']:>8.2f}s "
                f"{r['run_s'] * 1e3:>8.1f}ms {format_bytes(r['peak_bytes']):>12} "
                f"{r['newton_steps']:>6}"
            )
        plain, ours = by_variant.values()
        lines.append(
            f"{'':>9} {'':>9} {'ours / default':<20} "
            f"{ours['compile_s'] / plain['compile_s']:>8.2f}x "
            f"{ours['run_s'] / plain['run_s']:>9.3f}x "
            f"{ours['peak_bytes'] / plain['peak_bytes']:>11.3f}x"
        )
    return "\n".join(lines)


def budget_case() -> dict:
    """A grid whose dense Jacobian exceeds `BUDGET`: Auto solves it matrix-free; a
    materialising solve with the same budget reports what it would need."""
    n = BUDGET_GRID
    print(
        f"\n== memory budget: {n}x{n} grid ({n * n} unknowns), budget {BUDGET}; "
        f"the dense float64 Jacobian alone is {format_bytes(8 * n**4)}"
    )
    ours = lxd.AutoSolver(**TOL, memory_budget=BUDGET)
    print(lxd.explain(lambda lam: bratu.solve(n, ours, lam).value, bratu.LAMBDA))
    r = measure(n, ours, repeats=1)
    residual = float(jnp.max(jnp.abs(bratu.residual(r["value"], bratu.LAMBDA))))
    print(
        f"lxd.AutoSolver(memory_budget={BUDGET!r}): solved in {r['newton_steps']} "
        f"Newton steps, max |F(u)| = {residual:.1e}, compile {r['compile_s']:.2f} s, "
        f"run {r['run_s'] * 1e3:.0f} ms, peak memory {format_bytes(r['peak_bytes'])}"
    )
    assert r["successful"] and residual < 1e-6
    materialising = lxd.PolicySolver(
        lx.Cholesky(), lxd.Materialise(memory_budget=BUDGET)
    )
    try:
        jax.jit(lambda lam: bratu.solve(n, materialising, lam)).trace(bratu.LAMBDA)
    except ValueError as error:
        message = str(error)
        print(f"PolicySolver(lx.Cholesky(), Materialise(memory_budget={BUDGET!r})):")
        print(f"  ValueError at trace time: {message}")
    else:  # pragma: no cover
        raise AssertionError("materialising over the budget did not raise")
    start = time.perf_counter()
    plain = jax.jit(lambda lam: bratu.solve(n, lx.AutoLinearSolver(None), lam))
    memory = plain.trace(bratu.LAMBDA).lower().compile().memory_analysis()
    plain_peak = memory.temp_size_in_bytes + memory.argument_size_in_bytes
    plain_peak += memory.output_size_in_bytes
    print(
        f"optimistix default (compiled, not run; {time.perf_counter() - start:.1f} s):"
        f" XLA plans {format_bytes(plain_peak)} for it"
    )
    return dict(
        grid=n,
        budget=BUDGET,
        auto={k: v for k, v in r.items() if k != "value"},
        max_residual=residual,
        materialise_error=message,
        default_peak_bytes=int(plain_peak),
    )


def plot(results: dict, budget: dict, path) -> None:
    """Compile time, run time and peak memory per grid and solver."""
    plt = harness.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    metrics = [
        ("compile_s", "compile time (s)", 1.0),
        ("run_s", "run time (ms)", 1e3),
        ("peak_bytes", "peak memory (MB)", 1e-6),
    ]
    labels = [f"{n}x{n}" for n in results]
    names = list(next(iter(results.values())))
    width = 0.38
    for ax, (key, title, scale) in zip(axes, metrics):
        for i, name in enumerate(names):
            values = [results[n][name][key] * scale for n in results]
            xs = [j + (i - 0.5) * width for j in range(len(labels))]
            bars = ax.bar(xs, values, width, label=name)
            ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(title)
        ax.set_yscale("log")
    axes[0].legend()
    fig.suptitle(
        "2-D Bratu, optimistix Newton: default linear solver vs lxd.AutoSolver "
        f"(and {budget['grid']}x{budget['grid']} under a {budget['budget']} budget: "
        f"AutoSolver {budget['auto']['run_s'] * 1e3:.0f} ms, "
        f"{format_bytes(budget['auto']['peak_bytes'])}; default would plan "
        f"{format_bytes(budget['default_peak_bytes'])})",
        fontsize=9,
    )
    harness.save(fig, path, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="folder for demo.json and demo.png (default: demo-results/, "
        "git-ignored; `--out benchmarks/results` rewrites the docs' figure)",
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, "
        f"{os.cpu_count()} CPU cores, lineax-dispatch {lxd.__version__}"
    )
    results: dict = {}
    for n in GRIDS:
        print(f"\n== {n}x{n} grid: {n * n} unknowns, Jacobian {n * n}x{n * n}")
        ours = variants()["lxd.AutoSolver"]
        print(lxd.explain(lambda lam: bratu.solve(n, ours, lam).value, bratu.LAMBDA))
        results[n] = {}
        for name, linear_solver in variants().items():
            results[n][name] = measure(n, linear_solver, repeats=3 if n < 48 else 1)
        plain, mine = (r["value"] for r in results[n].values())
        difference = float(jnp.max(jnp.abs(plain - mine)))
        print(f"max |u_default - u_lxd| = {difference:.1e}")
        assert difference < 1e-6 and all(r["successful"] for r in results[n].values())
    print(
        "\n== comparison (compile: median of 3; run: median of 3 at 16x16, one run at 64x64)"
    )
    print(comparison(results))
    budget = budget_case()
    record = dict(
        environment=harness.environment(load_average=True),
        grids={
            str(n): {
                k: {m: v for m, v in r.items() if m != "value"} for k, r in by.items()
            }
            for n, by in results.items()
        },
        budget_case=budget,
    )
    plot_demo = lambda path: plot(results, budget, path)  # noqa: E731
    harness.write_results(args.out, "demo", record, plot_demo)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
