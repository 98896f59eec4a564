"""This machine's `CostModel`: the constants that depend on the machine, scaled
by a few micro-measurements taken at first use and cached per machine.

`CostModel()`'s defaults were fitted on one 2-core XLA:CPU machine. A machine that
compiles twice as fast, or reads memory at half the rate, moves every break-even
point of the decision rule. At the first decision of `Auto` (or `AutoSolver`)
with no cost model of the user's, `machine_cost_model` times six small programs
(about a second in all on a CPU): a compile, a matrix-matrix product, a matrix-vector
product over a matrix larger than the cache and one within it, the steps of a
small loop, and the compile time of one more copy of a small Krylov loop. Each constant that measures the same thing is scaled by the ratio
of this machine's time to the reference machine's (the times in `_REFERENCE`,
taken with these functions on the machine the defaults were fitted on). The
result is written to a JSON file named by the machine (backend, device kind, CPU
model and count, jax and jaxlib versions) and read from there by every later
process on it.

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
import jax.lax as lax
import jax.numpy as jnp
import numpy as np

from ._model import CostModel


ENV = "LINEAX_DISPATCH_CALIBRATION"


# `loop_copy_s` on the reference machine: the median ratio of `loop_copy_s` to
# `compile_s` in five first-use calibrations on a 2-core Intel Xeon (XLA:CPU,
# jax 0.10.2), 0.186, times the reference machine's `compile_s`.
LOOP_COPY_REFERENCE = 0.186 * 4.99e-2


# The micro-measurements on the reference machine (2-core AMD EPYC, 32 MiB L3,
# XLA:CPU, jax 0.10.2: where `CostModel`'s defaults were fitted), each the median
# of seven first-use calibrations there (each in a fresh process; their spread:
# compile 0.87-1.14x the median, matmul 0.95-1.02x, stream 0.87-1.34x, cached
# 0.95-1.16x, step 0.88-1.22x).
_REFERENCE = {
    "compile_s": 4.99e-2,
    "matmul_s": 5.97e-4,
    "stream_s": 1.108e-3,
    "cached_s": 8.96e-5,
    "step_s": 1.47e-7,
    "loop_copy_s": LOOP_COPY_REFERENCE,
}


# Which constants each measurement scales: a time constant is multiplied by
# measured / reference, a rate divided by it.
_SCALES = {
    "compile_s": (
        "compile_per_dot",
        "compile_per_op",
        "compile_per_site",
        "compile_per_batched_dot",
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
}


# `CostModel`'s margins on a backend other than XLA:CPU, whose constants are the
# CPU fit scaled by the five measurements: per strategy, the largest factor by
# which its estimated gain over `Lazy` exceeded the measured one on the fit half
# of `benchmarks.realistic` on a TPU v5e (its `fitted_margins`, two rounds:
# benchmarks/results/tpu/realistic.json), rounded up.
ACCELERATOR_MARGINS = dict(departure_margin=4.2, materialise_margin=10.7)


def _margins(backend: str) -> dict[str, Any]:
    return {} if backend == "cpu" else dict(ACCELERATOR_MARGINS)


# A ratio outside these bounds is taken as a disturbed measurement and clipped.
# A loop's compiled copy is up to about 30 times the reference machine's on an
# accelerator (a TPU v5e: XLA compiles each copy of a while loop apart).
_RATIO_BOUNDS = (0.1, 10.0)
_LOOP_COPY_BOUNDS = (0.1, 100.0)


# The model once made or read in this context, with the setting it was made under:
# (setting, model). (The machine does not change within a process.)
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


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def measure() -> dict[str, float]:
    """Times the six micro-programs on the default device (the best of a few
    runs each; about a second in all on a 2-core CPU).

    **Returns:**

    Seconds: `compile_s` (XLA's compile of a small loop with two matrix-vector
    products and a dozen element-wise operations), `matmul_s` (a 512 x 512 matrix
    product at `Precision.HIGHEST`, as batched products run), `stream_s` (a product with a 4096 x 4096 `float32` matrix, 64 MiB),
    `cached_s` (32 products with a 256 x 256 matrix, in one loop), `step_s` (one
    step of a loop of products with a 64 x 64 matrix, whose bound XLA does not
    know) and `loop_copy_s` (the compile time of one more copy of a small Krylov
    loop in a program: what each copy of a repeated solve costs beyond its `mv`).
    """
    rng = np.random.default_rng(0)
    small = rng.standard_normal((64, 64)).astype(np.float32) / 8
    salt = float(int.from_bytes(os.urandom(3), "little"))

    def compile_once(i):
        # A constant unique to this call: no cache of XLA's or of JAX's answers.
        offset = np.float32(salt + i)

        def program(x):
            def body(carry):
                step, v = carry
                w = lax.tanh(small @ v) * offset + lax.sin(v)
                return step + 1, small.T @ (w * w) - 0.5 * v + lax.exp(-abs(v))

            return lax.while_loop(lambda c: c[0] < 10, body, (0, x))[1]

        return jax.jit(program).lower(np.ones(64, np.float32)).compile

    compiles = [compile_once(i) for i in range(3)]
    compile_s = min(_best(c, 1) for c in compiles)
    loop_copy_s = _loop_copy(small, salt)

    def run(fn, *args, repeats):
        args = jax.device_put(args)  # on the device once, not at every call
        compiled = jax.jit(fn).lower(*args).compile()
        return _best(lambda: compiled(*args), repeats)

    a = rng.standard_normal((512, 512)).astype(np.float32)
    # At the precision of the products a strategy batches (`_precision`): on an
    # accelerator float32's passes, slower than its default; XLA:CPU's is the same.
    highest = lax.Precision.HIGHEST
    matmul_s = run(lambda x, y: lax.dot(x, y, precision=highest), a, a, repeats=20)
    big = rng.standard_normal((4096, 4096)).astype(np.float32)
    stream_s = run(lambda m, v: m @ v, big, big[0], repeats=10)
    del big
    mid = rng.standard_normal((256, 256)).astype(np.float32) / 16

    def cached(m, v):
        return lax.fori_loop(0, 32, lambda _, x: m @ x + 0.5, v)

    cached_s = run(cached, mid, mid[0], repeats=10)

    def steps(m, v, count):
        # A bound known only at run time: a loop XLA runs step by step.
        def body(carry):
            i, x = carry
            return i + 1, m @ x + 0.5

        return lax.while_loop(lambda c: c[0] < count, body, (0, v))[1]

    step_s = run(steps, small, small[0], np.int32(1024), repeats=5) / 1024
    return dict(
        compile_s=compile_s,
        matmul_s=matmul_s,
        stream_s=stream_s,
        cached_s=cached_s,
        step_s=step_s,
        loop_copy_s=loop_copy_s,
    )


def _loop_copy(small: np.ndarray, salt: float) -> float:
    """Compile time of one more copy of an iterative solver's loop: programs of
    one and of four dependent `while` loops with a body as a Krylov step's (a
    product, two inner products, vector updates, a stopping test), each copy
    with a constant of its own; a third of the difference of the two (each the
    best of two compiles)."""

    def program_of(copies: int, tag: float):
        def program(x):
            for c in range(copies):
                offset = np.float32(tag + c)

                def body(carry):
                    i, v, r = carry
                    p = small @ v
                    alpha = jnp.vdot(r, r) / (jnp.vdot(p, v) + offset)
                    r = r - alpha * p
                    return i + 1, v + alpha * r, r

                def cond(carry):
                    i, _, r = carry
                    return (i < 10) & (jnp.vdot(r, r) > 1e-12)

                x = lax.while_loop(cond, body, (0, x, x))[1]
            return x

        return jax.jit(program).lower(np.ones(64, np.float32)).compile

    times = {}
    for copies in (1, 4):
        tags = (salt + 10 * copies, salt + 10 * copies + 5)
        times[copies] = min(_best(program_of(copies, t), 1) for t in tags)
    return max(times[4] - times[1], 0.0) / 3


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
        bounds = _LOOP_COPY_BOUNDS if name == "loop_copy_s" else _RATIO_BOUNDS
        ratio = float(np.clip(measured[name] / _REFERENCE[name], *bounds))
        for field in fields:
            value = getattr(base, field)
            changes[field] = value / ratio if "per_second" in field else value * ratio
    return dataclasses.replace(base, **changes)


def _describe(names: dict[str, str], measured: dict[str, float], path) -> str:
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
    return (
        f"calibrated for this machine ({names['backend']} {names['device_kind']}, "
        f"{names['cpu']}, {names['cpus']} cpus; times over the reference "
        f"machine's: {ratios}; margins over Lazy: {margins}; cached in {path})"
    )


def machine_cost_model() -> CostModel:
    """The cost model of `Auto` and `AutoSolver` where the user gave none: this
    machine's calibration (measured at its first use and cached per machine), or
    the fitted defaults where `LINEAX_DISPATCH_CALIBRATION=off`.

    **Returns:**

    A `CostModel`, whose `source` says which (as `lxd.explain` prints it).
    """
    setting = _setting()
    if setting == "off":
        margins = _margins(jax.default_backend())
        return CostModel(**margins, source=f"defaults ({ENV}=off)")
    held = _MODEL.get()
    if held is not None and held[0] == setting:
        return held[1]
    names = machine()
    key = _key(names)
    path = _cache_dir(setting) / f"calibration-{key}.json"
    measured = None
    try:
        stored = json.loads(path.read_text())
        if stored.get("machine") == names and set(stored["measured"]) == set(
            _REFERENCE
        ):
            measured = {k: float(v) for k, v in stored["measured"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        measured = None
    if measured is None:
        with jax.ensure_compile_time_eval():
            measured = measure()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            record = {"machine": names, "measured": measured, "time": time.time()}
            path.write_text(json.dumps(record, indent=1))
        except OSError:
            path = f"{path} (not written: not writable)"
    model = scaled_model(measured, _describe(names, measured, path))
    model = dataclasses.replace(model, **_margins(names["backend"]))
    _MODEL.set((setting, model))
    return model
