"""The tables of the Benchmarks pages for what a solve's first call costs beyond
its run (see `benchmark_tables.py`): `cg_compile`'s ablation, `solver_kernels`'
counts, `reduction_compile`'s forms, `trace_gap`'s traces and `first_call`'s
paired ratios, as Markdown
tables, in `TABLES` by the results file's name."""

import statistics

from benchmark_tables import _ms, _table


def _cg_compile(data: dict) -> str:
    rows = [
        (name, _ms(r["compile_s"]), f"{r['over_lineax']:.3f}x")
        for name, r in data["results"].items()
    ]
    n, rounds = data["settings"]["n"], data["settings"]["rounds"]
    return f"n = {n}, median of {rounds} rounds:\n\n" + _table(
        ("CG", "XLA compile", "over lineax's, same round"), rows
    )


def _reduction_compile(data: dict) -> str:
    rows = []
    for n, forms in data["results"].items():
        for form, r in forms.items():
            nan = {True: "kept", False: "dropped"}.get(r.get("keeps_nan"), "")
            rows.append(
                (
                    n,
                    form,
                    _ms(r["compile_s"]),
                    f"{r['over_elementwise']:.2f}x",
                    "yes" if r["library"] else "",
                    nan,
                    f"{r['run_us']:.2f} us" if "run_us" in r else "",
                )
            )
    headers = (
        "length",
        "program",
        "XLA compile",
        "over elementwise",
        "library",
        "NaN",
        "run, one product",
    )
    rounds = data["settings"]["rounds"]
    return f"float32, median of {rounds} rounds:\n\n" + _table(headers, rows)


def _solver_kernels(data: dict) -> str:
    rows = []
    for program, r in data["results"].items():
        for variant, x in r["results"].items():
            rows.append(
                (
                    program,
                    variant,
                    str(x["kernels"]),
                    str(x["fused_instructions"]),
                    f"{x['compile_s']:.3f} s",
                )
            )
        q = r["ours_over_lineax"]
        rows.append(
            (
                program,
                "ours / lineax",
                f"{q['kernels']:.2f}",
                f"{q['fused_instructions']:.2f}",
                f"{q['compile_s']:.2f}",
            )
        )
    rounds = data["settings"]["rounds"]
    main = f"Compile: median of {rounds} rounds.\n\n" + _table(
        ("program", "variant", "kernels", "fused instructions", "XLA compile"), rows
    )
    ablated = [
        (
            program,
            name,
            str(a["kernels"]),
            str(a["fused_instructions"]),
            f"{a['compile_over_lineax']:.2f}x" if "compile_over_lineax" in a else "-",
        )
        for program, r in data["results"].items()
        for name, a in r.get("ablations", {}).items()
    ]
    if not ablated:
        return main
    headers = ("program", "ours, CG", "kernels", "fused instructions")
    return (
        f"{main}\n\nOur CG with each safeguard left out, then all of them (compile:"
        " the median of each round's ratio to lineax's):\n\n"
        + _table((*headers, "compile over lineax's"), ablated)
    )


def _trace_gap(data: dict) -> str:
    rows = [
        (phase, variant, _ms(e["wall_s"]), _ms(e["cpu_s"]), f"{e['over_lazy']:.2f}x")
        for phase, row in data["phases"].items()
        for variant, e in row.items()
    ]
    programs = ", ".join(data["programs"])
    return f"Programs: {programs}; medians.\n\n" + _table(
        ("phase", "variant", "trace", "main thread's CPU", "over `Lazy`"), rows
    )


def _first_call(data: dict) -> str:
    """`benchmarks.first_call`: per program the median first-call ratio to plain
    lineax's over the paired rounds, with its quartiles, per compared variant."""

    def cell(row: dict, variant: str) -> str:
        low, middle, high = row[variant]["quartiles"]
        mark = " (slower)" if row[variant]["slower"] else ""
        return f"{middle:.3f}x ({low:.3f}-{high:.3f}){mark}"

    variants = list(data["summary"])
    rows = [
        (
            r["label"],
            f"{statistics.median(r['first_s']['lineax']):.3f} s"
            + ("" if r.get("lineax_answer_ok", True) else " (answer not one)"),
            *(cell(r, v) for v in variants),
            ", ".join(r["choices"].values()),
        )
        for r in data["cases"]
    ]
    totals = [
        (
            f"**{variant}**",
            f"{s['median_ratio']:.3f}x",
            f"{len(s['slower'])} of {s['programs'] - len(s.get('not_counted', ()))} "
            f"(clearly: {len(s['clearly_slower'])})",
        )
        for variant, s in data["summary"].items()
    ]
    headers = (
        "program",
        "lineax's first call",
        *(f"{v} / lineax (quartiles)" for v in variants),
        "chose (" + ", ".join(v for v in variants if v != "Lazy") + ")",
    )
    summary = ("variant", "median of the ratios", "programs slower by > 5%")
    return (
        f"{data['config']['rounds']} paired rounds per program:\n\n"
        + _table(headers, rows)
        + "\n\n"
        + _table(summary, totals)
    )


TABLES = {
    "cg_compile": _cg_compile,
    "first_call": _first_call,
    "reduction_compile": _reduction_compile,
    "solver_kernels": _solver_kernels,
    "trace_gap": _trace_gap,
}
