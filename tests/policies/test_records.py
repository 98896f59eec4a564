"""The records lineax-dispatch hands back are typed: cost analyses, estimates,
solver choices; and budgets are parsed once and compared by value."""

import contextvars

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.policies import Estimate, mv_cost, MvCost
from lineax_dispatch.policies._policy_interface import with_top_policy


def _op(policy=None):
    structure = jax.ShapeDtypeStruct((32,), jnp.float32)
    return lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=policy)


def test_mv_cost_returns_a_typed_record():
    cost = mv_cost(_op())
    assert isinstance(cost, MvCost)
    assert cost.flops > 0 and cost.bytes > 0
    assert cost.source in ("cost_analysis", "jaxpr")
    assert cost.workspace > 0 and cost.constant_bytes >= 0
    assert cost.dots + cost.ops > 0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.complex64])
def test_mv_cost_from_the_jaxpr_is_xlas_where_it_is_not_lowered(dtype):
    # A function of dot products, sums, products and negations whose arrays are
    # arguments is counted from its jaxpr (no lowering): its figures must be those
    # of XLA's cost analysis.
    weights = tuple(jnp.full((24, 24), 0.1 * (i + 1), dtype) for i in range(3))
    scale = jnp.arange(24, dtype=dtype)

    def fn(weights, scale, x):
        for layer in weights:
            x = -(layer @ x) * scale + x
        return x - scale * x

    structure = jax.ShapeDtypeStruct((24,), dtype)
    op = lxd.FunctionLinearOperator(eqx.Partial(fn, weights, scale), structure)
    cost = mv_cost(op)
    assert cost.source == "jaxpr"
    analysis = jax.jit(fn).lower(weights, scale, structure).cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0]
    assert cost.flops == analysis["flops"]
    assert cost.bytes == analysis["bytes accessed"]
    # Arrays closed over (constants of the jaxpr, not closure-converted) that the
    # function reads as they are: counted from the jaxpr too, as the same arrays
    # passed as arguments. (XLA's analysis of a module holding them as constants
    # adds their bytes once more, as if each were written.)
    closed = lambda x: fn(weights, scale, x)  # noqa: E731
    op = lxd.FunctionLinearOperator(closed, structure, closure_convert=False)
    from_constants = mv_cost(op)
    assert from_constants.source == "jaxpr"
    assert from_constants.flops == analysis["flops"]
    assert from_constants.bytes == analysis["bytes accessed"]
    # Other primitives, or a computation from the constants alone (XLA folds it:
    # `layer + layer.T` here), are lowered for XLA's figures.
    folded = lambda x: sum((w + w.T) @ x for w in weights)  # noqa: E731
    for other, convert in ((jnp.cumsum, True), (folded, False)):
        op = lxd.FunctionLinearOperator(other, structure, closure_convert=convert)
        assert mv_cost(op).source == "cost_analysis"


def _stencil(x):
    g = x.reshape(6, 6)
    padded = jnp.pad(g, 1)
    near = padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]
    return (4.05 * g - near).reshape(-1)


def _network(w1, w2, x):
    return x + w2 @ jnp.tanh(w1 @ x)


def _zoo():
    """`mv`s a user writes, each made of primitives counted as XLA counts them:
    data movement (a stencil), transcendentals, a JVP whose primal output is
    unused, reductions, integer powers, the logistic function."""
    w1 = jnp.full((36, 36), 0.01, jnp.float32)
    w2 = jnp.full((36, 36), 0.02, jnp.float32) + jnp.eye(36, dtype=jnp.float32)
    x0 = jnp.linspace(-1.0, 1.0, 36, dtype=jnp.float32)
    return {
        "stencil": (lambda _, x: _stencil(x), ()),
        "network": (lambda a, x: _network(*a, x), (w1, w2)),
        "jvp": (
            lambda a, x: jax.jvp(lambda y: _network(a[0], a[1], y), (a[2],), (x,))[1],
            (w1, w2, x0),
        ),
        "powers": (lambda a, x: x**3 + 2 * x**2 + jnp.sum(x) * a[0], (x0,)),
        "logistic": (lambda a, x: jax.nn.sigmoid(a[0] * x) * x, (x0,)),
    }


