"""Parity on whatever backend JAX sees: every operator kind x policy x solver of
lineax-dispatch in float32, each against plain lineax (`jax.jit`, an `lx` operator
and an `lx` solver) on the same problem and against a float64 reference computed
on the host with numpy; `lxd.batch_mv`, stacked call sites and the dense matrix of
an operator against a Python loop of `mv`.

The problem exposes low-precision matrix-matrix products: the normal map
`A = B^T B + 0.1 I`, `B` a chain of 8 dense `n x n` float32 layers (scaled so that
the spectrum of `A` is about `[0.1, 1.1]`). On a TPU at default precision a
float32 matrix-matrix product runs in bfloat16 passes while a matrix-vector
product stays float32, so a strategy that stacks `mv`s into a matmul can come out
two digits off while reporting success.

Each row has our relative error (to the float64 reference), the baseline's (plain
lineax's solve on the same problem; for the `mv` groups, a Python loop of lineax's
jitted `mv`), the reported result and a verdict:

- `ok`: our error within the bound, `factor x max(baseline error, FLOOR)`, the
  factor 10 (2 for the Auto policy, `lxd.AutoSolver` and the `mv` groups);
- `FAIL`: a reported success (or an `mv`, which reports none) beyond the bound;
- `not solved`: the solve reported something other than success (its result
  shown); `refused`: it raised (its message shown); `timed out`: no answer within
  `--case-timeout` seconds (the case's process is ended and the rest go on in a
  new one); `not run`: left when the `--budget` of seconds was spent.

    python -m benchmarks.parity --out /tmp/parity            # n=256, every case
    python -m benchmarks.parity --quick --out /tmp/parity    # n=64
    python -m benchmarks.parity --n 32 --kinds function --policies lazy,roll \\
        --solvers cg,lu --groups solve,batch_mv --out /tmp/parity

The exit status is 1 where any row is `FAIL`. `benchmarks/accelerator.py` runs
this, then the headline benchmarks; docs/accelerators.md says how to read it.
Results: `<out>/parity.json` and `parity.png` (where matplotlib is installed).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

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


# ------------------------------------------------------------------ measure


def relative_error(value, reference) -> float:
    """`|value - reference| / |reference|` (Frobenius), in float64 on the host."""
    value = np.asarray(value, np.float64)
    return float(np.linalg.norm(value - reference) / np.linalg.norm(reference))


class Runner:
    """Runs cases on one `Problem`, computing each baseline once."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.baselines: dict = {}

    # -- programs

    def _program(self, op, body: Callable, program_level: bool):
        """`(jitted, params)`: `body(op, arg)` with the operator's arrays as a jit
        argument, under `lxd.jit` where `program_level`, else `jax.jit`."""
        import jax

        import lineax_dispatch as lxd
        from benchmarks import harness

        f, params, _ = harness.split_program(op, body)
        return (lxd.jit(f) if program_level else jax.jit(f)), params

    def _flat(self, op):
        """`(to_tree, to_flat)` between flat vectors and `op`'s input PyTree."""
        import jax
        from jax.flatten_util import ravel_pytree

        zeros = jax.tree_util.tree_map(
            lambda s: np.zeros(s.shape, s.dtype), op.in_structure()
        )
        _, unravel = ravel_pytree(zeros)
        return unravel, lambda tree: ravel_pytree(tree)[0]

    def _solve(self, op, solver, program_level: bool):
        import jax.numpy as jnp
        import lineax as lx

        to_tree, to_flat = self._flat(op)

        def body(op, b):
            sol = lx.linear_solve(op, to_tree(b), solver, throw=False)
            steps = sol.stats.get("num_steps", jnp.array(-1))
            return to_flat(sol.value), sol.result._value, steps

        jitted, params = self._program(op, body, program_level)
        value, result, steps = jitted(params, jnp.asarray(self.problem.rhs))
        return np.asarray(value), result_name(int(result)), int(steps)

    def _mv_loop(self, vectors: np.ndarray) -> np.ndarray:
        """lineax's jitted `mv` of the `function` kind, one vector at a time."""
        import equinox as eqx
        import jax.numpy as jnp

        op = plain_operator(self.problem, "function")
        mv = eqx.filter_jit(lambda op, x: op.mv(x))
        return np.stack([np.asarray(mv(op, jnp.asarray(v))) for v in vectors])

    # -- baselines

    def baseline(self, case: Case) -> dict:
        """lineax's error on the case's problem (cached)."""
        key = (case.group, case.kind, case.solver if case.group == "solve" else "")
        if key not in self.baselines:
            self.baselines[key] = self._baseline(case)
        return self.baselines[key]

    def _baseline(self, case: Case) -> dict:
        p = self.problem
        true = p.true_matrix(case.kind)
        if case.group == "solve":
            _, theirs, name = solver_pair(case.solver)
            value, result, steps = self._solve(
                plain_operator(p, case.kind), theirs, False
            )
            error = relative_error(value, p.reference(case.kind))
            return dict(name=f"{name}, jax.jit", error=error, result=result)
        if case.group == "batch_mv":
            vectors = p.vectors
        elif case.group == "stacked":
            vectors = p.vectors[:SITES]
        else:  # dense: the columns
            vectors = np.eye(p.n, dtype=np.float32)
        loop = self._mv_loop(vectors)
        error = relative_error(loop, vectors.astype(np.float64) @ true.T)
        name = f"Python loop of {len(vectors)} jitted lx mv"
        out = dict(name=name, error=error, result="-")
        if case.group == "dense":
            import equinox as eqx

            op = plain_operator(p, case.kind)
            matrix = eqx.filter_jit(lambda op: op.as_matrix())(op)
            out["lineax_as_matrix_error"] = relative_error(matrix, true)
        return out

    # -- cases

    def run(self, case: Case) -> dict:
        """The row of one case (raises what the case raises)."""
        import jax
        import jax.numpy as jnp
        import lineax as lx

        import lineax_dispatch as lxd

        p = self.problem
        ours = lxd.with_policy(plain_operator(p, case.kind), policy_of(case.policy))
        program_level = case.policy in PROGRAM_LEVEL
        true = p.true_matrix(case.kind)
        row: dict = dict(result="-", steps=None)
        if case.group == "solve":
            solver, _, _ = solver_pair(case.solver)
            value, row["result"], row["steps"] = self._solve(
                ours, solver, program_level
            )
            error = relative_error(value, p.reference(case.kind))
        elif case.group in ("batch_mv", "stacked"):
            vectors = p.vectors if case.group == "batch_mv" else p.vectors[:SITES]
            if case.group == "batch_mv":
                body = lambda op, xs: lxd.batch_mv(op, xs)
            else:
                body = lambda op, xs: jnp.stack(
                    [op.mv(xs[i]) * 1 for i in range(SITES)]
                )
            jitted, params = self._program(ours, body, program_level)
            out = np.asarray(jitted(params, jnp.asarray(vectors)))
            error = relative_error(out, vectors.astype(np.float64) @ true.T)
        else:  # dense
            if case.solver == "dense_matrix":
                body = lambda op, _: lxd.dense_matrix(op)
            else:
                body = lambda op, _: lx.materialise(op).as_matrix()
            jitted, params = self._program(ours, body, program_level)
            matrix = jitted(params, jnp.zeros((), jnp.float32))
            error = relative_error(jax.block_until_ready(matrix), true)
        return dict(row, error=error)


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


