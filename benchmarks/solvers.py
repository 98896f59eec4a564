"""Compile time and run time of lineax-dispatch's iterative solvers against their
lineax counterparts, for an expensive matrix-free operator.

What is measured
----------------

The operator is a plain `lineax.FunctionLinearOperator` (`closure_convert=False`,
the function an `eqx.Partial` holding the weights, so that they are the operator's
arrays and jit arguments; tagged `lx.positive_semidefinite_tag`) whose function is
the SPD map of `harness.spd_function`, `A x = SHIFT * x + B^T (B x)`, `B` the
dense-layer chain (`L` layers, so one `mv` is `2 L` matrix-vector products) with
its scales multiplied by a common factor that makes the largest eigenvalue of
`B^T B` about 1: the spectrum of `A` lies in about `[SHIFT, 1 + SHIFT]`
(condition number about 50) and CG converges in a few tens of steps at
`rtol = atol = 1e-5`.

Pairs (ours vs lineax's counterpart), with the same `rtol`, `atol` and
`max_steps` on both sides and lineax's defaults for everything else: `PAIRS`
(lineax has no MINRES: `minres` is compared with lineax's CG). A pair whose
lineax-dispatch solver does not exist or cannot be built is skipped with a note; a
pair whose measurement raises is reported as failed and the others are still
measured.

For each solver (each side of each pair), with a freshly built operator each time
(a new function object, hence a new static part, so that no cache of jax or
equinox carries over), the program

    f(params, b) = lx.linear_solve(op(params), b, solver, throw=False)

(returning the solution, `stats["num_steps"]` and the result code) is timed as in
`harness.time_program`, with at least 5 runs. Each solver is measured `--repeats`
times (default 3; lineax and ours alternate), and the repeat with the median
compile total is reported (all repeats' compile totals and run times are in the
JSON). The same is done for ONE bare `op.mv`, and each solver's compile total is
also reported as a multiple of it. Before the measurements one bare `mv` is
measured at the real size and discarded (warm-up).

Also reported per solver:

- `mv` copies in the compiled program: the `dot` instructions of the optimised
  HLO that take an `n x n` operand, divided by `2 L`;
- f traces: how many times the user's Python function runs while tracing,
  compiling and first calling the solve, counted on a small operator (n=16, two
  layers, closed over); this also warms up the Python side of every solver;
- the relative residual `|A x - b| / |b|` of the solution and the relative
  difference between the two sides' solutions.

How to run
----------

    python -m benchmarks.solvers                          # n=1024, L=32, all pairs
    python -m benchmarks.solvers --quick --solvers cg     # n=128, L=4, 1 repeat
    python -m benchmarks.solvers --solvers cg,bicgstab --repeats 5

Results: `benchmarks/results/solvers.json` and `solvers.png` (`--out DIR`). The
ratios, tables and plot are in `_solvers_report.py` (one file would be some 580
lines).
"""

import re
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import lineax as lx

from benchmarks import harness
from benchmarks._solvers_report import (
    ACCEPTANCE,
    acceptance,
    add_ratios,
    format_details,
    format_summary,
    format_table,
    plot,
    SIDES,
)
from benchmarks.harness import SEED, SHIFT
from lineax_dispatch import solvers as ours_module


FULL = dict(n=1024, layers=32, repeats=3)
QUICK = dict(n=128, layers=4, repeats=1)
RTOL = ATOL = 1e-5
MAX_STEPS = 500
# At least MIN_RUNS steady calls (more than callsites' 3: the run-time ratio is
# one of the things judged).
MIN_RUNS = 5
# The small operator of the f-trace count.
COUNT_N, COUNT_LAYERS = 16, 2


# ------------------------------------------------------------------ cases


# Each pair: ours (of `lineax_dispatch.solvers`) and lineax's counterpart, as names
# of solver classes; "Normal" is `Normal(CG)`.
PAIRS = dict(
    cg=("CG", "CG"), bicgstab=("BiCGStab", "BiCGStab"), gmres=("GMRES", "GMRES"),
    lsmr=("LSMR", "LSMR"), normal=("Normal", "Normal"), minres=("MINRES", "CG"),
)  # fmt: skip


def solver_name(key: str, side: str) -> str:
    """`lxd.CG`, `lx.Normal(lx.CG)`, `lx.CG (no lx.MINRES)`..."""
    ours, theirs = PAIRS[key]
    prefix, name = ("lxd", ours) if side == "ours" else ("lx", theirs)
    text = f"{prefix}.Normal({prefix}.CG)" if name == "Normal" else f"{prefix}.{name}"
    return text if name == ours else f"{text} (no lx.{ours})"


