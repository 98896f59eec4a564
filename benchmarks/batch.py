"""Many right-hand sides at once: `lxd.batch_solve` against a Python loop, against
the direct-solver limit, against a vmapped lineax CG, and its peak memory under a
memory budget.

What is measured
----------------

(a) Dense SPD `A = M M^T / n + I` (`n = 512`, float32) with `B = 1, 16, 256`
    right-hand sides, run times only (each program compiled and called once
    first; then the median of several calls, `block_until_ready`):

    batch_solve  jit(lxd.batch_solve(lxd.MatrixLinearOperator(A), bs, lx.LU()))
    loop         a Python loop over the B right-hand sides of
                 jit(lx.linear_solve(lx.MatrixLinearOperator(A), b, lx.LU())),
                 which factors A on every call
    limit        jit(lu_solve(lu_factor(A), bs.T)): one factorisation, one
                 matrix right-hand side

    Reported: batch_solve / limit and loop / batch_solve.

(b) The expensive matrix-free SPD operator of `solvers` (`x -> SHIFT x +
    C^T (C x)`, `C` a chain of 16 dense 256 x 256 float32 layers, weights in an
    `eqx.Partial` with `closure_convert=False` so that they are jit arguments,
    scaled so that CG converges in a few tens of steps), 512 right-hand sides:

    auto       jit(lxd.batch_solve(op with lxd.Auto(), bs, lxd.CG(...)))
    lineax     jit(jax.vmap(lambda b: lx.linear_solve(plain op, b, lx.CG(...))))

    both with `rtol = atol = 1e-5`, `max_steps = 200`, timed as in
    `harness.time_program` (trace + lower + compile + first call, then the
    median run). Auto's decision (with the executions `batch_solve` counts) is
    recorded: with at least as many right-hand sides as unknowns and the matrix
    within the budget it materialises once and vmaps CG on the matrix.

(c) Peak memory of a large batch of CG solves (2048 right-hand sides) on a cheap
    matrix-free SPD operator (`x -> d * x`, `n = 8192`, `d ~ U(SHIFT, 1 + SHIFT)`):
    `lxd.Auto(memory_budget=...)` with a budget small enough that Auto chooses
    chunks (`VmapBatch(batch_size=k)`) against `lxd.VmapBatch()` (all in lockstep).
    With batch >= n Auto materialises (or, when even that does not fit, scans),
    so the operator is wider than the batch here (at n = 16384 both lineax's and
    this package's CG break down after 1-2 steps in float32, so n = 8192). Each
    program is compiled first; then freed heap is returned to the OS
    (`malloc_trim(0)`), the peak RSS is reset (`5 > /proc/self/clear_refs`) and
    the run's growth is `VmHWM` after the call minus `VmRSS` before it. Chunked
    runs first (in case the reset is unavailable and `VmHWM` is monotone).

How to run
----------

    python -m benchmarks.batch            # the sizes above, ~3 minutes
    python -m benchmarks.batch --quick    # small sizes, < 1 minute

Results: `benchmarks/results/batch.json` and `batch.png` (`--out DIR`).
"""

import ctypes
import time
from collections.abc import Sequence
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.harness import SEED, SHIFT, timed
from lineax_dispatch.solvers._prepare import expected_iterations


RTOL = ATOL = 1e-5
MAX_STEPS = 200
FULL = dict(
    dense_n=512, dense_batches=(1, 16, 256), n=256, layers=16, rhs=512,
    mem_n=8192, mem_rhs=2048,
)  # fmt: skip
QUICK = dict(
    dense_n=128, dense_batches=(1, 4, 32), n=64, layers=4, rhs=128,
    mem_n=4096, mem_rhs=1024,
)  # fmt: skip


ACCEPTANCE = dict(
    dense_vs_limit_max=1.25, loop_vs_dense_min=20.0, auto_vs_lineax_max=1.0
)


def median_time(thunk, runs: int) -> float:
    """One call (compiling), then the median of `runs` calls."""
    jax.block_until_ready(thunk())
    return harness.median_call_time(thunk, runs)


# ------------------------------------------------------------------ (a) dense LU


