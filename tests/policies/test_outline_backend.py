"""`Outline` on a backend that cannot run it: refused at trace time, by a message
naming the backend and what runs there, and never chosen by `Auto`.

On jax < 0.11 an outlined call is a host callback that runs its callee's
executable while the calling program runs: on XLA:CPU it works; on an accelerator
the callee waits for the device the program holds, and the program never ends.
These tests stand a TPU in for the default backend (the refusal is decided from
`jax.default_backend()` at trace time) and so run on the CPU.
"""

import jax
import jax.numpy as jnp
import lineax as lx
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.policies._outline import outline_runs_here
from lineax_dispatch.policies.calls._marked import outline_mv
from lineax_dispatch.policies.decision._observation import Observation
from lineax_dispatch.policies.decision._rule import decide


callbacks_only = pytest.mark.skipif(
    outline_mv is not None, reason="this JAX outlines natively (jax.Inline.XLA_LATE)"
)


@pytest.fixture
def on_tpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")


def _operator(policy):
    matrix = jnp.eye(4, dtype=jnp.float32) * 2.0
    structure = jax.ShapeDtypeStruct((4,), jnp.float32)
    tag = lx.positive_semidefinite_tag
    return lxd.FunctionLinearOperator(
        lambda x: matrix @ x, structure, tag, policy=policy
    )


@callbacks_only
def test_outline_is_refused_naming_the_backend(on_tpu):
    op = _operator(lxd.Outline())
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(ValueError, match=r"(?s)runs only on the CPU.*'tpu'.*Lazy"):
        jax.jit(lambda x: op.mv(x) + op.mv(2 * x))(x)
    with pytest.raises(ValueError, match=r"(?s)'tpu'.*Roll"):
        lxd.jit(lambda op, x: op.mv(x) + op.mv(2 * x))(op, x)
    solve = lambda b: lx.linear_solve(op, b, lxd.CG(1e-5, 1e-5)).value
    with pytest.raises(ValueError, match="'tpu'"):
        jax.jit(solve)(x)


@callbacks_only
def test_auto_never_chooses_outline_where_it_cannot_run(on_tpu):
    assert not outline_runs_here()
    model = lxd.Auto().model()
    assert not model.outline_callbacks
    # A program where Outline would win on a CPU: an expensive mv at many sites in
    # branches (not rollable), run once.
    observation = Observation(
        kind="FunctionLinearOperator",
        dtype="float32",
        in_size=64,
        out_size=64,
        itemsize=4,
        call_sites=16,
        executions=16.0,
        runs=1.0,
        mv_flops=1e6,
        mv_bytes=1e6,
        mv_dots=64,
        mv_ops=64,
        memory_budget=1000,  # no room for the matrix
    )
    on_cpu = decide(observation, lxd.CostModel())
    assert on_cpu.strategy == "Outline"
    on_tpu_decision = decide(observation, model)
    assert on_tpu_decision.strategy != "Outline"
    outline = [e for e in on_tpu_decision.estimates if e.strategy == "Outline"]
    assert all(e.seconds is None for e in outline)


@callbacks_only
def test_outline_is_refused_across_processes(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    assert not outline_runs_here()
    assert not lxd.Auto().model().outline_callbacks
    op = _operator(lxd.Outline())
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(ValueError, match=r"(?s)across 2 processes.*Lazy"):
        jax.jit(lambda x: op.mv(x) + op.mv(2 * x))(x)


def test_outline_runs_on_the_cpu():
    assert outline_runs_here()
    op = _operator(lxd.Outline())
    x = jnp.ones(4, jnp.float32)
    y = jax.jit(lambda x: op.mv(x) + op.mv(2 * x))(x)
    assert jnp.allclose(y, 6.0 * x)
