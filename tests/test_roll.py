"""The `Roll` rewrite of `lxd.jit`: a zoo of programs, each compared with `jax.jit`
of the same program under jit, grad, jvp and vmap; the rolled program holds one
copy of the operator's dot products and traces the user's function once."""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd


N, LAYERS = 6, 3
_KEYS = jax.random.split(jax.random.key(0), LAYERS)
_WEIGHTS = [
    jnp.eye(N) + 0.3 * jax.random.normal(k, (N, N), jnp.float64) / N for k in _KEYS
]


def _chain(x):
    for w in _WEIGHTS:
        x = w @ x
    return x


def _operators(policy, counter=None):
    def fn(x):
        if counter is not None:
            counter.append(1)
        return _chain(x)

    structure = jax.ShapeDtypeStruct((N,), jnp.float64)
    op = lxd.FunctionLinearOperator(fn, structure, closure_convert=False, policy=policy)
    other = lxd.MatrixLinearOperator(
        jnp.arange(N * N, dtype=jnp.float64).reshape(N, N) / N**2, policy=policy
    )
    tree = lxd.FunctionLinearOperator(
        lambda t: {"a": _chain(t["a"]) + t["b"][:N], "b": 2 * t["b"]},
        {
            "a": jax.ShapeDtypeStruct((N,), jnp.float64),
            "b": jax.ShapeDtypeStruct((N + 1,), jnp.float64),
        },
        policy=policy,
    )
    return op, other, tree


def _dependent(ops, x):
    op = ops[0]
    for i in range(5):
        x = op.mv(x * (1.0 + 0.1 * i))
    return x


def _independent(ops, x):
    op = ops[0]
    return sum(op.mv(jnp.sin(x) * i) for i in range(4))


def _mixed(ops, x):
    op = ops[0]
    a = op.mv(x)
    b = op.mv(jnp.cos(x))
    c = op.mv(a * b)
    d = jnp.tanh(c) + a
    return op.mv(d) - b, c


def _two_operators(ops, x):
    op, other = ops[0], ops[1]
    for _ in range(3):
        x = other.mv(op.mv(x)) + 0.5 * x
    return x


def _pytree(ops, x):
    tree = ops[2]
    t = {"a": x, "b": jnp.concatenate([x, x[:1]])}
    for _ in range(3):
        t = tree.mv(t)
    return t["a"].sum() * x + t["b"][:N]


def _in_scan_and_cond(ops, x):
    op = ops[0]
    y = op.mv(x)

    def step(carry, _):
        return op.mv(carry) * 0.5, None

    z, _ = jax.lax.scan(step, y, None, length=3)
    w = jax.lax.cond(z.sum() > 0, lambda v: op.mv(v), lambda v: -v, z)
    return op.mv(w) + y


def _with_effects(ops, x):
    op = ops[0]
    y = op.mv(x)
    jax.debug.print("between calls {}", y.sum())
    y = eqx.error_if(y, ~jnp.all(jnp.isfinite(y)), "not finite")
    return op.mv(y) + op.mv(2 * y)


def _with_solve(ops, x):
    op = ops[0]
    b = op.mv(x)
    dense = lxd.MatrixLinearOperator(
        jnp.eye(N) * 3 + 0.1, lx.positive_semidefinite_tag, policy=lxd.Lazy()
    )
    y = lx.linear_solve(dense, b, lxd.CG(1e-10, 1e-10)).value
    return op.mv(y) + op.mv(b)


ZOO_X = jnp.linspace(0.1, 1.0, N)
ZOO = {
    "dependent": _dependent,
    "independent": _independent,
    "mixed": _mixed,
    "two-operators": _two_operators,
    "pytree": _pytree,
    "in-scan-and-cond": _in_scan_and_cond,
    "effects": _with_effects,
    "solve": _with_solve,
}


def _pair(name):
    rolled_ops = _operators(lxd.Roll())
    lazy_ops = _operators(lxd.Lazy())
    program = ZOO[name]
    return (
        lambda x: program(rolled_ops, x),
        lambda x: program(lazy_ops, x),
    )


def _close(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12)


# `jax.jit` of these programs fails inside jax's leak report too (an IndexError
# there, from `eqx.error_if`, which lineax's `throw` uses): no leak check.
NO_LEAK_CHECK = ("effects", "solve")


@ft.cache
def lazy_reference(name):
    """`jax.jit` of the zoo's program `name` on `Lazy` operators, at `ZOO_X`
    (leak-checked where it can be): the reference of every rewrite of it here and
    in test_program.py, so computed once."""
    lazy_ops = _operators(lxd.Lazy())
    f = jax.jit(lambda x: ZOO[name](lazy_ops, x))
    if name in NO_LEAK_CHECK:
        return f(ZOO_X)
    with jax.checking_leaks():
        return f(ZOO_X)


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


