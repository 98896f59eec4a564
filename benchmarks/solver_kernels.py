"""What our solvers compile to, against lineax's: the kernels XLA compiles for a
program with one solve, and the instructions fused into them, counted in the
optimised HLO (`jax.stages.Compiled.as_text()`: the same on every run of one
JAX version, where compile times vary from run to run by more than the
differences sought), with the compile time beside them.

On XLA:CPU each kernel (a fusion, a reduction, a library call) is code
generated and compiled on its own, at a cost per kernel that grows with the
instructions fused into it; a program of more kernels compiles longer. A first
call of a cheap solve is mostly that compile, so the counts say where our
solver's first call goes beyond lineax's.

Programs (one solve each, under `jax.jit`, the operator's arrays arguments):

- `stencil CG`: `benchmarks.families`' stencil, n = 1024, float32, CG;
- `diffusion CG`: `benchmarks.preconditioners`' diffusion, 64 x 64, float64, CG;
- `Gauss-Newton CG`: `benchmarks.families`' Gauss-Newton normal operator,
  n = 64, float32, CG;
- `Jacobian GMRES`: `benchmarks.families`' network Jacobian, n = 256, float32,
  GMRES.

Variants: `lineax` (lineax's operator and solver) and `ours` (ours, `Lazy`, and
our solver of the same name). Per program and variant: kernels, fused
instructions (less parameters, constants and bitcasts), and the median compile
time of the rounds (each round compiles every variant once, in turn, a fresh
program each); the ratios ours over lineax's. For the CG programs, the counts of
ours with each of its safeguards left out in turn (the true-residual check, the
stall rule, the periodic refresh, the scaling of the right-hand side), then all
of them, as `benchmarks.cg_compile` times them: what each compiles to, and its
compile over lineax's (the median of each round's ratio).

How to run
----------

    python -m benchmarks.solver_kernels            # 7 rounds
    python -m benchmarks.solver_kernels --quick    # 1 round

Results: `benchmarks/results/solver_kernels.json` and `.png`.
"""

import contextlib
import re
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd

from . import families_cases as fc, harness, preconditioners_cases as pc


FULL = dict(rounds=7)
QUICK = dict(rounds=1)
VARIANTS = ("lineax", "ours")
# Instructions of a fused computation that generate no code.
NO_CODE = ("parameter", "constant", "bitcast")
KERNEL_OPS = ("fusion", "dot", "custom-call", "reduce", "sort", "scatter")


# Our CG's safeguards, each left out in turn, then all of them: the
# settings of `lxd.CG`, and whether the right-hand side's scaling is patched out
# (as `benchmarks.cg_compile` does; there is no setting for it).
ABLATIONS: dict[str, tuple[dict, bool]] = {
    "no check": (dict(check_residual=False), False),
    "no stall rule": (dict(stagnation_iters=None), False),
    "no refresh": (dict(stabilise_every=None), False),
    "no scaling": ({}, True),
    "none of them": (
        dict(check_residual=False, stagnation_iters=None, stabilise_every=None),
        True,
    ),
}


def _families_program(
    family: str, n: int, variant: str, settings: dict
) -> tuple[Callable, tuple]:
    """`benchmarks.families`' `family` at `n`, one solve, as `(f, args)`; ours
    with CG's `settings` where given."""
    arrays = fc.family_arrays(family, n)
    op, solver = fc.make_operator(
        family, arrays, n, None if variant == "lineax" else lxd.Lazy()
    )
    if settings:
        solver = lxd.CG(rtol=fc.RTOL, atol=fc.ATOL, max_steps=fc.MAX_STEPS, **settings)
    f, params, _ = harness.split_program(op, fc.body(fc.Case(family, n, 1, 0), solver))
    return f, (params, jnp.ones(n, jnp.float32))


def _diffusion_program(variant: str, settings: dict) -> tuple[Callable, tuple]:
    """`benchmarks.preconditioners`' diffusion at 64 x 64 in float64, one CG
    solve, as `(f, args)`; ours with CG's `settings`."""
    plain = variant == "lineax"

    def f(c, b):
        op = pc.diffusion_operator(c, plain=plain)
        tol = dict(rtol=1e-6, atol=1e-6)
        solver = lx.CG(**tol) if plain else lxd.CG(**tol, **settings)
        sol = lx.linear_solve(op, b, solver, throw=False)
        return sol.value, sol.stats["num_steps"]

    c = pc.face_coefficients(64, 1e3, jnp.float64)
    return f, (c, jnp.ones(64 * 64, jnp.float64))


PROGRAMS: dict[str, Callable[[str, dict], tuple[Callable, tuple]]] = {
    "stencil CG": lambda v, s: _families_program("stencil", 1024, v, s),
    "diffusion CG": _diffusion_program,
    "Gauss-Newton CG": lambda v, s: _families_program("gauss_newton", 64, v, s),
    "Jacobian GMRES": lambda v, s: _families_program("jacobian", 256, v, s),
}
# The programs whose solver is CG (ablated).
CG_PROGRAMS = ("stencil CG", "diffusion CG", "Gauss-Newton CG")


# An HLO instruction's operation, after its result's type: one shape, or a tuple of
# shapes (a variadic reduction's fusion).
INSTRUCTION = re.compile(r"= (?:\([^)]*\)|\S+) ([a-z][\w\-]*)\(")


