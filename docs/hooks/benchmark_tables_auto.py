"""The tables of the Benchmarks pages for how `Auto` chooses, on program families,
on realistic programs and on an accelerator (see `benchmark_tables.py`): each
results file's data as Markdown tables, in `TABLES` by the results file's name."""

import statistics

from benchmark_tables import _table


FAMILIES_WORST_SHOWN = 4  # per score, the cells of `families` furthest from the best


def _x(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}x"


def _has_unraced(data: dict) -> bool:
    """Whether a `families` file measured `Auto(race=False)` (`--unraced`)."""
    return all("unraced_over_best" in c["scores"]["1"] for c in data["cases"])


def regrets(data: dict, runs: str) -> dict[str, list[float]]:
    """Per case of a `families` file, each score over the best measured one
    (plain lineax among them, whose answer is one: the file's `best`):
    `Auto`'s, `Auto(race=False)`'s where measured (`--unraced`), always `Lazy`'s,
    the best of ours (whose answer is one)."""
    out: dict[str, list[float]] = {"Auto": []}
    unraced = _has_unraced(data)
    if unraced:
        out["Auto(race=False)"] = []
    out.update({"always Lazy": [], "best of our policies": []})
    for case in data["cases"]:
        score = case["scores"][runs]
        totals = {k: v for k, v in score["totals"].items() if not k.startswith("Auto")}
        best = totals[score["best"]]
        wrong = set(score.get("not_answers", ()))
        out["Auto"].append(score["auto_over_best"])
        if unraced:
            out["Auto(race=False)"].append(score["unraced_over_best"])
        out["always Lazy"].append(totals["Lazy"] / best)
        ours = [v for k, v in totals.items() if k != "lineax" and k not in wrong]
        out["best of our policies"].append(min(ours) / best)
    return out


def _families(data: dict) -> str:
    halves = sorted({c.get("half", data["config"]["half"]) for c in data["cases"]})
    rows = []
    columns: tuple = ()
    for runs in ("1", "100"):
        r = regrets(data, runs)
        columns = tuple(r)
        rows.append(
            (
                f"compile + {runs} x run",
                len(r["Auto"]),
                *(f"{statistics.median(v):.3f} / {max(v):.3f}" for v in r.values()),
            )
        )
    names = {"always Lazy": "always `Lazy`", "best of our policies": "best of ours"}
    summary = _table(
        (
            "score",
            "cases",
            "Auto: median / worst",
            *(names.get(c, c) for c in columns[1:]),
        ),
        rows,
    )
    worst = _table(
        ("score", "case", "best", "Auto chose", "Auto / best"),
        [
            (
                f"{runs} run(s)",
                case["label"],
                case["scores"][runs]["best"],
                case["scores"][runs]["auto_choice"],
                f"{case['scores'][runs]['auto_over_best']:.3f}",
            )
            for runs in ("1", "100")
            for case in sorted(
                data["cases"], key=lambda c: -c["scores"][runs]["auto_over_best"]
            )[:FAMILIES_WORST_SHOWN]
        ],
    )
    return (
        f"Each policy's score over the best measured one (plain lineax among "
        f"them), half: {', '.join(halves)}:\n\n{summary}\n\nThe cells where Auto "
        f"is furthest from the best:\n\n{worst}\n\nEvery case:\n\n"
        f"{_family_cases(data)}"
    )


def _family_cases(data: dict) -> str:
    """One row per case of a `families` file: at each score, the best measured
    policy, what Auto chose and Auto over the best (and `Auto(race=False)` over
    the best, where measured)."""
    unraced = _has_unraced(data)
    staged = any("stages" in case["results"].get("Auto1", {}) for case in data["cases"])
    rows = []
    for case in data["cases"]:
        cells = []
        for runs in ("1", "100"):
            score = case["scores"][runs]
            cells += [score["best"], score["auto_choice"]]
            cells.append(f"{score['auto_over_best']:.3f}")
            if unraced:
                cells.append(f"{score['unraced_over_best']:.3f}")
        if staged:
            cells.append(_decision_cost(case["results"].get("Auto1", {})))
        rows.append((case["label"], *cells))
    columns = ["best", "Auto chose", "Auto / best"]
    if unraced:
        columns.append("Auto(race=False) / best")
    header = [f"{c} ({runs})" for runs in ("1 run", "100 runs") for c in columns]
    if staged:
        header.append("Auto's analysis + rewrite (1 run): s, share of first call")
    return _table(("case", *header), rows)


