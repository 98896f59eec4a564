"""Compile time and run time of lineax-dispatch's iterative solvers against their
lineax counterparts, for an expensive matrix-free operator.

What is measured
----------------

The operator is a plain `lineax.FunctionLinearOperator` (`closure_convert=False`,
the function an `eqx.Partial` holding the weights, so that they are the operator's
arrays and jit arguments; tagged `lx.positive_semidefinite_tag`) whose function is
symmetric positive definite:

    A x = SHIFT * x + B^T (B x),    B x = s_L * (W_L @ (... s_1 * (W_1 @ x)))

with `L` dense `n x n` float32 layers `W_i ~ N(0, 1/n)` and per-layer elementwise
scales `s_i ~ U(0.5, 1.5)` (as in `callsites.py`), the transpose applied by hand
(`W_1^T (s_1 * ... W_L^T (s_L * y))`, each `W^T y` written `y @ W`), so one `mv` is
`2 L` matrix-vector products. The scales are multiplied by a common factor that
makes the largest eigenvalue of `B^T B` about 1 (found by power iteration), so the
spectrum of `A` lies in about `[SHIFT, 1 + SHIFT]` (condition number about 50)
and CG converges in a few tens of steps at `rtol = atol = 1e-5`.

Pairs (ours vs lineax's counterpart), all with the same `rtol`, `atol` and
`max_steps` on both sides and lineax's defaults for everything else:

    cg        lxd.CG              vs lx.CG
    bicgstab  lxd.BiCGStab        vs lx.BiCGStab
    gmres     lxd.GMRES           vs lx.GMRES
    lsmr      lxd.LSMR            vs lx.LSMR
    normal    lxd.Normal(lxd.CG)  vs lx.Normal(lx.CG)
    minres    lxd.MINRES          vs lx.CG (lineax has no MINRES)

A pair whose lineax-dispatch solver cannot be imported (or built with these
arguments) yet is skipped with a note; a pair whose measurement raises is reported
as failed and the others are still measured.

For each solver (each side of each pair), with a freshly built operator each time
(a new function object, hence a new closure-converted jaxpr, so that no cache of
jax or equinox carries over), the program

    f(params, b) = lx.linear_solve(op(params), b, solver, throw=False)

(returning the solution, `stats["num_steps"]` and the result code) is jitted with
the operator's arrays (the weights) as an *argument* and its static part closed
over, as `equinox.filter_jit` would split it (closing over the operator would
embed the weights as HLO constants), and timed as in `callsites.py`:

- trace: `jax.jit(f).trace(params, b)`;
- lower: `traced.lower()`;
- compile: `lowered.compile()`;
- first call: the first execution (XLA:CPU defers part of its compile work for
  dot-heavy code to it);
- run: the median of several further executions (`block_until_ready`).

"compile total" = trace + lower + compile + (first call - run). Each solver is
measured `--repeats` times (default 3; lineax and ours alternate), and the repeat
with the median compile total is reported (all repeats' compile totals and run
times are kept in the JSON). The same is done for ONE bare `op.mv` (jitted the same
way, `f(params, x) = op(params).mv(x)`), and each solver's compile total is also
reported as a multiple of it. Before the measurements one bare `mv` is measured
at the real size and discarded (warm-up).

Also reported per solver:

- `mv` copies in the compiled program: the number of `dot` instructions of the
  optimised HLO that take an `n x n` operand, divided by `2 L`;
- f traces: how many times the user's Python function runs while tracing,
  compiling and first calling the solve, counted on a small operator (n=16, two
  layers) built with `closure_convert=False` (so each `mv` call site calls the
  Python function); the small operator is closed over, not passed as an argument
  (a Python function is not a valid `jax.jit` argument). This also warms up the
  Python side of every solver before the timed measurements;
- the relative residual `|A x - b| / |b|` of the solution (computed outside jit)
  and the relative difference between the two sides' solutions.

`OPENBLAS_NUM_THREADS` is set to 1 (unless already set) before jax is imported.

How to run
----------

    .venv/bin/python benchmarks/solvers.py                    # n=1024, L=32, all pairs
    .venv/bin/python benchmarks/solvers.py --quick --solvers cg   # n=128, L=4, 1 repeat
    .venv/bin/python benchmarks/solvers.py --solvers cg,bicgstab --repeats 5

Results: `benchmarks/results/solvers.json` and `benchmarks/results/solvers.png`
(`--out` to change the folder).
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import lineax as lx  # noqa: E402

import lineax_dispatch as lxd  # noqa: E402


SEED = 0
DEFAULT_N = 1024
DEFAULT_LAYERS = 32
QUICK_N = 128
QUICK_LAYERS = 4
REPEATS = 3
QUICK_REPEATS = 1
RTOL = 1e-5
ATOL = 1e-5
MAX_STEPS = 500
SHIFT = 0.02
POWER_ITERATIONS = 30
# Steady-state timing: at least MIN_RUNS calls, more while under RUN_BUDGET_S.
# (More than callsites.py's 3: the run-time ratio is one of the things judged.)
MIN_RUNS = 5
MAX_RUNS = 25
RUN_BUDGET_S = 1.0
# The small operator of the f-trace count.
COUNT_N = 16
COUNT_LAYERS = 2
RESULTS_DIR = Path(__file__).resolve().parent / "results"
ACCEPTANCE = dict(solvers=("cg", "bicgstab"), compile_ratio=0.6, run_ratio=1.05)


# --------------------------------------------------------------------------------------
# The operator


def make_weights(n: int, layers: int, seed: int = SEED):
    """Weights `W_i ~ N(0, 1/n)` and per-layer scales `s_i ~ U(0.5, 1.5)`, float32,
    the scales then multiplied by a common factor so that `B^T B` has its largest
    eigenvalue about 1. Returns `(weights, scales, factor)`."""
    keys = jax.random.split(jax.random.key(seed), 2 * layers + 1)
    weights = tuple(
        jax.random.normal(keys[i], (n, n), jnp.float32) / jnp.sqrt(n)
        for i in range(layers)
    )
    scales = tuple(
        jax.random.uniform(keys[layers + i], (n,), jnp.float32, 0.5, 1.5)
        for i in range(layers)
    )
    gram = make_gram(weights, scales)
    x = jax.random.normal(keys[-1], (n,), jnp.float32)
    lam = jnp.array(1.0, jnp.float32)
    for _ in range(POWER_ITERATIONS):
        x = x / jnp.linalg.norm(x)
        y = gram(x)
        lam = jnp.vdot(x, y)
        x = y
    # Power iteration underestimates the top eigenvalue: leave a little room.
    factor = float((1.05 * lam) ** (-1.0 / (2 * layers)))
    scales = tuple(s * factor for s in scales)
    return jax.block_until_ready((weights, scales)) + (factor,)


def make_gram(weights, scales) -> Callable:
    """A new function object `x -> B^T (B x)` each call."""

    def gram(x):
        for w, s in zip(weights, scales):
            x = s * (w @ x)
        for w, s in zip(reversed(weights), reversed(scales)):
            # `W^T y` written as `y @ W`: `w.T @ y` makes XLA:CPU copy the
            # transposed matrix on every call.
            x = (s * x) @ w
        return x

    return gram


def make_spd(weights, scales) -> Callable:
    """A new function `x -> SHIFT * x + B^T (B x)` each call, as an `eqx.Partial`
    whose arrays (the weights) are leaves: with `closure_convert=False` they are
    then the operator's arrays, passed to the jitted program as arguments rather
    than embedded as constants (lineax's default closure conversion would make
    them constants of the program)."""

    def spd(weights, scales, x):
        return SHIFT * x + make_gram(weights, scales)(x)

    return eqx.Partial(spd, weights, scales)


def build_operator(fn: Callable, n: int, closure_convert: bool = False):
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    return lx.FunctionLinearOperator(
        fn, structure, lx.positive_semidefinite_tag, closure_convert
    )


# --------------------------------------------------------------------------------------
# The solvers


@dataclass(frozen=True)
class Pair:
    key: str
    ours_name: str
    lineax_name: str
    # `(module, rtol, atol, max_steps) -> solver`, module being lxd.solvers or lx.
    make_ours: Callable
    make_lineax: Callable
    needs: tuple[str, ...]  # names of lineax_dispatch.solvers the ours side needs


def _iterative(name: str) -> Callable:
    def make(module, rtol, atol, max_steps):
        return getattr(module, name)(rtol=rtol, atol=atol, max_steps=max_steps)

    return make


def _normal_cg(module, rtol, atol, max_steps):
    return module.Normal(module.CG(rtol=rtol, atol=atol, max_steps=max_steps))


PAIRS = {
    p.key: p
    for p in (
        Pair("cg", "lxd.CG", "lx.CG", _iterative("CG"), _iterative("CG"), ("CG",)),
        Pair(
            "bicgstab",
            "lxd.BiCGStab",
            "lx.BiCGStab",
            _iterative("BiCGStab"),
            _iterative("BiCGStab"),
            ("BiCGStab",),
        ),
        Pair(
            "gmres",
            "lxd.GMRES",
            "lx.GMRES",
            _iterative("GMRES"),
            _iterative("GMRES"),
            ("GMRES",),
        ),
        Pair(
            "lsmr",
            "lxd.LSMR",
            "lx.LSMR",
            _iterative("LSMR"),
            _iterative("LSMR"),
            ("LSMR",),
        ),
        Pair(
            "normal",
            "lxd.Normal(lxd.CG)",
            "lx.Normal(lx.CG)",
            _normal_cg,
            _normal_cg,
            ("Normal", "CG"),
        ),
        Pair(
            "minres",
            "lxd.MINRES",
            "lx.CG (no lx.MINRES)",
            _iterative("MINRES"),
            _iterative("CG"),
            ("MINRES",),
        ),
    )
}
SIDES = ("lineax", "ours")


def available_pairs(keys: Sequence[str]) -> tuple[list[Pair], dict[str, str]]:
    """The selected pairs whose lineax-dispatch solvers import, and a note for each
    one skipped."""
    try:
        import lineax_dispatch.solvers as ours_module
    except Exception as e:  # pragma: no cover - the package is being written
        return [], {k: f"lineax_dispatch.solvers does not import: {e!r}" for k in keys}
    pairs, skipped = [], {}
    for key in keys:
        pair = PAIRS[key]
        missing = [name for name in pair.needs if not hasattr(ours_module, name)]
        if missing:
            skipped[key] = "lineax_dispatch.solvers has no " + ", ".join(missing)
            continue
        try:
            make_solver(pair, "ours", RTOL, ATOL, MAX_STEPS)
        except Exception as e:
            skipped[key] = f"{pair.ours_name} cannot be built: {e!r}"
            continue
        pairs.append(pair)
    return pairs, skipped


def make_solver(pair: Pair, side: str, rtol: float, atol: float, max_steps: int):
    import lineax_dispatch.solvers as ours_module

    if side == "ours":
        return pair.make_ours(ours_module, rtol, atol, max_steps)
    return pair.make_lineax(lx, rtol, atol, max_steps)


# --------------------------------------------------------------------------------------
# Programs


def split(op) -> tuple[object, object]:
    return eqx.partition(op, eqx.is_array)


def make_solve_program(op, solver) -> tuple[Callable, object]:
    """`(f, params)` with `f(params, b)` the solve's (value, num_steps, result)."""
    params, static = split(op)

    def f(params, b):
        sol = lx.linear_solve(eqx.combine(params, static), b, solver, throw=False)
        return sol.value, sol.stats.get("num_steps", jnp.array(-1)), sol.result._value

    return f, params


