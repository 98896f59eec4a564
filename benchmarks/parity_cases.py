"""The parity zoo's cases (`benchmarks/parity.py`): the constants, the cases, the
problem (float32 arrays and their float64 true matrices), the operators, policies
and solvers of each case, and the verdict on a row (`judge`)."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


FULL = dict(n=256)
QUICK = dict(n=64)
LAYERS, SHIFT, SEED = 8, 0.1, 0
RTOL = ATOL = 1e-6
MAX_STEPS = 1000
# Bounds: our error within FACTOR x max(baseline error, FLOOR) (about 8 float32
# epsilons: below it both sides are at float32's rounding).
FACTOR, AUTO_FACTOR, MV_FACTOR, FLOOR = 10.0, 2.0, 2.0, 1e-6
BATCH, SITES = 64, 4  # vectors of `batch_mv`; independent call sites stacked
CASE_TIMEOUT_S, SETUP_TIMEOUT_S = 120.0, 300.0
KINDS = (
    "function",
    "matrix",
    "pytree",
    "jacobian",
    "diagonal",
    "tridiagonal",
    "add",
    "composed",
)
POLICIES = ("lazy", "outline", "materialise", "vmapbatch", "scan", "roll", "auto")
# Under `lxd.jit` (program level); the others under `jax.jit`.
PROGRAM_LEVEL = ("roll", "auto")
SOLVERS = (
    "cg",
    "gmres",
    "bicgstab",
    "minres",
    "lsmr",
    "normal",
    "lu",
    "cholesky",
    "autosolver",
)
# The other kinds are solved with these only (the full set runs on `function`).
OTHER_KIND_SOLVERS = ("cg", "lu")
GROUPS = ("solve", "batch_mv", "stacked", "dense")
VERDICTS = ("ok", "FAIL", "not solved", "refused", "timed out", "not run")


# ------------------------------------------------------------------ cases


@dataclass(frozen=True)
class Case:
    """One row: `group` (solve, batch_mv, stacked, dense), the operator `kind`, the
    `policy` and, for a solve, the `solver` (for `dense`: `dense_matrix` or
    `lx.materialise`)."""

    group: str
    kind: str
    policy: str
    solver: str = "-"

    @property
    def id(self) -> str:
        return f"{self.group}:{self.kind}:{self.policy}:{self.solver}"

    @classmethod
    def parse(cls, text: str) -> "Case":
        return cls(*text.split(":"))


def cases(
    kinds: Sequence[str] = KINDS,
    policies: Sequence[str] = POLICIES,
    solvers: Sequence[str] = SOLVERS,
    groups: Sequence[str] = GROUPS,
) -> list[Case]:
    """The cases of a run: every policy with every solver on the `function` kind
    (the normal map); the other kinds with `OTHER_KIND_SOLVERS`; the `mv` groups
    on the `function` kind.

    **Arguments:**

    - `kinds`, `policies`, `solvers`, `groups`: the names to keep.

    **Returns:**

    A list of `Case`s.
    """
    out = []
    if "solve" in groups:
        for kind in kinds:
            names = SOLVERS if kind == "function" else OTHER_KIND_SOLVERS
            out += [
                Case("solve", kind, p, s)
                for s in names
                if s in solvers
                for p in policies
            ]
    mv_kind = "function" if "function" in kinds else None
    if mv_kind and "batch_mv" in groups:
        out += [Case("batch_mv", mv_kind, p) for p in policies]
    if mv_kind and "stacked" in groups:
        out += [Case("stacked", mv_kind, p) for p in policies]
    if mv_kind and "dense" in groups:
        for how in ("dense_matrix", "lx.materialise"):
            out += [Case("dense", mv_kind, p, how) for p in policies]
    return out


# ------------------------------------------------------------------ problem


class Problem:
    """The arrays of every kind (float32, on the device) and their true matrices
    (float64 numpy, from the float32 arrays). Imports jax when built."""

    def __init__(self, n: int):
        import jax
        import jax.numpy as jnp

        from benchmarks import harness

        self.n = n
        weights, scales = harness.chain_layers(n, LAYERS, SEED)
        b64 = _chain64(weights, scales)
        # Scale the layers so that B^T B has its largest eigenvalue about 1.
        top = np.linalg.norm(b64, 2) ** 2
        factor = (1.02 * top) ** (-1.0 / (2 * LAYERS))
        self.weights = tuple(weights)
        self.scales = tuple(jnp.asarray(s * factor, jnp.float32) for s in scales)
        jax.block_until_ready(self.scales)
        self.b_chain = _chain64(self.weights, self.scales)
        self.normal = self.b_chain.T @ self.b_chain + SHIFT * np.eye(n)
        rng = np.random.default_rng(SEED + 1)
        self.dense32 = self.normal.astype(np.float32)
        self.x0 = rng.uniform(-1, 1, n).astype(np.float32)
        self.diag = (1.0 + rng.random(n)).astype(np.float32)
        self.off = (0.5 * rng.standard_normal(n - 1)).astype(np.float32)
        self.rhs = rng.standard_normal(n).astype(np.float32)
        self.vectors = rng.standard_normal((BATCH, n)).astype(np.float32)

    def true_matrix(self, kind: str) -> np.ndarray:
        """The float64 matrix of `kind`'s operator."""
        if kind in ("function", "add", "composed"):
            return self.normal
        if kind in ("matrix", "pytree"):
            return self.dense32.astype(np.float64)
        if kind == "jacobian":
            return self.normal + 0.05 * np.diag(np.cos(self.x0.astype(np.float64)))
        if kind == "diagonal":
            return np.diag(self.diag.astype(np.float64))
        if kind == "tridiagonal":
            off = self.off.astype(np.float64)
            main = 4.0 + self.diag.astype(np.float64)
            return np.diag(main) + np.diag(off, 1) + np.diag(off, -1)
        raise ValueError(
            f"unknown kind {kind!r}; choose from {KINDS}"
        )  # pragma: no cover

    def reference(self, kind: str) -> np.ndarray:
        """`np.linalg.solve` of the true matrix (float64) at the right-hand side."""
        return np.linalg.solve(self.true_matrix(kind), self.rhs.astype(np.float64))


