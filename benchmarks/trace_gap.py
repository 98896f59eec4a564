"""`lxd.jit`'s trace of a program with solves against `jax.jit`'s, made one after
another and made inside `benchmarks.families`' loop of measured variants, in one
process.

On a TPU host `benchmarks.families` timed `lxd.jit`'s trace of a solve program at
about three times `jax.jit`'s, while the same traces made one after another ran
as fast as `jax.jit`'s (`docs/benchmarks_tpu.md`). This benchmark measures both
ways on whatever backend JAX sees, so that the gap can be found again and its
cause looked for.

Programs: the held-out stencil programs of `benchmarks.families_cases` with
solves (`lxd.CG`), each a fresh program per trace. Variants: `lineax` (plain
lineax under `jax.jit`), `Lazy` (our operator and solver under `jax.jit`), and
under `lxd.jit` `Roll` and `Auto1` (`Auto(runs=1, race=False)`). Phases, in turn:

- `alone`: each variant's trace (`jax.jit(f).trace` or `lxd.jit(f).decisions`)
  made one after another, nothing compiled or run between them;
- `families`: `benchmarks.families.run_case` on the same programs (every
  variant of that loop traced, lowered, compiled and run in turn), the trace
  stage of each timed where the families time it;
- `alone again`: as `alone`.

Per phase and variant: the median trace (wall seconds) and the main thread's CPU
seconds over it (equal where the thread computed throughout; less where it
waited), and each over `Lazy`'s (the same solver under `jax.jit`).

How to run
----------

    python -m benchmarks.trace_gap            # 3 rounds
    python -m benchmarks.trace_gap --quick    # 1 round, the first program only

Results: `<out>/trace_gap.json` and `.png`.
"""

import statistics
import time
from collections.abc import Callable
from unittest import mock

import jax
import jax.numpy as jnp

import lineax_dispatch as lxd
from benchmarks import families, families_cases as fc, harness


FULL = dict(rounds=3, programs=0)
QUICK = dict(rounds=1, programs=1)
VARIANTS = ("lineax", "Lazy", "Roll", "Auto1")
PHASES = ("alone", "families", "alone again")
# The variants `families.run_case` measures here (it scores `Auto` against them).
LOOP = ("Lazy", "Roll", "lineax", "Auto1", "Auto")


def cases(count: int) -> list[fc.Case]:
    """The held-out stencil programs with solves (the first `count`; all for 0)."""
    _, held_out = fc.split(fc.cases())
    found = [c for c in held_out if c.family == "stencil" and c.solves > 0]
    return found[:count] if count else found


def _trace(variant: str, case: fc.Case, arrays: tuple) -> Callable[[], object]:
    """The trace of a fresh program of `case` under `variant`, to be called."""
    policy = None if variant == "lineax" else families.POLICIES[variant]()
    op, solver = fc.make_operator(case.family, arrays, case.n, policy)
    f, params, _ = harness.split_program(op, fc.body(case, solver))
    x = jax.random.normal(jax.random.key(harness.SEED + 5), (case.n,), jnp.float32)
    if variant in families.LXD_JIT:
        jitted = lxd.jit(f)
        return lambda: jitted.decisions(params, x)
    return lambda: jax.jit(f).trace(params, x)


def _timed_trace(trace: Callable[[], object]) -> tuple[object, dict]:
    """`trace()` and its wall and main-thread CPU seconds, from a fresh heap."""
    harness.fresh_heap()
    cpu, wall = time.thread_time(), time.perf_counter()
    out = trace()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return out, dict(wall_s=wall, cpu_s=cpu)


def alone(programs: list, found: dict, phase: str) -> None:
    """Each variant's trace of each program, one after another."""
    for case, arrays in programs:
        for variant in VARIANTS:
            _, times = _timed_trace(_trace(variant, case, arrays))
            found[phase][variant].append(times)


def in_families(programs: list, found: dict) -> None:
    """`families.run_case` on each program, its trace stages timed."""
    real = harness.compile_stages
    current: list[str] = []

    def stages(trace: Callable, lower: Callable, args) -> tuple:
        timing: dict = {}

        def timed() -> object:
            out, times = _timed_trace(trace)
            timing.update(times)
            return out

        out = real(timed, lower, args)
        if current and current[-1] in VARIANTS:
            found["families"][current[-1]].append(timing)
        return out

    def measure(variant: str, case: fc.Case, arrays: tuple, *rest) -> tuple:
        current.append(variant)
        return real_measure(variant, case, arrays, *rest)

    real_measure = families.measure
    with mock.patch.object(harness, "compile_stages", stages):
        with mock.patch.object(families, "measure", measure):
            for case, _ in programs:
                families.run_case(case, 1, variants=LOOP)


def run(rounds: int, count: int) -> dict:
    programs = [(c, fc.family_arrays(c.family, c.n)) for c in cases(count)]
    found = {p: {v: [] for v in VARIANTS} for p in PHASES}
    for r in range(rounds):
        alone(programs, found, "alone")
        in_families(programs, found)
        alone(programs, found, "alone again")
        print(f"round {r}", flush=True)
    results = {}
    for phase, by_variant in found.items():
        row = {
            v: {k: statistics.median(t[k] for t in ts) for k in ("wall_s", "cpu_s")}
            for v, ts in by_variant.items()
        }
        for entry in row.values():
            entry["over_lazy"] = entry["wall_s"] / row["Lazy"]["wall_s"]
        results[phase] = row
    return dict(programs=[c.label for c, _ in programs], phases=results)


def report(results: dict) -> str:
    rows = [
        (
            phase,
            variant,
            f"{e['wall_s'] * 1e3:.1f} ms",
            f"{e['cpu_s'] * 1e3:.1f} ms",
            f"{e['over_lazy']:.2f}x",
        )
        for phase, row in results["phases"].items()
        for variant, e in row.items()
    ]
    headers = ("phase", "variant", "trace", "main thread's CPU", "over Lazy")
    return harness.table(headers, rows)


def _plot(results: dict):
    def draw(path):
        plt = harness.pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.5))
        width = 0.8 / len(VARIANTS)
        for i, variant in enumerate(VARIANTS):
            values = [results["phases"][p][variant]["wall_s"] * 1e3 for p in PHASES]
            xs = [j + i * width for j in range(len(PHASES))]
            ax.bar(xs, values, width, label=variant)
        ax.set_xticks([j + 0.4 for j in range(len(PHASES))], PHASES)
        ax.set_ylabel("trace, ms (median)")
        ax.set_title(f"trace of a solve program, {harness.jax_label()}")
        ax.legend(fontsize=8)
        harness.save(fig, path)

    return draw


def main(argv=None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--programs", type=int, default=None, help="0: all")
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    env = harness.environment()
    harness.print_setup(env, dict(rounds=args.rounds, programs=args.programs))
    results = run(args.rounds, args.programs)
    print(report(results))
    payload = dict(environment=env, backend=jax.default_backend(), **results)
    harness.write_results(args.out, "trace_gap", payload, _plot(results))


if __name__ == "__main__":
    main()
