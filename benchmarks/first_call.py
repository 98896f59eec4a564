"""`Auto`'s first call against plain lineax's on the program families, in enough
paired rounds to say whether it is slower by more than 5%.

The Auto issue asks that on no held-out program `lxd.jit` + `Auto`'s first call
(trace, lowering, compile and one run) be slower than `jax.jit` + plain lineax's
by more than 5%. `benchmarks.families` counts that from two rounds of every
variant, where one program's first call moves by a fifth or more between rounds
on a 2-core CPU: a count at 5% then says more about the noise than about
`Auto`. Here only four variants are measured, in more rounds: plain lineax,
`Lazy` (our operator and solver under `jax.jit`: the share of our solvers
without `lxd.jit`), `Auto1` (`lxd.Auto(runs=1)`: told the program runs once,
the objective a first call is) and `Auto` (`lxd.Auto()`, what a user gets:
it may spend compile that its 100 runs repay, such as CG's residual update in
a `lax.cond` from 4,096 unknowns), each a fresh program per round, in interleaved order (every other round reversed), each
timed as `benchmarks.families.measure` times it (its first call only:
no runs are timed). Per program: the ratio of
each variant's first call to lineax's in each round (paired: measured one after
the other), their median and quartiles. A program counts
as slower where the median ratio is above 1.05; as clearly slower where even
the lower quartile is. As in `benchmarks.families`, a program where lineax's
answer is not one in some round (`answer_ok`: it reported a failure and is off
`Lazy`'s answer) is shown but not counted: no time of a wrong answer is a bar.

How to run
----------

    python -m benchmarks.first_call                     # held-out half, 5 rounds
    python -m benchmarks.first_call --quick             # n <= 256, 3 rounds
    python -m benchmarks.first_call --half fit --rounds 7
    python -m benchmarks.first_call --families stencil,jacobian
    python -m benchmarks.first_call --merge A/first_call.json B/first_call.json \
        --out DIR                     # runs of separate families as one

Results: `<out>/first_call.json` and `.png`.
"""

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import families, families_cases as fc, harness
from benchmarks.families_scores import answer_ok, SLOWER_THAN_LINEAX


FULL = dict(max_n=4096, rounds=5)
QUICK = dict(max_n=256, rounds=3)
VARIANTS = ("lineax", "Lazy", "Auto1", "Auto")
COMPARED = ("Lazy", "Auto1", "Auto")


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """`(lower quartile, median, upper quartile)` of `values` (the median alone,
    three times, for fewer than two)."""
    if len(values) < 2:
        middle = statistics.median(values)
        return middle, middle, middle
    low, middle, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, middle, high


def run_case(case: fc.Case, rounds: int) -> dict:
    """`rounds` interleaved rounds of `VARIANTS` on `case`: each variant's first
    calls, and per compared variant its paired ratios to lineax's."""
    arrays = fc.family_arrays(case.family, case.n)
    firsts: dict = {v: [] for v in VARIANTS}
    choices: dict = {v: [] for v in VARIANTS}
    lineax_ok = []
    for round_ in range(rounds):
        outputs, timed = {}, {}
        for variant in VARIANTS[:: -1 if round_ % 2 else 1]:
            timed[variant], outputs[variant] = families.measure(
                variant, case, arrays, runs=False
            )
            firsts[variant].append(timed[variant]["total_s"])
            if "choice" in timed[variant]:
                choices[variant].append(timed[variant]["choice"]["strategy"])
        error = harness.relative_error(outputs["lineax"], outputs["Lazy"])
        lineax_ok.append(answer_ok(dict(timed["lineax"], rel_err_vs_lazy=error)))
    row = dict(label=case.label, family=case.family, n=case.n, first_s=firsts)
    row["choices"] = {v: "+".join(sorted(set(c))) for v, c in choices.items() if c}
    row["lineax_answer_ok"] = all(lineax_ok)
    for variant in COMPARED:
        ratios = [a / b for a, b in zip(firsts[variant], firsts["lineax"])]
        low, middle, high = quartiles(ratios)
        row[variant] = dict(
            ratios=ratios,
            quartiles=[low, middle, high],
            slower=row["lineax_answer_ok"] and middle > SLOWER_THAN_LINEAX,
            clearly_slower=row["lineax_answer_ok"] and low > SLOWER_THAN_LINEAX,
        )
    return row


def summary(rows: list[dict]) -> dict:
    """Per compared variant: the programs slower (median ratio) and clearly slower
    (lower quartile) than lineax's first call by more than 5%, and the median of
    the programs' median ratios; and the programs not counted (lineax's answer
    not one)."""
    out = {}
    for variant in COMPARED:
        out[variant] = dict(
            programs=len(rows),
            median_ratio=statistics.median(r[variant]["quartiles"][1] for r in rows),
            slower=[r["label"] for r in rows if r[variant]["slower"]],
            clearly_slower=[r["label"] for r in rows if r[variant]["clearly_slower"]],
            not_counted=[r["label"] for r in rows if not r["lineax_answer_ok"]],
        )
    return out


