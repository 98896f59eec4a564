"""The tables of the Benchmarks pages (see benchmarks.py, the MkDocs hook that
loads this module): for each benchmark with a table, its results file's data as
Markdown tables, in `TABLES` by the results file's name."""

AUTO_WORST_SHOWN = 6  # per score, the cases of `auto` furthest from the best


# ------------------------------------------------------------------ helpers


def _table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


# ------------------------------------------------------------------ tables


def _callsites(data: dict) -> str:
    results = data["results"]
    ks = [r["k"] for r in results["lineax"]]
    lineax = {r["k"]: r["compile_total_s"] for r in results["lineax"]}
    headers = ["variant", f"k={ks[0]}"] + [f"k={k}" for k in ks[1:]]
    headers += [f"k={ks[-1]} vs lineax", "run per mv"]
    rows = []
    for name, rs in results.items():
        first = rs[0]["compile_total_s"]
        runs = [r["run_per_mv_s"] for r in rs]
        rows.append(
            [name, f"{first:.3f} s"]
            + [f"{r['compile_total_s'] / first:.2f}x" for r in rs[1:]]
            + [
                f"{rs[-1]['compile_total_s'] / lineax[rs[-1]['k']]:.2f}x",
                f"{_ms(min(runs))} - {_ms(max(runs))}",
            ]
        )
    return f"Compile total at k={ks[0]} call sites, then relative to it:\n\n" + _table(
        headers, rows
    )


def _solvers(data: dict) -> str:
    bare = data["bare_mv"]
    rows = []
    for key, r in data["results"].items():
        lin, ours = r["lineax"], r["ours"]
        per_mv = 2 * r["layers"]

        def steps(t):
            done = t["result"] == "successful"
            return str(t["num_steps"]) + ("" if done else f" ({t['result']})")

        rows.append(
            (
                f"{r['lineax_solver']} / {r['ours_solver']}",
                f"{lin['compile_total_s']:.3f} s",
                f"{ours['compile_total_s']:.3f} s",
                f"{ours['compile_total_s'] / lin['compile_total_s']:.2f}x",
                _ms(lin["run_s"]),
                _ms(ours["run_s"]),
                f"{ours['run_per_step_s'] / lin['run_per_step_s']:.3f}x",
                f"{steps(lin)} / {steps(ours)}",
                f"{lin['matmuls_in_hlo'] / per_mv:g} / {ours['matmuls_in_hlo'] / per_mv:g}",
            )
        )
    headers = (
        "lineax / ours",
        "lineax compile",
        "ours compile",
        "ours/lineax",
        "lineax run",
        "ours run",
        "run per step ours/lineax",
        "steps (lineax / ours)",
        "`mv` copies in HLO",
    )
    out = _table(headers, rows)
    out += (
        f"\n\nOne bare `mv` compiles in {bare['compile_total_s']:.3f} s and runs in "
        f"{_ms(bare['run_s'])}."
    )
    for key, why in {**data.get("skipped", {}), **data.get("failed", {})}.items():
        out += f"\n\nNot measured: {key} ({why})."
    return out


def _auto(data: dict) -> str:
    scores = data["summary"]  # per number of runs: "1", "100"
    summary = _table(
        (
            "score",
            "cases",
            "Auto / best, median",
            "Auto / best, worst",
            "Auto picked the best",
            "lineax / best, median",
            "Auto / lineax where lineax is best, worst (paired by round)",
        ),
        [
            (
                f"compile + {runs} x run",
                s["cases"],
                f"{s['median_auto_over_best']:.2f}x",
                f"{s['worst_auto_over_best']:.2f}x ({s['worst_case']})",
                f"{s['auto_picked_best']} of {s['cases']}",
                f"{s['median_lineax_over_best']:.2f}x",
                _paired_lineax(s),
            )
            for runs, s in scores.items()
        ],
    )
    worst = _table(
        ("score", "case", "best", "Auto chose", "Auto / best"),
        [
            (
                f"{runs} run(s)",
                f"{case['kind']}/{case['workload']} n={case['n']} k={case['k']} "
                f"L={case['layers']}",
                case["scores"][runs]["best"],
                case["scores"][runs]["auto_choice"],
                f"{case['scores'][runs]['auto_over_best']:.2f}x",
            )
            for runs in scores
            for case in sorted(
                data["cases"], key=lambda c: -c["scores"][runs]["auto_over_best"]
            )[:AUTO_WORST_SHOWN]
        ],
    )
    out = f"{summary}\n\nThe cases where Auto is furthest from the best:\n\n{worst}"
    if data.get("lineax_gaps"):
        out += "\n\nWhere plain lineax is the best, each stage over plain lineax's:\n\n"
        out += _lineax_gaps(data["lineax_gaps"])
    return out