def make_mv_program(op) -> tuple[Callable, object]:
    params, static = split(op)

    def f(params, x):
        return eqx.combine(params, static).mv(x)

    return f, params


# --------------------------------------------------------------------------------------
# Timing


def _timed(thunk: Callable):
    start = time.perf_counter()
    out = thunk()
    return out, time.perf_counter() - start


def steady_run_time(compiled, args, first_call_s: float) -> tuple[float, int]:
    """Median wall time of further calls; as many as fit RUN_BUDGET_S, within
    [MIN_RUNS, MAX_RUNS]."""
    estimate = max(first_call_s, 1e-6)
    _, warm = _timed(lambda: jax.block_until_ready(compiled(*args)))
    estimate = min(estimate, max(warm, 1e-6))
    runs = int(min(MAX_RUNS, max(MIN_RUNS, RUN_BUDGET_S // estimate)))
    times = [warm]
    for _ in range(runs - 1):
        times.append(_timed(lambda: jax.block_until_ready(compiled(*args)))[1])
    return statistics.median(times), runs


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
    f = jax.jit(program)
    traced, trace_s = _timed(lambda: f.trace(params, arg))
    lowered, lower_s = _timed(traced.lower)
    compiled, compile_s = _timed(lowered.compile)
    out, first_s = _timed(lambda: jax.block_until_ready(compiled(params, arg)))
    run_s, runs = steady_run_time(compiled, (params, arg), first_s)
    first_extra_s = max(first_s - run_s, 0.0)
    timings = dict(
        trace_s=trace_s,
        lower_s=lower_s,
        compile_s=compile_s,
        first_call_s=first_s,
        first_call_extra_s=first_extra_s,
        compile_total_s=trace_s + lower_s + compile_s + first_extra_s,
        run_s=run_s,
        runs=runs,
        matmuls_in_hlo=count_matmuls(compiled, n),
    )
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
    ordered = sorted(trials, key=lambda t: t[0]["compile_total_s"])
    timings, out = ordered[(len(ordered) - 1) // 2]
    timings = dict(timings)
    timings["compile_total_all_s"] = [t["compile_total_s"] for t, _ in trials]
    timings["run_all_s"] = [t["run_s"] for t, _ in trials]
    return timings, out


def result_name(index: int) -> str:
    try:
        names = {
            int(item._value): name for name, item in lx.RESULTS._name_to_item.items()
        }
        return names.get(index, str(index))
    except Exception:  # pragma: no cover - equinox internals changed
        return str(index)


# --------------------------------------------------------------------------------------
# The f-trace count


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
        f = jax.jit(lambda b: op.mv(b))
    else:
        f = jax.jit(lambda b: lx.linear_solve(op, b, solver, throw=False).value)
    before = counter[0]
    traced = f.trace(b)
    after_trace = counter[0]
    jax.block_until_ready(traced.lower().compile()(b))
    return dict(
        trace=after_trace - before,
        compile_and_first_call=counter[0] - after_trace,
        total=counter[0] - before,
    )


# --------------------------------------------------------------------------------------
# Reporting


def environment() -> dict:
    return dict(
        python=sys.version.split()[0],
        jax=jax.__version__,
        jaxlib=jaxlib.__version__,
        lineax=lx.__version__ if hasattr(lx, "__version__") else "?",
        equinox=eqx.__version__ if hasattr(eqx, "__version__") else "?",
        lineax_dispatch=lxd.__version__,
        platform=platform.platform(),
        machine=platform.machine(),
        cpu_count=os.cpu_count(),
        jax_backend=jax.default_backend(),
        jax_devices=[str(d) for d in jax.devices()],
        OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS"),
    )


def add_ratios(row: dict, bare_mv: dict) -> None:
    lin, ours = row["lineax"], row["ours"]
    row["compile_ratio_ours_over_lineax"] = (
        ours["compile_total_s"] / lin["compile_total_s"]
    )
    row["run_ratio_ours_over_lineax"] = ours["run_s"] / lin["run_s"]
    # The two sides may stop at different steps (float32 rounding in the stopping
    # test): the run time per step separates the cost of a step from that.
    row["run_per_step_ratio_ours_over_lineax"] = (
        ours["run_per_step_s"] / lin["run_per_step_s"]
    )
    for side in SIDES:
        t = row[side]
        t["compile_over_bare_mv"] = t["compile_total_s"] / bare_mv["compile_total_s"]


def acceptance(results: dict) -> dict:
    out = {}
    for key in ACCEPTANCE["solvers"]:
        if key not in results:
            continue
        row = results[key]
        compile_ratio = row["compile_ratio_ours_over_lineax"]
        compile_ok = compile_ratio <= ACCEPTANCE["compile_ratio"]
        run_ok = row["run_ratio_ours_over_lineax"] <= ACCEPTANCE["run_ratio"]
        out[key] = dict(
            compile_ratio=compile_ratio,
            run_ratio=row["run_ratio_ours_over_lineax"],
            compile_met=bool(compile_ok),
            run_met=bool(run_ok),
            met=bool(compile_ok and run_ok),
        )
    return out


def format_table(results: dict) -> str:
    columns = (
        ("solver", 9),
        ("lineax compile s", 17),
        ("ours compile s", 15),
        ("ours/lineax", 12),
        ("lineax run ms", 14),
        ("ours run ms", 12),
        ("ours/lineax", 12),
        ("steps (lineax/ours)", 20),
        ("f traces (lineax/ours)", 23),
        ("compile / bare mv (lineax, ours)", 33),
        ("mv copies in HLO (lineax/ours)", 31),
    )
    header = " | ".join(
        f"{title:<{width}}" if i == 0 else f"{title:>{width}}"
        for i, (title, width) in enumerate(columns)
    )
    lines = [header, "-" * len(header)]
    for key, row in results.items():
        lin, ours = row["lineax"], row["ours"]

        def copies(t, layers=row["layers"]):
            m = t["matmuls_in_hlo"]
            return "?" if m < 0 else f"{m / (2 * layers):g}"

        cells = (
            key,
            f"{lin['compile_total_s']:.3f}",
            f"{ours['compile_total_s']:.3f}",
            f"{row['compile_ratio_ours_over_lineax']:.2f}x",
            f"{lin['run_s'] * 1e3:.1f}",
            f"{ours['run_s'] * 1e3:.1f}",
            f"{row['run_ratio_ours_over_lineax']:.3f}x",
            f"{lin['num_steps']}/{ours['num_steps']}",
            f"{lin['f_traces']['total']}/{ours['f_traces']['total']}",
            f"{lin['compile_over_bare_mv']:.1f}x, {ours['compile_over_bare_mv']:.1f}x",
            f"{copies(lin)}/{copies(ours)}",
        )
        lines.append(
            " | ".join(
                f"{cell:<{width}}" if i == 0 else f"{cell:>{width}}"
                for i, (cell, (_, width)) in enumerate(zip(cells, columns))
            )
        )
    return "\n".join(lines)


def format_details(results: dict) -> str:
    header = (
        f"{'solver':<9}{'side':<8}{'trace':>9}{'lower':>9}{'compile':>9}"
        f"{'1st-extra':>11}{'comp.total':>12}{'run':>11}{'run/step':>11}{'runs':>6}"
        f"  {'result':<18}{'rel.resid':>10}  all compile totals (s)"
    )
    lines = [header, "-" * len(header)]
    for key, row in results.items():
        for side in SIDES:
            t = row[side]
            lines.append(
                f"{key:<9}{side:<8}{t['trace_s']:>8.3f}s{t['lower_s']:>8.3f}s"
                f"{t['compile_s']:>8.3f}s{t['first_call_extra_s']:>10.3f}s"
                f"{t['compile_total_s']:>11.3f}s{t['run_s'] * 1e3:>8.1f} ms"
                f"{t['run_per_step_s'] * 1e3:>8.3f} ms{t['runs']:>6}  {t['result']:<18}"
                f"{t['relative_residual']:>10.1e}  "
                + ", ".join(f"{c:.2f}" for c in t["compile_total_all_s"])
            )
    return "\n".join(lines)


def plot(results: dict, bare_mv: dict, config: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(results)
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(11, 2.0 * len(keys) + 5), 4.8))
    width = 0.38
    xs = range(len(keys))
    for ax, field, scale, title, ylabel in (
        (
            left,
            "compile_total_s",
            1.0,
            "compile total (trace+lower+compile+first-call extra)",
            "seconds",
        ),
        (right, "run_s", 1e3, "run time per solve (median)", "milliseconds"),
    ):
        for offset, side, label in (
            (-width / 2, "lineax", "lineax"),
            (width / 2, "ours", "lineax-dispatch"),
        ):
            values = [results[k][side][field] * scale for k in keys]
            bars = ax.bar([x + offset for x in xs], values, width, label=label)
            if field == "compile_total_s":
                ax.bar_label(
                    bars,
                    labels=[f"{results[k][side]['f_traces']['total']}f" for k in keys],
                    fontsize=7,
                )
            else:
                ax.bar_label(
                    bars,
                    labels=[f"{results[k][side]['num_steps']} st" for k in keys],
                    fontsize=7,
                )
        ax.set_xticks(list(xs), [results[k]["label"] for k in keys], fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    left.axhline(
        bare_mv["compile_total_s"],
        color="k",
        linestyle="--",
        linewidth=1,
        label=f"one bare mv ({bare_mv['compile_total_s']:.2f} s)",
    )
    right.axhline(
        bare_mv["run_s"] * 1e3,
        color="k",
        linestyle=":",
        linewidth=1,
        label=f"one bare mv ({bare_mv['run_s'] * 1e3:.3g} ms)",
    )
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.text(
        0.5,
        0.005,
        "bar labels: f = runs of the Python function while compiling (small operator, "
        "closure_convert=False); st = solver steps",
        ha="center",
        fontsize=7,
    )
    fig.suptitle(
        f"SPD {config['layers']}-layer (x2) n={config['n']} float32 "
        f"FunctionLinearOperator, rtol=atol={config['rtol']:g}, "
        f"max_steps={config['max_steps']}\n"
        f"jax {jax.__version__} {jax.default_backend()}, "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# Main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n", type=int, default=None, help=f"size (default {DEFAULT_N})"
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help=f"layers of B (default {DEFAULT_LAYERS}; one mv is 2x this many matvecs)",
    )
    parser.add_argument(
        "--solvers",
        type=lambda s: tuple(k.strip().lower() for k in s.split(",") if k.strip()),
        default=tuple(PAIRS),
        help="comma-separated pairs among " + ",".join(PAIRS) + " (default all)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="fresh-operator repeats per solver, the median-compile one reported "
        f"(default {REPEATS}; {QUICK_REPEATS} with --quick)",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=MAX_STEPS,
        help=f"max_steps of every solver, both sides (default {MAX_STEPS})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"n={QUICK_N}, layers={QUICK_LAYERS}, repeats={QUICK_REPEATS} unless "
        "given",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder")
    args = parser.parse_args(argv)
    unknown = [k for k in args.solvers if k not in PAIRS]
    if unknown:
        parser.error(f"unknown solvers {unknown}; choose among {list(PAIRS)}")
    n_default, layers_default, repeats_default = (
        (QUICK_N, QUICK_LAYERS, QUICK_REPEATS)
        if args.quick
        else (DEFAULT_N, DEFAULT_LAYERS, REPEATS)
    )
    args.n = n_default if args.n is None else args.n
    args.layers = layers_default if args.layers is None else args.layers
    args.repeats = repeats_default if args.repeats is None else args.repeats
    return args


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
    row["relative_difference_ours_vs_lineax"] = float(
        jnp.linalg.norm(values["ours"] - values["lineax"])
        / jnp.linalg.norm(values["lineax"])
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


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    env = environment()
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
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    print("config: " + ", ".join(f"{k}={v}" for k, v in config.items()))

    pairs, skipped = available_pairs(args.solvers)
    for key, why in skipped.items():
        print(f"  skipping {key}: {why}", flush=True)
    if not pairs:
        print("nothing to measure")
        return

    weights, scales, factor = make_weights(args.n, args.layers)
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
    print(
        f"\nbare mv: compile total {bare_mv['compile_total_s']:.3f} s, "
        f"run {bare_mv['run_s'] * 1e3:.2f} ms, {bare_mv['matmuls_in_hlo']} matmuls "
        f"in HLO ({2 * args.layers} per mv)"
    )
    for key, row in results.items():
        print(
            f"{key}: |x_ours - x_lineax| / |x_lineax| = "
            f"{row['relative_difference_ours_vs_lineax']:.1e}; "
            "run per step ours/lineax "
            f"{row['run_per_step_ratio_ours_over_lineax']:.3f}x"
        )
    for key, a in accept.items():
        print(
            f"acceptance {key}: compile {a['compile_ratio']:.2f}x "
            f"(<= {ACCEPTANCE['compile_ratio']}: "
            f"{'met' if a['compile_met'] else 'NOT met'}), run {a['run_ratio']:.3f}x "
            f"(<= {ACCEPTANCE['run_ratio']}: {'met' if a['run_met'] else 'NOT met'})"
        )
    for key, why in {**skipped, **failed}.items():
        print(f"not measured: {key} ({why})")
    print(f"total benchmark time: {elapsed:.1f} s")

    args.out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out / "solvers.json", args.out / "solvers.png"
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
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    plot(results, bare_mv, config, png_path)
    print(f"wrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