def format_rows(rows: list[dict], totals: dict) -> str:
    lines = [
        f"{'program':36s} {'lineax first':>12s}  "
        + "  ".join(f"{v + ' / lineax':>22s}" for v in COMPARED)
        + "  chose (Auto1, Auto)"
    ]
    for r in rows:
        cells = []
        for variant in COMPARED:
            low, middle, high = r[variant]["quartiles"]
            mark = (
                "!!"
                if r[variant]["clearly_slower"]
                else "! "
                if r[variant]["slower"]
                else "  "
            )
            cells.append(f"{middle:5.3f} ({low:5.3f}-{high:5.3f}){mark}")
        base = statistics.median(r["first_s"]["lineax"])
        wrong = "" if r["lineax_answer_ok"] else "  (lineax's answer not one)"
        lines.append(
            f"{r['label']:36s} {base:10.3f} s  "
            + "  ".join(f"{c:>22s}" for c in cells)
            + "  "
            + ", ".join(r["choices"].values())
            + wrong
        )
    for variant, s in totals.items():
        lines.append(
            f"{variant}: median of the programs' median ratios "
            f"{s['median_ratio']:.3f}; slower than lineax by > 5% (median): "
            f"{len(s['slower'])} of {s['programs']}; clearly (lower quartile): "
            f"{len(s['clearly_slower'])}; not counted (lineax's answer not one): "
            f"{len(s['not_counted'])}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for j, r in enumerate(rows):
        for k, (variant, colour) in enumerate(
            zip(COMPARED, ("tab:grey", "tab:blue", "tab:red"))
        ):
            ratios = r[variant]["ratios"]
            ax.scatter([j + 0.25 * k] * len(ratios), ratios, s=8, color=colour)
            ax.scatter(
                j + 0.25 * k,
                r[variant]["quartiles"][1],
                s=40,
                marker="_",
                color="black",
            )
    ax.axhline(SLOWER_THAN_LINEAX, color="grey", linestyle="--")
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["label"] for r in rows], rotation=80, fontsize=6)
    ax.set_ylabel("first call / lineax's (per round)")
    ax.set_title(
        f"First call over plain lineax: Lazy (grey), Auto1 (blue), Auto (red) "
        f"({harness.jax_label()})"
    )
    harness.save(fig, path)


def merge(paths: Sequence[Path], out: Path) -> None:
    """Writes the programs of several results files (one process per family, as on
    a machine whose calls are time-limited) as one run, summarised again."""
    loaded = [json.loads(p.read_text()) for p in paths]
    rows = [row for payload in loaded for row in payload["cases"]]
    totals = summary(rows)
    print(format_rows(rows, totals))
    payload = dict(loaded[0], cases=rows, summary=totals)
    payload["config"] = dict(loaded[0]["config"], merged=[str(p) for p in paths])
    payload["total_seconds"] = sum(p.get("total_seconds") or 0.0 for p in loaded)
    harness.write_results(out, "first_call", payload, lambda p: plot(rows, p))


def main(argv: Sequence[str] | None = None) -> None:
    parser = harness.parser(__doc__, FULL, QUICK)
    parser.add_argument("--max-n", dest="max_n", type=int, help="largest n")
    parser.add_argument("--rounds", type=int, help="paired rounds per program")
    parser.add_argument(
        "--half", choices=("all", "fit", "held_out"), default="held_out"
    )
    parser.add_argument("--families", type=harness.name_list(fc.FAMILIES))
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="write these results files as one run (in --out), measuring nothing",
    )
    args = parser.parse_args(argv)
    if args.merge:
        merge(args.merge, args.out)
        return
    harness.fill_defaults(args, FULL, QUICK)
    start = time.perf_counter()
    env = harness.environment(load_average=True)
    config = dict(max_n=args.max_n, rounds=args.rounds, half=args.half)
    harness.print_setup(env, config)
    rows = []
    for case in families.selected(args):
        rows.append(run_case(case, args.rounds))
        print(format_rows(rows[-1:], {}).splitlines()[-1], flush=True)
    totals = summary(rows)
    print(format_rows(rows, totals))
    seconds = time.perf_counter() - start
    print(f"total benchmark time: {seconds:.1f} s")
    payload = dict(
        environment=env,
        config=config,
        cases=rows,
        summary=totals,
        total_seconds=seconds,
    )
    harness.write_results(args.out, "first_call", payload, lambda p: plot(rows, p))


if __name__ == "__main__":
    main()
