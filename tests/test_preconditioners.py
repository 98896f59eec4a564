"""`lxd.jacobi`, `lxd.block_jacobi` and `lxd.PreconditionedSolver`: the entries
they read against the dense matrix's (from structure, coloured probes and basis
vectors, float64 and complex), solves with them against lineax's with a diagonal
built by hand, one `mv` site and one preconditioner site, the precision of the
probes, the errors, `AutoSolver`'s choice, and sharded vectors."""

import itertools
import re

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch._reductions import LIBRARY_REDUCTION_SIZE
from lineax_dispatch.preconditioners import _probes
from tests.helpers.eight_devices import run_on_eight_devices
from tests.helpers.leaks import leak_checked


S = 6  # a 6 x 6 grid
N = S * S
FIVE_POINT = ((1, 0), (-1, 0), (0, 1), (0, -1))
PSD = lx.positive_semidefinite_tag


def _coefficient(span: float, dtype=jnp.float64):
    """A coefficient on the grid spanning `span` (1: constant)."""
    x = (jnp.arange(S, dtype=dtype) + 0.5) / S
    return span ** (0.5 + 0.5 * jnp.sin(3 * x)[:, None] * jnp.cos(2 * x)[None, :])


def _stencil(a, u):
    """`D^1/2 L D^1/2` for the shifted 5-point Laplacian `L` and `D = diag(a)`."""
    w = jnp.sqrt(a).reshape(-1)
    g = jnp.pad((w * u).reshape(S, S), 1)
    near = g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:]
    return w * (4.5 * g[1:-1, 1:-1] - near).reshape(-1)


def _operator(a, tags=PSD):
    structure = jax.ShapeDtypeStruct((N,), a.dtype)
    return lxd.FunctionLinearOperator(lambda u: _stencil(a, u), structure, tags)


def _dense_blocks_inverse(matrix, size):
    expected = np.zeros_like(np.asarray(matrix))
    for k in range(0, matrix.shape[0], size):
        e = min(k + size, matrix.shape[0])
        expected[k:e, k:e] = np.linalg.inv(np.asarray(matrix[k:e, k:e]))
    return expected


def _all_builds(matrix, op, patterns, dtype):
    """Every build of the test below, traced into one program (one compile)."""
    diagonal = lxd.DiagonalLinearOperator(jnp.arange(1.0, N + 1).astype(dtype))
    held = lxd.MatrixLinearOperator(matrix)
    tri = lx.TridiagonalLinearOperator(
        jnp.diagonal(matrix), jnp.diagonal(matrix, -1), jnp.diagonal(matrix, 1)
    )
    composite = 2.0 * (diagonal @ held) + lx.TaggedLinearOperator(tri, ()) - held
    found, words = {}, {}
    for name, pattern in patterns.items():
        for size in (1, 4):
            built = lxd.block_jacobi(op, size, pattern=pattern)
            found[name, str(size)] = built.as_matrix()
            words[name, str(size)] = built.explain()
        found[name, "jacobi"] = lxd.jacobi(op, pattern=pattern).as_matrix()
    for name, operator in (("held", held), ("composite", composite), ("tri", tri)):
        for size in (1, 5):
            built = lxd.block_jacobi(operator, size)
            found[name, str(size)] = built.as_matrix()
            words[name, str(size)] = built.explain()
        found[name, "dense"] = operator.as_matrix()
    return found, words


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
def test_builds_read_the_dense_blocks(dtype):
    """Every route gives the inverse diagonal blocks of the dense matrix: coloured
    probes (a stencil, a band), basis vectors, and the structure of held, diagonal,
    tridiagonal, summed, scaled and composed operators; `explain` names it."""
    a = _coefficient(1e3).astype(dtype)
    op = _operator(a, tags=())
    matrix = jax.vmap(op.mv, out_axes=1)(jnp.eye(N, dtype=dtype))
    patterns = {
        "coloured probe": lxd.Stencil((S, S), FIVE_POINT),
        "a band of width": lxd.Band(S, S),
        "basis vectors": None,
    }
    words = {}

    def run(matrix):
        found, said = _all_builds(matrix, op, patterns, dtype)
        words.update(said)
        return found

    found = jax.jit(run)(matrix)
    for (name, size), got in found.items():
        if size == "dense":
            continue
        dense = found[name, "dense"] if (name, "dense") in found else matrix
        expected = _dense_blocks_inverse(dense, 1 if size == "jacobi" else int(size))
        np.testing.assert_allclose(got, expected, rtol=1e-10, err_msg=str(name))
        if size != "jacobi":
            said = words[name, size]
            assert (name if name in patterns else "0 `mv`s in all") in said, said
    assert "4 coloured probe vectors" in words["coloured probe", "1"]