@pytest.mark.parametrize("name", list(_zoo()))
def test_mv_cost_counts_as_xla_without_lowering(name):
    """The zoo's functions are counted from their jaxprs (no lowering): flops as
    XLA's cost analysis gives them, bytes within 10% (XLA counts a padded or
    sliced operand's bytes its own way)."""
    fn, arrays = _zoo()[name]
    structure = jax.ShapeDtypeStruct((36,), jnp.float32)
    op = lxd.FunctionLinearOperator(eqx.Partial(fn, arrays), structure)
    cost = mv_cost(op)
    assert cost.source == "jaxpr"
    analysis = jax.jit(fn).lower(arrays, structure).cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0]
    assert cost.flops == analysis["flops"]
    assert cost.bytes == pytest.approx(analysis["bytes accessed"], rel=0.1)


def test_decision_estimates_are_typed_and_hold_their_policies():
    o = lxd.observe(_op(), memory_budget=2**30, call_sites=16, rollable=True)
    decision = lxd.decide(o)
    strategies = [e.strategy for e in decision.estimates]
    assert strategies == ["Lazy", "Roll", "Outline", "Materialise"]
    assert all(isinstance(e, Estimate) for e in decision.estimates)
    for e in decision.estimates:
        assert type(e.policy).__name__ == e.strategy
        assert e.seconds == pytest.approx(e.compile_seconds + o.runs * e.run_seconds)
    best = min(decision.estimates, key=lambda e: e.seconds)
    assert decision.policy == best.policy
    materialise = decision.estimates[-1].policy
    assert materialise.batch_size is not None


def test_over_budget_estimate_has_no_seconds():
    o = lxd.observe(_op(), memory_budget=1, call_sites=4)
    decision = lxd.decide(o)
    (materialise,) = [e for e in decision.estimates if e.strategy == "Materialise"]
    assert materialise.seconds is None and materialise.compile_seconds is None
    assert decision.strategy != "Materialise"


def test_explicit_operator_decision_has_no_estimates():
    op = lxd.MatrixLinearOperator(jnp.eye(4), policy=lxd.Auto())
    decision = op.policy.decision(op)
    assert decision.strategy == "Lazy" and decision.estimates == ()


@pytest.mark.parametrize(
    "make",
    [
        lambda b: lxd.Materialise(memory_budget=b),
        lambda b: lxd.Auto(memory_budget=b),
        lambda b: lxd.AutoSolver(memory_budget=b),
    ],
)
def test_budgets_are_parsed_once_and_compare_by_value(make):
    parsed = make("2GB")
    assert parsed == make(2 * 10**9)
    assert parsed.memory_budget == 2 * 10**9
    assert isinstance(parsed.memory_budget, int)
    assert make("512 MiB") == make(512 * 2**20) != parsed
    assert make(None).memory_budget is None
    with pytest.raises(ValueError, match="memory_budget"):
        make("2XB")


def test_sizes_have_one_home():
    from lineax_dispatch.policies import _memory as _sizes

    op = _op()
    assert _sizes.itemsize(op) == 4
    assert _sizes.dense_bytes(op) == 32 * 32 * 4
    assert _sizes.operator_build_bytes(op, 8) == 4 * (32 * 32 + 8 * 64)
    o = lxd.observe(op, memory_budget=2**30)
    assert o.matrix_bytes == _sizes.dense_bytes(op)
    assert o.itemsize == _sizes.itemsize(op)


def test_a_decision_with_a_reason_added_keeps_its_estimates():
    o = lxd.observe(_op(), memory_budget=2**30, call_sites=16, rollable=True)
    decision = lxd.decide(o)
    noted = decision.with_reason("a note")
    assert noted.reasons == (*decision.reasons, "a note")
    assert (noted.policy, noted.estimates) == (decision.policy, decision.estimates)
    assert noted.memory_needed == decision.memory_needed
    other = decision.with_reason("another", lxd.Outline(), memory_needed=0)
    assert other.strategy == "Outline" and other.memory_needed == 0
    assert other.estimates == decision.estimates


