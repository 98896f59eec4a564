"""What the benchmarks share for their output: text tables, plots and the results
files (`<name>.json` and `<name>.png`). `harness` re-exports every name, so that a
benchmark reaches them as `harness.table`, `harness.write_results`..."""

import importlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax


# ------------------------------------------------------------------ tables


def table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A text table, each column as wide as its widest cell, the first column
    left-aligned and the others right-aligned, a rule under the header."""
    cells = [list(map(str, headers))] + [list(map(str, row)) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    lines = [
        "  ".join([row[0].ljust(widths[0]), *map(str.rjust, row[1:], widths[1:])])
        for row in cells
    ]
    return "\n".join([lines[0], "-" * len(lines[0])] + lines[1:])


def column_table(columns: Sequence[tuple[str, Callable]], items: Sequence) -> str:
    """`table` with a row per item, column `(header, cell)` showing `cell(item)`."""
    headers = [header for header, _ in columns]
    return table(headers, [[cell(item) for _, cell in columns] for item in items])


def stage_columns() -> list[tuple[str, Callable]]:
    """`column_table` columns of `time_program`'s stages and compile total."""
    titles = "trace lower compile 1st-extra comp.total".split()
    keys = "trace_s lower_s compile_s first_call_extra_s compile_total_s".split()
    return [(t, lambda r, k=k: f"{r[k]:.3f}s") for t, k in zip(titles, keys)]


def met(ok: bool) -> str:
    """`"met"` or `"NOT met"`."""
    return "met" if ok else "NOT met"


# ------------------------------------------------------------------ plots, results


def pyplot():
    """`matplotlib.pyplot` with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def plain_log_ticks(ax) -> None:
    """Major ticks of a log y axis as plain numbers, minor ones unlabelled."""
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def log_axis(ax, ylim: tuple[float, float], ticks: Sequence[float]) -> None:
    """A log y axis over `ylim` with plain labels at those of `ticks` within it."""
    ax.set_yscale("log")
    plain_log_ticks(ax)
    ax.set_ylim(*ylim)
    ax.set_yticks([t for t in ticks if ylim[0] <= t <= ylim[1]])


def jax_label(openblas: bool = False) -> str:
    """`jax <version> <backend>`, then `, OPENBLAS_NUM_THREADS=<value>` if asked."""
    threads = f", OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}"
    return f"jax {jax.__version__} {jax.default_backend()}" + threads * openblas


def save(fig, path: Path, dpi: int = 120, **tight_layout) -> None:
    """`fig.tight_layout(**tight_layout)`, saved at `dpi`, then closed."""
    fig.tight_layout(**tight_layout)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


# No file of the repository is over this many lines: a result's JSON is laid out
# one entry a line down to the depth that keeps it within.
MAX_LINES = 400


def _key(key: Any) -> str:
    """A dict key as a JSON string: the text `json.dumps` gives a key of its kinds
    (`16` -> `"16"`, `True` -> `"true"`, `None` -> `"null"`), `str(key)` for any
    other (a tuple)."""
    try:
        (text,) = json.loads(json.dumps({key: None}))
    except TypeError:
        text = str(key)
    return json.dumps(text)


def _nested(obj: Any, depth: int, limit: int) -> str:
    pad = "  " * depth
    if depth >= limit or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, default=str)
    if isinstance(obj, dict):
        items = [f"{_key(k)}: {_nested(v, depth + 1, limit)}" for k, v in obj.items()]
        opening, closing = "{", "}"
    else:
        items = [_nested(v, depth + 1, limit) for v in obj]
        opening, closing = "[", "]"
    inner = ",\n".join(f"{pad}  {item}" for item in items)
    return f"{opening}\n{inner}\n{pad}{closing}"


def results_json(payload: Any) -> str:
    """`payload` as JSON, one entry a line down to the deepest level (at most 6)
    that keeps the text within `MAX_LINES` lines (the rest of each entry on its
    line). Keys that are not strings are written as `json.dumps` writes them
    (`{16: ...}` as `{"16": ...}`), so the text always parses."""
    for limit in range(6, 0, -1):
        text = _nested(payload, 0, limit) + "\n"
        if text.count("\n") <= MAX_LINES:
            return text
    return json.dumps(payload, default=str) + "\n"


def _missing_matplotlib(error: ImportError) -> bool:
    return (error.name or "").split(".")[0] == "matplotlib"


def write_results(
    out_dir: Path, name: str, payload: dict, plot: Callable | None
) -> None:
    """`<out_dir>/<name>.json` (the payload, see `results_json`), then
    `<out_dir>/<name>.png` (`plot(path)`). Where matplotlib cannot be imported (an
    accelerator machine without it) the JSON is still written and the plot skipped
    with a message.

    **Arguments:**

    - `out_dir`: the folder, created if missing.
    - `name`: the files' name, without suffix.
    - `payload`: what the JSON holds.
    - `plot`: a function of the PNG's path that draws and saves the figure, or
        None for no figure.

    **Returns:**

    Nothing.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / f"{name}.json", out_dir / f"{name}.png"
    json_path.write_text(results_json(payload))
    if plot is None:
        print(f"wrote {json_path}")
        return
    try:
        plot(png_path)
    except ImportError as error:
        if not _missing_matplotlib(error):
            raise
        print(f"wrote {json_path} (no plot: matplotlib is not installed)")
        return
    print(f"wrote {json_path} and {png_path}")