def _hand_built(op):
    """lineax's CG preconditioner as a user builds it today: the diagonal from a
    `jax.vmap` over basis vectors."""
    n = op.in_size()
    d = jax.vmap(lambda e: jnp.vdot(e, op.mv(e)))(jnp.eye(n))
    return lx.TaggedLinearOperator(lx.DiagonalLinearOperator(1 / d), PSD)


def test_preconditioned_solves_match_lineax_under_jit_vmap_and_grad():
    pattern = lxd.Stencil((S, S), FIVE_POINT)
    b = jnp.cos(jnp.arange(N, dtype=jnp.float64))

    def solve(a, b, ours):
        op = _operator(a)
        if ours:
            options = {"preconditioner": lxd.jacobi(op, pattern=pattern)}
            sol = lx.linear_solve(op, b, lxd.CG(1e-10, 1e-10), options=options)
        else:
            options = {"preconditioner": _hand_built(op)}
            sol = lx.linear_solve(op, b, lx.CG(1e-10, 1e-10), options=options)
        return sol.value, sol.stats["num_steps"]

    a = _coefficient(1e3)
    run = jax.jit(solve, static_argnums=2)
    (y, steps), (y_lx, steps_lx) = leak_checked(
        lambda: (run(a, b, True), run(a, b, False)), lambda: run(a, b, False)
    )
    np.testing.assert_allclose(y, y_lx, rtol=1e-8)
    assert abs(int(steps) - int(steps_lx)) <= 2
    bs = jnp.stack([b, 2 * b])
    ys, _ = jax.jit(jax.vmap(solve, in_axes=(None, 0, None)), static_argnums=2)(
        a, bs, True
    )
    np.testing.assert_allclose(ys[1], 2 * y, rtol=1e-8)

    def loss(scale, ours):  # a preconditioner built by hand cannot be differentiated
        op = _operator(a * scale)
        options = {"preconditioner": lxd.jacobi(op, pattern=pattern)} if ours else {}
        sol = lx.linear_solve(op, b, lx.CG(1e-10, 1e-10), options=options)
        return jnp.sum(sol.value**2)

    grads = [jax.jit(jax.grad(loss), static_argnums=1)(1.5, o) for o in (True, False)]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-7)


def test_one_mv_site_and_one_preconditioner_site():
    """The user's function is traced once for the build (the probes, batched) and
    once for the solve's loop; the preconditioner is applied at one site of each
    of our solvers' loops."""
    a = _coefficient(1e3)
    traces, applied = [], []
    # A plain lineax operator: its function runs at each trace of a site.
    op = lx.FunctionLinearOperator(
        lambda u: traces.append(1) or _stencil(a, u),
        jax.ShapeDtypeStruct((N,), jnp.float64),
        PSD,
        closure_convert=False,
    )
    pattern = lxd.Stencil((S, S), FIVE_POINT)
    real = lxd.JacobiPreconditioner.flat_mv
    for solver in (lxd.CG(1e-8, 1e-8), lxd.GMRES(1e-8, 1e-8)):
        traces.clear(), applied.clear()

        def counted(self, x):
            applied.append(1)
            return real(self, x)

        lxd.JacobiPreconditioner.flat_mv = counted
        try:
            options = lambda: {"preconditioner": lxd.jacobi(op, pattern=pattern)}
            jax.make_jaxpr(
                lambda b: lx.linear_solve(op, b, solver, options=options()).value
            )(jnp.ones(N))
        finally:
            lxd.JacobiPreconditioner.flat_mv = real
        assert (len(traces), len(applied)) == (2, 1), type(solver).__name__


def test_probes_run_at_float32_precision():
    """The batched probes' products are `HIGHEST` where the user set nothing (a
    TPU would run them in bfloat16 passes at the default)."""
    w = jax.random.normal(jax.random.key(0), (N, N), jnp.float32)

    def build(w, pattern):
        structure = jax.ShapeDtypeStruct((N,), jnp.float32)
        op = lxd.FunctionLinearOperator(lambda x: w @ x, structure)
        return lxd.block_jacobi(op, 3, pattern=pattern).inverse_blocks

    for pattern in (None, lxd.Band(N, N), lxd.Band(3, 3)):
        text = jax.jit(build, static_argnums=1).lower(w, pattern).as_text()
        found = re.findall(r"precision = \[(\w+), (\w+)\]", text)
        assert found and {p for pair in found for p in pair} == {"HIGHEST"}


