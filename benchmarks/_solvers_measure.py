"""The measurements of `solvers.py`: the SPD operator, the jitted programs (a solve,
one bare `mv`), their timing, the HLO matmul count and the f-trace count, per
pair and for the bare `mv`."""

import re
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
from _common import count_runs, median_trial, relative_error, SEED, time_program
from _operators import apply_gram, power_iteration, random_layers
from _solvers_pairs import ATOL, make_solver, Pair, result_name, RTOL, SIDES
from _solvers_report import add_ratios


SHIFT = 0.02
POWER_ITERATIONS = 30
# Steady-state timing: at least MIN_RUNS calls (more than callsites.py's 3: the
# run-time ratio is one of the things judged).
MIN_RUNS = 5
# The small operator of the f-trace count.
COUNT_N = 16
COUNT_LAYERS = 2


# --------------------------------------------------------------------------------------
# The operator


def make_weights(n: int, layers: int, seed: int = SEED):
    """Weights `W_i ~ N(0, 1/n)` and per-layer scales `s_i ~ U(0.5, 1.5)`, float32,
    the scales then multiplied by a common factor so that `B^T B` has its largest
    eigenvalue about 1. Returns `(weights, scales, factor)`."""
    keys = jax.random.split(jax.random.key(seed), 2 * layers + 1)
    weights, scales = random_layers(keys, n, layers)
    x = jax.random.normal(keys[-1], (n,), jnp.float32)
    lam = power_iteration(lambda x: apply_gram(weights, scales, x), x, POWER_ITERATIONS)
    # Power iteration underestimates the top eigenvalue: leave a little room.
    factor = float((1.05 * lam) ** (-1.0 / (2 * layers)))
    scales = tuple(s * factor for s in scales)
    return jax.block_until_ready((weights, scales)) + (factor,)


def make_spd(weights, scales) -> Callable:
    """A new function `x -> SHIFT * x + B^T (B x)` each call, as an `eqx.Partial`
    whose arrays (the weights) are leaves: with `closure_convert=False` they are
    then the operator's arrays, passed to the jitted program as arguments rather
    than possibly embedded as constants (with lineax's default closure conversion
    that depends on jax's `jax_use_simplified_jaxpr_constants` setting)."""

    def spd(weights, scales, x):
        return SHIFT * x + apply_gram(weights, scales, x)

    return eqx.Partial(spd, weights, scales)


def build_operator(fn: Callable, n: int, closure_convert: bool = False):
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    return lx.FunctionLinearOperator(
        fn, structure, lx.positive_semidefinite_tag, closure_convert
    )


# --------------------------------------------------------------------------------------
# Programs


def make_solve_program(op, solver) -> tuple[Callable, object]:
    """`(f, params)` with `f(params, b)` the solve's (value, num_steps, result)."""
    params, static = eqx.partition(op, eqx.is_array)

    def f(params, b):
        sol = lx.linear_solve(eqx.combine(params, static), b, solver, throw=False)
        return sol.value, sol.stats.get("num_steps", jnp.array(-1)), sol.result._value

    return f, params


def make_mv_program(op) -> tuple[Callable, object]:
    params, static = eqx.partition(op, eqx.is_array)

    def f(params, x):
        return eqx.combine(params, static).mv(x)

    return f, params


# --------------------------------------------------------------------------------------
# Measurements


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
    square = f"f32[{n},{n}]"
    shapes, dots = {}, []
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        name, shape, opcode, rest = match.groups()
        shapes[name] = shape
        if opcode == "dot":
            dots.append(re.findall(r"%[\w.\-]+", rest.split(")")[0]))
    return sum(1 for operands in dots if any(shapes.get(o) == square for o in operands))


def measure_program(program: Callable, params, arg, n: int) -> tuple[dict, object]:
    timings, compiled, out = time_program(program, params, arg, MIN_RUNS)
    timings["matmuls_in_hlo"] = count_matmuls(compiled, n)
    return timings, out


def measure_mv(weights, scales, n: int) -> dict:
    op = build_operator(make_spd(weights, scales), n)
    x = jax.random.normal(jax.random.key(SEED + 1), (n,), jnp.float32)
    program, params = make_mv_program(op)
    timings, _ = measure_program(program, params, x, n)
    return timings


def measure_solve(solver, weights, scales, b, n: int) -> tuple[dict, jax.Array]:
    op = build_operator(make_spd(weights, scales), n)
    program, params = make_solve_program(op, solver)
    timings, (value, num_steps, result) = measure_program(program, params, b, n)
    timings["num_steps"] = int(num_steps)
    timings["run_per_step_s"] = timings["run_s"] / max(int(num_steps), 1)
    timings["result"] = result_name(int(result))
    return timings, value