def _loop(op, x, sites):
    for i in range(sites):
        x = op.mv(x) * (1.0 + 0.01 * i)
    return x


def _sum(op, x, sites):
    return sum(op.mv(jnp.sin(x) * (i + 1)) for i in range(sites))


# A cost model under which Auto rolls whenever it can (for tests).
ROLL_MODEL = lxd.CostModel(
    compile_per_dot=10.0, materialise_fixed=1e3, outline_site=1e3
)


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
    from lineax_dispatch.policies._marked import MARKED_NAME
    from lineax_dispatch.policies._program import find_groups
    from lineax_dispatch.policies._roll_plan import plan_roll

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
    from lineax_dispatch.policies._program import find_groups
    from lineax_dispatch.policies._roll_plan import plan_roll

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
    program = entry.jitted
    assert set(program._jitted) == {"while"}
    names = _primitive_names(program._jitted["while"].trace(x).jaxpr.jaxpr)
    assert "while" in names and "scan" not in names
    loss = lambda g: lambda x: jnp.sum(g(x) ** 2)
    _close(jax.grad(loss(jitted))(x), jax.jit(jax.grad(loss(f)))(x))
    assert set(program._jitted) == {"while", "scan"}
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


@jax.jit
def _user_function(x):
    for i in range(40):
        x = jnp.sin(x) * (1.0 + 0.001 * i)
    return x


def _nested_dependent(x):
    for i in range(6):
        x = _user_function(x) + 0.1 * i
    return x


def _nested_independent(x):
    return sum(_user_function(x * (i + 1)) for i in range(6))


def _tiny(x):
    return jnp.cos(x)


@pytest.mark.parametrize("program", [_nested_dependent, _nested_independent])
def test_repeated_user_jit_functions_are_rolled(program):
    """A `jax.jit` function of the user's called at several sites is rolled too:
    the same results as `jax.jit` (under grad and vmap), one copy of its body."""
    x = jnp.linspace(0.1, 1.0, N)
    _close(lxd.jit(program)(x), jax.jit(program)(x))
    loss = lambda x: program(x).sum()
    _close(jax.grad(lxd.jit(loss))(x), jax.jit(jax.grad(loss))(x))
    xs = jnp.stack([x, 2 * x])
    _close(jax.vmap(lxd.jit(program))(xs), jax.jit(jax.vmap(program))(xs))
    sines = lambda lowered: lowered.compile().as_text().count(" sine(")
    assert sines(jax.jit(program).lower(x)) == 6 * 40
    assert sines(lxd.jit(program).lower(x)) == 40
    # A small function is left as it is.
    small = jax.jit(_tiny)
    f = lambda x: small(x) + small(2 * x)
    _close(lxd.jit(f)(x), jax.jit(f)(x))


@jax.jit
def _two_inputs(x, y):
    for i in range(20):
        x = jnp.sin(x) * (1.0 + 0.001 * i) + 0.01 * jnp.sum(y)
    return x


_C = jnp.linspace(0.3, 0.9, N + 1)


def _fresh_only(x):
    # The second input of each call is computed from values of before the loop
    # and the step's literal: computed where it is used, never carried.
    for i in range(6):
        x = _two_inputs(x, jnp.cos(_C) * (i + 1))
    return x


def _fresh_also_read(x):
    # The same input, also read by the code after the call: it stays carried.
    for i in range(6):
        y = jnp.cos(_C) * (i + 1)
        x = _two_inputs(x, y) + y[:N]
    return x


def _fresh_with_effect(x):
    # An effect between the calls stays where it is, in order.
    for i in range(4):
        y = jnp.cos(_C) * (i + 1)
        jax.debug.print("step {i}", i=i)
        x = _two_inputs(x, y)
    return x


def _fresh_read_after(x):
    # The last call's input is also read after the loop: it stays carried.
    for i in range(5):
        y = jnp.sin(_C) * i
        x = _two_inputs(x, y)
    return x + y[:N]


