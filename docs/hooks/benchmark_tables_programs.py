"""The tables of the Benchmarks pages for whole programs and solves (see
`benchmark_tables.py`): each results file's data as Markdown tables, in `TABLES`
by the results file's name."""

from benchmark_tables import _ms, _table


def _x(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}x"


def _demo(data: dict) -> str:
    rows = []
    for grid, sides in data["grids"].items():
        default, ours = sides["optimistix default"], sides["lxd.AutoSolver"]
        for label, r in (("optimistix default", default), ("`lxd.AutoSolver`", ours)):
            rows.append(
                (
                    f"{grid}x{grid}",
                    int(grid) ** 2,
                    label,
                    f"{r['compile_s']:.2f} s",
                    _ms(r["run_s"]),
                    f"{r['peak_bytes'] / 1e6:.3g} MB",
                    r["newton_steps"],
                )
            )
        rows.append(
            (
                "",
                "",
                "ours / default",
                _x(ours["compile_s"] / default["compile_s"]),
                _x(ours["run_s"] / default["run_s"], 3),
                _x(ours["peak_bytes"] / default["peak_bytes"], 3),
                "",
            )
        )
    case = data["budget_case"]
    grid = case["grid"]
    table = _table(
        ("grid", "unknowns", "linear solver", "compile", "run", "peak memory", "steps"),
        rows,
    )
    return (
        f"{table}\n\nUnder a {case['budget']} budget, a {grid}x{grid} grid: "
        f"`AutoSolver` stays matrix-free ({_ms(case['auto']['run_s'])} a run, "
        f"{case['auto']['peak_bytes'] / 1e6:.3g} MB at its peak, where XLA plans "
        f"{case['default_peak_bytes'] / 1e9:.3g} GB for optimistix's default); a "
        f"materialising solve raises at trace time:\n\n> {case['materialise_error']}"
    )


def _program(data: dict) -> str:
    rows = []
    for case, patterns in data["results"].items():
        if case == "nested jit":
            continue
        for pattern, r in patterns.items():
            if pattern == "eager":
                continue
            k = data["ks"][-1]

            def at(variant, key="compile_vs_k1"):
                return _x(r[f"{variant} k={k}"][key])

            rows.append(
                (
                    case,
                    pattern,
                    at("lxd.jit + Auto"),
                    at("lxd.jit + Roll"),
                    at("lineax"),
                    at("by hand (lineax)"),
                    at("lxd.jit + Auto", "run_per_mv_vs_lineax"),
                )
            )
    nested = data["results"]["nested jit"]
    k = data["ks"][-1]
    return (
        f"Compile total of {k} sites over one (the median of each round's own "
        "ratio):\n\n"
        + _table(
            (
                "operator",
                "sites",
                "`lxd.jit` + Auto",
                "`lxd.jit` + Roll",
                "plain lineax",
                "rolled by hand",
                "Auto's run per `mv` / lineax's",
            ),
            rows,
        )
        + f"\n\nA jitted function reused at {k} sites: "
        f"{_x(nested[f'lxd.jit k={k}']['compile_vs_k1'])} of one site under "
        f"`lxd.jit`, {_x(nested[f'jax.jit k={k}']['compile_vs_k1'])} under "
        "`jax.jit`."
    )


def _eager(data: dict) -> str:
    rows = []
    for case, variants in data["results"].items():
        for name, r in variants.items():
            rows.append(
                (
                    case,
                    name,
                    _ms(r["calls_s"][0]),
                    f"{r['steady_s'] * 1e3:.3f} ms",
                    _x(r["worst_ratio_from_call_2"]),
                    _x(r["steady_ratio_vs_jitted"]),
                )
            )
    return _table(
        (
            "operator",
            "eager `mv`",
            "first call",
            "steady call",
            "calls 2 on / jitted `mv`, worst",
            "steady / jitted `mv`",
        ),
        rows,
    )


def _fixed_cost(data: dict) -> str:
    return _table(
        ("program", "first call", "over `jax.jit` + lineax, median", "quartiles"),
        [
            (
                name,
                _ms(r["first_s"]),
                _x(r["ratio_median"], 3),
                " - ".join(f"{q:.3f}" for q in r["ratio_quartiles"]),
            )
            for name, r in data["results"].items()
        ],
    )


def _steady(data: dict) -> str:
    variants = ("ours", "ours inline", "ours inline, lxd.jit")
    return _table(
        (
            "case",
            "steps",
            "layout taken",
            "default / lineax",
            "inline / lineax",
            "inline under `lxd.jit` / lineax",
            "first call, default / inline",
        ),
        [
            (
                f"{c['shape']} n={c['n']}",
                c["steps"]["lineax"],
                c["layout"].replace("_", " "),
                *(f"{c['run_ratio'][v]:.3f}" for v in variants),
                f"{c['first_ratio']['ours']:.3f} / "
                f"{c['first_ratio']['ours inline']:.3f}",
            )
            for c in data["cases"]
        ],
    )


def _stacked(data: dict) -> str:
    results = data["results"]
    variants = list(next(iter(results.values()))["ratio_vs_inline"])
    return "Run time of each program call over the sites inline:\n\n" + _table(
        ("sites", *variants),
        [
            (k, *(f"{r['ratio_vs_inline'][v]:.2f}x" for v in variants))
            for k, r in results.items()
        ],
    )


