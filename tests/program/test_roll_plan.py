"""What `Roll`'s plan makes of the calls of a program: the slots its loop
carries (by position among the values live across each call, whatever number
each call keeps), where it cuts the calls (at a loop between them that one
step runs), and where it cuts the loop earlier (before each residual of a
refinement: one branch) and where not (a start value every step reads, calls of
different functions). Each program's results are `jax.jit`'s."""

import jax
import jax.numpy as jnp
import lineax as lx
import pytest

import lineax_dispatch as lxd

from ..helpers.roll_programs import _close, _operators, _WEIGHTS, N, ZOO, ZOO_X


def test_stages_that_keep_different_numbers_of_values_share_branches():
    """RK4's four stages keep one to four values across their calls: each value
    has the slot of its position among the values live there, and the start `x`,
    which the first time step reads where each later one reads the value its
    step before computed, heads the layout of the first time step: every time
    step runs the same four branches (the last call, which computes no next
    input, one of its own)."""
    from lineax_dispatch.program.analyse._groups import find_groups
    from lineax_dispatch.program.analyse._roll_plan import plan_roll

    ops = _operators(lxd.Roll())
    jaxpr = jax.make_jaxpr(lambda x: ZOO["runge-kutta"](ops, x))(ZOO_X).jaxpr
    (group,) = find_groups(jaxpr).values()
    plan = plan_roll(jaxpr, group.sites)
    assert plan.classes == (3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 4)
    # The first step starts the slot that later ones read their time step's
    # start from with the program's `x`.
    assert plan.initial[0][0] == "var" and plan.initial[1:] == (None,) * 3
    assert len(plan.slot_avals) == 4  # the most values live across one call


def test_a_loop_that_one_step_runs_stays_out_of_the_rolled_loop():
    """A solve between two calls that only one step runs cuts the calls there: of
    four calls, a solve, and four more, the first four are rolled; a solve in
    every step is one shared branch, and every call rolls: Newton's, and
    iterative refinement's two `mv`s from `x = 0` (the first step reads the
    zeros where the second reads the slot, and represents the last, whose code
    computes no next residual: one branch). The results are `jax.jit`'s (and
    the gradient, where the rolled run is followed by the solve)."""
    from lineax_dispatch.policies.calls._marked import MARKED_NAME
    from lineax_dispatch.program.analyse._groups import find_groups
    from lineax_dispatch.program.analyse._roll_plan import plan_roll

    op = _operators(lxd.Roll())[0]
    solve = lambda y: (
        lx.linear_solve(
            lx.MatrixLinearOperator(
                jnp.eye(N) * 3.0 + 0.1, lx.positive_semidefinite_tag
            ),
            y,
            lxd.CG(rtol=1e-10, atol=1e-10),
        ).value
    )

    def refine(b):
        x = jnp.zeros_like(b)
        for _ in range(2):
            x = x + solve(b - op.mv(x))
        return x

    def split(x):
        for _ in range(4):
            x = op.mv(x) + 1.0
        x = solve(x)
        for _ in range(4):
            x = op.mv(x) * 0.5
        return x

    def newton(b):
        x = b
        for _ in range(4):
            x = solve(op.mv(x) - b)
        return x

    b = jnp.linspace(0.1, 1.0, N)
    for f, rolled in ((refine, 2), (split, 4), (newton, 4)):
        jaxpr = jax.make_jaxpr(f)(b).jaxpr
        (group,) = [g for g in find_groups(jaxpr).values() if g.name == MARKED_NAME]
        plan = plan_roll(jaxpr, group.sites)
        assert (0 if plan is None else len(plan.sites)) == rolled, f.__name__
        if plan is not None:
            assert plan.sites == tuple(sorted(group.sites)[:rolled])
        if f is refine:
            assert len(plan.representatives) == 1
            assert plan.initial[0][0] == "var"  # the slot starts at `x = 0`
        _close(lxd.jit(f)(b), jax.jit(f)(b))
    # Through the rolled run and the solve after it; through the rolled solves.
    for g in (split, refine):
        loss = lambda b: jnp.sum(g(b) ** 2)
        _close(jax.grad(lxd.jit(loss))(b), jax.jit(jax.grad(loss))(b))
    _close(jax.vmap(lxd.jit(refine))(b[None] * 2.0), jax.vmap(refine)(b[None] * 2.0))


def test_solves_rolled_at_their_residuals():
    """`x <- x + A^-1 (b - A x)` twice from `x = 0`, `A` an `mv` inline (`Lazy`),
    its two solves rolled by `lxd.jit`: at the solves the loop is two branches
    (the first computes the next residual, the last does not); cut at the
    residual's first equation it is one, each step residual, solve and update.
    The rolled program has fewer copies of the operator's products than the
    program written out; the results (under jit, grad, jvp and vmap) are
    `jax.jit`'s."""
    from lineax_dispatch.program.analyse._groups import find_groups
    from lineax_dispatch.program.analyse._roll_plan import _plan_all, plan_roll

    op = _operators(lxd.Lazy())[0]
    spd = lx.MatrixLinearOperator(jnp.eye(N) * 3.0 + 0.1, lx.positive_semidefinite_tag)
    solver = lxd.CG(rtol=1e-10, atol=1e-10)

    def refine(b):
        x = jnp.zeros_like(b)
        for _ in range(2):
            x = x + lx.linear_solve(spd, b - op.mv(x), solver).value
        return x

    b = jnp.linspace(0.1, 1.0, N)
    jaxpr = jax.make_jaxpr(refine)(b).jaxpr
    (solves,) = [g for g in find_groups(jaxpr).values() if len(g.sites) == 2]
    assert len(_plan_all(jaxpr, solves.sites).representatives) == 2
    plan = plan_roll(jaxpr, solves.sites)
    assert len(plan.representatives) == 1 and plan.initial[0][0] == "var"
    first = jaxpr.eqns[plan.sites[0]]
    assert first.primitive.name == "dot_general" and plan.sites[1] < solves.sites[1]
    dots = lambda f: jax.jit(f).lower(b).as_text().count("dot_general")
    assert dots(lxd.jit(refine)) < dots(refine)
    _close(lxd.jit(refine)(b), jax.jit(refine)(b))
    loss = lambda b: jnp.sum(refine(b) ** 2)
    _close(jax.grad(lxd.jit(loss))(b), jax.jit(jax.grad(loss))(b))
    t = jnp.cos(b)
    _close(jax.jvp(lxd.jit(refine), (b,), (t,)), jax.jvp(refine, (b,), (t,)))
    bs = jnp.stack([b, 2 * b])
    _close(jax.vmap(lxd.jit(refine))(bs), jax.jit(jax.vmap(refine))(bs))


