"""What deciding costs: the seconds of `lxd.jit`'s own stages (trace, decide,
rewrite) per signature, from `lxd.jit(f).stage_seconds(...)` and in
`lxd.explain`'s report, with the rewrites it lists."""

import jax
import jax.numpy as jnp
import numpy as np

import lineax_dispatch as lxd

from ..helpers.roll_programs import (
    _MODELS,
    _operators,
    N,
    nested_dependent as _repeated,
    user_function,
)


def _once(x):
    return user_function(x) + 1.0


def test_stage_seconds_of_a_rewritten_program():
    x = jnp.linspace(0.1, 1.0, N)
    jitted = lxd.jit(_repeated)
    before = jitted.stage_seconds(x)
    assert set(before) == {"trace", "decide", "rewrite"}
    assert before["trace"] > 0 and before["decide"] > 0
    assert before["rewrite"] == 0  # rewritten at its lowering, not yet
    np.testing.assert_allclose(jitted(x), jax.jit(_repeated)(x), rtol=1e-6)
    after = jitted.stage_seconds(x)
    assert after["rewrite"] > 0
    # The trace and the decisions are those of the first: nothing traced again.
    assert (after["trace"], after["decide"]) == (before["trace"], before["decide"])
    # A copy: the program's own record does not change with it.
    after["rewrite"] = -1.0
    assert jitted.stage_seconds(x)["rewrite"] > 0


def test_a_call_once_is_left_as_traced():
    x = jnp.linspace(0.1, 1.0, N)
    jitted = lxd.jit(_once)
    jitted(x)
    seconds = jitted.stage_seconds(x)
    assert seconds["trace"] > 0 and seconds["rewrite"] >= 0
    assert lxd.explain(jitted, x).rewrites == ()


def test_explain_lists_the_rewrites_and_the_stages():
    x = jnp.linspace(0.1, 1.0, N)
    report = lxd.explain(_repeated, x)
    assert report.rows == ()
    (rewrite,) = report.rewrites
    assert "at 6 call sites: rolled into one loop body" in rewrite
    assert [name for name, _ in report.stage_seconds] == ["trace", "decide", "rewrite"]
    assert all(seconds > 0 for _, seconds in report.stage_seconds)
    text = str(report)
    assert "rewrites (lxd.jit):" in text
    assert "lxd.jit's own stages for this program: trace" in text

    op = _operators(lxd.Auto(cost_model=_MODELS["roll"]))[0]
    report = lxd.explain(lambda x: op.mv(op.mv(op.mv(x))), x)
    (row,) = report.rows
    assert row.decision.strategy == "Roll"
    (rewrite,) = report.rewrites
    assert rewrite.startswith("`mv` of FunctionLinearOperator at 3 call sites")

    lazy_model = lxd.CostModel(roll_fixed=1e3, materialise_fixed=1e3, outline_site=1e3)
    lazy = _operators(lxd.Auto(cost_model=lazy_model))[0]
    report = lxd.explain(lambda x: lazy.mv(lazy.mv(x)), x)
    assert report.rows[0].decision.strategy == "Lazy"
    assert report.rewrites == ()
    assert "rewrites" not in str(report)
