"""Shared by the benchmark scripts: the environment record, the timing of a jitted
program, picking the median repeat, counting runs of the user's function, and
writing the results.

Importing this module sets `OPENBLAS_NUM_THREADS` to 1 (unless already set)
before jax is imported, so the scripts import it before anything that imports jax.

Timing of a jitted program `f(params, arg)` (`time_program`), with the operator's
arrays as `params` and its static part closed over, as `equinox.filter_jit` would
split it:

- trace: `jax.jit(f).trace(params, arg)`;
- lower: `traced.lower()`;
- compile: `lowered.compile()`;
- first call: the first execution (`block_until_ready`); for dot-heavy code
  XLA:CPU defers part of its compile work to it, and `Outline` compiles its callee
  then;
- run: the median of further executions, as many as fit in `RUN_BUDGET_S`, at
  least `min_runs` and at most `MAX_RUNS`.

"compile total" = trace + lower + compile + (first call - run).
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import lineax as lx  # noqa: E402

import lineax_dispatch as lxd  # noqa: E402


SEED = 0
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Steady-state timing: at least `min_runs` calls, more while under RUN_BUDGET_S.
MAX_RUNS = 25
RUN_BUDGET_S = 1.0


# --------------------------------------------------------------------------------------
# Environment


def environment(load_average: bool = False) -> dict:
    """Versions, machine and jax backend; `load_average` adds `os.getloadavg()`."""
    env = dict(
        python=sys.version.split()[0],
        jax=jax.__version__,
        jaxlib=jaxlib.__version__,
        lineax=lx.__version__ if hasattr(lx, "__version__") else "?",
        equinox=eqx.__version__ if hasattr(eqx, "__version__") else "?",
        lineax_dispatch=lxd.__version__,
        platform=platform.platform(),
        machine=platform.machine(),
        cpu_count=os.cpu_count(),
    )
    if load_average:
        env["load_average"] = load_average_now()
    env.update(
        jax_backend=jax.default_backend(),
        jax_devices=[str(d) for d in jax.devices()],
        OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS"),
    )
    return env


def load_average_now():
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def print_setup(env: dict, config: dict) -> None:
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    print("config: " + ", ".join(f"{k}={v}" for k, v in config.items()))


# --------------------------------------------------------------------------------------
# Timing


def timed(thunk: Callable):
    """`(thunk(), seconds)`."""
    start = time.perf_counter()
    out = thunk()
    return out, time.perf_counter() - start


def steady_run_time(
    compiled, args, first_call_s: float, min_runs: int
) -> tuple[float, int]:
    """Median wall time of further calls; as many as fit RUN_BUDGET_S, within
    [min_runs, MAX_RUNS]."""
    estimate = max(first_call_s, 1e-6)
    _, warm = timed(lambda: jax.block_until_ready(compiled(*args)))
    estimate = min(estimate, max(warm, 1e-6))
    runs = int(min(MAX_RUNS, max(min_runs, RUN_BUDGET_S // estimate)))
    times = [warm]
    for _ in range(runs - 1):
        times.append(timed(lambda: jax.block_until_ready(compiled(*args)))[1])
    return statistics.median(times), runs


def time_program(program: Callable, params, arg, min_runs: int):
    """Times `jax.jit(program)` on `(params, arg)` (see the module docstring).
    Returns `(timings, compiled, out)`, `out` the first call's output."""
    f = jax.jit(program)
    traced, trace_s = timed(lambda: f.trace(params, arg))
    lowered, lower_s = timed(traced.lower)
    compiled, compile_s = timed(lowered.compile)
    out, first_s = timed(lambda: jax.block_until_ready(compiled(params, arg)))
    run_s, runs = steady_run_time(compiled, (params, arg), first_s, min_runs)
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
    )
    return timings, compiled, out


def median_trial(trials: list[tuple[dict, object]], key: str) -> tuple[dict, object]:
    """The `(timings, out)` trial with the median `timings[key]` (the lower median
    for an even count)."""
    ordered = sorted(trials, key=lambda t: t[0][key])
    return ordered[(len(ordered) - 1) // 2]


def relative_error(out, reference) -> float:
    return float(jnp.linalg.norm(out - reference) / jnp.linalg.norm(reference))


def count_runs(f: Callable, arg, counter: list[int]) -> tuple[int, int]:
    """Runs of a counted Python function (`counter[0]` counts them) while tracing
    `jax.jit(f)` on `arg`, and while lowering, compiling and first calling it."""
    jitted = jax.jit(f)
    before = counter[0]
    traced = jitted.trace(arg)
    after_trace = counter[0]
    jax.block_until_ready(traced.lower().compile()(arg))
    return after_trace - before, counter[0] - after_trace


# --------------------------------------------------------------------------------------
# Results


def write_results(
    out_dir: Path, name: str, payload: dict, plot: Callable[[Path], None]
) -> None:
    """`<out_dir>/<name>.json` (the payload) and `<out_dir>/<name>.png`
    (`plot(path)`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / f"{name}.json", out_dir / f"{name}.png"
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    plot(png_path)
    print(f"wrote {json_path} and {png_path}")
