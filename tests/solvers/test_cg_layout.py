"""CG's two layouts: the one-site loop and the inline layout (`mv` where lineax's
CG writes it), the same iterates in either, and `layout="auto"`'s choice between
them. (Both layouts also run the solver suites: `cg` and `cg-inline` in
helpers/solver_problems.py.)"""

import equinox.internal as eqxi
import jax
import jax.lax as lax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.solvers.cg import _layout_choice
from lineax_dispatch.solvers.skeleton._flat_vectors import branch_select
from lineax_dispatch.solvers.skeleton._linear_system import UPDATE_IN_COND
from lineax_dispatch.solvers.skeleton._one_site_solver import FUSED_TEST_BELOW


_PSD = lx.positive_semidefinite_tag
LAYOUTS = ("one_site", "inline")


def _stencil(x):
    return 2.05 * x - jnp.roll(x, 1) - jnp.roll(x, -1)


def _operator(n, policy, dtype=jnp.float32):
    structure = jax.ShapeDtypeStruct((n,), dtype)
    return lxd.FunctionLinearOperator(_stencil, structure, _PSD, policy=policy)


def _layout(solver, operator, options=None):
    """The layout `solver.init` chose for a solve of `operator`."""
    return solver.init(operator, options or {})[2].value[0]


def _auto(runs):
    return lxd.Auto(runs=runs, cost_model=lxd.CostModel())


def test_auto_keeps_one_site_where_the_copies_cost_more_than_the_runs_save():
    solver = lxd.CG(1e-5, 1e-5)
    # A program run once, or a small system: the two further copies of `mv`
    # are not repaid.
    assert _layout(solver, _operator(4096, _auto(1))) == "one_site"
    assert _layout(solver, _operator(64, _auto(100))) == "one_site"
    # A dense matrix's copies cost a matrix-vector product each to compile.
    matrix = lxd.MatrixLinearOperator(jnp.eye(256), _PSD, policy=_auto(100))
    assert _layout(solver, matrix) == "one_site"


def test_auto_takes_the_inline_layout_where_many_runs_repay_its_copies():
    solver = lxd.CG(1e-5, 1e-5)
    assert _layout(solver, _operator(4096, _auto(10_000))) == "inline"
    assert _layout(solver, _operator(64, _auto(10**7))) == "inline"
    matrix = lxd.MatrixLinearOperator(jnp.eye(256), _PSD, policy=_auto(10**7))
    assert _layout(solver, matrix) == "inline"
    # Without refreshes or a stopping test, nothing is saved.
    never = lxd.CG(0.0, 0.0, stabilise_every=None, max_steps=50)
    assert _layout(never, _operator(4096, _auto(10**7))) == "one_site"
    # A preconditioner's copy counts too, and one that is a lineax operator
    # holding a function of the user's is not traced again to cost it.
    diagonal = lx.TaggedLinearOperator(
        lx.DiagonalLinearOperator(jnp.ones(4096, jnp.float32)), _PSD
    )
    operator = _operator(4096, _auto(10_000))
    assert _layout(solver, operator, {"preconditioner": diagonal}) == "inline"
    function = lx.FunctionLinearOperator(
        lambda x: x, jax.ShapeDtypeStruct((4096,), jnp.float32), _PSD
    )
    assert _layout(solver, operator, {"preconditioner": function}) == "one_site"


def test_auto_keeps_a_plain_lineax_function_operator_on_one_site():
    # Its cost is not known without tracing the user's function again.
    structure = jax.ShapeDtypeStruct((4096,), jnp.float32)
    plain = lx.FunctionLinearOperator(_stencil, structure, _PSD)
    assert _layout(lxd.CG(1e-5, 1e-5), plain) == "one_site"


def test_the_one_site_loops_fused_test_counts_below_its_size():
    # Below `FUSED_TEST_BELOW` unknowns the one-site loop takes its test and
    # `gamma` in one reduction, which the inline layout's estimate pays for.
    solver = lxd.CG(1e-5, 1e-5)
    dear = lxd.Auto(runs=10**7, cost_model=lxd.CostModel(fused_test_compile=1e4))
    free = lxd.Auto(runs=10**7, cost_model=lxd.CostModel(fused_test_compile=0.0))
    assert _layout(solver, _operator(64, free)) == "inline"
    assert _layout(solver, _operator(64, dear)) == "one_site"
    assert _layout(solver, _operator(FUSED_TEST_BELOW, dear)) == "inline"
    # With another norm the test is not one reduction.
    two_norm = lxd.CG(1e-5, 1e-5, norm=lx.internal.two_norm)
    assert _layout(two_norm, _operator(64, dear)) == "inline"


