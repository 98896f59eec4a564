"""The cases of `auto`: its constants, the operators of each (kind, n), a fresh
operator per (variant, workload), the solver and the jitted program of each
workload with `k` call sites."""

from collections.abc import Callable
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

import lineax_dispatch as lxd
from benchmarks import harness
from benchmarks.harness import SEED


KINDS = ("cheap", "expensive")
WORKLOADS = ("mv", "solve")
WEIGHT_CAP_BYTES = 256 * 2**20
MATERIALISE_CAP_BYTES = 2**30
MATERIALISE_BATCH = 128
RTOL = 1e-5
ATOL = 1e-5
MAX_STEPS = 200
SHIFT = 0.02
RHS_SCALE = 1 / 16
FIXED = ("Lazy", "Outline", "Materialise", "Roll")
BASELINE = "lineax"
AUTO = "Auto"  # Auto() : runs=100, the default
AUTO_ONCE = "Auto1"  # Auto(runs=1)
AUTOS = (AUTO_ONCE, AUTO)
VARIANTS = FIXED + (BASELINE,) + AUTOS
# Variants compiled with `lxd.jit` (Roll only acts there); the others with jax.jit.
LXD_JIT = ("Roll",) + AUTOS
# How each case is scored: compile total + runs x run, for these runs, and the Auto
# variant that is told that number of runs.
SCORES = (1, 100)
AUTO_FOR = {1: AUTO_ONCE, 100: AUTO}


# ------------------------------------------------------------------ operators


@dataclass(frozen=True)
class OperatorData:
    """The arrays of one (kind, n): `mv_arrays` for the "mv" workload and
    `solve_arrays` for the (SPD) "solve" workload."""

    kind: str
    n: int
    layers: int  # 1 for "cheap" (one matmul)
    mv_arrays: tuple
    solve_arrays: tuple
    note: str

    def arrays(self, workload: str) -> tuple:
        return self.mv_arrays if workload == "mv" else self.solve_arrays

    def nbytes(self) -> int:
        leaves = jax.tree_util.tree_leaves((self.mv_arrays, self.solve_arrays))
        unique = {id(x): x for x in leaves}
        return sum(x.size * x.dtype.itemsize for x in unique.values())


def layers_for(n: int, layers: int) -> int:
    """`layers`, or fewer so that the weights stay within WEIGHT_CAP_BYTES."""
    return max(1, min(layers, WEIGHT_CAP_BYTES // (4 * n * n)))


def make_cheap(n: int, seed: int = SEED) -> OperatorData:
    """`M = I + G G^T / (1.05 SHIFT lambda_max(G G^T))`."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    g = jax.random.normal(k1, (n, n), jnp.float32) / jnp.sqrt(n)
    gram = g @ g.T
    lam = float(harness.top_eigenvalue(jax.jit(lambda x: gram @ x), n, k2))
    matrix = jnp.eye(n, dtype=jnp.float32) + gram / (1.05 * SHIFT * lam)
    matrix = jax.block_until_ready(matrix)
    return OperatorData(
        "cheap", n, 1, (matrix,), (matrix,), "x -> M @ x, one dense SPD matrix"
    )


def make_expensive(n: int, layers: int, seed: int = SEED) -> OperatorData:
    """Weights `W_i ~ N(0, 1/n)`, scales `s_i ~ U(0.5, 1.5)`; for solves the scales
    are multiplied by a common factor making `lambda_max(C^T C)` about `1 / SHIFT`."""
    keys = jax.random.split(jax.random.key(seed + 1), 2 * layers + 1)
    weights, scales = harness.random_layers(keys, n, layers)
    gram = jax.jit(lambda x: harness.apply_gram(weights, scales, x))
    lam = float(harness.top_eigenvalue(gram, n, keys[-1]))
    factor = (1.05 * SHIFT * lam) ** (-1.0 / (2 * layers))
    spd_scales = tuple(s * factor for s in scales)
    weights, scales, spd_scales = jax.block_until_ready((weights, scales, spd_scales))
    return OperatorData(
        "expensive",
        n,
        layers,
        (weights, scales),
        (weights, spd_scales),
        f"chain of {layers} dense layers "
        f"({layers * n * n * 4 / 2**20:.0f} MiB of weights)",
    )


def fresh_function(kind: str, workload: str) -> Callable:
    """A new function object `(*arrays, x) -> y` each call."""
    if kind == "cheap":

        def matvec(matrix, x):
            return matrix @ x

        return matvec
    if workload == "mv":

        def chain(weights, scales, x):
            return harness.apply_chain(weights, scales, x)

        return chain

    def spd(weights, scales, x):
        return x + harness.apply_gram(weights, scales, x)

    return spd


def build_operator(variant: str, data: OperatorData, workload: str):
    """A fresh operator for `variant`; its arrays are leaves (see the docstring)."""
    fn = eqx.Partial(fresh_function(data.kind, workload), *data.arrays(workload))
    structure = jax.ShapeDtypeStruct((data.n,), jnp.float32)
    tags = lx.positive_semidefinite_tag if workload == "solve" else ()
    if variant == BASELINE:
        return lx.FunctionLinearOperator(fn, structure, tags, closure_convert=False)
    policy = {
        "Lazy": lxd.Lazy(),
        "Outline": lxd.Outline(),
        "Materialise": lxd.Materialise(batch_size=MATERIALISE_BATCH),
        "Roll": lxd.Roll(),
        AUTO: lxd.Auto(),
        AUTO_ONCE: lxd.Auto(runs=1),
    }[variant]
    return lxd.FunctionLinearOperator(
        fn, structure, tags, closure_convert=False, policy=policy
    )


def make_solver(variant: str):
    if variant == BASELINE:
        return lx.CG(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)
    return lxd.CG(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)


# ------------------------------------------------------------------ programs


def make_program(op, workload: str, k: int, solver) -> tuple[Callable, object, object]:
    """`(f, params, static)`: `f(params, x)` runs the workload with `k` call sites
    on `eqx.combine(params, static)` (`harness.split_program`)."""

    def mvs(op, x):
        total = op.mv(x * 1)
        for i in range(1, k):
            total = total + op.mv(x * (i + 1))
        return total

    def solves(op, b):
        total, steps, ok = None, [], []
        for i in range(k):
            sol = lx.linear_solve(op, b * (i + 1), solver, throw=False)
            total = sol.value if total is None else total + sol.value
            steps.append(sol.stats["num_steps"])
            ok.append(sol.result == lx.RESULTS.successful)
        return total, jnp.max(jnp.stack(steps)), jnp.all(jnp.stack(ok))

    return harness.split_program(op, mvs if workload == "mv" else solves)


@dataclass(frozen=True)
class Case:
    kind: str
    workload: str
    n: int
    layers: int
    k: int

    def label(self) -> str:
        return f"{self.kind}/{self.workload} n={self.n} k={self.k}"
