"""The accelerator check's parity zoo (`benchmarks/parity.py`) on a tiny size on
the CPU: its verdicts, and the results file it writes through a worker process
where matplotlib is missing."""

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import parity
from benchmarks.parity import Case


ROOT = Path(__file__).resolve().parents[1]


def test_judge_verdicts():
    case = Case("solve", "function", "lazy", "cg")
    base = dict(name="lx.CG, jax.jit", error=1e-5, result="successful")
    ok = parity.judge(case, dict(error=9e-5, result="successful", steps=3), base)
    assert ok["verdict"] == "ok" and ok["bound"] == 1e-4
    bad = parity.judge(case, dict(error=2e-4, result="successful", steps=3), base)
    assert bad["verdict"] == "FAIL"
    stuck = dict(error=0.5, result="max_steps_reached", steps=9)
    assert parity.judge(case, stuck, base)["verdict"] == "not solved"
    # Auto and the mv groups: within 2x; a baseline below FLOOR counts as FLOOR.
    auto = Case("solve", "function", "auto", "cg")
    assert parity.judge(auto, dict(ok, error=3e-5), base)["verdict"] == "FAIL"
    mv = Case("batch_mv", "function", "roll")
    tiny = dict(name="loop", error=1e-9, result="-")
    row = parity.judge(mv, dict(error=1.5e-6, result="-", steps=None), tiny)
    assert row["verdict"] == "ok" and row["bound"] == 2 * parity.FLOOR
    row = parity.judge(mv, dict(error=1e-2, result="-", steps=None), tiny)
    assert row["verdict"] == "FAIL"


def test_cases_cover_every_policy_and_group():
    todo = parity.cases()
    ids = {c.id for c in todo}
    assert len(ids) == len(todo)
    for policy in parity.POLICIES:
        for solver in parity.SOLVERS:
            assert f"solve:function:{policy}:{solver}" in ids
        for kind in parity.KINDS:
            assert f"solve:{kind}:{policy}:cg" in ids
        assert f"batch_mv:function:{policy}:-" in ids
        assert f"stacked:function:{policy}:-" in ids
        assert f"dense:function:{policy}:dense_matrix" in ids
        assert f"dense:function:{policy}:lx.materialise" in ids
    assert Case.parse("solve:pytree:roll:lu") == Case("solve", "pytree", "roll", "lu")


def test_refused_case_is_recorded(monkeypatch):
    class Failing(parity.Runner):
        def baseline(self, case):
            return dict(name="lineax", error=1e-6, result="successful")

        def run(self, case):
            raise NotImplementedError("not on this backend")

    row = parity.case_row(Failing(None), Case("solve", "function", "outline", "cg"))
    assert row["verdict"] == "refused"
    assert row["message"] == "NotImplementedError: not on this backend"


def test_parity_zoo_writes_results(tmp_path):
    """A few cases at n=16 through the supervisor and a worker process, with
    matplotlib unimportable: the JSON has every row, each `ok`."""
    args = [
        "--n", "16", "--kinds", "function", "--policies", "lazy,roll",
        "--solvers", "cg,lu", "--groups", "solve,stacked", "--out", str(tmp_path),
    ]  # fmt: skip
    script = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from benchmarks import parity\n"
        f"sys.exit(parity.main({args!r}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_ENABLE")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=dict(env, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no plot: matplotlib is not installed" in done.stdout
    assert not (tmp_path / "parity.png").exists()
    data = json.loads((tmp_path / "parity.json").read_text())
    ids = [row["id"] for row in data["rows"]]
    expected = [
        c.id
        for c in parity.cases(
            ("function",), ("lazy", "roll"), ("cg", "lu"),
            ("solve", "stacked"),
        )
    ]  # fmt: skip
    assert ids == expected and len(ids) == 6
    verdicts = {row["id"]: row["verdict"] for row in data["rows"]}
    assert set(verdicts.values()) == {"ok"}, verdicts
    assert data["summary"]["counts"]["ok"] == 6
    assert data["environment"]["jax_backend"] == "cpu"
    for row in data["rows"]:
        assert 0 <= row["error"] <= row["bound"]
        assert row["baseline_error"] < 1e-5
