"""Parity on whatever backend JAX sees: every operator kind x policy x solver of
lineax-dispatch in float32, each against plain lineax (`jax.jit`, an `lx` operator
and an `lx` solver) on the same problem and against a float64 reference computed
on the host with numpy; `lxd.batch_mv`, stacked call sites and the dense matrix of
an operator against a Python loop of `mv`.

The problem exposes low-precision matrix-matrix products: the normal map
`A = B^T B + 0.1 I`, `B` a chain of 8 dense `n x n` float32 layers (scaled so that
the spectrum of `A` is about `[0.1, 1.1]`). On a TPU at default precision a
float32 matrix-matrix product runs in bfloat16 passes while a matrix-vector
product stays float32, so a strategy that stacks `mv`s into a matmul can come out
two digits off while reporting success.

Each row has our relative error (to the float64 reference), the baseline's (plain
lineax's solve on the same problem; for the `mv` groups, a Python loop of lineax's
jitted `mv`), the reported result and a verdict:

- `ok`: our error within the bound, `factor x max(baseline error, FLOOR)`, the
  factor 10 (2 for the Auto policy, `lxd.AutoSolver` and the `mv` groups);
- `FAIL`: a reported success (or an `mv`, which reports none) beyond the bound;
- `not solved`: the solve reported something other than success (its result
  shown); `refused`: it raised (its message shown); `timed out`: no answer within
  `--case-timeout` seconds (the case's process is ended and the rest go on in a
  new one); `not run`: left when the `--budget` of seconds was spent.

    python -m benchmarks.parity --out /tmp/parity            # n=256, every case
    python -m benchmarks.parity --quick --out /tmp/parity    # n=64
    python -m benchmarks.parity --n 32 --kinds function --policies lazy,roll \\
        --solvers cg,lu --groups solve,batch_mv --out /tmp/parity

The exit status is 1 where any row is `FAIL`. The cases, the problem and the
verdict are in `parity_cases.py`, running them (a worker process, timeouts) in
`parity_run.py`; this file has the report and the command line.
`benchmarks/accelerator.py` runs this, then the headline benchmarks;
docs/accelerators.md says how to read it.
Results: `<out>/parity.json` and `parity.png` (where matplotlib is installed).
"""

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.parity_cases import (  # re-exported: `parity.cases`, `parity.Case`...
    ATOL as ATOL,
    AUTO_FACTOR as AUTO_FACTOR,
    BATCH as BATCH,
    Case as Case,
    CASE_TIMEOUT_S as CASE_TIMEOUT_S,
    cases as cases,
    FACTOR as FACTOR,
    FLOOR as FLOOR,
    FULL as FULL,
    GROUPS as GROUPS,
    judge as judge,
    KINDS as KINDS,
    LAYERS as LAYERS,
    MAX_STEPS as MAX_STEPS,
    MV_FACTOR as MV_FACTOR,
    POLICIES as POLICIES,
    QUICK as QUICK,
    RTOL as RTOL,
    SHIFT as SHIFT,
    SITES as SITES,
    SOLVERS as SOLVERS,
    VERDICTS as VERDICTS,
)
from benchmarks.parity_run import (
    case_row as case_row,
    run_in_process as run_in_process,
    Runner as Runner,
    supervise as supervise,
    worker as worker,
)


