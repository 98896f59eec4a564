"""This machine's cost model: micro-measurements at first use, cached per machine,
scaling the constants that depend on the machine; `lxd.explain` says which model
it used."""

import contextvars
import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.policies.decision import _calibration as calibration


def _fresh(fn):
    """`fn()` in a context of its own (no model made or read before)."""
    return contextvars.copy_context().run(fn)


def _times(factor: float) -> dict[str, float]:
    return {name: factor * value for name, value in calibration._REFERENCE.items()}


def _fake(monkeypatch, measured):
    calls = []

    def measure():
        calls.append(1)
        return dict(measured)

    monkeypatch.setattr(calibration, "measure", measure)
    return calls


def test_off_keeps_the_fitted_defaults(monkeypatch):
    monkeypatch.setenv(calibration.ENV, "off")
    model = _fresh(lxd.policies.machine_cost_model)
    defaults = lxd.CostModel()
    for field in dataclasses.fields(defaults):
        if field.name != "source":
            assert getattr(model, field.name) == getattr(defaults, field.name)
    assert "off" in model.source


def test_scales_each_constant_by_its_measurement_and_caches_it(monkeypatch, tmp_path):
    monkeypatch.setenv(calibration.ENV, str(tmp_path))
    measured = _times(1.0)
    measured["compile_s"] *= 2.0  # compiles at half the reference's speed
    measured["stream_s"] *= 4.0  # reads memory at a quarter
    calls = _fake(monkeypatch, measured)
    model = _fresh(lxd.policies.machine_cost_model)
    defaults = lxd.CostModel()
    assert calls == [1]
    assert model.compile_per_dot == pytest.approx(2 * defaults.compile_per_dot)
    assert model.krylov_compile == pytest.approx(2 * defaults.krylov_compile)
    assert model.bytes_per_second == pytest.approx(defaults.bytes_per_second / 4)
    assert model.flops_per_second == pytest.approx(defaults.flops_per_second)
    assert model.build_chunk == defaults.build_chunk
    assert "calibrated" in model.source and str(tmp_path) in model.source
    (path,) = tmp_path.glob("calibration-*.json")
    assert json.loads(path.read_text())["machine"] == calibration.machine()
    # A later process on this machine reads the file and measures nothing.
    again = _fresh(lxd.policies.machine_cost_model)
    assert calls == [1]
    assert again.compile_per_dot == model.compile_per_dot
    # Within one context the model is made once.
    assert _fresh(lambda: lxd.policies.machine_cost_model() is not None)


def test_a_disturbed_measurement_is_clipped(monkeypatch, tmp_path):
    monkeypatch.setenv(calibration.ENV, str(tmp_path))
    _fake(monkeypatch, _times(1000.0))
    model = _fresh(lxd.policies.machine_cost_model)
    assert model.compile_per_site == pytest.approx(
        10 * lxd.CostModel().compile_per_site
    )
    # A loop's copy may cost tens of times the reference's (an accelerator that
    # compiles each copy apart): clipped at 100.
    assert model.solve_copy == pytest.approx(100 * lxd.CostModel().solve_copy)
    assert model.compile_per_batched_dot == pytest.approx(
        100 * lxd.CostModel().compile_per_batched_dot
    )


def test_a_repeated_solve_costs_what_a_loops_copy_measures(monkeypatch, tmp_path):
    # A TPU v5e compiles each copy of a Krylov loop apart: about 30 times the
    # reference machine's copy, where its compile of one program is about twice.
    monkeypatch.setenv(calibration.ENV, str(tmp_path))
    measured = _times(1.0)
    measured["compile_s"] *= 2.0
    measured["loop_copy_s"] *= 30.0
    _fake(monkeypatch, measured)
    model = _fresh(lxd.policies.machine_cost_model)
    defaults = lxd.CostModel()
    assert model.solve_copy == pytest.approx(30 * defaults.solve_copy)
    assert model.roll_fixed == pytest.approx(2 * defaults.roll_fixed)
    assert model.compile_per_dot == pytest.approx(2 * defaults.compile_per_dot)


def test_a_corrupt_or_foreign_cache_is_measured_again(monkeypatch, tmp_path):
    monkeypatch.setenv(calibration.ENV, str(tmp_path))
    calls = _fake(monkeypatch, _times(1.0))
    _fresh(lxd.policies.machine_cost_model)
    (path,) = tmp_path.glob("calibration-*.json")
    path.write_text("{not json")
    _fresh(lxd.policies.machine_cost_model)
    assert calls == [1, 1]
    record = json.loads(path.read_text())
    record["machine"]["cpu"] = "another machine"
    path.write_text(json.dumps(record))
    _fresh(lxd.policies.machine_cost_model)
    assert calls == [1, 1, 1]


