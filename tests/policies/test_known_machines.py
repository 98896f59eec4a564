"""Calibrations shipped per device kind: a TPU v5e takes its table and measures
nothing; the table is the median of the calibrations recorded in
`benchmarks/results/`, computed again here from those files."""

import collections
import contextvars
import re
import statistics
from pathlib import Path

import pytest

import lineax_dispatch as lxd
from lineax_dispatch.policies.decision import (
    _calibration as calibration,
    _known_machines as known,
)


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
# `lxd.explain`'s text of a measured calibration (a shipped one is not "cached").
RECORDED = re.compile(
    r"calibrated for this machine \((\w+) ([^,]+), [^;]*; times over the "
    r"reference machine's: ([^;]*);[^)]*; cached in "
)


def _recorded() -> dict[tuple[str, str], set[str]]:
    """Per (backend, device kind), the distinct ratio lists recorded."""
    found = collections.defaultdict(set)
    for path in RESULTS.rglob("*"):
        if path.suffix not in (".json", ".log", ".txt"):
            continue
        for match in RECORDED.finditer(path.read_text(errors="replace")):
            found[match.group(1), match.group(2)].add(match.group(3))
    return found


def test_the_table_is_the_median_of_the_recorded_calibrations():
    recorded = _recorded()
    for kind, table in known.KNOWN_MACHINES.items():
        lists = recorded[kind]
        assert len(lists) >= 10, (kind, len(lists))
        ratios = collections.defaultdict(list)
        for text in lists:
            for part in text.split(", "):
                name, value = part.split(" x")
                ratios[name + "_s"].append(float(value))
        assert set(table) == set(calibration._REFERENCE)
        for name, value in table.items():
            assert value == pytest.approx(statistics.median(ratios[name])), name


def test_a_known_device_kind_measures_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(calibration.ENV, str(tmp_path))
    names = dict(calibration.machine(), backend="tpu", device_kind="TPU v5 lite")
    monkeypatch.setattr(calibration, "machine", lambda: names)

    def measure():
        raise AssertionError("measured a device kind with a shipped calibration")

    monkeypatch.setattr(calibration, "measure", measure)
    model = contextvars.copy_context().run(lxd.policies.machine_cost_model)
    table = known.KNOWN_MACHINES["tpu", "TPU v5 lite"]
    base = lxd.CostModel()
    step = min(table["step_s"], calibration._RATIO_BOUNDS[1])  # clipped as measured
    assert model.krylov_step == pytest.approx(base.krylov_step * step)
    assert model.flops_per_second == pytest.approx(
        base.flops_per_second / table["matmul_s"]
    )
    assert "shipped for this device kind" in model.source
    assert "TPU v5 lite" in model.source
    assert not list(tmp_path.iterdir())  # no cache written
    # Another device kind of the same backend is measured.
    monkeypatch.setattr(calibration, "machine", lambda: dict(names, device_kind="x"))
    with pytest.raises(AssertionError, match="measured"):
        contextvars.copy_context().run(lxd.policies.machine_cost_model)
