"""batch_solve sharded over 8 (host) devices, run in a subprocess so that the
device count can be set before jax starts."""

import textwrap

from tests.helpers.eight_devices import run_on_eight_devices


_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, lineax as lx, numpy as np
    jax.config.update("jax_enable_x64", True)
    import lineax_dispatch as lxd

    assert len(jax.devices()) == 8, jax.devices()
    n, batch = 6, 13
    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n))
    a = jnp.asarray(m @ m.T / n + np.eye(n))
    op = lxd.MatrixLinearOperator(a, lx.positive_semidefinite_tag)
    bs = jnp.asarray(rng.standard_normal((batch, n)))
    expected = np.linalg.solve(np.asarray(a), np.asarray(bs).T).T
    for solver in (lx.LU(), lxd.CG(rtol=1e-10, atol=1e-10)):
        plain = lxd.batch_solve(op, bs, solver)
        by_list = lxd.batch_solve(op, bs, solver, mesh=jax.devices())
        mesh = jax.make_mesh((8,), ("rhs",), axis_types=(jax.sharding.AxisType.Auto,))
        by_mesh = jax.jit(lambda b: lxd.batch_solve(op, b, solver, mesh=mesh).value)(bs)
        np.testing.assert_allclose(plain.value, expected, rtol=1e-8)
        np.testing.assert_allclose(by_list.value, plain.value, rtol=1e-12)
        np.testing.assert_allclose(by_mesh, plain.value, rtol=1e-12)
        assert by_list.value.shape == (batch, n)
        assert by_list.result._value.shape == (batch,)
    # Right-hand sides that arrive sharded with explicit axes: only the sharding
    # annotation differs from the operator's structure, and that is accepted.
    explicit = jax.make_mesh((8,), ("b",), axis_types=(jax.sharding.AxisType.Explicit,))
    padded = jnp.concatenate([bs, bs[:3]])
    sharded = jax.device_put(
        padded, jax.sharding.NamedSharding(explicit, jax.sharding.PartitionSpec("b"))
    )
    out = lxd.batch_solve(op, sharded, lx.LU()).value
    np.testing.assert_allclose(np.asarray(out)[:batch], expected, rtol=1e-8)

    # A 2-D mesh: the operator's rows over one axis, the right-hand sides over the
    # other, on Explicit and Auto axes, every solver of ours (GMRES and what wraps
    # it solve one right-hand side after another on Explicit axes: see
    # `vmaps_explicit_axes`).
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    n, batch = 32, 8
    m = rng.standard_normal((n, n))
    spd = m @ m.T / n + np.eye(n)
    general = m / np.sqrt(n) + 3 * np.eye(n)
    bs_np = rng.standard_normal((batch, n))
    tol = dict(rtol=1e-10, atol=1e-10)
    cases = [
        (spd, lx.positive_semidefinite_tag, lxd.CG(**tol)),
        (spd, lx.positive_semidefinite_tag, lxd.MINRES(**tol)),
        (spd, lx.positive_semidefinite_tag, lxd.AutoSolver(**tol)),
        (general, (), lxd.GMRES(**tol)),
        (general, (), lxd.BiCGStab(**tol)),
        (general, (), lxd.LSMR(**tol)),
        (general, (), lxd.Normal(lxd.GMRES(**tol))),
        (general, (), lxd.PolicySolver(lxd.GMRES(**tol), lxd.Lazy())),
        (general, (), lxd.AutoSolver(**tol)),
    ]
    done = 0
    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((4, 2), ("x", "r"), axis_types=(kind, kind))
        bs = jax.device_put(bs_np, NamedSharding(mesh, P("r", "x")))
        for a_np, tags, solver in cases:
            a = jax.device_put(a_np, NamedSharding(mesh, P("x", None)))
            with jax.set_mesh(mesh):
                op = lxd.MatrixLinearOperator(a, tags)
                solve = jax.jit(lambda b: lxd.batch_solve(op, b, solver).value)
                out = solve(bs)
            expected = np.linalg.solve(a_np, bs_np.T).T
            where = f"{kind} {solver}"
            np.testing.assert_allclose(out, expected, atol=1e-8, err_msg=where)
            done += 1
    assert done == 2 * len(cases), done
    print("OK")
    """
)


def test_batch_solve_sharded_over_eight_devices():
    run_on_eight_devices(_SCRIPT, timeout=600)


_EVERY_SOLVER_ON_EVERY_MESH = textwrap.dedent(
    """
    # `mesh=` given as `jax.make_mesh`'s default mesh (Explicit axes), as a mesh
    # with Auto axes and as a list of devices, for every solver, called eagerly,
    # under `jax.jit` and under `jax.jit` in the mesh's context; a batch that the
    # mesh divides and one that it does not.
    import jax, jax.numpy as jnp, lineax as lx, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    import lineax_dispatch as lxd

    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(0)
    n = 6
    m = rng.standard_normal((n, n))
    a = jnp.asarray(m @ m.T / n + np.eye(n))
    tags = lx.positive_semidefinite_tag
    tol = dict(rtol=1e-10, atol=1e-10)
    solvers = (
        lx.AutoLinearSolver(well_posed=True),
        lx.LU(),
        lx.Cholesky(),
        lx.QR(),
        lx.CG(**tol),
        lxd.CG(**tol),
        lxd.MINRES(**tol),
        lxd.GMRES(**tol),
        lxd.BiCGStab(**tol),
        lxd.LSMR(**tol),
        lxd.Normal(lxd.GMRES(**tol)),
        lxd.PolicySolver(lxd.GMRES(**tol), lxd.Lazy()),
        lxd.AutoSolver(**tol),
    )
    meshes = {
        "make_mesh default": jax.make_mesh((8,), ("rhs",)),
        "Auto axes": jax.make_mesh((8,), ("rhs",), axis_types=(AxisType.Auto,)),
        "devices": jax.devices(),
    }
    assert meshes["make_mesh default"].axis_types == (AxisType.Explicit,)
    done = 0
    # Every solver on a batch the mesh does not divide (padded); a direct, a
    # lineax and one of our iterative solvers on one it divides. A list of devices
    # (a mesh built for the call) with those three and AutoSolver.
    few = solvers[1:2] + solvers[4:6] + solvers[-1:]
    for batch, batch_solvers in ((13, solvers), (16, solvers[1:2] + solvers[4:6])):
        bs = jnp.asarray(rng.standard_normal((batch, n)))
        expected = np.linalg.solve(np.asarray(a), np.asarray(bs).T).T
        for solver in batch_solvers:
            op = lxd.MatrixLinearOperator(a, tags)
            for name, mesh in meshes.items():
                if name == "devices" and solver not in few:
                    continue
                where = f"{name} {solver} batch={batch}"
                eager = lxd.batch_solve(op, bs, solver, mesh=mesh)
                solve = lambda b: lxd.batch_solve(op, b, solver, mesh=mesh).value
                jitted = jax.jit(solve)(bs)
                for got in (eager.value, jitted):
                    assert got.shape == (batch, n), (where, got.shape)
                    np.testing.assert_allclose(got, expected, atol=1e-8, err_msg=where)
                assert eager.result._value.shape == (batch,), where
                if name == "make_mesh default" and batch == 16:
                    # Typed sharded over the mesh's axis, as JAX types on it.
                    spec = jax.typeof(eager.value).sharding.spec
                    assert tuple(spec)[:1] == ("rhs",), (where, spec)
                if isinstance(mesh, jax.sharding.Mesh):
                    with jax.set_mesh(mesh):
                        in_context = jax.jit(solve)(bs)
                    np.testing.assert_allclose(
                        in_context, expected, atol=1e-8, err_msg=where
                    )
                done += 1
    # Right-hand sides sharded over an Explicit axis along their batch axis, for an
    # operator without a sharding, under `jax.jit` (eager calls are in the test
    # above): the solution comes sharded as they came.
    explicit = meshes["make_mesh default"]
    bs = jnp.asarray(rng.standard_normal((16, n)))
    expected = np.linalg.solve(np.asarray(a), np.asarray(bs).T).T
    sharded = jax.device_put(bs, NamedSharding(explicit, P("rhs")))
    for solver in solvers:
        op = lxd.MatrixLinearOperator(a, tags)
        for context in (False, True) if solver in few else (False,):
            solve = jax.jit(lambda b: lxd.batch_solve(op, b, solver).value)
            if context:
                with jax.set_mesh(explicit):
                    got = solve(sharded)
            else:
                got = solve(sharded)
            where = f"pre-sharded {solver} context={context}"
            np.testing.assert_allclose(got, expected, atol=1e-8, err_msg=where)
            assert tuple(got.sharding.spec)[:1] == ("rhs",), (where, got.sharding)
            done += 1
    print("OK", done)
    """
)


def test_every_solver_with_explicit_and_auto_meshes():
    assert "OK 56" in run_on_eight_devices(_EVERY_SOLVER_ON_EVERY_MESH, timeout=900)
