"""Auto in programs: call-site observation, lxd.jit, explain, PolicySolver and
AutoSolver (the decision rule itself: test_decide.py)."""

import threading

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd


def _chain(n=32, layers=4, seed=0):
    rng = np.random.default_rng(seed)
    ws = [jnp.asarray(rng.standard_normal((n, n)) / np.sqrt(n)) for _ in range(layers)]

    def fn(x):
        for w in ws:
            x = w @ x
        return x

    return fn, jax.ShapeDtypeStruct((n,), jnp.float64)


def _sites(f, *args):
    report = lxd.explain(f, *args)
    return {row.operator: row.call_sites for row in report.rows}


def test_call_site_counts():
    fn, s = _chain()
    op = lxd.FunctionLinearOperator(fn, s, policy=lxd.Auto())
    x = jnp.ones(32)

    def one(x):
        return op.mv(x)

    def three(x):
        return op.mv(x) + op.mv(2 * x) + op.mv(op.mv(x) * 0) * 0

    def helper(x):
        return op.mv(x)

    def nested(x):
        return helper(x) + helper(helper(x))

    def loop_body(x):
        return jax.lax.fori_loop(0, 5, lambda i, y: op.mv(y), x)

    def python_loop(x):
        for _ in range(4):
            x = op.mv(x)
        return x

    assert _sites(one, x) == {"FunctionLinearOperator": 1}
    assert _sites(three, x) == {"FunctionLinearOperator": 4}
    assert _sites(nested, x) == {"FunctionLinearOperator": 3}
    # A loop body is one copy in the program, however often it runs.
    assert _sites(loop_body, x) == {"FunctionLinearOperator": 1}
    assert _sites(python_loop, x) == {"FunctionLinearOperator": 4}
    # A loop body's execution count is not known: it is assumed to run repeatedly.
    (row,) = lxd.explain(loop_body, x).rows
    assert row.executions > 1


