"""Fits the cost model's constants on one half of `benchmarks.families`' cases and
scores them on the other, which is never used for fitting.

What is fitted
--------------

For a case and a cost model, each fixed policy's predicted cost is the sum, over
the decisions Auto made in that program (its observations, recorded by
`benchmarks.families`), of `decide`'s estimate for that policy (a policy a
decision does not allow costs infinity; `Roll` where a decision has no roll
estimate, one site, costs its `Lazy` estimate). The model's choice is the policy
of least predicted cost; its regret is the measured score of that policy over the
best measured one (plain lineax among the candidates), at compile + 1 run
(observations with `runs=1`) and compile + 100 runs. The fit searches, by
coordinate descent over multipliers of the constants `Auto` decided with (the
machine's calibration, which `families.json` records; `CostModel()` where it does
not), a factor of 4 either way in steps of 2, then of sqrt 2, for the constants
and the margins over `Lazy` (at least 1) minimising the mean log regret plus
the log of the worst on the fit half; the held-out half is scored once, for the
defaults and for the fitted model.

This scores a model's choices offline, on measured policies; `benchmarks.families`
measures Auto itself (its own analysis included).

How to run
----------

    python -m benchmarks.fit_cost_model          # reads results/families.json
    python -m benchmarks.fit_cost_model --margins-only  # the margins alone

Results: `benchmarks/results/cost_model_fit.json` (the fitted constants and the
regrets) and `.png`; with `--margins-only`, `cost_model_fit-margins.json`.
"""

import argparse
import dataclasses
import json
import math
from pathlib import Path
from statistics import median

import lineax_dispatch as lxd
from benchmarks import families_cases as fc, harness
from benchmarks.auto_report import AUTO_FOR, BASELINE, FIXED, score, SCORES


# The constants searched (the CPU's rates, and the compile-time constants).
FITTED = (
    "flops_per_second",
    "bytes_per_second",
    "cache_bytes_per_second",
    "compile_per_dot",
    "compile_per_op",
    "compile_per_site",
    "compile_per_batched_dot",
    "materialise_fixed",
    "outline_site",
    "outline_call",
    "matmul_site",
    "krylov_step",
    "roll_fixed",
    "roll_site",
    "roll_step",
    "departure_margin",
    "materialise_margin",
)
# A margin is a factor of at least 1 (`Auto` departs from `Lazy` only where the
# estimated gain exceeds it).
MARGINS = ("departure_margin", "materialise_margin")
COARSE, FINE = (0.25, 0.5, 2.0, 4.0), (2**-0.5, 2**0.5)
SWEEPS = 3


def base_model(data: dict) -> lxd.CostModel:
    """The constants `Auto` decided with in `data` (`families.json`'s
    `cost_model`: this machine's calibration), margins 1; `CostModel()` where the
    results do not record them."""
    recorded = data.get("cost_model")
    if recorded is None:
        return lxd.CostModel()
    return lxd.CostModel(**dict(recorded, departure_margin=1.0, materialise_margin=1.0))


def _model(multipliers: dict, base: lxd.CostModel | None = None) -> lxd.CostModel:
    base = lxd.CostModel() if base is None else base
    values = {name: getattr(base, name) * m for name, m in multipliers.items()}
    for name in MARGINS:
        values[name] = max(values.get(name, getattr(base, name)), 1.0)
    return dataclasses.replace(base, **values)


def _estimates(observation: dict, runs: int, model: lxd.CostModel) -> dict:
    o = lxd.Observation(**dict(observation, runs=float(runs)))
    decision = lxd.decide(o, model)
    out = {}
    for e in decision.estimates:
        out[e.strategy] = math.inf if e.seconds is None else e.seconds
    return out


def predicted_choice(row: dict, runs: int, model: lxd.CostModel) -> str:
    """The fixed policy of least predicted cost for the program of `row`."""
    observations = row["results"][AUTO_FOR[runs]]["observations"]
    totals = dict.fromkeys(FIXED, 0.0)
    for observation in observations:
        est = _estimates(observation, runs, model)
        lazy = est.get("Lazy", math.inf)
        for policy in FIXED:
            totals[policy] += est.get(policy, lazy if policy == "Roll" else math.inf)
    margins = model.margins()
    allowed = [
        p
        for p in FIXED
        if p in row["results"]
        and (p == "Lazy" or totals[p] * margins.get(p, 1.0) < totals["Lazy"])
    ]
    return min(allowed, key=totals.get)


