"""`lxd.jit` traces share one jit-cache context, as `jax.jit`'s do: the user's
jitted helpers (and `jax.numpy`'s own) keep their traces from one program to the
next. A program that reused a helper's trace holding another program's `Auto`
operator call is traced again under a fresh context, and a solve decided in its
solver's `init` (or an `AutoSolver`'s choice) is read back from a reused trace:
each program still records and decides everything it holds."""

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.program._session import shared_context


N = 8


def _auto_operator(scale: float = 3.0):
    matrix = jnp.asarray(np.eye(N) * scale + 0.1)
    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    tag = lx.positive_semidefinite_tag
    operator = lxd.FunctionLinearOperator(
        lambda x: matrix @ x, structure, tag, closure_convert=False, policy=lxd.Auto()
    )
    return operator, np.asarray(matrix)


def _counted_helper(traces: list):
    """A jitted helper of the user's (no operator in it) that notes each trace."""

    @jax.jit
    def helper(x):
        traces.append(1)
        return jnp.sin(x) * 2.0

    return helper


def test_a_helper_without_records_is_traced_once_for_many_programs():
    traces = []
    helper = _counted_helper(traces)

    operator, matrix = _auto_operator()
    x = jnp.arange(1.0, N + 1.0)
    for scale in (2.0, 3.0):  # two programs (two functions)
        f = lxd.jit(lambda x, scale=scale: operator.mv(helper(x)) * scale)
        np.testing.assert_allclose(f(x), scale * matrix @ (2.0 * np.sin(x)))
        assert list(f.decisions(x).values())[0].strategy == "Lazy"
    assert len(traces) == 1


def test_a_helper_applying_an_auto_operator_is_traced_for_each_program():
    traces = []
    operator, matrix = _auto_operator()

    @jax.jit
    def helper(x):
        traces.append(1)
        return operator.mv(x)

    x = jnp.arange(1.0, N + 1.0)
    for scale in (2.0, 3.0):
        f = lxd.jit(lambda x, scale=scale: helper(x) * scale)
        np.testing.assert_allclose(f(x), scale * matrix @ np.asarray(x))
        assert len(f.decisions(x)) == 1  # this program's record, not another's
    assert len(traces) == 2


def _nested_set_up():
    """For a program applying an `Auto` operator in nested traces: the list of
    the counted helper's traces, the helper, the operator and its matrix, an input,
    and the shared context before any program."""
    traces = []
    helper = _counted_helper(traces)
    operator, matrix = _auto_operator()
    return traces, helper, operator, matrix, jnp.arange(1.0, N + 1.0), shared_context()


def test_an_auto_operator_in_nested_traces_keeps_the_shared_context():
    # Applied inside lineax's own CG (its solve is traced in jits of its own) and
    # in a loop body, an `Auto` operator makes its records in nested traces. Those
    # traces name this program's marked call; the next program (a new function)
    # reuses none of them, so no program re-traces the user's helper.
    traces, helper, operator, matrix, x, before = _nested_set_up()

    def program(x, scale):
        solved = lx.linear_solve(operator, helper(x), lx.CG(1e-10, 1e-10)).value
        looped = jax.lax.fori_loop(0, 2, lambda i, v: operator.mv(v), x)
        return solved + scale * looped

    for scale in (2.0, 3.0):
        f = lxd.jit(lambda x, scale=scale: program(x, scale))
        expected = np.linalg.solve(matrix, 2.0 * np.sin(np.asarray(x)))
        expected += scale * matrix @ (matrix @ np.asarray(x))
        np.testing.assert_allclose(f(x), expected, rtol=1e-8)
    assert len(traces) == 1
    assert shared_context() == before


def test_an_auto_solver_choice_in_a_nested_trace_keeps_the_shared_context():
    # An `AutoSolver` chooses in its `init`, inside lineax's `linear_solve` (a jit
    # of its own) and here a loop body, as in optimistix's Newton. The choice
    # rides on the solver's state: no program re-traces the user's helper, and
    # each program still reports the choice, the second one from the trace it
    # reused.
    traces, helper, operator, matrix, x, before = _nested_set_up()

    def program(x, scale):
        def step(i, v):
            return lx.linear_solve(operator, v, lxd.AutoSolver()).value

        return scale * jax.lax.fori_loop(0, 2, step, helper(x))

    for scale in (2.0, 3.0):
        f = lxd.jit(lambda x, scale=scale: program(x, scale))
        solved = np.linalg.solve(matrix, np.linalg.solve(matrix, 2.0 * np.sin(x)))
        np.testing.assert_allclose(f(x), scale * solved, rtol=1e-8)
        report = lxd.explain(lambda x, scale=scale: program(x, scale), x)
        (choice,) = report.solves
        assert choice.size == f"{N}x{N}" and choice.reasons
    assert len(traces) == 1
    assert shared_context() == before


