"""This machine's `CostModel`: the constants that depend on the machine, scaled
by a few micro-measurements taken at first use and cached per machine.

`CostModel()`'s defaults were fitted on one 2-core XLA:CPU machine. A machine that
compiles twice as fast, or reads memory at half the rate, moves every break-even
point of the decision rule. At the first decision of `Auto` (or `AutoSolver`)
with no cost model of the user's, `machine_cost_model` times seven small programs
(about two seconds in all on a 2-core CPU): a compile, a matrix-matrix product, a matrix-vector
product over a matrix larger than the cache and one within it, the steps of a
small loop, and the compile times of one more copy of a small Krylov loop and of
one more batched product. Each constant that measures the same thing is scaled by the ratio
of this machine's time to the reference machine's (the times in `_REFERENCE`,
taken with these functions on the machine the defaults were fitted on). The
result is written to a JSON file named by the machine (backend, device kind, CPU
model and count, jax and jaxlib versions) and read from there by every later
process on it. A device kind with a calibration shipped in `_known_machines` (a
TPU v5e) takes that instead, measuring nothing.

The environment variable `LINEAX_DISPATCH_CALIBRATION` selects: `on` (the
default; the cache in `$XDG_CACHE_HOME/lineax_dispatch`, else
`~/.cache/lineax_dispatch`), `off` (the fitted defaults, as on the reference
machine: what the tests use, so that no decision they check depends on the
machine) or a directory to keep the cache in."""

import contextvars
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ._known_machines import known_ratios
from ._measure import measure
from ._model import CostModel


ENV = "LINEAX_DISPATCH_CALIBRATION"


# `loop_copy_s` on the reference machine: the median ratio of `loop_copy_s` to
# `compile_s` in first-use calibrations on a 2-core Intel Xeon (XLA:CPU, jax
# 0.10.2), 0.19, times the reference machine's `compile_s`.
LOOP_COPY_REFERENCE = 0.19 * 4.99e-2
# `batched_dot_s` likewise: its median ratio to `compile_s` there, 0.246.
BATCHED_DOT_REFERENCE = 0.246 * 4.99e-2


# The micro-measurements on the reference machine (2-core AMD EPYC, 32 MiB L3,
# XLA:CPU, jax 0.10.2: where `CostModel`'s defaults were fitted), each the median
# of seven first-use calibrations there, each in a fresh process.
_REFERENCE = {
    "compile_s": 4.99e-2,
    "matmul_s": 5.97e-4,
    "stream_s": 1.108e-3,
    "cached_s": 8.96e-5,
    "step_s": 1.47e-7,
    "loop_copy_s": LOOP_COPY_REFERENCE,
    "batched_dot_s": BATCHED_DOT_REFERENCE,
}


# Which constants each measurement scales: a time constant is multiplied by
# measured / reference, a rate divided by it.
_SCALES = {
    "compile_s": (
        "compile_per_dot",
        "compile_per_op",
        "compile_per_site",
        "materialise_fixed",
        "outline_site",
        "matmul_site",
        "krylov_compile",
        "roll_fixed",
        "roll_site",
        "inline_compile",
        "fused_test_compile",
        "update_cond_compile",
        "compile_per_constant_byte",
    ),
    "matmul_s": ("flops_per_second", "factor_flops_per_second"),
    "stream_s": ("bytes_per_second", "callback_bytes_per_second"),
    "cached_s": ("cache_bytes_per_second",),
    "step_s": ("krylov_step", "roll_step", "outline_call", "refresh_pass"),
    "loop_copy_s": ("solve_copy",),
    "batched_dot_s": ("compile_per_batched_dot",),
}


# `CostModel`'s margins on a backend other than XLA:CPU, whose constants are the
# CPU fit scaled by the measurements: per strategy, the largest factor by
# which its estimated gain over `Lazy` exceeded the measured one on the fit half
# of `benchmarks.realistic` on a TPU v5e (its `fitted_margins`, two rounds:
# benchmarks/results/tpu/realistic.json), rounded up. They stand for an
# accelerator whose own fit half has not been measured (a GPU).
ACCELERATOR_MARGINS = dict(departure_margin=4.2, materialise_margin=10.7)