def test_a_value_every_step_reads_does_not_start_a_slot():
    """The first step's `x` is also a value every step reads (`0.1 x_0`): it
    cannot stand for the slot in the branch's code (the later steps would read
    the slot there), so the first step does not represent the others; the
    results are `jax.jit`'s."""
    op = _operators(lxd.Lazy())[0]
    spd = lx.MatrixLinearOperator(jnp.eye(N) * 3.0 + 0.1, lx.positive_semidefinite_tag)
    solver = lxd.CG(rtol=1e-10, atol=1e-10)

    def refine(b):
        x0 = jnp.cos(b)
        x = x0
        for _ in range(2):
            x = x + lx.linear_solve(spd, b - op.mv(x), solver).value + 0.1 * x0
        return x

    b = jnp.linspace(0.1, 1.0, N)
    _close(lxd.jit(refine)(b), jax.jit(refine)(b))
    loss = lambda b: jnp.sum(refine(b) ** 2)
    _close(jax.grad(lxd.jit(loss))(b), jax.jit(jax.grad(loss))(b))


def test_the_loop_is_not_cut_at_calls_of_different_functions():
    """Each solve follows a call of another function of one signature: the loop
    is not cut at those calls (one would run in place of the other); the results
    are `jax.jit`'s."""
    spd = lx.MatrixLinearOperator(jnp.eye(N) * 3.0 + 0.1, lx.positive_semidefinite_tag)
    solver = lxd.CG(rtol=1e-10, atol=1e-10)
    # Products: the last step cannot run its next input's code unused.
    first = jax.jit(lambda x: jnp.sin(_WEIGHTS[0] @ x) + 1.0)
    second = jax.jit(lambda x: jnp.cos(_WEIGHTS[1] @ x) * 2.0)

    def program(b):
        x = b
        for f in (first, second):
            x = lx.linear_solve(spd, f(x), solver).value
        return x

    b = jnp.linspace(0.1, 1.0, N)
    _close(lxd.jit(program)(b), jax.jit(program)(b))


def _residual_programs():
    """Refinement rolled at its residuals, with more read after the loop: the
    last residual, the last solve's step count, an effect in every step, a
    start computed before the loop, three steps."""
    op = _operators(lxd.Lazy())[0]
    spd = lx.MatrixLinearOperator(jnp.eye(N) * 3.0 + 0.1, lx.positive_semidefinite_tag)
    solver = lxd.CG(rtol=1e-10, atol=1e-10)
    solve = lambda r: lx.linear_solve(spd, r, solver)

    def last_residual(b):
        x = jnp.zeros_like(b)
        for _ in range(2):
            r = b - op.mv(x)
            x = x + solve(r).value
        return x, r

    def last_steps(b):
        x = jnp.zeros_like(b)
        for _ in range(2):
            sol = solve(b - op.mv(x))
            x = x + sol.value
        return x * sol.stats["num_steps"]

    def printed(b):
        x = jnp.zeros_like(b)
        for i in range(2):
            x = x + solve(b - op.mv(x)).value
            jax.debug.print("step {i} {s}", i=i, s=jnp.sum(x), ordered=True)
        return x

    def from_before(b):
        x = jnp.sin(b)
        for _ in range(3):
            x = x + solve(b - op.mv(x)).value
        return x

    return [last_residual, last_steps, printed, from_before]


@pytest.mark.parametrize("which", range(4))
def test_programs_rolled_at_their_residuals_match_jax_jit(which, capfd):
    program = _residual_programs()[which]
    b = jnp.linspace(0.1, 1.0, N)
    _close(lxd.jit(program)(b), jax.jit(program)(b))
    jax.effects_barrier()
    if program.__name__ == "printed":
        capfd.readouterr()
        jax.block_until_ready(lxd.jit(program)(b + 1.0))
        jax.effects_barrier()
        lxd_out = capfd.readouterr().out
        jax.block_until_ready(jax.jit(program)(b + 1.0))
        jax.effects_barrier()
        assert lxd_out == capfd.readouterr().out and lxd_out.count("step") == 2
        return
    loss = lambda b: sum(jnp.sum(v**2) for v in jax.tree.leaves(program(b)))
    _close(jax.grad(lxd.jit(loss))(b), jax.jit(jax.grad(loss))(b))
    bs = jnp.stack([b, 2 * b])
    _close(jax.vmap(lxd.jit(program))(bs), jax.jit(jax.vmap(program))(bs))
