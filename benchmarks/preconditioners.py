"""Preconditioners the package builds (`lxd.jacobi`, `lxd.block_jacobi`) against
plain CG and against lineax's CG with a diagonal built by hand, and
`lxd.AutoSolver`'s choice, in one process.

What is measured
----------------

- `diffusion` (`benchmarks/preconditioners_cases.py`): a 2-D variable-coefficient
  diffusion stencil whose coefficient spans 1e3, float64, at s x s grids. Each
  program builds its preconditioner inside itself, so its time includes the
  build: lineax's CG plain and with the diagonal built by hand (`jax.vmap` of
  `mv` over every basis vector; where its n^2 entries exceed 2 GiB, one slice of
  2048 basis vectors is timed and scaled to n, marked estimated); `lxd.CG` plain,
  with `lxd.jacobi` from the stencil's 4 coloured probes, and from basis vectors
  (up to 4096 unknowns); `lxd.AutoSolver` told the stencil. Steps are
  `stats["num_steps"]`; times are `harness.time_program`'s compile total and
  median run; "total" is compile plus one run.
- `spread`: the same stencil at the first grid with spans 1 to 1e3: steps and
  totals of plain and Jacobi CG, what `AutoSolver`'s run-time test (spread >= 10)
  is measured by.
- `blocks`: a dense SPD matrix dominated by its diagonal blocks: CG steps plain,
  with Jacobi and with block Jacobi, and what `AutoSolver(block_size=...)` picks
  and its compile plus one run over the best of those three.
- `families`: `AutoSolver`'s choice on every operator of `benchmarks.families`
  (matrix-free, no pattern stated): no preconditioner; and the stencil family
  told its pattern, solved with and without it (built, applied only where the
  diagonal spans 10x: its regret).

Run: `python -m benchmarks.preconditioners [--quick] [--grids 64,256]
[--parts diffusion,spread,blocks,families] [--out DIR]` (`--parts`: only those
parts, e.g. where float64 compiles slowly, as on a TPU).
Results: `preconditioners.json` and `.png`.
"""

import time

import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import (
    families_cases as fc,
    harness,
    preconditioners_cases as pc,
    preconditioners_report,
)


FULL = dict(grids=(64, 256), block_n=4096, block_size=64, dtype="float64")
QUICK = dict(grids=(32, 64), block_n=1024, block_size=32)
TOL = dict(rtol=1e-6, atol=1e-6)
SPANS = (1.0, 10.0, 100.0, 1e3)
PARTS = ("diffusion", "spread", "blocks", "families")


def _steps(sol) -> jax.Array:
    return sol.stats.get("num_steps", jnp.array(0))  # 0: a direct solve


def diffusion_programs(s: int, with_basis: bool, with_hand: bool) -> dict:
    """The diffusion programs at grid `s`: name -> `program(coefficients, b)`."""
    pattern = pc.stencil(s)

    def lineax(c, b, hand=False):
        op = pc.diffusion_operator(c, plain=True)
        options = {"preconditioner": pc.hand_jacobi(op)} if hand else {}
        sol = lx.linear_solve(op, b, lx.CG(**TOL), options=options, throw=False)
        return sol.value, _steps(sol)

    def ours(c, b, build=None):
        op = pc.diffusion_operator(c)
        options = {} if build is None else {"preconditioner": build(op)}
        sol = lx.linear_solve(op, b, lxd.CG(**TOL), options=options, throw=False)
        return sol.value, _steps(sol)

    def auto(c, b):
        op = pc.diffusion_operator(c)
        sol = lx.linear_solve(
            op, b, lxd.AutoSolver(**TOL, pattern=pattern), throw=False
        )
        return sol.value, _steps(sol)

    programs = {
        "lineax CG": lineax,
        "lxd.CG": ours,
        "lxd.CG + jacobi (stencil)": lambda c, b: ours(
            c, b, lambda op: lxd.jacobi(op, pattern=pattern)
        ),
        "AutoSolver (stencil)": auto,
    }
    if with_hand:
        programs["lineax CG + hand Jacobi"] = lambda c, b: lineax(c, b, hand=True)
    if with_basis:
        programs["lxd.CG + jacobi (basis)"] = lambda c, b: ours(c, b, lxd.jacobi)
    return programs