# On a TPU, `Roll`'s margin (`departure_margin`: `Outline` does not run there) as
# `benchmarks.fit_cost_model` fitted it on the TPU's fit half of
# `benchmarks.families` since `Roll` rolls there what it stacked before
# (`_precision.stacking_keeps_cost`; benchmarks/results/tpu/families.json): 1,
# with the constants and alone (`--margins-only`: tpu/cost_model_fit*.json),
# where the fixed `Roll` scored 1.00 median / 1.34 worst over the best policy
# (compile + 1 run) and `Lazy` 1.25 / 2.11. `Materialise` keeps the margin above
# (the margins alone fitted it at 8).
TPU_MARGINS = dict(ACCELERATOR_MARGINS, departure_margin=1.0)


def _margins(backend: str) -> dict[str, Any]:
    if backend == "cpu":
        return {}
    return dict(TPU_MARGINS if backend == "tpu" else ACCELERATOR_MARGINS)


# `CostModel.solve_copy` on a TPU, at the reference machine's compile speed (it is
# scaled by this machine's `compile_s` ratio): each further CG solve of a cheap
# operator added about 0.18 s to a program's compile on a TPU v5e whose compile
# ratio was 2.11, beyond its copy of `mv` (the fit half of `benchmarks.families`
# there, `benchmarks/results/tpu/families.json`: the stencil and Gauss-Newton
# families at n = 64, one solve against four, `Lazy` and plain lineax alike).
# XLA:TPU compiles each copy of a solve's loop apart, and the calibration's copy
# of a small Krylov loop (`loop_copy_s`) measured a tenth to a quarter of that.
TPU_SOLVE_COPY = 0.085


def _fitted_on_backend(
    model: CostModel, backend: str, compile_ratio: float
) -> CostModel:
    """`model` with the constants fitted on `backend` itself where the micro-
    measurements miss them: on a TPU, a repeated solve's copy (`TPU_SOLVE_COPY`,
    scaled by this machine's `compile_ratio`) where the measured loop copy gives
    less."""
    if backend != "tpu":
        return model
    solve_copy = max(model.solve_copy, TPU_SOLVE_COPY * compile_ratio)
    return dataclasses.replace(model, solve_copy=solve_copy)


# A ratio outside these bounds is taken as a disturbed measurement and clipped.
# Those of a loop's copy and of a batched product's compile, which an accelerator
# may take tens of times the reference machine's for (a TPU v5e compiles each copy
# of a while loop apart, and a float32 product at `HIGHEST` as several passes), are
# clipped wider.
_RATIO_BOUNDS = (0.1, 10.0)
_WIDE_BOUNDS = (0.1, 100.0)
_WIDE = ("loop_copy_s", "batched_dot_s")


# The model once made or read in this context, with the setting it was made under:
# (setting, model). (The machine does not change within a process.) A context
# variable: `Auto.mv` is called by lineax with no argument to carry the model.
_MODEL: contextvars.ContextVar[tuple[str, CostModel] | None] = contextvars.ContextVar(
    "lineax_dispatch_machine_cost_model", default=None
)


def _setting() -> str:
    value = os.environ.get(ENV, "on").strip()
    if not value:
        raise ValueError(
            f"The environment variable {ENV} must be `on`, `off` or a directory for "
            "the calibration's cache; got an empty string."
        )
    return value


def _cache_dir(setting: str) -> Path:
    if setting != "on":
        return Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lineax_dispatch"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, str]:
    """What names this machine's calibration: backend, device kind, CPU model and
    count, jax and jaxlib versions.

    **Returns:**

    A dict of strings.
    """
    device = jax.devices()[0]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    return {
        "backend": jax.default_backend(),
        "device_kind": str(device.device_kind),
        "devices": str(jax.device_count()),
        "cpu": _cpu_model(),
        "cpus": str(cpus or os.cpu_count()),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
    }


