"""Realistic programs as users write them (Python-unrolled loops of `mv`s and
solves), `lxd.jit` + `Auto` against `jax.jit` + plain lineax, on whatever backend
JAX sees: the first call (trace + compile + run, a fresh program) and the steady
run, with `Lazy`, `Roll` and `Materialise` forced under `lxd.jit` beside them.

Programs: `benchmarks/realistic_cases.py` (eight, from RK4 of a stencil to
sums of independent `mv`s).

How to run
----------

    python -m benchmarks.realistic             # every program, 2 rounds
    python -m benchmarks.realistic --quick     # smaller sizes, 1 round
    python -m benchmarks.realistic --half held_out

Results: `<out>/realistic.json` and `.png` (`--out`, default
`benchmarks/results/<jax version>`).
"""

import statistics
import time

import equinox as eqx
import jax
import numpy as np

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.realistic_cases import fresh_program, HALF, PROGRAMS


FULL = dict(rounds=2, scale=1.0)
QUICK = dict(rounds=1, scale=0.25)
# "Auto, no race": `Auto(race=False)`, measured where `Auto` races (see
# `lxd.Auto.races`): the decisions without the race.
NO_RACE = "Auto, no race"
VARIANTS = ("lineax", "Auto", NO_RACE, "Lazy", "Roll", "Materialise")
# Runs of a compiled program, as `Auto()` weighs compile against run time.
RUNS = 100
POLICY = {
    "Auto": lxd.Auto,
    NO_RACE: lambda: lxd.Auto(race=False),
    "Lazy": lxd.Lazy,
    "Roll": lxd.Roll,
    "Materialise": lxd.Materialise,
}


def measured_variants() -> tuple[str, ...]:
    """The variants measured here: `NO_RACE` only where `Auto` races."""
    return tuple(v for v in VARIANTS if v != NO_RACE or lxd.Auto().races())


def measure(name: str, variant: str, scale: float, runs: int = 10) -> dict:
    """One fresh program: the first call (trace, compile, run) and the median of
    `runs` further calls, and its output."""
    policy = None if variant == "lineax" else POLICY[variant]()
    body, op, x = fresh_program(name, policy, scale)
    jitted = eqx.filter_jit(body) if policy is None else lxd.jit(body)
    harness.fresh_heap()
    start = time.perf_counter()
    out = jax.block_until_ready(jitted(op, x))
    first = time.perf_counter() - start
    settled = harness.settle()  # a race's losing compile (see `harness.settle`)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(jitted(op, x))
        times.append(time.perf_counter() - start)
    record = dict(first_call_s=first, run_s=statistics.median(times))
    if settled > 1e-3:
        record["loser_compile_after_s"] = settled
    if variant in ("Auto", NO_RACE):
        # What was compiled: the decisions, each raced one with its race's outcome.
        record["kept"] = [
            dict(strategy=d.strategy, reason=d.reasons[-1])
            for d in jitted.decisions(op, x).values()
        ]
        report = lxd.explain(body, op, x)
        record["explain"] = str(report)
        record["decisions"] = [
            dict(
                strategy=row.decision.strategy,
                estimates={e.strategy: e.seconds for e in row.decision.estimates},
            )
            for row in report.rows
        ]
    return record | dict(out=np.asarray(out, np.float64))


def run(names, rounds: int, scale: float) -> dict:
    variants = measured_variants()
    found: dict = {name: {v: [] for v in variants} for name in names}
    for r in range(rounds):
        for name in names:
            # Every other round in reverse order: no variant always runs first.
            for variant in variants[:: -1 if r % 2 else 1]:
                try:
                    found[name][variant].append(measure(name, variant, scale))
                except Exception as error:  # noqa: BLE001 - recorded, run goes on
                    found[name][variant].append(dict(error=repr(error)[:500]))
                print(f"round {r} {name} {variant}", flush=True)
    results = {}
    for name in names:
        row: dict = {"half": HALF[name]}
        reference = None
        for variant in variants:
            ok = [m for m in found[name][variant] if "error" not in m]
            if not ok:
                row[variant] = dict(error=found[name][variant][0]["error"])
                continue
            entry = dict(
                first_call_s=min(m["first_call_s"] for m in ok),
                run_s=min(m["run_s"] for m in ok),
            )
            if variant == "lineax":
                reference = ok[0]["out"]
            elif reference is not None:
                entry["error_vs_lineax"] = harness.relative_error(
                    ok[0]["out"], reference
                )
            if "explain" in ok[0]:
                entry["explain"] = ok[0]["explain"]
                entry["decisions"] = ok[0]["decisions"]
                entry["kept"] = [m["kept"] for m in ok]
            row[variant] = entry
        base = row.get("lineax", {})
        for variant in variants[1:]:
            entry = row[variant]
            if "first_call_s" in entry and "first_call_s" in base:
                entry["first_call_speedup"] = (
                    base["first_call_s"] / entry["first_call_s"]
                )
                entry["run_ratio"] = entry["run_s"] / base["run_s"]
        results[name] = row
    return results


