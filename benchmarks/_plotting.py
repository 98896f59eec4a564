"""Plotting helpers shared by the benchmark scripts (matplotlib, Agg backend)."""

import os
from pathlib import Path

import jax


def pyplot():
    """`matplotlib.pyplot` with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain_log_ticks(ax) -> None:
    """Major ticks of a log y axis as plain numbers, minor ones unlabelled."""
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def jax_label() -> str:
    """`jax <version> <backend>`."""
    return f"jax {jax.__version__} {jax.default_backend()}"


def openblas_label() -> str:
    return f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}"


def save(fig, path: Path, **tight_layout) -> None:
    """`fig.tight_layout(**tight_layout)`, saved at 120 dpi, then closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout(**tight_layout)
    fig.savefig(path, dpi=120)
    plt.close(fig)
