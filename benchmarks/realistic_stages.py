"""Where a realistic program's first call goes, stage by stage: the programs of
`benchmarks.realistic` (fresh programs), under `eqx.filter_jit` with plain lineax
operators and under `lxd.jit` with `Lazy`, `Roll` and `Auto(race=False)`, each
stage timed apart: the trace (for `lxd.jit`: its trace of the program, analysis
and decisions; for lineax: none apart, see below), the lowering (for lineax:
`eqx.filter_jit`'s trace and lowering together), XLA's compile, and the first run.

How to run
----------

    python -m benchmarks.realistic_stages                 # every program, 3 rounds
    python -m benchmarks.realistic_stages --programs rk4_stencil,newton_residual
    python -m benchmarks.realistic_stages --quick          # smaller sizes, 1 round

Per program and variant: the median of each stage over the rounds (every other
round in reverse order), and the total over lineax's total. The first `Auto` of a
process measures the machine's calibration where none is cached: one untimed
`Auto` program runs first. Results: `<out>/realistic_stages.json` and `.png`.
"""

import statistics

import equinox as eqx
import jax
import numpy as np

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.realistic_cases import fresh_program, PROGRAMS


FULL = dict(rounds=3, scale=1.0)
QUICK = dict(rounds=1, scale=0.25)
POLICY = {
    "Lazy": lxd.Lazy,
    "Roll": lxd.Roll,
    "Auto": lambda: lxd.Auto(race=False),
}
VARIANTS = ("lineax", *POLICY)
STAGES = ("trace_s", "lower_s", "compile_s", "first_run_s")


def stages(name: str, variant: str, scale: float) -> dict:
    """The stages of one fresh program's first call (seconds)."""
    policy = None if variant == "lineax" else POLICY[variant]()
    body, op, x = fresh_program(name, policy, scale)
    harness.fresh_heap()
    if policy is None:
        jitted, trace_s = eqx.filter_jit(body), 0.0
        lowered, lower_s = harness.timed(lambda: jitted.lower(op, x))
    else:
        jitted = lxd.jit(body)
        _, trace_s = harness.timed(lambda: jitted.decisions(op, x))
        lowered, lower_s = harness.timed(lambda: jitted.lower(op, x))
    compiled, compile_s = harness.timed(lowered.compile)
    _, run_s = harness.timed(lambda: jax.block_until_ready(compiled(op, x)))
    return dict(
        trace_s=trace_s, lower_s=lower_s, compile_s=compile_s, first_run_s=run_s
    )


def run(names, rounds: int, scale: float) -> dict:
    stages(names[0], "Auto", scale)  # the calibration, where none is cached
    found: dict = {name: {v: [] for v in VARIANTS} for name in names}
    for r in range(rounds):
        for name in names:
            for variant in VARIANTS[:: -1 if r % 2 else 1]:
                found[name][variant].append(stages(name, variant, scale))
            print(f"round {r} {name}", flush=True)
    results: dict = {}
    for name, by_variant in found.items():
        row = {}
        for variant, trials in by_variant.items():
            entry = {s: statistics.median(t[s] for t in trials) for s in STAGES}
            entry["total_s"] = statistics.median(sum(t.values()) for t in trials)
            row[variant] = entry
        for entry in row.values():
            entry["over_lineax"] = entry["total_s"] / row["lineax"]["total_s"]
        results[name] = row
    return results


def summary(results: dict) -> str:
    headers = ["program", "variant", *(s.removesuffix("_s") for s in STAGES)]
    headers += ["total", "over lineax"]
    rows = [
        [name, variant, *(f"{entry[s]:.3f}" for s in STAGES)]
        + [f"{entry['total_s']:.3f}", f"{entry['over_lineax']:.2f}x"]
        for name, row in results.items()
        for variant, entry in row.items()
    ]
    return harness.table(headers, rows)


def _plot(results: dict):
    def draw(path):
        plt = harness.pyplot()
        names = list(results)
        fig, ax = plt.subplots(figsize=(11, 4))
        width = 0.8 / len(VARIANTS)
        for i, variant in enumerate(VARIANTS):
            bottom = np.zeros(len(names))
            for s, colour in zip(STAGES, ("C0", "C1", "C2", "C3")):
                values = np.array([results[n][variant][s] for n in names])
                x = np.arange(len(names)) + i * width
                label = s.removesuffix("_s") if i == 0 else None
                ax.bar(x, values, width, bottom=bottom, color=colour, label=label)
                bottom += values
        ax.set_xticks(np.arange(len(names)) + 0.4, names, rotation=30, ha="right")
        ax.set_ylabel("seconds (bars: " + ", ".join(VARIANTS) + ")")
        ax.set_title(f"first call by stage, {harness.jax_label()}")
        ax.legend(fontsize=8)
        harness.save(fig, path)

    return draw


def main(argv=None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--scale", type=float, default=None)
    parser.add_argument("--programs", type=harness.name_list(list(PROGRAMS)))
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    names = list(args.programs or PROGRAMS)
    env = harness.environment()
    harness.print_setup(env, dict(rounds=args.rounds, scale=args.scale, programs=names))
    results = run(names, args.rounds, args.scale)
    print(summary(results))
    payload = dict(
        environment=env,
        rounds=args.rounds,
        scale=args.scale,
        backend=jax.default_backend(),
        results=results,
    )
    harness.write_results(args.out, "realistic_stages", payload, _plot(results))


if __name__ == "__main__":
    main()
