"""`lxd.jit` with `Auto` on the zoo of programs (tests/helpers/roll_programs.py):
each program rewritten as `Auto` decides under two cost models (rolled, one matrix
for the program, or left inline), with `jax.jit`'s results under jit, grad, jvp and
vmap, and transformations inside `lxd.jit`. The `Roll` rewrite itself:
test_roll.py."""

import functools as ft

import jax
import jax.numpy as jnp
import pytest

import lineax_dispatch as lxd

from ..helpers.roll_programs import (
    _close,
    _MODELS,
    _operators,
    _transformed,
    _transformed_args,
    lazy_reference,
    NO_LEAK_CHECK,
    ZOO,
    ZOO_X,
)


# Under the roll model Auto's rewrite is test_roll.py's, which runs every program of
# the zoo: here, the programs whose decision differs (Roll, or Lazy for sites in
# loop bodies); the materialise model's rewrite is Auto's own: every program.
_CASES = [(name, "materialise") for name in ZOO] + [
    (name, "roll")
    for name in ("dependent", "independent", "mixed", "pytree", "in-scan-and-cond")
]


@ft.cache
def _transformed_lazy_reference(name):
    """`jax.jit` of `_transformed` of the zoo's program `name` on `Lazy` operators:
    the same for both cost models, so computed once."""
    lazy_ops = _operators(lxd.Lazy())
    lazy = lambda x: ZOO[name](lazy_ops, x)
    return jax.jit(_transformed(lazy, lambda f: f))(*_transformed_args(ZOO_X))


@pytest.mark.parametrize("name, model", _CASES)
def test_auto_programs_match_jax_jit(name, model):
    auto_ops = _operators(lxd.Auto(cost_model=_MODELS[model]))
    program = ZOO[name]
    auto = lambda x: program(auto_ops, x)
    x = ZOO_X
    compiled = lxd.jit(auto)
    if name in NO_LEAK_CHECK:
        out = compiled(x)
    else:
        with jax.checking_leaks():
            out = compiled(x)
    _close(out, lazy_reference(name))
    strategies = {d.strategy for d in compiled.decisions(x).values()}
    if name in ("dependent", "independent", "mixed"):
        assert strategies == {"Roll" if model == "roll" else "Materialise"}
    if name == "in-scan-and-cond":
        # Sites inside loop bodies and branches stay inline.
        assert strategies == {"Lazy"}
    # grad, jvp and vmap of `lxd.jit` programs, compiled together.
    _close(
        jax.jit(_transformed(auto, lxd.jit))(*_transformed_args(x)),
        _transformed_lazy_reference(name),
    )


@pytest.mark.parametrize("name", list(ZOO))
def test_transformations_inside_lxd_jit_match_jax_jit(name):
    """`lxd.jit` of grad, jvp and vmap of the zoo's programs, `Auto` deciding to
    materialise: a transformation's calls of an `Auto` operator's `mv` keep its
    name but compute something else (a primal with residuals, a transpose, a JVP),
    and are not decided for as its `mv` (materialising them gave wrong values)."""
    auto_ops = _operators(lxd.Auto(cost_model=_MODELS["materialise"]))
    auto = lambda x: ZOO[name](auto_ops, x)
    compiled = lxd.jit(_transformed(auto, lambda f: f))
    args = _transformed_args(ZOO_X)
    _close(compiled(*args), _transformed_lazy_reference(name))


def test_an_operator_at_many_sites_and_its_transpose():
    """A program with plain call sites of an `Auto` operator and transformed ones:
    the plain ones are decided for (and materialised), the others left as
    computed, the results those of `jax.jit`."""
    auto_ops = _operators(lxd.Auto(cost_model=_MODELS["materialise"]))
    op = auto_ops[0]
    loss = lambda z: jnp.sum(jnp.sin(op.mv(z)))

    def f(x):
        return op.mv(x) + op.mv(2 * x), jax.grad(loss)(x), jax.jvp(op.mv, (x,), (x,))

    compiled = lxd.jit(f)
    _close(compiled(ZOO_X), jax.jit(f)(ZOO_X))
    strategies = {d.strategy for d in compiled.decisions(ZOO_X).values()}
    assert strategies == {"Materialise"}
