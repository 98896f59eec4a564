"""The `Roll` rewrite of `lxd.jit`: a zoo of programs (roll_programs.py), each
compared with `jax.jit` of the same program under jit, grad, jvp and vmap; the
rolled program holds one copy of the operator's dot products and traces the user's
function once. The user's own repeated `jax.jit` functions: test_roll_user_jit.py."""

import jax
import jax.numpy as jnp
import lineax as lx
import pytest

import lineax_dispatch as lxd

from ..helpers.roll_programs import (
    _chain,
    _close,
    _loop,
    _operators,
    _pair,
    _sum,
    LAYERS,
    lazy_reference,
    N,
    NO_LEAK_CHECK,
    ROLL_MODEL,
    ZOO,
    ZOO_X,
)


@pytest.mark.parametrize("name", list(ZOO))
def test_rolled_programs_match_jax_jit(name):
    rolled, lazy = _pair(name)
    x = ZOO_X
    expected = lazy_reference(name)
    if name in NO_LEAK_CHECK:
        _close(lxd.jit(rolled)(x), expected)
    else:
        with jax.checking_leaks():
            _close(lxd.jit(rolled)(x), expected)
    scalar = lambda f: (
        lambda x: sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(f(x)))
    )
    tangent = jnp.cos(x)
    xs = jnp.stack([x, 2 * x, -x])

    def transformed(f, jit):
        # Transformations of `lxd.jit` programs and `lxd.jit` of transformed ones,
        # and an `lxd.jit` program called from another, compiled together (each
        # inner `lxd.jit` traces and rewrites its program inside the outer trace).
        def run(x, tangent, xs):
            inner = jit(f)
            return (
                jax.grad(jit(scalar(f)))(x),
                jit(jax.grad(scalar(f)))(x),
                jax.jvp(jit(f), (x,), (tangent,)),
                jax.vmap(jit(f))(xs),
                jit(jax.vmap(f))(xs),
                jit(lambda x: inner(x))(x),
            )

        return run

    _close(
        jax.jit(transformed(rolled, lxd.jit))(x, tangent, xs),
        jax.jit(transformed(lazy, lambda f: f))(x, tangent, xs),
    )


def _count_dots(lowered):
    """Dot products in the compiled (optimised, inlined) HLO."""
    return lowered.compile().as_text().count(" dot(")


def _count_ops(lowered):
    """Operations in the compiled HLO's entry computation (instructions, with the
    names XLA gives them stripped)."""
    text = lowered.compile().as_text()
    entry = text[text.index("ENTRY") :]
    return sum(1 for line in entry.splitlines() if " = " in line)


@pytest.mark.parametrize("policy", ["Roll", "Auto"])
@pytest.mark.parametrize("program", [_loop, _sum], ids=["dependent", "independent"])
@pytest.mark.parametrize("sites", [1, 4, 16])
def test_function_traced_once_and_compiled_once(program, sites, policy):
    """Dependent sites are rolled into a loop, independent ones stacked into one
    call (by the Roll policy, or by Auto where it decides so): either way the
    user's function is traced once and the compiled program holds one copy of its
    dot products."""
    counter = []
    chosen = lxd.Roll() if policy == "Roll" else lxd.Auto(cost_model=ROLL_MODEL)
    op = _operators(chosen, counter)[0]
    x = jnp.linspace(0.1, 1.0, N)
    compiled = lxd.jit(lambda x: program(op, x, sites))
    out = compiled(x)
    assert len(counter) == 1
    if policy == "Auto":
        (decision,) = compiled.decisions(x).values()
        assert decision.strategy == ("Lazy" if sites == 1 else "Roll")
    lazy = _operators(lxd.Lazy())[0]
    _close(out, jax.jit(lambda x: program(lazy, x, sites))(x))
    inline = jax.jit(lambda x: program(lazy, x, sites)).lower(x)
    assert _count_dots(inline) == sites * LAYERS
    assert _count_dots(compiled.lower(x)) == LAYERS


@pytest.mark.parametrize("policy", [lxd.Roll(), lxd.Lazy(), lxd.Auto()])
def test_marked_calls_under_plain_jit_are_inline(policy):
    """Outside `lxd.jit` an operator is applied as lineax applies it: the marked
    call is inlined by XLA (the same dot products as lineax's, and the same
    compiled operations), and the function is traced once for all call sites."""
    counter = []
    op = _operators(policy, counter)[0]
    x = jnp.ones(N)
    ours = jax.jit(lambda x: _loop(op, x, 4)).lower(x)
    plain = lx.FunctionLinearOperator(_chain, op.in_structure())
    theirs = jax.jit(lambda x: _loop(plain, x, 4)).lower(x)
    assert _count_dots(ours) == _count_dots(theirs) == 4 * LAYERS
    assert _count_ops(ours) == _count_ops(theirs)
    assert len(counter) == 1
    _close(op.mv(x), plain.mv(x))
    _close(
        jax.jit(lambda x: _loop(op, x, 4))(x), jax.jit(lambda x: _loop(plain, x, 4))(x)
    )