@pytest.mark.parametrize("in_program", [False, True])
def test_colourings_divide_in_int32(monkeypatch, in_program):
    """The colours of a pattern's probes are a constant of the program, computed on
    the host (no integer division in the program); past `TABLE_ENTRIES` indices
    they are computed in the program, and with float64 enabled (as this suite
    runs) in int32: XLA:TPU emulates int64, and its division and remainder took
    tens of seconds to compile there. Either way the same entries."""
    a = _coefficient(10.0)

    def build(a, pattern, size):
        return lxd.block_jacobi(_operator(a), size, pattern=pattern).inverse_blocks

    patterns = (lxd.Stencil((S, S), FIVE_POINT), lxd.Band(S, S))
    cases = list(itertools.product(patterns, (1, 4)))
    from_table = [build(a, p, size) for p, size in cases]
    if in_program:
        monkeypatch.setattr(_probes, "TABLE_ENTRIES", 0)
    for (pattern, size), expected in zip(cases, from_table):
        text = jax.jit(build, static_argnums=(1, 2)).lower(a, pattern, size).as_text()
        integer = r"stablehlo\.(?:divide|remainder) .*: tensor<(?:\d+x)*(i\d+)>"
        widths = set(re.findall(integer, text))
        assert widths == ({"i32"} if in_program else set()), widths
        got = jax.jit(build, static_argnums=(1, 2))(a, pattern, size)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_errors_name_the_argument_and_what_was_given():
    op = _operator(_coefficient(1.0))
    with pytest.raises(TypeError, match=r"lxd.jacobi\(operator\)` must be a lineax"):
        lxd.jacobi(jnp.eye(3))  # pyright: ignore[reportArgumentType]
    rectangular = lxd.MatrixLinearOperator(jnp.ones((3, 4)))
    with pytest.raises(ValueError, match="needs a square operator"):
        lxd.jacobi(rectangular)
    with pytest.raises(ValueError, match=r"Stencil on a grid of shape \(2, 2\)"):
        lxd.jacobi(op, pattern=lxd.Stencil((2, 2), FIVE_POINT))
    with pytest.raises(ValueError, match="block_size=...\\)` must be a positive int"):
        lxd.block_jacobi(op, 0)
    with pytest.raises(ValueError, match="memory_budget"):
        lxd.jacobi(op, memory_budget=100)
    with pytest.raises(ValueError, match="must be tagged positive semidefinite"):
        untagged = lxd.jacobi(_operator(_coefficient(1.0), tags=()))
        lx.linear_solve(
            op, jnp.ones(N), lxd.CG(1e-6, 1e-6), options={"preconditioner": untagged}
        )
    short = lxd.jacobi(lxd.MatrixLinearOperator(jnp.eye(N - 1)))
    with pytest.raises(ValueError, match="must equal the operator's `in_structure"):
        lx.linear_solve(
            op, jnp.ones(N), lxd.GMRES(1e-6, 1e-6), options={"preconditioner": short}
        )
    matrix = jnp.eye(4).at[2, 2].set(-1.0)
    indefinite = lxd.MatrixLinearOperator(matrix, PSD)
    with pytest.raises(Exception, match="is not positive or not finite, where"):
        lxd.jacobi(indefinite).inverse_diagonal.block_until_ready()
    zero = lxd.MatrixLinearOperator(jnp.eye(4).at[1, 1].set(0.0) + jnp.eye(4, k=1))
    with pytest.raises(Exception, match="a diagonal entry of the operator is zero"):
        lxd.jacobi(zero).inverse_diagonal.block_until_ready()
    options = {"preconditioner": lxd.jacobi(indefinite, throw=False)}
    sol = lx.linear_solve(
        indefinite, jnp.ones(4), lxd.CG(1e-6, 1e-6), options=options, throw=False
    )
    assert sol.result == lx.RESULTS.nonfinite_input