@pytest.mark.parametrize(
    "program",
    [_fresh_only, _fresh_also_read, _fresh_with_effect, _fresh_read_after],
)
def test_inputs_computed_from_before_the_loop_are_not_carried(program, capfd):
    """A call's input computed between two calls only from values of before the
    loop (and the step's literals) is computed at the start of the step that reads
    it: the loop carries no value of its shape, and the results (under grad, jvp
    and vmap) and effects are `jax.jit`'s."""
    x = jnp.linspace(0.1, 1.0, N)
    _close(lxd.jit(program)(x), jax.jit(program)(x))
    loss = lambda x: program(x).sum()
    _close(jax.grad(lxd.jit(loss))(x), jax.jit(jax.grad(loss))(x))
    _close(
        jax.jvp(lxd.jit(program), (x,), (jnp.cos(x),)),
        jax.jvp(program, (x,), (jnp.cos(x),)),
    )
    xs = jnp.stack([x, 2 * x])
    _close(jax.vmap(lxd.jit(program))(xs), jax.jit(jax.vmap(program))(xs))
    if program is _fresh_with_effect:
        capfd.readouterr()
        jax.block_until_ready(lxd.jit(program)(x + 1))
        printed = capfd.readouterr().out.split("\n")
        assert [p for p in printed if p] == [f"step {i}" for i in range(4)]
    (scan,) = [
        e
        for e in jax.make_jaxpr(lxd.jit(program))(x).eqns[0].params["jaxpr"].eqns
        if e.primitive.name == "scan"
    ]
    carried = scan.params["num_carry"]
    shapes = [v.aval.shape for v in scan.invars[scan.params["num_consts"] :]][:carried]
    fresh = program in (_fresh_only, _fresh_with_effect)
    assert ((N + 1,) in shapes) == (not fresh)


def _from_before(x):
    """The carried sum starts from a value computed before the first call."""
    total = jnp.cos(x)
    for i in range(5):
        total = total + _user_function(x * (i + 1))
    return total


def _heavy_next(x):
    """The code computing the next input is a matrix product that the program does
    not run after the last call: the last step does not run it either."""
    for _ in range(4):
        x = _user_function(_WEIGHTS[0] @ x)
    return x


def _counted(calls):
    def record(v):
        calls.append(float(v))

    def effects_between(x):
        """An effect after every call, the last included: it joins the loop."""
        for i in range(4):
            x = _user_function(x) * (1.0 + 0.1 * i)
            jax.debug.callback(record, x.sum(), ordered=True)
        return x

    def effects_in_next(x):
        """An effect in the code computing the next input: not run once more."""
        total = 0.0
        y = x
        for i in range(4):
            total = total + _user_function(y)
            y = x * (i + 2.0)
            jax.debug.callback(record, y.sum(), ordered=True)
        return total

    return effects_between, effects_in_next


@pytest.mark.parametrize("which", ["from_before", "heavy_next", "between", "next"])
def test_first_and_last_steps_join_the_loop_only_where_equivalent(which):
    """The first step's carried start and the last step's extra code (see
    `test_unrolled_loops_share_one_branch`) give `jax.jit`'s results under jit,
    grad, jvp and vmap, and effects run as often, in the same order."""
    calls_jit, calls_lxd = [], []
    pick = {"from_before": 0, "heavy_next": 1, "between": 2, "next": 3}[which]
    programs = [
        (_from_before, _from_before),
        (_heavy_next, _heavy_next),
        (_counted(calls_jit)[0], _counted(calls_lxd)[0]),
        (_counted(calls_jit)[1], _counted(calls_lxd)[1]),
    ]
    reference, program = programs[pick]
    x = jnp.linspace(0.1, 1.0, N)
    _close(lxd.jit(program)(x), jax.jit(reference)(x))
    jax.effects_barrier()
    assert len(calls_lxd) == len(calls_jit)
    np.testing.assert_allclose(calls_lxd, calls_jit, rtol=1e-12)
    if which in ("from_before", "heavy_next"):
        from lineax_dispatch.policies._program import find_groups
        from lineax_dispatch.policies._roll_plan import plan_roll

        jaxpr = jax.make_jaxpr(program)(x).jaxpr
        (group,) = [g for g in find_groups(jaxpr).values() if len(g.sites) > 1]
        plan = plan_roll(jaxpr, group.sites)
        if which == "from_before":  # one branch; the sum starts from `cos(x)`
            assert plan.classes == (0,) * 5 and plan.initial[0][0] == "var"
        else:  # the last step runs no matrix product the program does not
            assert plan.tail is None and plan.classes == (0, 0, 0, 1)
        loss = lambda f: lambda x: jnp.sum(f(x) ** 2)
        _close(
            jax.grad(lxd.jit(loss(program)))(x), jax.jit(jax.grad(loss(reference)))(x)
        )
        _close(
            lxd.jit(jax.grad(loss(program)))(x), jax.jit(jax.grad(loss(reference)))(x)
        )
        t = jnp.cos(x)
        _close(jax.jvp(lxd.jit(program), (x,), (t,)), jax.jvp(reference, (x,), (t,)))
        xs = jnp.stack([x, 2 * x])
        _close(jax.vmap(lxd.jit(program))(xs), jax.jit(jax.vmap(reference))(xs))
