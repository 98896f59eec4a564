"""Compile time and run time of lineax-dispatch's iterative solvers against their
lineax counterparts, for an expensive matrix-free SPD operator, with the copies of
`mv` in each compiled program and the runs of the user's function while compiling.

What is measured and how: docs/benchmarks.md, "Solvers". This file reads top to
bottom: constants, cases, measurement, report, command line.

    python -m benchmarks.solvers                          # n=1024, L=32, all pairs
    python -m benchmarks.solvers --quick --solvers cg     # n=128, L=4, 1 repeat
    python -m benchmarks.solvers --solvers cg,bicgstab --repeats 5

Results: `benchmarks/results/solvers.json` and `solvers.png` (`--out DIR`).
"""

import re
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.harness import SEED, SHIFT


FULL = dict(n=1024, layers=32, repeats=3)
QUICK = dict(n=128, layers=4, repeats=1)
RTOL = ATOL = 1e-5
MAX_STEPS = 500
MIN_RUNS = 5  # steady calls at least (the run-time ratio is one of the things judged)
COUNT_N, COUNT_LAYERS = 16, 2  # the small operator of the f-trace count
SIDES = ("lineax", "ours")
# Each pair: ours (`lxd.<name>`) and lineax's counterpart (`lx.<name>`); "Normal"
# is `Normal(CG)`; lineax has no MINRES.
PAIRS = dict(
    cg=("CG", "CG"), bicgstab=("BiCGStab", "BiCGStab"), gmres=("GMRES", "GMRES"),
    lsmr=("LSMR", "LSMR"), normal=("Normal", "Normal"), minres=("MINRES", "CG"),
)  # fmt: skip
# The figures judged for CG and BiCGStab: ours over lineax's compile and run.
ACCEPTANCE = dict(solvers=("cg", "bicgstab"), compile_ratio=0.6, run_ratio=1.05)


# ------------------------------------------------------------------ cases


def solver_name(key: str, side: str) -> str:
    """`lxd.CG`, `lx.Normal(lx.CG)`, `lx.CG (no lx.MINRES)`..."""
    ours, theirs = PAIRS[key]
    prefix, name = ("lxd", ours) if side == "ours" else ("lx", theirs)
    text = f"{prefix}.Normal({prefix}.CG)" if name == "Normal" else f"{prefix}.{name}"
    return text if name == ours else f"{text} (no lx.{ours})"


def make_solver(key: str, side: str, max_steps: int):
    """The solver of one side of a pair, with the same tolerances on both sides."""
    module, name = (lxd, PAIRS[key][0]) if side == "ours" else (lx, PAIRS[key][1])
    tolerances = dict(rtol=RTOL, atol=ATOL, max_steps=max_steps)
    if name == "Normal":
        return module.Normal(module.CG(**tolerances))
    return getattr(module, name)(**tolerances)


def solve_body(solver):
    """`(op, b) ->` the solve's (value, num_steps, result code)."""

    def solve(op, b):
        sol = lx.linear_solve(op, b, solver, throw=False)
        return sol.value, sol.stats.get("num_steps", jnp.array(-1)), sol.result._value

    return solve


def result_name(index: int) -> str:
    """The name of a lineax result code."""
    items = lx.RESULTS._name_to_item.items()
    return {int(item._value): name for name, item in items}.get(index, str(index))


# ------------------------------------------------------------------ measure


_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?(%[\w.\-]+)\s*=\s*(\S+?)(?:\{[^}]*\})?\s+([\w\-]+)\((.*)$"
)


def count_matmuls(compiled, n: int) -> int:
    """`dot` instructions of the optimised HLO with an `n x n` operand (each copy of
    `mv` in the program has `2 L` of them)."""
    shapes, dots = {}, []
    for match in filter(None, map(_INSTRUCTION.match, compiled.as_text().splitlines())):
        name, shape, opcode, rest = match.groups()
        shapes[name] = shape
        if opcode == "dot":
            dots.append(re.findall(r"%[\w.\-]+", rest.split(")")[0]))
    square = f"f32[{n},{n}]"
    return sum(any(shapes.get(o) == square for o in operands) for operands in dots)


def measure(body, weights, scales, arg, n: int) -> tuple[dict, object]:
    """Times `body(op, arg)` on a fresh operator, with its HLO matmul count."""
    op = harness.spd_operator(harness.spd_function(weights, scales), n)
    program, params, _ = harness.split_program(op, body)
    timings, compiled, out = harness.time_program(program, params, arg, MIN_RUNS)
    timings["matmuls_in_hlo"] = count_matmuls(compiled, n)
    return timings, out