@pytest.mark.parametrize("n", [5, LIBRARY_REDUCTION_SIZE])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
def test_every_unusable_entry_makes_the_build_invalid(dtype, n):
    # `valid` comes from the reductions that give the spread (one with three
    # outputs, or from `LIBRARY_REDUCTION_SIZE` entries library sums, whose
    # maximum drops a NaN in jax 0.10.2): each kind of bad entry, alone among
    # good ones, in either sign convention.
    bad = (0.0, -1.0, np.nan, np.inf, -np.inf)

    @jax.jit
    def validity(diagonals):
        out = []
        for d in diagonals:
            for tags in ((), PSD, lx.negative_semidefinite_tag):
                sign = -1 if tags == lx.negative_semidefinite_tag else 1
                op = lxd.DiagonalLinearOperator(sign * d)
                op = lx.TaggedLinearOperator(op, tags) if tags else op
                m = lxd.jacobi(op, throw=False)
                out.append((m.valid, jnp.all(jnp.isfinite(m.inverse_diagonal))))
        return out

    good = jnp.arange(1.0, n + 1.0, dtype=dtype)
    found = validity([good] + [good.at[n // 2].set(x) for x in bad])
    for i, (valid, finite) in enumerate(found):
        entry, tagged = (None, *bad)[i // 3], i % 3 != 0
        usable = entry is None or (entry == -1.0 and not tagged)
        assert bool(valid) is usable and bool(finite) is usable, (entry, i % 3)


def _chain(a, u):
    """`D^1/2 L D^1/2` on a line of `a.size` points, `L` the shifted 3-point
    Laplacian."""
    w = jnp.sqrt(a)
    g = jnp.pad(w * u, 1)
    return w * (2.5 * g[1:-1] - g[:-2] - g[2:])


def test_auto_solver_preconditions_where_the_build_is_cheap():
    """On 1600 unknowns (~80 expected steps) a band's 2 coloured probes are within
    a tenth of them: the build is taken, and applied where the diagonal spans 1e3,
    not where it is constant; 1600 basis vectors are not; a held matrix's
    diagonal is free."""
    n = 1600
    auto = lxd.AutoSolver(1e-10, 1e-10, pattern=lxd.Band(1, 1), memory_budget=10**5)
    plain = lxd.AutoSolver(1e-10, 1e-10, memory_budget=10**5)
    structure = jax.ShapeDtypeStruct((n,), jnp.float64)
    b = jnp.cos(jnp.arange(n, dtype=jnp.float64))
    for span, applied in ((1e3, True), (1.0, False)):
        a = span ** jnp.sin(jnp.arange(n) / 50.0) ** 2
        op = lxd.FunctionLinearOperator(lambda u, a=a: _chain(a, u), structure, PSD)
        chosen, reasons = auto.choose(op)
        assert isinstance(chosen, lxd.PreconditionedSolver), reasons
        assert "2 coloured probe vectors" in reasons[-1]
        assert "applied where its spread is at least 10" in reasons[-1]
        sol = jax.jit(lambda b: lx.linear_solve(op, b, auto))(b)
        assert bool(sol.stats["preconditioned"]) is applied
        reference = lx.linear_solve(op, b, lx.CG(1e-10, 1e-10, max_steps=10 * n))
        np.testing.assert_allclose(sol.value, reference.value, rtol=1e-7)
    chosen, reasons = plain.choose(op)
    assert isinstance(chosen, lxd.CG) and "takes 1600 `mv`s, more than" in reasons[-1]
    held = lxd.MatrixLinearOperator(jnp.diag(jnp.arange(1.0, 4097.0)), PSD)
    chosen, reasons = lxd.AutoSolver(memory_budget=10**5).choose(held)
    assert isinstance(chosen, lxd.PreconditionedSolver) and "0 `mv`s" in reasons[-1]


def test_jacobi_on_sharded_vectors():
    """Jacobi (from coloured probes and from a held matrix) and block Jacobi (its
    8 blocks one per device) keep a CG solve on vectors sharded over an Explicit
    mesh axis sharded."""
    script = """
import jax, jax.numpy as jnp, lineax as lx, numpy as np, equinox as eqx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
jax.config.update("jax_enable_x64", True)
import lineax_dispatch as lxd
n = 64
rng = np.random.default_rng(0)
m = rng.standard_normal((n, n)) * (np.abs(np.subtract.outer(range(n), range(n))) <= 2)
a_np = m @ m.T / n + np.diag(10 ** (3 * rng.random(n)))
b_np = rng.standard_normal(n)
expected = np.linalg.solve(a_np, b_np)
mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
a = jax.device_put(a_np, NamedSharding(mesh, P("x")))
b = jax.device_put(b_np, NamedSharding(mesh, P("x")))
tag = lx.positive_semidefinite_tag
def solve(a, b, build):
    op = lxd.FunctionLinearOperator(eqx.Partial(lambda a, x: a @ x, a), jax.typeof(b), tag)
    pre = build(op, lxd.MatrixLinearOperator(a, tag))
    return lx.linear_solve(op, b, lxd.CG(1e-10, 1e-10), options={"preconditioner": pre}).value
builds = (lambda op, held: lxd.jacobi(op, pattern=lxd.Band(2, 2)),
          lambda op, held: lxd.jacobi(held),
          lambda op, held: lxd.block_jacobi(op, 8, pattern=lxd.Band(2, 2)))
with jax.set_mesh(mesh):
    for build in builds:
        y = jax.jit(solve, static_argnums=2)(a, b, build)
        np.testing.assert_allclose(y, expected, rtol=1e-7)
        assert y.sharding.spec == P("x"), y.sharding
print("OK")
"""
    run_on_eight_devices(script)
