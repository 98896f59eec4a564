"""Solves on sharded operators over 8 (host) devices, on meshes with Explicit axes
(what `jax.make_mesh` creates by default) and with Auto axes, 1-D and 2-D; run in a
subprocess so that the device count can be set before jax starts."""

import textwrap

from tests.helpers.eight_devices import run_on_eight_devices


_PRELUDE = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, lineax as lx, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    import lineax_dispatch as lxd

    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(0)
    """
)

# A dense SPD system of 64 unknowns and its solution.
_SPD = textwrap.dedent(
    """
    n = 64
    m = rng.standard_normal((n, n))
    a_np = m @ m.T / n + np.eye(n)
    b_np = rng.standard_normal(n)
    expected = np.linalg.solve(a_np, b_np)
    """
)

_SQUARE = _SPD + textwrap.dedent(
    """
    solvers = {
        "CG": lxd.CG(1e-10, 1e-10),
        "CG-inline": lxd.CG(1e-10, 1e-10, layout="inline"),
        "GMRES": lxd.GMRES(1e-10, 1e-10),
        "BiCGStab": lxd.BiCGStab(1e-10, 1e-10),
        "MINRES": lxd.MINRES(1e-10, 1e-10),
        "AutoSolver": lxd.AutoSolver(rtol=1e-10, atol=1e-10),
    }
    tag = lx.positive_semidefinite_tag

    def routes(solver):
        def plain(a, b):
            op = lxd.MatrixLinearOperator(a, tag)
            return lx.linear_solve(op, b, solver, throw=False).value

        def ours(a, b):
            op = lxd.MatrixLinearOperator(a, tag)
            return lxd.linear_solve(op, b, solver, throw=False).value

        def auto(a, b):
            op = lxd.MatrixLinearOperator(a, tag, policy=lxd.Auto())
            return lx.linear_solve(op, b, solver, throw=False).value

        return {
            "lx.linear_solve": jax.jit(plain),
            "lxd.linear_solve": jax.jit(ours),
            "lxd.jit + Auto": lxd.jit(auto),
        }

    done = 0
    for kind in ("Explicit", "Auto"):
        for shape, names in (((8,), ("x",)), ((4, 2), ("x", "y"))):
            types = (getattr(AxisType, kind),) * len(shape)
            mesh = jax.make_mesh(shape, names, axis_types=types)
            a = jax.device_put(a_np, NamedSharding(mesh, P(*names)))
            b = jax.device_put(b_np, NamedSharding(mesh, P("x")))
            for name, solver in solvers.items():
                for route, f in routes(solver).items():
                    with jax.set_mesh(mesh):
                        y = f(a, b)
                    where = f"{kind} {shape} {name} {route}"
                    np.testing.assert_allclose(y, expected, atol=1e-8, err_msg=where)
                    if kind == "Explicit":
                        # The solution keeps the rows' sharding.
                        assert y.sharding.spec == P("x"), (where, y.sharding)
                    done += 1
    assert done == 2 * 2 * len(solvers) * 3, done
    print("OK", done)
    """
)

_MORE = textwrap.dedent(
    """
    mesh = jax.make_mesh((4, 2), ("x", "y"))  # Explicit axes: JAX's default
    n = 64
    m = rng.standard_normal((n, n))
    a_np = m @ m.T / n + np.eye(n)
    b_np = rng.standard_normal(n)
    a = jax.device_put(a_np, NamedSharding(mesh, P("x", "y")))
    b = jax.device_put(b_np, NamedSharding(mesh, P("x")))
    tag = lx.positive_semidefinite_tag

    with jax.set_mesh(mesh):
        # Matrix-free, with the vectors' sharding in the structure.
        structure = jax.ShapeDtypeStruct((n,), b.dtype, sharding=b.sharding)
        fn = lambda y: jnp.matmul(a, y, out_sharding=P("x"))
        op = lxd.FunctionLinearOperator(fn, structure, tag)
        y = jax.jit(lambda b: lx.linear_solve(op, b, lxd.CG(1e-10, 1e-10)).value)(b)
        np.testing.assert_allclose(y, np.linalg.solve(a_np, b_np), atol=1e-8)
        assert y.sharding.spec == P("x"), y.sharding

        # The gradient through a solve keeps the sharding too.
        op = lxd.MatrixLinearOperator(a, tag)
        loss = lambda b: jnp.sum(lx.linear_solve(op, b, lxd.CG(1e-10, 1e-10)).value ** 2)
        grad = jax.jit(jax.grad(loss))(b)
        expected = 2 * np.linalg.solve(a_np, np.linalg.solve(a_np, b_np))
        np.testing.assert_allclose(grad, expected, atol=1e-7)
        assert grad.sharding.spec == P("x"), grad.sharding

        # Least squares with a row-sharded rectangular matrix.
        r_np, c_np = rng.standard_normal((96, n)), rng.standard_normal(96)
        r = jax.device_put(r_np, NamedSharding(mesh, P("x", None)))
        c = jax.device_put(c_np, NamedSharding(mesh, P("x")))
        expected = np.linalg.lstsq(r_np, c_np, rcond=None)[0]
        for solver in (
            lxd.LSMR(1e-12, 1e-12),
            lxd.Normal(lxd.CG(1e-12, 1e-12)),
            lxd.AutoSolver(well_posed=False, rtol=1e-12, atol=1e-12),
        ):
            solve = lambda c: lx.linear_solve(lxd.MatrixLinearOperator(r), c, solver)
            x = jax.jit(lambda c: solve(c).value)(c)
            np.testing.assert_allclose(x, expected, atol=1e-7, err_msg=str(solver))

    # Per-device memory: CG's vectors stay sharded. A diagonal operator (no matrix)
    # of 2**16 float32 unknowns, `throw=False` (lineax's error check on the solution
    # gathers it on every device).
    n = 2**16
    d = jnp.linspace(1.0, 2.0, n, dtype=jnp.float32)

    def temp_bytes(d):
        structure = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=d.sharding)

        def f(d, b):
            op = lxd.FunctionLinearOperator(lambda y: d * y, structure, tag)
            return lx.linear_solve(op, b, lxd.CG(1e-5, 1e-5), throw=False).value

        return jax.jit(f).lower(d, d).compile().memory_analysis().temp_size_in_bytes

    one = temp_bytes(jax.device_put(d, jax.devices()[0]))
    row = jax.make_mesh((8,), ("x",))
    with jax.set_mesh(row):
        eight = temp_bytes(jax.device_put(d, NamedSharding(row, P("x"))))
    assert eight <= 0.2 * one, (eight, one)
    print("OK", one, eight)
    """
)


_REWRITES = textwrap.dedent(
    """
    # lxd.jit's rewrites of a program (rolled and stacked sites, one matrix built,
    # an outlined call; Auto deciding) give jax.jit's output shardings and values,
    # on Explicit and Auto axes.
    n = 64
    a_np = rng.standard_normal((n, n)) / n
    done = 0
    policies = {
        "Roll": lxd.Roll(),
        "Materialise": lxd.Materialise(),
        "Outline": lxd.Outline(),
        "Auto": lxd.Auto(),
        "Auto materialising": lxd.Auto(cost_model=lxd.CostModel(compile_per_dot=10.0)),
    }
    for axis in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(axis, axis))
        rows = NamedSharding(mesh, P("x"))
        a = jax.device_put(a_np, NamedSharding(mesh, P("x", None)))
        x = jax.device_put(jnp.linspace(0.0, 1.0, n), rows)
        explicit = axis == AxisType.Explicit
        structure = jax.ShapeDtypeStruct(
            (n,), jnp.float64, sharding=rows if explicit else None
        )
        for name, policy in policies.items():
            if name == "Outline" and explicit:
                # Refused at trace time (tests/test_errors.py): out of line, `mv`
                # cannot take a vector sharded over an Explicit axis.
                continue

            def program(a, x):
                op = lxd.FunctionLinearOperator(
                    lambda v: a @ (a @ v) + 0.5 * v, structure, policy=policy
                )
                chained = op.mv(op.mv(op.mv(x)))  # dependent sites: rolled
                return chained + op.mv(2 * x) + op.mv(3 * x)  # independent: stacked

            with jax.set_mesh(mesh):
                expected = jax.jit(program)(a, x)
                got = lxd.jit(program)(a, x)
                ours = lxd.jit(program).lower(a, x).compile()
                theirs = jax.jit(program).lower(a, x).compile()
            assert got.sharding.spec == expected.sharding.spec, (name, axis)
            assert ours.input_shardings == theirs.input_shardings, (name, axis)
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
            done += 1
    print("OK", done)
    """
)

_LINEAX_SOLVERS = _SPD + textwrap.dedent(
    """
    # lineax's own solvers on our operators, where lineax runs them: on Auto axes
    # (on Explicit axes lineax's iterative solvers make unsharded vectors and
    # contract over sharded axes, and XLA's factorisations refuse a sharded matrix,
    # for lineax's operators as for ours).
    solvers = (
        lx.CG(1e-10, 1e-10),
        lx.GMRES(1e-10, 1e-10),
        lx.BiCGStab(1e-10, 1e-10),
        lx.LU(),
        lx.Cholesky(),
        lx.QR(),
    )
    done = 0
    for shape, names in (((8,), ("x",)), ((4, 2), ("x", "y"))):
        mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
        a = jax.device_put(a_np, NamedSharding(mesh, P(*names)))
        b = jax.device_put(b_np, NamedSharding(mesh, P("x")))
        for solver in solvers:
            def solve(a, b):
                op = lxd.MatrixLinearOperator(a, lx.positive_semidefinite_tag)
                return lx.linear_solve(op, b, solver, throw=False).value

            with jax.set_mesh(mesh):
                y = jax.jit(solve)(a, b)
            np.testing.assert_allclose(y, expected, atol=1e-8, err_msg=str(solver))
            done += 1
    print("OK", done)
    """
)

_BUDGETS = textwrap.dedent(
    """
    # A memory budget counts one device's bytes of a sharded matrix; and
    # `lx.materialise` builds the matrix of a matrix-free operator whose vectors an
    # Explicit axis shards (lineax's identity has no sharding) with its rows
    # sharded as the output.
    mesh = jax.make_mesh((8,), ("x",))
    n = 512
    rows = NamedSharding(mesh, P("x"))
    m = rng.standard_normal((n, n)).astype(np.float32)
    a_np = m @ m.T / n + np.eye(n, dtype=np.float32)
    b_np = rng.standard_normal(n).astype(np.float32)
    tag = lx.positive_semidefinite_tag
    # 1 MiB of matrix, 128 KiB a device; with the build's peak, 3 MiB and 384 KiB.
    budget = "400KB"

    def build(a, structure):
        fn = lambda y: jnp.matmul(a, y, out_sharding=structure.sharding)
        op = lxd.FunctionLinearOperator(
            fn, structure, tag, policy=lxd.Materialise(memory_budget=budget)
        )
        return op, lxd.dense_matrix(op)

    with jax.set_mesh(mesh):
        a = jax.device_put(jnp.asarray(a_np), NamedSharding(mesh, P("x", None)))
        b = jax.device_put(jnp.asarray(b_np), rows)
        structure = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=rows)
        f = jax.jit(lambda a: build(a, structure)[1])
        matrix = f(a)
        assert matrix.sharding.spec == P("x", None), matrix.sharding
        np.testing.assert_allclose(matrix, a_np, rtol=1e-6)
        per_device = f.lower(a).compile().memory_analysis().output_size_in_bytes
        assert per_device == n * n * 4 // 8, per_device
        op, _ = build(a, structure)
        observation = lxd.observe(op, memory_budget=10**9)
        assert (observation.out_parts, observation.in_parts) == (8, 8)
        dense = lx.materialise(op)
        assert isinstance(dense, lxd.AbstractDispatchOperator), type(dense)
        assert jax.typeof(dense.as_matrix()).sharding.spec == P("x", None)
        np.testing.assert_allclose(dense.as_matrix(), a_np, rtol=1e-6)
        y = jax.jit(lambda b: lx.linear_solve(dense, b, lxd.CG(1e-5, 1e-5)).value)(b)
        np.testing.assert_allclose(y, np.linalg.solve(a_np, b_np), rtol=1e-3)
        # Auto counts one device's part too, at one call site and in a program.
        fn = lambda y: jnp.matmul(a, y, out_sharding=rows)
        auto = lxd.FunctionLinearOperator(fn, structure, tag, policy=lxd.Auto())
        one = lxd.explain(auto).rows[0].memory_needed
        (row,) = lxd.explain(lambda b: auto.mv(auto.mv(b)), b).rows
        assert n * n * 4 // 8 <= one == row.memory_needed < n * n * 4 // 4, (one, row)
    # Unsharded, the same matrix is over the budget.
    a1 = jnp.asarray(a_np)
    try:
        build(a1, jax.ShapeDtypeStruct((n,), jnp.float32))
    except ValueError as e:
        assert "memory budget" in str(e), e
    else:
        raise AssertionError("no budget error")
    print("OK")
    """
)


def _run(script: str) -> str:
    return run_on_eight_devices(_PRELUDE + script)


def test_every_solver_on_explicit_and_auto_meshes():
    out = _run(_SQUARE)
    assert "OK 72" in out


def test_matrix_free_gradients_least_squares_and_per_device_memory():
    _run(_MORE)


def test_lxd_jit_rewrites_keep_jax_jit_s_shardings():
    assert "OK 9" in _run(_REWRITES)


def test_budgets_count_one_device_s_part_of_a_sharded_matrix():
    _run(_BUDGETS)


def test_lineax_s_solvers_on_our_operators_on_auto_axes():
    assert "OK 12" in _run(_LINEAX_SOLVERS)