def _key(names: dict[str, str]) -> str:
    text = json.dumps(names, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _ratio(measured: dict[str, float], name: str) -> float:
    """This machine's measurement `name` over the reference machine's, clipped."""
    bounds = _WIDE_BOUNDS if name in _WIDE else _RATIO_BOUNDS
    return float(np.clip(measured[name] / _REFERENCE[name], *bounds))


def scaled_model(measured: dict[str, float], source: str) -> CostModel:
    """`CostModel()` with each machine-dependent constant scaled by this machine's
    measurement over the reference machine's (clipped to 0.1-10x).

    **Arguments:**

    - `measured`: as returned by `measure`.
    - `source`: the model's `source`, for `lxd.explain`.

    **Returns:**

    A `CostModel`.
    """
    base = CostModel()
    changes: dict = {"source": source}
    for name, fields in _SCALES.items():
        ratio = _ratio(measured, name)
        for field in fields:
            value = getattr(base, field)
            changes[field] = value / ratio if "per_second" in field else value * ratio
    return dataclasses.replace(base, **changes)


def _describe(names: dict[str, str], measured: dict[str, float], where: str) -> str:
    margins = (
        ", ".join(
            f"{k.removesuffix('_margin')} x{v:g}"
            for k, v in _margins(names["backend"]).items()
        )
        or "none (the constants' own machine kind)"
    )
    ratios = ", ".join(
        f"{name.removesuffix('_s')} x{measured[name] / _REFERENCE[name]:.2f}"
        for name in _SCALES
    )
    fitted = (
        "; a repeated solve's copy as fitted on a TPU"
        if names["backend"] == "tpu"
        else ""
    )
    kind = "machine" if where.startswith("cached") else "device kind"
    return (
        f"calibrated for this {kind} ({names['backend']} {names['device_kind']}, "
        f"{names['cpu']}, {names['cpus']} cpus; times over the reference "
        f"machine's: {ratios}; margins over Lazy: {margins}{fitted}; {where})"
    )


def _measured_here(names: dict[str, str], setting: str) -> tuple[dict[str, float], str]:
    """This machine's micro-measurements, read from its cache file (in the
    directory `setting` names) or measured now and written there, and where they
    are kept (for `lxd.explain`)."""
    path = _cache_dir(setting) / f"calibration-{_key(names)}.json"
    try:
        stored = json.loads(path.read_text())
        if stored.get("machine") == names and set(stored["measured"]) == set(
            _REFERENCE
        ):
            return {k: float(v) for k, v in stored["measured"].items()}, (
                f"cached in {path}"
            )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    with jax.ensure_compile_time_eval():
        measured = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"machine": names, "measured": measured, "time": time.time()}
        path.write_text(json.dumps(record, indent=1))
    except OSError:
        return measured, f"cached in {path} (not written: not writable)"
    return measured, f"cached in {path}"


def machine_cost_model() -> CostModel:
    """The cost model of `Auto` and `AutoSolver` where the user gave none: the
    calibration shipped for this device kind where there is one
    (`_known_machines`), else this machine's (measured at its first use and
    cached per machine); the fitted defaults where
    `LINEAX_DISPATCH_CALIBRATION=off`.

    **Returns:**

    A `CostModel`, whose `source` says which (as `lxd.explain` prints it).
    """
    setting = _setting()
    if setting == "off":
        backend = jax.default_backend()
        model = _fitted_on_backend(CostModel(), backend, 1.0)
        source = f"defaults ({ENV}=off)"
        return dataclasses.replace(model, **_margins(backend), source=source)
    held = _MODEL.get()
    if held is not None and held[0] == setting:
        return held[1]
    names = machine()
    known = known_ratios(names)
    if known is not None:
        measured = {name: known[name] * _REFERENCE[name] for name in _REFERENCE}
        where = "shipped for this device kind: the median of its recorded calibrations"
    else:
        measured, where = _measured_here(names, setting)
    model = scaled_model(measured, _describe(names, measured, where))
    compile_ratio = _ratio(measured, "compile_s")
    model = _fitted_on_backend(model, names["backend"], compile_ratio)
    model = dataclasses.replace(model, **_margins(names["backend"]))
    _MODEL.set((setting, model))
    return model