def measure_solve(solver, weights, scales, b, n: int) -> tuple[dict, jax.Array]:
    """One solve, with its steps and result."""
    body = solve_body(solver)
    timings, (value, num_steps, result) = measure(body, weights, scales, b, n)
    timings["num_steps"] = int(num_steps)
    timings["run_per_step_s"] = timings["run_s"] / max(int(num_steps), 1)
    timings["result"] = result_name(int(result))
    return timings, value


def pick_median(trials: list[tuple[dict, object]]) -> tuple[dict, object]:
    """The trial with the median compile total, with every trial's compile total
    and run time (`compile_total_all_s`, `run_all_s`)."""
    return harness.median_trial(trials, "compile_total_s", ("compile_total_s", "run_s"))


def count_f_traces(solver, mv_only: bool = False) -> dict:
    """Runs of the user's Python function while tracing / compiling and first
    calling a solve (or one bare mv) on a small operator."""
    weights, scales, _ = harness.spd_layers(COUNT_N, COUNT_LAYERS, SEED + 2)
    spd, counter = harness.spd_function(weights, scales), [0]

    def counted(x):
        counter[0] += 1
        return spd(x)

    op = harness.spd_operator(counted, COUNT_N)
    mv = lambda b: op.mv(b)
    solve = lambda b: lx.linear_solve(op, b, solver, throw=False).value
    b = jnp.ones((COUNT_N,), jnp.float32)
    trace, rest = harness.count_runs(mv if mv_only else solve, b, counter)
    return dict(trace=trace, compile_and_first_call=rest, total=trace + rest)


def measure_pair(args, key: str, weights, scales, b, bare_mv: dict) -> dict:
    """Both sides of a pair, alternating, `args.repeats` times, the median kept;
    ours over lineax (compile, run, run per step) and each over one bare mv."""
    solvers = {side: make_solver(key, side, args.max_steps) for side in SIDES}
    f_traces = {side: count_f_traces(solvers[side]) for side in SIDES}
    trials = {side: [] for side in SIDES}
    for _ in range(args.repeats):
        for side in SIDES:
            trials[side].append(
                measure_solve(solvers[side], weights, scales, b, args.n)
            )
    names = {side: solver_name(key, side) for side in SIDES}
    row = dict(label=f"{names['lineax']}\nvs {names['ours']}", layers=args.layers)
    row.update(lineax_solver=names["lineax"], ours_solver=names["ours"])
    values = {}
    for side in SIDES:
        t, values[side] = pick_median(trials[side])
        row[side] = t
        t.update(f_traces=f_traces[side], solver_repr=repr(solvers[side]))
        ax = harness.spd_function(weights, scales)(values[side])
        t["relative_residual"] = harness.relative_error(ax, b)
        t["compile_over_bare_mv"] = t["compile_total_s"] / bare_mv["compile_total_s"]
    row["relative_difference_ours_vs_lineax"] = harness.relative_error(
        values["ours"], values["lineax"]
    )
    # The two sides may stop at different steps (float32 rounding in the stopping
    # test): the run time per step separates the cost of a step from that.
    for name, field in (("compile", "compile_total_s"), ("run", "run_s"),
                        ("run_per_step", "run_per_step_s")):  # fmt: skip
        row[f"{name}_ratio_ours_over_lineax"] = (
            row["ours"][field] / row["lineax"][field]
        )
    return row


