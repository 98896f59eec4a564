"""The figures of the benchmarks run on a CPU and on a TPU, registered by name in
`figure_core.FIGURES` (see `figures.py`)."""

import functools
import statistics

from figure_core import figure, load, span, x


def _callsites(file: str, variant: str, k: str = "16") -> str:
    return x(load(file)["ratios"][variant]["vs_own_first_k"][k])


for _variant, _key in (
    ("lineax", "lineax"),
    ("Lazy", "lazy"),
    ("Outline", "outline"),
    ("Materialise(128)", "materialise"),
):
    figure(f"callsites.{_key}_16", "callsites")(
        functools.partial(_callsites, "callsites", _variant)
    )
    figure(f"callsites64.{_key}_16", "callsites-64-layers/callsites")(
        functools.partial(_callsites, "callsites-64-layers/callsites", _variant)
    )


def _program(case: str, pattern: str, variant: str, key: str = "compile_vs_k1"):
    return x(load("program")["results"][case][pattern][f"{variant} k=16"][key])


_CASES = {"1024": "32 layers, n=1024", "256": "24 layers, n=256"}
for _n, _case in _CASES.items():
    for _pattern in ("independent", "dependent"):
        for _variant, _key in (
            ("lxd.jit + Auto", "auto"),
            ("lxd.jit + Roll", "roll"),
            ("lineax", "lineax"),
            ("by hand (lineax)", "by_hand"),
        ):
            figure(f"program.{_n}.{_pattern}.{_key}", "program")(
                functools.partial(_program, _case, _pattern, _variant)
            )
        figure(f"program.{_n}.{_pattern}.auto_run", "program")(
            functools.partial(
                _program, _case, _pattern, "lxd.jit + Auto", "run_per_mv_vs_lineax"
            )
        )


@figure("program.nested.lxd", "program")
def _nested_lxd():
    return x(load("program")["results"]["nested jit"]["lxd.jit k=16"]["compile_vs_k1"])


@figure("program.nested.jax", "program")
def _nested_jax():
    return x(load("program")["results"]["nested jit"]["jax.jit k=16"]["compile_vs_k1"])


def _solver(solver: str, key: str) -> str:
    r = load("solvers")["results"][solver]
    if key == "copies":
        per_mv = 2 * r["layers"]
        lin, ours = r["lineax"]["matmuls_in_hlo"], r["ours"]["matmuls_in_hlo"]
        return f"{ours / per_mv:g} against {lin / per_mv:g}"
    return x(r[key])


for _solver_name in ("cg", "bicgstab"):
    for _key, _field in (
        ("compile", "compile_ratio_ours_over_lineax"),
        ("step", "run_per_step_ratio_ours_over_lineax"),
        ("copies", "copies"),
    ):
        figure(f"solvers.{_solver_name}.{_key}", "solvers")(
            functools.partial(_solver, _solver_name, _field)
        )


@figure("solvers_others.compile", "solvers-others/solvers")
def _others_compile():
    rs = load("solvers-others/solvers")["results"].values()
    return span([r["compile_ratio_ours_over_lineax"] for r in rs])


@figure("solvers_others.step", "solvers-others/solvers")
def _others_step():
    rs = load("solvers-others/solvers")["results"].values()
    return span([r["run_per_step_ratio_ours_over_lineax"] for r in rs])


def _auto(file: str, runs: str, key: str) -> str:
    return x(load(file)["summary"][runs][key])


for _runs in ("1", "100"):
    for _key, _field in (
        ("median", "median_auto_over_best"),
        ("worst", "worst_auto_over_best"),
        ("median_paired", "median_auto_over_best_paired"),
        ("lineax_best", "worst_auto_over_lineax_where_lineax_best"),
        ("lineax_best_paired", "worst_auto_over_lineax_where_lineax_best_paired"),
        ("lineax_median", "median_lineax_over_best"),
    ):
        figure(f"auto.{_runs}.{_key}", "auto")(
            functools.partial(_auto, "auto", _runs, _field)
        )


@figure("auto.cases", "auto")
def _auto_cases():
    return str(load("auto")["summary"]["1"]["cases"])


def _families(file: str, half: str, runs: str, key: str) -> str:
    return x(load(file)["summary"][half][runs][key])