def time_one(program, params, b) -> dict:
    """`harness.time_program`, with steps and compile plus one run."""
    timings, _, (value, steps) = harness.time_program(program, params, b, min_runs=2)
    timings["total_s"] = timings["compile_total_s"] + timings["run_s"]
    timings["steps"] = int(steps)
    timings["value"] = value
    return timings


def measure_diffusion(s: int, dtype, span: float = 1e3) -> dict:
    """Every diffusion program at grid `s`, and the ratios of the targets."""
    n = s * s
    coefficients = pc.face_coefficients(s, span, dtype)
    b = jnp.ones(n, dtype)
    with_hand = n * n * jnp.dtype(dtype).itemsize <= pc.HAND_BYTES
    programs = diffusion_programs(s, with_basis=n <= 4096, with_hand=with_hand)
    results = {}
    for name, program in programs.items():
        results[name] = time_one(program, coefficients, b)
        r = results[name]
        print(
            f"  s={s:4d} {name:<28} steps {r['steps']:6d}  compile "
            f"{r['compile_total_s']:7.3f} s  run {r['run_s']:8.4f} s  total "
            f"{r['total_s']:7.3f} s"
        )
    reference = results["lineax CG"]["value"]
    for r in results.values():
        r["rel_err_vs_lineax"] = harness.relative_error(r.pop("value"), reference)
    hand = (
        dict(results["lineax CG + hand Jacobi"], estimated=False)
        if with_hand
        else _hand_estimate(coefficients, results["lxd.CG + jacobi (stencil)"])
    )
    results["lineax CG + hand Jacobi"] = hand
    ours = results["lxd.CG + jacobi (stencil)"]
    auto = lxd.AutoSolver(**TOL, pattern=pc.stencil(s))
    chosen, reasons = auto.choose(pc.diffusion_operator(coefficients))
    ratios = dict(steps_jacobi_over_plain=ours["steps"] / results["lxd.CG"]["steps"])
    for key in ("total_s", "run_s"):
        for name, other in (
            ("plain", results["lxd.CG"]),
            ("lineax", results["lineax CG"]),
            ("hand", hand),
        ):
            ratios[f"{name}_{key[:-2]}_over_jacobi"] = other[key] / ours[key]
    return dict(
        s=s,
        n=n,
        span=span,
        results=results,
        ratios=ratios,
        auto_chose=type(chosen).__name__,
        auto_reasons=list(reasons),
    )


def _hand_estimate(coefficients, jacobi: dict) -> dict:
    """The hand build past `HAND_BYTES`: its build estimated from one slice; the
    total a lower bound, that estimate plus our Jacobi-preconditioned solve's
    total (the same preconditioner, its build aside)."""
    found = pc.hand_estimate(coefficients)
    print(
        f"  hand Jacobi: n^2 = {found['dense_bytes'] / 2**30:.0f} GiB; "
        f"{found['slice_vectors']} basis vectors {found['slice_s']:.3f} s, so "
        f"~{found['build_s']:.1f} s for all (estimated)"
    )
    return dict(
        found,
        total_s=found["build_s"] + jacobi["total_s"],
        run_s=found["build_s"] + jacobi["run_s"],
        steps=jacobi["steps"],
    )