def run_all(args, weights, scales) -> tuple[dict, dict, dict]:
    """The results per pair, the bare-mv reference and a note for each pair whose
    measurement raised (the others are still measured)."""
    b = jax.random.normal(jax.random.key(SEED + 3), (args.n,), jnp.float32)
    x = jax.random.normal(jax.random.key(SEED + 1), (args.n,), jnp.float32)
    bare = lambda: measure(lambda op, x: op.mv(x), weights, scales, x, args.n)
    bare()  # warm-up, discarded
    bare_mv, _ = pick_median([bare() for _ in range(args.repeats)])
    bare_mv["f_traces"] = count_f_traces(None, mv_only=True)
    print(f"  bare mv        compile total {bare_mv['compile_total_s']:8.3f} s   run "
          f"{bare_mv['run_s'] * 1e3:9.2f} ms   f traces "
          f"{bare_mv['f_traces']['total']}", flush=True)  # fmt: skip
    results, failed = {}, {}
    for key in args.solvers:
        try:
            results[key] = row = measure_pair(args, key, weights, scales, b, bare_mv)
        except Exception as e:  # reported; the other pairs are still measured
            failed[key] = f"{type(e).__name__}: {e}"
            print(f"  {key:<9}FAILED: {failed[key]}", flush=True)
            continue
        for side, t in ((side, row[side]) for side in SIDES):
            print(f"  {key:<9}{side:<7}compile total {t['compile_total_s']:8.3f} s"
                  f"   run {t['run_s'] * 1e3:9.2f} ms   steps {t['num_steps']:>4}"
                  f"   {t['result']}   rel.resid {t['relative_residual']:.1e}"
                  f"   f traces {t['f_traces']['total']}", flush=True)  # fmt: skip
    return results, bare_mv, failed


# ------------------------------------------------------------------ report


def acceptance(results: dict) -> dict:
    """For CG and BiCGStab: the compile and run ratios against `ACCEPTANCE`."""
    out = {}
    for key in (k for k in ACCEPTANCE["solvers"] if k in results):
        compile_ratio = results[key]["compile_ratio_ours_over_lineax"]
        run_ratio = results[key]["run_ratio_ours_over_lineax"]
        compile_met = compile_ratio <= ACCEPTANCE["compile_ratio"]
        run_met = run_ratio <= ACCEPTANCE["run_ratio"]
        out[key] = dict(compile_ratio=compile_ratio, run_ratio=run_ratio,
                        compile_met=compile_met, run_met=run_met,
                        met=compile_met and run_met)  # fmt: skip
    return out


def format_results(results: dict, bare_mv: dict, accept: dict, failed: dict) -> str:
    """Per pair both sides' compile and run, their ratios, steps, f traces, compile
    over a bare mv and the copies of `mv` in the HLO; per solver the timing stages;
    the bare mv, solution differences, the acceptance criteria, the failures."""
    both = lambda f: lambda r: f"{f(r['lineax'])}/{f(r['ours'])}"
    copies = lambda r: both(lambda t: f"{t['matmuls_in_hlo'] / (2 * r['layers']):g}")
    columns = (
        ("solver", lambda r: r["key"]),
        ("compile s (lineax/ours)", both(lambda t: f"{t['compile_total_s']:.3f}")),
        ("ours/lineax", lambda r: f"{r['compile_ratio_ours_over_lineax']:.2f}x"),
        ("run ms (lineax/ours)", both(lambda t: f"{t['run_s'] * 1e3:.1f}")),
        ("ours/lineax", lambda r: f"{r['run_ratio_ours_over_lineax']:.3f}x"),
        ("steps", both(lambda t: t["num_steps"])),
        ("f traces", both(lambda t: t["f_traces"]["total"])),
        ("compile / bare mv", both(lambda t: f"{t['compile_over_bare_mv']:.1f}x")),
        ("mv copies in HLO", lambda r: copies(r)(r)),
    )
    rows = [dict(row, key=key) for key, row in results.items()]
    stages = [("solver", lambda t: t["key"]), ("side", lambda t: t["side"])]
    stages += harness.stage_columns() + [("result", lambda t: t["result"])]
    stages += [("rel.resid", lambda t: f"{t['relative_residual']:.1e}")]
    items = [
        dict(row[side], key=row["key"], side=side) for row in rows for side in SIDES
    ]
    lines = [harness.column_table(columns, rows), harness.column_table(stages, items)]
    lines += [f"bare mv: compile total {bare_mv['compile_total_s']:.3f} s, run "
              f"{bare_mv['run_s'] * 1e3:.2f} ms, {bare_mv['matmuls_in_hlo']} matmuls "
              "in HLO"]  # fmt: skip
    lines += [f"{key}: |x_ours - x_lineax| / |x_lineax| = "
              f"{row['relative_difference_ours_vs_lineax']:.1e}; run per step "
              f"ours/lineax {row['run_per_step_ratio_ours_over_lineax']:.3f}x"
              for key, row in results.items()]  # fmt: skip
    met = harness.met
    lines += [f"acceptance {key}: compile {a['compile_ratio']:.2f}x (<= "
              f"{ACCEPTANCE['compile_ratio']}: {met(a['compile_met'])}), run "
              f"{a['run_ratio']:.3f}x (<= {ACCEPTANCE['run_ratio']}: "
              f"{met(a['run_met'])})" for key, a in accept.items()]  # fmt: skip
    lines += [f"not measured: {key} ({why})" for key, why in failed.items()]
    return "\n\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:])