def case_row(runner: Runner, case: Case) -> dict:
    """The judged row of `case`, an exception recorded as `refused`."""
    start = time.perf_counter()
    row = dict(id=case.id, **vars(case))
    try:
        base = runner.baseline(case)
    except Exception as e:  # the baseline itself failed: nothing to compare with
        return dict(
            row,
            verdict="refused",
            message=f"baseline (plain lineax) raised {type(e).__name__}: {e}"[:500],
            seconds=time.perf_counter() - start,
        )
    try:
        measured = runner.run(case)
    except Exception as e:
        traceback.print_exc(limit=3)
        return dict(
            row,
            baseline=base["name"],
            baseline_error=base["error"],
            verdict="refused",
            message=f"{type(e).__name__}: {e}"[:500],
            seconds=time.perf_counter() - start,
        )
    return dict(row, **judge(case, measured, base), seconds=time.perf_counter() - start)


# ------------------------------------------------------------------ worker


def worker(n: int, ids: Sequence[str], progress: Path) -> None:
    """Runs the cases `ids` in this process, appending a JSON line to `progress`
    once the problem is built (`{"ready": environment}`), before each case
    (`{"start": id}`) and after it (`{"row": ...}`)."""
    from benchmarks import harness

    problem = Problem(n)
    runner = Runner(problem)

    def emit(record: dict) -> None:
        with open(progress, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    emit({"ready": harness.environment()})
    for text in ids:
        emit({"start": text})
        emit({"row": case_row(runner, Case.parse(text))})


def _read_progress(path: Path) -> list[dict]:
    records = []
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return records


def _lost_row(case_id: str, verdict: str, message: str) -> dict:
    return dict(id=case_id, **vars(Case.parse(case_id)), verdict=verdict,
                message=message)  # fmt: skip


def supervise(
    n: int,
    todo: Sequence[Case],
    case_timeout: float = CASE_TIMEOUT_S,
    setup_timeout: float = SETUP_TIMEOUT_S,
    budget: float | None = None,
) -> tuple[list[dict], dict]:
    """Runs `todo` in worker processes, one at a time (one process holds an
    accelerator) and none while this process holds it (it never starts a
    backend): a case with no answer within `case_timeout` seconds is recorded as
    `timed out` and its process ended, a case whose process dies as `refused`,
    and the remaining cases go on in a new process.

    **Arguments:**

    - `n`: the size.
    - `todo`: the cases.
    - `case_timeout`, `setup_timeout`: seconds allowed for one case, and for a
      worker to start and build the problem.
    - `budget`: seconds for them all (None: no limit); the cases left at the end
      of it are recorded as `not run`.

    **Returns:**

    `(rows, environment)`: the rows in the order of `todo`, and the environment
    the workers reported (empty if none started).
    """
    rows: dict[str, dict] = {}
    environment: dict = {}
    remaining = [c.id for c in todo]
    root = Path(__file__).resolve().parent.parent
    end = time.monotonic() + (budget if budget is not None else float("inf"))
    with tempfile.TemporaryDirectory() as folder:
        for attempt in range(1, len(remaining) + 2):
            if not remaining:
                break
            progress = Path(folder) / f"progress-{attempt}.jsonl"
            command = [sys.executable, "-m", "benchmarks.parity", "--worker",
                       "--n", str(n), "--progress", str(progress),
                       "--cases", ",".join(remaining)]  # fmt: skip
            process = subprocess.Popen(command, cwd=root, start_new_session=True)
            changed, current, seen, ready = time.monotonic(), None, 0, False
            while True:
                finished = process.poll() is not None  # then its records are all in
                records = _read_progress(progress)
                for record in records[seen:]:
                    changed = time.monotonic()
                    if "ready" in record:
                        ready, environment = True, record["ready"]
                    elif "start" in record:
                        current = record["start"]
                    elif "row" in record:
                        rows[record["row"]["id"]] = record["row"]
                        _print_row(record["row"])
                        current = None
                seen = len(records)
                limit = case_timeout if ready else setup_timeout
                if finished:
                    break
                over_budget = time.monotonic() > end
                if over_budget or time.monotonic() - changed > limit:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    why = "the time budget is spent" if over_budget else (
                        f"no answer in {limit:g} s ({current or 'setup'})")  # fmt: skip
                    print(f"  {why}: ended the process", flush=True)
                    break
                time.sleep(0.25)
            timed_out = process.returncode == -signal.SIGKILL
            remaining = [i for i in remaining if i not in rows]
            if not remaining:
                break
            if time.monotonic() > end:
                for i in remaining:
                    rows[i] = _lost_row(i, "not run", f"the {budget:.0f} s budget "
                                        "was spent before it")  # fmt: skip
                break
            if not ready:  # the worker never built the problem: report, stop
                message = (f"the worker process ended (exit status "
                           f"{process.returncode}) before its first case")  # fmt: skip
                for i in remaining:
                    rows[i] = _lost_row(i, "refused", message)
                break
            lost = current or remaining[0]
            if timed_out:
                rows[lost] = _lost_row(
                    lost, "timed out", f"no answer in {case_timeout:g} s"
                )
            else:
                rows[lost] = _lost_row(
                    lost, "refused", f"the process ended (exit status "
                    f"{process.returncode}) during this case"
                )  # fmt: skip
            _print_row(rows[lost])
            remaining.remove(lost)
    return [rows[c.id] for c in todo], environment


def run_in_process(n: int, todo: Sequence[Case]) -> list[dict]:
    """The rows of `todo`, run in this process (no timeout)."""
    runner = Runner(Problem(n))
    rows = []
    for case in todo:
        rows.append(case_row(runner, case))
        _print_row(rows[-1])
    return rows


# ------------------------------------------------------------------ report


def _sci(value) -> str:
    return "-" if value is None else f"{value:.1e}"


def _print_row(row: dict) -> None:
    message = row.get("message", "") if row["verdict"] != "ok" else ""
    message = f"  {' '.join(message.split())[:200]}" if message else ""
    print(
        f"{row['group']:<9} {row['kind']:<12} {row['policy']:<12} "
        f"{row['solver']:<15} err {_sci(row.get('error')):>8}  lineax "
        f"{_sci(row.get('baseline_error')):>8}  {str(row.get('result', '-')):<18}"
        f" {row['verdict']}{message}",
        flush=True,
    )


def summary(rows: Sequence[dict]) -> dict:
    """Counts of each verdict, and the ids of the rows not `ok`."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    return dict(
        counts=counts,
        not_ok={
            r["id"]: r.get("message", r["verdict"])
            for r in rows
            if r["verdict"] != "ok"
        },
    )


def table(rows: Sequence[dict]) -> str:
    """Per group and policy: rows, the worst ratio of our error to the baseline's,
    and the verdicts."""
    from benchmarks import output

    cells = {}
    for r in rows:
        key = (r["group"], r["policy"])
        c = cells.setdefault(key, dict(rows=0, worst=0.0, verdicts={}))
        c["rows"] += 1
        if r.get("error") is not None and r.get("baseline_error") is not None:
            ratio = r["error"] / max(r["baseline_error"], FLOOR)
            c["worst"] = max(c["worst"], ratio)
        c["verdicts"][r["verdict"]] = c["verdicts"].get(r["verdict"], 0) + 1
    body = [
        (
            group,
            policy,
            c["rows"],
            f"{c['worst']:.2f}",
            ", ".join(f"{v} {k}" for k, v in c["verdicts"].items()),
        )
        for (group, policy), c in cells.items()
    ]
    headers = ("group", "policy", "rows", "worst err / max(baseline, 1e-6)", "verdicts")
    return output.table(headers, body)


def plot(rows: Sequence[dict], title: str, path: Path) -> None:
    """Our error against the baseline's, a point per row coloured by verdict."""
    from benchmarks import output

    plt = output.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5))
    colours = {"ok": "tab:green", "FAIL": "tab:red", "not solved": "tab:orange"}
    for verdict, colour in colours.items():
        pts = [
            (max(r["baseline_error"], 1e-9), max(r["error"], 1e-9))
            for r in rows
            if r["verdict"] == verdict and r.get("error") is not None
        ]
        if pts:
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, s=14, c=colour, label=f"{verdict} ({len(pts)})")
    lo, hi = 1e-9, 1.0
    for factor, style in ((1, "-"), (FACTOR, "--"), (MV_FACTOR, ":")):
        ax.plot([lo, hi], [factor * lo, factor * hi], "k" + style, lw=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("baseline's relative error (plain lineax / loop of mv)")
    ax.set_ylabel("our relative error (float64 reference)")
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    output.save(fig, path)


def write(out: Path, rows: Sequence[dict], config: dict, environment: dict,
          seconds: float) -> dict:  # fmt: skip
    """`<out>/parity.json` (and `parity.png`) through `benchmarks/output.py`.

    **Arguments:**

    - `out`: the folder.
    - `rows`: the judged rows.
    - `config`: the settings of the run.
    - `environment`: `harness.environment()` where the cases ran.
    - `seconds`: the run's wall time.

    **Returns:**

    The payload written.
    """
    from benchmarks import output

    payload = dict(
        environment=environment,
        config=config,
        summary=summary(rows),
        rows=list(rows),
        total_seconds=seconds,
    )
    title = (f"parity on {environment.get('jax_backend', '?')}, n={config['n']} "
             f"(jax {environment.get('jax', '?')})")  # fmt: skip
    output.write_results(out, "parity", payload, lambda p: plot(rows, title, p))
    return payload


# ------------------------------------------------------------------ command line


def _names(choices: Sequence[str]) -> Callable:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(v.strip().lower() for v in text.split(",") if v.strip())
        if bad := [v for v in names if v not in choices]:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {choices}")
        return names

    return parse


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.parity", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=None, help="results folder "
                        "(default benchmarks/results/<jax.default_backend()>)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help=f"n={QUICK['n']}")
    parser.add_argument("--n", type=int, default=None, help=f"size ({FULL['n']})")
    for name, choices in (("kinds", KINDS), ("policies", POLICIES),
                          ("solvers", SOLVERS), ("groups", GROUPS)):  # fmt: skip
        parser.add_argument(
            f"--{name}",
            type=_names(choices),
            default=choices,
            help=f"comma-separated among {','.join(choices)} (default all)",
        )
    parser.add_argument("--case-timeout", type=float, default=CASE_TIMEOUT_S,
                        help="seconds for one case (default %(default)s)")  # fmt: skip
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for all the cases; those left are "
                        "recorded as `not run` (default: no limit)")  # fmt: skip
    parser.add_argument("--in-process", action="store_true",
                        help="run the cases in this process (no timeout)")  # fmt: skip
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--progress", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cases", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.n is None:
        args.n = (QUICK if args.quick else FULL)["n"]
    return args