def _decision_cost(result: dict) -> str:
    """The seconds of a variant's analysis and rewrite (`lxd.jit`'s `decide` and
    `rewrite` stages) and their share of its first call."""
    stages = result.get("stages")
    if stages is None:
        return "-"
    seconds = stages["decide"] + stages["rewrite"]
    return f"{seconds:.4f}, {seconds / result['total_s']:.1%}"


def _replay(data: dict) -> str:
    return _table(
        ("score", "cells replayable", "choices changed", "predicted median / worst"),
        [
            (
                f"compile + {runs} x run",
                s["replayable"],
                len(s["changed"]),
                f"{_x(s['predicted_median'])} / {_x(s['predicted_worst'])} "
                f"({s['predicted_worst_cell']})",
            )
            for runs, s in data["summary"].items()
        ],
    )


def _cost_model_fit(data: dict) -> str:
    rows = [
        (
            constants,
            half,
            f"compile + {runs} x run",
            f"{r['median']:.3f} / {r['worst']:.3f}",
        )
        for constants, by_half in data["regrets"].items()
        for half, by_runs in by_half.items()
        for runs, r in by_runs.items()
    ]
    changed = ", ".join(
        f"`{k}` x{v:g}" for k, v in data["multipliers"].items() if v != 1.0
    )
    return (
        f"Multipliers of the constants the fit found: {changed or 'none'}. The "
        "offline score of each set of constants' choices, median / worst regret:"
        "\n\n" + _table(("constants", "half", "score", "median / worst"), rows)
    )


def _realistic(data: dict) -> str:
    variants = [v for v in next(iter(data["results"].values())) if v != "half"]
    variants.remove("lineax")
    rows = []
    for name, row in data["results"].items():
        lin = row["lineax"]
        decided = ", ".join(d["strategy"] for d in row["Auto"].get("decisions", []))
        kept = {d["strategy"] for r in row["Auto"].get("kept", []) for d in r}
        if any("Raced" in d["reason"] for r in row["Auto"].get("kept", []) for d in r):
            decided += f" (raced; kept: {', '.join(sorted(kept))})"
        rows.append(
            (
                f"`{name}`",
                row["half"].replace("_", "-"),
                f"{lin['first_call_s']:.2f} s / {lin['run_s'] * 1e3:.2f} ms",
                decided or "(solves only)",
                *(
                    f"{row[v]['first_call_speedup']:.2f}x / {row[v]['run_ratio']:.2f}x"
                    for v in variants
                ),
            )
        )
    first = [row["Auto"]["first_call_speedup"] for row in data["results"].values()]
    runs = [row["Auto"]["run_ratio"] for row in data["results"].values()]
    margins = data["fitted_margins"]
    return (
        "Each cell: the first call's speedup over lineax's (`eqx.filter_jit` + "
        "plain lineax operators; above 1 is faster), then the steady run over "
        f"lineax's; the faster of {data['rounds']} round(s).\n\n"
        + _table(
            ("program", "half", "lineax first / run", "Auto decided", *variants),
            rows,
        )
        + f"\n\nAuto's first call: median {_x(statistics.median(first))} "
        f"({_x(min(first))} to {_x(max(first))}); its steady runs "
        f"{_x(min(runs))} to {_x(max(runs))} of lineax's. Margins fitted on the "
        f"fit half: departure {margins['departure_margin']:.2f}, materialise "
        f"{margins['materialise_margin']:.2f}."
    )


def _realistic_stages(data: dict) -> str:
    stages = ("trace_s", "lower_s", "compile_s", "first_run_s")
    rows = [
        (
            f"`{name}`",
            variant,
            *(f"{entry[s]:.3f}" for s in stages),
            f"{entry['total_s']:.3f}",
            _x(entry["over_lineax"]),
        )
        for name, row in data["results"].items()
        for variant, entry in row.items()
    ]
    return (
        "Seconds of each stage of a fresh program's first call, the median of "
        f"{data['rounds']} round(s); lineax's trace is inside its lowering "
        "(`eqx.filter_jit(...).lower`).\n\n"
        + _table(
            (
                "program",
                "variant",
                "trace",
                "lower",
                "compile",
                "first run",
                "total",
                "over lineax",
            ),
            rows,
        )
    )


def _accelerator(data: dict) -> str:
    parity = data["parity"]
    counts = _table(("verdict", "rows"), list(parity["counts"].items()))
    kinds: dict[str, int] = {}
    for why in parity["not_ok"].values():
        key = why.split(":")[0]
        kinds[key] = kinds.get(key, 0) + 1
    benchmarks = _table(
        ("benchmark", "exit status", "seconds"),
        [
            (name, b["exit_status"], f"{b['seconds']:.0f}")
            for name, b in data["benchmarks"].items()
        ],
    )
    return (
        f"The parity zoo ({parity['seconds']:.0f} s):\n\n{counts}\n\nRows not `ok`, "
        f"by cause: {', '.join(f'{k} ({n})' for k, n in kinds.items())}.\n\n"
        f"The benchmarks it ran:\n\n{benchmarks}"
    )


