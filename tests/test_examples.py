"""The worked examples of `docs/examples/` run to completion (each checks its own
answers against optimistix's or lineax's and raises if they differ).

Each runs in a subprocess of its own, as `python docs/examples/NAME.py` would run
it: one test per example, so that the two test workers share them."""

import os
import pathlib
import subprocess
import sys

import pytest


EXAMPLES = sorted(
    (pathlib.Path(__file__).parent.parent / "docs" / "examples").glob("*.py")
)

_MARK = "===== example: "

# Runs each path given as `__main__`, with a marker line before its output; a
# failing example prints its traceback, the others still run, and the exit
# status is 1 if any failed.
_DRIVER = f"""
import runpy, sys, traceback
failed = []
for path in sys.argv[1:]:
    print({_MARK!r} + path, flush=True)
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        failed.append(path)
    sys.stdout.flush()
sys.exit(1 if failed else 0)
"""


def test_there_are_examples():
    names = {path.name for path in EXAMPLES}
    assert {"bratu.py", "curve_fit.py", "many_rhs.py", "sharded_stencil.py"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    outputs = {}
    for section in done.stdout.split(_MARK)[1:]:
        name, _, output = section.partition("\n")
        outputs[name] = output
    assert done.returncode == 0, done.stdout + done.stderr
    assert str(path) in outputs, f"{path.name} did not run:\n{done.stderr}"
    assert outputs[str(path)].strip(), f"{path.name} printed nothing"