for _file, _prefix, _halves in (
    ("families-held-out/families", "held_out", ("held_out",)),
    ("families-held-out/families-first-run", "held_out_first", ("held_out",)),
    ("families-held-out-reductions/families", "held_out_latest", ("held_out",)),
    ("families", "families", ("fit", "held_out")),
):
    for _half in _halves:
        for _runs in ("1", "100"):
            for _key in ("median", "worst"):
                figure(f"{_prefix}.{_half}.{_runs}.{_key}", _file)(
                    functools.partial(_families, _file, _half, _runs, _key)
                )


def _fixed(file: str, variant: str, key: str) -> str:
    r = load(file)["results"][variant]
    if key == "quartiles":
        return span(r["ratio_quartiles"], 3, "")
    return x(r["ratio_median"], 3)


for _file in ("fixed_cost", "fixed_cost-newton", "fixed_cost-loop", "tpu/fixed_cost"):
    for _variant, _key in (
        ("lxd.jit + ours", "ours"),
        ("lxd.jit + lx.CG", "lineax_solver"),
        ("jax.jit + ours", "jax_jit_ours"),
    ):
        _name = _file.replace("tpu/", "tpu_").replace("-", "_")
        figure(f"{_name}.{_key}", _file)(
            functools.partial(_fixed, _file, _variant, "median")
        )
        figure(f"{_name}.{_key}_quartiles", _file)(
            functools.partial(_fixed, _file, _variant, "quartiles")
        )


def _steady(variant: str) -> str:
    return span([c["run_ratio"][variant] for c in load("steady")["cases"]])


figure("steady.inline", "steady")(functools.partial(_steady, "ours inline"))
figure("steady.inline_jit", "steady")(
    functools.partial(_steady, "ours inline, lxd.jit")
)
figure("steady.default", "steady")(functools.partial(_steady, "ours"))


def _batch_dense(key: str, digits: int) -> str:
    row = max(load("batch")["dense"], key=lambda r: r["batch"])
    return x(row[key], digits)


figure("batch.loop", "batch")(
    functools.partial(_batch_dense, "loop_over_batch_solve", 0)
)
figure("batch.limit", "batch")(
    functools.partial(_batch_dense, "batch_solve_over_limit", 2)
)


@figure("batch.rhs", "batch")
def _batch_rhs():
    return str(max(r["batch"] for r in load("batch")["dense"]))


@figure("batch.n", "batch")
def _batch_n():
    return str(load("batch")["config"]["dense_n"])


def _dispatch(variants: tuple[str, ...]) -> str:
    us = [row[v]["us"] for row in load("dispatch")["rows"] for v in variants]
    return span(us, 1, " us")


figure("dispatch.lxd", "dispatch")(
    functools.partial(_dispatch, ("lxd.jit + ours (Auto)", "lxd.jit + lineax"))
)
figure("dispatch.jax", "dispatch")(
    functools.partial(_dispatch, ("jax.jit + lineax", "jax.jit + ours (Lazy)"))
)
figure("dispatch.eqx", "dispatch")(
    functools.partial(_dispatch, ("eqx.filter_jit + lineax",))
)


def _demo(key: str) -> str:
    grid = load("demo")["grids"]["64"]
    ours, default = grid["lxd.AutoSolver"], grid["optimistix default"]
    if key == "speedup":
        return f"{default['run_s'] / ours['run_s']:.0f}x"
    return f"1/{default['peak_bytes'] / ours['peak_bytes']:.0f}"


figure("demo.speedup_64", "demo")(functools.partial(_demo, "speedup"))
figure("demo.memory_64", "demo")(functools.partial(_demo, "memory"))


@figure("tpu.parity_ok", "tpu/accelerator")
def _parity_ok():
    return str(load("tpu/accelerator")["parity"]["counts"]["ok"])


@figure("tpu.parity_fail", "tpu/accelerator")
def _parity_fail():
    return str(load("tpu/accelerator")["parity"]["counts"]["FAIL"])


def _realistic_auto(file: str, key: str) -> str:
    rows = load(file)["results"].values()
    if key == "run_max":
        return x(max(r["Auto"]["run_ratio"] for r in rows))
    first = [r["Auto"]["first_call_speedup"] for r in rows]
    if key == "first_median":
        return x(statistics.median(first))
    return span(first)


for _key in ("first_median", "first_span", "run_max"):
    figure(f"tpu_realistic.{_key}", "tpu/realistic-3-rounds")(
        functools.partial(_realistic_auto, "tpu/realistic-3-rounds", _key)
    )