def _lineax_gaps(gaps: list) -> str:
    stages = list(gaps[0]["gap_ms"])
    return _table(
        (
            "case",
            "score",
            "variant",
            *(f"{s.removesuffix('_s').replace('_', ' ')} (ms)" for s in stages),
            "over plain lineax, paired",
            "its quartiles",
        ),
        [
            (
                g["case"],
                f"{g['runs']} run(s)",
                g["variant"],
                *(f"{g['gap_ms'][s]:+.1f}" for s in stages),
                f"{g['over_lineax_paired']:.3f}x",
                " - ".join(f"{q:.2f}" for q in g.get("over_lineax_quartiles") or ())
                or "-",
            )
            for g in gaps
        ],
    )


def _paired_lineax(s: dict) -> str:
    worst = s.get("worst_auto_over_lineax_where_lineax_best")
    paired = s.get("worst_auto_over_lineax_where_lineax_best_paired")
    if worst is None:
        return "(plain lineax never the best)"
    return f"{worst:.2f}x" + ("" if paired is None else f" ({paired:.2f}x)")


def _dispatch(data: dict) -> str:
    variants = [k for k in data["rows"][0] if isinstance(data["rows"][0][k], dict)]
    return _table(
        ("program", *variants),
        [
            (
                row["program"],
                *(
                    f"{row[v]['us']:.1f} us ({row[v]['over_reference']:.2f}x)"
                    for v in variants
                ),
            )
            for row in data["rows"]
        ],
    )


def _batch(data: dict) -> str:
    config, cg, mem = data["config"], data["cg"], data["memory"]
    dense = _table(
        (
            "right-hand sides",
            "`batch_solve`",
            "Python loop",
            "LU limit",
            "`batch_solve` / limit",
            "loop / `batch_solve`",
        ),
        [
            (
                r["batch"],
                _ms(r["batch_solve_s"]),
                _ms(r["loop_s"]),
                _ms(r["limit_s"]),
                f"{r['batch_solve_over_limit']:.2f}x",
                f"{r['loop_over_batch_solve']:.1f}x",
            )
            for r in data["dense"]
        ],
    )
    cg_table = _table(
        ("", "compile total", "run", "total", "steps (max)"),
        [
            (
                label,
                f"{cg[k]['compile_total_s']:.3f} s",
                _ms(cg[k]["run_s"]),
                f"{cg[k]['total_s']:.3f} s",
                cg[k]["steps_max"],
            )
            for k, label in (
                ("auto", "`batch_solve`, Auto"),
                ("lineax", "vmapped lineax CG"),
            )
        ],
    )
    mem_table = _table(
        ("", "peak RSS growth", "run"),
        [
            (label, f"{mem[k]['growth_mb']:.0f} MB", f"{mem[k]['run_s']:.2f} s")
            for k, label in (
                ("auto_chunked", f"Auto: {mem['decision']['policy']}"),
                ("lockstep", "lockstep"),
            )
        ],
    )
    return (
        f"(a) Dense SPD n={config['dense_n']}, `lx.LU()`, run times:\n\n{dense}\n\n"
        f"(b) Matrix-free SPD n={config['n']}, {config['layers']} layers, "
        f"{config['rhs']} right-hand sides, CG; Auto decided "
        f"`{cg['decision']['policy']}`:\n\n{cg_table}\n\n"
        f"(c) {config['mem_rhs']} right-hand sides of n={config['mem_n']} under a "
        f"{mem['budget'] / 2**20:g} MiB budget:\n\n{mem_table}"
    )


TABLES = {
    "callsites": _callsites,
    "solvers": _solvers,
    "auto": _auto,
    "batch": _batch,
    "dispatch": _dispatch,
}
