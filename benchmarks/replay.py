"""Auto's decisions under the current cost model, replayed on a recorded run of
`python -m benchmarks.auto`: what a change to `CostModel` or `decide` does to the
grid, in seconds instead of half an hour.

What is computed
----------------

For every cell of the recorded grid (`--grid`, by default
`benchmarks/results/auto.json`) the same program is built again (`benchmarks.auto`'s
`make_program`, the same arrays) and only traced: `lxd.jit(f).decisions(...)` gives
the strategy `Auto(runs=1)` and `Auto()` pick now. Where that strategy is one of the
grid's fixed variants (`Lazy`, `Outline`, `Materialise`, `Roll`) the cell is
*replayable*: its predicted score is that variant's measured score (compile + runs x
run), over the best measured fixed variant or plain lineax (plain lineax measured in
the same recorded process). Solves repeated at k >= 2 sites are decided together
and rolled by `lxd.jit`, which no fixed variant measures: those cells report only
whether the decision changed. Nothing is timed here; `Auto`'s own trace (a few
milliseconds) is not in the predicted score.

Results: `benchmarks/results/replay.json` and `.png` (predicted against recorded
Auto / best, per replayable cell).

Run: `python -m benchmarks.replay [--grid PATH] [--out DIR]`.
"""

import argparse
import json
from pathlib import Path
from statistics import median

import jax.numpy as jnp

import lineax_dispatch as lxd
from benchmarks import auto, harness
from benchmarks.auto_report import FIXED, label, score


RESULTS = Path(__file__).parent / "results"
VARIANTS = {1: "Auto1", 100: "Auto"}


def decided(data, case: dict, variant: str) -> str:
    """The strategy `variant` picks now for the program of `case`."""
    f, params, _ = auto.make_program(variant, data, case["workload"], case["k"])
    x = jnp.ones((case["n"],), jnp.float32)
    decisions = lxd.jit(f).decisions(params, x).values()
    return "+".join(sorted({d.strategy for d in decisions})) or "(none)"


def replay_cell(data, case: dict) -> dict:
    """One cell: per score, the recorded and the present choice, and the predicted
    and the recorded Auto / best."""
    results = case["results"]
    measured = {v: t for v, t in results.items() if v in FIXED or v == auto.BASELINE}
    row = dict(cell=label(case), scores={})
    for runs, variant in VARIANTS.items():
        now = decided(data, case, variant)
        best = min(score(t, runs) for t in measured.values())
        got = dict(
            recorded=results[variant]["choice"]["strategy"],
            now=now,
            recorded_over_best=score(results[variant], runs) / best,
        )
        replayable = now in measured and (case["workload"] == "mv" or case["k"] == 1)
        if replayable:
            got["predicted_over_best"] = score(measured[now], runs) / best
        row["scores"][str(runs)] = got
    return row


def summarise(rows: list[dict]) -> dict:
    """Per score: decisions changed, and the predicted median and worst over the
    replayable cells."""
    out = {}
    for runs in VARIANTS:
        cells = [r["scores"][str(runs)] | dict(cell=r["cell"]) for r in rows]
        changed = [c["cell"] for c in cells if c["now"] != c["recorded"]]
        ratios = [c for c in cells if "predicted_over_best" in c]
        worst = max(ratios, key=lambda c: c["predicted_over_best"], default=None)
        out[str(runs)] = dict(
            changed=changed,
            replayable=len(ratios),
            predicted_median=median(c["predicted_over_best"] for c in ratios),
            predicted_worst=worst and worst["predicted_over_best"],
            predicted_worst_cell=worst and worst["cell"],
        )
    return out


def plot(rows: list[dict], path) -> None:
    """Predicted against recorded Auto / best, per replayable cell and score."""
    plt = harness.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for ax, runs in zip(axes, VARIANTS):
        cells = [r for r in rows if "predicted_over_best" in r["scores"][str(runs)]]
        got = [r["scores"][str(runs)] for r in cells]
        xs = range(len(cells))
        ax.plot(xs, [g["recorded_over_best"] for g in got], "o", label="recorded")
        ax.plot(xs, [g["predicted_over_best"] for g in got], "x", label="replayed")
        ax.axhline(1.5, color="grey", lw=0.8, ls="--")
        ax.set_xticks(list(xs), [r["cell"] for r in cells], rotation=90, fontsize=6)
        ax.set_title(f"runs={runs}")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("Auto / best")
    axes[0].legend(fontsize=8)
    harness.save(fig, path)


def main(argv=None):
    """Replay every cell of the grid, print the changes, write `replay.json`/`.png`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=Path, default=RESULTS / "auto.json")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    grid = json.loads(args.grid.read_text())
    layers = grid["config"]["layers"]
    data, rows = {}, []
    for case in grid["cases"]:
        key = (case["kind"], case["n"])
        if key not in data:
            data[key] = auto.make_data(case["kind"], case["n"], layers)
        row = replay_cell(data[key], case)
        rows.append(row)
        for runs, got in row["scores"].items():
            predicted = got.get("predicted_over_best")
            note = "" if predicted is None else f"  predicted {predicted:.2f}x"
            flag = "  CHANGED" if got["now"] != got["recorded"] else ""
            print(f"  {row['cell']:<30} runs={runs:<4} {got['recorded']:>12} -> "
                  f"{got['now']:<12} recorded {got['recorded_over_best']:.2f}x"
                  f"{note}{flag}", flush=True)  # fmt: skip
    summary = summarise(rows)
    print("summary:", json.dumps(summary, indent=1))
    env = harness.environment()
    payload = dict(
        environment=env, grid=str(args.grid), cost_model=repr(lxd.CostModel()),
        rows=rows, summary=summary,
    )  # fmt: skip
    harness.write_results(args.out, "replay", payload, lambda p: plot(rows, p))


if __name__ == "__main__":
    main()