def _total(entry: dict) -> float:
    """Compile + `RUNS` runs, as `Auto` weighs them: the first call (compile and
    one run) and `RUNS - 1` steady runs."""
    return entry["first_call_s"] + (RUNS - 1) * entry["run_s"]


def fit_margins(results: dict, half: str = "fit") -> dict:
    """Per strategy, the largest factor by which `Auto`'s estimated gain over
    `Lazy` (its first decision's estimates) exceeded the measured gain (compile +
    `RUNS` runs, the forced policies under `lxd.jit`) on the programs of `half`:
    the margins of `CostModel` (at least 1)."""
    found: dict = {"Roll": [1.0], "Materialise": [1.0]}
    for row in results.values():
        if row["half"] != half or not row["Auto"].get("decisions"):
            continue
        estimates = row["Auto"]["decisions"][0]["estimates"]
        lazy = estimates.get("Lazy")
        for strategy, ratios in found.items():
            estimate, measured = estimates.get(strategy), row[strategy]
            if not lazy or not estimate or "first_call_s" not in measured:
                continue
            predicted_gain = lazy / estimate
            measured_gain = _total(row["Lazy"]) / _total(measured)
            ratios.append(predicted_gain / measured_gain)
    return dict(
        departure_margin=max(found["Roll"]),
        materialise_margin=max(found["Materialise"]),
    )


def replay(results: dict, margins: dict, half: str = "held_out") -> dict:
    """What `Auto` with `margins` picks on each program of `half` from its recorded
    estimates, and that strategy's measured first call and steady run against
    lineax's."""
    margin = dict(
        Roll=margins["departure_margin"], Materialise=margins["materialise_margin"]
    )
    out = {}
    for name, row in results.items():
        if row["half"] != half or not row["Auto"].get("decisions"):
            continue
        estimates = row["Auto"]["decisions"][0]["estimates"]
        lazy = estimates.get("Lazy")
        candidates = [
            (seconds, strategy)
            for strategy, seconds in estimates.items()
            if strategy in margin
            and seconds is not None
            and lazy is not None
            and seconds * margin[strategy] < lazy
        ]
        pick = min(candidates)[1] if candidates else "Lazy"
        entry = row[pick]
        if "first_call_s" in entry:
            out[name] = dict(
                strategy=pick,
                first_call_speedup=entry["first_call_speedup"],
                run_ratio=entry["run_ratio"],
            )
    return out


def summary(results: dict) -> str:
    rows = []
    variants = [v for v in VARIANTS if all(v in row for row in results.values())]
    for name, row in results.items():
        cells = [f"{name} ({row['half']})"]
        for variant in variants:
            entry = row[variant]
            if "error" in entry:
                cells.append("error")
            elif variant == "lineax":
                cells.append(
                    f"{entry['first_call_s']:.2f}s/{entry['run_s'] * 1e3:.2f}ms"
                )
            else:
                cells.append(
                    f"{entry['first_call_speedup']:.2f}x/{entry['run_ratio']:.2f}x"
                )
        rows.append(cells)
    headers = [
        "program",
        "lineax first/run",
        *(f"{v} speedup/run" for v in variants[1:]),
    ]
    return harness.table(headers, rows)


def _plot(results: dict):
    def draw(path):
        plt = harness.pyplot()
        names = list(results)
        fig, ax = plt.subplots(figsize=(10, 4))
        variants = [v for v in VARIANTS if all(v in row for row in results.values())]
        width = 0.8 / (len(variants) - 1)
        for i, variant in enumerate(variants[1:]):
            values = [
                results[name][variant].get("first_call_speedup", 0.0) for name in names
            ]
            ax.bar(np.arange(len(names)) + i * width, values, width, label=variant)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(names)) + 0.4, names, rotation=30, ha="right")
        ax.set_ylabel("first call: lineax time / ours")
        ax.set_title(f"realistic programs, {harness.jax_label()}")
        ax.legend(fontsize=8)
        harness.save(fig, path)

    return draw


def main(argv=None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--scale", type=float, default=None)
    parser.add_argument("--half", choices=("fit", "held_out", "both"), default="both")
    parser.add_argument("--programs", type=harness.name_list(list(PROGRAMS)))
    args = parser.parse_args(argv)
    harness.fill_defaults(args, FULL, QUICK)
    names = args.programs or [n for n in PROGRAMS if args.half in ("both", HALF[n])]
    env = harness.environment()
    harness.print_setup(env, dict(rounds=args.rounds, scale=args.scale, programs=names))
    results = run(names, args.rounds, args.scale)
    print(summary(results))
    margins = fit_margins(results)
    replayed = replay(results, margins)
    print(f"margins from the fit half: {margins}")
    print(f"held-out half replayed with them: {replayed}")
    payload = dict(
        environment=env,
        rounds=args.rounds,
        scale=args.scale,
        backend=jax.default_backend(),
        results=results,
        fitted_margins=margins,
        held_out_replayed=replayed,
    )
    harness.write_results(args.out, "realistic", payload, _plot(results))


if __name__ == "__main__":
    main()