def _parity(data: dict) -> str:
    rows = [
        (
            r["id"],
            r["result"],
            f"{r['error']:.1e}" if r.get("error") is not None else "-",
            f"{r['baseline_error']:.1e}"
            if r.get("baseline_error") is not None
            else "-",
            r["verdict"],
        )
        for r in data["rows"]
        if r["verdict"] not in ("ok", "refused")
    ]
    off = [
        r
        for r in data["rows"]
        if r.get("error") and r.get("baseline_error", 0) > 100 * r["error"]
    ]
    worst = max(off, key=lambda r: r["baseline_error"], default=None)
    tail = (
        f"Rows where the baseline is more than 100 times further from the float64 "
        f"reference than ours: {len(off)}; the furthest, `{worst['id']}`, "
        f"{worst['baseline_error']:.1e} against ours {worst['error']:.1e}."
        if worst
        else "No row where the baseline is far off and ours is not."
    )
    return (
        _table(("case", "result", "error", "baseline's error", "verdict"), rows)
        + "\n\n"
        + tail
    )


def _copies(counts: dict | None) -> str:
    if counts is None:
        return "-"
    return f"{counts['in_loops'] / 2**20:.0f} / {counts['outside'] / 2**20:.0f}"


def _dependent_sites(data: dict) -> str:
    k1, k = data["ks"][0], data["ks"][-1]
    rows = []
    for variant, r in data["results"].items():
        many = r["rounds"][str(k)]
        rows.append(
            (
                variant,
                f"{r['first_call_ratio']:.2f}x",
                f"{min(m['run_per_mv_s'] for m in many) * 1e6:.0f} us",
                f"{r['run_per_mv_over_inline']:.2f}x",
                _copies(many[0].get("copies_started")),
            )
        )
    return (
        f"n = {data['n']}, {data['layers']} layers; the faster of the rounds.\n\n"
        + _table(
            (
                "variant",
                f"first call, k={k} / k={k1}",
                f"run per mv at k={k}",
                "over lineax's inline",
                f"MiB copied on chip at k={k}: per trip / once",
            ),
            rows,
        )
    )


def _compile_race(data: dict) -> str:
    rows = [
        (
            f"`{name}`",
            *(f"{r['alone_s'][p]:.2f} s" for p in ("Lazy", "Roll")),
            *(f"{r['side_by_side_s'][p]:.2f} s" for p in ("Lazy", "Roll")),
            f"{r['first_finish_over_fastest_alone']:.2f}x",
        )
        for name, r in data["results"].items()
    ]
    return _table(
        (
            "program",
            "Lazy alone",
            "Roll alone",
            "Lazy side by side",
            "Roll side by side",
            "first finish over the faster alone",
        ),
        rows,
    )


def _solve_roll_replay(data: dict) -> str:
    rows = [
        (
            f"compile + {runs} x run",
            f"{s['recorded']['median']:.3f} / {s['recorded']['worst']:.3f}",
            f"{s['current']['median']:.3f} / {s['current']['worst']:.3f}",
            ", ".join(s["changed"]) or "none",
        )
        for runs, s in data["summary"].items()
    ]
    copy = data["solve_copy"]
    return (
        f"`CostModel.solve_copy` {copy['recorded']:.3g} s as recorded, "
        f"{copy['current']:.3g} s now; the measured variant each decision stands "
        f"for over the best, on the {len(data['cases']) // 2} programs of two or "
        f"more solves:\n\n"
        + _table(
            ("score", "recorded: median / worst", "now", "decisions changed"), rows
        )
    )


TABLES = {
    "solve_roll_replay": _solve_roll_replay,
    "realistic-raced": _realistic,
    "realistic-3-rounds": _realistic,
    "realistic-solve-programs": _realistic,
    "realistic_stages": _realistic_stages,
    "dependent_sites": _dependent_sites,
    "compile_race": _compile_race,
    "families": _families,
    "families-adjoint": _families,
    "replay": _replay,
    "cost_model_fit": _cost_model_fit,
    "realistic": _realistic,
    "realistic-12-programs": _realistic,
    "realistic-2-rounds": _realistic,
    "accelerator": _accelerator,
    "parity": _parity,
}
