"""How often the user's function runs while one of the one-`mv`-site solvers is
compiled, and under `grad`, against lineax's solvers: once per trace, where
lineax's run it once per `mv` site."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import pytest

from ..helpers.solver_problems import Counter, function_operator, rhs, SOLVERS


# Every test here runs under lineax's strict dtype and rank promotion.
pytestmark = pytest.mark.usefixtures("strict_promotion")


# How often the user's function runs while jit-compiling one solve. lineax's
# linear_solve primitive traces `compute` twice (abstract evaluation, lowering), so
# one `mv` site gives 2. Normal and LSMR also apply the transpose, which lineax
# computes for a FunctionLinearOperator by transposing the function (one more run
# of it per site): one site each for `mv` and its transpose gives 4.
_JIT_COUNTS = {"normal-cg": 4, "lsmr": 4}
# CG's inline layout writes `mv` where lineax's CG does (three sites), so a plain
# lineax operator runs as often as under lineax's CG. (An operator of ours traces
# the function once per trace whatever the layout: see below; and `layout="auto"`
# keeps a plain lineax operator on one site.)
_AS_LINEAX = ("cg-inline",)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_jit_runs_function_once_per_trace(name):
    ours, theirs, kinds = SOLVERS[name]
    kind = kinds[-1]
    b = jnp.asarray(rhs(kind, jnp.float64))
    counts = {}
    for who, factory in (("ours", ours), ("lineax", theirs)):
        if factory is None:
            continue
        counter = Counter()
        # A plain lineax operator: each `mv` site of the solver runs the function
        # (an operator of ours traces it once per trace, whatever the solver).
        operator = function_operator(kind, jnp.float64, counter=counter, dispatch=False)
        operator.out_structure()  # lineax evaluates the function once for this
        counter.n = 0
        jax.jit(lambda b: lx.linear_solve(operator, b, factory(1e-8)).value)(b)
        counts[who] = counter.n
    if name in _AS_LINEAX:
        assert counts["ours"] == counts["lineax"] == 6, counts
        return
    assert counts["ours"] == _JIT_COUNTS.get(name, 2), counts
    if "lineax" in counts:
        assert counts["lineax"] > counts["ours"], counts


class _CountCompute(lx.AbstractLinearSolver):
    """Wraps a solver; the function's counter counts only inside `compute`."""

    inner: lx.AbstractLinearSolver
    counter: Counter = eqx.field(static=True)

    def init(self, operator, options):
        return self.inner.init(operator, options)

    def compute(self, state, vector, options):
        self.counter.active = True
        try:
            return self.inner.compute(state, vector, options)
        finally:
            self.counter.active = False

    def transpose(self, state, options):
        return self.inner.transpose(state, options)

    def conj(self, state, options):
        return self.inner.conj(state, options)

    def assume_full_rank(self):
        return self.inner.assume_full_rank()


# lineax's number of `mv` sites in one `compute` (CG: initial residual, step,
# refresh; BiCGStab: initial residual and two per step; GMRES: Arnoldi step and
# residual). Ours have one.
_LINEAX_SITES = {"cg": 3, "bicgstab": 3, "gmres": 2}


@pytest.mark.parametrize("name", list(_LINEAX_SITES))
def test_grad_runs_function_once_per_compute(name):
    ours, theirs, kinds = SOLVERS[name]
    kind = kinds[0]
    b = jnp.asarray(rhs(kind, jnp.float64))
    counts = {}
    for who, factory in (("ours", ours), ("lineax", theirs)):
        counter = Counter()

        def loss(theta, b):
            # Plain lineax: each `mv` site runs the function (see above).
            operator = function_operator(
                kind, jnp.float64, theta, counter, dispatch=False
            )
            solver = _CountCompute(factory(1e-10), counter)
            return jnp.sum(lx.linear_solve(operator, b, solver).value ** 2)

        counter.active = False
        jax.jit(jax.grad(loss, argnums=(0, 1)))(1.5, b)
        counts[who] = counter.n
    # Under grad `compute` is traced for the primal, the tangent and the cotangent
    # solves (6 traces here); ours runs the function once per trace.
    assert counts["ours"] * _LINEAX_SITES[name] == counts["lineax"], counts
    assert counts["ours"] <= counts["lineax"] / 2, counts
