"""The benchmarks' results files (`benchmarks/output.py`) and where `make demo`
writes: results JSON parses whatever its dict keys are, a benchmark writes its JSON
where matplotlib is missing, and the showcase changes no tracked file."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import output


ROOT = Path(__file__).resolve().parents[1]


def test_non_string_keys_round_trip(tmp_path):
    payload = {
        "grids": {16: {"run_s": 0.5}, 64: {"run_s": 1.5}},
        "layers_per_n": {64: 32, 256: 32},
        "flags": {True: 1, None: 2, 0.5: 3, (1, 2): 4},
    }
    output.write_results(tmp_path, "keys", payload, lambda path: None)
    with open(tmp_path / "keys.json") as f:
        data = json.load(f)
    assert data["grids"] == {"16": {"run_s": 0.5}, "64": {"run_s": 1.5}}
    assert data["layers_per_n"] == {"64": 32, "256": 32}
    # As `json.dumps` writes such keys; any other key as `str(key)`.
    assert data["flags"] == {"true": 1, "null": 2, "0.5": 3, "(1, 2)": 4}


def test_long_results_parse_at_every_depth():
    """`results_json` lays out fewer levels for a long payload; each parses."""
    payload = {n: {m: list(range(m % 7)) for m in range(40)} for n in range(30)}
    text = output.results_json(payload)
    assert text.count("\n") <= output.MAX_LINES
    assert json.loads(text)["3"]["12"] == list(range(5))


def test_json_written_without_matplotlib(tmp_path):
    """With matplotlib unimportable, `write_results` writes the JSON, says there is
    no plot, and writes no PNG; another ImportError still raises."""
    script = f"""
import sys
sys.modules["matplotlib"] = None
from pathlib import Path
from benchmarks import harness

def plot(path):
    plt = harness.pyplot()
    fig, ax = plt.subplots()
    harness.save(fig, path)

harness.write_results(Path({str(tmp_path)!r}), "nompl", {{"a": {{1: 2}}}}, plot)

def broken(path):
    import a_module_that_is_not_there  # noqa: F401

try:
    harness.write_results(Path({str(tmp_path)!r}), "broken", {{}}, broken)
except ImportError:
    print("other ImportError raised")
"""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "no plot: matplotlib is not installed" in done.stdout
    assert "other ImportError raised" in done.stdout
    assert json.loads((tmp_path / "nompl.json").read_text()) == {"a": {"1": 2}}
    assert not (tmp_path / "nompl.png").exists()


def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_make_demo_writes_no_tracked_file():
    """`make demo` runs `demo.py --out DEMO_OUT`, a git-ignored folder outside
    `benchmarks/results/` (whose every file the docs publish), and demo.py's own
    default is the same folder."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n\t(.*)$", makefile, re.MULTILINE)
    assert recipe, "no `demo` target in the Makefile"
    command = recipe.group(1)
    assert "demo.py --out $(DEMO_OUT)" in command, command
    out = re.search(r"^DEMO_OUT \?= (\S+)$", makefile, re.MULTILINE)
    assert out, "the Makefile does not set DEMO_OUT"
    folder = out.group(1)
    assert not (ROOT / folder).resolve().is_relative_to(ROOT / "benchmarks")
    source = (ROOT / "demo.py").read_text()
    assert f'parent / "{folder}"' in source, "demo.py's default --out differs"
    if shutil.which("git") is None or _git("rev-parse").returncode != 0:
        pytest.skip("not a git checkout")
    for name in ("demo.json", "demo.png"):
        path = f"{folder}/{name}"
        assert _git("check-ignore", "-q", path).returncode == 0, f"{path} not ignored"
        assert _git("ls-files", "--error-unmatch", path).returncode != 0


def test_the_ablations_without_scaling_divide_by_one():
    # `benchmarks.cg_compile` and `benchmarks.solver_kernels` patch the scaling
    # out by name: the system built inside the context divides by 1.
    import jax.numpy as jnp
    import lineax as lx

    import lineax_dispatch as lxd
    from benchmarks import harness
    from lineax_dispatch.solvers.skeleton._linear_system import plain_system

    op = lxd.MatrixLinearOperator(jnp.eye(4) * 3.0)
    b = jnp.full(4, 1e10)
    assert float(plain_system(op, b, None)[0].unit) != 1.0
    with harness.without_rhs_scaling():
        system, _ = plain_system(op, b, None)
    assert float(system.unit) == 1.0
    assert lx.linear_solve(op, b, lxd.GMRES(1e-6, 1e-6)).result == lx.RESULTS.successful
