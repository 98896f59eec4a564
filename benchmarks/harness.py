"""What the benchmarks share: the environment record, timing (`time_program`,
`compile_stages`), the dense-layer operators (`chain_layers`, `spd_layers`), the
command line; and, from `benchmarks/output.py` and re-exported here, text tables,
plots and the results files. How they time and what the dense-layer chain is:
docs/benchmarks.md, "How the benchmarks measure"."""

import argparse
import contextlib
import gc
import importlib.util
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from unittest import mock

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxlib
import lineax as lx

import lineax_dispatch as lxd
from benchmarks.output import (  # re-exported: `harness.table`, `harness.save`...
    column_table as column_table,
    jax_label as jax_label,
    log_axis as log_axis,
    met as met,
    plain_log_ticks as plain_log_ticks,
    pyplot as pyplot,
    save as save,
    stage_columns as stage_columns,
    table as table,
    write_results as write_results,
)
from lineax_dispatch import _reductions
from lineax_dispatch.program._compiled import RACE_THREADS
from lineax_dispatch.solvers.skeleton import _linear_system


SEED = 0
RESULTS_DIR = Path(__file__).resolve().parent / "results"
EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "docs" / "examples"
# Steady-state timing: at least `min_runs` calls, more while under RUN_BUDGET_S.
MAX_RUNS, RUN_BUDGET_S = 25, 1.0
# The SPD operator `SHIFT * x + B^T (B x)` of `spd_layers`; `top_eigenvalue`'s steps.
SHIFT, POWER_ITERATIONS = 0.02, 30


# ------------------------------------------------------------------ environment