def test_static_and_donated_arguments():
    op = _operators(lxd.Roll())[0]
    lazy = _operators(lxd.Lazy())[0]

    @lxd.jit(static_argnums=1, donate_argnums=0)
    def f(x, k):
        return _loop(op, x, k)

    for k in (2, 3):
        _close(f(jnp.ones(N), k), jax.jit(lambda x: _loop(lazy, x, k))(jnp.ones(N)))


def test_unrolled_loops_share_one_branch():
    """A Python-unrolled loop becomes a plain loop: steps equal up to literals
    share a branch. The first step, which reads no carried value, shares it by
    starting the carried sum with its literal (`0 + x` of Python's `sum`); the
    last, which computes no next input, runs the branch's code that computes one
    (unused: cheap, without effects) or repeats the start of it after its call."""
    from lineax_dispatch.policies.calls._marked import MARKED_NAME
    from lineax_dispatch.program.analyse._groups import find_groups
    from lineax_dispatch.program.analyse._roll_plan import plan_roll

    op = _operators(lxd.Roll())[0]

    def dependent(x):
        for i in range(16):
            x = op.mv(x * (1.0 + 0.01 * i))
        return x

    def independent(x):
        return sum(op.mv(jnp.sin(x) * i) for i in range(16))

    x = jnp.ones(N)
    for f, branches in ((dependent, 1), (independent, 1)):
        jaxpr = jax.make_jaxpr(f)(x).jaxpr
        (group,) = find_groups(jaxpr).values()
        assert group.name == MARKED_NAME
        sites = group.sites
        assert len(sites) == 16
        plan = plan_roll(jaxpr, sites)
        assert len(plan.representatives) == branches
        assert plan.classes == (0,) * 16
        _close(lxd.jit(f)(x), jax.jit(lambda x: f(x))(x))