def measure_spread(s: int, dtype) -> list[dict]:
    """Plain and Jacobi CG at grid `s` across coefficient spans."""
    rows = []
    pattern = pc.stencil(s)
    for span in SPANS:
        coefficients = pc.face_coefficients(s, span, dtype)
        b = jnp.ones(s * s, dtype)
        programs = diffusion_programs(s, with_basis=False, with_hand=False)
        plain = time_one(programs["lxd.CG"], coefficients, b)
        jacobi = time_one(programs["lxd.CG + jacobi (stencil)"], coefficients, b)
        m = lxd.jacobi(pc.diffusion_operator(coefficients), pattern=pattern)
        d = 1 / m.inverse_diagonal
        row = dict(
            span=span,
            diagonal_spread=float(jnp.max(d) / jnp.min(d)),
            plain_steps=plain["steps"],
            jacobi_steps=jacobi["steps"],
            plain_total_s=plain["total_s"],
            jacobi_total_s=jacobi["total_s"],
        )
        rows.append(row)
        print(
            f"  span {span:7g}: diagonal spread {row['diagonal_spread']:8.1f}  steps "
            f"{row['plain_steps']} -> {row['jacobi_steps']}"
        )
    return rows


def measure_blocks(n: int, size: int, dtype) -> dict:
    """CG on the block-dominant matrix: plain, Jacobi, block Jacobi; AutoSolver."""
    matrix = pc.block_matrix(n, size, 0.5, dtype)
    b = jnp.ones(n, dtype)

    def program(matrix, b, build):
        op = lxd.MatrixLinearOperator(matrix, pc.PSD, policy=lxd.Lazy())
        options = {} if build is None else {"preconditioner": build(op)}
        sol = lx.linear_solve(op, b, lxd.CG(**TOL), options=options, throw=False)
        return sol.value, _steps(sol)

    builds = dict(
        plain=None,
        jacobi=lxd.jacobi,
        block_jacobi=lambda op: lxd.block_jacobi(op, size),
    )
    results = {
        name: time_one(lambda m, b, build=build: program(m, b, build), matrix, b)
        for name, build in builds.items()
    }
    auto = lxd.AutoSolver(**TOL, block_size=size)

    def auto_program(matrix, b):
        op = lxd.MatrixLinearOperator(matrix, pc.PSD)
        sol = lx.linear_solve(op, b, auto, throw=False)
        return sol.value, _steps(sol)

    results["AutoSolver"] = time_one(auto_program, matrix, b)
    for r in results.values():
        r.pop("value")
    op = lxd.MatrixLinearOperator(matrix, pc.PSD)
    chosen, reasons = auto.choose(op)
    sol = jax.jit(
        lambda m, b: lx.linear_solve(
            lxd.MatrixLinearOperator(m, pc.PSD), b, auto, throw=False
        )
    )(matrix, b)
    out = dict(n=n, block_size=size, results=results)
    out["auto_chose"] = type(chosen).__name__
    out["auto_reasons"] = list(reasons)
    out["auto_preconditioned"] = bool(sol.stats.get("preconditioned", False))
    out["auto_steps"] = int(sol.stats.get("num_steps", -1))
    out["jacobi_over_block_steps"] = (
        results["jacobi"]["steps"] / results["block_jacobi"]["steps"]
    )
    # AutoSolver's compile + one run over the best of the fixed programs.
    best = min(results[k]["total_s"] for k in builds)
    out["auto_over_best"] = results["AutoSolver"]["total_s"] / best
    print(
        f"  blocks n={n} b={size}: steps plain {results['plain']['steps']}, jacobi "
        f"{results['jacobi']['steps']}, block {results['block_jacobi']['steps']}; "
        f"AutoSolver -> {out['auto_chose']} (applied: {out['auto_preconditioned']}), "
        f"{out['auto_over_best']:.2f}x the best total"
    )
    return out


