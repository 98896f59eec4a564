"""How close `lxd.Auto` under `lxd.jit` comes to the best fixed policy, measured as
the total time to get one answer: compile (including the first call's extra) plus
one run of the compiled program.

What is measured
----------------

A grid of cases (kind x workload x n x call sites k), each under every fixed
policy of lineax-dispatch, under plain lineax, and under `Auto`:

- operator kinds, all `FunctionLinearOperator`s of float32 `n x n` maps:

  - "cheap": one dense matrix-vector product, `x -> M @ x`, with
    `M = I + G G^T / (SHIFT lambda_max(G G^T))` (`G ~ N(0, 1/n)`), so `M` is
    symmetric positive definite with its spectrum in about `[1, 1 + 1 / SHIFT]`.
  - "expensive": a chain of `L` dense layers (as in `callsites.py`),
    `C x = s_L * (W_L @ (... s_1 * (W_1 @ x)))`, `W_i ~ N(0, 1/n)`,
    `s_i ~ U(0.5, 1.5)`. For `mv` the operator is `C` itself (`L` matmuls); for
    solves it is the SPD `x -> x + C^T (C x)` (transposes applied by hand, `2 L`
    matmuls), the scales multiplied by a common factor (power iteration) so that
    `C^T C` has its largest eigenvalue about `1 / SHIFT`. `L` is `--layers`
    (default 32) but at most what keeps the weights within 256 MiB (`L = 4` at
    n=4096); the table's `L` column gives the layers actually used.

  Solves use operators tagged `lx.positive_semidefinite_tag`; with `SHIFT = 0.02`
  (condition number about 50) CG converges in a few tens of steps. The spectrum
  starts at 1, not at `SHIFT`: lineax's CG, and `lxd.CG` after it, report
  `singular` when a curvature `p^T A p` falls below `100 rcond p^T p` with
  `rcond = 2 eps n`, about `0.1 p^T p` at n=4096 in float32, so an operator whose
  Rayleigh quotients are small in absolute terms fails at large n. The
  right-hand side `b` is `RHS_SCALE = 1/16` times a standard normal vector, so
  that even `b * 16` stays at a scale where float32 rounding of the residual
  (about `eps * cond * |b|`) is below `atol = 1e-5`; with `b` of unit scale the
  solves with `b * 4` and beyond stalled at `max_steps`.

- workloads, with `k` independent call sites written as a Python loop (each a
  separate copy in the traced program):

  - "mv": `f(x) = sum_{i<k} op.mv(x * (i + 1))`;
  - "solve": `f(b) = sum_{i<k} lx.linear_solve(op, b * (i + 1), solver,
    throw=False).value` with `solver = lxd.CG(rtol=1e-5, atol=1e-5,
    max_steps=200)` (the program also returns the largest step count and whether
    every solve succeeded).

- variants:

  - `Lazy`, `Outline`, `Materialise`: `lxd.FunctionLinearOperator` with the fixed
    policy `lxd.Lazy()`, `lxd.Outline()`, `lxd.Materialise(batch_size=128)`,
    compiled with `jax.jit`. `Materialise` is skipped where the matrix would exceed
    1 GiB (recorded; it never does in the default grid). `VmapBatch`/`Scan` equal
    `Lazy` for single vectors and are not run.
  - `lineax`: plain `lx.FunctionLinearOperator` with `jax.jit`, the reference
    (for solves with lineax's own `lx.CG(rtol=1e-5, atol=1e-5, max_steps=200)`,
    i.e. no lineax-dispatch at all).
  - `Auto`: `lxd.FunctionLinearOperator(..., policy=lxd.Auto())` compiled with
    `lxd.jit`, which traces the program once abstractly to count call sites,
    decides, then traces for real: all of that is in Auto's time. For "mv" the
    decision is `jitted.decisions(params, x)`; for "solve" the decision is made
    inside `CG.prepare` (once per solve, as one call site run the solver's
    expected number of iterations), and the strategy reported is what
    `solver.prepare(op)` returns (evaluated with `eqx.filter_eval_shape`, after the
    timing), with the reasons from `op.policy.decision(op, call_sites=1,
    executions=expected_iterations(200, n))`, the call `prepare` makes.

How the operator reaches the compiled program. Each measurement builds a fresh
operator whose function is `eqx.Partial(new_function_object, *arrays)` with
`closure_convert=False`: the arrays (matrix, weights, scales) are leaves of the
operator, and the Python function is new each time, so the operator's key (and
with it Auto's history and cost cache, equinox's cache of `Outline`'s callee and
jax's tracing caches) is new and nothing carries over between variants. The
operator is split `eqx.partition(op, eqx.is_array)`: its arrays are an *argument*
of the jitted function, the rest (function, policy, tags) is closed over, as
`equinox.filter_jit` splits it (`lxd.jit` has `jax.jit` semantics, so the
operator itself, which holds a Python function, cannot be an argument). Closing
over the arrays instead would make them HLO constants: with jax 0.10 even
lineax's default `closure_convert=True` puts closed-over arrays into the
operator's static part (the closure-converted jaxpr keeps them as literals, the
operator has no array leaves), and compiling 128 MiB of constants adds about a
second to every program, for every variant alike, which is not what is compared
here.

Timing, per (case, variant), with a fresh operator:

- trace: `jax.jit(f).trace(params, x)`. For Auto: `jitted.decisions(params, x)`
  (the observing trace and the decisions);
- lower: `traced.lower()`. For Auto: `jitted.lower(params, x)` (the second, real
  trace with the decisions fixed, and the lowering; when every decision is `Lazy`
  the observing trace is the program and jax reuses it);
- compile: `lowered.compile()`;
- first call: the first execution (`block_until_ready`). It includes compiling
  `Outline`'s callee, and the work XLA:CPU defers to the first execution;
- run: one further execution.

"total" = trace + lower + compile + first call, i.e. compile (with the first
call's extra) plus one run; "compile total" = total - run. The best fixed policy
of a case is the one with the least total among Lazy, Outline and Materialise.
With `--repeats r` each (case, variant) is measured r times and the repeat with
the median total is kept (all totals are in the JSON).

Skipped measurements, to keep the default grid within about 15 minutes on two
cores (each recorded with its reason in the JSON and shown as `skip` in the
table): within one (kind, workload, n) the call-site counts are run in increasing
order, and at each k after the first the fixed variants are measured best-first
(by their total at the previous k); a fixed variant is not measured when a lower
bound on its total already exceeds twice the best total measured at this k, so it
cannot be the best. The bound is 0.8 x (its run time at the previous k) x
(k / previous k) for `Lazy` and `Outline` (each of the k sites runs its own
`mv`s: `Outline` with a host callback that copies all the weights each time, which
makes its solves of the large expensive operators take tens of seconds), and
0.8 x its total at the previous k for `Materialise` (its build is shared by the
k sites). Auto and lineax are always measured.

Before the grid, every variant is run once on a tiny case and discarded
(warm-up), and for each (kind, n) `Outline` is run once (its first call at a size
pays a one-off first touch of the host memory the callback copies into).

A separate measurement: the expensive operator at n=1024, L=32 (`--quick`: n=256,
L=4) with the "mv" workload at k=1 and k=16, under `lxd.jit` + Auto and under plain
lineax: compile total at k=16 / compile total at k=1 (target for Auto: <= 1.3).

Targets over the grid: median Auto / best <= 1.15, worst <= 2.

`OPENBLAS_NUM_THREADS` is set to 1 (unless already set) before jax is imported.

Noise. With the default `--repeats 1` single cells are noisy on a shared 2-core
machine: in the recorded run, Auto's total against the fixed policy it chose
(the same compiled program plus Auto's observing trace) ranged from 0.66x to 1.78x
(median 1.02x) at a load average of about 3.5. Use `--repeats 3` (and a subset of
the grid) to confirm a single cell.

How to run
----------

    .venv/bin/python benchmarks/auto.py             # n=64,256,1024,4096; k=1,4,16;
                                                    # L=32: about 11 minutes
    .venv/bin/python benchmarks/auto.py --quick     # n=64,256; k=1,4; L=4: 1 minute
    .venv/bin/python benchmarks/auto.py --n 256,1024 --sites 1,16 --layers 16
    .venv/bin/python benchmarks/auto.py --kinds expensive --workloads solve

Results: `auto.json` and `auto.png` in `benchmarks/results/` (`--out` to change
the folder).
"""

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
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
DEFAULT_NS = (64, 256, 1024, 4096)
DEFAULT_SITES = (1, 4, 16)
DEFAULT_LAYERS = 32
QUICK_NS = (64, 256)
QUICK_SITES = (1, 4)
QUICK_LAYERS = 4
KINDS = ("cheap", "expensive")
WORKLOADS = ("mv", "solve")
WEIGHT_CAP_BYTES = 256 * 2**20
MATERIALISE_CAP_BYTES = 2**30
MATERIALISE_BATCH = 128
RTOL = 1e-5
ATOL = 1e-5
MAX_STEPS = 200
SHIFT = 0.02
RHS_SCALE = 1 / 16
POWER_ITERATIONS = 30
FIXED = ("Lazy", "Outline", "Materialise")
BASELINE = "lineax"
AUTO = "Auto"
VARIANTS = FIXED + (BASELINE, AUTO)
# Skipping dominated fixed variants (see the module docstring).
SKIP_FACTOR = 2.0
SKIP_MARGIN = 0.8
# The separate call-site measurement.
SITES_CHECK = dict(n=1024, layers=32, sites=(1, 16))
QUICK_SITES_CHECK = dict(n=256, layers=4, sites=(1, 16))
TARGET_MEDIAN = 1.15
TARGET_WORST = 2.0
TARGET_SITES = 1.3
WORST_KEPT = 6
RESULTS_DIR = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------------------
# Operators