def pick_median(trials: list[tuple[dict, object]]) -> tuple[dict, object]:
    """The trial with the median compile total, with every trial's compile total
    and run time added."""
    timings, out = median_trial(trials, "compile_total_s")
    timings = dict(timings)
    timings["compile_total_all_s"] = [t["compile_total_s"] for t, _ in trials]
    timings["run_all_s"] = [t["run_s"] for t, _ in trials]
    return timings, out


def count_f_traces(solver, mv_only: bool = False) -> dict:
    """Runs of the user's Python function while tracing / compiling and first
    calling a solve (or one bare mv) on a small operator with
    `closure_convert=False`."""
    weights, scales, _ = make_weights(COUNT_N, COUNT_LAYERS, SEED + 2)
    spd = make_spd(weights, scales)
    counter = [0]

    def counted(x):
        counter[0] += 1
        return spd(x)

    op = build_operator(counted, COUNT_N, closure_convert=False)
    b = jnp.ones((COUNT_N,), jnp.float32)
    if mv_only:
        trace, rest = count_runs(lambda b: op.mv(b), b, counter)
    else:
        trace, rest = count_runs(
            lambda b: lx.linear_solve(op, b, solver, throw=False).value, b, counter
        )
    return dict(trace=trace, compile_and_first_call=rest, total=trace + rest)


def relative_residual(weights, scales, x: jax.Array, b: jax.Array) -> float:
    ax = make_spd(weights, scales)(x)
    return float(jnp.linalg.norm(ax - b) / jnp.linalg.norm(b))


def measure_pair(args, pair: Pair, weights, scales, b, bare_mv: dict) -> dict:
    n = args.n
    solvers = {
        side: make_solver(pair, side, RTOL, ATOL, args.max_steps) for side in SIDES
    }
    f_traces = {side: count_f_traces(solvers[side]) for side in SIDES}
    trials = {side: [] for side in SIDES}
    for _ in range(args.repeats):
        for side in SIDES:
            trials[side].append(measure_solve(solvers[side], weights, scales, b, n))
    row = dict(
        label=f"{pair.lineax_name}\nvs {pair.ours_name}",
        lineax_solver=pair.lineax_name,
        ours_solver=pair.ours_name,
        layers=args.layers,
    )
    values = {}
    for side in SIDES:
        timings, value = pick_median(trials[side])
        timings["f_traces"] = f_traces[side]
        timings["relative_residual"] = relative_residual(weights, scales, value, b)
        timings["solver_repr"] = repr(solvers[side])
        row[side] = timings
        values[side] = value
    row["relative_difference_ours_vs_lineax"] = relative_error(
        values["ours"], values["lineax"]
    )
    add_ratios(row, bare_mv)
    return row


def run_all(
    args, pairs: list[Pair], weights, scales
) -> tuple[dict, dict, dict[str, str]]:
    """Returns the results per pair, the bare-mv reference and a note for each
    pair whose measurement raised (the others are still measured)."""
    n = args.n
    b = jax.random.normal(jax.random.key(SEED + 3), (n,), jnp.float32)

    # Warm-up (discarded), then the bare-mv reference.
    measure_mv(weights, scales, n)
    bare_mv, _ = pick_median(
        [(measure_mv(weights, scales, n), None) for _ in range(args.repeats)]
    )
    bare_mv["f_traces"] = count_f_traces(None, mv_only=True)
    print(
        f"  bare mv        compile total {bare_mv['compile_total_s']:8.3f} s"
        f"   run {bare_mv['run_s'] * 1e3:9.2f} ms   f traces "
        f"{bare_mv['f_traces']['total']}",
        flush=True,
    )

    results, failed = {}, {}
    for pair in pairs:
        try:
            row = measure_pair(args, pair, weights, scales, b, bare_mv)
        except Exception as e:
            failed[pair.key] = f"{type(e).__name__}: {e}"
            print(f"  {pair.key:<9}FAILED: {failed[pair.key]}", flush=True)
            continue
        results[pair.key] = row
        for side in SIDES:
            t = row[side]
            print(
                f"  {pair.key:<9}{side:<7}compile total {t['compile_total_s']:8.3f} s"
                f"   run {t['run_s'] * 1e3:9.2f} ms   steps {t['num_steps']:>4}"
                f"   {t['result']}   rel.resid {t['relative_residual']:.1e}"
                f"   f traces {t['f_traces']['total']}",
                flush=True,
            )
    return results, bare_mv, failed