def environment(load_average: bool = False) -> dict:
    """Versions, machine and jax backend; `load_average` adds `os.getloadavg()`."""
    env = dict(
        python=sys.version.split()[0],
        jax=jax.__version__,
        jaxlib=jaxlib.__version__,
        lineax=getattr(lx, "__version__", "?"),
        equinox=getattr(eqx, "__version__", "?"),
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
    """`os.getloadavg()`, or None where the platform has none."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def print_setup(env: dict, config: dict) -> None:
    """The environment and the configuration, one line each."""
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    print("config: " + ", ".join(f"{k}={v}" for k, v in config.items()))


def example(name: str):
    """The worked example (a script) `docs/examples/<name>.py`, imported as `name`."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES_DIR / f"{name}.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


# ------------------------------------------------------------------ timing


def fresh_heap() -> None:
    """Collects Python's garbage before a program's first call is timed, so that
    a full collection of what earlier programs left does not land in this one's
    timing. With the families' heap on the CPU a full collection took about 0.1 s,
    a quarter of a small program's first call, in whichever stage it fell
    (`docs/benchmarks.md`, "How the benchmarks measure"). The program's own
    allocations still trigger the collections they would for a user."""
    gc.collect()


def timed(thunk: Callable):
    """`(thunk(), seconds)`."""
    start = time.perf_counter()
    out = thunk()
    return out, time.perf_counter() - start


def call_times(call: Callable, count: int) -> list[float]:
    """Wall times of `count` calls of `call()`, each waited for."""
    return [timed(lambda: jax.block_until_ready(call()))[1] for _ in range(count)]


def settle(limit_s: float = 120.0) -> float:
    """Waits for the compiles that `lxd.jit`'s race left running (its threads,
    named `RACE_THREADS`: the compile that lost goes on to its end and is dropped),
    at most `limit_s`. While one runs it competes with the runs that follow for
    the host's cores (on a TPU v5e host the runs right after a race were slower
    than once it had ended: `tpu/logs/after-race-runs.log`), so a steady run time
    is measured after it. Returns the seconds waited."""
    start = time.perf_counter()
    for thread in threading.enumerate():
        if thread.name.startswith(RACE_THREADS):
            thread.join(max(0.0, limit_s - (time.perf_counter() - start)))
    return time.perf_counter() - start


def median_call_time(call: Callable, count: int) -> float:
    """The median of `call_times(call, count)`."""
    return statistics.median(call_times(call, count))


def compile_stages(trace: Callable, lower: Callable, args) -> tuple:
    """Times `traced = trace()`, `lowered = lower(traced)`, `lowered.compile()` and
    the first call on `args`, from a `fresh_heap`: `(timings, compiled, out)`,
    `out` that call's output."""
    fresh_heap()
    traced, trace_s = timed(trace)
    lowered, lower_s = timed(lambda: lower(traced))
    compiled, compile_s = timed(lowered.compile)
    out, first_s = timed(lambda: jax.block_until_ready(compiled(*args)))
    stages = dict(trace_s=trace_s, lower_s=lower_s, compile_s=compile_s)
    return dict(stages, first_call_s=first_s), compiled, out


def jit_stages(f: Callable, args, program_level: bool) -> tuple:
    """The `(trace, lower)` stages of `compile_stages` for `f` on `args`: under
    `lxd.jit` where `program_level` (its one trace, analysis and rewrite, then its
    lowering), else under `jax.jit` (trace, then lower). Returns `(jitted,
    stages)`."""
    if program_level:
        jitted = lxd.jit(f)
        return jitted, (lambda: jitted.decisions(*args), lambda _: jitted.lower(*args))
    jitted = jax.jit(f)
    return jitted, (lambda: jitted.trace(*args), lambda traced: traced.lower())


def time_program(program: Callable, params, arg, min_runs: int):
    """Times `jax.jit(program)` on `(params, arg)` (see the module docstring).
    Returns `(timings, compiled, out)`, `out` the first call's output."""
    f = jax.jit(program)
    t, compiled, out = compile_stages(
        lambda: f.trace(params, arg), lambda traced: traced.lower(), (params, arg)
    )
    (warm,) = call_times(lambda: compiled(params, arg), 1)
    estimate = min(max(t["first_call_s"], 1e-6), max(warm, 1e-6))
    runs = int(min(MAX_RUNS, max(min_runs, RUN_BUDGET_S // estimate)))
    times = [warm] + call_times(lambda: compiled(params, arg), runs - 1)
    run_s = statistics.median(times)
    t["first_call_extra_s"] = extra = max(t["first_call_s"] - run_s, 0.0)
    t["compile_total_s"] = t["trace_s"] + t["lower_s"] + t["compile_s"] + extra
    return dict(t, run_s=run_s, runs=runs), compiled, out


def median_trial(trials: list, key: str, every: Sequence[str] = ()) -> tuple:
    """The `(timings, out)` trial with the median `timings[key]` (the lower median
    for an even count), with `NAME_all_s`, every trial's value, for each `NAME_s`
    in `every`."""
    timings, out = sorted(trials, key=lambda t: t[0][key])[(len(trials) - 1) // 2]
    lists = {f"{k[:-2]}_all_s": [t[k] for t, _ in trials] for k in every}
    return dict(timings, **lists), out


def relative_error(out, reference) -> float:
    """`|out - reference| / |reference|`."""
    return float(jnp.linalg.norm(out - reference) / jnp.linalg.norm(reference))


def decision_record(decision, **extra) -> dict:
    """An `lxd` decision for the JSON: strategy, policy, reasons, `extra`, memory
    and each strategy's estimated seconds."""
    return dict(
        strategy=decision.strategy,
        policy=repr(decision.policy),
        reasons=list(decision.reasons),
        **extra,
        memory_needed=int(decision.memory_needed),
        estimates={e.strategy: e.seconds for e in decision.estimates},
    )


def count_runs(f: Callable, arg, counter: list[int]) -> tuple[int, int]:
    """Runs of a counted Python function (`counter[0]` counts them) while tracing
    `jax.jit(f)` on `arg`, and while lowering, compiling and first calling it."""
    before = counter[0]
    traced = jax.jit(f).trace(arg)
    after_trace = counter[0]
    jax.block_until_ready(traced.lower().compile()(arg))
    return after_trace - before, counter[0] - after_trace


def split_program(op, body: Callable) -> tuple[Callable, object, object]:
    """`(f, params, static)` with `f(params, x) = body(op, x)`: the operator's
    arrays are a jit argument and its static part (function, policy, tags) is
    closed over, the split `equinox.filter_jit` makes. Closing over the arrays
    would embed them as HLO constants and time their serialisation."""
    params, static = eqx.partition(op, eqx.is_array)

    def f(params, x):
        return body(eqx.combine(params, static), x)

    return f, params, static


# ------------------------------------------------------------------ operators


def random_layers(keys, n: int, layers: int) -> tuple[tuple, tuple]:
    """`(weights, scales)`: `W_i` drawn with `keys[i]`, `s_i` with `keys[L + i]`."""
    weights = tuple(
        jax.random.normal(keys[i], (n, n), jnp.float32) / jnp.sqrt(n)
        for i in range(layers)
    )
    scales = tuple(
        jax.random.uniform(keys[layers + i], (n,), jnp.float32, 0.5, 1.5)
        for i in range(layers)
    )
    return weights, scales


def chain_layers(n: int, layers: int, seed: int = SEED) -> tuple[tuple, tuple]:
    """The `(weights, scales)` of a chain of `layers` layers drawn from `seed`."""
    keys = jax.random.split(jax.random.key(seed), 2 * layers)
    return jax.block_until_ready(random_layers(keys, n, layers))


def apply_chain(weights, scales, x):
    """`B x`."""
    for w, s in zip(weights, scales):
        x = s * (w @ x)
    return x


def apply_gram(weights, scales, x):
    """`B^T (B x)`."""
    x = apply_chain(weights, scales, x)
    for w, s in zip(reversed(weights), reversed(scales)):
        x = (s * x) @ w
    return x


def top_eigenvalue(apply: Callable, n: int, key):
    """The Rayleigh quotient of `apply` after POWER_ITERATIONS steps of power
    iteration from a normal vector drawn with `key` (a jax scalar; it
    underestimates the top eigenvalue)."""
    x, lam = jax.random.normal(key, (n,), jnp.float32), jnp.array(1.0, jnp.float32)
    for _ in range(POWER_ITERATIONS):
        x = x / jnp.linalg.norm(x)
        y = apply(x)
        lam, x = jnp.vdot(x, y), y
    return lam


def spd_layers(n: int, layers: int, seed: int = SEED):
    """A chain's `(weights, scales, factor)`, the scales multiplied by a common
    `factor` so that `B^T B` has its largest eigenvalue about 1: the spectrum of
    `SHIFT * x + B^T (B x)` is then about `[SHIFT, 1 + SHIFT]`."""
    keys = jax.random.split(jax.random.key(seed), 2 * layers + 1)
    weights, scales = random_layers(keys, n, layers)
    lam = top_eigenvalue(lambda x: apply_gram(weights, scales, x), n, keys[-1])
    # Power iteration underestimates the top eigenvalue: leave a little room.
    factor = float((1.05 * lam) ** (-1.0 / (2 * layers)))
    scales = tuple(s * factor for s in scales)
    return jax.block_until_ready((weights, scales)) + (factor,)


def spd_operator(fn: Callable, n: int, policy=None):
    """`fn` as an SPD-tagged float32 operator on `R^n` with `closure_convert=False`:
    plain lineax's, or with `policy` lineax-dispatch's."""
    args = (fn, jax.ShapeDtypeStruct((n,), jnp.float32), lx.positive_semidefinite_tag)
    if policy is None:
        return lx.FunctionLinearOperator(*args, closure_convert=False)
    return lxd.FunctionLinearOperator(*args, closure_convert=False, policy=policy)


def spd_function(weights, scales) -> Callable:
    """A new function `x -> SHIFT * x + B^T (B x)` each call, as an `eqx.Partial`
    whose arrays (the weights) are leaves."""

    def spd(weights, scales, x):
        return SHIFT * x + apply_gram(weights, scales, x)

    return eqx.Partial(spd, weights, scales)


# ------------------------------------------------------------------ command line


def parser(doc: str, full: dict, quick: dict) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of `doc`, with `--out` and
    `--quick` (`quick`'s sizes for the arguments not given: `fill_defaults`)."""
    prog = f"python -m benchmarks.{Path(sys.argv[0]).stem}"
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=results_dir(),
        help=f"results folder (default {results_dir()}: per JAX version)",
    )
    shown = ", ".join(f"{k}={joined(v)}" for k, v in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"small sizes: {shown}")
    return parser


def results_dir() -> Path:
    """Where results of this JAX go by default: `benchmarks/results/` for jax 0.10
    (the oldest CI runs), `benchmarks/results/jax-<major>.<minor>/` for others, so
    that each version's figures are kept."""
    version = ".".join(jax.__version__.split(".")[:2])
    return RESULTS_DIR if version == "0.10" else RESULTS_DIR / f"jax-{version}"


def int_list(text: str) -> tuple[int, ...]:
    """`"1,4,16"` as `(1, 4, 16)`."""
    return tuple(int(v) for v in text.split(",") if v.strip())


def name_list(choices: Sequence[str]) -> Callable:
    """An argument type: `"a,b"` as `("a", "b")`, each (lower-cased) in `choices`."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(v.strip().lower() for v in text.split(",") if v.strip())
        if bad := [v for v in names if v not in choices]:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {choices}")
        return names

    return parse


def joined(values) -> str:
    """`(1, 4, 16)` as `"1,4,16"`; a value not a tuple as `str(value)`."""
    return ",".join(map(str, values)) if isinstance(values, tuple) else str(values)


def fill_defaults(args: argparse.Namespace, full: dict, quick: dict) -> None:
    """Each argument of `full` left at None: its value in `quick` under
    `--quick` (where it has one), else in `full`."""
    for name, value in full.items():
        if getattr(args, name) is None:
            setattr(args, name, quick.get(name, value) if args.quick else value)


@contextlib.contextmanager
def without_rhs_scaling() -> Iterator[None]:
    """Within this context the solvers' systems divide the right-hand side by 1
    rather than by its power of two (`rhs_unit_and_finite` patched; its
    finiteness still read from `b`): for the ablations of `benchmarks.cg_compile`
    and `benchmarks.solver_kernels`, which say what the scaling costs to
    compile. Not a setting: a right-hand side whose squared norm overflows is
    then not solved."""

    def unit_and_finite(b):
        return jnp.ones((), jnp.finfo(b.dtype).dtype), _reductions.all_finite(b)

    with mock.patch.object(_linear_system, "rhs_unit_and_finite", unit_and_finite):
        yield
