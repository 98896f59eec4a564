"""Run-time errors under `lxd.jit` (`eqx.error_if`, lineax's `throw=True`) are raised
as `eqx.filter_jit` raises them: an `EquinoxRuntimeError` with the readable
message, not JAX's `JaxRuntimeError`; whatever the program's rewrite."""

import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd

from ..helpers.roll_programs import ROLL_MODEL


N = 4


def _spd(n):
    return jnp.diag(jnp.arange(1.0, n + 1.0))


def _singular(n):
    return jnp.ones((n, n))


_STEPS = "The maximum number of solver steps was reached"
_TAIL = "equinox.EquinoxRuntimeError: "
_NOT_FILTER_JIT = "you do not appear to be using `equinox.filter_jit`"


def _raised(fn, *args) -> BaseException:
    """The exception that calling `fn(*args)` raises (blocking on its output)."""
    with pytest.raises(Exception) as info:
        jax.block_until_ready(fn(*args))
    return info.value


def _same_error(program, make_args, message: str, exact: bool = True):
    """`lxd.jit(program)` raises as `eqx.filter_jit(program)` does (the same type
    and, where `exact`, the same message: the traced stack is the user's), on the
    first call and on a later one (its stack the first's, from the caller on).

    Each is called with arguments of its own size, `make_args(n)`: JAX caches the
    traces of `eqx.error_if` and lineax's lowering by shape, the stack recorded in
    them included. A solve's error is recorded where lineax traces the solve: on
    jax >= 0.11, `eqx.filter_jit` reuses at lowering the trace made in the
    program's trace (its stack the user's), where `lxd.jit`, lowering under the
    caller's jit-cache context, traces it again (its stack lineax's from the
    lowering): `exact=False` there."""
    raised = {}
    for n, jit in enumerate((eqx.filter_jit, lxd.jit)):
        jitted = jit(program)
        args = make_args(N + n)
        raised[jit] = [_raised(jitted, *args) for _ in range(2)]  # traced, cached
    for expected, got in zip(raised[eqx.filter_jit], raised[lxd.jit]):
        assert type(expected) is eqx.EquinoxRuntimeError
        assert message in str(expected)
        assert type(got) is eqx.EquinoxRuntimeError, repr(got)[:2000]
        assert message in str(got)
        assert _NOT_FILTER_JIT not in str(got)
        assert got.__cause__ is None and got.__suppress_context__
        assert "lineax_dispatch/policies/_jit.py" not in str(got)
        if exact:
            assert str(got) == str(expected)
        else:  # the same message and advice; the stack may be another trace's
            assert str(got).split(_TAIL)[1] == str(expected).split(_TAIL)[1]
    return jitted


def _check(x):
    return eqx.error_if(x, jnp.sum(x) > 0, "x must be non-positive")


def test_error_if():
    ones = lambda n: (jnp.ones(n),)
    jitted = _same_error(_check, ones, message="x must be non-positive")
    assert "return eqx.error_if(x, jnp.sum(x) > 0" in str(_raised(jitted, *ones(N)))
    np.testing.assert_array_equal(jitted(-jnp.ones(N)), -jnp.ones(N))


def test_other_errors_pass_as_they_are():
    def bad(x):
        raise ValueError("not a runtime error")

    with pytest.raises(ValueError, match="not a runtime error"):
        lxd.jit(bad)(jnp.ones(2))


def _cg(policy):
    def program(b):
        a = _spd(b.size)
        op = lxd.MatrixLinearOperator(a, lx.positive_semidefinite_tag, policy=policy)
        return lx.linear_solve(op, b, lx.CG(1e-10, 1e-10, max_steps=1)).value

    return program


def _lu(a, b):
    return lx.linear_solve(lx.MatrixLinearOperator(a), b, lx.LU()).value


@pytest.mark.parametrize("policy", [None, lxd.Auto()], ids=["default", "Auto"])
def test_failed_cg_solve(policy):
    program = _cg(lxd.Lazy() if policy is None else policy)
    _same_error(program, lambda n: (jnp.ones(n),), message=_STEPS, exact=False)


def test_failed_lu_solve():
    args = lambda n: (_singular(n), jnp.ones(n))
    _same_error(_lu, args, message="non-finite (NaN or inf)", exact=False)


def test_failed_solve_of_this_package():
    def program(b):
        op = lxd.MatrixLinearOperator(
            _spd(b.size), lx.positive_semidefinite_tag, policy=lxd.Auto()
        )
        total = b
        for i in range(3):  # solves from one line: decided together
            total = (
                total
                + lx.linear_solve(
                    op, b * (i + 1), lxd.CG(rtol=1e-10, atol=1e-10, max_steps=1)
                ).value
            )
        return total

    _same_error(program, lambda n: (jnp.ones(n),), message=_STEPS, exact=False)


