"""Running the parity zoo's cases (`benchmarks/parity.py`): a `Runner` that computes
a case and its baseline, `case_row` (the row, judged by `parity_cases.judge`), and
the worker processes that run the cases with a timeout per case (`supervise`)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from benchmarks.parity_cases import (
    Case,
    CASE_TIMEOUT_S,
    judge,
    plain_operator,
    policy_of,
    Problem,
    PROGRAM_LEVEL,
    result_name,
    SETUP_TIMEOUT_S,
    SITES,
    solver_pair,
)


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