@pytest.mark.parametrize("solver", [lxd.CG(1e-10, 1e-10), lxd.AutoSolver()])
def test_every_program_decides_its_own_solves(solver):
    # lineax's `linear_solve` is a jit of its own: a program solving the same
    # operator as an earlier one still decides (and reports) its solve.
    operator, matrix = _auto_operator()
    b = jnp.arange(1.0, N + 1.0)
    for scale in (2.0, 3.0):
        f = lxd.jit(lambda b, scale=scale: lx.linear_solve(operator, scale * b, solver))
        np.testing.assert_allclose(
            f(b).value, np.linalg.solve(matrix, scale * np.asarray(b)), rtol=1e-8
        )
        report = lxd.explain(
            lambda b, scale=scale: lx.linear_solve(operator, scale * b, solver), b
        )
        if isinstance(solver, lxd.CG):  # Auto decided in `CG.init`
            assert len(f.decisions(b)) == 1 and len(report.rows) == 1
        else:  # AutoSolver's choice, reported
            assert len(report.solves) == 1


def test_a_failed_trace_retires_the_shared_context():
    operator, _ = _auto_operator()

    def fails(x):
        operator.mv(x)
        raise RuntimeError("the user's error")

    before = shared_context()
    with pytest.raises(RuntimeError, match="the user's error"):
        lxd.jit(fails)(jnp.ones(N))
    assert shared_context() != before
    after = shared_context()
    lxd.jit(lambda x: operator.mv(x))(jnp.ones(N))  # records at the top only
    assert shared_context() == after


def _two_solving_programs(operator, matrix, solver, b, strategy: str) -> list:
    """Two `lxd.jit` programs solving `operator` (the second reusing the first's
    trace of lineax's `linear_solve`), each checked: its answer and its one
    decision, `strategy`."""
    programs = []
    for scale in (2.0, 3.0):
        f = lxd.jit(lambda b, scale=scale: lx.linear_solve(operator, scale * b, solver))
        np.testing.assert_allclose(
            f(b).value, np.linalg.solve(matrix, scale * np.asarray(b)), rtol=1e-8
        )
        (decision,) = f.decisions(b).values()
        assert decision.strategy == strategy
        programs.append(f)
    return programs


def test_a_solve_decided_in_init_is_read_back_from_a_reused_trace(monkeypatch):
    # The decision rides on the solve's operator (its pinned policy): a program
    # whose solve reuses an earlier program's trace of lineax's `linear_solve` (no
    # `init` runs) reads it from its own program, and no program retires the
    # shared context for it.
    import lineax_dispatch.solvers._prepare as prepare

    made = []
    original = prepare.solve_record
    monkeypatch.setattr(
        prepare, "solve_record", lambda *a: made.append(1) or original(*a)
    )
    operator, matrix = _auto_operator()
    solver = lxd.CG(1e-10, 1e-10)
    b = jnp.arange(1.0, N + 1.0)
    before = shared_context()
    sites = []
    for f in _two_solving_programs(operator, matrix, solver, b, "Lazy"):
        (row,) = lxd.explain(f, b).rows
        sites.append(row.sites)
    assert len(made) == 1  # decided once: the later traces reused the first
    assert shared_context() == before
    assert sites[0] == sites[1]
    assert all("test_shared_context.py" in site for site in sites[0]), sites


def test_a_materialised_solve_is_read_back_from_a_reused_trace():
    # A solve decided `Materialise` in `init` carries its record on the built
    # matrix operator's pinned policy.
    matrix = jnp.asarray(np.eye(N) * 3.0 + 0.1)
    policy = lxd.Auto(runs=1, cost_model=lxd.CostModel(compile_per_dot=10.0))
    operator = lxd.FunctionLinearOperator(
        lambda x: matrix @ x,
        jax.ShapeDtypeStruct((N,), jnp.float64),
        lx.positive_semidefinite_tag,
        closure_convert=False,
        policy=policy,
    )
    solver = lxd.CG(1e-10, 1e-10)
    b = jnp.arange(1.0, N + 1.0)
    before = shared_context()
    _two_solving_programs(operator, matrix, solver, b, "Materialise")
    assert shared_context() == before


def test_a_program_of_lxd_jit_called_in_another_is_not_a_stale_trace():
    # The inner program's marked calls, in the outer trace, are its own (decided
    # there): the outer program is traced once and keeps the shared context.
    operator, matrix = _auto_operator()
    inner = lxd.jit(lambda x: operator.mv(operator.mv(x)))
    runs = []

    def outer(x):
        runs.append(1)
        return inner(x) + operator.mv(x)

    x = jnp.arange(1.0, N + 1.0)
    before = shared_context()
    np.testing.assert_allclose(
        lxd.jit(outer)(x), matrix @ matrix @ np.asarray(x) + matrix @ np.asarray(x)
    )
    assert len(runs) == 1
    assert shared_context() == before