def main(argv=None) -> int:
    """Runs the parity zoo; returns 1 where any row is `FAIL`, else 0."""
    args = parse_args(argv)
    if args.worker:
        worker(args.n, args.cases.split(","), args.progress)
        return 0
    start = time.perf_counter()
    from benchmarks import harness

    todo = cases(args.kinds, args.policies, args.solvers, args.groups)
    config = dict(
        n=args.n, layers=LAYERS, shift=SHIFT, rtol=RTOL, atol=ATOL,
        max_steps=MAX_STEPS, factor=FACTOR, auto_factor=AUTO_FACTOR,
        mv_factor=MV_FACTOR, floor=FLOOR, batch=BATCH, sites=SITES,
        case_timeout_s=args.case_timeout, budget_s=args.budget, cases=len(todo),
        in_process=args.in_process,
    )  # fmt: skip
    print(f"parity: {len(todo)} cases, n={args.n}", flush=True)
    if args.in_process:
        environment = harness.environment()
        rows = run_in_process(args.n, todo)
    else:
        rows, environment = supervise(
            args.n, todo, args.case_timeout, budget=args.budget
        )
    backend = environment.get("jax_backend", "unknown")
    print(f"\nparity on {backend} ({environment.get('jax_devices')}), n={args.n}")
    print(table(rows))
    out = args.out or harness.RESULTS_DIR / backend
    payload = write(out, rows, config, environment, time.perf_counter() - start)
    counts = payload["summary"]["counts"]
    print("parity: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
