"""A matrix-free operator whose function holds a sharded matrix in a closure cell
or a `functools.partial`, and the matrix itself as an operator, over 8 (host)
devices on Explicit axes, with and without a mesh set; run in a subprocess as
`test_sharded`'s solves are."""

import textwrap

from tests.test_sharded import _run, _SPD


_HELD_MATRIX = _SPD + textwrap.dedent(
    """
    # A matrix-free operator whose function holds a sharded matrix in a closure
    # cell or a `functools.partial` (arrays that closure conversion makes part of
    # the operator), on Explicit axes: its output structure is what
    # `jax.eval_shape` gives of the function; every solver solves with it, built
    # outside and inside `jax.jit`, in and out of the mesh's context. A function
    # whose output is sharded otherwise than its input is refused a symmetric tag,
    # as lineax refuses it.
    import functools

    mesh = jax.make_mesh((8,), ("x",))  # Explicit axes: JAX's default
    rows = NamedSharding(mesh, P("x"))
    b = jax.device_put(b_np, rows)
    structure = jax.ShapeDtypeStruct((n,), b.dtype, sharding=rows)
    tag = lx.positive_semidefinite_tag

    def in_cell(a):
        return lambda y: a @ y

    def in_partial(a):
        return functools.partial(jnp.matmul, a)

    solvers = (
        lxd.CG(1e-10, 1e-10),
        lxd.CG(1e-10, 1e-10, layout="inline"),
        lxd.MINRES(1e-10, 1e-10),
        lxd.GMRES(1e-10, 1e-10),
        lxd.BiCGStab(1e-10, 1e-10),
        lxd.LSMR(1e-10, 1e-10),
        lxd.Normal(lxd.CG(1e-10, 1e-10)),
        lxd.AutoSolver(rtol=1e-10, atol=1e-10),
    )
    import contextlib

    done = 0
    a = jax.device_put(a_np, NamedSharding(mesh, P("x", None)))
    for holder in (in_cell, in_partial):
        for context in (contextlib.nullcontext, lambda: jax.set_mesh(mesh)):
            with context():
                fn = holder(a)
                op = lxd.FunctionLinearOperator(fn, structure, tag)
                assert op.out_structure() == jax.eval_shape(fn, structure), (
                    op.out_structure()
                )
                assert op.out_structure().sharding.spec == P("x")
                assert jax.jit(lambda b: op.mv(b))(b).sharding.spec == P("x")
                # Every solver with the closure cell; with the partial, whose
                # arrays closure conversion reads the same way, three of them
                # (the suite's time on 2 cores).
                chosen = solvers if holder is in_cell else solvers[::3]
                for solver in chosen:
                    where = f"{holder.__name__} {solver}"
                    solve = lambda b: lx.linear_solve(op, b, solver, throw=False)
                    y = jax.jit(lambda b: solve(b).value)(b)
                    np.testing.assert_allclose(y, expected, atol=1e-8, err_msg=where)
                    assert y.sharding.spec == P("x"), (where, y.sharding)

                    def built_inside(a, b):
                        op = lxd.FunctionLinearOperator(holder(a), structure, tag)
                        return lx.linear_solve(op, b, solver, throw=False).value

                    y = jax.jit(built_inside)(a, b)
                    np.testing.assert_allclose(y, expected, atol=1e-8, err_msg=where)
                    done += 1
        # A replicated matrix: the function's output is replicated, its input
        # sharded, so no symmetric tag, for lineax's operator as for ours.
        replicated = jax.device_put(a_np, NamedSharding(mesh, P()))
        fn = holder(replicated)
        assert jax.eval_shape(fn, structure).sharding.spec == P(None)
        op = lxd.FunctionLinearOperator(fn, structure)
        assert op.out_structure() == jax.eval_shape(fn, structure)
        messages = []
        for cls in (lx.FunctionLinearOperator, lxd.FunctionLinearOperator):
            try:
                cls(fn, structure, tag)
            except ValueError as e:
                messages.append(str(e).split(". Got")[0])
            else:
                raise AssertionError(f"{cls} took a symmetric tag")
        assert messages[0] == messages[1], messages
        assert "must have matching input and output structures" in messages[1]
    # The matrix itself as the operator, solved under `jax.jit` where no mesh is
    # set: every vector of a solver's loop keeps the rows' sharding.
    op = lxd.MatrixLinearOperator(a, tag)
    for solver in solvers:
        solve = lambda b: lx.linear_solve(op, b, solver, throw=False).value
        y = jax.jit(solve)(b)
        np.testing.assert_allclose(y, expected, atol=1e-8, err_msg=str(solver))
        assert y.sharding.spec == P("x"), (solver, y.sharding)
        done += 1
    print("OK", done)
    """
)


def test_matrix_held_in_a_closure_cell_or_partial():
    assert "OK 30" in _run(_HELD_MATRIX)