def _update(solver, operator):
    """The residual update `solver.init` chose for a solve of `operator`."""
    return solver.init(operator, {})[2].value[1]


def test_the_residual_update_takes_a_cond_where_the_runs_repay_it():
    solver = lxd.CG(1e-5, 1e-5)
    # Below `UPDATE_IN_COND` unknowns one expression is as fast.
    assert _update(solver, _operator(UPDATE_IN_COND // 4, _auto(10**7))) == "select"
    # From it on, a program run once does not repay the `cond`'s compile; one run
    # often does (each step as one expression computes the `mv` again).
    assert _update(solver, _operator(UPDATE_IN_COND, _auto(1))) == "select"
    assert _update(solver, _operator(UPDATE_IN_COND, _auto(10**4))) == "cond"
    free = lxd.Auto(runs=1, cost_model=lxd.CostModel(update_cond_compile=0.0))
    assert _update(solver, _operator(UPDATE_IN_COND, free)) == "cond"
    # A lineax operator holding a function of the user's: not costed, a `cond`.
    structure = jax.ShapeDtypeStruct((UPDATE_IN_COND,), jnp.float32)
    plain = lx.FunctionLinearOperator(_stencil, structure, _PSD)
    assert _update(solver, plain) == "cond"
    # Given, it is kept, with either layout.
    for layout in LAYOUTS:
        for update in ("select", "cond"):
            given = lxd.CG(1e-5, 1e-5, layout=layout, residual_update=update)
            assert _update(given, _operator(64, _auto(1))) == update
    with pytest.raises(ValueError, match=r"residual_update=\.\.\.\).*'maybe'"):
        lxd.CG(1e-5, 1e-5, residual_update="maybe")


def _eqns_below(jaxpr):
    """Each equation of `jaxpr` at any depth, with the jaxpr that holds it."""
    for eqn in jaxpr.eqns:
        yield jaxpr, eqn
        for inner in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _eqns_below(inner)


def test_the_residual_update_s_cond_selects_its_coefficient_itself():
    # The one-site loop's `cond` reads the step length and whether the step was
    # taken, not the coefficient selected from them: an operand of a `cond` is a
    # value XLA:CPU computes in a kernel of its own.
    solver = lxd.CG(1e-5, 1e-5, layout="one_site", residual_update="cond")
    op = lxd.MatrixLinearOperator(jnp.eye(8) * 2.0, _PSD)
    state = solver.init(op, {})
    closed = jax.make_jaxpr(lambda b: solver.compute(state, b, {})[0])(jnp.ones(8))
    conds = []
    for jaxpr, eqn in _eqns_below(closed.jaxpr):
        if eqn.primitive is lax.cond_p and any(
            v.aval.shape == (8,) for v in eqn.outvars
        ):
            made_by = {v: e for e in jaxpr.eqns for v in e.outvars}
            conds.append([made_by.get(v) for v in eqn.invars[1:]])
    assert conds
    for producers in conds:
        for eqn in producers:
            scalar_select = (
                eqn is not None
                and eqn.primitive is lax.select_n_p
                and eqn.outvars[0].aval.shape == ()
            )
            assert not scalar_select, eqn
    sol = lx.linear_solve(op, jnp.arange(8.0), solver)
    np.testing.assert_allclose(np.asarray(sol.value), np.arange(8.0) / 2, rtol=1e-6)


def test_off_the_cpu_auto_takes_one_site_and_one_expression(monkeypatch):
    """The inline layout and the `cond` update are XLA:CPU's: on another backend
    `"auto"` takes the one-site loop and the update as one expression, where the
    CPU takes the inline layout and the `cond`; given, either is kept."""
    solver = lxd.CG(1e-5, 1e-5)
    many = _operator(UPDATE_IN_COND, _auto(10**7))
    assert (_layout(solver, many), _update(solver, many)) == ("inline", "cond")
    monkeypatch.setattr(_layout_choice.jax, "default_backend", lambda: "tpu")
    assert (_layout(solver, many), _update(solver, many)) == ("one_site", "select")
    given = lxd.CG(1e-5, 1e-5, layout="inline", residual_update="cond")
    assert (_layout(given, many), _update(given, many)) == ("inline", "cond")
    reasons = _layout_choice.choose_layout(solver, many, many, None)[1]
    assert "On 'tpu' one site" in " ".join(reasons)
    why = _layout_choice.choose_update(solver, many, many)[1]
    assert "On 'tpu' the update is one expression" in why


def test_a_layout_given_is_kept():
    for layout in ("one_site", "inline"):
        solver = lxd.CG(1e-5, 1e-5, layout=layout)
        assert _layout(solver, _operator(64, _auto(1))) == layout
        assert _layout(solver, _operator(4096, _auto(10**7))) == layout


def test_a_bad_layout_is_an_error_naming_the_argument():
    with pytest.raises(ValueError, match=r"CG\(\.\.\., layout=\.\.\.\).*'sideways'"):
        lxd.CG(1e-5, 1e-5, layout="sideways")


def _sites(layout):
    """The `mv`s of a dense matrix (its matrix-vector products) in the lowered
    solve."""
    operator = lxd.MatrixLinearOperator(jnp.eye(8) * 2.0, _PSD, policy=lxd.Lazy())
    solver = lxd.CG(1e-6, 1e-6, layout=layout)
    solve = jax.jit(lambda b: lx.linear_solve(operator, b, solver).value)
    lines = solve.lower(jnp.ones(8)).as_text().splitlines()
    return sum("dot_general" in x and "tensor<8x8x" in x for x in lines)


def test_the_inline_layout_writes_mv_where_lineax_does():
    # One `mv` in the one-site loop; three (the initial residual, the step, the
    # true residual) in the inline layout.
    assert _sites("one_site") == 1
    assert _sites("inline") == 3


# Small systems, whose stopping test and inner product are one reduction, and
# from `FUSED_TEST_BELOW` unknowns on, two.
_SAME_STEPS = [
    (dtype, stabilise_every, 48)
    for dtype in (jnp.float32, jnp.float64, jnp.complex128)
    for stabilise_every in (1, 3, None)
] + [(jnp.float64, 3, FUSED_TEST_BELOW + 8), (jnp.complex128, 1, FUSED_TEST_BELOW)]


@pytest.mark.parametrize("dtype, stabilise_every, n", _SAME_STEPS)
def test_both_layouts_take_the_same_steps_to_the_same_solution(
    dtype, stabilise_every, n
):
    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n))
    if dtype == jnp.complex128:
        m = m + 1j * rng.standard_normal((n, n))
    a = jnp.asarray(m @ m.conj().T / n + 0.2 * np.eye(n), dtype)
    b = jnp.asarray(rng.standard_normal(n), dtype)
    operator = lxd.MatrixLinearOperator(a, _PSD, policy=lxd.Lazy())
    tol = 1e-5 if dtype == jnp.float32 else 1e-10

    def solve(layout, b):
        solver = lxd.CG(tol, tol, stabilise_every=stabilise_every, layout=layout)
        sol = lx.linear_solve(operator, b, solver, throw=False)
        return sol.value, sol.stats["num_steps"], sol.result._value

    one, inline = (jax.jit(lambda b, k=k: solve(k, b))(b) for k in LAYOUTS)
    assert int(one[2]) == int(inline[2]) == 0
    assert int(one[1]) == int(inline[1])
    np.testing.assert_allclose(inline[0], one[0], rtol=1e-4 if tol > 1e-6 else 1e-9)
    # Batched: a refresh or check that one vector needs runs for the whole batch,
    # the others keeping their updated residual. (Batched inner products round
    # apart from single ones: the steps may differ from the unbatched solves by
    # one or two, as the one-site loop's do. `-b` is `b`'s problem mirrored: a
    # multiple of `b` would change `atol`'s share of the tolerance, and the steps.)
    bs = jnp.stack([b, jnp.roll(b, 5), -b])
    batched = {k: jax.jit(jax.vmap(lambda b, k=k: solve(k, b)))(bs) for k in LAYOUTS}
    for k in LAYOUTS:
        values, steps, results = batched[k]
        assert np.all(np.asarray(results) == 0), k
        residual = np.abs(np.asarray(jax.vmap(lambda x: a @ x)(values) - bs))
        assert np.all(residual <= 3 * (tol + tol * np.abs(np.asarray(bs)))), k
        assert np.all(np.abs(np.asarray(steps) - int(one[1])) <= 3), k