@figure("tpu_realistic.programs", "tpu/realistic-3-rounds")
def _realistic_programs():
    return str(len(load("tpu/realistic-3-rounds")["results"]))


@figure("auto.lineax_worst", "auto")
def _auto_lineax_worst():
    cases = load("auto")["cases"]
    return x(
        max(c["scores"][r]["lineax_over_best"] for c in cases for r in ("1", "100")), 1
    )


def _spread(span_: float, key: str) -> str:
    row = next(r for r in load("preconditioners")["spread"] if r["span"] == span_)
    return f"{row['diagonal_spread']:.1f}" if key == "spread" else str(row[key])


for _span, _label in ((1.0, "1"), (10.0, "10")):
    for _key, _field in (
        ("plain", "plain_steps"),
        ("jacobi", "jacobi_steps"),
        ("spread", "spread"),
    ):
        figure(f"precond.spread_{_label}.{_key}", "preconditioners")(
            functools.partial(_spread, _span, _field)
        )


def _margin(source: str, field: str, spec: str, key: str) -> str:
    """A margin `key` of the dict `field` of the results file `source`."""
    return format(load(source)[field][key], spec)


# The margins fitted on a TPU: on the realistic programs' fit half, and (the
# margins alone) on the program families' fit half.
_MARGINS = (
    ("tpu_margins.departure", "tpu/realistic", "fitted_margins", ".2f", "departure"),
    (
        "tpu_margins.materialise",
        "tpu/realistic",
        "fitted_margins",
        ".2f",
        "materialise",
    ),
    ("tpu_fit.roll_margin", "tpu/cost_model_fit-margins", "fitted", "g", "departure"),
    (
        "tpu_fit.materialise_margin",
        "tpu/cost_model_fit-margins",
        "fitted",
        "g",
        "materialise",
    ),
)
for _name, _source, _field, _spec, _which in _MARGINS:
    figure(_name, _source)(
        functools.partial(_margin, _source, _field, _spec, f"{_which}_margin")
    )


@figure("tpu.parity_cases", "tpu/parity")
def _parity_cases():
    return str(len(load("tpu/parity")["rows"]))


@figure("fixed_cost.rounds", "fixed_cost")
def _fixed_rounds():
    return str(load("fixed_cost")["settings"]["rounds"])


@figure("solvers.matvecs_per_mv", "solvers")
def _matvecs():
    return str(load("solvers")["config"]["matvecs_per_mv"])


@figure("callsites.operator", "callsites")
def _callsites_operator():
    config = load("callsites")["config"]
    n = config["n"]
    return f"{config['layers']} dense {n}x{n} layers"


def _fixed_over_best(name: str, policy: str, key: str) -> str:
    """The median or worst of a fixed policy's total over the best (compile + 1
    run) across the cases of a `benchmarks.families` results file."""
    values = []
    for row in load(name)["cases"]:
        totals = row["scores"]["1"]["totals"]
        values.append(totals[policy] / totals[row["scores"]["1"]["best"]])
    return f"{(statistics.median if key == 'median' else max)(values):.2f}"


for _policy in ("Roll", "Lazy"):
    for _key in ("median", "worst"):
        figure(f"tpu_fit.{_policy.lower()}_{_key}", "tpu/families")(
            functools.partial(_fixed_over_best, "tpu/families", _policy, _key)
        )


def _stage_gap(name: str, stages: tuple[str, ...]) -> str:
    """The median, over the held-out cases with solves of a `benchmarks.families`
    results file, of `lxd.jit`'s `stages` (`Roll`: its trace, analysis and
    rewrite, then its lowering) less `jax.jit`'s (`Lazy`: its trace, then its
    lowering), in seconds."""
    gaps = [
        sum(row["results"]["Roll"][s] - row["results"]["Lazy"][s] for s in stages)
        for row in load(name)["cases"]
        if row["solves"]
    ]
    return f"{statistics.median(gaps):.3f} s"


for _name, _file in (
    ("tpu_held_out", "tpu/families-held-out/families"),
    ("tpu_kept_records", "tpu/families-held-out-kept-records/families"),
):
    for _key, _stages in (
        ("trace_gap", ("trace_s",)),
        ("lower_gap", ("lower_s",)),
        ("both_gap", ("trace_s", "lower_s")),
    ):
        figure(f"{_name}.{_key}", _file)(functools.partial(_stage_gap, _file, _stages))
