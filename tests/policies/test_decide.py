"""Auto's decision rule (`lxd.decide` over an `Observation`), memory budgets and
how the number of runs weighs run time against compile time."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch import _compat


def _obs(**kw):
    base = dict(
        kind="FunctionLinearOperator",
        in_size=256,
        out_size=256,
        dtype="float32",
        itemsize=4,
        memory_budget=10**9,
        call_sites=1,
        executions=1.0,
        mv_flops=2.0 * 256 * 256 * 32,
        mv_bytes=4.0 * 256 * 256 * 32,
        mv_dots=32,
        mv_ops=64,
        operator_bytes=4 * 256 * 256 * 32,
    )
    base.update(kw)
    return lxd.Observation(**base)


_EXPENSIVE_LARGE = dict(
    in_size=1024,
    out_size=1024,
    mv_flops=2.0 * 1024**2 * 32,
    mv_bytes=4.0 * 1024**2 * 32,
    operator_bytes=4 * 1024**2 * 32,
)


@pytest.mark.parametrize(
    "observation,expected",
    [
        # One site, run once, a large operator: inline.
        (_obs(**_EXPENSIVE_LARGE), "Lazy"),
        # A small dot-heavy operator: building its matrix (matrix-matrix products,
        # quick to compile) beats compiling its matrix-vector products.
        (_obs(), "Materialise"),
        # Explicit operators are applied as they are.
        (_obs(explicit=True, call_sites=16, executions=100.0), "Lazy"),
        # A cheap function (one small op) at several sites: inline.
        (
            _obs(
                call_sites=4,
                mv_dots=0,
                mv_ops=2,
                mv_flops=256,
                mv_bytes=2048,
                operator_bytes=0,
            ),
            "Lazy",
        ),
        # Expensive and large at many sites: one build beats 16 copies.
        (_obs(call_sites=16, executions=16.0, **_EXPENSIVE_LARGE), "Materialise"),
        # ... and with no room for the matrix, one outlined copy.
        (
            _obs(
                call_sites=16, executions=16.0, memory_budget=10**6, **_EXPENSIVE_LARGE
            ),
            "Outline",
        ),
        # Run thousands of times, each outlined call would hand over the weights.
        (
            _obs(
                call_sites=2,
                executions=2000.0,
                memory_budget=10**6,
                **_EXPENSIVE_LARGE,
            ),
            "Lazy",
        ),
        # Materialise over budget is never chosen.
        (_obs(call_sites=16, executions=16.0, memory_budget=10**5), "Outline"),
        # Solves: many iterations of an expensive mv pay for a build (at 64 the
        # two are within 1% under the default model).
        (_obs(executions=128.0, solves=1, **_EXPENSIVE_LARGE), "Materialise"),
        # Many vectors at once: lockstep, chunks, or one at a time.
        (_obs(batch=64), "VmapBatch"),
        (_obs(batch=64, memory_budget=100_000), "VmapBatch"),
        (_obs(batch=64, memory_budget=10), "Scan"),
    ],
)
def test_decide_table(observation, expected):
    # `Outline` as a host callback (jax 0.10's, and any JAX's if asked): the
    # table's figures are its.
    decision = lxd.decide(observation, _CALLBACK)
    assert decision.strategy == expected, decision.reasons
    assert decision.reasons and all(isinstance(r, str) for r in decision.reasons)


_CALLBACK = lxd.CostModel(outline_native=False)
_NATIVE = pytest.mark.skipif(
    _compat.XLA_OUTLINE is None, reason="needs jax.Inline.XLA_LATE (jax >= 0.11)"
)


@_NATIVE
def test_native_outline_estimates():
    """A native out-of-line call runs at the speed of an inline one; its compile
    time is one copy of `mv` plus `outline_clone` of a copy per further site: on
    XLA:CPU (1.0, a callee cloned per caller) no better than inline, so `Lazy`
    wins the tie; where the callee is compiled once (0.0), `Outline` wins where
    rolling cannot reach."""
    observation = _obs(
        call_sites=16, executions=16.0, memory_budget=10**6, **_EXPENSIVE_LARGE
    )
    cloned = lxd.decide(observation, lxd.CostModel(outline_native=True))
    estimates = {e.strategy: e for e in cloned.estimates}
    lazy, outline = estimates["Lazy"], estimates["Outline"]
    assert outline.compile_seconds == pytest.approx(lazy.compile_seconds)
    assert outline.run_seconds == pytest.approx(lazy.run_seconds)
    assert cloned.strategy == "Lazy", cloned.reasons
    once = lxd.decide(
        observation, lxd.CostModel(outline_native=True, outline_clone=0.0)
    )
    assert once.strategy == "Outline", once.reasons
    # The host callback pays for handing over the operator at every call.
    callback = {e.strategy: e for e in lxd.decide(observation, _CALLBACK).estimates}
    assert callback["Outline"].run_seconds > outline.run_seconds


def test_decide_unseen():
    """One call site of a program that is not read (a plain `jax.jit`): out of line
    only where natively so and a further site would save more than a site costs."""
    expensive = _obs(**_EXPENSIVE_LARGE)
    cheap = _obs(mv_dots=0, mv_ops=3)
    assert lxd.policies.decide_unseen(expensive, _CALLBACK).strategy == "Lazy"
    if _compat.XLA_OUTLINE is None:
        return
    native = lxd.CostModel(outline_native=True)
    assert lxd.policies.decide_unseen(expensive, native).strategy == "Lazy"
    once = lxd.CostModel(outline_native=True, outline_clone=0.0)
    decision = lxd.policies.decide_unseen(expensive, once)
    assert decision.strategy == "Outline", decision.reasons
    assert lxd.policies.decide_unseen(cheap, once).strategy == "Lazy"
    effects = _obs(mv_effects=True, **_EXPENSIVE_LARGE)
    assert lxd.policies.decide_unseen(effects, once).strategy == "Lazy"


def test_cost_model_outline_fields_are_checked():
    with pytest.raises(ValueError, match="outline_clone"):
        lxd.CostModel(outline_clone=1.5)
    with pytest.raises(TypeError, match="outline_native"):
        lxd.CostModel(outline_native="yes")  # pyright: ignore[reportArgumentType]
    if _compat.XLA_OUTLINE is None:
        with pytest.raises(ValueError, match="XLA_LATE"):
            lxd.CostModel(outline_native=True)
    assert lxd.CostModel().outline_native is (_compat.XLA_OUTLINE is not None)


def test_decide_budget_edges():
    o = _obs(call_sites=16, executions=1000.0)
    needed = lxd.decide(o).memory_needed
    assert needed > o.matrix_bytes
    # The peak with one column at a time is the least Materialise can need.
    at_edge = lxd.decide(_obs(call_sites=16, executions=1000.0, memory_budget=needed))
    assert at_edge.strategy == "Materialise"
    assert at_edge.policy.batch_size == 1
    below = lxd.decide(_obs(call_sites=16, executions=1000.0, memory_budget=needed - 1))
    assert below.strategy != "Materialise"
    assert any("budget" in r for r in below.reasons)


@pytest.mark.parametrize(
    "value,expected",
    [
        (1000, 1000),
        ("2GB", 2 * 10**9),
        ("512 MiB", 512 * 2**20),
        ("1.5e3", 1500),
        ("3kb", 3000),
        (2.5e9, 2_500_000_000),
    ],
)
def test_parse_memory_budget(value, expected):
    assert lxd.parse_memory_budget(value) == expected
    assert lxd.Auto(memory_budget=value).budget() == expected


@pytest.mark.parametrize("value", [0, -1, "0GB", "-2GB", "abc", "2XB", "", True, [1]])
def test_bad_memory_budget(value):
    with pytest.raises(ValueError, match="memory_budget"):
        lxd.Auto(memory_budget=value)


def test_default_budget_is_positive_and_default_policy_is_auto():
    assert lxd.Auto().budget() > 0
    op = lxd.MatrixLinearOperator(jnp.eye(3))
    assert op.policy == lxd.Auto()
    assert lxd.policies.default_policy() == lxd.Auto()


def test_explicit_materialise_over_budget_raises():
    op = lxd.FunctionLinearOperator(
        lambda x: 2 * x,
        jax.ShapeDtypeStruct((100,), jnp.float32),
        policy=lxd.Materialise(memory_budget=1000),
    )
    with pytest.raises(
        ValueError,
        match=r"needs .* over the memory budget of its `Materialise` policy: 1 KB",
    ):
        op.mv(jnp.ones(100, jnp.float32))


def test_runs_weigh_run_time():
    """Auto minimises compile + runs x run: a program run once may take a strategy
    that compiles faster and runs slower; one run 100 times may not."""
    observation = dict(
        memory_budget=1,
        call_sites=4,
        executions=4.0,
        mv_flops=3.1e6,
        mv_bytes=6.3e6,
        mv_dots=24,
        mv_ops=0,
        operator_bytes=6_300_000,
    )
    # `Outline` as a host callback: each call pays a round trip.
    assert lxd.decide(_obs(**observation, runs=1.0), _CALLBACK).strategy == "Outline"
    assert lxd.decide(_obs(**observation, runs=100.0), _CALLBACK).strategy == "Lazy"
    rolled = _obs(**observation, runs=100.0, rollable=True)
    assert lxd.decide(rolled).strategy == "Roll"
    with pytest.raises(ValueError, match="runs"):
        lxd.Auto(runs=0)


def test_an_operator_that_fits_the_cache_is_read_at_the_cache_rate():
    """A solve's Lazy run reads the operator's arrays at the cache's rate when they
    fit the last-level cache, at memory bandwidth otherwise; which one decides
    between Lazy and Materialise for a 32-layer n=256 operator solved 100 times."""
    layers = dict(
        mv_flops=2.0 * 256 * 256 * 64,
        mv_bytes=2 * 4.0 * 256 * 256 * 32,
        mv_dots=64,
        operator_bytes=4 * 256 * 256 * 32,
        executions=32.0,
        solves=1,
        runs=100.0,
    )
    rate = 1e10
    fits = lxd.CostModel(cache_bytes=2**25, cache_bytes_per_second=10 * rate)
    spills = lxd.CostModel(cache_bytes=2**20, cache_bytes_per_second=10 * rate)
    fits, spills = (
        eqx.tree_at(lambda m: m.bytes_per_second, m, rate) for m in (fits, spills)
    )
    for model, expected in ((fits, 10 * rate), (spills, rate)):
        lazy = lxd.decide(_obs(**layers), model).estimates[0]
        assert lazy.strategy == "Lazy"
        # One run: 32 mvs, each reading mv_bytes (flops are not the bound here).
        np.testing.assert_allclose(lazy.run_seconds, 32 * layers["mv_bytes"] / expected)
    assert lxd.decide(_obs(**layers), fits).strategy == "Lazy"
    assert lxd.decide(_obs(**layers), spills).strategy == "Materialise"


def test_an_mv_with_effects_or_that_vmap_cannot_batch():
    """An `mv` with effects runs them where the program applies it: neither a
    matrix build (on basis vectors) nor an out-of-line call; one `vmap` cannot
    batch is not materialised, and a block of vectors takes it one at a time."""
    outline_model = lxd.CostModel(
        outline_site=0.0,
        compile_per_site=1.0,
        materialise_fixed=1e3,
        outline_native=False,
    )
    assert lxd.decide(_obs(), lxd.CostModel()).strategy == "Materialise"
    assert lxd.decide(_obs(call_sites=8), outline_model).strategy == "Outline"
    with_effects = lxd.decide(_obs(mv_effects=True), lxd.CostModel())
    assert with_effects.strategy == "Lazy"
    assert any("effects" in reason for reason in with_effects.reasons)
    assert {e.strategy for e in with_effects.estimates if e.seconds is None} == {
        "Outline",
        "Materialise",
    }
    assert lxd.decide(_obs(call_sites=8, mv_effects=True), outline_model).strategy == (
        "Lazy"
    )
    unbatchable = lxd.decide(_obs(mv_batchable=False), lxd.CostModel())
    assert unbatchable.strategy == "Lazy"
    assert any("pure_callback" in reason for reason in unbatchable.reasons)
    for flags in (dict(mv_effects=True), dict(mv_batchable=False)):
        assert lxd.decide(_obs(batch=512, **flags)).strategy == "Scan"
    assert lxd.decide(_obs(batch=512)).strategy == "Materialise"


def test_a_solve_is_not_materialised_within_the_dense_product_s_rounding():
    """A dense matrix's product with a vector rounds as its inner products do (up
    to `n * eps`), whatever the user's `mv` computes: a solve whose tolerance is
    within that is not materialised (the matrix could keep it from an answer the
    user's `mv` reaches); with a looser tolerance, in float64, or without a stated
    one, it is."""
    solve = dict(executions=128.0, solves=1, **_EXPENSIVE_LARGE)
    assert lxd.decide(_obs(**solve)).strategy == "Materialise"
    # float32, n = 1024: a dense product rounds by up to 1024 * 1.2e-7 = 1.2e-4.
    tight = lxd.decide(_obs(solve_tolerance=1e-5, **solve))
    assert tight.strategy != "Materialise"
    (reason,) = [r for r in tight.reasons if r.startswith("Materialise not allowed")]
    assert "1e-05" in reason and "float32" in reason
    assert lxd.decide(_obs(solve_tolerance=1e-3, **solve)).strategy == "Materialise"
    wide = lxd.decide(_obs(solve_tolerance=1e-5, dtype="float64", itemsize=8, **solve))
    assert wide.strategy == "Materialise"
    # Plain call sites (no solve) are not bound by a tolerance.
    sites = dict(call_sites=16, executions=16.0, **_EXPENSIVE_LARGE)
    assert lxd.decide(_obs(solve_tolerance=1e-5, **sites)).strategy == "Materialise"