def _sharded(data: dict) -> str:
    rows = []
    for row in data["rows"]:
        for name, v in row["variants"].items():
            collectives = ", ".join(f"{k} {n}" for k, n in v["collectives"].items())
            rows.append(
                (
                    row["devices"],
                    name,
                    f"{v['compile_s']:.3f} s",
                    f"{v['temp_bytes'] / 1e3:.1f} KB",
                    f"{v['argument_bytes'] / 1e6:.2f} MB",
                    collectives or "none",
                    f"{v['rel_err']:.1e}",
                )
            )
    return _table(
        (
            "devices",
            "solve",
            "compile",
            "temporaries",
            "arguments",
            "collectives",
            "relative error",
        ),
        rows,
    )


def _autosolver(data: dict) -> str:
    s = data["summary"]
    table = _table(
        (
            "unknowns",
            "default (factorise)",
            "CG",
            "AutoSolver",
            "AutoSolver chose",
            "best",
            "AutoSolver / best",
        ),
        [
            (
                r["unknowns"],
                f"{r['default']['total_s']:.3f} s",
                f"{r['cg']['total_s']:.3f} s",
                f"{r['auto']['total_s']:.3f} s",
                r["auto_chose"],
                r["best"],
                _x(r["auto_over_best"]),
            )
            for r in data["rows"]
        ],
    )
    return (
        f"Compile plus one run of the Newton solve:\n\n{table}\n\n`AutoSolver` "
        f"picked the faster on {s['auto_picked_best']} of {s['grids']} grids; its "
        f"worst is {_x(s['worst_auto_over_best'])} of the best."
    )


def _diffusion_table(data: dict) -> str:
    rows = []
    for d in data["diffusion"]:
        for name, r in d["results"].items():
            mark = " (estimated)" if r.get("estimated") else ""
            rows.append(
                (
                    f"{d['s']} x {d['s']}",
                    name + mark,
                    r["steps"],
                    _ms(r["run_s"]),
                    f"{r['total_s']:.2f} s",
                )
            )
    diffusion = _table(("grid", "program", "steps", "run", "compile + run"), rows)
    return (
        f"Diffusion stencil, {data['config']['dtype']}, its coefficient spanning 1e3 "
        f'("run": the compiled program\'s median call, build and solve):\n\n{diffusion}'
    )


def _preconditioners(data: dict) -> str:
    parts = [_diffusion_table(data)] if "diffusion" in data else []
    if "spread" in data:
        parts.append(_spread_table(data))
    if "blocks" in data:
        parts.append(_blocks_table(data["blocks"]))
    if "families" in data:
        f = data["families"]
        chosen = sum(c["preconditioned"] for c in f["choices"])
        parts.append(
            f"The operators of `benchmarks.families`: `AutoSolver` took a "
            f"preconditioner on {chosen} of {len(f['choices'])}; the stencil family "
            f"at n = {f['stencil_n']}, told its pattern, took {_x(f['regret'])} the "
            "total of its solve without it."
        )
    return "\n\n".join(parts)


def _spread_table(data: dict) -> str:
    spread = _table(
        ("coefficient span", "diagonal spread", "plain CG steps", "Jacobi steps"),
        [
            (
                f"{r['span']:g}",
                f"{r['diagonal_spread']:.1f}",
                r["plain_steps"],
                r["jacobi_steps"],
            )
            for r in data["spread"]
        ],
    )
    s = data["config"]["grids"][0]
    return f"The spread rule, {s} x {s}:\n\n{spread}"


def _blocks_table(b: dict) -> str:
    blocks = _table(
        ("preconditioner", "steps", "compile + run"),
        [(k, r["steps"], f"{r['total_s']:.2f} s") for k, r in b["results"].items()],
    )
    return (
        f"A block-diagonal-dominant dense operator (n = {b['n']}, "
        f"blocks of {b['block_size']}): Jacobi takes "
        f"{_x(b['jacobi_over_block_steps'], 1)} the steps of block Jacobi; "
        f"`AutoSolver(block_size={b['block_size']})` chose `{b['auto_chose']}` "
        f"({' '.join(b['auto_reasons'])})"
        + (
            f", {_x(b['auto_over_best'])} the best fixed program's compile + run"
            if "auto_over_best" in b
            else ""
        )
        + f"\n\n{blocks}"
    )


def _cg_choices(data: dict) -> str:
    rows = []
    for n, by_variant in data["results"].items():
        for name, r in by_variant.items():
            label = f"auto ({r['took']})" if "took" in r else name
            rows.append(
                (
                    f"n = {n}",
                    label,
                    f"{r['compile_s']:.3f} s ({_x(r['compile_over_lineax'])})",
                    f"{r['run_s'] * 1e3:.3f} ms ({_x(r['run_over_lineax'])})",
                )
            )
    return _table(("stencil", "CG layout, update", "compile", "run"), rows)


TABLES = {
    "demo": _demo,
    "cg_choices": _cg_choices,
    "program": _program,
    "eager": _eager,
    "fixed_cost": _fixed_cost,
    "fixed_cost-newton": _fixed_cost,
    "fixed_cost-loop": _fixed_cost,
    "steady": _steady,
    "stacked": _stacked,
    "sharded": _sharded,
    "autosolver": _autosolver,
    "preconditioners": _preconditioners,
    "preconditioners-float64-64": _preconditioners,
    "preconditioners-float64-256": _preconditioners,
    "preconditioners-blocks-float64": _preconditioners,
    "preconditioners-blocks-float32": _preconditioners,
}
