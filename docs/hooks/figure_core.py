"""The registry of the documentation's figures (see `figures.py`): a figure is a
name and a function of the JSON files under `benchmarks/results/` that gives its
text ("11.59x", "0.85-1.04x"). Nothing here imports MkDocs or JAX."""

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# The device kind of the TPU results: their environment records the backend only.
TPU_KIND = "TPU v5e"
PLACEHOLDER = re.compile(r"\{\{ *([\w.]+) *\}\}")
_FIELD = re.compile(r"\{([\w.]+)\}")


@functools.cache
def load(name: str) -> dict:
    """`benchmarks/results/<name>.json`."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def dig(name: str, *keys):
    """`load(name)[keys[0]][keys[1]]...`."""
    data = load(name)
    for key in keys:
        data = data[key]
    return data


# ------------------------------------------------------------------ formats


def x(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}x"


def span(values, digits: int = 2, unit: str = "x") -> str:
    """`lo-hi` with the unit once ("0.85-1.04x"), or one value where they agree."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def ms(seconds: float, digits: int = 1) -> str:
    return f"{seconds * 1e3:.{digits}f} ms"


def backend(name: str) -> str:
    """Where a results file was measured: "CPU, 2 cores" or "TPU v5e"."""
    env = load(name)["environment"]
    if env["jax_backend"] == "cpu":
        return f"CPU, {env['cpu_count']} cores"
    return env.get("device_kind") or TPU_KIND


# ------------------------------------------------------------------ figures

# name -> (results file, function giving the text)
FIGURES: dict[str, tuple[str, Callable[[], str]]] = {}


def figure(name: str, source: str):
    def register(fn):
        assert name not in FIGURES, name
        FIGURES[name] = (source, fn)
        return fn

    return register


def value(name: str) -> str:
    """The text of the figure `name`."""
    return FIGURES[name][1]()


def at(name: str, source: str, keys: tuple, fmt: Callable = None) -> None:
    """Registers the figure `name`: `fmt(dig(source, *keys))`."""
    fmt = fmt or x
    figure(name, source)(lambda: fmt(dig(source, *keys)))


def fill(text: str) -> str:
    """`text` with each `{name}` replaced by the figure's text."""
    return _FIELD.sub(lambda m: value(m.group(1)), text)