def _primitive_names(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names |= _primitive_names(sub)
    return names


def test_code_after_the_last_call_that_repeats_a_step_joins_the_loop():
    """`for i: x = op.mv(x); x = normalise(x, c_i)`: the last step's code is the
    first equations after the loop; it runs in the loop's last step, so every step
    shares one branch and the program has no `lax.switch`."""
    from lineax_dispatch.program.analyse._groups import find_groups
    from lineax_dispatch.program.analyse._roll_plan import plan_roll

    op = _operators(lxd.Roll())[0]

    def f(x):
        for i in range(6):
            x = op.mv(x)
            x = x * ((1.0 + 0.01 * i) / jnp.sqrt(jnp.vdot(x, x)))
        return jnp.sin(x)

    x = jnp.linspace(0.5, 1.5, N)
    jaxpr = jax.make_jaxpr(f)(x).jaxpr
    (group,) = find_groups(jaxpr).values()
    plan = plan_roll(jaxpr, group.sites)
    assert plan.classes == (0,) * 6 and plan.tail > 0

    names = _primitive_names(jax.make_jaxpr(lxd.jit(f))(x).jaxpr)
    assert "scan" in names and "cond" not in names
    _close(lxd.jit(f)(x), jax.jit(f)(x))
    loss = lambda x: jnp.sum(f(x) ** 2)
    _close(jax.grad(lxd.jit(loss))(x), jax.jit(jax.grad(loss))(x))
    _close(lxd.jit(jax.grad(loss))(x), jax.jit(jax.grad(loss))(x))
    _close(jax.jvp(lxd.jit(f), (x,), (jnp.cos(x),)), jax.jvp(f, (x,), (jnp.cos(x),)))
    xs = jnp.stack([x, 2 * x])
    _close(jax.vmap(lxd.jit(f))(xs), jax.vmap(f)(xs))


def test_a_program_compiled_as_it_is_rolls_into_a_while_loop():
    """Called (or lowered) outside any trace, the rolled calls are a
    `lax.while_loop`, which JAX lowers directly; under a trace, which may
    differentiate the program in reverse mode, a `lax.scan`, rewritten only then."""
    op = _operators(lxd.Roll())[0]

    def f(x):
        for i in range(4):
            x = op.mv(x) * (1.0 + 0.1 * i)
        return x

    x = jnp.linspace(0.5, 1.5, N)
    jitted = lxd.jit(f)
    _close(jitted(x), jax.jit(f)(x))
    (entry,) = jitted._compiled.values()
    program = entry.program
    assert set(program.jaxprs) == {"while"}
    names = _primitive_names(program.jaxprs["while"].jaxpr)
    assert "while" in names and "scan" not in names
    loss = lambda g: lambda x: jnp.sum(g(x) ** 2)
    _close(jax.grad(loss(jitted))(x), jax.jit(jax.grad(loss(f)))(x))
    assert set(program.jaxprs) == {"while", "scan"}
    assert "scan" in _primitive_names(jax.make_jaxpr(jitted)(x).jaxpr)


def test_the_step_number_stays_unbatched_under_vmap():
    """Steps with different code are branches of a `lax.switch` on the step number;
    under `vmap` the step number is not batched, so the switch stays a switch (with
    a batched index, `vmap` would turn it into every branch at every step and a
    select)."""
    op = _operators(lxd.Roll())[0]

    def f(x):
        for i in range(6):
            x = op.mv(x)
            x = jnp.sin(x) if i % 2 else jnp.cos(x) * (1.0 + 0.1 * i)
        return x

    x = jnp.linspace(0.5, 1.5, N)
    xs = jnp.stack([x, 2 * x, -x])
    names = _primitive_names(jax.make_jaxpr(jax.vmap(lxd.jit(f)))(xs).jaxpr)
    assert "scan" in names and "cond" in names
    _close(jax.vmap(lxd.jit(f))(xs), jax.jit(jax.vmap(f))(xs))


def test_literals_equal_as_numbers_but_not_bits_are_told_apart():
    """`0.0` and `-0.0` (equal as numbers) at different steps, between the calls
    and as a call's input: each step's own, as under `jax.jit`."""
    op = lxd.MatrixLinearOperator(jnp.eye(3), policy=lxd.Roll())

    def between(x):
        count = jnp.zeros(3)
        for c in [0.0, -0.0, 0.0, -0.0, 0.0]:
            x = op.mv(x)
            count = count + jnp.signbit(jnp.abs(x) * c).astype(x.dtype)
        return count

    @jax.jit
    def g(x, c):
        for _ in range(40):  # enough equations to be rolled
            x = jnp.sin(x)
        return x + jnp.signbit(c)

    as_input = lambda x: g(x, 0.0) + 10 * g(x, -0.0)
    x = jnp.ones(3)
    for program in (between, as_input):
        _close(lxd.jit(program)(x), jax.jit(program)(x))
    assert float(lxd.jit(between)(x)[0]) == 2.0


def test_calls_with_effects_run_in_order_and_are_not_stacked():
    """Independent calls of a `Roll` operator whose function has an ordered
    effect: rolled rather than stacked (`vmap` cannot batch an ordered callback),
    each call's effect run once, in program order, as under `jax.jit`."""
    from jax.experimental import io_callback

    seen: list[float] = []

    def fn(x):
        io_callback(lambda s: seen.append(float(s)), None, x.sum(), ordered=True)
        return 2.0 * x

    structure = jax.ShapeDtypeStruct((3,), jnp.float64)
    op = lxd.FunctionLinearOperator(fn, structure, policy=lxd.Roll())
    f = lambda x: op.mv(x) + op.mv(2 * x) + op.mv(3 * x)
    x = jnp.ones(3)
    expected = jax.jit(f)(x)
    assert seen == [3.0, 6.0, 9.0]
    seen.clear()
    _close(lxd.jit(f)(x), expected)
    assert seen == [3.0, 6.0, 9.0]


def test_each_policy_s_estimate_is_reached_from_its_rule():
    """The registry of rules (`RULES`, by policy class) reaches each policy's
    estimate, the one `decide` reads by class below the program (`ESTIMATES`)."""
    from lineax_dispatch.policies.decision._formulas import ESTIMATES
    from lineax_dispatch.program.rewrite._rules import RULES

    assert set(RULES) == set(ESTIMATES)
    for policy, rule in RULES.items():
        assert rule.estimate is ESTIMATES[policy]


def test_a_roll_group_s_plan_is_made_once_per_program(monkeypatch):
    """Two `Roll` groups one after the other: each group's plan is made once for
    each program it is applied in (the first for the traced program, kept for
    both kinds of loop; the second for each rewritten program), never for one
    that no rewrite applies it in."""
    from lineax_dispatch.program.rewrite import _rules

    made = []
    plan_roll = _rules.plan_roll
    monkeypatch.setattr(
        _rules,
        "plan_roll",
        lambda jaxpr, sites: made.append(jaxpr) or plan_roll(jaxpr, sites),
    )
    op, other, _ = _operators(lxd.Roll())

    def f(x):
        for _ in range(3):
            x = op.mv(x) * 1.1
        x = jnp.sin(x)
        for _ in range(3):
            x = other.mv(x) * 0.9
        return x

    compiled = lxd.jit(f)
    jax.make_jaxpr(compiled)(ZOO_X)
    compiled.lower(ZOO_X)
    assert len(made) == 3 and len({id(jaxpr) for jaxpr in made}) == 3
    _close(compiled(ZOO_X), jax.jit(f)(ZOO_X))