def test_the_true_residuals_select_keeps_each_vectors_own_residual_under_vmap():
    # The inline layout's `cond` runs its true-residual branch where any vector of
    # a batch needs it; there each vector takes the true residual only where it
    # needs one itself. Unbatched, the branch runs only where it is needed.
    need = jnp.array([True, False, True])
    true, kept = jnp.ones((3, 4)), jnp.zeros((3, 4))

    def branch(need, true, kept):
        some = eqxi.nonbatchable(eqxi.unvmap_any(need))
        return lax.cond(some, branch_select, lambda *a: a[2], need, true, kept)

    expected = np.where(np.asarray(need)[:, None], 1.0, 0.0) * np.ones((3, 4))
    np.testing.assert_array_equal(jax.jit(jax.vmap(branch))(need, true, kept), expected)
    np.testing.assert_array_equal(jax.vmap(branch_select)(need, true, kept), expected)
    one = jax.vmap(branch_select, in_axes=(0, None, 0))(need, true[0], kept)
    np.testing.assert_array_equal(one, expected)
    # A predicate the batch shares, or none: the true residual.
    shared = jax.vmap(branch_select, in_axes=(None, 0, 0))(jnp.array(True), true, kept)
    np.testing.assert_array_equal(shared, np.ones((3, 4)))
    np.testing.assert_array_equal(jax.jit(branch)(need[0], true[0], kept[0]), true[0])