def test_mv_cost_cache_keeps_the_kinds_last_met(monkeypatch):
    # Fresh operator functions are new kinds each time: the context's cache keeps
    # the `COSTS_KEPT` last met, not every one ever seen.
    from lineax_dispatch.policies.decision import _cost

    monkeypatch.setattr(_cost, "COSTS_KEPT", 3)

    def fresh(scale: float):
        structure = jax.ShapeDtypeStruct((8,), jnp.float32)
        return lxd.FunctionLinearOperator(lambda x: scale * x, structure)

    def run():
        ops = [fresh(float(i + 1)) for i in range(5)]
        keys = [_cost.cost_key(op) for op in ops]
        for op in ops[:3]:
            mv_cost(op)
        mv_cost(ops[0])  # met again: now the most recently used
        for op in ops[3:]:
            mv_cost(op)
        cache = _cost.cost_cache()
        assert len(cache) == 3
        assert keys[0] in cache and keys[3] in cache and keys[4] in cache
        assert keys[1] not in cache and keys[2] not in cache
        assert mv_cost(ops[1]) == mv_cost(ops[1])  # measured again, kept again
        assert len(cache) == 3

    contextvars.copy_context().run(run)


def test_an_auto_operator_and_its_decided_policy_share_one_cost(monkeypatch):
    # CG's layout choice reads the cost of the operator its loop applies (the
    # `Auto` operator with its decided policy) after `Auto`'s decision read the
    # `Auto` operator's: the `mv` is traced for its cost once.
    from lineax_dispatch.policies.decision import _cost

    traced = []
    real = _cost.jaxpr_cost
    monkeypatch.setattr(_cost, "jaxpr_cost", lambda c: traced.append(c) or real(c))

    def run():
        # (One operator with its policy replaced: two operators made from one
        # function apart are two kinds, their closure-converted functions apart.)
        auto = _op(lxd.Auto())
        lazy = with_top_policy(auto, lxd.Lazy())
        outline = with_top_policy(auto, lxd.Outline())
        assert _cost.cost_key(auto) == _cost.cost_key(lazy) == _cost.cost_key(outline)
        assert mv_cost(auto) == mv_cost(lazy) == mv_cost(outline)
        assert len(traced) == 1
        structure = jax.ShapeDtypeStruct((16,), jnp.float32)
        other = lxd.FunctionLinearOperator(jnp.cumsum, structure, policy=lxd.Auto())
        assert _cost.cost_key(other) != _cost.cost_key(auto)
        mv_cost(other)
        assert len(traced) == 2

    contextvars.copy_context().run(run)


def _kept_kinds():
    """Operators whose `mv` reads arrays in ways a shape stand-in cannot take (a
    scalar added to a float, a matrix product, a Jacobian at a point)."""
    n = 16
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    shift = jnp.asarray(0.5, jnp.float32)
    matrix = jnp.eye(n, dtype=jnp.float32) + 0.1
    point = jnp.linspace(0.0, 1.0, n, dtype=jnp.float32)
    stencil = eqx.Partial(lambda c, x: (2.0 + c) * x - jnp.roll(x, 1), shift)
    product = eqx.Partial(lambda a, x: a @ x, matrix)
    return [
        lxd.FunctionLinearOperator(stencil, structure, policy=lxd.Auto()),
        lxd.FunctionLinearOperator(product, structure, policy=lxd.Auto()),
        lxd.JacobianLinearOperator(
            lambda x, args: jnp.tanh(matrix @ x), point, policy=lxd.Auto()
        ),
    ]


@pytest.mark.parametrize("index", range(3))
def test_a_kept_record_of_an_operator_has_its_operators_cost(index, monkeypatch):
    # What a trace's records keep of an operator (`abstract_operator`: its arrays
    # as shapes) is priced by `lxd.jit` (shared solves, copies of a solve): it has
    # the operator's cost, from the same cache entry, not a dense matrix's
    # estimate made after its `mv` failed on the stand-ins.
    from lineax_dispatch.policies.calls._keys import abstract_operator
    from lineax_dispatch.policies.decision import _cost

    estimated = []
    real = _cost._estimate
    monkeypatch.setattr(_cost, "_estimate", lambda op: estimated.append(op) or real(op))

    def run(first_kept: bool):
        operator = _kept_kinds()[index]
        kept = abstract_operator(operator)
        assert _cost.cost_key(kept) == _cost.cost_key(operator)
        if first_kept:
            cost = mv_cost(kept)
            assert mv_cost(operator) is cost
        else:
            cost = mv_cost(operator)
            assert mv_cost(kept) is cost
        assert cost.source != "estimate"

    contextvars.copy_context().run(run, True)
    contextvars.copy_context().run(run, False)
    assert estimated == []
