"""`lxd.jit` keys its compiled programs as `jax.jit` does: by where each array
argument is (its sharding, device and layout where it is committed to them), not
only by its shape and dtype. Called on one device and then on another, unsharded
and then sharded over a mesh, committed and then not, its calls give `jax.jit`'s
values on `jax.jit`'s devices. Run over 8 host devices in a subprocess (the device
count is set before jax starts), as tests/test_sharded.py runs its programs."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np

import lineax_dispatch as lxd
from tests.helpers.eight_devices import run_on_eight_devices


_PRELUDE = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    import lineax_dispatch as lxd

    devices = jax.devices()
    assert len(devices) == 8, devices
    n = 16
    weights = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)) / n)

    def plain(x):
        return jnp.sin(x) * 2.0 + x.sum()

    def pytree(t):
        return {"y": plain(t["x"]), "k": t["k"]}

    def rolled(x):
        # Dependent sites of a `Roll` operator: a rewritten program.
        structure = jax.ShapeDtypeStruct((n,), x.dtype)
        op = lxd.FunctionLinearOperator(
            lambda v: jnp.tanh(weights @ v), structure, policy=lxd.Roll()
        )
        for _ in range(3):
            x = op.mv(x)
        return x

    def same(ours, theirs, where, exact=True):
        # Values, devices, committedness and (`exact`) the sharding itself: XLA
        # may shard a rewritten program's output over an Auto mesh otherwise than
        # the program as traced.
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
            if not isinstance(b, jax.Array):
                assert a == b, where
                continue
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=where)
            assert a.devices() == b.devices(), (where, a.devices(), b.devices())
            assert a.committed == b.committed, (where, a.committed, b.committed)
            if exact:
                assert a.sharding == b.sharding, (where, a.sharding, b.sharding)

    def check(f, calls, where, exact=True):
        # The calls, in order, by `lxd.jit(f)` and by `jax.jit(f)`, each twice (a
        # repeated call takes `lxd.jit`'s fast path).
        ours, theirs = lxd.jit(f), jax.jit(f)
        for i, args in enumerate(calls):
            for repeat in range(2):
                got, expected = ours(*args), theirs(*args)
                same(got, expected, f"{where}: call {i}, {repeat}", exact)
    """
)


_PLACEMENTS = textwrap.dedent(
    """
    x_np = np.linspace(0.0, 1.0, n)
    uncommitted = jnp.asarray(x_np)
    on = [jax.device_put(x_np, d) for d in devices]
    # Auto axes (avals without shardings, which the operator's structure would
    # need on Explicit ones; those are tests/test_sharded.py's), and Explicit.
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    rows = jax.device_put(x_np, NamedSharding(mesh, P("x")))
    replicated = jax.device_put(x_np, NamedSharding(mesh, P()))
    explicit = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    explicit_rows = jax.device_put(x_np, NamedSharding(explicit, P("x")))
    with jax.default_device(devices[3]):
        elsewhere = jnp.asarray(x_np)  # uncommitted, on device 3
    assert not elsewhere.committed and elsewhere.devices() == {devices[3]}

    done = 0
    for name, f in (("plain", plain), ("rolled", rolled)):
        for calls in (
            [on[0], on[5], on[0]],
            [uncommitted, rows, replicated, uncommitted],
            [on[5], uncommitted, elsewhere, on[5]],
            [rows, on[2]],
        ):
            check(f, [(x,) for x in calls], name, exact=name == "plain")
            done += 1
    check(plain, [(on[1],), (explicit_rows,), (rows,), (explicit_rows,)], "explicit")
    # The key of a PyTree argument (not the fast path) too.
    tree = lambda x: {"x": x, "k": 2}
    check(pytree, [(tree(on[0]),), (tree(on[5]),), (tree(rows),)], "pytree")
    # Under a default device: uncommitted arrays go there, with `jax.jit`.
    ours, theirs = lxd.jit(plain), jax.jit(plain)
    same(ours(uncommitted), theirs(uncommitted), "default device 0")
    with jax.default_device(devices[6]):
        same(ours(uncommitted), theirs(uncommitted), "default device 6")
    print("OK", done + 2)
    """
)


def _run(script: str) -> str:
    return run_on_eight_devices(_PRELUDE + script)


def test_devices_shardings_and_committedness_each_get_their_program():
    assert "OK 10" in _run(_PLACEMENTS)


def test_layouts_each_get_their_program():
    """A committed array with another layout than the default (column-major here)
    is compiled for apart, by `jax.jit` and by `lxd.jit`, in either order."""
    from jax.experimental.layout import Format, Layout

    x = jax.device_put(jnp.arange(12.0).reshape(3, 4), jax.devices()[0])
    default = x.format.layout.major_to_minor
    other = jax.device_put(x, Format(Layout(tuple(reversed(default))), x.sharding))
    assert other.format.layout != x.format.layout
    f = lambda u: u.T * 2.0
    for calls in ((x, other, x), (other, x, other)):
        ours, theirs = lxd.jit(f), jax.jit(f)
        for u in calls:
            for _ in range(2):  # (the repeated call takes the fast path)
                got, expected = ours(u), theirs(u)
                np.testing.assert_allclose(got, expected, rtol=1e-12)
                assert got.format == expected.format