def make_solver(key: str, side: str, max_steps: int):
    """The solver of one side of a pair."""
    module, name = (
        (ours_module, PAIRS[key][0]) if side == "ours" else (lx, PAIRS[key][1])
    )
    if name == "Normal":
        return module.Normal(module.CG(rtol=RTOL, atol=ATOL, max_steps=max_steps))
    return getattr(module, name)(rtol=RTOL, atol=ATOL, max_steps=max_steps)


def available_pairs(keys: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The selected pairs whose lineax-dispatch solvers exist and build, and a
    note for each one skipped."""
    pairs, skipped = [], {}
    for key in keys:
        needs = ("Normal", "CG") if PAIRS[key][0] == "Normal" else PAIRS[key][:1]
        missing = [name for name in needs if not hasattr(ours_module, name)]
        if missing:
            skipped[key] = "lineax_dispatch.solvers has no " + ", ".join(missing)
            continue
        try:
            make_solver(key, "ours", MAX_STEPS)
        except Exception as e:
            skipped[key] = f"{solver_name(key, 'ours')} cannot be built: {e!r}"
            continue
        pairs.append(key)
    return pairs, skipped


def solve_body(solver) -> Callable:
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
    try:
        text = compiled.as_text()
    except Exception:  # pragma: no cover - backend without HLO text
        return -1
    shapes, dots = {}, []
    for match in filter(None, map(_INSTRUCTION.match, text.splitlines())):
        name, shape, opcode, rest = match.groups()
        shapes[name] = shape
        if opcode == "dot":
            dots.append(re.findall(r"%[\w.\-]+", rest.split(")")[0]))
    square = f"f32[{n},{n}]"
    return sum(any(shapes.get(o) == square for o in operands) for operands in dots)


def measure(body: Callable, weights, scales, arg, n: int) -> tuple[dict, object]:
    """Times `body(op, arg)` on a fresh operator, with its HLO matmul count."""
    op = harness.spd_operator(harness.spd_function(weights, scales), n)
    program, params, _ = harness.split_program(op, body)
    timings, compiled, out = harness.time_program(program, params, arg, MIN_RUNS)
    timings["matmuls_in_hlo"] = count_matmuls(compiled, n)
    return timings, out


def measure_mv(weights, scales, n: int) -> dict:
    """One bare `mv`."""
    x = jax.random.normal(jax.random.key(SEED + 1), (n,), jnp.float32)
    return measure(lambda op, x: op.mv(x), weights, scales, x, n)[0]


def measure_solve(solver, weights, scales, b, n: int) -> tuple[dict, jax.Array]:
    """One solve, with its steps and result."""
    timings, (value, num_steps, result) = measure(
        solve_body(solver), weights, scales, b, n
    )
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
    spd = harness.spd_function(weights, scales)
    counter = [0]

    def counted(x):
        counter[0] += 1
        return spd(x)

    op = harness.spd_operator(counted, COUNT_N)
    b = jnp.ones((COUNT_N,), jnp.float32)
    mv = lambda b: op.mv(b)
    solve = lambda b: lx.linear_solve(op, b, solver, throw=False).value
    trace, rest = harness.count_runs(mv if mv_only else solve, b, counter)
    return dict(trace=trace, compile_and_first_call=rest, total=trace + rest)


def measure_pair(args, key: str, weights, scales, b, bare_mv: dict) -> dict:
    """Both sides of a pair, alternating, `args.repeats` times."""
    solvers = {side: make_solver(key, side, args.max_steps) for side in SIDES}
    f_traces = {side: count_f_traces(solvers[side]) for side in SIDES}
    trials = {side: [] for side in SIDES}
    for _ in range(args.repeats):
        for side in SIDES:
            trials[side].append(
                measure_solve(solvers[side], weights, scales, b, args.n)
            )
    names = {side: solver_name(key, side) for side in SIDES}
    row = dict(
        label=f"{names['lineax']}\nvs {names['ours']}",
        lineax_solver=names["lineax"],
        ours_solver=names["ours"],
        layers=args.layers,
    )
    values = {}
    for side in SIDES:
        timings, values[side] = pick_median(trials[side])
        ax = harness.spd_function(weights, scales)(values[side])
        timings["f_traces"] = f_traces[side]
        timings["relative_residual"] = harness.relative_error(ax, b)
        timings["solver_repr"] = repr(solvers[side])
        row[side] = timings
    row["relative_difference_ours_vs_lineax"] = harness.relative_error(
        values["ours"], values["lineax"]
    )
    add_ratios(row, bare_mv)
    return row


def run_all(args, pairs: list[str], weights, scales) -> tuple[dict, dict, dict]:
    """The results per pair, the bare-mv reference and a note for each pair whose
    measurement raised (the others are still measured)."""
    b = jax.random.normal(jax.random.key(SEED + 3), (args.n,), jnp.float32)
    measure_mv(weights, scales, args.n)  # warm-up, discarded
    bare_mv, _ = pick_median(
        [(measure_mv(weights, scales, args.n), None) for _ in range(args.repeats)]
    )
    bare_mv["f_traces"] = count_f_traces(None, mv_only=True)
    print(
        f"  bare mv        compile total {bare_mv['compile_total_s']:8.3f} s"
        f"   run {bare_mv['run_s'] * 1e3:9.2f} ms   f traces "
        f"{bare_mv['f_traces']['total']}",
        flush=True,
    )
    results, failed = {}, {}
    for key in pairs:
        try:
            results[key] = row = measure_pair(args, key, weights, scales, b, bare_mv)
        except Exception as e:
            failed[key] = f"{type(e).__name__}: {e}"
            print(f"  {key:<9}FAILED: {failed[key]}", flush=True)
            continue
        for side, t in ((side, row[side]) for side in SIDES):
            print(
                f"  {key:<9}{side:<7}compile total {t['compile_total_s']:8.3f} s"
                f"   run {t['run_s'] * 1e3:9.2f} ms   steps {t['num_steps']:>4}"
                f"   {t['result']}   rel.resid {t['relative_residual']:.1e}"
                f"   f traces {t['f_traces']['total']}",
                flush=True,
            )
    return results, bare_mv, failed


# ------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None):
    """The command line; sizes left out take the defaults (or `--quick`'s)."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--n", type=int, help=f"size (default {FULL['n']})")
    parser.add_argument(
        "--layers",
        type=int,
        help=f"layers of B (default {FULL['layers']}; one mv is 2x this many matvecs)",
    )
    parser.add_argument(
        "--solvers",
        type=harness.name_list(tuple(PAIRS)),
        default=tuple(PAIRS),
        help="comma-separated pairs among " + ",".join(PAIRS) + " (default all)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="fresh-operator repeats per solver, the median-compile one reported "
        f"(default {FULL['repeats']}; {QUICK['repeats']} with --quick)",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=MAX_STEPS,
        help=f"max_steps of every solver, both sides (default {MAX_STEPS})",
    )
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Measure, print the tables, write `solvers.json` and `solvers.png`."""
    args = parse_args(argv)
    start = time.perf_counter()
    env = harness.environment()
    config = dict(
        n=args.n,
        layers=args.layers,
        matvecs_per_mv=2 * args.layers,
        shift=SHIFT,
        dtype="float32",
        rtol=RTOL,
        atol=ATOL,
        max_steps=args.max_steps,
        repeats=args.repeats,
        solvers=list(args.solvers),
        closure_convert=False,
        tags=["positive_semidefinite_tag"],
        seed=SEED,
        operator_passed_as_jit_argument=True,
        f_trace_count_operator=dict(
            n=COUNT_N, layers=COUNT_LAYERS, closure_convert=False
        ),
    )
    harness.print_setup(env, config)

    pairs, skipped = available_pairs(args.solvers)
    for key, why in skipped.items():
        print(f"  skipping {key}: {why}", flush=True)
    if not pairs:
        print("nothing to measure")
        return
    weights, scales, factor = harness.spd_layers(args.n, args.layers)
    config["scale_factor_per_layer"] = factor
    results, bare_mv, failed = run_all(args, pairs, weights, scales)
    if not results:
        print("every selected pair failed: " + repr(failed))
        return
    accept = acceptance(results)
    elapsed = time.perf_counter() - start

    print()
    print(format_table(results))
    print()
    print(format_details(results))
    not_measured = {**skipped, **failed}
    print(format_summary(results, bare_mv, args.layers, accept, not_measured))
    print(f"total benchmark time: {elapsed:.1f} s")

    payload = dict(
        environment=env,
        config=config,
        skipped=skipped,
        failed=failed,
        bare_mv=bare_mv,
        results=results,
        acceptance=dict(criteria=ACCEPTANCE, results=accept),
        total_seconds=elapsed,
    )
    harness.write_results(
        args.out, "solvers", payload, lambda path: plot(results, bare_mv, config, path)
    )


if __name__ == "__main__":
    main()
