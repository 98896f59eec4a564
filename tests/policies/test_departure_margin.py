"""`CostModel.departure_margin`: `Auto` departs from lineax's behaviour (`Lazy`)
only where a strategy is estimated more than the margin cheaper, and the machine's
model sets the margin from the backend (1 on XLA:CPU, where the constants were
fitted; more on an accelerator, where they are scaled from the CPU's)."""

import dataclasses

import jax
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.policies.decision import _calibration
from lineax_dispatch.policies.decision._observation import Observation
from lineax_dispatch.policies.decision._rule import decide


def _observation(call_sites: int) -> Observation:
    # An expensive mv at `call_sites` dependent top-level sites, no room to build.
    return Observation(
        kind="FunctionLinearOperator",
        dtype="float32",
        in_size=256,
        out_size=256,
        itemsize=4,
        memory_budget=1000,
        call_sites=call_sites,
        executions=float(call_sites),
        rollable=True,
        mv_flops=2e6,
        mv_bytes=4e6,
        mv_dots=16,
        mv_ops=32,
    )


def _gain(decision) -> float:
    seconds = {e.strategy: e.seconds for e in decision.estimates}
    return seconds["Lazy"] / seconds[decision.strategy]


def test_margin_keeps_lazy_below_it_and_departs_above_it():
    model = lxd.CostModel()
    for sites in (2, 3, 4, 8, 16, 32):
        plain = decide(_observation(sites), model)
        if plain.strategy == "Lazy":
            continue
        gain = _gain(plain)
        assert gain > 1.0
        field = (
            "materialise_margin"
            if plain.strategy == "Materialise"
            else "departure_margin"
        )
        below = dataclasses.replace(model, **{field: gain * 1.01})
        kept = decide(_observation(sites), below)
        assert kept.strategy == "Lazy"
        assert "measured error" in kept.reasons[-1]
        above = dataclasses.replace(model, **{field: max(gain * 0.99, 1.0)})
        assert decide(_observation(sites), above).strategy == plain.strategy
    assert decide(_observation(32), model).strategy != "Lazy"


def test_margin_is_checked():
    with pytest.raises(ValueError, match="departure_margin"):
        lxd.CostModel(departure_margin=0.5)
    with pytest.raises(ValueError, match="materialise_margin"):
        lxd.CostModel(materialise_margin=0.9)
    with pytest.raises((TypeError, ValueError), match="departure_margin"):
        lxd.CostModel(departure_margin="3")


@pytest.mark.parametrize("backend", ["cpu", "tpu", "gpu"])
def test_machine_model_sets_margins_from_backend(monkeypatch, backend):
    monkeypatch.setenv(_calibration.ENV, "off")
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    model = lxd.Auto().model()
    if backend == "cpu":
        assert model.margins() == dict(Roll=1.0, Outline=1.0, Materialise=1.0)
    elif backend == "tpu":
        # fitted on the TPU's fit half: `Roll` at no margin, `Materialise` above 1
        margins = _calibration.TPU_MARGINS
        assert model.departure_margin == margins["departure_margin"] == 1.0
        assert model.materialise_margin == margins["materialise_margin"] > 1.0
    else:
        margins = _calibration.ACCELERATOR_MARGINS
        assert model.departure_margin == margins["departure_margin"] > 1.0
        assert model.materialise_margin == margins["materialise_margin"] > 1.0