def summary(rows: Sequence[dict]) -> dict:
    """Counts of each verdict, and the ids of the rows not `ok`."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    return dict(
        counts=counts,
        not_ok={
            r["id"]: r.get("message", r["verdict"])
            for r in rows
            if r["verdict"] != "ok"
        },
    )


def table(rows: Sequence[dict]) -> str:
    """Per group and policy: rows, the worst ratio of our error to the baseline's,
    and the verdicts."""
    from benchmarks import output

    cells = {}
    for r in rows:
        key = (r["group"], r["policy"])
        c = cells.setdefault(key, dict(rows=0, worst=0.0, verdicts={}))
        c["rows"] += 1
        if r.get("error") is not None and r.get("baseline_error") is not None:
            ratio = r["error"] / max(r["baseline_error"], FLOOR)
            c["worst"] = max(c["worst"], ratio)
        c["verdicts"][r["verdict"]] = c["verdicts"].get(r["verdict"], 0) + 1
    body = [
        (
            group,
            policy,
            c["rows"],
            f"{c['worst']:.2f}",
            ", ".join(f"{v} {k}" for k, v in c["verdicts"].items()),
        )
        for (group, policy), c in cells.items()
    ]
    headers = ("group", "policy", "rows", "worst err / max(baseline, 1e-6)", "verdicts")
    return output.table(headers, body)


def plot(rows: Sequence[dict], title: str, path: Path) -> None:
    """Our error against the baseline's, a point per row coloured by verdict."""
    from benchmarks import output

    plt = output.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5))
    colours = {"ok": "tab:green", "FAIL": "tab:red", "not solved": "tab:orange"}
    for verdict, colour in colours.items():
        pts = [
            (max(r["baseline_error"], 1e-9), max(r["error"], 1e-9))
            for r in rows
            if r["verdict"] == verdict and r.get("error") is not None
        ]
        if pts:
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, s=14, c=colour, label=f"{verdict} ({len(pts)})")
    lo, hi = 1e-9, 1.0
    for factor, style in ((1, "-"), (FACTOR, "--"), (MV_FACTOR, ":")):
        ax.plot([lo, hi], [factor * lo, factor * hi], "k" + style, lw=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("baseline's relative error (plain lineax / loop of mv)")
    ax.set_ylabel("our relative error (float64 reference)")
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    output.save(fig, path)


def write(out: Path, rows: Sequence[dict], config: dict, environment: dict,
          seconds: float) -> dict:  # fmt: skip
    """`<out>/parity.json` (and `parity.png`) through `benchmarks/output.py`.

    **Arguments:**

    - `out`: the folder.
    - `rows`: the judged rows.
    - `config`: the settings of the run.
    - `environment`: `harness.environment()` where the cases ran.
    - `seconds`: the run's wall time.

    **Returns:**

    The payload written.
    """
    from benchmarks import output

    payload = dict(
        environment=environment,
        config=config,
        summary=summary(rows),
        rows=list(rows),
        total_seconds=seconds,
    )
    title = (f"parity on {environment.get('jax_backend', '?')}, n={config['n']} "
             f"(jax {environment.get('jax', '?')})")  # fmt: skip
    output.write_results(out, "parity", payload, lambda p: plot(rows, title, p))
    return payload


# ------------------------------------------------------------------ command line


def _names(choices: Sequence[str]) -> Callable:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(v.strip().lower() for v in text.split(",") if v.strip())
        if bad := [v for v in names if v not in choices]:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {choices}")
        return names

    return parse


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.parity", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=None, help="results folder "
                        "(default benchmarks/results/<jax.default_backend()>)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help=f"n={QUICK['n']}")
    parser.add_argument("--n", type=int, default=None, help=f"size ({FULL['n']})")
    for name, choices in (("kinds", KINDS), ("policies", POLICIES),
                          ("solvers", SOLVERS), ("groups", GROUPS)):  # fmt: skip
        parser.add_argument(
            f"--{name}",
            type=_names(choices),
            default=choices,
            help=f"comma-separated among {','.join(choices)} (default all)",
        )
    parser.add_argument("--case-timeout", type=float, default=CASE_TIMEOUT_S,
                        help="seconds for one case (default %(default)s)")  # fmt: skip
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for all the cases; those left are "
                        "recorded as `not run` (default: no limit)")  # fmt: skip
    parser.add_argument("--in-process", action="store_true",
                        help="run the cases in this process (no timeout)")  # fmt: skip
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--progress", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cases", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.n is None:
        args.n = (QUICK if args.quick else FULL)["n"]
    return args


def main(argv=None) -> int:
    """Runs the parity zoo; returns 1 where any row is `FAIL`, else 0."""
    args = parse_args(argv)
    if args.worker:
        worker(args.n, args.cases.split(","), args.progress)
        return 0
    start = time.perf_counter()
    from benchmarks import harness

    todo = cases(args.kinds, args.policies, args.solvers, args.groups)
    config = dict(
        n=args.n, layers=LAYERS, shift=SHIFT, rtol=RTOL, atol=ATOL,
        max_steps=MAX_STEPS, factor=FACTOR, auto_factor=AUTO_FACTOR,
        mv_factor=MV_FACTOR, floor=FLOOR, batch=BATCH, sites=SITES,
        case_timeout_s=args.case_timeout, budget_s=args.budget, cases=len(todo),
        in_process=args.in_process,
    )  # fmt: skip
    print(f"parity: {len(todo)} cases, n={args.n}", flush=True)
    if args.in_process:
        environment = harness.environment()
        rows = run_in_process(args.n, todo)
    else:
        rows, environment = supervise(
            args.n, todo, args.case_timeout, budget=args.budget
        )
    backend = environment.get("jax_backend", "unknown")
    print(f"\nparity on {backend} ({environment.get('jax_devices')}), n={args.n}")
    print(table(rows))
    out = args.out or harness.RESULTS_DIR / backend
    payload = write(out, rows, config, environment, time.perf_counter() - start)
    counts = payload["summary"]["counts"]
    print("parity: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