def dense_part(n: int, batches: Sequence[int], runs: int) -> list[dict]:
    k1, k2 = jax.random.split(jax.random.key(SEED))
    m = jax.random.normal(k1, (n, n), jnp.float32)
    a = m @ m.T / n + jnp.eye(n, dtype=jnp.float32)
    batched = jax.jit(
        lambda a, bs: lxd.batch_solve(lxd.MatrixLinearOperator(a), bs, lx.LU()).value
    )
    single = jax.jit(
        lambda a, b: lx.linear_solve(lx.MatrixLinearOperator(a), b, lx.LU()).value
    )
    limit = jax.jit(lambda a, bs: jsl.lu_solve(jsl.lu_factor(a), bs.T).T)
    rows = []
    for b in batches:
        bs = jax.random.normal(jax.random.fold_in(k2, b), (b, n), jnp.float32)
        cols = [bs[i] for i in range(b)]
        t_batch = median_time(lambda: batched(a, bs), runs)
        t_limit = median_time(lambda: limit(a, bs), runs)
        t_loop = median_time(lambda: [single(a, c) for c in cols], max(3, runs // 3))
        x = batched(a, bs)
        residual = float(jnp.linalg.norm(x @ a.T - bs) / jnp.linalg.norm(bs))
        rows.append(dict(
            batch=b, batch_solve_s=t_batch, loop_s=t_loop, limit_s=t_limit,
            batch_solve_over_limit=t_batch / t_limit,
            loop_over_batch_solve=t_loop / t_batch, residual=residual,
        ))  # fmt: skip
        print(f"  (a) B={b}: done", flush=True)
    return rows


# ------------------------------------------------------------------ (b) expensive matrix-free operator, CG


def cg_part(n: int, layers: int, rhs: int) -> dict:
    weights, scales, factor = harness.spd_layers(n, layers)
    fn = lambda: harness.spd_function(weights, scales)  # noqa: E731
    ours, plain = (
        harness.spd_operator(fn(), n, lxd.Auto()),
        harness.spd_operator(fn(), n),
    )
    bs = jax.random.normal(jax.random.key(SEED + 1), (rhs, n), jnp.float32)
    executions = expected_iterations(MAX_STEPS, n)
    decision = ours.policy.decision(ours, batch=rhs, executions=executions)
    solver = lxd.CG(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)
    lx_solver = lx.CG(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)

    def auto(op, bs):
        sol = lxd.batch_solve(op, bs, solver, throw=False)
        return sol.value, sol.stats["num_steps"]

    def vmapped(op, bs):
        def one(b):
            sol = lx.linear_solve(op, b, lx_solver, throw=False)
            return sol.value, sol.stats["num_steps"]

        return jax.vmap(one)(bs)

    out = dict(
        decision=harness.decision_record(
            decision, executions=executions, memory_budget=ours.policy.budget()
        ),
        scale_factor_per_layer=factor,
    )
    for name, op, body in (("auto", ours, auto), ("lineax", plain, vmapped)):
        program, params, _ = harness.split_program(op, body)
        timings, _, (x, steps) = harness.time_program(program, params, bs, 3)
        residual = jnp.linalg.norm(jax.vmap(plain.mv)(x) - bs, axis=1)
        timings.update(
            total_s=timings["compile_total_s"] + timings["run_s"],
            max_residual=float(jnp.max(residual / jnp.linalg.norm(bs, axis=1))),
            steps_max=int(jnp.max(steps)),
            steps_median=float(jnp.median(steps)),
        )
        out[name] = timings
        print(f"  (b) {name}: done", flush=True)
    return out


# ------------------------------------------------------------------ (c) peak memory under a budget


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def _reset_peak() -> bool:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_part(n: int, rhs: int) -> dict:
    k1, k2 = jax.random.split(jax.random.key(SEED + 2))
    d = jax.random.uniform(k1, (n,), jnp.float32, SHIFT, 1 + SHIFT)
    fn = eqx.Partial(lambda d, x: d * x, d)
    bs = jax.random.normal(k2, (rhs, n), jnp.float32)
    executions = expected_iterations(MAX_STEPS, n)
    solver = lxd.CG(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)

    op_with = lambda policy: harness.spd_operator(fn, n, policy)  # noqa: E731
    # The largest power-of-two budget that makes Auto solve in chunks of <= rhs/8.
    budget, decision = 1 << 40, None
    while budget > 1 << 16:
        policy = lxd.Auto(memory_budget=budget)
        d_ = policy.decision(op_with(policy), batch=rhs, executions=executions)
        bsz = getattr(d_.policy, "batch_size", None)
        if isinstance(d_.policy, lxd.VmapBatch) and bsz is not None and bsz <= rhs // 8:
            decision = d_
            break
        budget //= 2
    assert decision is not None, "no budget makes Auto chunk"
    out = dict(
        budget=budget,
        decision=dict(policy=repr(decision.policy), reasons=list(decision.reasons)),
        vectors_mb=rhs * n * 4 / 2**20,
    )

    def solve(op, bs):
        sol = lxd.batch_solve(op, bs, solver, throw=False)
        return sol.value, sol.stats["num_steps"]

    reset_ok = True
    for name, policy in (
        ("auto_chunked", lxd.Auto(memory_budget=budget)),
        ("lockstep", lxd.VmapBatch()),
    ):
        program, params, _ = harness.split_program(op_with(policy), solve)
        compiled, compile_s = timed(
            lambda: jax.jit(program).lower(params, bs).compile()
        )
        reset_ok &= _reset_peak()
        before = _status_kb("VmRSS")
        (x, steps), run_s = timed(lambda: jax.block_until_ready(compiled(params, bs)))
        peak = _status_kb("VmHWM")
        residual = jnp.linalg.norm(d * x - bs, axis=1) / jnp.linalg.norm(bs, axis=1)
        out[name] = dict(
            rss_before_mb=before / 1024,
            peak_mb=peak / 1024,
            growth_mb=(peak - before) / 1024,
            compile_s=compile_s,
            run_s=run_s,
            steps_max=int(jnp.max(steps)),
            max_residual=float(jnp.max(residual)),
        )
        del x, steps
        print(f"  (c) {name}: done", flush=True)
    out["peak_reset_available"] = reset_ok
    return out


# ------------------------------------------------------------------ report


def format_report(dense: list[dict], cg: dict, mem: dict, config: dict) -> str:
    """The three parts' tables and Auto's decisions."""
    ms = lambda seconds, spec: f"{1e3 * seconds:{spec}}"  # noqa: E731
    dense_rows = [
        [r["batch"], ms(r["batch_solve_s"], ".3f"), ms(r["loop_s"], ".2f"),
         ms(r["limit_s"], ".3f"), f"{r['batch_solve_over_limit']:.2f}",
         f"{r['loop_over_batch_solve']:.1f}", f"{r['residual']:.1e}"]
        for r in dense
    ]  # fmt: skip
    cg_rows = [
        [k, f"{t['compile_total_s']:.2f}", f"{t['run_s']:.3f}", f"{t['total_s']:.2f}",
         t["steps_max"], f"{t['max_residual']:.1e}"]
        for k, t in ((k, cg[k]) for k in ("auto", "lineax"))
    ]  # fmt: skip
    mem_rows = [
        [k, f"{m['rss_before_mb']:.0f}M", f"{m['peak_mb']:.0f}M",
         f"{m['growth_mb']:.0f}M", f"{m['run_s']:.2f}", m["steps_max"]]
        for k, m in ((k, mem[k]) for k in ("auto_chunked", "lockstep"))
    ]  # fmt: skip
    b, c = cg["decision"], mem["decision"]
    lines = [
        f"(a) dense SPD n={config['dense_n']} float32, lx.LU, run times (ms)",
        harness.table(
            ["B", "batch_solve", "loop", "limit", "bs/limit", "loop/bs", "residual"],
            dense_rows,
        ),
        f"\n(b) matrix-free SPD n={config['n']}, {config['layers']} layers, "
        f"{config['rhs']} rhs, CG rtol=atol={RTOL:g} (s)",
        harness.table(["", "compile", "run", "total", "steps", "residual"], cg_rows),
        f"  Auto decided {b['policy']} (executions={b['executions']}): "
        + " ".join(b["reasons"]),
        f"\n(c) CG on x -> d*x, n={config['mem_n']}, {config['mem_rhs']} rhs "
        f"(stack of vectors {mem['vectors_mb']:.0f} MB), budget "
        f"{mem['budget'] / 2**20:g} MiB",
        harness.table(["", "RSS before", "peak", "growth", "run s", "steps"], mem_rows),
        f"  Auto decided {c['policy']}: " + " ".join(c["reasons"]),
    ]
    if not mem["peak_reset_available"]:
        lines.append("  (peak RSS reset unavailable: VmHWM is monotone)")
    return "\n".join(lines)


def acceptance(dense: list[dict], cg: dict) -> dict:
    """Each criterion of `ACCEPTANCE`, as a line, and whether it holds."""
    last, a = dense[-1], ACCEPTANCE
    b = last["batch"]
    limit, loop = last["batch_solve_over_limit"], last["loop_over_batch_solve"]
    ratio = cg["auto"]["total_s"] / cg["lineax"]["total_s"]
    return {
        f"B={b}: batch_solve / limit = {limit:.2f} <= {a['dense_vs_limit_max']}": (
            limit <= a["dense_vs_limit_max"]
        ),
        f"B={b}: loop / batch_solve = {loop:.1f} >= {a['loop_vs_dense_min']}": (
            loop >= a["loop_vs_dense_min"]
        ),
        f"auto / vmapped lineax CG total = {ratio:.2f} <= "
        f"{a['auto_vs_lineax_max']}": ratio <= a["auto_vs_lineax_max"],
    }


def plot(dense: list[dict], cg: dict, mem: dict, path: Path) -> None:
    """(a) run times against B, (b) compile and run, (c) peak RSS growth."""
    plt = harness.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    bs = [r["batch"] for r in dense]
    for key, label in (
        ("batch_solve_s", "lxd.batch_solve"),
        ("loop_s", "Python loop of lx.linear_solve"),
        ("limit_s", "lu_factor + lu_solve (limit)"),
    ):
        ax.plot(bs, [1e3 * r[key] for r in dense], "o-", label=label)
    ax.set(xscale="log", yscale="log", xlabel="right-hand sides B", ylabel="run (ms)")
    ax.set_title("(a) dense SPD, LU")
    ax.legend(fontsize=8)
    ax = axes[1]
    names = ["auto", "lineax"]
    comp = [cg[k]["compile_total_s"] for k in names]
    run = [cg[k]["run_s"] for k in names]
    ax.bar(names, comp, label="compile total")
    ax.bar(names, run, bottom=comp, label="run")
    ax.set(ylabel="seconds", title=f"(b) CG: Auto ({cg['decision']['strategy']})")
    ax.legend(fontsize=8)
    ax = axes[2]
    names = ["auto_chunked", "lockstep"]
    ax.bar(names, [mem[k]["growth_mb"] for k in names], color=["C2", "C3"])
    ax.set_xlabel(mem["decision"]["policy"] + " vs VmapBatch()", fontsize=8)
    ax.set(ylabel="peak RSS growth of the run (MB)", title="(c) peak memory, CG")
    fig.suptitle(f"batch_solve; {harness.jax_label(openblas=True)}")
    harness.save(fig, path)


# ------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> None:
    args = harness.parser(__doc__, FULL, QUICK).parse_args(argv)
    start = time.perf_counter()
    env = harness.environment()
    config = dict(
        QUICK if args.quick else FULL,
        dtype="float32",
        rtol=RTOL,
        atol=ATOL,
        max_steps=MAX_STEPS,
        shift=SHIFT,
        seed=SEED,
        quick=args.quick,
    )
    harness.print_setup(env, config)
    runs = 5 if args.quick else 9
    mem = memory_part(config["mem_n"], config["mem_rhs"])
    dense = dense_part(config["dense_n"], config["dense_batches"], runs)
    cg = cg_part(config["n"], config["layers"], config["rhs"])
    accept = acceptance(dense, cg)
    elapsed = time.perf_counter() - start
    print()
    print(format_report(dense, cg, mem, config))
    print()
    print("acceptance:")
    for line, ok in accept.items():
        print(f"  [{'PASS' if ok else 'FAIL'}] {line}")
    print(f"total benchmark time: {elapsed:.1f} s")
    payload = dict(
        environment=env,
        config=config,
        dense=dense,
        cg=cg,
        memory=mem,
        acceptance=dict(criteria=ACCEPTANCE, results=accept),
        total_seconds=elapsed,
    )
    harness.write_results(
        args.out, "batch", payload, lambda path: plot(dense, cg, mem, path)
    )


if __name__ == "__main__":
    main()