def _rewritten(policy, limit):
    """A program whose sites of `op` are rolled (a rewrite), with a check and a
    failing solve between them (an operator per size of the input)."""
    ops = {
        n: lxd.FunctionLinearOperator(
            lambda v: 0.5 * v[::-1],
            jax.ShapeDtypeStruct((n,), jnp.float64),
            policy=policy,
        )
        for n in (N, N + 1)
    }
    solve = _cg(lxd.Lazy())

    def program(x):
        op = ops[x.size]
        for _ in range(4):
            x = op.mv(x) + 1.0
        x = eqx.error_if(x, jnp.sum(x) > limit, "too large")
        x = solve(x)
        for _ in range(4):
            x = op.mv(x) * 2.0
        return x

    return program


@pytest.mark.parametrize(
    "policy",
    [lxd.Roll(), lxd.Auto(runs=1, cost_model=ROLL_MODEL)],
    ids=["Roll", "Auto"],
)
def test_errors_of_rewritten_programs(policy):
    x = lambda n: (jnp.linspace(0.1, 1.0, n),)
    jitted = _same_error(_rewritten(policy, limit=0.0), x, message="too large")
    assert jitted.compiled(jitted.split(x(N + 1), {})).program.rewritten
    if isinstance(policy, lxd.Auto):
        assert {d.strategy for d in jitted.decisions(*x(N + 1)).values()} == {"Roll"}
    _same_error(_rewritten(policy, limit=np.inf), x, message=_STEPS, exact=False)


def test_errors_under_grad():
    loss = lambda x: jnp.sum(_check(x) ** 2)
    x = jnp.ones(3)
    # Differentiating the compiled function, and compiling the derivative.
    for wrap in (
        lambda jit: jax.grad(jit(loss)),
        lambda jit: jit(jax.grad(loss)),
    ):
        expected = _raised(wrap(eqx.filter_jit), x)
        got = _raised(wrap(lxd.jit), x)
        assert type(got) is type(expected)
        assert "x must be non-positive" in str(got)
    np.testing.assert_array_equal(jax.grad(lxd.jit(loss))(-x), -2 * x)


_ENV_PROGRAM = """
import jax, jax.numpy as jnp, equinox as eqx
import lineax_dispatch as lxd

def f(x):
    return eqx.error_if(x, jnp.sum(x) > 0, "x must be non-positive")

for jit in (eqx.filter_jit, lxd.jit):
    print(jit.__name__, jit(f)(jnp.ones(2)))
"""


@pytest.mark.parametrize("mode", ["nan", "breakpoint"])
def test_eqx_on_error_is_equinox_s(mode):
    """`EQX_ON_ERROR=nan` returns NaN, `=breakpoint` opens JAX's debugger (here
    told to continue), under `lxd.jit` as under `eqx.filter_jit`."""
    env = dict(os.environ, EQX_ON_ERROR=mode, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_ENV_PROGRAM)],
        env=env,
        input="c\n" * 4,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [
        line.removeprefix("(jdb) ")
        for line in done.stdout.splitlines()
        if line.endswith("]")
    ]
    assert lines[-2:] == ["filter_jit [nan nan]", "jit [nan nan]"], done.stdout
    if mode == "breakpoint":
        assert done.stdout.count("x must be non-positive") == 2, done.stdout


def _plain(jitted, *args) -> bool:
    """Whether `jitted`'s program for `args` is called straight, as `jax.jit`'s."""
    jitted(*args)
    return jitted.compiled(jitted.split(args, {})).program.plain


def test_only_programs_that_call_back_are_waited_for():
    # A program with no host callback cannot raise at run time: it is called as
    # `jax.jit` calls it, its output not waited for. One with an `eqx.error_if`
    # (lineax's `throw=True`) is waited for, its errors raised readably (above).
    x = -jnp.ones(N)
    assert _plain(lxd.jit(lambda x: 2 * x), x)
    assert not _plain(lxd.jit(_check), x)
    op = lxd.MatrixLinearOperator(_spd(N), lx.positive_semidefinite_tag)
    for throw in (False, True):
        jitted = lxd.jit(
            lambda b, throw=throw: (
                lx.linear_solve(op, b, lxd.CG(1e-6, 1e-6), throw=throw).value
            )
        )
        assert _plain(jitted, x) is not throw
        np.testing.assert_allclose(jitted(x), x / jnp.arange(1.0, N + 1.0), rtol=1e-6)