def measure_families(max_n: int) -> dict:
    """AutoSolver's choice on the families' operators; the stencil family with its
    pattern stated, with and without it."""
    choices = []
    for family in fc.FAMILIES:
        for n in (n for n in fc.SIZES[family] if n <= max_n):
            arrays = fc.family_arrays(family, n)
            op, _ = fc.make_operator(family, arrays, n, lxd.Auto())
            chosen, reasons = lxd.AutoSolver(**fc_tol()).choose(op)
            choices.append(
                dict(
                    family=family,
                    n=n,
                    chose=type(chosen).__name__,
                    preconditioned=isinstance(chosen, lxd.PreconditionedSolver),
                    reason=reasons[-1],
                )
            )
    n = max(v for v in fc.SIZES["stencil"] if v <= max_n)
    s = int(round(n**0.5))
    arrays = fc.family_arrays("stencil", n)
    op, _ = fc.make_operator("stencil", arrays, n, lxd.Lazy())
    x = jax.random.normal(jax.random.key(5), (n,), jnp.float32)
    told = {}
    for name, pattern in (("without pattern", None), ("with pattern", pc.stencil(s))):
        solver = lxd.AutoSolver(**fc_tol(), pattern=pattern)

        def program(arrays, x, solver=solver):
            o, _ = fc.make_operator("stencil", arrays, n, lxd.Lazy())
            sol = lx.linear_solve(o, x, solver, throw=False)
            return sol.value, sol.stats.get("preconditioned", jnp.array(False))

        timings, _, (_, applied) = harness.time_program(program, arrays, x, min_runs=3)
        timings["total_s"] = timings["compile_total_s"] + timings["run_s"]
        timings["preconditioned"] = bool(applied)
        told[name] = timings
    del op
    regret = told["with pattern"]["total_s"] / told["without pattern"]["total_s"]
    picked = sum(c["preconditioned"] for c in choices)
    print(
        f"  families: a preconditioner chosen on {picked} of {len(choices)} operators"
    )
    print(f"  stencil n={n} told its pattern: total {regret:.2f}x of without")
    return dict(choices=choices, stencil_told=told, stencil_n=n, regret=regret)


def fc_tol() -> dict:
    return dict(rtol=fc.RTOL, atol=fc.ATOL, max_steps=fc.MAX_STEPS)


def main(argv=None):
    """Measure, print, write `preconditioners.json` and `.png`."""
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--grids", type=harness.int_list, help="comma-separated s")
    parser.add_argument("--block-n", dest="block_n", type=int)
    parser.add_argument("--block-size", dest="block_size", type=int)
    parser.add_argument("--dtype", choices=("float64", "float32"))
    parser.add_argument(
        "--parts",
        type=lambda text: tuple(text.split(",")),
        default=PARTS,
        help=f"comma-separated, of {','.join(PARTS)}",
    )
    args = parser.parse_args(argv)
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"--parts: unknown {sorted(unknown)}; the parts are {PARTS}")
    harness.fill_defaults(args, FULL, QUICK)
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.dtype(args.dtype)
    env = harness.environment(load_average=True)
    config = dict(
        grids=list(args.grids),
        block_n=args.block_n,
        block_size=args.block_size,
        dtype=args.dtype,
        tol=TOL,
        spans=SPANS,
        parts=list(args.parts),
    )
    harness.print_setup(env, config)
    start = time.perf_counter()
    measure_diffusion(16, dtype)  # warm-up: a process's first compile pays more
    print("(warm-up done)")
    payload: dict = dict(environment=env, config=config)
    parts = dict(
        diffusion=lambda: [measure_diffusion(s, dtype) for s in args.grids],
        spread=lambda: measure_spread(args.grids[0], dtype),
        blocks=lambda: measure_blocks(args.block_n, args.block_size, dtype),
        families=lambda: measure_families(1024 if args.quick else 4096),
    )
    for part in args.parts:
        payload[part] = parts[part]()
    payload["seconds"] = time.perf_counter() - start
    print(preconditioners_report.report(payload))
    harness.write_results(
        args.out,
        "preconditioners",
        payload,
        lambda p: preconditioners_report.plot(payload, p),
    )


if __name__ == "__main__":
    main()