@dataclass(frozen=True)
class OperatorData:
    """The arrays of one (kind, n): `mv_arrays` for the "mv" workload and
    `solve_arrays` for the (SPD) "solve" workload."""

    kind: str
    n: int
    layers: int  # 1 for "cheap" (one matmul)
    mv_arrays: tuple
    solve_arrays: tuple
    note: str

    def arrays(self, workload: str) -> tuple:
        return self.mv_arrays if workload == "mv" else self.solve_arrays

    def nbytes(self) -> int:
        leaves = jax.tree_util.tree_leaves((self.mv_arrays, self.solve_arrays))
        unique = {id(x): x for x in leaves}
        return sum(x.size * x.dtype.itemsize for x in unique.values())


def layers_for(n: int, layers: int) -> int:
    """`layers`, or fewer so that the weights stay within WEIGHT_CAP_BYTES."""
    return max(1, min(layers, WEIGHT_CAP_BYTES // (4 * n * n)))


def _top_eigenvalue(apply: Callable, n: int, key) -> float:
    apply = jax.jit(apply)
    x = jax.random.normal(key, (n,), jnp.float32)
    lam = jnp.array(1.0, jnp.float32)
    for _ in range(POWER_ITERATIONS):
        x = x / jnp.linalg.norm(x)
        y = apply(x)
        lam = jnp.vdot(x, y)
        x = y
    return float(lam)


def make_cheap(n: int, seed: int = SEED) -> OperatorData:
    """`M = I + G G^T / (1.05 SHIFT lambda_max(G G^T))`."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    g = jax.random.normal(k1, (n, n), jnp.float32) / jnp.sqrt(n)
    gram = g @ g.T
    lam = _top_eigenvalue(lambda x: gram @ x, n, k2)
    matrix = jnp.eye(n, dtype=jnp.float32) + gram / (1.05 * SHIFT * lam)
    matrix = jax.block_until_ready(matrix)
    return OperatorData(
        "cheap", n, 1, (matrix,), (matrix,), "x -> M @ x, one dense SPD matrix"
    )


def _chain(weights, scales, x):
    for w, s in zip(weights, scales):
        x = s * (w @ x)
    return x


def _gram(weights, scales, x):
    x = _chain(weights, scales, x)
    for w, s in zip(reversed(weights), reversed(scales)):
        # `W^T y` written as `y @ W`: `w.T @ y` makes XLA:CPU copy the transpose.
        x = (s * x) @ w
    return x


def make_expensive(n: int, layers: int, seed: int = SEED) -> OperatorData:
    """Weights `W_i ~ N(0, 1/n)`, scales `s_i ~ U(0.5, 1.5)`; for solves the scales
    are multiplied by a common factor making `lambda_max(C^T C)` about `1 / SHIFT`."""
    keys = jax.random.split(jax.random.key(seed + 1), 2 * layers + 1)
    weights = tuple(
        jax.random.normal(keys[i], (n, n), jnp.float32) / jnp.sqrt(n)
        for i in range(layers)
    )
    scales = tuple(
        jax.random.uniform(keys[layers + i], (n,), jnp.float32, 0.5, 1.5)
        for i in range(layers)
    )
    lam = _top_eigenvalue(lambda x: _gram(weights, scales, x), n, keys[-1])
    factor = (1.05 * SHIFT * lam) ** (-1.0 / (2 * layers))
    spd_scales = tuple(s * factor for s in scales)
    weights, scales, spd_scales = jax.block_until_ready((weights, scales, spd_scales))
    return OperatorData(
        "expensive",
        n,
        layers,
        (weights, scales),
        (weights, spd_scales),
        f"chain of {layers} dense layers "
        f"({layers * n * n * 4 / 2**20:.0f} MiB of weights)",
    )


def fresh_function(kind: str, workload: str) -> Callable:
    """A new function object `(*arrays, x) -> y` each call."""
    if kind == "cheap":

        def matvec(matrix, x):
            return matrix @ x

        return matvec
    if workload == "mv":

        def chain(weights, scales, x):
            return _chain(weights, scales, x)

        return chain

    def spd(weights, scales, x):
        return x + _gram(weights, scales, x)

    return spd


def build_operator(variant: str, data: OperatorData, workload: str):
    """A fresh operator for `variant`; its arrays are leaves (see the docstring)."""
    fn = eqx.Partial(fresh_function(data.kind, workload), *data.arrays(workload))
    structure = jax.ShapeDtypeStruct((data.n,), jnp.float32)
    tags = lx.positive_semidefinite_tag if workload == "solve" else ()
    if variant == BASELINE:
        return lx.FunctionLinearOperator(fn, structure, tags, closure_convert=False)
    policy = {
        "Lazy": lxd.Lazy(),
        "Outline": lxd.Outline(),
        "Materialise": lxd.Materialise(batch_size=MATERIALISE_BATCH),
        AUTO: lxd.Auto(),
    }[variant]
    return lxd.FunctionLinearOperator(
        fn, structure, tags, closure_convert=False, policy=policy
    )


def make_solver(variant: str):
    if variant == BASELINE:
        return lx.CG(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)
    return lxd.CG(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)


# --------------------------------------------------------------------------------------
# Programs


def make_program(op, workload: str, k: int, solver) -> tuple[Callable, object, object]:
    """`(f, params, static)`: `f(params, x)` runs the workload with `k` call sites
    on `eqx.combine(params, static)`."""
    params, static = eqx.partition(op, eqx.is_array)
    if workload == "mv":

        def f(params, x):
            op = eqx.combine(params, static)
            total = op.mv(x * 1)
            for i in range(1, k):
                total = total + op.mv(x * (i + 1))
            return total

    else:

        def f(params, b):
            op = eqx.combine(params, static)
            total, steps, ok = None, [], []
            for i in range(k):
                sol = lx.linear_solve(op, b * (i + 1), solver, throw=False)
                total = sol.value if total is None else total + sol.value
                steps.append(sol.stats["num_steps"])
                ok.append(sol.result == lx.RESULTS.successful)
            return total, jnp.max(jnp.stack(steps)), jnp.all(jnp.stack(ok))

    return f, params, static


# --------------------------------------------------------------------------------------
# Timing


def _timed(thunk: Callable):
    start = time.perf_counter()
    out = thunk()
    return out, time.perf_counter() - start


@dataclass(frozen=True)
class Case:
    kind: str
    workload: str
    n: int
    layers: int
    k: int

    def label(self) -> str:
        return f"{self.kind}/{self.workload} n={self.n} k={self.k}"


def _decision_dict(decision) -> dict:
    return dict(
        strategy=decision.strategy,
        policy=repr(decision.policy),
        reasons=list(decision.reasons),
        estimates={name: t for name, t in decision.estimates},
        memory_needed=int(decision.memory_needed),
    )


def auto_choice(jitted, op, static, params, x, case: Case) -> dict:
    """What Auto chose (called after the timing, so nothing it computes is cached
    for the timed run)."""
    if case.workload == "mv":
        decisions = list(jitted.decisions(params, x).values())
        if not decisions:
            return dict(strategy="(none)", source="lxd.jit decisions: none")
        return dict(
            strategy="+".join(d.strategy for d in decisions),
            source="lxd.jit(...).decisions(params, x)",
            decisions=[_decision_dict(d) for d in decisions],
        )
    solver = make_solver(AUTO)
    out = dict(
        source="CG.prepare(op) (filter_eval_shape); reasons from op.policy.decision",
        jit_decisions=len(jitted.decisions(params, x)),
    )
    try:
        prepared = eqx.filter_eval_shape(
            lambda p: solver.prepare(eqx.combine(p, static)), params
        )
        if isinstance(prepared, lx.MatrixLinearOperator):
            out["strategy"] = "Materialise"
        else:
            out["strategy"] = type(getattr(prepared, "policy", None)).__name__
    except Exception as e:  # pragma: no cover - the package is being written
        out["strategy"] = "?"
        out["prepare_error"] = repr(e)
    try:
        from lineax_dispatch.solvers._prepare import expected_iterations

        executions = expected_iterations(MAX_STEPS, case.n)
        decision = op.policy.decision(op, call_sites=1, executions=executions)
        out["executions"] = executions
        out["decisions"] = [_decision_dict(decision)]
        if out["strategy"] == "?":
            out["strategy"] = decision.strategy
    except Exception as e:  # pragma: no cover - private API changed
        out["decision_error"] = repr(e)
    return out


def measure(variant: str, data: OperatorData, case: Case) -> tuple[dict, object]:
    """Times one (case, variant) with a fresh operator."""
    op = build_operator(variant, data, case.workload)
    solver = make_solver(variant) if case.workload == "solve" else None
    f, params, static = make_program(op, case.workload, case.k, solver)
    x = jax.random.normal(jax.random.key(SEED + 7), (case.n,), jnp.float32)
    if case.workload == "solve":
        x = RHS_SCALE * x
    if variant == AUTO:
        jitted = lxd.jit(f)
        _, trace_s = _timed(lambda: jitted.decisions(params, x))
        lowered, lower_s = _timed(lambda: jitted.lower(params, x))
    else:
        jitted = jax.jit(f)
        traced, trace_s = _timed(lambda: jitted.trace(params, x))
        lowered, lower_s = _timed(traced.lower)
    compiled, compile_s = _timed(lowered.compile)
    out, first_s = _timed(lambda: jax.block_until_ready(compiled(params, x)))
    _, run_s = _timed(lambda: jax.block_until_ready(compiled(params, x)))
    total = trace_s + lower_s + compile_s + first_s
    timings = dict(
        trace_s=trace_s,
        lower_s=lower_s,
        compile_s=compile_s,
        first_call_s=first_s,
        run_s=run_s,
        total_s=total,
        compile_total_s=total - min(run_s, first_s),
    )
    if case.workload == "solve":
        value, steps, ok = out
        timings["num_steps_max"] = int(steps)
        timings["all_successful"] = bool(ok)
        out = value
    if variant == AUTO:
        timings["choice"] = auto_choice(jitted, op, static, params, x, case)
    return timings, out


def measure_repeated(
    variant: str, data: OperatorData, case: Case, repeats: int
) -> tuple[dict, object]:
    """`measure` `repeats` times; the repeat with the median total, with every
    repeat's total added."""
    trials = [measure(variant, data, case) for _ in range(repeats)]
    order = sorted(range(len(trials)), key=lambda i: trials[i][0]["total_s"])
    timings, out = trials[order[(len(order) - 1) // 2]]
    timings = dict(timings, total_all_s=[t["total_s"] for t, _ in trials])
    return timings, out


def relative_error(out, reference) -> float:
    return float(jnp.linalg.norm(out - reference) / jnp.linalg.norm(reference))


def _lower_bound(variant: str, previous: dict, k: int, k_prev: int) -> float:
    if variant == "Materialise":
        return SKIP_MARGIN * previous["total_s"]
    return SKIP_MARGIN * previous["run_s"] * k / k_prev


def run_cell(
    data: OperatorData, workload: str, sites: Sequence[int], repeats: int
) -> list[dict]:
    """All k of one (kind, workload, n)."""
    rows: list[dict] = []
    previous: dict[str, dict] = {}
    k_prev = None
    for k in sites:
        case = Case(data.kind, workload, data.n, data.layers, k)
        row: dict = dict(
            kind=case.kind,
            workload=workload,
            n=case.n,
            layers=case.layers,
            k=k,
            results={},
            skipped={},
        )
        if k_prev is None:
            order = list(FIXED)
        else:
            order = sorted(
                FIXED,
                key=lambda v: previous[v]["total_s"] if v in previous else math.inf,
            )
        outputs = {}
        for variant in order + [BASELINE, AUTO]:
            if variant == "Materialise" and 4 * data.n * data.n > MATERIALISE_CAP_BYTES:
                row["skipped"][variant] = (
                    f"matrix of {4 * data.n * data.n / 2**30:.1f} GiB > 1 GiB"
                )
                continue
            if variant in FIXED and k_prev is not None:
                measured = [
                    row["results"][v]["total_s"] for v in FIXED if v in row["results"]
                ]
                if variant not in previous:
                    row["skipped"][variant] = f"skipped at k={k_prev}"
                    continue
                bound = _lower_bound(variant, previous[variant], k, k_prev)
                if measured and bound > SKIP_FACTOR * min(measured):
                    row["skipped"][variant] = (
                        f"lower bound {bound:.2f} s (from k={k_prev}) > "
                        f"{SKIP_FACTOR:g} x best measured {min(measured):.2f} s"
                    )
                    continue
            timings, out = measure_repeated(variant, data, case, repeats)
            row["results"][variant] = timings
            outputs[variant] = out
            print(
                f"    {case.label():<30} {variant:<12} "
                f"total {timings['total_s']:8.3f} s"
                f"  (run {timings['run_s']:.3f} s)"
                + (f"  -> {timings['choice']['strategy']}" if variant == AUTO else ""),
                flush=True,
            )
        reference = outputs.get("Lazy", next(iter(outputs.values())))
        for variant, out in outputs.items():
            row["results"][variant]["rel_err_vs_lazy"] = relative_error(out, reference)
        finish_row(row)
        rows.append(row)
        previous = {v: row["results"][v] for v in FIXED if v in row["results"]}
        k_prev = k
    return rows


def finish_row(row: dict) -> None:
    results = row["results"]
    fixed = {v: results[v]["total_s"] for v in FIXED if v in results}
    best = min(fixed, key=fixed.get)
    auto = results[AUTO]
    row["best"] = best
    row["best_total_s"] = fixed[best]
    row["auto_choice"] = auto["choice"]["strategy"]
    row["auto_over_best"] = auto["total_s"] / fixed[best]
    row["lineax_over_best"] = results[BASELINE]["total_s"] / fixed[best]
    row["auto_picked_best"] = row["auto_choice"] == best


# --------------------------------------------------------------------------------------
# The separate call-site measurement


def sites_check(config: dict, repeats: int) -> dict:
    """Expensive operator, "mv" workload, k=1 and k=16: compile total under
    `lxd.jit` + Auto and under plain lineax."""
    data = make_expensive(config["n"], config["layers"])
    out: dict = dict(
        n=config["n"], layers=config["layers"], sites=list(config["sites"])
    )
    for variant in (BASELINE, AUTO):
        rows = {}
        for k in config["sites"]:
            case = Case("expensive", "mv", config["n"], config["layers"], k)
            timings, _ = measure_repeated(variant, data, case, repeats)
            rows[k] = timings
            print(
                f"    sites check {variant:<8} k={k:<3} compile total "
                f"{timings['compile_total_s']:.3f} s"
                + (f"  -> {timings['choice']['strategy']}" if variant == AUTO else ""),
                flush=True,
            )
        first, last = config["sites"][0], config["sites"][-1]
        out[variant] = dict(
            results={str(k): v for k, v in rows.items()},
            ratio=rows[last]["compile_total_s"] / rows[first]["compile_total_s"],
        )
    out["target"] = TARGET_SITES
    out["met"] = bool(out[AUTO]["ratio"] <= TARGET_SITES)
    return out


# --------------------------------------------------------------------------------------
# Reporting


def environment() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
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
        load_average=load,
        jax_backend=jax.default_backend(),
        jax_devices=[str(d) for d in jax.devices()],
        OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS"),
    )


def format_table(rows: list[dict]) -> str:
    header = (
        f"{'kind':<10}{'work':<6}{'n':>5}{'L':>4}{'k':>4}"
        + "".join(f"{v:>12}" for v in VARIANTS)
        + f"  {'best':<12}{'Auto chose':<12}{'Auto/best':>10}{'lineax/best':>12}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        cells = []
        for v in VARIANTS:
            if v in r["results"]:
                cells.append(f"{r['results'][v]['total_s']:>11.3f}s")
            else:
                cells.append(f"{'skip':>12}")
        mark = "" if r["auto_picked_best"] else " *"
        lines.append(
            f"{r['kind']:<10}{r['workload']:<6}{r['n']:>5}{r['layers']:>4}{r['k']:>4}"
            + "".join(cells)
            + f"  {r['best']:<12}{r['auto_choice']:<12}"
            f"{r['auto_over_best']:>9.2f}x{r['lineax_over_best']:>11.2f}x{mark}"
        )
    return "\n".join(lines)


def summarise(rows: list[dict]) -> dict:
    ratios = [r["auto_over_best"] for r in rows]
    worst = max(rows, key=lambda r: r["auto_over_best"])
    lineax = [r["lineax_over_best"] for r in rows]
    return dict(
        cases=len(rows),
        median_auto_over_best=statistics.median(ratios),
        worst_auto_over_best=worst["auto_over_best"],
        worst_case=f"{worst['kind']}/{worst['workload']} n={worst['n']} k={worst['k']}",
        auto_picked_best=sum(r["auto_picked_best"] for r in rows),
        median_lineax_over_best=statistics.median(lineax),
        median_target=TARGET_MEDIAN,
        worst_target=TARGET_WORST,
        median_met=bool(statistics.median(ratios) <= TARGET_MEDIAN),
        worst_met=bool(worst["auto_over_best"] <= TARGET_WORST),
    )


def worst_cases(rows: list[dict], count: int = WORST_KEPT) -> list[dict]:
    """The cases with the largest Auto / best, with every variant's measured
    totals and Auto's decisions (reasons and estimates)."""
    ordered = sorted(rows, key=lambda r: r["auto_over_best"], reverse=True)[:count]
    out = []
    for r in ordered:
        auto = r["results"][AUTO]
        out.append(
            dict(
                case=f"{r['kind']}/{r['workload']} n={r['n']} L={r['layers']} "
                f"k={r['k']}",
                auto_over_best=r["auto_over_best"],
                best=r["best"],
                auto_choice=r["auto_choice"],
                measured_total_s={v: t["total_s"] for v, t in r["results"].items()},
                measured_compile_total_s={
                    v: t["compile_total_s"] for v, t in r["results"].items()
                },
                measured_run_s={v: t["run_s"] for v, t in r["results"].items()},
                skipped=r["skipped"],
                decisions=auto["choice"].get("decisions", []),
            )
        )
    return out


def plot(rows: list[dict], summary: dict, check: dict | None, config: dict, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    colours = {"Lazy": "tab:blue", "Outline": "tab:orange", "Materialise": "tab:green"}
    markers = {"mv": "o", "solve": "s"}
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(13, 4.8), gridspec_kw=dict(width_ratios=(3.2, 1))
    )
    seen = set()
    for i, r in enumerate(rows):
        choice = r["auto_choice"]
        label = f"Auto chose {choice} ({r['workload']})"
        left.scatter(
            i,
            r["auto_over_best"],
            c=colours.get(choice, "tab:gray"),
            marker=markers[r["workload"]],
            edgecolors="black" if not r["auto_picked_best"] else "none",
            s=45,
            label=None if label in seen else label,
            zorder=3,
        )
        seen.add(label)
    for target, colour, what in (
        (TARGET_MEDIAN, "tab:purple", "median"),
        (TARGET_WORST, "tab:red", "worst"),
    ):
        label = f"{target:g} ({what} target)"
        left.axhline(target, color=colour, ls="--", lw=1, label=label)
    left.axhline(1.0, color="black", lw=0.6)
    left.set_xticks(
        range(len(rows)),
        [f"{r['kind'][0]}/{r['workload']} {r['n']} k{r['k']}" for r in rows],
        rotation=90,
        fontsize=6,
    )
    left.set_yscale("log")
    left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    left.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    top = max([r["auto_over_best"] for r in rows] + [TARGET_WORST])
    bottom = min([r["auto_over_best"] for r in rows] + [1.0])
    # Head room for the legend.
    left.set_ylim(bottom / 1.1, top * 2.2)
    left.set_yticks(
        [
            t
            for t in (0.5, 0.75, 1, 1.15, 1.5, 2, 3, 5, 10, 20)
            if bottom / 1.1 <= t <= top * 2.2
        ]
    )
    left.set_ylabel("Auto total / best fixed total")
    left.set_title(
        f"Auto / best per case: median {summary['median_auto_over_best']:.2f}, "
        f"worst {summary['worst_auto_over_best']:.2f} (black edge: not the best)",
        fontsize=9,
    )
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7, ncol=3, loc="upper left")
    if check is not None:
        names = [BASELINE, AUTO]
        values = [check[v]["ratio"] for v in names]
        right.bar(names, values, color=["tab:gray", "tab:blue"])
        right.axhline(TARGET_SITES, color="tab:red", ls="--", lw=1, label="1.3 target")
        right.set_title(
            f"compile total k={check['sites'][-1]} / k={check['sites'][0]}\n"
            f"expensive mv, n={check['n']}, L={check['layers']}",
            fontsize=9,
        )
        right.legend(fontsize=7)
        right.grid(True, axis="y", alpha=0.3)
    else:
        right.axis("off")
    fig.suptitle(
        f"lxd.jit + Auto vs fixed policies, total = compile + one run; jax "
        f"{jax.__version__} {jax.default_backend()}, layers<={config['layers']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# Main


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def _name_list(choices: Sequence[str]) -> Callable:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(v for v in text.split(",") if v)
        bad = [v for v in names if v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {choices}")
        return names

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n",
        type=_int_list,
        default=None,
        help="comma-separated sizes (default " + ",".join(map(str, DEFAULT_NS)) + ")",
    )
    parser.add_argument(
        "--sites",
        type=_int_list,
        default=None,
        help="comma-separated call-site counts (default "
        + ",".join(map(str, DEFAULT_SITES))
        + ")",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help=f"layers of the expensive operator (default {DEFAULT_LAYERS}; fewer "
        "where the weights would exceed 256 MiB)",
    )
    parser.add_argument(
        "--kinds", type=_name_list(KINDS), default=KINDS, help="cheap,expensive"
    )
    parser.add_argument(
        "--workloads", type=_name_list(WORKLOADS), default=WORKLOADS, help="mv,solve"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="fresh-operator repeats per (case, variant), the median total kept "
        "(default 1)",
    )
    parser.add_argument(
        "--no-sites-check",
        action="store_true",
        help="skip the separate k=16 / k=1 compile measurement",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="n="
        + ",".join(map(str, QUICK_NS))
        + f", layers={QUICK_LAYERS}, sites="
        + ",".join(map(str, QUICK_SITES))
        + " unless given",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder")
    args = parser.parse_args(argv)
    ns, sites, layers = (
        (QUICK_NS, QUICK_SITES, QUICK_LAYERS)
        if args.quick
        else (DEFAULT_NS, DEFAULT_SITES, DEFAULT_LAYERS)
    )
    args.n = tuple(sorted(set(ns if args.n is None else args.n)))
    args.sites = tuple(sorted(set(sites if args.sites is None else args.sites)))
    args.layers = layers if args.layers is None else args.layers
    args.sites_check = (
        None
        if args.no_sites_check
        else dict(QUICK_SITES_CHECK if args.quick else SITES_CHECK)
    )
    if args.sites_check is not None and args.quick and args.layers != QUICK_LAYERS:
        args.sites_check["layers"] = args.layers
    return args


def warm_up() -> None:
    """Every variant once, on both workloads of a tiny operator (discarded)."""
    for data in (make_cheap(16), make_expensive(16, 2)):
        for workload in WORKLOADS:
            for variant in VARIANTS:
                measure(variant, data, Case(data.kind, workload, 16, data.layers, 2))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    env = environment()
    config = dict(
        kinds=list(args.kinds),
        workloads=list(args.workloads),
        n=list(args.n),
        sites=list(args.sites),
        layers=args.layers,
        layers_per_n={n: layers_for(n, args.layers) for n in args.n},
        weight_cap_bytes=WEIGHT_CAP_BYTES,
        materialise_batch_size=MATERIALISE_BATCH,
        materialise_cap_bytes=MATERIALISE_CAP_BYTES,
        solver=f"lxd.CG(rtol={RTOL}, atol={ATOL}, max_steps={MAX_STEPS}) "
        f"(lineax reference: lx.CG, same arguments)",
        shift=SHIFT,
        rhs_scale=RHS_SCALE,
        repeats=args.repeats,
        dtype="float32",
        closure_convert=False,
        operator_arrays="jit argument (eqx.partition), static part closed over",
        skip_rule=dict(factor=SKIP_FACTOR, margin=SKIP_MARGIN),
        seed=SEED,
        sites_check=args.sites_check,
    )
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    print("config: " + ", ".join(f"{k}={v}" for k, v in config.items()))
    capped = {n: l for n, l in config["layers_per_n"].items() if l < args.layers}
    if "expensive" in args.kinds and capped:
        print(
            "expensive operator: fewer layers where the weights would exceed "
            f"{WEIGHT_CAP_BYTES // 2**20} MiB: "
            + ", ".join(f"n={n}: L={l}" for n, l in capped.items())
        )

    warm_up()
    print(f"warm-up done ({time.perf_counter() - start:.1f} s)", flush=True)

    rows: list[dict] = []
    for kind in args.kinds:
        for n in args.n:
            if kind == "cheap":
                data = make_cheap(n)
            else:
                data = make_expensive(n, layers_for(n, args.layers))
            print(f"  {kind} n={n}: {data.note}", flush=True)
            # The first Outline call at a size pays a one-off first touch.
            measure("Outline", data, Case(kind, "mv", n, data.layers, 1))
            for workload in args.workloads:
                rows += run_cell(data, workload, args.sites, args.repeats)
            del data

    check = None
    if args.sites_check is not None:
        print("  separate call-site measurement", flush=True)
        check = sites_check(args.sites_check, args.repeats)

    summary = summarise(rows)
    elapsed = time.perf_counter() - start
    env["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None

    print()
    print(
        "total seconds (compile + first-call extra + one run); * = Auto did not "
        "pick the best fixed policy"
    )
    print(format_table(rows))
    skipped = [(r, v, why) for r in rows for v, why in r["skipped"].items()]
    if skipped:
        print("\nskipped:")
        for r, v, why in skipped:
            print(f"  {r['kind']}/{r['workload']} n={r['n']} k={r['k']} {v}: {why}")
    print(
        f"\nAuto / best over {summary['cases']} cases: median "
        f"{summary['median_auto_over_best']:.2f}x (target <= {TARGET_MEDIAN}: "
        f"{'met' if summary['median_met'] else 'NOT met'}), worst "
        f"{summary['worst_auto_over_best']:.2f}x at {summary['worst_case']} "
        f"(target <= {TARGET_WORST}: {'met' if summary['worst_met'] else 'NOT met'}); "
        f"Auto picked the best fixed policy in {summary['auto_picked_best']} of "
        f"{summary['cases']}; plain lineax / best: median "
        f"{summary['median_lineax_over_best']:.2f}x"
    )
    if check is not None:
        first, last = check["sites"][0], check["sites"][-1]
        print(
            f"call sites (expensive mv, n={check['n']}, L={check['layers']}): compile "
            f"total k={last} / k={first}: Auto {check[AUTO]['ratio']:.2f}x (target <= "
            f"{TARGET_SITES}: {'met' if check['met'] else 'NOT met'}; chose "
            + ", ".join(
                f"k={k}: {t['choice']['strategy']}"
                for k, t in check[AUTO]["results"].items()
            )
            + f"), plain lineax {check[BASELINE]['ratio']:.2f}x"
        )
    print(
        f"total benchmark time: {elapsed:.1f} s; load average at start "
        f"{env['load_average']}, at end {env['load_average_end']}"
    )

    args.out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out / "auto.json", args.out / "auto.png"
    payload = dict(
        environment=env,
        config=config,
        cases=rows,
        summary=summary,
        worst_cases=worst_cases(rows),
        sites_check=check,
        total_seconds=elapsed,
    )
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    plot(rows, summary, check, config, png_path)
    print(f"wrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