def test_registry_is_per_thread():
    fn, s = _chain()
    results = {}

    def work(name, k):
        op = lxd.FunctionLinearOperator(fn, s, policy=lxd.Auto())
        results[name] = _sites(lambda x: sum(op.mv(x) for _ in range(k)), jnp.ones(32))

    threads = [threading.Thread(target=work, args=(i, i + 1)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: {"FunctionLinearOperator": i + 1} for i in range(3)}


# A cost model under which materialising is always cheapest (for tests).
_MATERIALISE_MODEL = lxd.CostModel(compile_per_dot=10.0, outline_site=100.0)


def test_jit_matches_jax_jit_and_builds_once(monkeypatch):
    import lineax_dispatch.program.rewrite._rules as rewrite_module

    fn, s = _chain()
    op = lxd.FunctionLinearOperator(
        fn, s, policy=lxd.Auto(cost_model=_MATERIALISE_MODEL)
    )
    fixed = lxd.FunctionLinearOperator(fn, s, policy=lxd.Materialise())
    builds = []
    original = rewrite_module.materialised_function

    def counting(*args, **kwargs):
        builds.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(rewrite_module, "materialised_function", counting)

    def make(op):
        def f(x):
            return op.mv(x) + op.mv(op.mv(2 * x)) + op.mv(3 * x)

        return f

    x = jnp.linspace(0, 1, 32)
    with jax.checking_leaks():
        compiled = lxd.jit(make(op))
        out = compiled(x)
    (decision,) = compiled.decisions(x).values()
    assert decision.strategy == "Materialise"
    assert len(builds) == 1
    np.testing.assert_allclose(out, jax.jit(make(fixed))(x), rtol=1e-10)
    lazy = lxd.with_policy(op, lxd.Lazy())
    np.testing.assert_allclose(out, jax.jit(make(lazy))(x), rtol=1e-10)
    # A second call reuses the compiled program.
    np.testing.assert_allclose(compiled(2 * x), 2 * out, rtol=1e-10)
    assert len(builds) == 1
    # The lowered program holds one build rather than four.
    text = compiled.lower(x).as_text()
    plain = jax.jit(make(fixed)).lower(x).as_text()
    assert text.count("dot_general") < plain.count("dot_general")


def test_jit_static_args_and_grad():
    fn, s = _chain()
    op = lxd.FunctionLinearOperator(fn, s, policy=lxd.Auto())

    def f(x, k):
        return jnp.sum(sum(op.mv(i * x) for i in range(k)) ** 2)

    x = jnp.linspace(0, 1, 32)
    g = lxd.jit(jax.grad(f), static_argnums=1)
    reference = jax.jit(jax.grad(f), static_argnums=1)
    np.testing.assert_allclose(g(x, 3), reference(x, 3))
    # A new static value is a new signature: observed and decided afresh. (The
    # gradient's program calls the `mv`'s transpose and its primal with
    # residuals, not the `mv`: it is decided on the program of `f` itself.)
    np.testing.assert_allclose(g(x, 5), reference(x, 5))
    plain = lxd.jit(f, static_argnums=1)
    np.testing.assert_allclose(plain(x, 3), jax.jit(f, static_argnums=1)(x, 3))
    (decision,) = plain.decisions(x, 5).values()
    assert any("5 call site(s)" in reason for reason in decision.reasons)


def test_explain_table_and_operator():
    fn, s = _chain()
    op = lxd.FunctionLinearOperator(fn, s, policy=lxd.Auto())
    report = lxd.explain(lambda x: op.mv(op.mv(x)), jnp.ones(32))
    text = str(report)
    for header in (
        "operator",
        "size",
        "dtype",
        "call sites",
        "mv flops",
        "decision",
        "reason",
    ):
        assert header in text
    assert "FunctionLinearOperator" in text and "32x32" in text
    assert "traced at" in text
    # An operator on its own: its decision at one call site, whatever was traced
    # before (no hidden state).
    (alone,) = lxd.explain(op).rows
    assert alone.call_sites == 1
    assert alone.decision == op.policy.decision(op)
    fresh = lxd.FunctionLinearOperator(*_chain(n=8), policy=lxd.Auto())
    (row,) = lxd.explain(fresh).rows
    assert row.call_sites == 1 and row.decision.strategy == "Lazy"
    with pytest.raises(TypeError, match="Auto"):
        lxd.explain(lxd.MatrixLinearOperator(jnp.eye(2), policy=lxd.Lazy()))


def test_policy_solver_and_override():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((16, 16))
    a = m @ m.T / 16 + np.eye(16)
    b = jnp.asarray(rng.standard_normal(16))
    plain = lx.MatrixLinearOperator(jnp.asarray(a), lx.positive_semidefinite_tag)
    expected = np.linalg.solve(a, b)
    for policy in (lxd.Auto(), lxd.Outline(), lxd.Materialise(4)):
        for inner in (
            lx.CG(rtol=1e-10, atol=1e-10),
            lxd.CG(rtol=1e-10, atol=1e-10),
            lx.LU(),
        ):
            solver = lxd.PolicySolver(inner, policy)
            out = jax.jit(lambda b: lx.linear_solve(plain, b, solver).value)(b)
            np.testing.assert_allclose(out, expected, rtol=1e-7)
    with pytest.raises(TypeError, match="policy"):
        lxd.PolicySolver(lx.LU(), "auto")


def test_auto_solver_selects_by_budget_and_tags():
    n = 8
    spd = lxd.MatrixLinearOperator(jnp.eye(n) * 2, lx.positive_semidefinite_tag)
    sym = lxd.MatrixLinearOperator(
        jnp.diag(jnp.arange(1.0, n + 1) * (-1) ** jnp.arange(n)), lx.symmetric_tag
    )
    gen = lxd.MatrixLinearOperator(jnp.eye(n) + jnp.triu(jnp.ones((n, n)), 1) * 0.1)
    tall = lxd.MatrixLinearOperator(jnp.ones((n + 2, n)) + jnp.eye(n + 2, n))
    big = lxd.AutoSolver(memory_budget=1)
    assert isinstance(lxd.AutoSolver().select(gen), lx.AutoLinearSolver)
    # Matrix-free CG and GMRES take a Jacobi preconditioner where the operator
    # holds its entries (a build of no `mv`s; applied where the diagonal's spread
    # is 10 or more: docs/preconditioners.md); MINRES takes none.
    for op, kind in ((spd, lxd.CG), (gen, lxd.GMRES)):
        chosen = big.select(op)
        assert isinstance(chosen, lxd.PreconditionedSolver)
        assert isinstance(chosen.solver, kind)
    assert isinstance(big.select(sym), lxd.MINRES)
    assert isinstance(
        lxd.AutoSolver(memory_budget=1, well_posed=False).select(tall), lxd.LSMR
    )
    with pytest.raises(ValueError, match="square"):
        lxd.AutoSolver(well_posed=True).select(tall)
    # The default, `well_posed=None` (optimistix's least squares): QR, or LSMR.
    assert isinstance(lxd.AutoSolver().select(tall), lx.AutoLinearSolver)
    assert isinstance(lxd.AutoSolver(memory_budget=1).select(tall), lxd.LSMR)
    b = jnp.arange(1.0, n + 1)
    for op in (spd, sym, gen):
        for solver in (
            lxd.AutoSolver(rtol=1e-10, atol=1e-10),
            lxd.AutoSolver(rtol=1e-10, atol=1e-10, memory_budget=1),
        ):
            np.testing.assert_allclose(
                lxd.linear_solve(op, b, solver).value,
                np.linalg.solve(op.as_matrix(), b),
                rtol=1e-7,
            )


def test_jit_fixes_solve_decisions_inside_linear_solve(monkeypatch):
    """Solves inside `lxd.jit` are observed as call sites and their decision reaches
    the solver's `init` although lineax's `linear_solve` is itself jitted."""
    import lineax_dispatch.solvers._prepare as prepare_module

    n = 16
    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n))
    a = jnp.asarray(m @ m.T / n + np.eye(n))
    op = lxd.FunctionLinearOperator(
        lambda x: a @ x,
        jax.ShapeDtypeStruct((n,), jnp.float64),
        lx.positive_semidefinite_tag,
        policy=lxd.Auto(cost_model=_MATERIALISE_MODEL),
    )
    builds = []
    original = prepare_module.dense_matrix

    def counting(*args, **kwargs):
        builds.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(prepare_module, "dense_matrix", counting)
    solver = lxd.CG(rtol=1e-10, atol=1e-10)

    def f(b):
        return sum(lx.linear_solve(op, b * i, solver).value for i in (1.0, 2.0, 3.0))

    b = jnp.arange(1.0, n + 1)
    compiled = lxd.jit(f)
    out = compiled(b)
    (decision,) = compiled.decisions(b).values()
    assert decision.strategy == "Materialise"
    assert builds
    np.testing.assert_allclose(out, 6 * np.linalg.solve(np.asarray(a), b), rtol=1e-8)
    # lineax's jitted linear_solve is traced once for the three identical
    # signatures (one decision), and the report counts the program's three solves.
    (row,) = lxd.explain(f, b).rows
    assert row.call_sites == 3 and row.decision.strategy == "Materialise"


@pytest.mark.parametrize(
    "policy", [lxd.VmapBatch(), lxd.VmapBatch(batch_size=3), lxd.Scan()]
)
def test_batch_policies_apply_stacks(policy):
    fn, s = _chain(n=8, layers=2)
    op = lxd.FunctionLinearOperator(fn, s, policy=policy)
    xs = jnp.asarray(np.random.default_rng(5).standard_normal((7, 8)))
    expected = jnp.stack([fn(x) for x in xs])
    out = jax.jit(lambda xs: policy.batch_mv(op, xs))(xs)
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    np.testing.assert_allclose(op.mv(xs[0]), expected[0], rtol=1e-12)
    with pytest.raises(ValueError, match="batch_size"):
        lxd.VmapBatch(batch_size=0)
