"""Whether `lxd.jit` rolls an `Auto` operator's repeated solves, replayed on a
recorded `benchmarks.families` run: the decision under the constants `Auto`
decided with there (`families.json`'s `cost_model`: that machine's
calibration), and under the same constants with the current fit for that
machine's backend (`_calibration._fitted_on_backend`: on a TPU, a repeated
solve's copy as fitted on the TPU's fit half), each scored by the variant it
stands for, measured in that run: the fixed `Roll` (its repeated solves rolled)
where it rolls, else `Lazy`.

Nothing is timed here: each program of two or more solves is built again and
traced (`lxd.jit(f).decisions`), and `rolling_pays`' answer read. A score is
compile + 1 run (`Auto(runs=1)`) or compile + 100 runs (`Auto()`), over the best
measured fixed policy or plain lineax, as `benchmarks.families` scores it. Use
it on a half the fit did not see (`--results
benchmarks/results/tpu/families-held-out`, for the TPU's held-out half).

Results: `solve_roll_replay.json` and `.png` in the results folder given.

Run: `python -m benchmarks.solve_roll_replay [--results DIR] [--backend NAME]`.
"""

import argparse
import json
from pathlib import Path
from statistics import median
from unittest import mock

import jax.numpy as jnp

import lineax_dispatch as lxd
from benchmarks import families_cases as fc, harness
from benchmarks.auto_report import AUTO_FOR, BASELINE, FIXED, score
from lineax_dispatch.policies.decision import _calibration
from lineax_dispatch.program import _decide


def rolls(row: dict, runs: int, model: lxd.CostModel) -> bool:
    """Whether `lxd.jit` rolls the repeated solves of `row`'s program under
    `Auto(runs=runs, cost_model=model)`."""
    answers: list[bool] = []
    real = _decide.rolling_pays

    def recording(callee, k):
        answers.append(real(callee, k))
        return answers[-1]

    case = fc.Case(row["family"], row["n"], row["solves"], row["mvs"])
    arrays = fc.family_arrays(case.family, case.n)
    policy = lxd.Auto(runs=runs, cost_model=model, race=False)
    op, solver = fc.make_operator(case.family, arrays, case.n, policy)
    f, params, _ = harness.split_program(op, fc.body(case, solver))
    with mock.patch.object(_decide, "rolling_pays", recording):
        lxd.jit(f).decisions(params, jnp.ones((case.n,), jnp.float32))
    return any(answers)


def models(data: dict, backend: str) -> dict[str, lxd.CostModel]:
    """The recorded constants, and those with the current fit for `backend`."""
    recorded = lxd.CostModel(**data["cost_model"])
    ratio = recorded.compile_per_dot / lxd.CostModel().compile_per_dot
    fitted = _calibration._fitted_on_backend(recorded, backend, ratio)
    return dict(recorded=recorded, current=fitted)


def replay(data: dict, compared: dict[str, lxd.CostModel]) -> list[dict]:
    """Per program of two or more solves and per score: the decision under each
    of the `compared` models and the measured score of the variant it stands
    for, over the best."""
    rows = []
    for row in data["cases"]:
        if row["solves"] < 2:
            continue
        results = row["results"]
        for runs in AUTO_FOR:
            totals = {
                v: score(results[v], runs) for v in FIXED + (BASELINE,) if v in results
            }
            best = min(totals.values())
            entry: dict = dict(label=row["label"], runs=runs)
            for name, model in compared.items():
                rolled = rolls(row, runs, model)
                entry[name] = dict(
                    rolled=rolled,
                    over_best=totals["Roll" if rolled else "Lazy"] / best,
                )
            rows.append(entry)
    return rows


def summary(rows: list[dict]) -> dict:
    """Per score and model: the median and worst over the programs, and the
    decisions the current fit changed."""
    out: dict = {}
    for runs in AUTO_FOR:
        mine = [r for r in rows if r["runs"] == runs]
        out[str(runs)] = {
            name: dict(
                median=median(r[name]["over_best"] for r in mine),
                worst=max(r[name]["over_best"] for r in mine),
            )
            for name in ("recorded", "current")
        }
        out[str(runs)]["changed"] = [
            r["label"]
            for r in mine
            if r["recorded"]["rolled"] != r["current"]["rolled"]
        ]
    return out


def plot(rows: list[dict], path: Path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, row in enumerate(rows):
        for name, marker in (("recorded", "o"), ("current", "x")):
            ax.scatter(i, row[name]["over_best"], marker=marker, color="k", s=18)
    ax.set_xticks(range(len(rows)), [f"{r['label']} ({r['runs']})" for r in rows])
    ax.tick_params(axis="x", labelrotation=90, labelsize=5)
    ax.set_ylabel("measured variant / best (o recorded, x current)")
    ax.set_title("Repeated solves rolled or not, replayed")
    harness.save(fig, path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=harness.results_dir())
    parser.add_argument(
        "--backend",
        default=None,
        help="the backend the run was measured on (default: its environment's)",
    )
    args = parser.parse_args(argv)
    data = json.loads((args.results / "families.json").read_text())
    backend = args.backend or data["environment"]["jax_backend"]
    compared = models(data, backend)
    rows = replay(data, compared)
    totals = summary(rows)
    for row in rows:
        print(
            f"{row['label']:<38} runs={row['runs']:<4} "
            + "  ".join(
                f"{name}: {'rolled' if row[name]['rolled'] else 'inline'} "
                f"{row[name]['over_best']:.2f}"
                for name in ("recorded", "current")
            )
        )
    for runs, s in totals.items():
        print(
            f"runs={runs}: recorded {s['recorded']['median']:.3f} / "
            f"{s['recorded']['worst']:.3f}, current {s['current']['median']:.3f} / "
            f"{s['current']['worst']:.3f}; changed: {', '.join(s['changed']) or 'none'}"
        )
    payload = dict(
        environment=harness.environment(),
        replayed=dict(results=str(args.results), backend=backend),
        solve_copy={name: m.solve_copy for name, m in compared.items()},
        cases=rows,
        summary=totals,
    )
    harness.write_results(
        args.results, "solve_roll_replay", payload, lambda p: plot(rows, p)
    )


if __name__ == "__main__":
    main()