def _chain64(weights, scales) -> np.ndarray:
    """The dense float64 matrix of `x -> s_L (W_L ... s_1 (W_1 x))`."""
    out = np.eye(np.asarray(weights[0]).shape[0])
    for w, s in zip(weights, scales):
        out = np.asarray(s, np.float64)[:, None] * (np.asarray(w, np.float64) @ out)
    return out


def plain_operator(problem: Problem, kind: str):
    """`kind`'s operator from plain lineax, its arrays as leaves, tagged symmetric
    positive semidefinite (directly where lineax's constructor takes tags, else in
    a `TaggedLinearOperator`)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import lineax as lx

    from benchmarks import harness

    n, tags = problem.n, (lx.symmetric_tag, lx.positive_semidefinite_tag)
    struct = jax.ShapeDtypeStruct((n,), jnp.float32)
    w, s = problem.weights, problem.scales

    def normal_map(w, s, x):
        return SHIFT * x + harness.apply_gram(w, s, x)

    def chain_transpose(w, s, x):
        for wi, si in zip(reversed(w), reversed(s)):
            x = (si * x) @ wi
        return x

    gram = eqx.Partial(harness.apply_gram, w, s)
    function = lambda f, t=tags: lx.FunctionLinearOperator(
        f, struct, t, closure_convert=False
    )
    tagged = lambda op: lx.TaggedLinearOperator(op, tags)
    shift = lx.DiagonalLinearOperator(jnp.full((n,), SHIFT, jnp.float32))
    if kind == "function":
        return function(eqx.Partial(normal_map, w, s))
    if kind == "matrix":
        return lx.MatrixLinearOperator(jnp.asarray(problem.dense32), tags)
    if kind == "pytree":
        k, a = n // 2, jnp.asarray(problem.dense32)
        blocks = {
            "a": {"a": a[:k, :k], "b": a[:k, k:]},
            "b": {"a": a[k:, :k], "b": a[k:, k:]},
        }
        out = {
            "a": jax.ShapeDtypeStruct((k,), jnp.float32),
            "b": jax.ShapeDtypeStruct((n - k,), jnp.float32),
        }
        return lx.PyTreeLinearOperator(blocks, out, tags)
    if kind == "jacobian":

        def fn(x, args):
            return normal_map(*args, x) + 0.05 * jnp.sin(x)

        x0 = jnp.asarray(problem.x0)
        return lx.JacobianLinearOperator(fn, x0, (w, s), tags)
    if kind == "diagonal":
        return tagged(lx.DiagonalLinearOperator(jnp.asarray(problem.diag)))
    if kind == "tridiagonal":
        off = jnp.asarray(problem.off)
        main = jnp.asarray(4.0 + problem.diag)
        return tagged(lx.TridiagonalLinearOperator(main, off, off))
    if kind == "add":
        return tagged(function(gram, ()) + shift)
    if kind == "composed":
        chain = eqx.Partial(harness.apply_chain, w, s)
        transpose = eqx.Partial(chain_transpose, w, s)
        return tagged(function(transpose, ()) @ function(chain, ()) + shift)
    raise ValueError(f"unknown kind {kind!r}; choose from {KINDS}")  # pragma: no cover


def policy_of(name: str):
    """The `lxd` policy called `name`."""
    import lineax_dispatch as lxd

    return dict(
        lazy=lxd.Lazy,
        outline=lxd.Outline,
        materialise=lxd.Materialise,
        vmapbatch=lxd.VmapBatch,
        scan=lxd.Scan,
        roll=lxd.Roll,
        auto=lxd.Auto,
    )[name]()


def solver_pair(name: str) -> tuple[object, object, str]:
    """`(ours, lineax's, lineax's name)` for a solver name, with equal tolerances."""
    import lineax as lx

    import lineax_dispatch as lxd

    tol = dict(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)
    pairs = dict(
        cg=(lxd.CG(**tol), lx.CG(**tol), "lx.CG"),
        gmres=(lxd.GMRES(**tol), lx.GMRES(**tol), "lx.GMRES"),
        bicgstab=(lxd.BiCGStab(**tol), lx.BiCGStab(**tol), "lx.BiCGStab"),
        minres=(lxd.MINRES(**tol), lx.CG(**tol), "lx.CG (no lx.MINRES)"),
        lsmr=(lxd.LSMR(**tol), lx.LSMR(**tol), "lx.LSMR"),
        normal=(
            lxd.Normal(lxd.CG(**tol)),
            lx.Normal(lx.CG(**tol)),
            "lx.Normal(lx.CG)",
        ),
        lu=(lx.LU(), lx.LU(), "lx.LU"),
        cholesky=(lx.Cholesky(), lx.Cholesky(), "lx.Cholesky"),
        autosolver=(
            lxd.AutoSolver(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS),
            lx.AutoLinearSolver(well_posed=True),
            "lx.AutoLinearSolver(well_posed=True)",
        ),
    )
    return pairs[name]


def result_name(index: int) -> str:
    """The name of a lineax result code."""
    import lineax as lx

    items = lx.RESULTS._name_to_item.items()
    return {int(item._value): name for name, item in items}.get(index, str(index))


# ------------------------------------------------------------------ verdicts


def bound_factor(case: Case) -> float:
    """10 for a solve, 2 for the Auto policy, `lxd.AutoSolver` and the `mv` groups."""
    if case.group != "solve":
        return MV_FACTOR
    if case.policy == "auto" or case.solver == "autosolver":
        return AUTO_FACTOR
    return FACTOR


def judge(case: Case, measured: dict, base: dict) -> dict:
    """The row: `measured` (error, result, steps) against `base`, with verdict."""
    factor = bound_factor(case)
    bound = factor * max(base["error"], FLOOR)
    if measured["result"] not in ("successful", "-"):
        verdict = "not solved"
    else:
        verdict = "ok" if measured["error"] <= bound else "FAIL"
    return dict(
        measured,
        baseline=base["name"],
        baseline_error=base["error"],
        baseline_result=base["result"],
        factor=factor,
        bound=bound,
        verdict=verdict,
        **{k: v for k, v in base.items() if k == "lineax_as_matrix_error"},
    )