def test_an_unwritable_cache_still_gives_the_model(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(calibration.ENV, str(blocker / "cache"))
    _fake(monkeypatch, _times(2.0))
    model = _fresh(lxd.policies.machine_cost_model)
    assert "not written" in model.source
    assert model.compile_per_op == pytest.approx(2 * lxd.CostModel().compile_per_op)


def test_an_empty_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(calibration.ENV, " ")
    with pytest.raises(ValueError, match=calibration.ENV):
        _fresh(lxd.policies.machine_cost_model)


def test_measures_this_machine_during_a_trace(monkeypatch, tmp_path):
    # The first decision is taken while a program is traced: the measurement runs
    # its own compiled programs there, on concrete arrays.
    monkeypatch.setenv(calibration.ENV, str(tmp_path))
    seen = []

    def f(x):
        seen.append(lxd.policies.machine_cost_model())
        return 2 * x

    assert _fresh(lambda: float(jax.jit(f)(jnp.float32(1.0)))) == 2.0
    (model,) = seen
    (path,) = tmp_path.glob("calibration-*.json")
    measured = json.loads(path.read_text())["measured"]
    assert set(measured) == set(calibration._REFERENCE)
    assert all(math.isfinite(v) and v > 0 for v in measured.values())
    assert 0 < model.flops_per_second < math.inf


def test_auto_uses_this_machine_s_model_unless_given_one(monkeypatch, tmp_path):
    monkeypatch.setenv(calibration.ENV, str(tmp_path))
    _fake(monkeypatch, _times(3.0))
    given = lxd.CostModel(compile_per_dot=0.5)
    assert _fresh(lambda: lxd.Auto(cost_model=given).model()) is given
    model = _fresh(lambda: lxd.Auto().model())
    assert model.roll_site == pytest.approx(3 * lxd.CostModel().roll_site)
    assert _fresh(lambda: lxd.AutoSolver().model()).roll_site == model.roll_site


def test_explain_says_which_cost_model_decided(monkeypatch, tmp_path):
    structure = jax.ShapeDtypeStruct((16,), jnp.float32)
    x = jnp.ones(16, jnp.float32)
    monkeypatch.setenv(calibration.ENV, "off")
    op = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Auto())
    report = _fresh(lambda: lxd.explain(lambda v: op.mv(op.mv(v)), x))
    assert report.cost_models == (f"defaults ({calibration.ENV}=off)",)
    assert f"cost model: defaults ({calibration.ENV}=off)" in str(report)
    given = lxd.Auto(cost_model=lxd.CostModel(source="mine"))
    mine = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=given)
    assert "cost model: mine" in str(lxd.explain(mine))
    monkeypatch.setenv(calibration.ENV, str(tmp_path))
    _fake(monkeypatch, _times(1.0))
    report = _fresh(lambda: lxd.explain(lambda v: op.mv(op.mv(v)), x))
    (source,) = report.cost_models
    assert source.startswith("calibrated for this machine") and str(tmp_path) in source


def test_cost_model_source_must_be_a_string():
    with pytest.raises(TypeError, match="source"):
        lxd.CostModel(source=3)


def test_on_a_tpu_a_repeated_solve_costs_at_least_what_the_fit_there_found(
    monkeypatch, tmp_path
):
    # XLA:TPU compiles each copy of a solve's loop apart, in more time than the
    # calibration's small Krylov loop measures: on a TPU `solve_copy` is at least
    # `TPU_SOLVE_COPY` (fitted there) at this machine's compile ratio; elsewhere,
    # and where the loop's copy measures more, the measurement stands.
    monkeypatch.setenv(calibration.ENV, str(tmp_path))
    names = dict(calibration.machine(), backend="tpu")
    monkeypatch.setattr(calibration, "machine", lambda: names)
    measured = _times(1.0)
    measured["compile_s"] *= 2.0
    _fake(monkeypatch, measured)
    model = _fresh(lxd.policies.machine_cost_model)
    assert model.solve_copy == pytest.approx(2 * calibration.TPU_SOLVE_COPY)
    assert model.departure_margin == calibration.TPU_MARGINS["departure_margin"]
    assert "fitted on a TPU" in model.source
    measured["loop_copy_s"] *= 100.0
    _fake(monkeypatch, measured)
    for path in tmp_path.glob("calibration-*.json"):
        path.unlink()
    model = _fresh(lxd.policies.machine_cost_model)
    assert model.solve_copy == pytest.approx(100 * lxd.CostModel().solve_copy)
    monkeypatch.setattr(calibration, "machine", lambda: dict(names, backend="gpu"))
    for path in tmp_path.glob("calibration-*.json"):
        path.unlink()
    measured["loop_copy_s"] /= 100.0
    _fake(monkeypatch, measured)
    model = _fresh(lxd.policies.machine_cost_model)
    assert model.solve_copy == pytest.approx(lxd.CostModel().solve_copy)
