"""Results that must not depend on what ran before in the process: each program
here runs in a fresh Python process of its own, against `jax.jit`."""

import subprocess
import sys
import textwrap


def _run_fresh(code: str) -> str:
    """Runs `code` in a new Python process (the tests' XLA flags inherited) and
    returns what it printed; fails with its error output if it fails."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


_CHORD = """
import jax, jax.numpy as jnp, numpy as np, optimistix as optx
import lineax_dispatch as lxd

def F(y, a):
    return y**3 + a * y - 0.3 * jnp.roll(y, 1) - 1.0 + 0.1 * jnp.arange(8) * y

def make(inner):
    def f(a):
        solver = lxd.PolicySolver(inner, lxd.Auto())
        s = optx.Chord(1e-6, 1e-6, linear_solver=solver)
        y0 = jnp.full(8, 0.1, jnp.float32)
        return optx.root_find(F, s, y0, args=a, throw=False).value.sum()
    return f

a = jnp.float32(2.0)
for inner in (lxd.GMRES(1e-7, 1e-7), lxd.BiCGStab(1e-7, 1e-7)):
    f = make(inner)
    got = jax.grad(lxd.jit(f))(a)          # first: nothing of ours ran before
    expected = jax.grad(jax.jit(f))(a)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    np.testing.assert_allclose(lxd.jit(jax.grad(f))(a), expected, rtol=1e-4)
print("ok")
"""


def test_grad_of_lxd_jit_through_chord_in_a_fresh_process():
    """`jax.grad(lxd.jit(f))` through optimistix's `Chord` with a `PolicySolver` of
    an `Auto` iterative solver, first thing in a process: the policy held in
    Chord's linear state has one structure whether or not an `lxd.jit` record
    rides on it (a missing record shifted the static leaves: optimistix's custom
    JVP saw two structures and raised), so the result is `jax.jit`'s whatever
    ran before."""
    assert _run_fresh(_CHORD).strip().endswith("ok")