def test_constants_of_the_program_make_each_copy_dearer():
    # The same matrix closed over by the program (a constant that each copy of
    # `mv` holds) or taken as an argument (traced).
    model = lxd.CostModel(compile_per_constant_byte=1.0)
    policy = lxd.Auto(runs=10**7, cost_model=model)
    a = jnp.eye(64)
    solver = lxd.CG(1e-5, 1e-5)
    closed = lxd.MatrixLinearOperator(a, _PSD, policy=policy)
    assert _layout(solver, closed) == "one_site"
    seen = []

    def traced(a):
        seen.append(_layout(solver, lxd.MatrixLinearOperator(a, _PSD, policy=policy)))
        return a

    jax.eval_shape(traced, a)
    assert seen == ["inline"]


def test_explain_reports_the_layout_taken_and_why():
    b = jnp.ones(4096, jnp.float32)

    def solves(policy, layout="auto"):
        operator = _operator(4096, policy)
        solver = lxd.CG(1e-5, 1e-5, layout=layout)
        report = lxd.explain(lambda b: lx.linear_solve(operator, b, solver).value, b)
        return [(s.solver, s.size) for s in report.solves], str(report)

    taken, text = solves(_auto(10**7))
    assert taken == [("CG (inline layout)", "4096x4096")]
    assert "over 1e+07 runs" in text and ": inline." in text
    taken, text = solves(_auto(1))
    assert taken == [("CG (one-site layout)", "4096x4096")]
    assert "over 1 runs" in text and ": one site." in text
    # A layout given is no choice.
    assert solves(_auto(10**7), "one_site")[0] == []


def _stencil_2d(x):
    g = x.reshape(64, 64)
    p = jnp.pad(g, 1)
    near = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:]
    return (4.05 * g - near).reshape(-1)


@pytest.mark.parametrize("steps", [1, 200])
def test_lxd_jit_counts_the_loops_around_a_solve(steps):
    # A time step: one CG solve in a `fori_loop` of `steps` steps, at `Auto`'s
    # default of 100 runs. Alone, the inline layout's copies are not repaid; run
    # 200 times a run, they are: `lxd.jit` traces the program again, telling the
    # solve, and the step takes the inline layout. The results are `jax.jit`'s.
    structure = jax.ShapeDtypeStruct((4096,), jnp.float32)
    operator = lxd.FunctionLinearOperator(
        _stencil_2d, structure, _PSD, policy=_auto(100)
    )
    solver = lxd.CG(1e-4, 1e-4)

    def program(u):
        # (The operator's inverse has norm 20: scaled by 1/20, the steps keep `u`
        # of order 1, where float32 reaches the tolerance.)
        def step(i, u):
            return 0.05 * lx.linear_solve(operator, u, solver, throw=False).value

        return jax.lax.fori_loop(0, steps, step, u)

    u = jnp.linspace(0.0, 1.0, 4096, dtype=jnp.float32)
    report = lxd.explain(program, u)
    expected = "CG (inline layout)" if steps > 1 else "CG (one-site layout)"
    assert [s.solver for s in report.solves] == [expected]
    assert f"over {100 * steps:g} runs" in str(report)
    np.testing.assert_array_equal(lxd.jit(program)(u), jax.jit(program)(u))