def regret(row: dict, runs: int, choice: str) -> float:
    """The measured score of `choice` over the best measured policy."""
    totals = {
        v: score(row["results"][v], runs)
        for v in FIXED + (BASELINE,)
        if v in row["results"]  # Outline is not measured where it cannot run
    }
    return totals[choice] / min(totals.values())


def regrets(rows: list[dict], model: lxd.CostModel) -> dict:
    """Per score, the regret of the model's choice on each row."""
    return {
        runs: [regret(r, runs, predicted_choice(r, runs, model)) for r in rows]
        for runs in SCORES
    }


def objective(rows: list[dict], model: lxd.CostModel) -> float:
    """Mean log regret plus the log of the worst, over both scores."""
    total = 0.0
    for values in regrets(rows, model).values():
        logs = [math.log(v) for v in values]
        total += sum(logs) / len(logs) + max(logs)
    return total


def fit(
    rows: list[dict], base: lxd.CostModel, names: tuple = FITTED
) -> tuple[dict, float]:
    """Coordinate descent over the multipliers of `names` (`FITTED` by default)."""
    multipliers = dict.fromkeys(names, 1.0)
    best = objective(rows, _model(multipliers, base))
    for steps in (COARSE,) * SWEEPS + (FINE,):
        improved = False
        for name in names:
            for factor in steps:
                trial = dict(multipliers, **{name: multipliers[name] * factor})
                value = objective(rows, _model(trial, base))
                if value < best - 1e-9:
                    best, multipliers, improved = value, trial, True
        if not improved and steps is COARSE:
            continue
    return multipliers, best


def _summary(values: list[float]) -> dict:
    return dict(median=median(values), worst=max(values), cases=len(values))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=harness.results_dir())
    parser.add_argument(
        "--margins-only",
        action="store_true",
        help="fit the margins alone, the constants held as Auto decided with them "
        "(written as cost_model_fit-margins)",
    )
    args = parser.parse_args(argv)
    names = MARGINS if args.margins_only else FITTED
    data = json.loads((args.results / "families.json").read_text())
    fit_cases, held_cases = fc.split(fc.cases())
    by_label = {row["label"]: row for row in data["cases"]}
    fit_rows = [by_label[c.label] for c in fit_cases if c.label in by_label]
    held_rows = [by_label[c.label] for c in held_cases if c.label in by_label]
    base = base_model(data)
    multipliers, value = fit(fit_rows, base, names)
    models = dict(defaults=base, fitted=_model(multipliers, base))
    report: dict = {}
    for name, model in models.items():
        report[name] = {
            half: {
                str(runs): _summary(values)
                for runs, values in regrets(rows, model).items()
            }
            for half, rows in (("fit", fit_rows), ("held_out", held_rows))
            if rows  # a half the results do not hold is not scored
        }
    changed = {k: v for k, v in multipliers.items() if v != 1.0}
    fitted = models["fitted"]
    print("multipliers of the defaults:", {k: round(v, 3) for k, v in changed.items()})
    print("fitted constants:", {k: getattr(fitted, k) for k in changed})
    for name, halves in report.items():
        for half, by_runs in halves.items():
            for runs, s in by_runs.items():
                print(
                    f"{name:<9} {half:<9} runs={runs:<4} median {s['median']:.3f} "
                    f"worst {s['worst']:.3f} ({s['cases']} cases)"
                )
    payload = dict(
        environment=data["environment"],
        multipliers=multipliers,
        fitted={k: getattr(fitted, k) for k in names},
        objective=value,
        regrets=report,
    )

    def plot(path):
        plt = harness.pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        labels, medians, worsts = [], [], []
        for name, halves in report.items():
            for half, by_runs in halves.items():
                for runs, s in by_runs.items():
                    labels.append(f"{name}\n{half}\nruns={runs}")
                    medians.append(s["median"])
                    worsts.append(s["worst"])
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], medians, 0.4, label="median")
        ax.bar([x + 0.2 for x in xs], worsts, 0.4, label="worst")
        ax.axhline(1.05, color="grey", linestyle="--")
        ax.axhline(1.5, color="grey", linestyle=":")
        ax.set_xticks(list(xs), labels, fontsize=6)
        ax.set_ylabel("regret (chosen / best fixed)")
        ax.legend()
        harness.save(fig, path)

    name = "cost_model_fit-margins" if args.margins_only else "cost_model_fit"
    harness.write_results(args.results, name, payload, plot)


if __name__ == "__main__":
    main()
