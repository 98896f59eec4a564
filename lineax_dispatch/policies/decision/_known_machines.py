"""Calibrations shipped for the device kinds measured often enough: on such a
device `machine_cost_model` takes the table below rather than timing its
micro-programs at the first decision (two to three seconds on a TPU v5e, paid by
the user's first program on every fresh machine).

On a TPU v5e the micro-measurements of one machine are noisy beside what they
stand for: over the 18 distinct calibrations recorded in `benchmarks/results/tpu/`
(one per fresh machine or cache, in `lxd.explain`'s text), `compile` ranged
1.34-2.15x the reference machine's, a loop's copy 2.3-6.1x and a batched product's
compile 0.00-1.12x, where the device kind, the host and the software were the
same. Their median is a better estimate of the next such machine than its own
first measurement, and costs nothing.
"""

from typing import Any


# Per (backend, device kind): each measurement of `_measure.measure` over the
# reference machine's, the median of the distinct calibrations on that kind
# recorded in `benchmarks/results/` (`tests/policies/test_known_machines.py`
# computes it again from those files and checks this table against it).
KNOWN_MACHINES: dict[tuple[str, str], dict[str, float]] = {
    ("tpu", "TPU v5 lite"): {
        "compile_s": 1.95,
        "matmul_s": 0.735,
        "stream_s": 0.535,
        "cached_s": 5.36,
        "step_s": 11.14,
        "loop_copy_s": 4.96,
        "batched_dot_s": 0.795,
    },
}


def known_ratios(names: dict[str, Any]) -> dict[str, float] | None:
    """The shipped ratios over the reference machine's for the machine `names`
    (as `_calibration.machine` gives them), or `None` where its device kind has
    none."""
    found = KNOWN_MACHINES.get((names["backend"], names["device_kind"]))
    return None if found is None else dict(found)
