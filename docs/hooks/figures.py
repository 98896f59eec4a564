"""Every measured figure of the documentation, read from its results file.

A figure is a name in `FIGURES` and a function of the JSON files under
`benchmarks/results/` that gives its text ("11.59x", "0.85-1.04x"); the registry
is `figure_core.py`, the figures `figures_*.py`, beside this file. The pages
write `{{ name }}` where a figure goes; the MkDocs hook `figure_hook.py` puts the
text there when the site is built, so that a page shows what its results file
holds and nothing else. README.md, which MkDocs does not build, holds the
headline table that `headline_table()` makes from `HEADLINES`, between two
markers; `tests/test_figures.py` fails where it differs, and

    python docs/hooks/figures.py

writes it again. Nothing here imports MkDocs or JAX: the tests import this module.
"""

import sys

import figures_bench  # noqa: F401  (registers its figures)
from figure_core import (  # noqa: F401  (the names the hook and the tests use)
    backend,
    FIGURES,
    fill,
    PLACEHOLDER,
    RESULTS,
    ROOT,
    TPU_KIND,
    value,
)


README = ROOT / "README.md"
BEGIN = "<!-- headline figures: written by `python docs/hooks/figures.py` -->"
END = "<!-- end of headline figures -->"

# ------------------------------------------------------------------ headline table

# (what is measured, the results file it is read from, result, command)
HEADLINES = (
    (
        "Compile time of 16 call sites over one: an operator of "
        "{callsites.operator}, `jax.jit`",
        "callsites",
        "plain lineax {callsites.lineax_16}, `Outline()` {callsites.outline_16}, "
        "`Materialise(128)` {callsites.materialise_16}",
        "python -m benchmarks.callsites",
    ),
    (
        "The same under `lxd.jit` + `Auto`: independent sites (stacked) / "
        "dependent sites (rolled)",
        "program",
        "{program.1024.independent.auto} / {program.1024.dependent.auto}, "
        "plain lineax {program.1024.independent.lineax} / "
        "{program.1024.dependent.lineax}",
        "python -m benchmarks.program",
    ),
    (
        "`lxd.CG` / `lxd.BiCGStab` over lineax's, an operator whose `mv` is "
        "{solvers.matvecs_per_mv} matrix-vector products: compile; run per step; "
        "copies of `mv` compiled",
        "solvers",
        "{solvers.cg.compile} / {solvers.bicgstab.compile}; {solvers.cg.step} / "
        "{solvers.bicgstab.step}; {solvers.cg.copies}",
        "python -m benchmarks.solvers --solvers cg,bicgstab",
    ),
    (
        "`Auto` over the best fixed policy or plain lineax, {auto.cases} cases, "
        "median / worst: compile + 1 run; compile + 100 runs",
        "auto",
        "{auto.1.median} / {auto.1.worst}; {auto.100.median} / {auto.100.worst}",
        "python -m benchmarks.auto --n 64,256,1024 --repeats 3",
    ),
    (
        "The same on held-out program families (stencils, adjoint pairs, "
        "Gauss-Newton, a network's Jacobian)",
        "families-held-out-reductions/families",
        "{held_out_latest.held_out.1.median} / {held_out_latest.held_out.1.worst}; "
        "{held_out_latest.held_out.100.median} / "
        "{held_out_latest.held_out.100.worst}",
        "python -m benchmarks.families --half held_out --repeats 2 "
        "--out benchmarks/results/families-held-out-reductions",
    ),
    (
        "One cheap CG solve compiled and run once, `lxd.jit` + ours over "
        "`jax.jit` + lineax, median (quartiles) of {fixed_cost.rounds} rounds",
        "fixed_cost",
        "{fixed_cost.ours} ({fixed_cost.ours_quartiles})",
        "python -m benchmarks.fixed_cost",
    ),
    (
        "`lxd.batch_solve(..., lx.LU())`, {batch.rhs} right-hand sides, "
        "n={batch.n}: a Python loop of `lx.linear_solve` over it; it over "
        "`lu_factor` + `lu_solve`",
        "batch",
        "{batch.loop}; {batch.limit}",
        "python -m benchmarks.batch",
    ),
    (
        "Parity of every policy and solver with a float64 reference",
        "tpu/accelerator",
        "{tpu.parity_ok} cases `ok`, {tpu.parity_fail} `FAIL`",
        "python -m benchmarks.accelerator",
    ),
    (
        "{tpu_realistic.programs} user-written programs, first call of `lxd.jit` + "
        "`Auto`: speedup over `eqx.filter_jit` + lineax, median (range)",
        "tpu/realistic-3-rounds",
        "{tpu_realistic.first_median} ({tpu_realistic.first_span})",
        "python -m benchmarks.realistic --rounds 3",
    ),
)


def headline_table() -> str:
    rows = ["| measured | backend | result | command |", "|---|---|---|---|"]
    for measured, source, result, command in HEADLINES:
        cells = (fill(measured), backend(source), fill(result), f"`{command}`")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def readme_with_table(readme: str) -> str:
    """`readme` with the text between `BEGIN` and `END` replaced by the table."""
    head, begin, rest = readme.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"README.md has no {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{headline_table()}\n{END}{tail}"


if __name__ == "__main__":
    text = README.read_text()
    new = readme_with_table(text)
    if new != text:
        README.write_text(new)
        print("README.md: headline figures written", file=sys.stderr)
