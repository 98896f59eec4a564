"""Dependent solves of one operator compile the same kernels, as lineax's do: the
solution's product by its unit (`in_user_units`) is a kernel of its own, not
fused into the next solve's preparation, so a second solve's kernels are the
first's again and XLA:CPU compiles each once. Also `in_user_units` itself, under
`vmap` with one `unit` of 1 and one not."""

import re

import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import lineax_dispatch as lxd
from lineax_dispatch.solvers.skeleton._linear_system import in_user_units


def _canonical(block: str) -> str:
    """A fused computation's instructions with metadata left out and its values
    named by first appearance: equal for two copies of one computation."""
    names: dict[str, str] = {}

    def rename(match: re.Match) -> str:
        return names.setdefault(match.group(0), f"%v{len(names)}")

    lines = [re.sub(r", metadata=\{[^}]*\}", "", x) for x in block.splitlines()[1:]]
    return re.sub(r"%[\w.\-]+", rename, "\n".join(lines))


def _distinct_fusions(text: str) -> int:
    """The distinct fused computations of an optimised HLO module's text."""
    blocks = re.findall(r"(?ms)^%fused_computation[\w.\-]* .*?^}", text)
    return len({_canonical(b) for b in blocks})


def _stencil(x):
    padded = jnp.pad(x, 1)
    return 4.5 * x - padded[:-2] - padded[2:]


def _program(ours: bool, solves: int, solver_name: str):
    n = 256
    module = lxd if ours else lx
    solvers = dict(
        CG=module.CG(rtol=1e-5, atol=1e-5, max_steps=100),
        GMRES=module.GMRES(rtol=1e-5, atol=1e-5, max_steps=100),
    )
    solver = solvers[solver_name]
    structure = jax.ShapeDtypeStruct((n,), jnp.float32)
    extra = dict(policy=lxd.Lazy()) if ours else {}

    def f(b):
        op = module.FunctionLinearOperator(
            _stencil, structure, lx.positive_semidefinite_tag, **extra
        )
        y = b
        for _ in range(solves):
            y = lx.linear_solve(op, y, solver, throw=False).value
        return y

    b = jnp.linspace(-3.0, 3.0, n, dtype=jnp.float32)
    return f, b


def _added_by_second_solve(ours: bool, solver_name: str) -> int:
    counts = []
    for solves in (1, 2):
        f, b = _program(ours, solves, solver_name)
        counts.append(_distinct_fusions(jax.jit(f).lower(b).compile().as_text()))
    return counts[1] - counts[0]


@pytest.mark.parametrize("solver_name", ["CG", "GMRES"])
def test_a_second_dependent_solve_adds_no_more_kernels_than_lineax_s(solver_name):
    ours = _added_by_second_solve(True, solver_name)
    theirs = _added_by_second_solve(False, solver_name)
    assert ours <= theirs, (ours, theirs)


def test_dependent_solves_give_the_solution():
    f, b = _program(True, 2, "CG")
    g, _ = _program(False, 2, "CG")
    np.testing.assert_allclose(jax.jit(f)(b), jax.jit(g)(b), rtol=1e-4, atol=1e-4)


def test_in_user_units_multiplies_each_vector_by_its_own_unit():
    y = jnp.arange(1.0, 7.0, dtype=jnp.float32).reshape(2, 3)
    for units in ([1.0, 4.0], [1.0, 1.0], [0.25, 8.0]):
        unit = jnp.asarray(units, jnp.float32)
        got = jax.jit(jax.vmap(in_user_units))(y, unit)
        np.testing.assert_array_equal(got, y * unit[:, None])
    np.testing.assert_array_equal(
        jax.jit(in_user_units)(y[0], jnp.float32(0.5)), y[0] * 0.5
    )
