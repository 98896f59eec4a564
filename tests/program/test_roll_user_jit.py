"""The `Roll` rewrite of `lxd.jit` applied to the user's own `jax.jit` functions
called at several sites: rolled as operators are (one copy of the body), with
inputs computed from before the loop left uncarried and the first and last steps
joining the loop only where that is equivalent; `jax.jit`'s results and effects
under jit, grad, jvp and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch import _compat

from ..helpers.roll_programs import (
    _close,
    _WEIGHTS,
    N,
    nested_dependent as _nested_dependent,
    user_function as _user_function,
)


def _nested_independent(x):
    return sum(_user_function(x * (i + 1)) for i in range(6))


def _tiny(x):
    return jnp.cos(x)


def _matches_jax_jit(program, x):
    """`lxd.jit(program)` gives `jax.jit`'s results, under grad and vmap."""
    _close(lxd.jit(program)(x), jax.jit(program)(x))
    loss = lambda x: program(x).sum()
    _close(jax.grad(lxd.jit(loss))(x), jax.jit(jax.grad(loss))(x))
    xs = jnp.stack([x, 2 * x])
    _close(jax.vmap(lxd.jit(program))(xs), jax.jit(jax.vmap(program))(xs))


@pytest.mark.parametrize("program", [_nested_dependent, _nested_independent])
def test_repeated_user_jit_functions_are_rolled(program):
    """A `jax.jit` function of the user's called at several sites is rolled too:
    the same results as `jax.jit` (under grad and vmap), one copy of its body."""
    x = jnp.linspace(0.1, 1.0, N)
    _matches_jax_jit(program, x)
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
    # The same input, also read by the code after the call: the loop is cut
    # before the input's equations (one branch: the last step's code after its
    # call is the others'), so each step computes it and nothing is carried.
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
    consts, carried = _compat.scan_counts(scan)
    shapes = [v.aval.shape for v in scan.invars[consts:]][:carried]
    fresh = program in (_fresh_only, _fresh_with_effect, _fresh_also_read)
    assert ((N + 1,) in shapes) == (not fresh)


def _from_before(x):
    """The carried sum starts from a value computed before the first call."""
    total = jnp.cos(x)
    for i in range(5):
        total = total + _user_function(x * (i + 1))
    return total


def _heavy_next(x):
    """The code computing the next input is a matrix product that the program does
    not run after the last call: the loop is cut at the products instead (each
    step a product and a call: one branch), so no step runs a product the
    program does not."""
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
    `test_unrolled_loops_share_one_branch` in test_roll.py) give `jax.jit`'s
    results under jit, grad, jvp and vmap, and effects run as often, in the same
    order."""
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
        from lineax_dispatch.program.analyse._groups import find_groups
        from lineax_dispatch.program.analyse._roll_plan import plan_roll

        jaxpr = jax.make_jaxpr(program)(x).jaxpr
        (group,) = [g for g in find_groups(jaxpr).values() if len(g.sites) > 1]
        plan = plan_roll(jaxpr, group.sites)
        if which == "from_before":  # one branch; the sum starts from `cos(x)`
            assert plan.classes == (0,) * 5 and plan.initial[0][0] == "var"
        else:  # cut at the products: one branch, none run once more
            assert plan.classes == (0,) * 4
            assert {jaxpr.eqns[s].primitive.name for s in plan.sites} == {"dot_general"}
            assert len(jaxpr.eqns) == plan.sites[-1] + 2  # product, call: all
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


@jax.jit
def _scaled(x, c):
    for _ in range(40):
        x = jnp.sin(x) + c
    return x


def _literal_independent(x):
    # A Python number passed at each site: a literal of the call, differing
    # between calls (stacked: the calls are independent).
    return sum(_scaled(x, float(i)) for i in range(1, 4))


def _literal_dependent(x):
    for i in range(4):
        x = _scaled(x, 0.5 * i)  # rolled
    return x


def _literal_or_variable(x):
    # A literal at some calls, a traced value at another (a computation of its
    # own: a Python number is weakly typed, so jax traces the function apart).
    return _scaled(x, 1.0) + _scaled(x, jnp.sum(x)) + _scaled(x, 2.0)


@pytest.mark.parametrize(
    "program, copies",
    [(_literal_independent, 1), (_literal_dependent, 1), (_literal_or_variable, 2)],
)
def test_call_inputs_that_are_literals(program, copies):
    """A call input that is a literal at each site (a Python number passed to a
    jitted function), differing between sites: each site's own value, as under
    `jax.jit` (under grad and vmap), with one copy of the body per computation."""
    x = jnp.linspace(0.1, 1.0, N)
    _matches_jax_jit(program, x)
    sines = lambda lowered: lowered.compile().as_text().count(" sine(")
    assert sines(lxd.jit(program).lower(x)) == 40 * copies


def test_weakly_typed_outputs_stay_weak():
    """An output `jax.jit` returns weakly typed (a Python number's result, here
    out of a rolled helper) comes back weakly typed, so that later promotion is
    the same (a float16 operand keeps float16)."""

    @jax.jit
    def helper(v, s):
        for _ in range(3):
            v = jnp.tanh(v @ v.T @ v)
        return v, s * 2

    def f(x):
        a, _ = helper(x, 1.0)
        b, s = helper(a, 2.0)
        return b, s

    x = jnp.eye(3) * 0.1
    for ours, theirs in zip(lxd.jit(f)(x), jax.jit(f)(x)):
        assert (ours.dtype, ours.weak_type) == (theirs.dtype, theirs.weak_type)
        assert (ours + jnp.float16(1)).dtype == (theirs + jnp.float16(1)).dtype
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