def plot(results: dict, bare_mv: dict, config: dict, path) -> None:
    """Compile total (labelled with f traces) and run time (labelled with steps)
    per pair, both sides, against one bare mv."""
    plt = harness.pyplot()
    keys = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(max(11, 2.0 * len(keys) + 5), 4.8))
    width, xs = 0.38, range(len(keys))
    compile_title = "compile total (trace+lower+compile+first-call extra)"
    run_title = "run time per solve (median)"
    panels = (("compile_total_s", 1.0, compile_title, "seconds", "--"),
              ("run_s", 1e3, run_title, "milliseconds", ":"))  # fmt: skip
    for ax, (field, scale, title, ylabel, line) in zip(axes, panels):
        for offset, side in ((-1, "lineax"), (1, "ours")):
            values = [results[k][side][field] * scale for k in keys]
            at = [x + offset * width / 2 for x in xs]
            name = "lineax" if side == "lineax" else "lineax-dispatch"
            bars = ax.bar(at, values, width, label=name)
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
        ax.axhline(bare, color="k", ls=line, lw=1, label=f"one bare mv ({shown})")
        ax.legend(fontsize=8)
    fig.text(0.5, 0.005, "bar labels: f = runs of the Python function while "
             "compiling (small operator, closure_convert=False); st = solver steps",
             ha="center", fontsize=7)  # fmt: skip
    fig.suptitle(f"SPD {config['layers']}-layer (x2) n={config['n']} float32 "
                 f"FunctionLinearOperator, rtol=atol={config['rtol']:g}, "
                 f"max_steps={config['max_steps']}\n"
                 f"{harness.jax_label(openblas=True)}", fontsize=10)  # fmt: skip
    harness.save(fig, path, rect=(0, 0.03, 1, 1))


# ------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None):
    """The command line; sizes left out take the defaults (or `--quick`'s)."""
    parser = harness.parser(__doc__, FULL, QUICK)
    add = parser.add_argument
    add("--n", type=int, help=f"size (default {FULL['n']})")
    add("--layers", type=int, help="layers of B (default 32; an mv is 2x as many)")
    add("--solvers", type=harness.name_list(tuple(PAIRS)), default=tuple(PAIRS),
        help=f"comma-separated pairs among {','.join(PAIRS)} (default all)")  # fmt: skip
    add("--repeats", type=int, help="repeats per solver (median compile reported; "
        f"default {FULL['repeats']}, {QUICK['repeats']} with --quick)")  # fmt: skip
    add("--max-steps", type=int, default=MAX_STEPS, help="max_steps of every solver")
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Measure, print the tables, write `solvers.json` and `solvers.png`."""
    args = parse_args(argv)
    start = time.perf_counter()
    env = harness.environment()
    config = dict(n=args.n, layers=args.layers, matvecs_per_mv=2 * args.layers,
                  shift=SHIFT, dtype="float32", rtol=RTOL, atol=ATOL, seed=SEED,
                  max_steps=args.max_steps, repeats=args.repeats,
                  solvers=list(args.solvers), closure_convert=False,
                  tags=["positive_semidefinite_tag"],
                  operator_passed_as_jit_argument=True, f_trace_count_operator=dict(
                      n=COUNT_N, layers=COUNT_LAYERS))  # fmt: skip
    harness.print_setup(env, config)
    weights, scales, config["scale_factor_per_layer"] = harness.spd_layers(
        args.n, args.layers
    )
    results, bare_mv, failed = run_all(args, weights, scales)
    if not results:
        raise SystemExit("every selected pair failed: " + repr(failed))
    accept = acceptance(results)
    elapsed = time.perf_counter() - start
    print("\n" + format_results(results, bare_mv, accept, failed))
    print(f"total benchmark time: {elapsed:.1f} s")
    payload = dict(environment=env, config=config, failed=failed, bare_mv=bare_mv,
                   results=results, total_seconds=elapsed)  # fmt: skip
    payload["acceptance"] = dict(criteria=ACCEPTANCE, results=accept)
    plot_to = lambda path: plot(results, bare_mv, config, path)
    harness.write_results(args.out, "solvers", payload, plot_to)


if __name__ == "__main__":
    main()