def count_kernels(hlo: str) -> tuple[int, int]:
    """`(kernels, fused instructions)` of an optimised HLO module's text: the
    kernel-making instructions of its computations that are not themselves fused
    or reducers (the entry, loop bodies and conditions, branches), and the
    instructions that make code in the fused computations they call."""
    called = set(re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", hlo))
    bodies = {
        m.group(1): m.group(0)
        for m in re.finditer(r"(?m)^(?:ENTRY )?%([\w.\-]+) .*?\n}", hlo, re.S)
    }
    kernels = instructions = 0
    for name, body in bodies.items():
        if name in called:
            continue
        for line in body.split("\n")[1:]:
            op = INSTRUCTION.search(line)
            if op is None or op.group(1) not in KERNEL_OPS:
                continue
            kernels += 1
            callee = re.search(r"calls=%?([\w.\-]+)", line)
            if callee is not None and callee.group(1) in bodies:
                ops = INSTRUCTION.findall(bodies[callee.group(1)])
                instructions += sum(o not in NO_CODE for o in ops)
    return kernels, instructions


# The programs traced with 64-bit types enabled (their float64 arrays).
X64 = ("diffusion CG",)


def _compile(
    program: str, variant: str, settings: dict | None = None, unscaled: bool = False
) -> tuple[float, str]:
    """`(seconds, optimised HLO text)` of one fresh program's compile; ours with
    CG's `settings`, and without the scaling of the right-hand side where
    `unscaled`."""
    unit = harness.without_rhs_scaling() if unscaled else contextlib.nullcontext()
    with jax.enable_x64(program in X64), unit:
        f, args = PROGRAMS[program](variant, settings or {})
        lowered = jax.jit(f).lower(*args)
    start = time.perf_counter()
    compiled = lowered.compile()
    return time.perf_counter() - start, compiled.as_text()


def ablations(program: str, rounds: int) -> dict:
    """Per variant of `ABLATIONS`, the kernels and fused instructions of ours,
    and its compile over lineax's: the median over `rounds` of each round's
    ratio (a round compiles lineax's program, then each variant's, fresh
    programs)."""
    ratios: dict[str, list[float]] = {name: [] for name in ABLATIONS}
    for _ in range(rounds):
        base = _compile(program, "lineax")[0]
        for name, (settings, unscaled) in ABLATIONS.items():
            seconds = _compile(program, "ours", settings, unscaled)[0]
            ratios[name].append(seconds / base)
    out = {}
    for name, (settings, unscaled) in ABLATIONS.items():
        kernels, instructions = count_kernels(
            _compile(program, "ours", settings, unscaled)[1]
        )
        out[name] = dict(
            kernels=kernels,
            fused_instructions=instructions,
            compile_over_lineax=statistics.median(ratios[name]),
        )
    return out


def measure(rounds: int) -> dict:
    """Per program: each variant's kernels, fused instructions and compile
    seconds (median of `rounds`), and ours over lineax's."""
    out: dict = {}
    for program in PROGRAMS:
        counts = {v: count_kernels(_compile(program, v)[1]) for v in VARIANTS}
        seconds: dict = {v: [] for v in VARIANTS}
        for round_ in range(rounds):
            for v in VARIANTS[:: -1 if round_ % 2 else 1]:
                seconds[v].append(_compile(program, v)[0])
        rows = {
            v: dict(
                kernels=counts[v][0],
                fused_instructions=counts[v][1],
                compile_s=statistics.median(seconds[v]),
                all_compile_s=seconds[v],
            )
            for v in VARIANTS
        }
        ours, base = rows["ours"], rows["lineax"]
        ratios = {
            k: ours[k] / base[k] for k in ("kernels", "fused_instructions", "compile_s")
        }
        out[program] = dict(results=rows, ours_over_lineax=ratios)
        if program in CG_PROGRAMS:
            out[program]["ablations"] = ablations(program, rounds)
    return out


def plot(results: dict, path) -> None:
    plt = harness.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    names = list(results)
    keys = (
        ("kernels", "kernels"),
        ("fused_instructions", "fused instructions"),
        ("compile_s", "compile, s (median)"),
    )
    for ax, (key, label) in zip(axes, keys):
        for i, v in enumerate(VARIANTS):
            values = [results[p]["results"][v][key] for p in names]
            ax.bar([j + 0.4 * i for j in range(len(names))], values, 0.4, label=v)
        ax.set_xticks([j + 0.2 for j in range(len(names))], names, fontsize=7)
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"One solve, compiled: ours and lineax's; {harness.jax_label()}", fontsize=9
    )
    harness.save(fig, path)


def main(argv=None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    env = harness.environment(load_average=True)
    results = measure(settings["rounds"])
    rows = []
    for program, r in results.items():
        for v in VARIANTS:
            x = r["results"][v]
            rows.append(
                [
                    program,
                    v,
                    x["kernels"],
                    x["fused_instructions"],
                    f"{x['compile_s']:.3f} s",
                ]
            )
        q = r["ours_over_lineax"]
        rows.append(
            [
                program,
                "ours / lineax",
                f"{q['kernels']:.2f}",
                f"{q['fused_instructions']:.2f}",
                f"{q['compile_s']:.2f}",
            ]
        )
    print(
        harness.table(
            ["program", "variant", "kernels", "fused instructions", "compile"], rows
        )
    )
    print(
        harness.table(
            ["program", "ours, CG", "kernels", "fused instructions", "over lineax"],
            [
                [
                    program,
                    name,
                    a["kernels"],
                    a["fused_instructions"],
                    f"{a['compile_over_lineax']:.2f}",
                ]
                for program, r in results.items()
                for name, a in r.get("ablations", {}).items()
            ],
        )
    )
    payload = dict(environment=env, settings=settings, results=results)
    harness.write_results(
        args.out, "solver_kernels", payload, lambda p: plot(results, p)
    )


if __name__ == "__main__":
    main()
